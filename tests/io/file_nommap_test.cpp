// SPDX-License-Identifier: MIT
// tests/io/file_nommap_test.cpp: tests/io/file_test.cpp with ATTN_IO_HAS_MMAP=0, the
// standard-library backend (files streamed into memory, no POSIX calls), and a check that
// this configuration includes no POSIX header of its own.
#define ATTN_IO_HAS_MMAP 0
#include "attn/io/io.hpp"

// <sys/mman.h> and <fcntl.h> come only from attn/io/detail/file.hpp, and only with mmap on
// (GoogleTest, included before this file by the precompiled header, includes neither).
#if defined(MAP_FAILED) || defined(PROT_READ) || defined(O_NONBLOCK) || defined(O_CREAT)
#error "attn/io/io.hpp with ATTN_IO_HAS_MMAP=0 included <sys/mman.h> or <fcntl.h>"
#endif

#define ATTN_FILE_TEST SafetensorsFileIoStreamed
#include "file_test.cpp"  // NOLINT(bugprone-suspicious-include)
