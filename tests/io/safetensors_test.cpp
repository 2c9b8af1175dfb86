// SPDX-License-Identifier: MIT
// tests/io/safetensors_test.cpp: safetensors round trips, dtype conversion, and a clear
// FormatError (never a crash) for every kind of malformed file.
#include "attn/io/safetensors.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace safetensors_test {

namespace {

using attn::io::DType;
using attn::io::FormatError;
using attn::io::IoError;
using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A file from a header text and `data_bytes` bytes of data (value i at byte i).
std::vector<unsigned char> make_file(const std::string& header, std::size_t data_bytes,
                                     std::uint64_t header_length = UINT64_MAX) {
  const std::uint64_t n = header_length == UINT64_MAX ? header.size() : header_length;
  std::vector<unsigned char> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (std::size_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<unsigned char>(i));
  return bytes;
}

SafetensorsFile parse(const std::string& header, std::size_t data_bytes) {
  return SafetensorsFile::from_bytes(make_file(header, data_bytes), "test.safetensors");
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "attn_io_" + name; }

TEST(Safetensors, RoundTripsFloatDoubleAndBool) {
  const auto f = attn::test::random_tensor<float, 3>({2, 3, 4}, 1);
  const auto d = attn::test::random_tensor<double, 2>({5, 1}, 2);
  attn::Tensor<bool, 2> m({2, 3});
  m(0, 1) = true;
  m(1, 2) = true;
  SafetensorsWriter writer;
  writer.add("layer.weight", f).add("d", d).add("mask", m).set_metadata("format", "pt");
  const SafetensorsFile file = SafetensorsFile::from_bytes(writer.to_bytes());

  EXPECT_THAT(file.names(), ElementsAre("d", "layer.weight", "mask"));
  EXPECT_EQ(file.dtype("layer.weight"), DType::kF32);
  EXPECT_EQ(file.dtype("d"), DType::kF64);
  EXPECT_EQ(file.dtype("mask"), DType::kBool);
  EXPECT_THAT(file.shape("layer.weight"), ElementsAre(2, 3, 4));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(attn::test::to_vector((file.get<float, 3>("layer.weight"))), f.to_vector());
  EXPECT_EQ(attn::test::to_vector((file.get<double, 2>("d"))), d.to_vector());
  EXPECT_EQ((file.get<bool, 2>("mask")).to_vector(), m.to_vector());
}

TEST(Safetensors, WritesStridedViewsInRowMajorOrder) {
  const auto t = attn::test::random_tensor<double, 2>({3, 4}, 3);
  SafetensorsWriter writer;
  writer.add("t", attn::transpose(t.view()));
  const auto back = SafetensorsFile::from_bytes(writer.to_bytes()).get<double, 2>("t");
  ASSERT_THAT(back.shape(), ElementsAre(4, 3));
  EXPECT_EQ(back(1, 2), t(2, 1));
}

TEST(Safetensors, HeaderIsPaddedToEightBytes) {
  SafetensorsWriter writer;
  writer.add("x", attn::Tensor<float, 1>({3}, 1.0f));
  const auto bytes = writer.to_bytes();
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
}

TEST(Safetensors, OpensMemoryMappedFileAndFloatToDoubleConverts) {
  const std::string path = temp_path("mapped.safetensors");
  attn::Tensor<float, 2> t({2, 2}, {1.5f, -2.0f, 0.25f, 8.0f});
  SafetensorsWriter writer;
  writer.add("t", t);
  writer.save(path);
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.source(), path);
  EXPECT_THAT((file.get<double, 2>("t")).to_vector(), ElementsAre(1.5, -2.0, 0.25, 8.0));
  std::remove(path.c_str());
}

TEST(Safetensors, ConvertsHalfAndBfloat16Exactly) {
  // F16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), +inf, NaN
  const std::vector<std::uint16_t> half{0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x7e00};
  // BF16: 1.0, -0.5, 3.0
  const std::vector<std::uint16_t> bf16{0x3f80, 0xbf00, 0x4040};
  const auto to_bytes = [](const std::vector<std::uint16_t>& v) {
    std::vector<unsigned char> out;
    for (const auto x : v) {
      out.push_back(static_cast<unsigned char>(x & 0xff));
      out.push_back(static_cast<unsigned char>(x >> 8));
    }
    return out;
  };
  SafetensorsWriter writer;
  writer.add_raw("h", DType::kF16, {6}, to_bytes(half));
  writer.add_raw("b", DType::kBF16, {3}, to_bytes(bf16));
  const SafetensorsFile file = SafetensorsFile::from_bytes(writer.to_bytes());
  const auto h = (file.get<float, 1>("h")).to_vector();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[4], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(h[5]));
  EXPECT_THAT((file.get<double, 1>("b")).to_vector(), ElementsAre(1.0, -0.5, 3.0));
}

TEST(Safetensors, ConvertsIntegersToFloatAndBool) {
  SafetensorsWriter writer;
  writer.add_raw("i", DType::kI64, {2},
                 {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 3, 0, 0, 0, 0, 0, 0, 0});
  writer.add_raw("u", DType::kU8, {3}, {0, 1, 7});
  const SafetensorsFile file = SafetensorsFile::from_bytes(writer.to_bytes());
  EXPECT_THAT((file.get<float, 1>("i")).to_vector(), ElementsAre(-1.0f, 3.0f));
  EXPECT_THAT((file.get<bool, 1>("u")).to_vector(), ElementsAre(false, true, true));
}

TEST(Safetensors, BoolBytesOtherThanOneReadAsTrue) {
  // data bytes 0, 1, 2
  const auto file = parse(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 3);
  EXPECT_THAT((file.get<bool, 1>("m")).to_vector(), ElementsAre(false, true, true));
}

TEST(Safetensors, AcceptsEmptyAndZeroSizedTensorsAndScalars) {
  EXPECT_EQ(parse("{}", 0).size(), 0u);
  const auto file = parse(R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                          R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                          4);
  EXPECT_EQ((file.get<float, 2>("z")).size(), 0);
  EXPECT_THAT((file.get<float, 1>("s")).shape(), ElementsAre(1));
}

// ---- malformed files: each is a FormatError naming the file and the values ----

TEST(SafetensorsMalformed, FileShorterThanLengthField) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] {
                SafetensorsFile::from_bytes(std::vector<unsigned char>{1, 2, 3}, "short");
              }),
              HasSubstr("'short': file is 3 bytes"));
}

TEST(SafetensorsMalformed, HugeHeaderLength) {
  const auto bytes = make_file("{}", 0, 1ull << 40);
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { SafetensorsFile::from_bytes(bytes); }),
              HasSubstr("header length 1099511627776 exceeds the limit"));
}

TEST(SafetensorsMalformed, HeaderLengthPastEndOfFile) {
  const auto bytes = make_file("{}", 0, 50);
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { SafetensorsFile::from_bytes(bytes); }),
              HasSubstr("header length 50 exceeds the 2 bytes"));
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse("{\"a\": [1, 2", 0); }),
              HasSubstr("header is not valid JSON"));
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse("[1,2,3]", 0); }),
              HasSubstr("header is a JSON array, expected an object"));
}

TEST(SafetensorsMalformed, MetadataNotStrings) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse(R"({"__metadata__":{"epoch":3}})", 0); }),
              HasSubstr("__metadata__ entry 'epoch' is 3"));
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse(R"({"__metadata__":[1]})", 0); }),
              HasSubstr("__metadata__ is a JSON array"));
}

TEST(SafetensorsMalformed, EntryNotAnObject) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse(R"({"w":5})", 0); }),
              HasSubstr("tensor 'w' is 5"));
}

TEST(SafetensorsMalformed, UnknownDtype) {
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4); }),
              HasSubstr("tensor 'w' has unknown dtype \"F33\""));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4); }),
              HasSubstr("tensor 'w' has no string \"dtype\""));
}

TEST(SafetensorsMalformed, NegativeOrNonIntegerShape) {
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,4]}})", 4); }),
              HasSubstr("shape [-1,4] with a negative extent"));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,4]}})", 4); }),
              HasSubstr("extents must be non-negative integers"));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,4]}})", 4); }),
              HasSubstr("tensor 'w' has no array \"shape\""));
}

TEST(SafetensorsMalformed, OverflowingShape) {
  EXPECT_THAT(
      attn::test::thrown<FormatError>([] {
        parse(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4);
      }),
      HasSubstr("whose element count overflows"));
  // zero elements, but the other extents would still overflow strides
  EXPECT_THAT(
      attn::test::thrown<FormatError>([] {
        parse(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0);
      }),
      HasSubstr("overflows"));
  // element count fits, bytes (x8) overflow 2^64
  EXPECT_THAT(attn::test::thrown<FormatError>([] {
                parse(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})",
                      8);
              }),
              HasSubstr("needs more than 2^64 bytes"));
}

TEST(SafetensorsMalformed, BadDataOffsets) {
  EXPECT_THAT(
      attn::test::thrown<FormatError>([] { parse(R"({"w":{"dtype":"F32","shape":[1]}})", 4); }),
      HasSubstr("tensor 'w' has no data_offsets"));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4); }),
              HasSubstr("has data_offsets [0]"));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4); }),
              HasSubstr("has data_offsets [-4,0]"));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4); }),
              HasSubstr("data_offsets [4, 0], outside the data"));
}

TEST(SafetensorsMalformed, OffsetsPastTheDataAreTruncation) {
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10); }),
              HasSubstr("data_offsets [0, 16], outside the data section of 10 bytes"));
}

TEST(SafetensorsMalformed, ShapeAndByteCountDisagree) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] {
                parse(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
              }),
              HasSubstr("tensor 'w' (F32, shape [2, 3]) needs 24 bytes, but data_offsets "
                        "[0, 20] span 20"));
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] {
                parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12);
              }),
              HasSubstr("tensor 'b' (bytes [4, 12)) overlaps tensor 'a'"));
}

TEST(SafetensorsMalformed, GapAndTrailingBytes) {
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8); }),
              HasSubstr("bytes [0, 4) of the data section belong to no tensor"));
  EXPECT_THAT(attn::test::thrown<FormatError>(
                  [] { parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9); }),
              HasSubstr("cover 4 bytes but the data section has 9"));
}

TEST(SafetensorsMalformed, RankMismatchOnGet) {
  const auto file = parse(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16);
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { (file.get<float, 3>("w")); }),
              HasSubstr("tensor 'w' has rank 2 (shape [2, 2]), requested rank 3"));
}

TEST(SafetensorsMalformed, UnconvertibleDtypes) {
  const auto file = parse(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]},)"
                          R"("w":{"dtype":"F32","shape":[1],"data_offsets":[2,6]},)"
                          R"("e":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[6,7]}})",
                          7);
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { (file.get<float, 1>("m")); }),
              HasSubstr("'m' has dtype BOOL, which cannot be read as float"));
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { (file.get<bool, 1>("w")); }),
              HasSubstr("'w' has dtype F32, which cannot be read as bool"));
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { (file.get<double, 1>("e")); }),
              HasSubstr("8-bit float formats are not supported"));
}

TEST(SafetensorsMalformed, MissingTensorListsTheNames) {
  const auto file = parse(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_THAT(attn::test::thrown<FormatError>([&] { (file.get<float, 1>("bias")); }),
              HasSubstr("has no tensor 'bias'; it has 1 tensor(s): w"));
}

// ---- nesting: rejected before anything recurses (a 100000-deep header used to overflow the
// stack in the error message's dump(), in release builds as under ASan) ----

std::string nested(std::size_t depth, const std::string& inner = "") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(SafetensorsNesting, DeepHeadersAreFormatErrorsWherever) {
  const std::string deep = nested(100000);
  const std::vector<std::string> headers = {
      "{\"x\":" + deep + "}",                                                   // a tensor entry
      R"({"w":{"dtype":)" + deep + R"(,"shape":[1],"data_offsets":[0,4]}})",    // a dtype
      R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,4]}})",  // a shape
      R"({"__metadata__":{"k":)" + deep + "}}",                                 // __metadata__
      R"({"__metadata__":)" + deep + "}",
      deep,  // the header
  };
  for (const std::string& header : headers) {
    SCOPED_TRACE(header.substr(0, 40));
    EXPECT_THAT(attn::test::thrown<FormatError>([&] { parse(header, 4); }),
                HasSubstr("nests arrays and objects deeper than 8"));
  }
}

TEST(SafetensorsNesting, DepthIsCountedOutsideStringsOnly) {
  // 8 levels is the limit: the value below is then an ordinary error, with a short excerpt.
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse("{\"x\":" + nested(7, "1") + "}", 0); }),
              HasSubstr("tensor 'x' is [[[[[[[1]]]]]]], expected"));
  EXPECT_THAT(attn::test::thrown<FormatError>([] { parse("{\"x\":" + nested(8, "1") + "}", 0); }),
              HasSubstr("deeper than 8 levels (at byte 12 "));
  // brackets and escaped quotes inside strings do not nest
  const auto file = parse(R"({"__metadata__":{"k":"[[[[[[[[[[{{{{{{{{{{\"[[[[[[[[[["}})", 0);
  EXPECT_EQ(file.metadata().at("k"), "[[[[[[[[[[{{{{{{{{{{\"[[[[[[[[[[");
}

TEST(SafetensorsNesting, ErrorExcerptsStayShort) {
  std::string wide = "[";  // a 200 KB shape: the message quotes 80 characters of it
  for (int i = 0; i < 50000; ++i) wide += "-1,";
  wide += "-1]";
  try {
    parse(R"({"w":{"dtype":"F32","shape":)" + wide + R"(,"data_offsets":[0,4]}})", 4);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("[-1,-1,-1,"));
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

// ---- duplicate keys: nlohmann keeps the last one silently ----

TEST(SafetensorsMalformed, DuplicateTensorNamesAndKeys) {
  EXPECT_THAT(attn::test::thrown<FormatError>([] {
                parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8);
              }),
              HasSubstr("the header names tensor 'a' more than once"));
  EXPECT_THAT(attn::test::thrown<FormatError>([] {
                parse(R"({"a":{"dtype":"F64","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
              }),
              HasSubstr("tensor 'a' has key 'dtype' more than once"));
  EXPECT_THAT(
      attn::test::thrown<FormatError>([] { parse(R"({"__metadata__":{"k":"1","k":"2"}})", 0); }),
      HasSubstr("__metadata__ has key 'k' more than once"));
  // the same name in different objects is fine
  EXPECT_EQ(parse(R"({"dtype":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4).size(), 1u);
}

// ---- sizes: every extent product and byte count is checked ----

TEST(SafetensorsWriter, ByteCountsThatOverflowAreRejected) {
  SafetensorsWriter writer;
  // 2^62 x 4 x 4 bytes: the byte count wraps to 0 in 64 bits, which an empty buffer matched
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([&] {
                writer.add_raw("w", DType::kF32, {attn::Index(1) << 62, 4}, {});
              }),
              HasSubstr("tensor 'w' (F32, shape [4611686018427387904, 4]) has a byte count "
                        "that overflows"));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([&] {
                writer.add_raw("w", DType::kU8, {attn::Index(1) << 32, attn::Index(1) << 32}, {});
              }),
              HasSubstr("overflows"));
  // a broadcast view of 2^62 floats: sizes fit an index, bytes (2^64) do not
  const float one = 1.0f;
  const attn::TensorView<const float, 1> broadcast(&one, {attn::Index(1) << 62}, {0});
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([&] { writer.add("b", broadcast); }),
              HasSubstr("has a byte count that overflows"));
  EXPECT_EQ(writer.size(), 0u);
}

TEST(SafetensorsWriter, NamesAndMetadataMustBeUtf8) {
  SafetensorsWriter writer;
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [&] { writer.add("\xff", attn::Tensor<float, 1>({1})); }),
              HasSubstr("valid UTF-8"));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([&] { writer.set_metadata("k", "\xc3"); }),
              HasSubstr("valid UTF-8"));
  EXPECT_NO_THROW(writer.to_bytes());
}

TEST(SafetensorsWriter, RejectsDuplicateReservedAndMissizedTensors) {
  SafetensorsWriter writer;
  writer.add("a", attn::Tensor<float, 1>({2}));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [&] { writer.add("a", attn::Tensor<float, 1>({2})); }),
              HasSubstr("tensor 'a' was already added"));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>(
                  [&] { writer.add("__metadata__", attn::Tensor<float, 1>({2})); }),
              HasSubstr("reserved"));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([&] {
                writer.add_raw("b", DType::kF32, {3}, {0, 0, 0, 0});
              }),
              HasSubstr("needs 12 bytes, got 4"));
  EXPECT_THAT(attn::test::thrown<IoError>([&] { writer.save("/nonexistent/dir/out.safetensors"); }),
              HasSubstr("cannot open '/nonexistent/dir/out.safetensors'"));
}

}  // namespace

}  // namespace safetensors_test

#include "support/bodies_end.hpp"
