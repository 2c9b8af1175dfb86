// SPDX-License-Identifier: MIT
// attn/io/safetensors.hpp: read (memory-mapped or from a buffer) and write safetensors files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/io/error.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#define ATTN_IO_HAS_MMAP 1
#else
#define ATTN_IO_HAS_MMAP 0
#endif

namespace attn::io {

/// Element types of the safetensors format (its "dtype" strings).
enum class DType {
  kBool,     ///< "BOOL", one byte, 0 or 1
  kU8,       ///< "U8"
  kI8,       ///< "I8"
  kF8E4M3,   ///< "F8_E4M3" (recognised; not convertible)
  kF8E5M2,   ///< "F8_E5M2" (recognised; not convertible)
  kI16,      ///< "I16"
  kU16,      ///< "U16"
  kF16,      ///< "F16", IEEE half; converted to float/double on load
  kBF16,     ///< "BF16", bfloat16; converted to float/double on load
  kI32,      ///< "I32"
  kU32,      ///< "U32"
  kF32,      ///< "F32"
  kI64,      ///< "I64"
  kU64,      ///< "U64"
  kF64,      ///< "F64"
};

/// The format's name of a dtype ("F32").
inline const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kBool: return "BOOL";
    case DType::kU8: return "U8";
    case DType::kI8: return "I8";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kI16: return "I16";
    case DType::kU16: return "U16";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kU32: return "U32";
    case DType::kF32: return "F32";
    case DType::kI64: return "I64";
    case DType::kU64: return "U64";
    case DType::kF64: return "F64";
  }
  return "?";
}

/// Bytes per element.
inline std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kBool: case DType::kU8: case DType::kI8: case DType::kF8E4M3:
    case DType::kF8E5M2: return 1;
    case DType::kI16: case DType::kU16: case DType::kF16: case DType::kBF16: return 2;
    case DType::kI32: case DType::kU32: case DType::kF32: return 4;
    case DType::kI64: case DType::kU64: case DType::kF64: return 8;
  }
  return 1;
}

/// The dtype attn writes for a C++ element type: float -> F32, double -> F64, bool -> BOOL.
template <class Scalar>
constexpr DType dtype_of() noexcept {
  using S = std::remove_const_t<Scalar>;
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double> || std::is_same_v<S, bool>,
                "attn::io: tensors are written as float (F32), double (F64) or bool (BOOL)");
  if constexpr (std::is_same_v<S, float>) {
    return DType::kF32;
  } else if constexpr (std::is_same_v<S, double>) {
    return DType::kF64;
  } else {
    return DType::kBool;
  }
}

namespace detail {

/// Largest header the reader accepts (the reference implementation's limit).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

inline bool parse_dtype(const std::string& text, DType& out) noexcept {
  static const std::pair<const char*, DType> kNames[] = {
      {"BOOL", DType::kBool},       {"U8", DType::kU8},   {"I8", DType::kI8},
      {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2},
      {"I16", DType::kI16},         {"U16", DType::kU16}, {"F16", DType::kF16},
      {"BF16", DType::kBF16},       {"I32", DType::kI32}, {"U32", DType::kU32},
      {"F32", DType::kF32},         {"I64", DType::kI64}, {"U64", DType::kU64},
      {"F64", DType::kF64}};
  for (const auto& [name, dtype] : kNames) {
    if (text == name) {
      out = dtype;
      return true;
    }
  }
  return false;
}

/// "[2, 3]" for a shape.
inline std::string shape_text(const std::vector<Index>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

/// A JSON value as at most ~80 characters of text, for messages.
inline std::string json_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

inline constexpr bool host_is_little_endian() noexcept {
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__)
  return __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__;
#else
  return true;
#endif
}

/// A little-endian value of type T at `p` (any alignment).
template <class T>
T load_le(const unsigned char* p) noexcept {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, p, sizeof(T));
  if constexpr (!host_is_little_endian()) std::reverse(bytes, bytes + sizeof(T));
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

/// Stores `value` little-endian at `p`.
template <class T>
void store_le(T value, unsigned char* p) noexcept {
  std::memcpy(p, &value, sizeof(T));
  if constexpr (!host_is_little_endian()) std::reverse(p, p + sizeof(T));
}

/// IEEE binary16 -> float (exact, including subnormals, infinities and NaN).
inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits = 0;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// bfloat16 -> float (exact).
inline float bfloat16_to_float(std::uint16_t b) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

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
#endif

inline std::vector<unsigned char> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  io_require<IoError>(static_cast<bool>(in), "SafetensorsFile::open",
                      [&] { return "cannot open '" + path + "' for reading"; });
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  io_require<IoError>(!in.bad(), "SafetensorsFile::open",
                      [&] { return "error while reading '" + path + "'"; });
  return bytes;
}

}  // namespace detail

/// Name, dtype, shape and byte range of one tensor in a safetensors file.
struct TensorInfo {
  DType dtype = DType::kF32;
  std::vector<Index> shape;
  std::size_t begin = 0;  ///< byte offset in the data section
  std::size_t end = 0;    ///< one past the last byte in the data section
  /// Number of elements (validated not to overflow when the file was opened).
  Index numel() const noexcept {
    for (const Index e : shape) {
      if (e == 0) return 0;
    }
    Index n = 1;
    for (const Index e : shape) n *= e;
    return n;
  }
};

/// A safetensors file: an 8-byte little-endian header length N, N bytes of JSON
/// (`{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
/// "__metadata__": {"key": "value"}}`), then the tensors' raw little-endian bytes.
///
/// The whole file is validated when it is opened: the header length (at most 100 MB and
/// within the file), the JSON (parsed by nlohmann::json; must be an object), every entry's
/// dtype, shape (non-negative, no overflow) and offsets (in range, byte count equal to
/// shape x dtype size), and that the tensors tile the data section exactly (no overlap, no
/// gap, nothing left over). Any violation throws FormatError naming the file, the tensor
/// and the values; nothing is read out of bounds. Tensors are then decoded on demand by
/// get(), which converts F16/BF16/F32/F64 (and integers) to float or double and BOOL (and
/// integers, nonzero = true) to bool.
///
/// open() memory-maps the file (POSIX mmap; read into memory elsewhere). Copies share the
/// mapping, which lives until the last copy is destroyed. A file truncated by another
/// process while mapped raises SIGBUS, as for any mapping.
class SafetensorsFile {
 public:
  /// An empty file (no tensors).
  SafetensorsFile() = default;

  /// Memory-maps and validates `path`.
  /// @throws IoError if it cannot be opened; FormatError if it is malformed.
  static SafetensorsFile open(const std::string& path) {
#if ATTN_IO_HAS_MMAP
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    detail::io_require<IoError>(fd >= 0, "SafetensorsFile::open", [&] {
      return "cannot open '" + path + "' for reading: " + std::strerror(errno);
    });
    struct stat info {};
    const bool stat_ok = ::fstat(fd, &info) == 0;
    const int stat_errno = errno;
    if (!stat_ok || !S_ISREG(info.st_mode)) {
      ::close(fd);
      detail::io_require<IoError>(false, "SafetensorsFile::open", [&] {
        return stat_ok ? "'" + path + "' is not a regular file"
                       : "cannot stat '" + path + "': " + std::strerror(stat_errno);
      });
    }
    const auto size = static_cast<std::size_t>(info.st_size);
    if (size == 0) {
      ::close(fd);
      return from_storage(std::make_shared<detail::BufferStorage>(std::vector<unsigned char>{}),
                          path);
    }
    void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    detail::io_require<IoError>(address != MAP_FAILED, "SafetensorsFile::open", [&] {
      return "cannot memory-map '" + path + "' (" + std::to_string(size) +
             " bytes): " + std::strerror(map_errno);
    });
    return from_storage(std::make_shared<detail::MappedStorage>(address, size), path);
#else
    return from_bytes(detail::read_whole_file(path), path);
#endif
  }

  /// Validates a file held in memory (takes ownership of the bytes).
  /// @param source  how messages name the buffer.
  /// @throws FormatError if it is malformed.
  static SafetensorsFile from_bytes(std::vector<unsigned char> bytes,
                                    std::string source = "<buffer>") {
    return from_storage(std::make_shared<detail::BufferStorage>(std::move(bytes)),
                        std::move(source));
  }

  /// Copies `size` bytes at `data` and validates them.
  static SafetensorsFile from_bytes(const void* data, std::size_t size,
                                    std::string source = "<buffer>") {
    const auto* p = static_cast<const unsigned char*>(data);
    return from_bytes(std::vector<unsigned char>(p, p + size), std::move(source));
  }

  /// Reads a whole stream (e.g. a pipe) into memory and validates it.
  static SafetensorsFile from_stream(std::istream& in, std::string source = "<stream>") {
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    detail::io_require<IoError>(!in.bad(), "SafetensorsFile::from_stream",
                                [&] { return "error while reading " + source; });
    return from_bytes(std::move(bytes), std::move(source));
  }

  /// How messages name this file (its path, or "<buffer>").
  const std::string& source() const noexcept { return source_; }

  /// The tensor names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& entry : tensors_) out.push_back(entry.first);
    return out;
  }
  std::size_t size() const noexcept { return tensors_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  /// The "__metadata__" string map (empty if absent).
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }

  /// @throws FormatError if there is no tensor `name`.
  const TensorInfo& info(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw FormatError(missing_message(name));
    return it->second;
  }
  const std::vector<Index>& shape(const std::string& name) const { return info(name).shape; }
  DType dtype(const std::string& name) const { return info(name).dtype; }
  std::size_t rank(const std::string& name) const { return info(name).shape.size(); }

  /// The raw little-endian bytes of tensor `name` (info(name).end - begin bytes; any alignment).
  const unsigned char* raw_data(const std::string& name) const {
    return data_begin() + info(name).begin;
  }

  /// Tensor `name` converted to Scalar (float, double or bool).
  /// @throws FormatError if it is missing, its rank is not Rank, or its dtype does not
  ///         convert (float types to bool, BOOL to float, F8 formats).
  /// Shapes: as stored; a rank-0 tensor is read with Rank 1 as shape (1).
  template <class Scalar, std::size_t Rank>
  Tensor<Scalar, Rank> get(const std::string& name) const {
    const TensorInfo& entry = info(name);
    Shape<Rank> shape{};
    const bool scalar_as_vector = Rank == 1 && entry.shape.empty();
    detail::io_require<FormatError>(entry.shape.size() == Rank || scalar_as_vector,
                                    "SafetensorsFile::get", [&] {
      return where(name) + " has rank " + std::to_string(entry.shape.size()) + " (shape " +
             detail::shape_text(entry.shape) + "), requested rank " + std::to_string(Rank);
    });
    if (scalar_as_vector) {
      shape[0] = 1;
    } else {
      for (std::size_t r = 0; r < Rank; ++r) shape[r] = entry.shape[r];
    }
    Tensor<Scalar, Rank> out(shape);
    decode(name, entry, out.data());
    return out;
  }

  /// The elements of tensor `name` (any rank) in row-major order, converted to Scalar.
  template <class Scalar>
  std::vector<Scalar> values(const std::string& name) const {
    const TensorInfo& entry = info(name);
    std::vector<Scalar> out(static_cast<std::size_t>(entry.numel()));
    if constexpr (std::is_same_v<Scalar, bool>) {
      // std::vector<bool> has no data(): decode through a byte buffer.
      std::unique_ptr<bool[]> tmp(new bool[out.size()]);
      decode(name, entry, tmp.get());
      std::copy(tmp.get(), tmp.get() + out.size(), out.begin());
    } else {
      decode(name, entry, out.data());
    }
    return out;
  }

 private:
  static SafetensorsFile from_storage(std::shared_ptr<const detail::Storage> storage,
                                      std::string source) {
    SafetensorsFile file;
    file.storage_ = std::move(storage);
    file.source_ = std::move(source);
    file.parse();
    return file;
  }

  std::string where(const std::string& name) const {
    return "'" + source_ + "': tensor '" + name + "'";
  }
  std::string missing_message(const std::string& name) const {
    std::string text = "attn::io::SafetensorsFile: '" + source_ + "' has no tensor '" + name +
                       "'; it has " + std::to_string(tensors_.size()) + " tensor(s)";
    std::size_t listed = 0;
    for (const auto& entry : tensors_) {
      text += (listed == 0 ? ": " : ", ") + entry.first;
      if (++listed == 8) {
        if (tensors_.size() > 8) text += ", ...";
        break;
      }
    }
    return text;
  }
  const unsigned char* data_begin() const noexcept {
    return storage_->data() + 8 + header_bytes_;
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw FormatError("attn::io::SafetensorsFile: '" + source_ + "': " + message);
  }

  void parse() {
    const unsigned char* bytes = storage_->data();
    const std::size_t size = storage_->size();
    if (size < 8) {
      fail("file is " + std::to_string(size) +
           " bytes, shorter than the 8-byte header length");
    }
    const auto header_length = detail::load_le<std::uint64_t>(bytes);
    if (header_length > detail::kMaxHeaderBytes) {
      fail("header length " + std::to_string(header_length) + " exceeds the limit of " +
           std::to_string(detail::kMaxHeaderBytes) + " bytes");
    }
    if (header_length > size - 8) {
      fail("header length " + std::to_string(header_length) + " exceeds the " +
           std::to_string(size - 8) + " bytes after the length field (file truncated?)");
    }
    if (header_length < 2) {
      fail("header length " + std::to_string(header_length) + " is too short for a JSON object");
    }
    header_bytes_ = static_cast<std::size_t>(header_length);
    const char* header = reinterpret_cast<const char*>(bytes + 8);
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(header, header + header_bytes_);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("header is not valid JSON: ") + e.what());
    }
    if (!root.is_object()) {
      fail(std::string("header is a JSON ") + root.type_name() + ", expected an object");
    }
    const std::size_t data_size = size - 8 - header_bytes_;

    struct Range {
      std::size_t begin, end;
      const std::string* name;
    };
    std::vector<Range> ranges;
    ranges.reserve(root.size());
    for (auto it = root.begin(); it != root.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& value = it.value();
      if (name == "__metadata__") {
        if (!value.is_object()) {
          fail("__metadata__ is a JSON " + std::string(value.type_name()) +
               ", expected an object of strings");
        }
        for (auto m = value.begin(); m != value.end(); ++m) {
          if (!m.value().is_string()) {
            fail("__metadata__ entry '" + m.key() + "' is " + detail::json_excerpt(m.value()) +
                 ", expected a string");
          }
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string tensor = "tensor '" + name + "'";
      if (!value.is_object()) {
        fail(tensor + " is " + detail::json_excerpt(value) +
             ", expected {\"dtype\", \"shape\", \"data_offsets\"}");
      }
      TensorInfo entry;
      // dtype
      const auto dtype_it = value.find("dtype");
      if (dtype_it == value.end() || !dtype_it->is_string()) {
        fail(tensor + " has no string \"dtype\" (got " + detail::json_excerpt(value) + ")");
      }
      if (!detail::parse_dtype(dtype_it->get_ref<const std::string&>(), entry.dtype)) {
        fail(tensor + " has unknown dtype " + detail::json_excerpt(*dtype_it) +
             " (expected BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, "
             "F8_E4M3 or F8_E5M2)");
      }
      // shape: non-negative integers whose product (ignoring zeros) fits Index
      const auto shape_it = value.find("shape");
      if (shape_it == value.end() || !shape_it->is_array()) {
        fail(tensor + " has no array \"shape\" (got " + detail::json_excerpt(value) + ")");
      }
      std::uint64_t numel = 1, nonzero_product = 1;
      constexpr auto kIndexMax = static_cast<std::uint64_t>(std::numeric_limits<Index>::max());
      for (const nlohmann::json& extent : *shape_it) {
        if (!extent.is_number_integer()) {
          fail(tensor + " has shape " + detail::json_excerpt(*shape_it) +
               ": extents must be non-negative integers");
        }
        if (extent.is_number_unsigned() ? false : extent.get<std::int64_t>() < 0) {
          fail(tensor + " has shape " + detail::json_excerpt(*shape_it) +
               " with a negative extent");
        }
        const std::uint64_t e = extent.get<std::uint64_t>();
        if (e != 0) {
          if (e > kIndexMax / nonzero_product) {
            fail(tensor + " has shape " + detail::json_excerpt(*shape_it) +
                 ", whose element count overflows");
          }
          nonzero_product *= e;
        }
        numel = e == 0 ? 0 : numel * e;
        entry.shape.push_back(static_cast<Index>(e));
      }
      // data_offsets: [begin, end] within the data section, matching the shape
      const auto offsets_it = value.find("data_offsets");
      if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
          !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
        const bool present = offsets_it != value.end();
        fail(tensor + (present ? " has data_offsets " + detail::json_excerpt(*offsets_it)
                               : std::string(" has no data_offsets")) +
             ", expected [begin, end] with non-negative integers");
      }
      const auto begin = (*offsets_it)[0].get<std::uint64_t>();
      const auto end = (*offsets_it)[1].get<std::uint64_t>();
      if (begin > end || end > data_size) {
        fail(tensor + " has data_offsets [" + std::to_string(begin) + ", " +
             std::to_string(end) + "], outside the data section of " +
             std::to_string(data_size) + " bytes (or begin > end)");
      }
      const std::uint64_t element = dtype_size(entry.dtype);
      if (numel > std::numeric_limits<std::uint64_t>::max() / element ||
          numel * element != end - begin) {
        fail(tensor + " (" + dtype_name(entry.dtype) + ", shape " +
             detail::shape_text(entry.shape) + ") needs " +
             (numel > std::numeric_limits<std::uint64_t>::max() / element
                  ? std::string("more than 2^64")
                  : std::to_string(numel * element)) +
             " bytes, but data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
             "] span " + std::to_string(end - begin));
      }
      entry.begin = static_cast<std::size_t>(begin);
      entry.end = static_cast<std::size_t>(end);
      const auto inserted = tensors_.emplace(name, std::move(entry));
      ranges.push_back({inserted.first->second.begin, inserted.first->second.end,
                        &inserted.first->first});
    }
    // The tensors must tile [0, data_size) exactly, as the reference implementation checks.
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::size_t covered = 0;
    const std::string* previous = nullptr;
    for (const Range& r : ranges) {
      if (r.begin < covered) {
        fail("tensor '" + *r.name + "' (bytes [" + std::to_string(r.begin) + ", " +
             std::to_string(r.end) + ")) overlaps tensor '" + *previous + "' (ending at " +
             std::to_string(covered) + ")");
      }
      if (r.begin > covered) {
        fail("bytes [" + std::to_string(covered) + ", " + std::to_string(r.begin) +
             ") of the data section belong to no tensor (before tensor '" + *r.name + "')");
      }
      covered = r.end;
      previous = r.name;
    }
    if (covered != data_size) {
      fail("the tensors cover " + std::to_string(covered) + " bytes but the data section has " +
           std::to_string(data_size) + " (trailing bytes)");
    }
  }

  template <class Scalar>
  void decode(const std::string& name, const TensorInfo& entry, Scalar* out) const {
    static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double> ||
                      std::is_same_v<Scalar, bool>,
                  "attn::io::SafetensorsFile: read tensors as float, double or bool");
    const unsigned char* src = data_begin() + entry.begin;
    const Index n = entry.numel();
    const auto unsupported = [&](const char* why) {
      throw FormatError("attn::io::SafetensorsFile::get: " + where(name) + " has dtype " +
                        dtype_name(entry.dtype) + ", which cannot be read as " +
                        (std::is_same_v<Scalar, bool> ? "bool" :
                         std::is_same_v<Scalar, float> ? "float" : "double") + why);
    };
    const auto each = [&](auto load) {
      for (Index i = 0; i < n; ++i) out[i] = load(src + static_cast<std::size_t>(i) * dtype_size(entry.dtype));
    };
    const auto as_integer = [&](auto tag) {
      using I = decltype(tag);
      if constexpr (std::is_same_v<Scalar, bool>) {
        each([](const unsigned char* p) { return detail::load_le<I>(p) != 0; });
      } else {
        each([](const unsigned char* p) { return static_cast<Scalar>(detail::load_le<I>(p)); });
      }
    };
    switch (entry.dtype) {
      case DType::kBool:
        if constexpr (!std::is_same_v<Scalar, bool>) {
          unsupported(" (a boolean mask; read it as bool)");
        } else {
          each([](const unsigned char* p) { return *p != 0; });
        }
        return;
      case DType::kU8: return as_integer(std::uint8_t{});
      case DType::kI8: return as_integer(std::int8_t{});
      case DType::kI16: return as_integer(std::int16_t{});
      case DType::kU16: return as_integer(std::uint16_t{});
      case DType::kI32: return as_integer(std::int32_t{});
      case DType::kU32: return as_integer(std::uint32_t{});
      case DType::kI64: return as_integer(std::int64_t{});
      case DType::kU64: return as_integer(std::uint64_t{});
      case DType::kF8E4M3:
      case DType::kF8E5M2:
        unsupported(" (8-bit float formats are not supported)");
        return;
      default:
        break;
    }
    if constexpr (std::is_same_v<Scalar, bool>) {
      unsupported(" (a floating-point tensor; read it as float or double)");
    } else {
      switch (entry.dtype) {
        case DType::kF16:
          each([](const unsigned char* p) {
            return static_cast<Scalar>(detail::half_to_float(detail::load_le<std::uint16_t>(p)));
          });
          return;
        case DType::kBF16:
          each([](const unsigned char* p) {
            return static_cast<Scalar>(
                detail::bfloat16_to_float(detail::load_le<std::uint16_t>(p)));
          });
          return;
        case DType::kF32:
          if constexpr (std::is_same_v<Scalar, float> && detail::host_is_little_endian()) {
            if (n > 0) std::memcpy(out, src, static_cast<std::size_t>(n) * sizeof(float));
          } else {
            each([](const unsigned char* p) { return static_cast<Scalar>(detail::load_le<float>(p)); });
          }
          return;
        case DType::kF64:
          if constexpr (std::is_same_v<Scalar, double> && detail::host_is_little_endian()) {
            if (n > 0) std::memcpy(out, src, static_cast<std::size_t>(n) * sizeof(double));
          } else {
            each([](const unsigned char* p) { return static_cast<Scalar>(detail::load_le<double>(p)); });
          }
          return;
        default:
          return;
      }
    }
  }

  std::shared_ptr<const detail::Storage> storage_ =
      std::make_shared<detail::BufferStorage>(std::vector<unsigned char>{});
  std::string source_ = "<empty>";
  std::size_t header_bytes_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Collects named tensors and writes them as one safetensors file. Tensors are copied in
/// when added (any strides), so the sources need not outlive the writer. float is written
/// as F32, double as F64 and bool as BOOL; add_raw() writes any dtype from raw bytes. The
/// header is padded with spaces to a multiple of 8 bytes and the data is ordered by
/// element size (largest first), then by name, as the reference implementation does.
class SafetensorsWriter {
 public:
  /// Adds tensor `name` (row-major copy of `tensor`).
  /// @throws std::invalid_argument if the name is taken or is "__metadata__".
  template <class Scalar, std::size_t Rank>
  SafetensorsWriter& add(const std::string& name, TensorView<Scalar, Rank> tensor) {
    using S = std::remove_const_t<Scalar>;
    std::vector<unsigned char> bytes(static_cast<std::size_t>(tensor.size()) * sizeof(S));
    unsigned char* out = bytes.data();
    const Scalar* in = tensor.data();
    attn::detail::for_each_offset(tensor.shape(), row_major_strides(tensor.shape()), tensor.strides(),
                            [&](Index o, Index i) {
                              unsigned char* dst = out + static_cast<std::size_t>(o) * sizeof(S);
                              if constexpr (std::is_same_v<S, bool>) {
                                *dst = in[i] ? 1 : 0;
                              } else {
                                detail::store_le<S>(in[i], dst);
                              }
                            });
    return add_raw(name, dtype_of<S>(), std::vector<Index>(tensor.shape().begin(), tensor.shape().end()),
                   std::move(bytes));
  }
  template <class Scalar, std::size_t Rank>
  SafetensorsWriter& add(const std::string& name, const Tensor<Scalar, Rank>& tensor) {
    return add(name, tensor.view());
  }

  /// Adds a tensor from raw little-endian bytes.
  /// @throws std::invalid_argument if the name is taken or reserved, an extent is negative,
  ///         or bytes.size() is not shape x dtype_size(dtype).
  SafetensorsWriter& add_raw(const std::string& name, DType dtype, std::vector<Index> shape,
                             std::vector<unsigned char> bytes) {
    const char* where = "SafetensorsWriter::add";
    detail::io_require<std::invalid_argument>(name != "__metadata__", where, [] {
      return std::string("the name __metadata__ is reserved by the format");
    });
    detail::io_require<std::invalid_argument>(entries_.count(name) == 0, where,
                                              [&] { return "tensor '" + name + "' was already added"; });
    std::size_t numel = 1;
    for (const Index e : shape) {
      detail::io_require<std::invalid_argument>(e >= 0, where, [&] {
        return "tensor '" + name + "' has negative extent in shape " + detail::shape_text(shape);
      });
      numel *= static_cast<std::size_t>(e);
    }
    detail::io_require<std::invalid_argument>(numel * dtype_size(dtype) == bytes.size(), where, [&] {
      return "tensor '" + name + "' (" + dtype_name(dtype) + ", shape " +
             detail::shape_text(shape) + ") needs " + std::to_string(numel * dtype_size(dtype)) +
             " bytes, got " + std::to_string(bytes.size());
    });
    entries_.emplace(name, Entry{dtype, std::move(shape), std::move(bytes)});
    return *this;
  }

  /// Sets a "__metadata__" string entry.
  SafetensorsWriter& set_metadata(const std::string& key, const std::string& value) {
    metadata_[key] = value;
    return *this;
  }

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  std::size_t size() const noexcept { return entries_.size(); }

  /// The file's bytes.
  std::vector<unsigned char> to_bytes() const {
    std::vector<const std::pair<const std::string, Entry>*> order;
    for (const auto& entry : entries_) order.push_back(&entry);
    std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
      return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);
    });
    nlohmann::json header = nlohmann::json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::size_t offset = 0;
    for (const auto* entry : order) {
      const Entry& e = entry->second;
      header[entry->first] = {{"dtype", dtype_name(e.dtype)},
                              {"shape", e.shape},
                              {"data_offsets", {offset, offset + e.bytes.size()}}};
      offset += e.bytes.size();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::vector<unsigned char> out(8 + text.size() + offset);
    detail::store_le<std::uint64_t>(text.size(), out.data());
    std::memcpy(out.data() + 8, text.data(), text.size());
    unsigned char* data = out.data() + 8 + text.size();
    for (const auto* entry : order) {
      const auto& bytes = entry->second.bytes;
      if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
      data += bytes.size();
    }
    return out;
  }

  /// Writes the file to `path` (replacing it).
  /// @throws IoError if it cannot be written.
  void save(const std::string& path) const {
    const std::vector<unsigned char> bytes = to_bytes();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    detail::io_require<IoError>(static_cast<bool>(out), "SafetensorsWriter::save",
                                [&] { return "cannot open '" + path + "' for writing"; });
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    detail::io_require<IoError>(!out.fail(), "SafetensorsWriter::save", [&] {
      return "error while writing " + std::to_string(bytes.size()) + " bytes to '" + path + "'";
    });
  }

 private:
  struct Entry {
    DType dtype;
    std::vector<Index> shape;
    std::vector<unsigned char> bytes;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace attn::io
