// SPDX-License-Identifier: MIT
// tests/io/attn_run_output_test.cpp: `attn_run --output` (and SafetensorsWriter::save) write
// only regular files, or create new ones. A FIFO, a socket, a character device or a
// directory at the path, or a symbolic link to one, is refused before anything is computed
// (the error names the output, even with a weights file that does not exist) and is left as
// it was. The atomic rename once went over whatever was there: naming a FIFO replaced it with
// a regular file and exited 0; run as root on /dev/full it replaced the device node.
//
// The character device: /dev/null when not running as root (which cannot replace it: the
// check that it is unchanged is read-only); as root, a device node made with mknod in the
// test's own directory, so nothing outside it can be touched.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "attn_run/cli.hpp"
#include "io/file_test_support.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace attn_run_output_test {

namespace {

using attn::io::SafetensorsWriter;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Files {
  attn::test::TempDir dir;
  std::string weights = dir.file("w.safetensors"), input = dir.file("x.safetensors");
  Files() {
    attn::TorchGenerator gen(3);
    const attn::MultiHeadAttention<float> m(attn::MultiHeadAttentionOptions::pytorch(8, 2), gen);
    SafetensorsWriter w;
    attn::io::save_state_dict(m, w);
    w.save(weights);
    SafetensorsWriter x;
    x.add("query", attn::test::random_tensor<float, 3>({2, 3, 8}, 7));
    x.save(input);
  }
};

/// attn_run's exit status for --output `output` (its stderr in `err`).
int run(const Files& f, const std::string& output, std::string& err,
        const std::string& weights = "") {
  std::ostringstream out, errors;
  const int code = attn_run::main({"--weights", weights.empty() ? f.weights : weights, "--input",
                                   f.input, "--output", output, "--num-heads", "2"},
                                  out, errors);
  err = errors.str();
  return code;
}

struct stat lstat_of(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
  return info;
}

/// The output `path` (a special file, or a link to one) is refused with a message naming it
/// and `kind`, before the (missing) weights are opened, and `check` still holds after.
void expect_refused(const Files& f, const std::string& path, const std::string& kind) {
  SCOPED_TRACE(path);
  const struct stat before = lstat_of(path);
  std::string err;
  EXPECT_EQ(run(f, path, err, f.dir.file("missing.safetensors")), 1);
  EXPECT_THAT(err, AllOf(HasSubstr(path), HasSubstr(kind), HasSubstr("not a regular file")));
  EXPECT_THAT(err, ::testing::Not(HasSubstr("missing.safetensors")));  // checked first
  // With every input fine: still refused.
  EXPECT_EQ(run(f, path, err), 1);
  EXPECT_THAT(err, HasSubstr(kind));
  const struct stat after = lstat_of(path);
  EXPECT_EQ(after.st_mode, before.st_mode);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(after.st_rdev, before.st_rdev);
}

TEST(AttnRunOutput, AFifoIsRefusedAndKept) {
  const Files f;
  const std::string fifo = f.dir.file("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(f, fifo, "a FIFO");
  EXPECT_TRUE(S_ISFIFO(lstat_of(fifo).st_mode));
}

TEST(AttnRunOutput, ASymbolicLinkToAFifoIsRefusedAndBothKept) {
  const Files f;
  const std::string fifo = f.dir.file("out.fifo"), link = f.dir.file("out.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(fifo.c_str(), link.c_str()), 0);
  expect_refused(f, link, "a FIFO");
  EXPECT_TRUE(S_ISLNK(lstat_of(link).st_mode));
  EXPECT_TRUE(S_ISFIFO(lstat_of(fifo).st_mode));
}

TEST(AttnRunOutput, ASocketIsRefusedAndKept) {
  const Files f;
  const std::string path = f.dir.file("out.sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(address.sun_path));
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  expect_refused(f, path, "a socket");
  EXPECT_TRUE(S_ISSOCK(lstat_of(path).st_mode));
  ::close(fd);
}

TEST(AttnRunOutput, ACharacterDeviceIsRefusedAndKept) {
  const Files f;
  std::string device = "/dev/null";
  if (::geteuid() == 0) {  // root could replace /dev/null: use a node of our own instead
    device = f.dir.file("null.device");
    ASSERT_EQ(::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  }
  ASSERT_TRUE(S_ISCHR(lstat_of(device).st_mode));
  expect_refused(f, device, "a character device");
  EXPECT_TRUE(S_ISCHR(lstat_of(device).st_mode));
  // Through a symbolic link too.
  const std::string link = f.dir.file("dev.safetensors");
  ASSERT_EQ(::symlink(device.c_str(), link.c_str()), 0);
  expect_refused(f, link, "a character device");
}

TEST(AttnRunOutput, ADirectoryIsRefused) {
  const Files f;
  const std::string dir = f.dir.file("out.d");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  expect_refused(f, dir, "a directory");
}

TEST(AttnRunOutput, RegularFilesNewFilesAndLinksToThemAreWritten) {
  const Files f;
  std::string err;
  const std::string fresh = f.dir.file("new.safetensors");
  EXPECT_EQ(run(f, fresh, err), 0) << err;
  EXPECT_TRUE(S_ISREG(lstat_of(fresh).st_mode));
  EXPECT_EQ(run(f, fresh, err), 0) << err;  // over a regular file
  // A link to a regular file, and a dangling link: the link is replaced by the file.
  const std::string link = f.dir.file("link.safetensors"), dangling = f.dir.file("d.safetensors");
  ASSERT_EQ(::symlink(fresh.c_str(), link.c_str()), 0);
  ASSERT_EQ(::symlink(f.dir.file("nowhere").c_str(), dangling.c_str()), 0);
  EXPECT_EQ(run(f, link, err), 0) << err;
  EXPECT_EQ(run(f, dangling, err), 0) << err;
  EXPECT_TRUE(S_ISREG(lstat_of(link).st_mode));
  EXPECT_TRUE(S_ISREG(lstat_of(dangling).st_mode));
  EXPECT_EQ(attn::io::SafetensorsFile::open(link).values<float>("output"),
            attn::io::SafetensorsFile::open(fresh).values<float>("output"));
  // No temporary file is left behind.
  for (const auto& e : std::filesystem::directory_iterator(f.dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST(AttnRunOutput, TheWriterRefusesSpecialFilesToo) {
  const attn::test::TempDir dir;
  const std::string fifo = dir.file("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  SafetensorsWriter w;
  w.add("x", attn::Tensor<float, 1>({3}));
  EXPECT_THAT(attn::test::thrown<attn::io::IoError>([&] { w.save(fifo); }),
              AllOf(HasSubstr(fifo), HasSubstr("a FIFO"), HasSubstr("not a regular file")));
  EXPECT_TRUE(S_ISFIFO(lstat_of(fifo).st_mode));
  EXPECT_THAT(dir.others("out.fifo"), ::testing::IsEmpty());
}

}  // namespace

}  // namespace attn_run_output_test

#include "support/bodies_end.hpp"
