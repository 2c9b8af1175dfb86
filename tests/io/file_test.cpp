// SPDX-License-Identifier: MIT
// tests/io/file_test.cpp: attn::io's file handling: opening (regular files only, never
// waiting on a FIFO) and atomic saving (a failed save leaves the old file and no temporary
// file). tests/io/file_nommap_test.cpp builds the same tests with ATTN_IO_HAS_MMAP=0 (the
// standard-library backend: streamed reading, no POSIX calls).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/safetensors.hpp"
#include "io/file_test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace file_test {

#ifndef ATTN_FILE_TEST
#define ATTN_FILE_TEST SafetensorsFileIo  // the test suite's name
#endif

namespace {

using attn::io::FormatError;
using attn::io::IoError;
using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using attn::test::read_bytes;
using attn::test::run_in_child;
using attn::test::TempDir;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

SafetensorsWriter writer_of(attn::Index n, float value) {
  SafetensorsWriter w;
  w.add("x", attn::Tensor<float, 1>({n}, value));
  return w;
}

TEST(ATTN_FILE_TEST, OpensAndSavesRoundTrip) {
  const TempDir dir;
  writer_of(5, 1.5f).save(dir.file("w.safetensors"));
  const SafetensorsFile file = SafetensorsFile::open(dir.file("w.safetensors"));
  EXPECT_EQ((file.get<float, 1>("x")).to_vector(), std::vector<float>(5, 1.5f));
  EXPECT_EQ(file.source(), dir.file("w.safetensors"));
  EXPECT_THAT(dir.others("w.safetensors"), IsEmpty());
}

TEST(ATTN_FILE_TEST, FifoIsRejectedAtOnce) {
  // A blocking open() of a FIFO waits for a writer forever; the child's alarm turns that
  // hang into a failure (status 128 + SIGALRM).
  const TempDir dir;
  const std::string fifo = dir.file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int status = run_in_child(
      [&] {
        try {
          SafetensorsFile::open(fifo);
        } catch (const IoError& e) {
          return std::string(e.what()).find("is not a regular file (a FIFO)") != std::string::npos
                     ? 0
                     : 2;
        }
        return 1;
      },
      10);
  EXPECT_EQ(status, 0) << "0: IoError naming the FIFO; 1: no error; 2: another message; 142: hung";
}

TEST(ATTN_FILE_TEST, DirectoriesAndDevicesAreNotRegularFiles) {
  const TempDir dir;
  EXPECT_THAT(attn::test::thrown<IoError>([&] { SafetensorsFile::open(dir.path()); }),
              HasSubstr("is not a regular file (a directory)"));
  EXPECT_THAT(attn::test::thrown<IoError>([] { SafetensorsFile::open("/dev/null"); }),
              HasSubstr("'/dev/null' is not a regular file (a character device)"));
}

TEST(ATTN_FILE_TEST, ReadsFilesLargerThanOneChunk) {
  const TempDir dir;
  writer_of(100000, -2.0f).save(dir.file("big.safetensors"));  // 400 KB: several 64 KiB reads
  const auto x = SafetensorsFile::open(dir.file("big.safetensors")).values<float>("x");
  EXPECT_EQ(x, std::vector<float>(100000, -2.0f));
}

TEST(ATTN_FILE_TEST, SaveReplacesTheFileAndKeepsItsPermissions) {
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  writer_of(3, 1.0f).save(path);
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  writer_of(7, 2.0f).save(path);
  EXPECT_EQ(SafetensorsFile::open(path).values<float>("x"), std::vector<float>(7, 2.0f));
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0640u);
  EXPECT_THAT(dir.others("w.safetensors"), IsEmpty());
}

TEST(ATTN_FILE_TEST, SaveOverAMappedFileKeepsTheMappingValid) {
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  writer_of(4, 3.0f).save(path);
  const SafetensorsFile old = SafetensorsFile::open(path);
  writer_of(4, 5.0f).save(path);  // in place, this would rewrite the mapped bytes
  EXPECT_EQ(old.values<float>("x"), std::vector<float>(4, 3.0f));
  EXPECT_EQ(SafetensorsFile::open(path).values<float>("x"), std::vector<float>(4, 5.0f));
}

// Saves a 400 KB file over a small one in a forked child after `prepare` (which returns
// false if it cannot set the child up): the save must throw an IoError containing `message`,
// and the old file must be intact with no temporary file beside it.
void expect_failed_save_keeps_the_old_file(const std::function<bool(const TempDir&)>& prepare,
                                           const std::string& message) {
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  writer_of(8, 1.0f).save(path);
  const std::vector<char> before = read_bytes(path);
  const int status = run_in_child([&] {
    if (!prepare(dir)) return 3;
    try {
      writer_of(100000, 2.0f).save(path);
    } catch (const IoError& e) {
      return std::string(e.what()).find(message) != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  EXPECT_EQ(status, 0) << "0: IoError; 1: no error; 2: another message; 3: setup failed";
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_THAT(dir.others("w.safetensors"), IsEmpty());
}

TEST(ATTN_FILE_TEST, SaveFailingPastAFileSizeLimitKeepsTheOldFile) {
  // ulimit -f: with SIGXFSZ ignored, a write past the limit fails with EFBIG. Saving in place
  // truncated the old file, then wrote up to the limit.
  expect_failed_save_keeps_the_old_file(
      [](const TempDir&) {
        std::signal(SIGXFSZ, SIG_IGN);
        const rlimit limit{8192, 8192};
        return ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
      },
      "the file is unchanged");
}

TEST(ATTN_FILE_TEST, SaveKilledBySigxfszKeepsTheOldFileButLeavesTheTemporary) {
  // The caveat docs/io.md states: past a file size limit the kernel sends SIGXFSZ, which
  // ends a process that does not ignore it before save() can clean up.
  const TempDir dir;
  const std::string path = dir.file("w.safetensors");
  writer_of(8, 1.0f).save(path);
  const std::vector<char> before = read_bytes(path);
  const int status = run_in_child([&] {
    const rlimit limit{8192, 8192};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
    writer_of(100000, 2.0f).save(path);
    return 1;
  });
  EXPECT_EQ(status, 128 + SIGXFSZ) << "3: setup failed; 1: the save succeeded";
  EXPECT_EQ(read_bytes(path), before);
  const auto others = dir.others("w.safetensors");
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].rfind(".w.safetensors.tmp-", 0), 0u) << others[0];
}

TEST(ATTN_FILE_TEST, SaveReplacesASymbolicLinkInsteadOfFollowingIt) {
  const TempDir dir;
  const std::string target = dir.file("target.safetensors"), link = dir.file("link.safetensors");
  writer_of(3, 1.0f).save(target);
  const std::vector<char> target_bytes = read_bytes(target);
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  writer_of(5, 2.0f).save(link);
  EXPECT_FALSE(std::filesystem::is_symlink(link));
  EXPECT_EQ(SafetensorsFile::open(link).values<float>("x"), std::vector<float>(5, 2.0f));
  EXPECT_EQ(read_bytes(target), target_bytes);
}

TEST(ATTN_FILE_TEST, SaveIntoADirectoryThatCannotBeWrittenKeepsTheOldFile) {
  expect_failed_save_keeps_the_old_file(
      [](const TempDir& dir) {
        // root writes anywhere: drop to nobody first
        return ::chmod(dir.path().c_str(), 0555) == 0 &&
               (::geteuid() != 0 || (::setgid(65534) == 0 && ::setuid(65534) == 0));
      },
      "cannot create a temporary file");
}

TEST(ATTN_FILE_TEST, SaveIntoAMissingDirectoryNamesThePath) {
  EXPECT_THAT(attn::test::thrown<IoError>(
                  [] { writer_of(1, 0.0f).save("/nonexistent/dir/out.safetensors"); }),
              HasSubstr("cannot open '/nonexistent/dir/out.safetensors' for writing"));
}

TEST(ATTN_FILE_TEST, MissingOrEmptyFile) {
  EXPECT_THAT(
      attn::test::thrown<IoError>([] { SafetensorsFile::open("/nonexistent/dir/w.safetensors"); }),
      HasSubstr("cannot open '/nonexistent/dir/w.safetensors'"));
  const TempDir dir;
  std::ofstream(dir.file("empty")).close();
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { SafetensorsFile::open(dir.file("empty")); }),
              HasSubstr("file is 0 bytes"));
}

TEST(ATTN_FILE_TEST, FromStreamReadsEverything) {
  const std::vector<unsigned char> bytes = writer_of(70000, 4.0f).to_bytes();
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  EXPECT_EQ(SafetensorsFile::from_stream(in, "pipe").values<float>("x"),
            std::vector<float>(70000, 4.0f));
}

}  // namespace

}  // namespace file_test

#undef ATTN_FILE_TEST

#include "support/bodies_end.hpp"
