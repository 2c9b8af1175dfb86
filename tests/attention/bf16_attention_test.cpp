// SPDX-License-Identifier: MIT
// tests/attention/bf16_attention_test.cpp: scaled_dot_product_attention on bfloat16 and float16
// q, k, v and out, on every kernel set and every bfloat16 path the CPU has on the avx512 set
// (widening, AVX512-BF16's vdpbf16ps, AMX): against a long double reference computed from the
// same rounded inputs, on shapes that are not multiples of the tiles (T not a multiple of 16
// or 32, d = 64, 80, 128, grouped-query heads) under every kind of mask; bit-identical for one
// and two threads; value rows that are not finite only where seen. MultiHeadAttention<bfloat16>
// and MultiHeadAttention<float16> against the float module on the same rounded weights and
// inputs (self, cross, grouped-query heads, masks, variants), on every set and path, and their
// conversion from and to float; their incremental forward through a KVCache<bfloat16> and
// <float16> (rings, sinks, ragged items); the single-head modules and MultiHeadAttentionWrapper.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace bf16_attention_test {

namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::Bf16Path;
using attn::bfloat16;
using attn::CausalAlignment;
using attn::float16;
using attn::Index;
using attn::Isa;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
namespace ref = attn::test::ref;

// The paths `isa` runs for bfloat16 on this CPU: widening always; on the avx512 set the dot
// product where the CPU has AVX512-BF16 and AMX where the operating system grants it. float16
// always widens (one pass is enough).
template <class Element>
std::vector<Bf16Path> paths(Isa isa) {
  std::vector<Bf16Path> out{Bf16Path::kWiden};
  if (!std::is_same_v<Element, bfloat16> || isa != Isa::kAvx512) return out;
  if (attn::bf16_path_available(Bf16Path::kDot)) out.push_back(Bf16Path::kDot);
  if (attn::bf16_path_available(Bf16Path::kAmx)) out.push_back(Bf16Path::kAmx);
  return out;
}

// Every runnable set and path, with `f()` run while it is selected.
template <class Element, class F>
void for_each_path(F&& f) {
  for (const Isa isa : attn::test::runnable_sets()) {
    attn::set_isa(isa);
    for (const Bf16Path path : paths<Element>(isa)) {
      attn::set_bf16_path(path);
      SCOPED_TRACE(std::string(attn::isa_name(isa)) + " " + attn::bf16_path_name(path));
      f();
    }
  }
}

// The kernel set, bf16 path and thread count a test sets are restored around every test by
// tests/support/test_main.cpp.
class StorageAttention : public ::testing::Test {};

// Uniform values in [-1, 1) rounded to Element.
template <class Element>
Tensor<Element, 4> random_rounded(const Shape<4>& shape, std::uint64_t seed) {
  const auto f = attn::test::random_tensor<float, 4>(shape, seed);
  Tensor<Element, 4> t(shape);
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = Element(f.data()[i]);
  return t;
}

// Tolerances against the reference on the same rounded inputs (|q|, |k|, |v| <= 1), written
// as PyTorch's SDPA tests write them (atol + rtol |expected|). The float work (products
// accumulated in float, softmax, rescaling) adds ~1e-6; what remains is two roundings to the
// element type's half ulp u (bfloat16 2^-9, float16 2^-12 of the value): P before it
// multiplies V (an error of at most u max |v| = u in the output) and out itself (u |out|).
// So atol 4u and rtol 4u leave a factor of 2 over the worst case: bfloat16 8e-3 (PyTorch
// uses 1e-2..5e-2 for bf16), float16 1e-3 (PyTorch: 1e-3..1e-2). Measured on this machine,
// |actual - expected| / (1 + |expected|): bfloat16 at most 1.5e-3 on every set and path,
// float16 at most 2e-4. A wrong mask, scale, tile edge or rescale moves outputs by 1e-2 or
// more (about 1 / T_k of a key's weight times |v|).
template <class Element>
constexpr double tolerance() {
  return std::is_same_v<Element, bfloat16> ? 8e-3 : 1e-3;
}

template <class Element>
::testing::AssertionResult near(TensorView<const Element, 4> actual,
                                TensorView<const double, 4> expected, Index rows = -1) {
  const double tol = tolerance<Element>();
  for (Index b = 0; b < actual.extent(0); ++b) {
    for (Index h = 0; h < actual.extent(1); ++h) {
      for (Index i = 0; i < (rows < 0 ? actual.extent(2) : rows); ++i) {
        for (Index e = 0; e < actual.extent(3); ++e) {
          const double a = static_cast<float>(actual(b, h, i, e)), x = expected(b, h, i, e);
          if (!(std::abs(a - x) <= tol + tol * std::abs(x))) {
            return ::testing::AssertionFailure()
                   << "out(" << b << ", " << h << ", " << i << ", " << e << ") = " << a
                   << ", expected " << x << " (tolerance " << tol << " + " << tol << " |x|)";
          }
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

enum class MaskKind { kNone, kCausal, kBottomRight, kWindow, kBool, kAdditive, kPadding, kLengths };

struct Case {
  Index batch, heads, kv_heads, tq, tk, d, dv;
  MaskKind mask;
};

// Against the tiles: 64 query rows per task (grouped heads stacked up to 64), 128 keys per
// tile, 32-row AMX blocks, 32-deep AMX steps, 16-pair packing blocks; V's whole 128-key tiles
// packed once per call on the AMX and dot paths when several tasks read them (GQA, three
// query tiles per head, two whole key tiles and a partial one).
const Case kCases[] = {
    {1, 2, 2, 37, 77, 64, 64, MaskKind::kCausal},         // T neither 16- nor 32-aligned
    {2, 4, 2, 19, 200, 80, 80, MaskKind::kNone},          // GQA, d = 80, two key tiles
    {1, 2, 1, 70, 45, 128, 128, MaskKind::kBottomRight},  // MQA, two query tiles, d = 128
    {2, 2, 2, 33, 130, 64, 48, MaskKind::kBool},          // d_v != d, a key tile of 2
    {1, 3, 3, 1, 150, 128, 128, MaskKind::kAdditive},     // one query (a decode step)
    {2, 2, 2, 65, 65, 80, 80, MaskKind::kPadding},        // rows past a 64-row task
    {1, 4, 1, 3, 257, 64, 64, MaskKind::kLengths},        // 4 heads x 3 rows stacked, 3 tiles
    {1, 1, 1, 150, 150, 64, 64, MaskKind::kWindow},       // causal sliding window
    {1, 2, 2, 9, 31, 7, 5, MaskKind::kCausal},            // d, d_v odd and under a tile
    {2, 4, 2, 130, 260, 64, 64, MaskKind::kNone},         // V's whole tiles packed per call
    {2, 8, 2, 1, 300, 24, 20, MaskKind::kPadding},        // a decode step: 4 grouped heads, 3
                                                          // tiles, d, d_v not multiples of 16
    {1, 2, 1, 2, 140, 136, 72, MaskKind::kBottomRight},   // 2 heads x 2 rows, d % 16 = 8
};

struct Inputs {
  Tensor<float, 4> additive;
  Tensor<bool, 4> boolean;
  Tensor<bool, 2> padding;
  AttentionMask<float> mask;
};

template <class Element>
void check_case(const Case& c) {
  SCOPED_TRACE("case B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) + "/" +
               std::to_string(c.kv_heads) + " T " + std::to_string(c.tq) + "x" +
               std::to_string(c.tk) + " d " + std::to_string(c.d) + "/" + std::to_string(c.dv) +
               " mask " + std::to_string(static_cast<int>(c.mask)));
  const auto q = random_rounded<Element>({c.batch, c.heads, c.tq, c.d}, 3 + c.tq);
  const auto k = random_rounded<Element>({c.batch, c.kv_heads, c.tk, c.d}, 5 + c.tk);
  const auto v = random_rounded<Element>({c.batch, c.kv_heads, c.tk, c.dv}, 7 + c.dv);
  ref::DenseMask dense(c.batch, c.heads, c.tq, c.tk);
  Inputs in;
  switch (c.mask) {
    case MaskKind::kNone:
      break;
    case MaskKind::kCausal:
      in.mask.causal(CausalAlignment::kTopLeft);
      dense.causal(CausalAlignment::kSquare);
      break;
    case MaskKind::kBottomRight:
      in.mask.causal(CausalAlignment::kBottomRight);
      dense.causal(CausalAlignment::kBottomRight);
      break;
    case MaskKind::kWindow:
      in.mask.causal().sliding_window(40);
      dense.causal_window({0}, 40);
      break;
    case MaskKind::kBool:
      in.boolean = ref::random_bools<4>({c.batch, 1, c.tq, c.tk}, 17, 0.7);
      in.mask.allowed(in.boolean);
      dense.boolean(in.boolean.view(), true);
      break;
    case MaskKind::kAdditive:
      in.additive = ref::random_additive<float, 4>({1, c.heads, c.tq, c.tk}, 19);
      in.mask.additive(in.additive);
      dense.additive(in.additive.view());
      for (Index h = 0; h < c.heads; ++h) {  // -inf entries hide their keys
        for (Index j = 0; j < c.tk; ++j) {
          if (std::isinf(in.additive(0, h, 0, j))) dense.visible[dense.at(0, h, 0, j)] = 0;
        }
      }
      break;
    case MaskKind::kPadding:
      in.padding = Tensor<bool, 2>({c.batch, c.tk}, false);
      for (Index j = 50; j < c.tk; ++j) in.padding(1, j) = true;
      in.mask.key_padding(in.padding);
      dense.key_padding(in.padding.view());
      break;
    case MaskKind::kLengths:
      in.mask.key_lengths({200});
      dense.key_lengths({200});
      break;
  }
  const auto expected = ref::attention(q.view(), ref::repeat_kv(k.view(), c.heads).view(),
                                       ref::repeat_kv(v.view(), c.heads).view(), dense,
                                       1.0L / std::sqrt(static_cast<ref::Real>(c.d)));
  attn::Workspace ws;
  for_each_path<Element>([&] {
    Tensor<Element, 4> out({c.batch, c.heads, c.tq, c.dv},
                           Element(std::numeric_limits<float>::quiet_NaN()));
    attn::scaled_dot_product_attention<Element>(q.view(), k.view(), v.view(), out.view(), ws,
                                                in.mask);
    EXPECT_TRUE(near<Element>(out.view(), expected.output.view()));
  });
}

TEST_F(StorageAttention, Bfloat16MatchesTheReferenceOnEveryPath) {
  for (const Case& c : kCases) check_case<bfloat16>(c);
}

TEST_F(StorageAttention, Float16MatchesTheReference) {
  for (const Case& c : kCases) check_case<float16>(c);
}

// The variants and dropout are fields of the call, computed in float: softcap, ALiBi, sinks
// and dropout (the same keep decisions, a hash of the seed and the position) against the
// float call on the same rounded values, which computes every step the bfloat16 one does
// except the two roundings (P and out) the tolerance covers; GQA with a padding mask too.
TEST_F(StorageAttention, VariantsAndDropoutMatchTheFloatCall) {
  const Shape<4> qs{2, 4, 70, 64}, ks{2, 2, 150, 64};
  const auto q = random_rounded<bfloat16>(qs, 9);
  const auto k = random_rounded<bfloat16>(ks, 10);
  const auto v = random_rounded<bfloat16>(ks, 11);
  const auto qf = attn::convert<float>(q), kf = attn::convert<float>(k),
             vf = attn::convert<float>(v);
  Tensor<float, 1> sinks({4});
  for (Index h = 0; h < 4; ++h) sinks(h) = 0.5f * static_cast<float>(h) - 1.0f;
  Tensor<bool, 2> padding({2, 150}, false);
  for (Index j = 120; j < 150; ++j) padding(1, j) = true;
  AttentionMask<float> mask;
  mask.key_padding(padding);
  AttentionOptions options;
  options.softcap = 2.0;
  options.alibi_max_bias = 8.0;
  options.sinks = sinks;
  options.dropout = 0.25;
  options.dropout_seed = 77;
  Tensor<float, 4> expected({2, 4, 70, 64});
  attn::scaled_dot_product_attention<float>(qf.view(), kf.view(), vf.view(), expected.view(), mask,
                                            options);
  Tensor<double, 4> wide({2, 4, 70, 64});
  for (Index i = 0; i < wide.size(); ++i) wide.data()[i] = expected.data()[i];
  for_each_path<bfloat16>([&] {
    Tensor<bfloat16, 4> out({2, 4, 70, 64});
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), out.view(), mask,
                                                 options);
    // Dropout scales kept weights by 4/3: P's rounding moves out by up to 4/3 u max |v|.
    EXPECT_TRUE(near<bfloat16>(out.view(), wide.view()));
  });
}

// Each output element is one task's, whatever the schedule: the same bits for 1 and 2 threads.
TEST_F(StorageAttention, BitIdenticalForOneAndTwoThreads) {
  const Shape<4> shape{2, 4, 130, 64};
  const auto q = random_rounded<bfloat16>(shape, 1);
  const auto k = random_rounded<bfloat16>(shape, 2);
  const auto v = random_rounded<bfloat16>(shape, 3);
  AttentionMask<float> mask;
  mask.causal();
  for_each_path<bfloat16>([&] {
    Tensor<bfloat16, 4> one(shape), two(shape);
    attn::set_num_threads(1);
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), one.view(), mask);
    attn::set_num_threads(2);
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), two.view(), mask);
    EXPECT_TRUE(ref::same_bits(one.view(), two.view()));
  });
}

// vdpbf16ps gives way to widening for tasks of 5 to few query rows (ops/attention.hpp's
// attention_bf16_path(): below 16 at d 128), and runs 4 keys x 4 rows at a time for tasks of
// at most 4 (a decode step's grouped heads). The query is subnormal (2^-127, which vdpbf16ps
// reads as zero and widening reads exactly) against keys near 2^126: the scores are products
// of order 1 on the widening path and 0 on the dot product's, so the outputs of the two paths
// differ by far more than bfloat16's rounding.
TEST_F(StorageAttention, DotPathWidensForFewQueryRowsAndDotsADecodeStep) {
  const std::vector<Isa> sets = attn::test::runnable_sets();
  if (std::find(sets.begin(), sets.end(), Isa::kAvx512) == sets.end()) {
    GTEST_SKIP() << "the avx512 set does not run here";
  }
  attn::set_isa(Isa::kAvx512);
  if (!attn::bf16_path_available(Bf16Path::kDot)) GTEST_SKIP() << "no AVX512-BF16";
  const Index d = 128, tk = 300;
  const auto k_unit = attn::test::random_tensor<float, 4>({1, 2, tk, d}, 11);
  Tensor<bfloat16, 4> k({1, 2, tk, d});
  for (Index i = 0; i < k.size(); ++i) k.data()[i] = bfloat16(k_unit.data()[i] * 0x1p126f);
  const auto v = random_rounded<bfloat16>({1, 2, tk, d}, 12);
  const auto run = [&](Index heads, Index tq, Bf16Path path) {
    Tensor<bfloat16, 4> q({1, heads, tq, d}, bfloat16(0x1p-127f)), out({1, heads, tq, d});
    attn::set_bf16_path(path);
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), out.view());
    return out;
  };
  // A decode step: 1 query of 8 heads over 2 key/value heads, 4 rows per task: the dot
  // product's bits (scores of 0: each output the mean of the value rows, to bfloat16's
  // rounding of the output).
  const Tensor<bfloat16, 4> step = run(8, 1, Bf16Path::kDot);
  EXPECT_FALSE(ref::same_bits(step.view(), run(8, 1, Bf16Path::kWiden).view()));
  for (Index h = 0; h < 8; ++h) {
    for (Index e = 0; e < d; ++e) {
      double sum = 0;
      for (Index j = 0; j < tk; ++j)
        sum += static_cast<double>(static_cast<float>(v(0, h / 4, j, e)));
      const double got = static_cast<double>(static_cast<float>(step(0, h, 0, e)));
      EXPECT_NEAR(sum / tk, got, 0x1p-8 * std::abs(sum / tk) + 1e-6) << h << " " << e;
    }
  }
  // 8 rows per task (2 queries of 4 heads): widened.
  EXPECT_TRUE(ref::same_bits(run(8, 2, Bf16Path::kDot).view(), run(8, 2, Bf16Path::kWiden).view()));
  // 64 rows per task: the dot product's bits.
  EXPECT_FALSE(
      ref::same_bits(run(2, 64, Bf16Path::kDot).view(), run(2, 64, Bf16Path::kWiden).view()));
}

// A value row holding an infinity enters only the outputs of the queries that see it (the
// AMX and dot-product paths take the widened product for that tile): causal, key 100 is seen
// by queries 100 on, which are not finite; the rows before match the reference.
TEST_F(StorageAttention, NonFiniteValuesOnlyWhereSeen) {
  const Shape<4> shape{1, 1, 130, 64};
  const auto q = random_rounded<bfloat16>(shape, 4);
  const auto k = random_rounded<bfloat16>(shape, 5);
  auto v = random_rounded<bfloat16>(shape, 6);
  ref::DenseMask dense(1, 1, 130, 130);
  dense.causal(CausalAlignment::kSquare);
  const auto expected = ref::attention(q.view(), k.view(), v.view(), dense, 0.125L);
  v(0, 0, 100, 7) = bfloat16(std::numeric_limits<float>::infinity());
  AttentionMask<float> mask;
  mask.causal();
  for_each_path<bfloat16>([&] {
    Tensor<bfloat16, 4> out(shape);
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), out.view(), mask);
    EXPECT_TRUE(near<bfloat16>(out.view(), expected.output.view(), 100));
    EXPECT_FALSE(std::isfinite(static_cast<float>(out(0, 0, 100, 7))));
  });
}

// The same in a decode step (4 grouped heads, one query each, whose K and V rows are widened
// in registers where the set can): a value row holding an infinity that the mask hides leaves
// the outputs as the reference's; seen, it makes its element of every output non-finite.
TEST_F(StorageAttention, NonFiniteValuesOnlyWhereSeenInADecodeStep) {
  const auto q = random_rounded<bfloat16>({1, 4, 1, 64}, 4);
  const auto k = random_rounded<bfloat16>({1, 1, 130, 64}, 5);
  auto v = random_rounded<bfloat16>({1, 1, 130, 64}, 6);
  Tensor<bool, 2> padding({1, 130}, false);
  padding(0, 100) = true;
  ref::DenseMask dense(1, 4, 1, 130);
  dense.key_padding(padding.view());
  const auto expected = ref::attention(q.view(), ref::repeat_kv(k.view(), 4).view(),
                                       ref::repeat_kv(v.view(), 4).view(), dense, 0.125L);
  v(0, 0, 100, 7) = bfloat16(std::numeric_limits<float>::infinity());
  AttentionMask<float> hidden;
  hidden.key_padding(padding);
  for_each_path<bfloat16>([&] {
    Tensor<bfloat16, 4> out({1, 4, 1, 64});
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), out.view(), hidden);
    EXPECT_TRUE(near<bfloat16>(out.view(), expected.output.view()));
    attn::scaled_dot_product_attention<bfloat16>(q.view(), k.view(), v.view(), out.view());
    for (Index h = 0; h < 4; ++h) EXPECT_FALSE(std::isfinite(static_cast<float>(out(0, h, 0, 7))));
  });
}

// The allocating form on tensors of rank 3, and the materialised path refused.
TEST_F(StorageAttention, TensorsAndTheMaterialisedPath) {
  const auto q4 = random_rounded<float16>({1, 1, 20, 16}, 8);
  Tensor<float16, 3> q({1, 20, 16});
  std::copy(q4.data(), q4.data() + q4.size(), q.data());
  const auto out = attn::scaled_dot_product_attention(q, q, q);
  ref::DenseMask dense(1, 1, 20, 20);
  const auto expected = ref::attention(q4.view(), q4.view(), q4.view(), dense, 0.25L);
  Tensor<float16, 4> out4({1, 1, 20, 16});
  std::copy(out.data(), out.data() + out.size(), out4.data());
  EXPECT_TRUE(near<float16>(out4.view(), expected.output.view()));
  AttentionOptions options;
  options.path = attn::AttentionPath::kMaterialized;
  EXPECT_THROW(attn::scaled_dot_product_attention<float16>(q4.view(), q4.view(), q4.view(),
                                                           out4.view(), {}, options),
               attn::ConfigError);
}

// ---- MultiHeadAttention<bfloat16> and MultiHeadAttention<float16> ----

// A float module with biases in [-0.5, 0.5) (nn.MultiheadAttention starts them at 0).
attn::MultiHeadAttention<float> float_module(const attn::MultiHeadAttentionOptions& o) {
  attn::MultiHeadAttention<float> m(o);
  for (const auto& p : m.named_parameters()) {
    if (p.rank() != 1) continue;
    const auto r = attn::test::random_tensor<float, 1>(p.vector().shape(), 43, -0.5, 0.5);
    attn::copy(r.view(), p.vector());
  }
  return m;
}

// A float module and its bfloat16 (float16) twin: the float one holds the rounded weights
// widened, so both compute from the same values and only the narrow module's roundings differ.
template <class Element>
struct ModulePair {
  attn::MultiHeadAttention<float> wide;
  attn::MultiHeadAttention<Element> narrow;
  explicit ModulePair(const attn::MultiHeadAttentionOptions& o)
      : wide(attn::convert<float>(attn::convert<Element>(float_module(o)))),
        narrow(attn::convert<Element>(wide)) {
    wide.eval();
    narrow.eval();
  }
};

// Uniform values in [-1, 1) rounded to Element, and the same values as floats.
template <class Element = bfloat16>
struct RoundedInput {
  Tensor<Element, 3> narrow;
  Tensor<float, 3> wide;
  RoundedInput(const Shape<3>& shape, std::uint64_t seed)
      : narrow(attn::convert<Element>(attn::test::random_tensor<float, 3>(shape, seed))),
        wide(attn::convert<float>(narrow)) {}
};

// The bfloat16 module against the float one on the same bfloat16 values, as PyTorch's tests
// compare a bf16 module with its float twin (atol = rtol = 1e-2 for bf16 there). Beyond the
// attention call's own two roundings (P and the context, 4u each in the test above, u = 2^-9)
// the module rounds Q, K and V (a relative u on each score's factors: |s| u on a score, here
// |s| < 1.5, so at most 1.5 u on the weights' logits) and the output once (u |out|, |out| <
// 1). Outputs are sums over E = 64 context features with weights under 1/8 (xavier), so the
// context's error of ~4u reaches them as about 4u sqrt(64) / 8 = 4u = 8e-3: PyTorch's bf16
// atol = rtol = 1e-2 holds it. Measured here, |a - x| / (1 + |x|): at most 2.0e-3 on every
// set and path, a factor of 5 under it. A wrong bias (|b| ~ 0.25), weight layout, mask or
// head mapping moves outputs by 5e-2 or more.
// float16 (u = 2^-12, and its products widened to float on every set): the same estimate gives
// 4u = 1e-3, which is PyTorch's default fp16 tolerance in its SDPA tests (atol = rtol = 1e-3).
// Measured here: at most 2.5e-4 on every set (bfloat16's worst over 8, as the half ulps are),
// a factor of 4 under it.
template <class Element>
::testing::AssertionResult module_near(const Tensor<Element, 3>& actual,
                                       const Tensor<float, 3>& expected) {
  const double kTol = std::is_same_v<Element, bfloat16> ? 1e-2 : 1e-3;
  double worst = 0;
  for (Index i = 0; i < actual.size(); ++i) {
    const double a = static_cast<float>(actual.data()[i]), x = expected.data()[i];
    worst = std::max(worst, std::abs(a - x) / (1 + std::abs(x)));
    if (!(std::abs(a - x) <= kTol + kTol * std::abs(x))) {
      return ::testing::AssertionFailure() << "element " << i << " = " << a << ", expected " << x;
    }
  }
  return ::testing::AssertionSuccess() << "worst " << worst;
}

attn::MultiHeadAttentionOptions module_options(Index kdim, Index kv_heads) {
  auto o = attn::MultiHeadAttentionOptions::pytorch(64, 4, true, kdim, kdim);
  o.num_kv_heads = kv_heads;
  return o;
}

// Self-attention (causal, key padding), cross-attention with kdim != d_in and grouped-query
// heads, softcap and ALiBi, value heads of another size (value_head_dim): every set and path,
// and 1 and 2 threads bit for bit; with value_head_dim also frozen (packed weights) bit for bit.
template <class Element>
void check_module_against_float() {
  struct ModuleCase {
    Index kdim, kv_heads, tq, tk;
    bool causal, padding, variants;
    Index value_head_dim;
  };
  const ModuleCase cases[] = {
      {0, 0, 37, 37, true, false, false, 0},    // self, causal, fused Q/K/V
      {0, 2, 70, 70, false, true, true, 0},     // self, GQA, padding, softcap + ALiBi
      {48, 4, 19, 77, false, false, false, 0},  // cross, kdim = vdim = 48: W_q, [W_k; W_v]
      {0, 2, 37, 37, true, false, false, 8},    // self, values of 8 against keys of 16
      {48, 4, 19, 77, false, false, true, 24},  // cross, values of 24
  };
  for (const ModuleCase& c : cases) {
    SCOPED_TRACE("case kdim " + std::to_string(c.kdim) + " tq " + std::to_string(c.tq));
    auto o = module_options(c.kdim, c.kv_heads);
    o.causal = c.causal;
    o.value_head_dim = c.value_head_dim;
    if (c.variants) {
      o.softcap = 5.0;
      o.alibi_max_bias = 8.0;
    }
    const ModulePair<Element> m(o);
    const RoundedInput<Element> q({2, c.tq, 64}, 31 + c.tq);
    const RoundedInput<Element> kv({2, c.tk, c.kdim > 0 ? c.kdim : 64}, 37 + c.tk);
    Tensor<bool, 2> padding({2, c.tk}, false);
    AttentionMask<float> mask;
    if (c.padding) {
      for (Index j = c.tk - 20; j < c.tk; ++j) padding(1, j) = true;
      mask.key_padding(padding);
    }
    const bool self = c.kdim == 0 && c.tq == c.tk;
    const Tensor<float, 3> expected =
        self ? m.wide.forward(q.wide, mask) : m.wide.forward(q.wide, kv.wide, kv.wide, mask);
    attn::set_num_threads(1);
    for_each_path<Element>([&] {
      const Tensor<Element, 3> out = self ? m.narrow.forward(q.narrow, mask)
                                          : m.narrow.forward(q.narrow, kv.narrow, kv.narrow, mask);
      EXPECT_TRUE(module_near(out, expected));
      attn::set_num_threads(2);
      const Tensor<Element, 3> two = self ? m.narrow.forward(q.narrow, mask)
                                          : m.narrow.forward(q.narrow, kv.narrow, kv.narrow, mask);
      attn::set_num_threads(1);
      for (Index i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out.data()[i].bits(), two.data()[i].bits()) << "element " << i;
      }
      if (c.value_head_dim == 0) return;
      attn::MultiHeadAttention<Element> frozen = m.narrow;
      frozen.freeze();
      const Tensor<Element, 3> packed = self ? frozen.forward(q.narrow, mask)
                                             : frozen.forward(q.narrow, kv.narrow, kv.narrow, mask);
      for (Index i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out.data()[i].bits(), packed.data()[i].bits()) << "frozen, element " << i;
      }
    });
  }
}

TEST_F(StorageAttention, Bf16ModuleMatchesTheFloatModule) {
  check_module_against_float<bfloat16>();
}
TEST_F(StorageAttention, Fp16ModuleMatchesTheFloatModule) { check_module_against_float<float16>(); }

// The incremental forward of a causal rotary module through a KVCache<Element> (a prefill of
// 25 tokens, then token by token): within module_near's bound of `expected`, the float
// module's whole-sequence forward on the same values; the prefill's rows are the narrow
// module's whole-sequence bits (the same GEMMs, rotations and kernel on the same rows). An
// int8 cache of Element is refused, naming the type.
template <class Element>
void check_incremental(const attn::MultiHeadAttention<Element>& module, const Tensor<Element, 3>& x,
                       const Tensor<float, 3>& expected) {
  const Index tokens = x.extent(1);
  attn::KVCache<Element> cache(1, module.num_kv_heads(), module.head_dim(), tokens);
  EXPECT_EQ(cache.bytes_per_token(), 2 * module.num_kv_heads() * module.head_dim() * 2);
  Tensor<Element, 3> stepped({1, tokens, module.d_out()});
  attn::Workspace ws;
  const attn::TensorView<const Element, 3> in = x.view();
  for (Index t0 = 0, t = 25; t0 < tokens; t0 += t, t = 1) {
    module.forward(attn::slice(in, 1, t0, t0 + t), attn::slice(stepped.view(), 1, t0, t0 + t), ws,
                   cache);
  }
  EXPECT_EQ(cache.length(0), tokens);
  const ::testing::AssertionResult near_float = module_near(stepped, expected);
  EXPECT_TRUE(near_float);
  std::cout << "[ " << attn::element_name<Element>() << " cache ] " << near_float.message() << "\n";
  const Tensor<Element, 3> whole = module.forward(x);
  for (Index t = 0; t < 25; ++t) {
    for (Index e = 0; e < module.d_out(); ++e) {
      ASSERT_EQ(stepped(0, t, e).bits(), whole(0, t, e).bits()) << t << " " << e;
    }
  }
  attn::KVCacheOptions quantised{1, module.num_kv_heads(), module.head_dim(), tokens};
  quantised.element = attn::KVElement::kInt8;
  const std::string name = attn::element_name<Element>();
  const std::string message = attn::test::thrown<attn::ConfigError>(
      [&] { const attn::KVCache<Element> refused(quantised); });
  EXPECT_NE(message.find("a " + name + " cache stores " + name + " rows"), std::string::npos)
      << message;
  quantised.element = attn::kv_element_of<Element>();  // the same rows: accepted
  EXPECT_EQ(attn::KVCache<Element>(quantised).element(), attn::KVElement::kScalar);
}

// The conversion rounds each weight once and widens back exactly; frozen and unfrozen give
// the same bits. A rotary module with learned sinks converts too (its sinks rounded once to a
// bfloat16 parameter, as .to(torch.bfloat16) makes them): the whole-sequence forward and the
// incremental one through a KVCache<bfloat16> (a prefill, then token by token) are within
// module_near's bound of the float module on the same values (one more rounding, of the
// rotated Q and K, u = 2^-9 each; the sinks are widened exactly, so they add none).
TEST_F(StorageAttention, Bf16ModuleConversion) {
  auto o = module_options(0, 0);
  const attn::MultiHeadAttention<float> wide(o);
  const attn::MultiHeadAttention<bfloat16> narrow(wide);
  const auto from = wide.named_parameters();
  const auto to = narrow.named_parameters();
  ASSERT_EQ(from.size(), to.size());
  for (std::size_t p = 0; p < from.size(); ++p) {
    ASSERT_EQ(from[p].name(), to[p].name());
    const bool vector = from[p].rank() == 1;
    const Index rows = vector ? 1 : from[p].matrix().extent(0);
    const Index cols = vector ? from[p].vector().extent(0) : from[p].matrix().extent(1);
    for (Index r = 0; r < rows; ++r) {
      for (Index i = 0; i < cols; ++i) {
        const float f = vector ? from[p].vector()(i) : from[p].matrix()(r, i);
        const bfloat16 n = vector ? to[p].vector()(i) : to[p].matrix()(r, i);
        ASSERT_EQ(bfloat16(f).bits(), n.bits()) << from[p].name() << " " << r << " " << i;
      }
    }
  }
  const attn::MultiHeadAttention<float> back = attn::convert<float>(narrow);
  EXPECT_EQ(back.in_proj_weight()(5, 7), static_cast<float>(narrow.in_proj_weight()(5, 7)));
  EXPECT_EQ(back.out_proj().bias()(3), static_cast<float>(narrow.out_proj().bias()(3)));

  const RoundedInput<> x({1, 40, 64}, 41);
  auto frozen = narrow;
  frozen.eval();
  const Tensor<bfloat16, 3> a = frozen.forward(x.narrow);
  frozen.freeze();
  const Tensor<bfloat16, 3> b = frozen.forward(x.narrow);
  for (Index i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i].bits(), b.data()[i].bits());

  // Built from options, a bfloat16 module takes the float module's draws, rounded.
  attn::TorchGenerator g1(5), g2(5);
  const attn::MultiHeadAttention<float> drawn(o, g1);
  const attn::MultiHeadAttention<bfloat16> drawn_narrow(o, g2);
  for (Index r = 0; r < 64; ++r) {
    ASSERT_EQ(bfloat16(drawn.in_proj_weight()(3 * r, r)).bits(),
              drawn_narrow.in_proj_weight()(3 * r, r).bits());
    ASSERT_EQ(bfloat16(drawn.out_proj().weight()(r, 63 - r)).bits(),
              drawn_narrow.out_proj().weight()(r, 63 - r).bits());
  }

  o.rope.head_dim = 16;
  o.rope.max_positions = 40;
  o.causal = true;
  o.sinks = true;
  attn::MultiHeadAttention<float> rotary_source(o);
  // Sinks that take a good share of every row's weight (1.3 to 3.4 against 40 keys of scores
  // near 0), three of them not exact in bfloat16.
  for (Index h = 0; h < 4; ++h) rotary_source.sinks()(h) = 1.3f + 0.7f * static_cast<float>(h);
  attn::MultiHeadAttention<bfloat16> rotary(rotary_source);
  for (Index h = 0; h < 4; ++h) {
    ASSERT_EQ(bfloat16(rotary_source.sinks()(h)).bits(), rotary.sinks()(h).bits()) << h;
  }
  rotary.eval();
  attn::MultiHeadAttention<float> rotary_wide = attn::convert<float>(rotary);
  rotary_wide.eval();
  const Tensor<float, 3> expected = rotary_wide.forward(x.wide);
  EXPECT_TRUE(module_near(rotary.forward(x.narrow), expected));
  // The sinks' values count: the float twin with sinks of 0 is well outside that bound.
  attn::MultiHeadAttention<float> zero_sinks = rotary_wide;
  for (Index h = 0; h < 4; ++h) zero_sinks.sinks()(h) = 0.0f;
  EXPECT_FALSE(module_near(rotary.forward(x.narrow), zero_sinks.forward(x.wide)));
  check_incremental(rotary, x.narrow, expected);
}

// MultiHeadAttention<float16>: the conversion rounds each weight once to float16 (a weight
// past float16's range becomes infinite, as .to(torch.float16) makes it) and widens back
// exactly; built from options it takes the float module's draws, rounded; frozen and unfrozen
// give the same bits; a rotary module with learned sinks runs as its float twin does.
TEST_F(StorageAttention, Fp16ModuleConversion) {
  auto o = module_options(0, 0);
  attn::MultiHeadAttention<float> wide(o);
  wide.in_proj_weight()(0, 0) = 1e5f;
  wide.in_proj_weight()(0, 1) = 1e-6f;  // a float16 subnormal
  const attn::MultiHeadAttention<float16> narrow(wide);
  EXPECT_EQ(narrow.in_proj_weight()(0, 0).bits(), 0x7C00);
  EXPECT_EQ(narrow.in_proj_weight()(0, 1).bits(), float16(1e-6f).bits());
  for (Index r = 0; r < 64; ++r) {
    ASSERT_EQ(float16(wide.in_proj_weight()(3 * r, r)).bits(),
              narrow.in_proj_weight()(3 * r, r).bits());
    ASSERT_EQ(float16(wide.out_proj().weight()(r, 63 - r)).bits(),
              narrow.out_proj().weight()(r, 63 - r).bits());
  }
  const attn::MultiHeadAttention<float> back = attn::convert<float>(narrow);
  EXPECT_EQ(back.in_proj_weight()(5, 7), static_cast<float>(narrow.in_proj_weight()(5, 7)));
  EXPECT_EQ(back.out_proj().bias()(3), static_cast<float>(narrow.out_proj().bias()(3)));

  attn::TorchGenerator g1(5), g2(5);
  const attn::MultiHeadAttention<float> drawn(o, g1);
  auto drawn_narrow = attn::MultiHeadAttention<float16>(o, g2);
  for (Index r = 0; r < 64; ++r) {
    ASSERT_EQ(float16(drawn.in_proj_weight()(3 * r, r)).bits(),
              drawn_narrow.in_proj_weight()(3 * r, r).bits());
  }
  const RoundedInput<float16> x({1, 40, 64}, 41);
  drawn_narrow.eval();
  const Tensor<float16, 3> a = drawn_narrow.forward(x.narrow);
  drawn_narrow.freeze();
  const Tensor<float16, 3> b = drawn_narrow.forward(x.narrow);
  for (Index i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i].bits(), b.data()[i].bits());

  o.rope.head_dim = 16;
  o.rope.max_positions = 40;
  o.causal = true;
  o.sinks = true;  // a float16 parameter, widened exactly for the kernel
  attn::MultiHeadAttention<float> rotary_source(o);
  for (Index h = 0; h < 4; ++h) rotary_source.sinks()(h) = 1.3f + 0.7f * static_cast<float>(h);
  attn::MultiHeadAttention<float16> rotary(rotary_source);
  EXPECT_EQ(rotary.sinks()(2).bits(), float16(rotary_source.sinks()(2)).bits());
  rotary.eval();
  attn::MultiHeadAttention<float> rotary_wide = attn::convert<float>(rotary);
  rotary_wide.eval();
  const Tensor<float, 3> expected = rotary_wide.forward(x.wide);
  EXPECT_TRUE(module_near(rotary.forward(x.narrow), expected));
  check_incremental(rotary, x.narrow, expected);
}

// Rings, sinks and ragged items through a KVCache<Element>, as through a float cache: a causal
// rotary module with grouped-query heads (2 of 4), 9 tokens (the cache's max_chunk of 3 at a
// time), item 1 truncated back to 6 tokens (ragged lengths from there), then token by token,
// through (a) a ring for its sliding window of 8, (b) a cache keeping 2 sinks beside a window
// of 8 (20 tokens: both rings wrap, the sinks bite) (positions within the cache, un-rotated rows
// rotated as read). Against the float twin (the same rounded weights and inputs) through a float
// cache of the same options in the same steps, on every set and path: within module_near's bound,
// as the whole-sequence forward (the same roundings per token; a wrong ring slot, sink row or
// rotary position moves outputs by 5e-2 or more).
template <class Element>
void check_rings_and_sinks() {
  auto o = module_options(0, 2);
  o.causal = true;
  o.rope.head_dim = 16;
  o.rope.max_positions = 32;
  const RoundedInput<Element> x({2, 20, 64}, 91);
  for (const bool sinks : {false, true}) {
    SCOPED_TRACE(sinks ? "sinks" : "ring");
    o.sliding_window = sinks ? 0 : 8;
    const ModulePair<Element> m(o);
    attn::KVCacheOptions c{2, 2, 16, 0, 8, 3};
    c.sink_tokens = sinks ? 2 : 0;
    const auto generate = [&](const auto& module, const auto& in) {
      using S = typename std::decay_t<decltype(in)>::value_type;
      attn::KVCache<S> cache(c);
      attn::Workspace ws;
      Tensor<S, 3> out({2, 20, 64});
      const attn::TensorView<const S, 3> all = in.view();
      module.forward(attn::slice(all, 1, 0, 9), attn::slice(out.view(), 1, 0, 9), ws, cache);
      cache.truncate(1, 6);
      for (Index t = 9; t < 20; ++t) {
        module.forward(attn::slice(all, 1, t, t + 1), attn::slice(out.view(), 1, t, t + 1), ws,
                       cache);
      }
      EXPECT_EQ(cache.length(0), 20);
      EXPECT_EQ(cache.length(1), 17);
      return out;
    };
    const Tensor<float, 3> expected = generate(m.wide, x.wide);
    for_each_path<Element>([&] {
      const ::testing::AssertionResult near_float =
          module_near(generate(m.narrow, x.narrow), expected);
      EXPECT_TRUE(near_float);
      std::cout << "[ " << attn::element_name<Element>() << " ring/sinks ] " << near_float.message()
                << "\n";
    });
  }
}

TEST_F(StorageAttention, Bf16CacheRingsSinksAndRaggedItems) { check_rings_and_sinks<bfloat16>(); }
TEST_F(StorageAttention, Fp16CacheRingsSinksAndRaggedItems) { check_rings_and_sinks<float16>(); }

// SelfAttention, CausalAttention and CrossAttention on bfloat16 (float16) run
// MultiHeadAttention<bfloat16>'s (<float16>'s) core, MultiHeadAttentionWrapper several
// CausalAttention heads: each against its float twin holding the
// same rounded weights, on the same rounded input, within module_near's bound (the same roundings:
// Q, K, V, P, the context, and the output where out_proj follows; one head of 32 features for the
// single-head modules, whose output is the rounded context itself). Conversion rounds each weight
// once.
template <class Element>
void check_single_head_and_cross() {
  attn::manual_seed(7);
  const attn::SelfAttention<float> self_wide(64, 32, true);
  const attn::CausalAttention<float> causal_wide(64, 32, 48, 0.0, true);
  const attn::CrossAttention<float> cross_wide(64, 40, 48, 4, true);
  const RoundedInput<Element> x({2, 37, 64}, 51), kv({2, 23, 40}, 53);
  const auto twins = [](const auto& source) {
    auto narrow = attn::convert<Element>(source);
    auto wide = attn::convert<float>(narrow);
    narrow.eval();
    wide.eval();
    const auto from = source.named_parameters()[0].matrix();
    const auto to = narrow.named_parameters()[0].matrix();
    EXPECT_EQ(Element(from(1, 2)).bits(), to(1, 2).bits());
    return std::make_pair(std::move(narrow), std::move(wide));
  };
  const auto self = twins(self_wide);
  EXPECT_TRUE(module_near(self.first.forward(x.narrow), self.second.forward(x.wide)));
  const auto causal = twins(causal_wide);
  const Tensor<Element, 3> causal_out = causal.first.forward(x.narrow);
  EXPECT_TRUE(module_near(causal_out, causal.second.forward(x.wide)));
  // The causal bound holds: changing the later tokens leaves the first rows' bits alone.
  Tensor<Element, 3> later = x.narrow;
  for (Index t = 20; t < 37; ++t) {
    for (Index e = 0; e < 64; ++e) later(1, t, e) = Element(-static_cast<float>(later(1, t, e)));
  }
  const Tensor<Element, 3> changed = causal.first.forward(later);
  for (Index t = 0; t < 20; ++t) {
    for (Index e = 0; e < 32; ++e) {
      ASSERT_EQ(changed(1, t, e).bits(), causal_out(1, t, e).bits()) << t << " " << e;
    }
  }
  EXPECT_NE(changed(1, 30, 0).bits(), causal_out(1, 30, 0).bits());
  const auto cross = twins(cross_wide);
  EXPECT_TRUE(
      module_near(cross.first.forward(x.narrow, kv.narrow), cross.second.forward(x.wide, kv.wide)));
  // MultiHeadAttentionWrapper: three causal heads of 16, each its own CausalAttention<Element>;
  // the output is their concatenation, bit for bit.
  const attn::MultiHeadAttentionWrapper<float> wrapper_wide(64, 16, 37, 0.0, 3, true);
  const auto wrapper = twins(wrapper_wide);
  const Tensor<Element, 3> concatenated = wrapper.first.forward(x.narrow);
  EXPECT_TRUE(module_near(concatenated, wrapper.second.forward(x.wide)));
  for (Index h = 0; h < 3; ++h) {
    const Tensor<Element, 3> alone = wrapper.first.head(h).forward(x.narrow);
    for (Index t = 0; t < 37; ++t) {
      for (Index e = 0; e < 16; ++e) {
        ASSERT_EQ(concatenated(1, t, h * 16 + e).bits(), alone(1, t, e).bits()) << h << " " << t;
      }
    }
  }
}

TEST_F(StorageAttention, Bf16SingleHeadAndCrossModules) { check_single_head_and_cross<bfloat16>(); }
TEST_F(StorageAttention, Fp16SingleHeadAndCrossModules) { check_single_head_and_cross<float16>(); }
// ---- training: the backward of a bfloat16 or float16 module ----

// max |a - x| / max(max |x|, floor) over a tensor's elements (x the double reference).
double normalised_error(const std::vector<double>& a, const std::vector<double>& x,
                        double floor = 0) {
  double scale = floor, err = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    scale = std::max(scale, std::abs(x[i]));
    err = std::max(err, std::abs(a[i] - x[i]));
  }
  return err / std::max(scale, 1e-30);
}

template <class S, std::size_t Rank>
std::vector<double> values(TensorView<const S, Rank> v) {
  std::vector<double> out;
  const attn::Tensor<double, Rank> wide = attn::convert<double>(v);
  out.assign(wide.data(), wide.data() + wide.size());
  return out;
}

// One training step's gradients: every parameter's (in named_parameters() order), then the
// query's and (cross-attention) the key/value input's.
template <class S>
struct StepGradients {
  std::vector<std::vector<double>> tensors;
  std::vector<std::uint16_t> bits;  // 16-bit modules: every gradient's bits, in order
};

template <class S>
StepGradients<S> training_step(const attn::MultiHeadAttention<S>& module, const Tensor<S, 3>& x,
                               const Tensor<S, 3>& kv, bool self, const Tensor<S, 3>& grad_y,
                               const AttentionMask<attn::compute_type_t<S>>& mask) {
  attn::Gradients<S> grads(module.named_parameters());
  attn::SavedForward<S> saved;
  attn::Workspace ws;
  Tensor<S, 3> out(grad_y.shape());
  Tensor<S, 3> gx(x.shape()), gkv(kv.shape());
  gx.fill(S(0));
  gkv.fill(S(0));
  if (self) {
    module.forward(x.view(), out.view(), saved, ws, mask);
    module.backward(grad_y.view(), saved, gx.view(), grads, ws);
  } else {
    module.forward(x.view(), kv.view(), kv.view(), out.view(), saved, ws, mask);
    module.backward(grad_y.view(), saved, gx.view(), gkv.view(), gkv.view(), grads, ws);
  }
  StepGradients<S> result;
  const auto add = [&](auto view) {
    result.tensors.push_back(values(view));
    if constexpr (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>) {
      const auto* p = view.data();  // contiguous: Gradients mirror contiguous parameters
      for (Index i = 0; i < view.size(); ++i) result.bits.push_back(p[i].bits());
    }
  };
  for (const auto& g : grads) add(attn::TensorView<const S, 2>(g.matrix()));
  add(attn::TensorView<const S, 3>(gx.view()));
  if (!self) add(attn::TensorView<const S, 3>(gkv.view()));
  return result;
}

// The backward of MultiHeadAttention<bfloat16> against its double twin on the same rounded
// weights, inputs and grad_out (the float64 reference), on every set and path; bit-identical
// for 1 and 2 threads (on the widest set run, every path). Self-attention (fused Q/K/V: one GEMM
// each for dW and dX, causal, with dropout), cross-attention with kdim = vdim = 48 and
// grouped-query heads (W_q, [W_k; W_v]; key = value receives the sum) under key padding with
// softcap and ALiBi, value heads of another size; self-attention with grouped-query heads and
// rotary embeddings against its float twin (the same float tables: the backward rotates the
// float dQ and dK back with them, so the float module is the closer reference; its own float
// rounding, 2^-24 relative, is far below the bound).
//
// Bound. The bfloat16 backward rounds (u = 2^-9 relative each) what its forward rounded (Q, K,
// V, P, the context C: the double reference keeps them exact), dC, and on AMX and the dot
// product P and dS before the attention's products, dQKV before the projection GEMMs, and each
// gradient once as it is stored; everything else is float. A gradient is a
// sum of products of such values, each term off by a few u: dW_o = dY^T C by C's two
// roundings, dV = P^T dC by P's, and dQ, dK through dS = P (dP - D), where D = rowsum(dO O)
// is the P-weighted mean of dP, so dP's error counts against the smaller |dP - D|. The
// projections' gradients add dQKV's rounding. Normalised to the tensor's largest element,
// terms of random sign add up slower than their count: measured here, at most 5.2e-3 (2.6 u)
// over all gradients, cases, sets and paths, with P and dS rounded or not. The rotary case rounds Q
// and K a second time, after the rotation (u each, as the forward test above counts it), which
// moves dQKV by a u more at most. The bound 1.6e-2 = 8u is three times that; a gradient that misses
// a term (a bias, a head, dropout's keep decisions) or takes a wrong transpose is off by 20 % or
// more.
// float16 (u = 2^-12 on the same count): its kernel keeps P and dS in float (its products
// widened on every set and path), so fewer roundings than bfloat16's worst path; the same bound,
// 8u = 2.0e-3. Measured here: at most 6.4e-4 (2.6u) on every set; 7.9e-4 in the single-head and
// cross modules below. A float16 backward whose kernel took the bfloat16 dot-product path
// (P and dS rounded to bfloat16) measured 3e-3 to 6e-3 there.
template <class Element>
void check_module_backward(double bound) {
  struct TrainCase {
    Index kdim, kv_heads, tq, tk;
    bool causal, padding;
    Index value_head_dim;
    double dropout;
    bool variants, sinks;
    bool rope = false;
  };
  const TrainCase cases[] = {
      {0, 0, 37, 37, true, false, 0, 0.1, false, false},  // self, fused Q/K/V, causal, dropout
      {48, 2, 19, 45, false, true, 0, 0.0, true, false},  // cross, GQA, padding, softcap + ALiBi
      {0, 2, 21, 21, false, false, 8, 0.0, false, true},  // self, values of 8, learned sinks
      {0, 2, 29, 29, true, false, 0, 0.0, false, false, true},  // self, GQA, causal, rotary
  };
  for (const TrainCase& c : cases) {
    SCOPED_TRACE("case kdim " + std::to_string(c.kdim) + " tq " + std::to_string(c.tq));
    auto o = module_options(c.kdim, c.kv_heads);
    o.causal = c.causal;
    o.value_head_dim = c.value_head_dim;
    o.dropout = c.dropout;
    if (c.variants) {
      o.softcap = 5.0;
      o.alibi_max_bias = 8.0;
    }
    o.sinks = c.sinks;
    if (c.rope) {
      o.rope.head_dim = 16;
      o.rope.max_positions = c.tq;
    }
    attn::MultiHeadAttention<Element> narrow(float_module(o));
    // Sinks (rounded to Element) that take a good share of each row's weight (1.3 to 3.4
    // against 21 keys): dL/dsinks is the last parameter gradient.
    for (Index h = 0; h < (c.sinks ? 4 : 0); ++h) {
      narrow.sinks()(h) = Element(1.3f + 0.7f * static_cast<float>(h));
    }
    narrow.seed(3);
    attn::MultiHeadAttention<double> wide = attn::convert<double>(narrow);
    wide.seed(3);
    const bool self = c.kdim == 0;
    const RoundedInput<Element> x({2, c.tq, 64}, 61 + c.tq);
    const RoundedInput<Element> kv({2, self ? c.tq : c.tk, self ? 64 : c.kdim}, 67 + c.tk);
    const RoundedInput<Element> gy({2, c.tq, 64}, 71 + c.tq);
    Tensor<bool, 2> padding({2, c.tk}, false);
    AttentionMask<float> mask;
    AttentionMask<double> wide_mask;
    if (c.padding) {
      for (Index j = c.tk - 15; j < c.tk; ++j) padding(1, j) = true;
      mask.key_padding(padding);
      wide_mask.key_padding(padding);
    }
    StepGradients<double> expected;
    if (c.rope) {
      attn::MultiHeadAttention<float> twin = attn::convert<float>(narrow);
      expected.tensors = training_step<float>(twin, x.wide, kv.wide, self, gy.wide, mask).tensors;
    } else {
      expected = training_step<double>(wide, attn::convert<double>(x.narrow),
                                       attn::convert<double>(kv.narrow), self,
                                       attn::convert<double>(gy.narrow), wide_mask);
    }
    attn::set_num_threads(1);
    for_each_path<Element>([&] {
      narrow.seed(3);
      const StepGradients<Element> got =
          training_step<Element>(narrow, x.narrow, kv.narrow, self, gy.narrow, mask);
      ASSERT_EQ(got.tensors.size(), expected.tensors.size());
      double worst = 0;
      for (std::size_t t = 0; t < got.tensors.size(); ++t) {
        const double e = normalised_error(got.tensors[t], expected.tensors[t]);
        EXPECT_LE(e, bound) << "gradient " << t;
        worst = std::max(worst, e);
      }
      std::cout << "[ " << typeid(Element).name() << " backward ] worst normalised error " << worst
                << "\n";
      if (attn::active_isa() != attn::test::runnable_sets().back()) return;  // threads: last set
      attn::set_num_threads(2);
      narrow.seed(3);
      const StepGradients<Element> two =
          training_step<Element>(narrow, x.narrow, kv.narrow, self, gy.narrow, mask);
      attn::set_num_threads(1);
      ASSERT_EQ(got.bits, two.bits);
    });
  }
}

TEST_F(StorageAttention, Bf16ModuleBackwardMatchesTheDoubleModule) {
  check_module_backward<bfloat16>(1.6e-2);
}
TEST_F(StorageAttention, Fp16ModuleBackwardMatchesTheDoubleModule) {
  check_module_backward<float16>(2.0e-3);
}

// SelfAttention, CausalAttention (dropout on), CrossAttention and MultiHeadAttentionWrapper
// (three CausalAttention heads, dropout on) on bfloat16 or float16 train through the same core:
// each one step against its double twin on the same rounded weights, inputs and grad_out, every
// parameter's and input's gradient within the bound of the test above.
template <class Element>
void check_single_head_and_cross_backward(double bound) {
  attn::manual_seed(11);
  const RoundedInput<Element> x({2, 29, 64}, 81), kv({2, 23, 40}, 83), gy({2, 29, 48}, 85);
  const auto check = [&](auto narrow, Index d_out, auto cross_tag) {
    using Narrow = decltype(narrow);
    using Cross = decltype(cross_tag);
    narrow.seed(5);
    auto wide = attn::convert<double>(narrow);
    wide.seed(5);
    std::vector<std::string> names;  // the parameters' names, in gradient order
    const auto step = [&](const auto& module, const auto& in, const auto& in_kv, const auto& g) {
      using S = typename std::decay_t<decltype(in)>::value_type;
      attn::Gradients<S> grads(module.named_parameters());
      attn::SavedForward<S> saved;
      attn::Workspace ws;
      Tensor<S, 3> out(g.shape()), gx(in.shape()), gkv(in_kv.shape());
      if constexpr (Cross::value) {
        module.forward(in.view(), in_kv.view(), out.view(), saved, ws);
        module.backward(g.view(), saved, gx.view(), gkv.view(), grads, ws);
      } else {
        module.forward(in.view(), out.view(), saved, ws);
        module.backward(g.view(), saved, gx.view(), grads, ws);
      }
      std::vector<std::vector<double>> all;
      names.clear();
      for (const auto& p : grads) {
        all.push_back(values(attn::TensorView<const S, 2>(p.matrix())));
        names.push_back(p.name());
      }
      all.push_back(values(attn::TensorView<const S, 3>(gx.view())));
      if (Cross::value) all.push_back(values(attn::TensorView<const S, 3>(gkv.view())));
      return all;
    };
    const auto g =
        attn::convert<Element>(attn::Tensor<float, 3>(attn::slice(gy.wide.view(), 2, 0, d_out)));
    const auto got = step(narrow, x.narrow, kv.narrow, g);
    const auto want = step(wide, attn::convert<double>(x.narrow), attn::convert<double>(kv.narrow),
                           attn::convert<double>(g));
    ASSERT_EQ(got.size(), want.size());
    // W_key's bias has a gradient of zero in exact arithmetic (it adds q . b_k to a whole row
    // of scores, which the softmax ignores): its rounding noise is measured against a floor
    // instead of its own size (~1e-17 in double). Every other gradient's floor is 1e-3 of the
    // step's largest gradient. The key bias's is 3e-2 of it: db_k = scale sum_i Q_i sum_j
    // dS_ij, and dS is rounded to bfloat16 before dK = dS^T Q (as PyTorch's bfloat16 kernels
    // round it), which leaves each row's sum_j dS_ij (zero in exact arithmetic) off by up to
    // 2^-9 sum_j |dS_ij|; measured on AMX: 0.6e-4 to 1.2e-4 of the largest gradient (float
    // dS: under 1.6e-5), so at most 4e-3 against this floor, a quarter of the bound.
    double largest = 0;
    for (const auto& w : want) {
      for (const double v : w) largest = std::max(largest, std::abs(v));
    }
    ASSERT_EQ(names.size() + (Cross::value ? 2 : 1), got.size());
    for (std::size_t t = 0; t < got.size(); ++t) {
      const bool key_bias = t < names.size() && names[t].find("key") != std::string::npos &&
                            names[t].size() >= 4 &&
                            names[t].compare(names[t].size() - 4, 4, "bias") == 0;
      const double floor = (key_bias ? 3e-2 : 1e-3) * largest;
      EXPECT_LE(normalised_error(got[t], want[t], floor), bound)
          << typeid(Narrow).name() << " gradient " << t << (key_bias ? " (key bias)" : "");
    }
  };
  check(attn::convert<Element>(attn::SelfAttention<float>(64, 32, true)), 32, std::false_type());
  check(attn::convert<Element>(attn::CausalAttention<float>(64, 32, 48, 0.1, true)), 32,
        std::false_type());
  check(attn::convert<Element>(attn::CrossAttention<float>(64, 40, 48, 4, true)), 48,
        std::true_type());
  check(attn::convert<Element>(attn::MultiHeadAttentionWrapper<float>(64, 16, 29, 0.1, 3, true)),
        48, std::false_type());
}

TEST_F(StorageAttention, Bf16SingleHeadAndCrossModulesBackward) {
  check_single_head_and_cross_backward<bfloat16>(1.6e-2);
}
TEST_F(StorageAttention, Fp16SingleHeadAndCrossModulesBackward) {
  check_single_head_and_cross_backward<float16>(2.0e-3);
}

// What a query cannot see never affects it (tests/attention/nonfinite_test.cpp), in training
// too: cross-attention whose key/value input holds NaN or infinity at keys some queries cannot
// see (future keys under causal, keys a boolean mask blocks for even queries, padded keys),
// against the same step with those rows finite, on every path (AMX, the dot product, widened
// to float): the input gradient rows of the queries that cannot see them keep their values
// (the dQ products cover keys a query cannot see, whole key tiles or each group of kMicroRows
// queries up to its last visible key, so dQ = dS K met 0 * NaN there before); so does the
// key/value gradient under padding (dK = dV = 0 at padded keys), and so do the parameters'
// gradients, except W_k's and W_v's (dW_k = dK^T X sums 0 * NaN over the padded rows, as in
// PyTorch). Under causal and the mask, the queries that see the non-finite key reach every
// parameter's gradient.
template <class Element>
void check_hidden_nonfinite_backward() {
  constexpr Index kT = 40;
  enum class Hide { kCausal, kBlocked, kPadding };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const Hide hide : {Hide::kCausal, Hide::kBlocked, Hide::kPadding}) {
    SCOPED_TRACE("case " + std::to_string(static_cast<int>(hide)));
    auto o = module_options(48, 0);
    o.causal = hide == Hide::kCausal;
    attn::MultiHeadAttention<Element> narrow(float_module(o));
    const RoundedInput<Element> x({2, kT, 64}, 91), kv({2, kT, 48}, 93), gy({2, kT, 64}, 95);
    Tensor<Element, 3> bad = kv.narrow;  // NaN in batch 0, infinity in batch 1
    // hidden(b, i): query i of item b cannot see a non-finite key. Padding: every key's row of
    // the key/value gradient keeps its value too.
    std::function<bool(Index, Index)> hidden;
    const bool keys_kept = hide == Hide::kPadding;
    AttentionMask<float> mask;
    Tensor<bool, 2> blocked({kT, kT}, false), padding({2, kT}, false);
    if (hide == Hide::kPadding) {
      for (Index j = 25; j < kT; ++j) padding(1, j) = true;
      for (Index j = 25; j < kT; ++j) {
        for (Index e = 0; e < 48; ++e) bad(1, j, e) = Element(j % 2 != 0 ? nan : -inf);
      }
      mask.key_padding(padding);
      hidden = [](Index, Index) { return true; };
    } else {
      const Index at[2] = {29, 33};  // the non-finite key of each item
      for (Index b = 0; b < 2; ++b) {
        for (Index e = 0; e < 48; ++e) bad(b, at[b], e) = Element(b == 0 ? nan : inf);
      }
      if (hide == Hide::kCausal) {
        hidden = [at](Index b, Index i) { return i < at[b]; };
      } else {
        for (Index i = 0; i < kT; i += 2) blocked(i, 29) = blocked(i, 33) = true;
        mask.blocked(blocked);
        hidden = [](Index, Index i) { return i % 2 == 0; };
      }
    }
    // The elements of a step's gradients that must keep their values: the query input's rows
    // by hidden(), the key/value input's by keys_kept, the parameters' under padding but W_k's
    // and W_v's.
    std::vector<bool> param_kept;
    for (const auto& param : narrow.named_parameters()) {
      const std::string name = param.name();
      param_kept.push_back(keys_kept && name.find("k_proj_weight") == std::string::npos &&
                           name.find("v_proj_weight") == std::string::npos);
    }
    attn::set_num_threads(1);
    for_each_path<Element>([&] {
      const auto finite =
          training_step<Element>(narrow, x.narrow, kv.narrow, false, gy.narrow, mask);
      const auto broken = training_step<Element>(narrow, x.narrow, bad, false, gy.narrow, mask);
      const std::size_t params = param_kept.size();
      ASSERT_EQ(finite.tensors.size(), params + 2);
      for (std::size_t t = 0; t < finite.tensors.size(); ++t) {
        const auto& a = finite.tensors[t];
        const auto& z = broken.tensors[t];
        for (std::size_t i = 0; i < a.size(); ++i) {
          const Index row = static_cast<Index>(i / 64 % kT), b = static_cast<Index>(i / 64 / kT);
          const bool keep = t < params ? param_kept[t] : t == params ? hidden(b, row) : keys_kept;
          if (keep) {
            ASSERT_EQ(z[i], a[i]) << "gradient " << t << " element " << i;
          }
        }
      }
    });
  }
}

TEST_F(StorageAttention, Bf16BackwardHiddenNonFiniteKeysAndValues) {
  check_hidden_nonfinite_backward<bfloat16>();
}
TEST_F(StorageAttention, Fp16BackwardHiddenNonFiniteKeysAndValues) {
  check_hidden_nonfinite_backward<float16>();
}

}  // namespace

}  // namespace bf16_attention_test

#include "support/bodies_end.hpp"
