// SPDX-License-Identifier: MIT
// tests/tensor/types_pytorch_test.cpp: bfloat16 and float16 against PyTorch 1.13's own
// conversions, bit for bit, on the chosen values of tests/fixtures/pytorch/types_reference.hpp
// (scripts/types_reference.py): signed zeros, infinities, NaNs with payloads, subnormals, ties
// and near ties, overflow boundaries; scalar conversions and attn::convert on every kernel set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attn/attn.hpp"
#include "fixtures/pytorch/types_reference.hpp"
#include "support/test_support.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace types_pytorch_test {

namespace {

namespace ref = attn::test::pytorch;
using attn::Index;

template <class To, class From, std::size_t N>
std::vector<To> bit_casts(const From (&bits)[N]) {
  static_assert(sizeof(To) == sizeof(From));
  std::vector<To> out(N);
  std::memcpy(out.data(), bits, sizeof bits);
  return out;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

template <std::size_t N>
constexpr Index count(const std::uint16_t (&)[N]) {
  return Index(N);
}

/// Bulk conversion of `src` on every set, compared with `expected` bits.
template <class To, class From, class Bits, std::size_t N>
void check_bulk(const std::vector<From>& src, const Bits (&expected)[N], const char* what) {
  ASSERT_EQ(src.size(), N);
  std::vector<To> out(N);
  for (const attn::Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    attn::convert(attn::TensorView<const From, 1>(src.data(), {Index(N)}),
                  attn::TensorView<To, 1>(out.data(), {Index(N)}));
    for (std::size_t i = 0; i < N; ++i) {
      Bits got;
      std::memcpy(&got, &out[i], sizeof got);
      ASSERT_EQ(got, expected[i]) << what << " element " << i << " on " << attn::isa_name(isa);
    }
  }
  attn::set_isa(attn::best_isa());
}

TEST(TypesPyTorch, FloatToBFloat16MatchesCBFloat16BitForBit) {
  const auto floats = bit_casts<float>(ref::kFloatInputs);
  ASSERT_EQ(floats.size(), std::size(ref::kBf16FromFloatScalar));
  for (std::size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(attn::bfloat16(floats[i]).bits(), ref::kBf16FromFloatScalar[i])
        << "float 0x" << std::hex << ref::kFloatInputs[i];
  }
  check_bulk<attn::bfloat16>(floats, ref::kBf16FromFloatScalar, "float -> bfloat16");
}

// PyTorch's vectorised tensor.to() (AVX2/AVX-512 capability) agrees everywhere but in the NaN
// bits, where it writes a different quiet NaN (0xFFFF): the fixture shows it, and attn keeps
// c10::BFloat16's 0x7FC0.
TEST(TypesPyTorch, PyTorchsVectorisedBFloat16DiffersOnlyInTheNaNBits) {
  int nan_inputs = 0;
  for (std::size_t i = 0; i < std::size(ref::kFloatInputs); ++i) {
    const bool nan = (ref::kFloatInputs[i] & 0x7FFFFFFFu) > 0x7F800000u;
    if (!nan) {
      EXPECT_EQ(ref::kBf16FromFloatNative[i], ref::kBf16FromFloatScalar[i]) << i;
      continue;
    }
    ++nan_inputs;
    EXPECT_EQ(ref::kBf16FromFloatScalar[i], 0x7FC0) << i;
    EXPECT_GT(ref::kBf16FromFloatNative[i] & 0x7FFF, 0x7F80) << "still a NaN, element " << i;
  }
  EXPECT_GE(nan_inputs, 10);
}

TEST(TypesPyTorch, FloatToFloat16MatchesPyTorchBitForBit) {
  const auto floats = bit_casts<float>(ref::kFloatInputs);
  for (std::size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(attn::float16(floats[i]).bits(), ref::kF16FromFloat[i])
        << "float 0x" << std::hex << ref::kFloatInputs[i];
  }
  check_bulk<attn::float16>(floats, ref::kF16FromFloat, "float -> float16");
}

// attn rounds a double once; PyTorch rounds it to float first. Through float attn gives
// PyTorch's bits; directly, the exactly rounded ones (computed in rational arithmetic by the
// script), which differ on the near-tie inputs.
TEST(TypesPyTorch, DoubleConversionsRoundOnceAndThroughFloatGivePyTorchsBits) {
  const auto doubles = bit_casts<double>(ref::kDoubleInputs);
  int bf16_differences = 0, f16_differences = 0;
  for (std::size_t i = 0; i < doubles.size(); ++i) {
    const double x = doubles[i];
    ASSERT_EQ(attn::bfloat16(x).bits(), ref::kBf16FromDoubleExact[i]) << std::hex << x;
    ASSERT_EQ(attn::float16(x).bits(), ref::kF16FromDoubleExact[i]) << std::hex << x;
    ASSERT_EQ(attn::bfloat16(static_cast<float>(x)).bits(), ref::kBf16FromDoubleScalar[i]) << x;
    ASSERT_EQ(attn::float16(static_cast<float>(x)).bits(), ref::kF16FromDouble[i]) << x;
    bf16_differences += ref::kBf16FromDoubleExact[i] != ref::kBf16FromDoubleScalar[i];
    f16_differences += ref::kF16FromDoubleExact[i] != ref::kF16FromDouble[i];
  }
  EXPECT_GT(bf16_differences, 100);  // the near ties: PyTorch's double rounding shows
  EXPECT_GT(f16_differences, 100);
  check_bulk<attn::bfloat16>(doubles, ref::kBf16FromDoubleExact, "double -> bfloat16");
  check_bulk<attn::float16>(doubles, ref::kF16FromDoubleExact, "double -> float16");
}

TEST(TypesPyTorch, BFloat16AndFloat16ToFloatMatchPyTorchBitForBit) {
  std::vector<attn::bfloat16> bf(std::size(ref::kBf16Patterns));
  for (std::size_t i = 0; i < bf.size(); ++i) {
    bf[i] = attn::bfloat16::from_bits(ref::kBf16Patterns[i]);
    ASSERT_EQ(bits_of(bf[i]), ref::kFloatFromBf16[i]) << std::hex << ref::kBf16Patterns[i];
  }
  check_bulk<float>(bf, ref::kFloatFromBf16, "bfloat16 -> float");
  std::vector<attn::float16> h(std::size(ref::kF16Patterns));
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = attn::float16::from_bits(ref::kF16Patterns[i]);
    ASSERT_EQ(bits_of(h[i]), ref::kFloatFromF16[i]) << std::hex << ref::kF16Patterns[i];
  }
  check_bulk<float>(h, ref::kFloatFromF16, "float16 -> float");
  EXPECT_GT(count(ref::kF16Patterns), 1000);
}

}  // namespace

}  // namespace types_pytorch_test

#include "support/bodies_end.hpp"
