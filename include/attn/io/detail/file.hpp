// SPDX-License-Identifier: MIT
// attn/io/detail/file.hpp: every operating-system call of attn::io: reading a file (memory-
// mapped, or streamed into memory) and replacing one atomically. The only attn header that
// includes POSIX headers, and only when ATTN_IO_HAS_MMAP is 1.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "attn/io/error.hpp"

/// 1: SafetensorsFile::open() memory-maps the file and the writer fsyncs it, through POSIX
/// calls (<fcntl.h>, <sys/mman.h>, <sys/stat.h>, <unistd.h>, included here only). 0: the
/// standard library only: open() streams the file into memory and the writer cannot fsync.
/// Defaults to 1 on POSIX systems; define it before including attn to choose.
#ifndef ATTN_IO_HAS_MMAP
#if defined(__unix__) || defined(__APPLE__)
#define ATTN_IO_HAS_MMAP 1
#else
#define ATTN_IO_HAS_MMAP 0
#endif
#endif

#if ATTN_IO_HAS_MMAP
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

ATTN_NAMESPACE_BEGIN
namespace io {
namespace detail {

/// Read-only bytes that keep themselves alive: a memory map or an owned buffer.
class Storage {
 public:
  virtual ~Storage() = default;
  virtual const unsigned char* data() const noexcept = 0;
  virtual std::size_t size() const noexcept = 0;
};

class BufferStorage final : public Storage {
 public:
  explicit BufferStorage(std::vector<unsigned char> bytes) : bytes_(std::move(bytes)) {}
  const unsigned char* data() const noexcept override { return bytes_.data(); }
  std::size_t size() const noexcept override { return bytes_.size(); }

 private:
  std::vector<unsigned char> bytes_;
};

/// The whole of a stream, read in 64 KiB chunks.
inline std::vector<unsigned char> read_stream(std::istream& in, const std::string& source,
                                              const char* where) {
  std::vector<unsigned char> bytes;
  constexpr std::size_t kChunk = 64 * 1024;
  while (in) {
    const std::size_t used = bytes.size();
    bytes.resize(used + kChunk);
    in.read(reinterpret_cast<char*>(bytes.data() + used), static_cast<std::streamsize>(kChunk));
    bytes.resize(used + static_cast<std::size_t>(in.gcount()));
  }
  io_require<IoError>(!in.bad(), where, [&] { return "error while reading " + source; });
  return bytes;
}

inline std::string describe_errno(int error) { return std::strerror(error); }

#if ATTN_IO_HAS_MMAP

class MappedStorage final : public Storage {
 public:
  MappedStorage(void* address, std::size_t size) noexcept : address_(address), size_(size) {}
  MappedStorage(const MappedStorage&) = delete;
  MappedStorage& operator=(const MappedStorage&) = delete;
  ~MappedStorage() override { ::munmap(address_, size_); }
  const unsigned char* data() const noexcept override {
    return static_cast<const unsigned char*>(address_);
  }
  std::size_t size() const noexcept override { return size_; }

 private:
  void* address_;
  std::size_t size_;
};

/// Closes a descriptor on every path out of a scope.
struct FileDescriptor {
  int fd = -1;
  FileDescriptor() = default;
  explicit FileDescriptor(int value) noexcept : fd(value) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { close(); }
  int close() noexcept {
    const int result = fd >= 0 ? ::close(fd) : 0;
    fd = -1;
    return result;
  }
};

/// Memory-maps `path` read-only. O_NONBLOCK makes opening a FIFO return at once (a blocking
/// open waits for a writer), so fstat() can reject everything that is not a regular file.
inline std::shared_ptr<const Storage> read_file(const std::string& path, const char* where) {
  const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  io_require<IoError>(file.fd >= 0, where, [&, error = errno] {
    return "cannot open '" + path + "' for reading: " + describe_errno(error);
  });
  struct stat info {};
  const bool stat_ok = ::fstat(file.fd, &info) == 0;
  io_require<IoError>(stat_ok, where, [&, error = errno] {
    return "cannot stat '" + path + "': " + describe_errno(error);
  });
  io_require<IoError>(S_ISREG(info.st_mode), where, [&] {
    return "'" + path + "' is not a regular file (" +
           (S_ISDIR(info.st_mode)    ? "a directory"
            : S_ISFIFO(info.st_mode) ? "a FIFO"
            : S_ISCHR(info.st_mode)  ? "a character device"
                                     : "a special file") +
           ")";
  });
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size == 0) return std::make_shared<BufferStorage>(std::vector<unsigned char>{});
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd, 0);
  io_require<IoError>(address != MAP_FAILED, where, [&, error = errno] {
    return "cannot memory-map '" + path + "' (" + std::to_string(size) +
           " bytes): " + describe_errno(error);
  });
  return std::make_shared<MappedStorage>(address, size);
}

#else  // ATTN_IO_HAS_MMAP

/// Streams `path` into memory. Without POSIX calls the type check comes before the open: a
/// FIFO swapped in between the two would block the open.
inline std::shared_ptr<const Storage> read_file(const std::string& path, const char* where) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  io_require<IoError>(!error, where,
                      [&] { return "cannot open '" + path + "' for reading: " + error.message(); });
  io_require<IoError>(std::filesystem::is_regular_file(status), where, [&] {
    return "'" + path + "' is not a regular file (" +
           (std::filesystem::is_directory(status)        ? "a directory"
            : std::filesystem::is_fifo(status)           ? "a FIFO"
            : std::filesystem::is_character_file(status) ? "a character device"
                                                         : "a special file") +
           ")";
  });
  std::ifstream in(path, std::ios::binary);
  io_require<IoError>(static_cast<bool>(in), where,
                      [&] { return "cannot open '" + path + "' for reading"; });
  return std::make_shared<BufferStorage>(read_stream(in, "'" + path + "'", where));
}

#endif  // ATTN_IO_HAS_MMAP

#if ATTN_IO_HAS_MMAP
inline const char* file_kind(mode_t mode) noexcept {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "a special file";
}
#endif

/// Throws IoError unless `path` is something a writer may replace: nothing (a new file), a
/// regular file, or a symbolic link (which is replaced, not followed) that leads to nothing
/// or to a regular file. A directory, a FIFO, a socket or a device, or a link to one, is
/// refused: replacing it would destroy something that is not a file the writer made (as
/// root, a device node). Called before anything is computed or written, and again just
/// before the rename (the window between the second check and the rename is a few system
/// calls long; a path that changes kind in between is not guarded against).
inline void check_replaceable(const std::string& path, const char* where) {
#if ATTN_IO_HAS_MMAP
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) {
    const int error = errno;
    io_require<IoError>(error == ENOENT, where,
                        [&] { return "cannot write '" + path + "': " + describe_errno(error); });
    return;  // nothing there (the directory is checked when the temporary file is created)
  }
  const bool link = S_ISLNK(info.st_mode);
  struct stat target {};
  const bool leads_somewhere = link && ::stat(path.c_str(), &target) == 0;
  const mode_t mode = link ? target.st_mode : info.st_mode;
  io_require<IoError>((link && !leads_somewhere) || S_ISREG(mode), where, [&] {
    return "'" + path + "' is " + (link ? "a symbolic link to " : "") + file_kind(mode) +
           ", not a regular file: refusing to replace it (name a regular file or a new one)";
  });
#else
  std::error_code error;
  const std::filesystem::file_status own = std::filesystem::symlink_status(path, error);
  if (error || !std::filesystem::exists(own)) return;
  const bool link = std::filesystem::is_symlink(own);
  const std::filesystem::file_status target = link ? std::filesystem::status(path, error) : own;
  if (link && (error || !std::filesystem::exists(target))) return;
  io_require<IoError>(std::filesystem::is_regular_file(target), where, [&] {
    const char* kind = std::filesystem::is_directory(target)        ? "a directory"
                       : std::filesystem::is_fifo(target)           ? "a FIFO"
                       : std::filesystem::is_character_file(target) ? "a character device"
                       : std::filesystem::is_block_file(target)     ? "a block device"
                       : std::filesystem::is_socket(target)         ? "a socket"
                                                                    : "a special file";
    return "'" + path + "' is " + (link ? "a symbolic link to " : "") + kind +
           ", not a regular file: refusing to replace it (name a regular file or a new one)";
  });
#endif
}

/// A temporary file next to `path`, created exclusively, removed unless commit() renamed it
/// over `path`. The name is ".<file name>.tmp-<pid>-<n>" in the same directory, so the
/// rename stays on one file system and is atomic. `path` must be replaceable
/// (check_replaceable()), when the object is made and again just before the rename.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const char* where) : path_(path), where_(where) {
    check_replaceable(path, where);
    const std::filesystem::path target(path);
    const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
    static std::atomic<unsigned> counter{0};
    const std::string base = target.filename().string().substr(0, 200);  // NAME_MAX is 255
    for (int attempt = 0; attempt < 100 && !open_; ++attempt) {
      temp_ = (dir / ("." + base + ".tmp-" + std::to_string(process_id()) + "-" +
                      std::to_string(counter++)))
                  .string();
      int error = 0;
      open_ = create_exclusive(error);
      io_require<IoError>(open_ || error == EEXIST, where_, [&] {
        return "cannot open '" + path_ + "' for writing: cannot create a temporary file in '" +
               dir.string() + "': " + describe_errno(error);
      });
    }
    io_require<IoError>(open_, where_, [&] {
      return "cannot open '" + path_ + "' for writing: no free temporary file name";
    });
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (!committed_) {
      close_file();
      std::remove(temp_.c_str());
    }
  }

  /// Writes all bytes, flushes them to the device (fsync, with POSIX), then renames the
  /// temporary file over the target. On any failure the target is untouched and the
  /// temporary file is removed.
  void commit(const unsigned char* data, std::size_t size) {
    const auto failed = [&](const std::string& what, int error) {
      return "error while writing " + std::to_string(size) + " bytes to '" + path_ + "' (" + what +
             (error != 0 ? ": " + describe_errno(error) : std::string()) +
             "); the file is unchanged";
    };
    int error = 0;
    io_require<IoError>(write_all(data, size, error), where_,
                        [&] { return failed("write", error); });
    io_require<IoError>(sync_and_close(error), where_, [&] { return failed("flush", error); });
    check_replaceable(path_, where_);  // again: it may have changed while the bytes were written
    std::error_code rename_error;
    std::filesystem::rename(temp_, path_, rename_error);
    io_require<IoError>(!rename_error, where_, [&] {
      return "cannot replace '" + path_ + "': " + rename_error.message() +
             "; the file is unchanged";
    });
    committed_ = true;
  }

 private:
#if ATTN_IO_HAS_MMAP
  static long process_id() noexcept { return static_cast<long>(::getpid()); }
  bool create_exclusive(int& error) {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    error = errno;
    if (fd_ < 0) return false;
    struct stat info {};  // keep an existing file's permissions
    if (::stat(path_.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
      (void)::fchmod(fd_, info.st_mode & 07777);
    }
    return true;
  }
  bool write_all(const unsigned char* data, std::size_t size, int& error) {
    while (size > 0) {
      const ::ssize_t n = ::write(fd_, data, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = n < 0 ? errno : EIO;
        return false;
      }
      data += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  }
  bool sync_and_close(int& error) {
    const bool synced = ::fsync(fd_) == 0;
    error = synced ? 0 : errno;
    const bool closed = close_file() == 0;
    if (synced && !closed) error = errno;
    return synced && closed;
  }
  int close_file() noexcept {
    const int result = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return result;
  }
  int fd_ = -1;
#else
  static long process_id() noexcept { return 0; }  // names differ by the counter alone
  bool create_exclusive(int& error) {
    errno = 0;
    file_ = std::fopen(temp_.c_str(), "wbx");  // "x": fail if it exists (C11)
    error = file_ != nullptr ? 0 : (errno == 0 ? EEXIST : errno);
    if (file_ == nullptr) return false;
    std::error_code ignored;  // keep an existing file's permissions
    const std::filesystem::file_status old = std::filesystem::status(path_, ignored);
    if (std::filesystem::is_regular_file(old)) {
      std::filesystem::permissions(temp_, old.permissions(), ignored);
    }
    return true;
  }
  bool write_all(const unsigned char* data, std::size_t size, int& error) {
    errno = 0;
    const bool ok = size == 0 || std::fwrite(data, 1, size, file_) == size;
    error = ok ? 0 : errno;
    return ok;
  }
  bool sync_and_close(int& error) {  // flushes to the OS; no fsync without POSIX
    errno = 0;
    const bool flushed = std::fflush(file_) == 0;
    error = flushed ? 0 : errno;
    const bool closed = close_file() == 0;
    if (flushed && !closed) error = errno;
    return flushed && closed;
  }
  int close_file() noexcept {
    const int result = file_ != nullptr ? std::fclose(file_) : 0;
    file_ = nullptr;
    return result;
  }
  std::FILE* file_ = nullptr;
#endif
  std::string path_, temp_;
  const char* where_;
  bool open_ = false, committed_ = false;
};

}  // namespace detail
}  // namespace io
ATTN_NAMESPACE_END
