// SPDX-License-Identifier: MIT
// tests/tensor/types_convert_test.cpp: attn::convert between element types (errors, strides,
// odd lengths, every kernel set against the scalar conversion, every pair of types), tensors and
// views of the storage types, and the Eigen bridge for them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace types_convert_test {

namespace {

using attn::bfloat16;
using attn::float16;
using attn::float8_e4m3;
using attn::float8_e5m2;
using attn::Index;
using attn::Isa;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using ::testing::AllOf;
using ::testing::HasSubstr;

/// The bits of any element (float as uint32, double as uint64, storage types as theirs).
template <class T>
std::uint64_t bits_of(const T& x) {
  if constexpr (std::is_same_v<T, float>) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  } else if constexpr (std::is_same_v<T, double>) {
    std::uint64_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  } else {
    return x.bits();
  }
}

/// Values that exercise every rule: ordinary numbers over a wide range, ties, signed zeros,
/// infinities, NaNs, subnormals and beyond every format's range.
std::vector<float> interesting_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> exponent(-30.0, 20.0);
  std::vector<float> v(n);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            1.0f + 0x1p-8f,   // a bfloat16 tie
                            1.0f + 0x1p-11f,  // a float16 tie
                            65520.0f,
                            464.0f,
                            61440.0f,
                            0x1p-25f,
                            0x1p-149f,
                            3.4e38f};
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = i < std::size(specials)
               ? specials[i]
               : static_cast<float>(std::exp2(exponent(gen)) * (i % 3 ? 1 : -1));
  }
  return v;
}

template <class To, class From>
To reference(From x) {  // the rule, spelled out with the types' own conversions
  if constexpr (std::is_same_v<From, To>) {
    return x;
  } else if constexpr (std::is_same_v<To, float> || std::is_same_v<To, double>) {
    if constexpr (attn::is_storage_type_v<From>) {
      return static_cast<To>(static_cast<float>(x));
    } else {
      return static_cast<To>(x);
    }
  } else if constexpr (attn::is_storage_type_v<From>) {
    return To(static_cast<float>(x));
  } else {
    return To(x);
  }
}

// ---- errors ----

// std::numeric_limits of the storage types: the members all of them share with float (one
// base, StorageFloatLimits) and each type's own, against its format (digits: mantissa bits
// + 1; the largest exponent; an infinity unless the format has none), and epsilon and max as
// values.
template <class T>
void check_limits(int digits, int max_exponent, bool infinity, float epsilon, float largest) {
  using L = std::numeric_limits<T>;
  using F = std::numeric_limits<float>;
  static_assert(L::is_specialized && L::is_signed && !L::is_integer && !L::is_exact);
  static_assert(L::has_quiet_NaN && L::has_denorm == F::has_denorm && !L::has_denorm_loss);
  static_assert(L::round_style == F::round_style && L::is_bounded && !L::is_modulo);
  static_assert(L::radix == 2 && !L::traps && !L::tinyness_before);
  EXPECT_EQ(L::digits, digits);
  EXPECT_EQ(L::max_exponent, max_exponent);
  EXPECT_EQ(L::has_infinity, infinity);
  EXPECT_EQ(static_cast<float>(L::epsilon()), epsilon);
  EXPECT_EQ(static_cast<float>(L::max()), largest);
  EXPECT_TRUE(std::isnan(static_cast<float>(L::quiet_NaN())));
}

TEST(TypesConvert, NumericLimitsDescribeEachFormat) {
  check_limits<attn::bfloat16>(8, 128, true, 0x1p-7f, 0x1.FEp127f);
  check_limits<attn::float16>(11, 16, true, 0x1p-10f, 65504.0f);
  check_limits<attn::float8_e4m3>(4, 9, false, 0.125f, 448.0f);
  check_limits<attn::float8_e5m2>(3, 16, true, 0.25f, 57344.0f);
}

TEST(TypesConvert, RejectsDifferentShapesNamingBothWithTheirTypes) {
  Tensor<float, 2> src({2, 3});
  Tensor<bfloat16, 2> dst({3, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::convert(src.view(), dst.view()); }),
              AllOf(HasSubstr("attn::convert"), HasSubstr("(2, 3)"), HasSubstr("(3, 2)"),
                    HasSubstr("float"), HasSubstr("bfloat16")));
  Tensor<float8_e4m3, 2> fp8({2, 2});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { attn::convert_saturate(src.view(), fp8.view()); }),
      AllOf(HasSubstr("attn::convert_saturate"), HasSubstr("(2, 3)"), HasSubstr("(2, 2)")));
}

TEST(TypesConvert, RejectsOverlappingAndSelfOverlappingDestinations) {
  std::vector<float> buffer(16);
  const TensorView<float, 1> all(buffer.data(), {16});
  // float -> float in place, and an output over its own input's bytes
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::convert(all, all); }),
              AllOf(HasSubstr("dst"), HasSubstr("overlaps src")));
  const TensorView<bfloat16, 1> halves(reinterpret_cast<bfloat16*>(buffer.data()), {8});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { attn::convert(attn::slice(all, 0, 0, 8), halves); }),
              HasSubstr("overlaps"));
  // a broadcast output: several elements in one place
  std::vector<bfloat16> out(1);
  const TensorView<bfloat16, 2> broadcast(out.data(), {2, 2}, {0, 0});
  const Tensor<float, 2> src({2, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::convert(src.view(), broadcast); }),
              HasSubstr("share memory"));
}

TEST(TypesConvert, EmptyViewsConvertNothing) {
  Tensor<float, 2> src({0, 5});
  Tensor<float16, 2> dst({0, 5});
  EXPECT_NO_THROW(attn::convert(src.view(), dst.view()));
  EXPECT_EQ(attn::convert<bfloat16>(src.view()).shape(), (Shape<2>{0, 5}));
}

// ---- every set, every length, every layout ----

/// Converts `src` into a fresh dst of the same shape with each kernel set and checks every
/// element against the scalar rule.
template <class To, class From, std::size_t Rank, class Make>
void check_every_set(TensorView<const From, Rank> src, Make make_dst, bool saturate = false) {
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    auto holder = make_dst();  // (storage, view)
    const TensorView<To, Rank> dst = std::get<1>(holder);
    if (saturate) {
      if constexpr (std::is_same_v<To, float8_e4m3> || std::is_same_v<To, float8_e5m2>) {
        attn::convert_saturate(src, dst);
      }
    } else {
      attn::convert(src, dst);
    }
    const auto in = attn::test::to_vector(src);
    const auto out = attn::test::to_vector(TensorView<const To, Rank>(dst));
    for (std::size_t i = 0; i < in.size(); ++i) {
      To want = reference<To>(in[i]);
      if constexpr (std::is_same_v<To, float8_e4m3> || std::is_same_v<To, float8_e5m2>) {
        if (saturate) want = To::from_float_saturate(static_cast<float>(in[i]));
      }
      ASSERT_EQ(bits_of(out[i]), bits_of(want))
          << attn::element_name<From>() << " -> " << attn::element_name<To>() << " element " << i
          << " on " << attn::isa_name(isa);
    }
  }
  attn::set_isa(attn::best_isa());
}

template <class To, class From>
void check_contiguous_lengths() {
  const auto floats = interesting_floats(200, 3);
  for (Index n = 0; n <= 67; ++n) {  // every tail length of every set, and longer rows
    std::vector<From> src(static_cast<std::size_t>(n));
    for (Index i = 0; i < n; ++i) src[std::size_t(i)] = reference<From>(floats[std::size_t(i)]);
    check_every_set<To>(TensorView<const From, 1>(src.data(), {n}), [&] {
      auto t = Tensor<To, 1>(Shape<1>{n});
      auto v = t.view();
      return std::make_tuple(std::move(t), v);
    });
  }
}

TEST(TypesConvert, EveryLengthOnEverySetGivesTheScalarBits) {
  check_contiguous_lengths<bfloat16, float>();
  check_contiguous_lengths<float, bfloat16>();
  check_contiguous_lengths<float16, float>();
  check_contiguous_lengths<float, float16>();
  check_contiguous_lengths<float8_e4m3, float>();
  check_contiguous_lengths<float, float8_e4m3>();
  check_contiguous_lengths<float8_e5m2, float>();
  check_contiguous_lengths<float, float8_e5m2>();
  check_contiguous_lengths<bfloat16, double>();
  check_contiguous_lengths<double, float16>();
}

/// Strided sources and destinations: a transposed source (no unit stride), a column slice
/// (unit inner stride, gaps between rows) and a strided destination.
template <class To, class From>
void check_strided_layouts() {
  const auto floats = interesting_floats(37 * 29, 4);
  Tensor<From, 2> base({37, 29});
  for (Index i = 0; i < base.size(); ++i) {
    base.data()[i] = reference<From>(floats[std::size_t(i)]);
  }
  const auto transposed = attn::transpose(TensorView<const From, 2>(base.view()));  // (29, 37)
  check_every_set<To>(transposed, [] {
    auto t = Tensor<To, 2>(Shape<2>{29, 37});
    auto v = t.view();
    return std::make_tuple(std::move(t), v);
  });
  const auto columns = attn::slice(TensorView<const From, 2>(base.view()), 1, 3, 26);  // (37, 23)
  check_every_set<To>(columns, [] {
    auto t = Tensor<To, 3>(Shape<3>{37, 23, 2});
    auto v = attn::select(t.view(), 2, 1);  // inner stride 2
    return std::make_tuple(std::move(t), v);
  });
  check_every_set<To>(columns, [] {
    auto t = Tensor<To, 2>(Shape<2>{37, 40});
    auto v = attn::slice(t.view(), 1, 5, 28);  // unit inner stride, row stride 40
    return std::make_tuple(std::move(t), v);
  });
}

TEST(TypesConvert, StridedViewsOnEverySetGiveTheScalarBits) {
  check_strided_layouts<bfloat16, float>();
  check_strided_layouts<float, bfloat16>();
  check_strided_layouts<float16, float>();
  check_strided_layouts<float, float16>();
  check_strided_layouts<float8_e4m3, float>();
  check_strided_layouts<float, float8_e5m2>();
}

TEST(TypesConvert, SaturatingConversionsClampToTheLargestFiniteValue) {
  const auto floats = interesting_floats(101, 5);
  for (const float scale : {1.0f, 1000.0f, 1e6f}) {
    std::vector<float> src(floats.size());
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = floats[i] * scale;
    const TensorView<const float, 1> in(src.data(), {Index(src.size())});
    const auto make = [&](auto tag) {
      using T = decltype(tag);
      return [&] {
        auto t = Tensor<T, 1>(Shape<1>{Index(src.size())});
        auto v = t.view();
        return std::make_tuple(std::move(t), v);
      };
    };
    check_every_set<float8_e4m3>(in, make(float8_e4m3{}), /*saturate=*/true);
    check_every_set<float8_e5m2>(in, make(float8_e5m2{}), /*saturate=*/true);
  }
  // the definition, on the boundaries
  EXPECT_EQ(float8_e4m3::from_float_saturate(1e30f).bits(), 0x7E);
  EXPECT_EQ(float8_e4m3::from_float_saturate(-std::numeric_limits<float>::infinity()).bits(), 0xFE);
  EXPECT_EQ(float8_e4m3::from_float_saturate(-std::nanf("")).bits() & 0x7F, 0x7F);
  EXPECT_EQ(float8_e4m3(1e30f).bits(), 0x7F);  // non-saturating: NaN
  EXPECT_EQ(float8_e5m2::from_float_saturate(std::numeric_limits<float>::infinity()).bits(), 0x7B);
  EXPECT_EQ(float8_e5m2(std::numeric_limits<float>::infinity()).bits(), 0x7C);
  // From double and from the other storage types too.
  Tensor<double, 1> d(Shape<1>{3});
  d(0) = 1e300;
  d(1) = -500.0;
  d(2) = 447.99;
  Tensor<float8_e4m3, 1> e(Shape<1>{3});
  attn::convert_saturate(d.view(), e.view());
  EXPECT_EQ(e(0).bits(), 0x7E);
  EXPECT_EQ(e(1).bits(), 0xFE);
  EXPECT_EQ(e(2).bits(), 0x7E);
  Tensor<bfloat16, 1> b(Shape<1>{1}, bfloat16(1e10f));
  Tensor<float8_e5m2, 1> f(Shape<1>{1});
  attn::convert_saturate(b.view(), f.view());
  EXPECT_EQ(f(0).bits(), 0x7B);
}

/// Every pair of element types: one rounding from the exact value. A storage type converted to
/// another goes through float, which holds it exactly.
template <class From, class... Tos>
void check_pairs_from(const std::vector<float>& floats) {
  std::vector<From> src(floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i) src[i] = reference<From>(floats[i]);
  const TensorView<const From, 1> in(src.data(), {Index(src.size())});
  (
      [&] {
        const auto out = attn::convert<Tos>(in);
        for (std::size_t i = 0; i < src.size(); ++i) {
          ASSERT_EQ(bits_of(out.data()[i]), bits_of(reference<Tos>(src[i])))
              << attn::element_name<From>() << " -> " << attn::element_name<Tos>() << " " << i;
        }
      }(),
      ...);
}

TEST(TypesConvert, EveryPairOfElementTypesRoundsOnce) {
  const auto floats = interesting_floats(300, 6);
#define ATTN_ALL_TYPES float, double, bfloat16, float16, float8_e4m3, float8_e5m2
  check_pairs_from<float, ATTN_ALL_TYPES>(floats);
  check_pairs_from<double, ATTN_ALL_TYPES>(floats);
  check_pairs_from<bfloat16, ATTN_ALL_TYPES>(floats);
  check_pairs_from<float16, ATTN_ALL_TYPES>(floats);
  check_pairs_from<float8_e4m3, ATTN_ALL_TYPES>(floats);
  check_pairs_from<float8_e5m2, ATTN_ALL_TYPES>(floats);
#undef ATTN_ALL_TYPES
  // bfloat16 -> float16 is exact-then-rounded: 1 + 2^-7 is a float16 value, 2^-20 is a
  // float16 subnormal, 1e5 overflows float16.
  Tensor<bfloat16, 1> b(Shape<1>{3});
  b(0) = bfloat16(1.0f + 0x1p-7f);
  b(1) = bfloat16(0x1p-20f);
  b(2) = bfloat16(1e5f);
  const auto h = attn::convert<float16>(b);
  EXPECT_EQ(h(0).bits(), 0x3C08);
  EXPECT_EQ(h(1).bits(), 0x0010);
  EXPECT_EQ(h(2).bits(), 0x7C00);
}

/// The conversions are integer arithmetic and instructions with their own rounding control
/// (F16C, exact float steps): flush-to-zero, denormals-are-zero and another rounding mode change
/// none of their bits, on any set.
TEST(TypesConvert, BitsDoNotDependOnTheFloatingPointEnvironment) {
  auto floats = interesting_floats(333, 8);
  for (const float tiny : {0x1p-126f, 0x1p-130f, 0x1p-149f, 0x1.8p-24f, 0x1p-25f, 0x1p-10f}) {
    floats.push_back(tiny);
    floats.push_back(-tiny * 3);
  }
  const auto n = static_cast<Index>(floats.size());
  const TensorView<const float, 1> in(floats.data(), {n});
  std::vector<bfloat16> b0(floats.size()), b1(floats.size());
  std::vector<float16> h0(floats.size()), h1(floats.size());
  std::vector<float8_e4m3> e0(floats.size()), e1(floats.size());
  std::vector<float> back0(floats.size()), back1(floats.size());
  const auto run = [&](auto& b, auto& h, auto& e, auto& back) {
    attn::convert(in, TensorView<bfloat16, 1>(b.data(), {n}));
    attn::convert(in, TensorView<float16, 1>(h.data(), {n}));
    attn::convert(in, TensorView<float8_e4m3, 1>(e.data(), {n}));
    attn::convert(TensorView<const float16, 1>(h.data(), {n}),
                  TensorView<float, 1>(back.data(), {n}));
  };
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    run(b0, h0, e0, back0);
    const int rounding = std::fegetround();
#if defined(__SSE__) || defined(__x86_64__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);  // flush-to-zero and denormals-are-zero
#endif
    std::fesetround(FE_TOWARDZERO);
    run(b1, h1, e1, back1);
    std::fesetround(rounding);
#if defined(__SSE__) || defined(__x86_64__)
    _mm_setcsr(csr);
#endif
    for (std::size_t i = 0; i < floats.size(); ++i) {
      ASSERT_EQ(b1[i].bits(), b0[i].bits()) << attn::isa_name(isa) << " " << floats[i];
      ASSERT_EQ(h1[i].bits(), h0[i].bits()) << attn::isa_name(isa) << " " << floats[i];
      ASSERT_EQ(e1[i].bits(), e0[i].bits()) << attn::isa_name(isa) << " " << floats[i];
      ASSERT_EQ(bits_of(back1[i]), bits_of(back0[i])) << attn::isa_name(isa) << " " << floats[i];
    }
  }
  attn::set_isa(attn::best_isa());
}

// ---- tensors and views of the storage types ----

TEST(TypesTensor, StorageTensorsZeroFillCopyAndViewLikeFloatOnes) {
  Tensor<bfloat16, 3> x({2, 4, 6});
  for (Index i = 0; i < x.size(); ++i) EXPECT_EQ(x.data()[i].bits(), 0);  // +0
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = bfloat16(static_cast<float>(i));
  EXPECT_EQ(static_cast<float>(x(1, 2, 3)), 39.0f);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x.data()) % 64, 0u);

  // views: slice, select, transpose, reshape, split/merge heads, const conversion
  const TensorView<const bfloat16, 3> cx = x.view();
  EXPECT_EQ(static_cast<float>(attn::slice(cx, 2, 2, 5)(1, 1, 0)), 1 * 24 + 1 * 6 + 2);
  EXPECT_EQ(static_cast<float>(attn::select(cx, 0, 1)(3, 5)), 47.0f);
  EXPECT_EQ(static_cast<float>(attn::transpose(cx, 1, 2)(0, 5, 3)), 23.0f);
  EXPECT_EQ(static_cast<float>(attn::reshape(cx, Shape<2>{8, -1})(5, 5)), 35.0f);
  const auto heads = attn::split_heads(cx, 3);  // (2, 3, 4, 2)
  EXPECT_EQ(heads.shape(), (Shape<4>{2, 3, 4, 2}));
  EXPECT_EQ(static_cast<float>(heads(1, 2, 3, 1)), static_cast<float>(x(1, 3, 5)));
  EXPECT_EQ(attn::merge_heads(heads).data(), cx.data());

  // deep copies: Tensor from a strided view, copy(), contiguous(), copy assignment
  const Tensor<bfloat16, 3> t(attn::transpose(cx, 1, 2));
  EXPECT_EQ(t.shape(), (Shape<3>{2, 6, 4}));
  EXPECT_EQ(t(1, 5, 3).bits(), x(1, 3, 5).bits());
  Tensor<bfloat16, 3> y({2, 6, 4});
  attn::copy(attn::transpose(cx, 1, 2), y.view());
  EXPECT_EQ(y.to_vector().size(), 48u);
  EXPECT_EQ(y(0, 2, 1).bits(), x(0, 1, 2).bits());
  const auto c = attn::contiguous(attn::transpose(cx, 0, 2));
  EXPECT_EQ(c(5, 3, 1).bits(), x(1, 3, 5).bits());
  Tensor<bfloat16, 3> z;
  z = x;
  EXPECT_EQ(z(1, 3, 5).bits(), x(1, 3, 5).bits());
  EXPECT_THROW(static_cast<void>(x.at(2, 0, 0)), attn::IndexError);

  // the other storage types
  Tensor<float16, 2> h({3, 3}, float16(0.5f));
  EXPECT_EQ(h(2, 2).bits(), 0x3800);
  auto e = Tensor<float8_e4m3, 2>::from_rows(
      {{float8_e4m3(1.0f), float8_e4m3(-2.0f)}, {float8_e4m3(448.0f), float8_e4m3(0.0f)}});
  EXPECT_EQ(e(1, 0).bits(), 0x7E);
  Tensor<float8_e5m2, 1> f(
      Shape<1>{4}, {float8_e5m2(1.0f), float8_e5m2(2.0f), float8_e5m2(3.0f), float8_e5m2(4.0f)});
  EXPECT_EQ(static_cast<float>(f(2)), 3.0f);
}

TEST(TypesTensor, ConvertRoundTripsThroughTheStorageTypes) {
  const auto x = attn::test::random_tensor<float, 3>({3, 5, 7}, 11);
  const auto b = attn::convert<bfloat16>(x);
  const auto back = attn::convert<float>(b);
  // bfloat16 keeps 8 significant bits: |x - bf16(x)| <= half a unit <= 2^-8 |x|
  for (Index i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::fabs(back.data()[i] - x.data()[i]), std::ldexp(std::fabs(x.data()[i]), -8));
  }
  // exact the other way: storage -> float -> storage gives the same bits
  const auto again = attn::convert<bfloat16>(back);
  for (Index i = 0; i < x.size(); ++i) EXPECT_EQ(again.data()[i].bits(), b.data()[i].bits());
}

// ---- Eigen ----

TEST(TypesEigen, BitsCopyToAndFromEigensTypes) {
  EXPECT_EQ(Eigen::numext::bit_cast<std::uint16_t>(attn::to_eigen(bfloat16(1.5f))), 0x3FC0);
  EXPECT_EQ(static_cast<float>(attn::to_eigen(float16(-2.0f))), -2.0f);
  EXPECT_EQ(attn::from_eigen(Eigen::bfloat16(0.25f)).bits(), bfloat16(0.25f).bits());
  EXPECT_EQ(attn::from_eigen(Eigen::half(65504.0f)).bits(), 0x7BFF);
  // Eigen keeps a NaN's sign: the bits go across unchanged either way
  EXPECT_EQ(attn::from_eigen(attn::to_eigen(bfloat16::from_bits(0xFFC1))).bits(), 0xFFC1);

  Tensor<bfloat16, 2> t({3, 4});
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = bfloat16(0.1f * static_cast<float>(i));
  const auto m = attn::to_eigen(attn::transpose(TensorView<const bfloat16, 2>(t.view())));  // 4 x 3
  ASSERT_EQ(m.rows(), 4);
  EXPECT_EQ(static_cast<float>(m(3, 2)), static_cast<float>(t(2, 3)));
  Tensor<bfloat16, 2> back({4, 3});
  attn::from_eigen(m, back.view());
  EXPECT_EQ(back(3, 2).bits(), t(2, 3).bits());
  Tensor<float16, 2> wrong({2, 2});
  const Eigen::Matrix<Eigen::half, 3, 2> hm = Eigen::Matrix<Eigen::half, 3, 2>::Zero();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::from_eigen(hm, wrong.view()); }),
              AllOf(HasSubstr("(3, 2)"), HasSubstr("(2, 2)")));
}

TEST(TypesEigen, FloatMatricesConvertThroughAsView) {
  Tensor<bfloat16, 2> t({2, 3});
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = bfloat16(1.0f + 0.25f * static_cast<float>(i));
  Eigen::MatrixXf m(2, 3);  // column-major: as_view gives strides (1, 2)
  attn::convert(t.view(), attn::as_view(m));
  EXPECT_EQ(m(1, 2), 2.25f);
  m(0, 1) = 1.0f + 0x1p-8f;  // a tie: to the even 1.0
  attn::convert(attn::as_view(std::as_const(m)), t.view());
  EXPECT_EQ(t(0, 1).bits(), 0x3F80);
  EXPECT_EQ(t(1, 2).bits(), bfloat16(2.25f).bits());
}

}  // namespace

}  // namespace types_convert_test

#include "support/bodies_end.hpp"
