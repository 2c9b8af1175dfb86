// SPDX-License-Identifier: MIT
// tests/attention/module_variants_test.cpp: the attention variants of the modules
// (MultiHeadAttentionOptions::softcap, alibi_max_bias / alibi_slopes, sinks), through the one
// core every module runs: the options' checks and messages; the incremental forward through a
// KVCache (prefill, chunks, single tokens, a sliding-window ring) equal to the whole-sequence
// forward, ALiBi at the cache's absolute positions; the training forward and backward against
// central finite differences (every gradient, the sinks' included); the sinks as a parameter
// like any other (names, Gradients, AdamW, freezing); the materialised path. Every other
// module with weights (SelfAttention, CausalAttention, CrossAttention, the wrapper's heads)
// with each variant against a long-double loop written from the formulas, forward, and its
// backward against central differences. Value heads of their own size (value_head_dim):
// every projection storage against a long-double reference, the incremental forward and the
// packed prefill (plain, ring with the variants, bfloat16 rows), the packed forward, thread
// counts, parameter shapes, a state_dict round trip and the refusals (their gradients:
// tests/attention/module_backward_test.cpp and the finite differences below). PyTorch
// references of whole modules: tests/io/variants_fixtures_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/module_test_support.hpp"
#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "attn/io/state_dict.hpp"
#include "support/finite_difference.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace module_variants_test {
namespace {

using attn::ConfigError;
using attn::Index;
using attn::KVCache;
using attn::MultiHeadAttention;
using attn::MultiHeadAttentionOptions;
using attn::ParameterNames;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using attn::test::module_tolerance;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace ref = attn::test::ref;

/// A causal self-attention module's options with the variants of one case.
struct Variant {
  const char* name;
  Index d, heads, kv_heads, head_dim, window;
  bool rope;
  double softcap, alibi_max_bias;
  std::vector<double> slopes;
  bool sinks;
};

const std::vector<Variant> kVariants = {
    // gpt-oss: sinks, grouped-query heads, a window (the cache a ring), rotary embeddings.
    {"sinks+window+gqa+rope", 16, 4, 2, 4, 5, true, 0.0, 0.0, {}, true},
    {"sinks", 12, 3, 3, 4, 0, false, 0.0, 0.0, {}, true},
    // Gemma 2: softcap, grouped-query heads, head_dim set.
    {"softcap+gqa+rope", 16, 4, 2, 6, 0, true, 0.3, 0.0, {}, false},
    // BLOOM: the standard ALiBi slopes of 6 heads (a second series past 4).
    {"alibi", 12, 6, 6, 2, 0, false, 0.0, 8.0, {}, false},
    // Given slopes, read from a ring: distances from absolute positions.
    {"alibi-slopes+window", 12, 3, 3, 4, 6, false, 0.0, 0.0, {0.9, 0.3, 0.05}, false},
    {"all", 16, 4, 2, 4, 0, false, 3.0, 4.0, {}, true},
};

MultiHeadAttentionOptions options(const Variant& v, Index max_positions, Index value_head_dim = 0) {
  MultiHeadAttentionOptions o;
  o.d_in = v.d;
  o.num_heads = v.heads;
  o.num_kv_heads = v.kv_heads;
  o.head_dim = v.head_dim;
  o.value_head_dim = value_head_dim;
  o.qkv_bias = true;
  o.causal = true;
  o.sliding_window = v.window;
  if (v.rope) {
    o.rope = attn::RotaryOptions{v.head_dim, v.head_dim, 10000.0, attn::RopeStyle::kHalfSplit,
                                 max_positions};
  }
  o.softcap = v.softcap;
  o.alibi_max_bias = v.alibi_max_bias;
  o.alibi_slopes = v.slopes;
  o.sinks = v.sinks;
  return o;
}

/// The module of `v` with sinks set to values in [-1, 1.5] (their initial 0 would hide a
/// sink read from the wrong head).
template <class Scalar>
MultiHeadAttention<Scalar> make_module(const Variant& v, Index max_positions = 64,
                                       Index value_head_dim = 0) {
  attn::TorchGenerator gen(11);
  MultiHeadAttention<Scalar> m(options(v, max_positions, value_head_dim), gen);
  for (Index h = 0; h < m.sinks().extent(0); ++h) {
    m.sinks()(h) =
        static_cast<Scalar>(-1.0 + 2.5 * static_cast<double>(h) / static_cast<double>(v.heads));
  }
  m.eval();
  return m;
}

template <class Scalar>
double max_diff(TensorView<const Scalar, 3> a, TensorView<const Scalar, 3> b) {
  double worst = 0;
  for (Index i = 0; i < a.extent(0); ++i) {
    for (Index j = 0; j < a.extent(1); ++j) {
      for (Index k = 0; k < a.extent(2); ++k) {
        worst = std::max(
            worst, std::abs(static_cast<double>(a(i, j, k)) - static_cast<double>(b(i, j, k))));
      }
    }
  }
  return worst;
}

template <class Scalar>
class ModuleVariants : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ModuleVariants, Scalars, );

// Tolerance: 2 module_tolerance, as tests/attention/cached_forward_test.cpp: each forward is
// within module_tolerance of the exact result (the variants add a tanh, a product and one
// exp per row, each within an ulp), so they are within twice that of each other. A wrong
// ALiBi position, a sink of another head or a missing softcap moves the outputs by far more:
// the test checks that each variant changes the output by at least 1e-2.
TYPED_TEST(ModuleVariants, CachedGenerationEqualsTheWholeForward) {
  using S = TypeParam;
  const Index batch = 2, total = 30;
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const MultiHeadAttention<S> m = make_module<S>(v);
    const auto x = attn::test::random_tensor<S>(Shape<3>{batch, total, v.d}, 7);
    const Tensor<S, 3> whole = m.forward(x.view());
    // The variant matters: the same module without it gives other outputs.
    {
      attn::TorchGenerator gen(11);
      MultiHeadAttentionOptions plain = options(v, 64);
      plain.softcap = plain.alibi_max_bias = 0.0;
      plain.alibi_slopes.clear();
      plain.sinks = false;
      MultiHeadAttention<S> p(plain, gen);
      p.eval();
      EXPECT_GT(max_diff<S>(p.forward(x.view()).view(), whole.view()), 1e-2);
    }
    const Index max_chunk = 4;
    KVCache<S> cache = v.window > 0 ? KVCache<S>::sliding_window(batch, v.kv_heads, v.head_dim,
                                                                 v.window, max_chunk)
                                    : KVCache<S>(batch, v.kv_heads, v.head_dim, total);
    Tensor<S, 3> out({batch, total, v.d});
    attn::Workspace ws;
    // A prefill of 9 (in chunks of 4 with a ring), chunks of 3, then single tokens.
    Index t0 = 0;
    for (const Index t : {9, 3, 3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
      m.forward(attn::slice(x.view(), 1, t0, t0 + t), attn::slice(out.view(), 1, t0, t0 + t), ws,
                cache);
      t0 += t;
    }
    ASSERT_EQ(t0, total);
    const double tol = 2 * module_tolerance<S>(v.d, v.head_dim, total, v.d);
    EXPECT_TRUE(ref::all_near(TensorView<const S, 3>(out.view()), whole.view(), tol));
  }
}

// Ragged items: after a truncation each item decodes at its own positions, which ALiBi's
// distances and the window follow (each item against the whole forward of its own tokens).
TYPED_TEST(ModuleVariants, RaggedItemsDecodeAtTheirOwnPositions) {
  using S = TypeParam;
  for (const Variant& v : kVariants) {
    if (v.alibi_max_bias == 0.0 && v.slopes.empty()) continue;
    SCOPED_TRACE(v.name);
    const MultiHeadAttention<S> m = make_module<S>(v);
    KVCache<S> cache = v.window > 0
                           ? KVCache<S>::sliding_window(2, v.kv_heads, v.head_dim, v.window, 8)
                           : KVCache<S>(2, v.kv_heads, v.head_dim, 16);
    attn::Workspace ws;
    const auto prompt = attn::test::random_tensor<S>(Shape<3>{2, 8, v.d}, 31);
    Tensor<S, 3> y({2, 8, v.d});
    m.forward(prompt.view(), y.view(), ws, cache);
    cache.truncate(1, 5);  // item 1 drops its last 3 tokens (rejected draft tokens)
    std::vector<S> seq[2];
    for (Index b = 0; b < 2; ++b) {
      const Index keep = b == 0 ? 8 : 5;
      for (Index t = 0; t < keep; ++t) {
        for (Index f = 0; f < v.d; ++f) seq[b].push_back(prompt(b, t, f));
      }
    }
    for (Index step = 0; step < 3; ++step) {
      const auto x = attn::test::random_tensor<S>(Shape<3>{2, 1, v.d}, 40 + step);
      Tensor<S, 3> out({2, 1, v.d});
      m.forward(x.view(), out.view(), ws, cache);
      for (Index b = 0; b < 2; ++b) {
        for (Index f = 0; f < v.d; ++f) seq[b].push_back(x(b, 0, f));
        const Index len = static_cast<Index>(seq[b].size()) / v.d;
        const Tensor<S, 3> whole = m.forward(TensorView<const S, 3>(seq[b].data(), {1, len, v.d}));
        EXPECT_TRUE(ref::all_near(attn::slice(TensorView<const S, 3>(out.view()), 0, b, b + 1),
                                  attn::slice(whole.view(), 1, len - 1, len),
                                  2 * module_tolerance<S>(v.d, v.head_dim, len, v.d)))
            << "step " << step << " item " << b;
      }
    }
  }
}

// The materialised path (weights requested) runs the same variants: the same output within
// the paths' rounding, and with sinks each row of weights sums to less than 1 (the sink takes
// the rest), without to 1.
TYPED_TEST(ModuleVariants, MaterialisedPathAgrees) {
  using S = TypeParam;
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const MultiHeadAttention<S> m = make_module<S>(v);
    const auto x = attn::test::random_tensor<S>(Shape<3>{2, 11, v.d}, 3);
    const Tensor<S, 3> streamed = m.forward(x.view());
    const auto result = m.forward_with_weights(x.view());
    EXPECT_TRUE(ref::all_near(TensorView<const S, 3>(result.output.view()), streamed.view(),
                              2 * module_tolerance<S>(v.d, v.head_dim, 11, v.d)));
    const auto& w = result.weights;
    for (Index b = 0; b < 2; ++b) {
      for (Index h = 0; h < v.heads; ++h) {
        for (Index i = 0; i < 11; ++i) {
          double sum = 0;
          for (Index j = 0; j < 11; ++j) sum += static_cast<double>(w(b, h, i, j));
          if (v.sinks) {
            EXPECT_LT(sum, 0.99) << b << " " << h << " " << i;
          } else {
            EXPECT_NEAR(sum, 1.0, 1e-5) << b << " " << h << " " << i;
          }
        }
      }
    }
  }
}

/// sum(grad_out * m(x)) in double.
double loss(const MultiHeadAttention<double>& m, const Tensor<double, 3>& x,
            const Tensor<double, 3>& grad_out) {
  const Tensor<double, 3> y = m.forward(x.view());
  double s = 0;
  for (Index i = 0; i < y.size(); ++i) s += y.data()[i] * grad_out.data()[i];
  return s;
}

// Every gradient of a module with all three variants (and a window, grouped-query heads)
// against central differences of the loss, in double: each sink, a spread of entries of every
// other parameter, and of the input. Step 1e-5: the truncation error (h^2 times third
// derivatives of order 1) and the rounding error (1e-16 |loss| / h) both stay near 1e-10,
// so 1e-7 (relative to max(1, |g|)) leaves a wide margin; a dropped dsinks or a wrong
// softcap derivative is off by 1e-2 or more.
TEST(ModuleVariantsBackward, EveryGradientMatchesFiniteDifferences) {
  for (const int c : {0, 1, 2}) {
    const bool given_slopes = c > 0;
    const Index value_head_dim = c == 2 ? 3 : 0;  // value heads narrower than the keys' 4
    SCOPED_TRACE(given_slopes ? "given slopes" : "standard slopes");
    SCOPED_TRACE("value_head_dim " + std::to_string(value_head_dim));
    Variant v{"all+window", 12, 4, 2, 4, 4, true, 1.5, 6.0, {}, true};
    if (given_slopes) v.alibi_max_bias = 0.0, v.slopes = {0.7, 0.05, 0.3, 1.1};
    MultiHeadAttention<double> m = make_module<double>(v, 64, value_head_dim);
    const auto x = attn::test::random_tensor<double>(Shape<3>{2, 7, v.d}, 21);
    const auto grad_out = attn::test::random_tensor<double>(Shape<3>{2, 7, v.d}, 22);
    attn::SavedForward<double> saved;
    attn::Workspace ws;
    Tensor<double, 3> out({2, 7, v.d});
    m.forward(x.view(), out.view(), saved, ws);
    attn::Gradients<double> grads(m.named_parameters());
    Tensor<double, 3> grad_x({2, 7, v.d});
    m.backward(grad_out.view(), saved, grad_x.view(), grads, ws);
    ASSERT_NE(grads.find("sinks"), nullptr);
    const double h = 1e-5;
    const auto check = [&](double* value, double analytic, const std::string& what) {
      const double keep = *value;
      *value = keep + h;
      const double up = loss(m, x, grad_out);
      *value = keep - h;
      const double down = loss(m, x, grad_out);
      *value = keep;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic, numeric, 1e-7 * std::max(1.0, std::abs(numeric))) << what;
    };
    Index checked = 0;
    for (const auto& p : m.named_parameters()) {
      const TensorView<double, 2> w = p.matrix();
      const TensorView<const double, 2> g = grads.at(p.name()).matrix();
      const Index n = w.extent(0) * w.extent(1), stride = p.name() == "sinks" ? 1 : 7;
      for (Index e = 0; e < n; e += stride) {
        const Index r = e / w.extent(1), c = e % w.extent(1);
        check(&w(r, c), g(r, c), p.name() + "[" + std::to_string(e) + "]");
        ++checked;
      }
    }
    EXPECT_GT(checked, 40);
    Tensor<double, 3> xm = x;
    for (Index e = 0; e < xm.size(); e += 5) {
      const double keep = xm.data()[e];
      xm.data()[e] = keep + h;
      const double up = loss(m, xm, grad_out);
      xm.data()[e] = keep - h;
      const double down = loss(m, xm, grad_out);
      xm.data()[e] = keep;
      EXPECT_NEAR(grad_x.data()[e], (up - down) / (2 * h), 1e-7) << "x[" << e << "]";
    }
  }
}

// ---- value heads of their own size (MultiHeadAttentionOptions::value_head_dim) ----

/// Options of a 4-head module of d_in 12 and d_out 10 whose value heads (hd_v) differ from
/// its query/key heads (hd): kdim and vdim pick the projections' storage (0, 0: one fused
/// weight; equal: [W_k; W_v] stacked; different: three weights).
MultiHeadAttentionOptions value_head_options(Index kdim, Index vdim, Index kv_heads, Index hd,
                                             Index hd_v, bool causal) {
  MultiHeadAttentionOptions o;
  o.d_in = 12;
  o.d_out = 10;
  o.kdim = kdim;
  o.vdim = vdim;
  o.num_heads = 4;
  o.num_kv_heads = kv_heads;
  o.head_dim = hd;
  o.value_head_dim = hd_v;
  o.qkv_bias = true;
  o.causal = causal;
  return o;
}

/// The module's output on its own weights, computed apart from it in long double: each
/// projection a loop of its own (ref::linear), the key/value heads repeated per group
/// (ref::repeat_kv), the attention per head (ref::attention), the heads merged, out_proj.
Tensor<double, 3> value_head_reference(const MultiHeadAttention<float>& m,
                                       TensorView<const float, 3> query,
                                       TensorView<const float, 3> key,
                                       TensorView<const float, 3> value, const ref::DenseMask& mask,
                                       Tensor<double, 4>* weights = nullptr) {
  const attn::test::WideWeights w = attn::test::wide(m);
  const Index heads = m.num_heads(), kv_heads = m.num_kv_heads();
  const Tensor<ref::Real, 3> q = ref::linear(query, w.wq.view(), w.bq.view());
  const Tensor<ref::Real, 3> k = ref::linear(key, w.wk.view(), w.bk.view());
  const Tensor<ref::Real, 3> v = ref::linear(value, w.wv.view(), w.bv.view());
  const auto kh = ref::repeat_kv(ref::heads_of(k.view(), kv_heads), heads);
  const auto vh = ref::repeat_kv(ref::heads_of(v.view(), kv_heads), heads);
  ref::Result r = ref::attention(ref::heads_of(q.view(), heads), kh.view(), vh.view(), mask,
                                 attn::test::inv_sqrt(m.head_dim()));
  if (weights != nullptr) *weights = std::move(r.weights);
  const Tensor<ref::Real, 3> ctx = ref::merge(r.output.view());
  const Tensor<ref::Real, 3> y = ref::linear(ctx.view(), w.wo.view(), w.bo.view());
  Tensor<double, 3> out(y.shape());
  for (Index i = 0; i < y.size(); ++i) out.data()[i] = static_cast<double>(y.data()[i]);
  return out;
}

// The whole-sequence forward (streamed and materialised, frozen and not) against the
// independent reference, for each storage of the projections: self-attention (one fused
// weight, two GEMMs: [W_q; W_k], then W_v), cross-attention with kdim == vdim (key = value
// and not) and kdim != vdim; grouped-query heads; hd_v below and above hd; a causal bound or
// a key-length mask. Tolerance: module_tolerance (see module_test_support.hpp) with the
// larger head size. The weights must equal the reference's probabilities to the same
// tolerance. Freezing packs the weights and must change no bit.
TEST(ModuleValueHeadDim, ForwardMatchesAnIndependentReference) {
  struct Case {
    const char* name;
    Index kdim, vdim, kv_heads, hd, hd_v;
    bool causal, key_is_value;
  };
  const Case cases[] = {
      {"self, fused weight, GQA, causal", 0, 0, 2, 5, 2, true, false},
      {"self, hd_v > hd", 0, 0, 4, 2, 6, true, false},
      {"cross, kdim == vdim, key = value", 7, 7, 2, 5, 3, false, true},
      {"cross, kdim == vdim, two tensors", 7, 7, 1, 5, 3, false, false},
      {"cross, kdim != vdim", 7, 5, 4, 3, 4, false, false},
  };
  const Index batch = 2, tq = 6, tk = 9;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    attn::TorchGenerator gen(5);
    MultiHeadAttention<float> m(
        value_head_options(c.kdim, c.vdim, c.kv_heads, c.hd, c.hd_v, c.causal), gen);
    EXPECT_EQ(m.value_head_dim(), c.hd_v);
    EXPECT_EQ(m.v_proj_weight().extent(0), c.kv_heads * c.hd_v);
    EXPECT_EQ(m.out_proj().weight().extent(1), 4 * c.hd_v);
    const bool self = c.kdim == 0;
    const Index keys = self ? tq : tk;
    const auto x = attn::test::random_tensor<float>(Shape<3>{batch, tq, 12}, 1);
    const auto kx = attn::test::random_tensor<float>(Shape<3>{batch, keys, self ? 12 : c.kdim}, 2);
    const auto vx = attn::test::random_tensor<float>(Shape<3>{batch, keys, self ? 12 : c.vdim}, 3);
    const TensorView<const float, 3> key = self ? x.view() : kx.view();
    const TensorView<const float, 3> value =
        self ? x.view() : (c.key_is_value ? kx.view() : vx.view());
    attn::AttentionMask<float> mask;
    ref::DenseMask dense(batch, 4, tq, keys);
    if (c.causal) {
      dense.causal(attn::CausalAlignment::kTopLeft);
    } else {
      mask.key_lengths({keys, 4});
      dense.key_lengths({keys, 4});
    }
    Tensor<double, 4> expected_weights;
    const Tensor<double, 3> expected =
        value_head_reference(m, x.view(), key, value, dense, &expected_weights);
    const double tol = module_tolerance<float>(12, std::max(c.hd, c.hd_v), keys, 10);
    const Tensor<float, 3> streamed = m.forward(x.view(), key, value, mask);
    EXPECT_TRUE(ref::all_near(streamed.view(), expected.view(), tol));
    const auto result = m.forward_with_weights(x.view(), key, value, mask);
    EXPECT_TRUE(ref::all_near(result.output.view(), expected.view(), tol));
    EXPECT_TRUE(ref::all_near(result.weights.view(), expected_weights.view(), tol));
    m.freeze();
    EXPECT_EQ(attn::test::to_vector(m.forward(x.view(), key, value, mask)),
              attn::test::to_vector(streamed));
  }
}

// The incremental forward through a KVCache of the same value_head_dim equals the whole
// forward (tolerance as CachedGenerationEqualsTheWholeForward): a plain cache, a sliding-window
// ring with the variants (sinks, ALiBi, softcap, rotary embeddings on the 6-wide keys), and a
// bfloat16 cache (the rows rounded to 8 bits: 2^-8 relative on each key and value, outputs of
// order 1, so within 3e-2; a value row in the wrong place or of the wrong width moves them by
// more than 0.1). Then the packed prefill of two sequences equals each one's incremental forward
// alone, bit for bit, and a cache of another value_head_dim is refused naming both.
TEST(ModuleValueHeadDim, CachedAndPackedPrefillEqualTheWholeForward) {
  MultiHeadAttentionOptions o = value_head_options(0, 0, 2, 6, 4, true);
  o.d_out = 12;
  for (const int variant : {0, 1, 2}) {
    SCOPED_TRACE("case " + std::to_string(variant));
    MultiHeadAttentionOptions c = o;
    attn::KVCacheOptions co;
    co.batch = 2, co.num_kv_heads = 2, co.head_dim = 6, co.value_head_dim = 4, co.capacity = 24;
    if (variant == 1) {
      c.sliding_window = 5;
      c.sinks = true;
      c.alibi_max_bias = 4.0;
      c.softcap = 2.0;
      c.rope = attn::RotaryOptions{6, 6, 100.0, attn::RopeStyle::kHalfSplit, 64};
      co.window = 5, co.max_chunk = 4, co.capacity = 0;
    }
    if (variant == 2) co.element = attn::KVElement::kBFloat16;
    attn::TorchGenerator gen(9);
    MultiHeadAttention<float> m(c, gen);
    for (Index h = 0; h < m.sinks().extent(0); ++h)
      m.sinks()(h) = 0.4f * static_cast<float>(h) - 0.5f;
    const auto x = attn::test::random_tensor<float>(Shape<3>{2, 20, 12}, 4);
    const Tensor<float, 3> whole = m.forward(x.view());
    KVCache<float> cache(co);
    Tensor<float, 3> out({2, 20, 12});
    attn::Workspace ws;
    Index t0 = 0;
    for (const Index t : {7, 3, 1, 4, 1, 1, 1, 1, 1}) {
      m.forward(attn::slice(x.view(), 1, t0, t0 + t), attn::slice(out.view(), 1, t0, t0 + t), ws,
                cache);
      t0 += t;
    }
    ASSERT_EQ(t0, 20);
    const double tol = variant == 2 ? 3e-2 : 2 * module_tolerance<float>(12, 6, 20, 12);
    EXPECT_TRUE(ref::all_near(TensorView<const float, 3>(out.view()), whole.view(), tol));
    // The packed prefill of sequences of 7 and 3 tokens against each alone.
    const attn::SequenceOffsets cu = attn::SequenceOffsets::from_lengths({7, 3});
    const Tensor<float, 2> rows(attn::slice(attn::select(x.view(), 0, 0), 0, 0, 10));
    Tensor<float, 2> packed(Shape<2>{10, 12});
    KVCache<float> both(co);
    m.forward(rows.view(), rows.view(), rows.view(), cu, packed.view(), ws, both);
    for (Index s = 0; s < 2; ++s) {
      attn::KVCacheOptions one = co;
      one.batch = 1;
      KVCache<float> alone(one);
      const Index r0 = cu.begin(s), r1 = r0 + cu.length(s);
      Tensor<float, 3> y(Shape<3>{1, r1 - r0, 12});
      m.forward(attn::unsqueeze(attn::slice(rows.view(), 0, r0, r1), 0), y.view(), ws, alone);
      EXPECT_EQ(attn::test::to_vector(attn::slice(packed.view(), 0, r0, r1)),
                attn::test::to_vector(attn::select(y.view(), 0, 0)))
          << "sequence " << s;
    }
  }
  attn::TorchGenerator gen(9);
  const MultiHeadAttention<float> m(o, gen);
  KVCache<float> wrong(2, 2, 6, 8);  // value rows of 6
  Tensor<float, 3> out({2, 1, 12});
  attn::Workspace ws;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                m.forward(Tensor<float, 3>({2, 1, 12}).view(), out.view(), ws, wrong);
              }),
              AllOf(HasSubstr("value_head_dim=6"), HasSubstr("value_head_dim=4")));
}

// The packed forward equals each sequence alone, bit for bit, and the training forward and
// backward (packed and not) give the same bits on 1 and 2 threads.
TEST(ModuleValueHeadDim, PackedForwardAndThreadCountInvariance) {
  const int threads = attn::num_threads();
  attn::TorchGenerator gen(13);
  const MultiHeadAttention<float> m(value_head_options(0, 0, 2, 6, 3, true), gen);
  const attn::SequenceOffsets cu = attn::SequenceOffsets::from_lengths({9, 1, 14});
  const auto x = attn::test::random_tensor<float>(Shape<2>{24, 12}, 6);
  const auto grad_out = attn::test::random_tensor<float>(Shape<2>{24, 10}, 7);
  const auto xb = attn::test::random_tensor<float>(Shape<3>{2, 11, 12}, 8);
  const auto gb = attn::test::random_tensor<float>(Shape<3>{2, 11, 10}, 9);
  std::vector<float> results[2];
  for (int t = 0; t < 2; ++t) {
    attn::set_num_threads(t + 1);
    attn::Workspace ws;
    std::vector<float>& r = results[t];
    Tensor<float, 2> packed(Shape<2>{24, 10}), gx(Shape<2>{24, 12});
    m.forward(x.view(), x.view(), x.view(), cu, packed.view(), ws);
    if (t == 0) {
      for (Index s = 0; s < cu.sequences(); ++s) {
        const Index r0 = cu.begin(s), r1 = r0 + cu.length(s);
        Tensor<float, 2> y(Shape<2>{r1 - r0, 10});
        const auto xs = attn::slice(x.view(), 0, r0, r1);
        m.forward(xs, xs, xs, y.view(), ws);
        EXPECT_EQ(attn::test::to_vector(attn::slice(packed.view(), 0, r0, r1)),
                  attn::test::to_vector(y))
            << "sequence " << s;
      }
    }
    attn::SavedForward<float> saved;
    attn::Gradients<float> grads(m.named_parameters());
    m.forward(x.view(), x.view(), x.view(), cu, packed.view(), saved, ws);
    m.backward(grad_out.view(), saved, gx.view(), gx.view(), gx.view(), grads, ws);
    Tensor<float, 3> y(Shape<3>{2, 11, 10}), gxb(Shape<3>{2, 11, 12});
    m.forward(xb.view(), y.view(), saved, ws);
    m.backward(gb.view(), saved, gxb.view(), grads, ws);
    for (const auto& v : {attn::test::to_vector(packed), attn::test::to_vector(gx),
                          attn::test::to_vector(y), attn::test::to_vector(gxb)}) {
      r.insert(r.end(), v.begin(), v.end());
    }
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const auto g = attn::test::to_vector(grads[i].matrix());
      r.insert(r.end(), g.begin(), g.end());
    }
  }
  attn::set_num_threads(threads);
  EXPECT_EQ(results[0], results[1]);
}

// Parameter shapes under every naming, a state_dict round trip, what is refused (naming the
// sizes) and the Llama-named file's options.
TEST(ModuleValueHeadDim, ParametersStateDictAndErrors) {
  attn::TorchGenerator gen(17);
  const MultiHeadAttentionOptions o = value_head_options(0, 0, 2, 5, 3, true);
  MultiHeadAttention<float> m(o, gen);
  // in_proj_weight stacks [W_q; W_k; W_v]: (4 + 2) 5 + 2 * 3 rows.
  EXPECT_EQ(m.in_proj_weight().shape(), (Shape<2>{36, 12}));
  EXPECT_EQ(m.in_proj_bias().extent(0), 36);
  const auto llama = m.named_parameters(ParameterNames::kLlama);
  ASSERT_NE(llama.find("v_proj.weight"), nullptr);
  EXPECT_EQ(llama.find("v_proj.weight")->matrix().shape(), (Shape<2>{6, 12}));
  EXPECT_EQ(llama.find("o_proj.weight")->matrix().shape(), (Shape<2>{10, 12}));
  // A round trip through a state_dict under Llama's names, and the options read back.
  attn::io::SafetensorsWriter writer;
  attn::io::save_state_dict(m, writer, "", ParameterNames::kLlama);
  const auto file = attn::io::SafetensorsFile::from_bytes(writer.to_bytes());
  MultiHeadAttentionOptions read = attn::io::options_from_state_dict(file, 4);
  EXPECT_EQ(read.head_dim, 5);
  EXPECT_EQ(read.num_kv_heads, 2);
  EXPECT_EQ(read.value_head_dim, 3);
  read.causal = true;
  MultiHeadAttention<float> loaded(read);
  attn::io::load_state_dict(loaded, file);
  const auto x = attn::test::random_tensor<float>(Shape<3>{1, 5, 12}, 3);
  EXPECT_EQ(attn::test::to_vector(loaded.forward(x.view())),
            attn::test::to_vector(m.forward(x.view())));
  // The per-head [q; k; v] layout has no room for value heads of another size.
  const Tensor<float, 2> fused(Shape<2>{36, 12});
  EXPECT_THAT(attn::test::thrown<ConfigError>(
                  [&] { m.set_in_proj(fused.view(), {}, attn::QkvLayout::kPerHead); }),
              HasSubstr("value_head_dim == head_dim (got 2 and 4, 3 and 5)"));
  m.set_in_proj(fused.view());  // the stacked layout loads
  // Bad sizes, named.
  MultiHeadAttentionOptions bad = o;
  bad.value_head_dim = -1;
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] { MultiHeadAttention<float> x(bad); }),
              HasSubstr("value_head_dim=-1"));
  // Without an output projection the context (H hd_v) is the output (d_out).
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] {
                attn::detail::CoreConfig c(o);
                c.name = "Test";
                c.out_proj = false;
                (void)attn::detail::checked_core_config(c);
              }),
              HasSubstr("num_heads=4 x value_head_dim=3 != d_out=10"));
  // A record of a module with other value heads is refused, naming both.
  attn::TorchGenerator gen2(17);
  MultiHeadAttentionOptions other = o;
  other.value_head_dim = 0;
  const MultiHeadAttention<float> n(other, gen2);
  attn::SavedForward<float> saved;
  attn::Workspace ws;
  Tensor<float, 3> y(Shape<3>{1, 5, 10}), gx(Shape<3>{1, 5, 12});
  n.forward(x.view(), y.view(), saved, ws);
  attn::Gradients<float> grads(m.named_parameters());
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { m.backward(y.view(), saved, gx.view(), grads, ws); }),
              HasSubstr("value_head_dim=3"));
}

TEST(ModuleVariantsParameters, SinksAreAParameterLikeAnyOther) {
  const Variant v{"sinks", 12, 3, 3, 4, 0, false, 0.0, 0.0, {}, true};
  attn::TorchGenerator gen(2);
  MultiHeadAttention<float> m(options(v, 64), gen);
  // Initial value 0, named `sinks`, last under every naming.
  ASSERT_EQ(m.sinks().extent(0), 3);
  for (Index h = 0; h < 3; ++h) EXPECT_EQ(m.sinks()(h), 0.0f);
  for (const ParameterNames names :
       {ParameterNames::kDefault, ParameterNames::kLlama, ParameterNames::kNotebook,
        ParameterNames::kSeparateProjections}) {
    const auto params = m.named_parameters(names);
    ASSERT_GT(params.size(), 0u);
    EXPECT_EQ(params[params.size() - 1].name(), "sinks");
    EXPECT_EQ(params[params.size() - 1].vector().data(), m.sinks().data());
  }
  // The weights drawn are those of the module without sinks (nothing more is drawn).
  {
    attn::TorchGenerator gen2(2);
    MultiHeadAttentionOptions plain = options(v, 64);
    plain.sinks = false;
    const MultiHeadAttention<float> p(plain, gen2);
    const auto a = std::as_const(m).named_parameters();
    const auto b = p.named_parameters();
    ASSERT_EQ(a.size(), b.size() + 1);
    for (std::size_t i = 0; i < b.size(); ++i) {
      EXPECT_TRUE(ref::same_bits(TensorView<const float, 2>(a[i].matrix()), b[i].matrix()))
          << b[i].name();
    }
  }
  // A training step moves them: AdamW over named_parameters() with the backward's Gradients.
  m.eval();
  const auto x = attn::test::random_tensor<float>(Shape<3>{2, 6, 12}, 4);
  attn::SavedForward<float> saved;
  attn::Workspace ws;
  Tensor<float, 3> out({2, 6, 12});
  m.forward(x.view(), out.view(), saved, ws);
  attn::Gradients<float> grads(m.named_parameters());
  m.backward(TensorView<const float, 3>(out.view()), saved, TensorView<float, 3>(), grads, ws);
  const auto gs = grads.at("sinks").vector();
  // dL/dsink_h = -sum_rows p_sink * (dO . O): not zero for L = |out|^2 / 2.
  for (Index h = 0; h < 3; ++h) EXPECT_NE(gs(h), 0.0f) << h;
  attn::optim::AdamWOptions adam;
  adam.lr = 0.1;
  attn::optim::AdamW<float> opt(m.named_parameters(), adam);
  opt.step(grads);
  for (Index h = 0; h < 3; ++h) {
    // AdamW's first step moves each parameter by lr against its gradient's sign.
    EXPECT_NEAR(m.sinks()(h), gs(h) > 0 ? -0.1f : 0.1f, 1e-4f) << h;
  }
  // Freezing packs the projections; the sinks stay live.
  m.freeze();
  ASSERT_TRUE(m.is_frozen());
  const Tensor<float, 3> before = m.forward(x.view());
  m.sinks()(1) = 3.0f;
  const Tensor<float, 3> after = m.forward(x.view());
  EXPECT_GT(max_diff<float>(before.view(), after.view()), 1e-3);
  EXPECT_TRUE(m.is_frozen());
}

// A record of a module with other variants is refused by the backward, naming them.
TEST(ModuleVariantsParameters, BackwardRefusesARecordOfOtherVariants) {
  const Variant v{"softcap", 8, 2, 2, 4, 0, false, 2.0, 0.0, {}, false};
  MultiHeadAttention<float> a = make_module<float>(v);
  MultiHeadAttentionOptions other = options(v, 64);
  other.softcap = 3.0;
  attn::TorchGenerator gen(1);
  MultiHeadAttention<float> b(other, gen);
  const auto x = attn::test::random_tensor<float>(Shape<3>{1, 4, 8}, 1);
  attn::SavedForward<float> saved;
  attn::Workspace ws;
  Tensor<float, 3> out({1, 4, 8});
  a.forward(x.view(), out.view(), saved, ws);
  attn::Gradients<float> grads(b.named_parameters());
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                b.backward(TensorView<const float, 3>(out.view()), saved, TensorView<float, 3>(),
                           grads, ws);
              }),
              AllOf(HasSubstr("softcap=2"), HasSubstr("softcap=3")));
}

TEST(ModuleVariantsOptions, BadOptionsThrowNamingTheValues) {
  const auto build = [](const std::function<void(MultiHeadAttentionOptions&)>& edit) {
    MultiHeadAttentionOptions o;
    o.d_in = 8;
    o.num_heads = 2;
    edit(o);
    return [o] { MultiHeadAttention<float> m(o); };
  };
  using Edit = std::function<void(MultiHeadAttentionOptions&)>;
  const std::pair<Edit, std::string> cases[] = {
      {[](auto& o) { o.softcap = -1.0; }, "softcap=-1 must be 0 (off) or positive and finite"},
      {[](auto& o) { o.softcap = std::numeric_limits<double>::infinity(); }, "softcap=inf"},
      {[](auto& o) { o.softcap = std::nan(""); }, "softcap=nan"},
      // Finite in double, not in the float module's arithmetic.
      {[](auto& o) { o.softcap = 1e300; }, "softcap=1e+300 must be 0 (off) or finite"},
      {[](auto& o) { o.alibi_max_bias = -8.0; }, "alibi_max_bias=-8 must be 0 (off)"},
      {[](auto& o) {
         o.alibi_slopes = {0.5, 0.25, 0.125};
       },
       "alibi_slopes has 3 values, expected one per head: num_heads=2"},
      {[](auto& o) {
         o.alibi_slopes = {0.5, std::numeric_limits<double>::infinity()};
       },
       "alibi_slopes[1]=inf must be finite"},
      {[](auto& o) {
         o.alibi_slopes = {0.5, 0.25};
         o.alibi_max_bias = 8.0;
       },
       "alibi_max_bias=8 and 2 alibi_slopes are both set"},
  };
  for (const auto& [edit, message] : cases) {
    SCOPED_TRACE(message);
    EXPECT_THAT(attn::test::thrown<ConfigError>(build(edit)),
                AllOf(HasSubstr("MultiHeadAttention"), HasSubstr(message)));
  }
}

// ---- the other modules: SelfAttention, CausalAttention, CrossAttention, the wrapper ----

using attn::test::Real;
using attn::test::WideWeights;

/// One variant of the other modules' tests, for a module of `heads` heads.
struct ModuleCase {
  const char* name;
  double softcap, alibi_max_bias;
  bool given_slopes, sinks;

  attn::AttentionVariants variants(Index heads) const {
    attn::AttentionVariants v;
    v.softcap = softcap;
    v.alibi_max_bias = alibi_max_bias;
    for (Index h = 0; given_slopes && h < heads; ++h) v.alibi_slopes.push_back(0.3 + 0.25 * h);
    v.sinks = sinks;
    return v;
  }
};

// Each variant large enough to move the outputs by more than 1e-3 at these sizes (checked
// below on the reference itself): a softcap near the scores' own size, slopes of 0.3..1.
const ModuleCase kModuleCases[] = {
    {"softcap 0.3", 0.3, 0.0, false, false},
    {"ALiBi max_bias 2", 0.0, 2.0, false, false},
    {"ALiBi given slopes", 0.0, 0.0, true, false},
    {"sinks", 0.0, 0.0, false, true},
    {"all", 0.5, 4.0, false, true},
};

/// The slope of head h of `heads` as the case gives it (0: no ALiBi), from the published
/// series (BLOOM's get_slopes) rather than attn::alibi_slopes(): n the largest power of two
/// <= heads, 2^(-b (h + 1) / n) for h < n, then the odd steps of the series of 2n.
Real slope_of(const ModuleCase& c, Index h, Index heads) {
  if (c.given_slopes) return static_cast<Real>(0.3 + 0.25 * h);
  if (c.alibi_max_bias == 0.0) return 0;
  Index n = 1;
  while (2 * n <= heads) n *= 2;
  const Real b = static_cast<Real>(c.alibi_max_bias);
  return h < n ? std::pow(Real(2), -b * static_cast<Real>(h + 1) / static_cast<Real>(n))
               : std::pow(Real(2),
                          -b * static_cast<Real>(2 * (h - n) + 1) / static_cast<Real>(2 * n));
}

/// The formulas, in long double, for a module with weights `w`: q, k, v projected, per head
/// h and query i over keys j: s = q.k / sqrt(hd); s = c tanh(s / c); s -= m_h |p_i - j| with
/// p_i = i + T_k - T_q (causal: keys j <= p_i only); softmax with exp(sink_h) added to the
/// denominator alone; heads merged; out_proj when `w` has one. `sinks` per head (empty: none).
template <class Scalar>
Tensor<double, 3> reference(TensorView<const Scalar, 3> xq, TensorView<const Scalar, 3> xkv,
                            const WideWeights& w, Index heads, bool causal, const ModuleCase& c,
                            const std::vector<Real>& sinks) {
  const Tensor<Real, 3> q = ref::linear(xq, w.wq.view(), w.bq.view());
  const Tensor<Real, 3> k = ref::linear(xkv, w.wk.view(), w.bk.view());
  const Tensor<Real, 3> v = ref::linear(xkv, w.wv.view(), w.bv.view());
  const Index batch = xq.extent(0), tq = xq.extent(1), tk = xkv.extent(1);
  const Index hd = q.extent(2) / heads, width = q.extent(2);
  Tensor<Real, 3> ctx({batch, tq, width});
  std::vector<Real> s(static_cast<std::size_t>(tk));
  for (Index b = 0; b < batch; ++b) {
    for (Index h = 0; h < heads; ++h) {
      const Real m = slope_of(c, h, heads);
      for (Index i = 0; i < tq; ++i) {
        const Index pos = i + tk - tq;
        Real top = sinks.empty() ? -INFINITY : sinks[static_cast<std::size_t>(h)];
        for (Index j = 0; j < tk; ++j) {
          Real x = 0;
          for (Index e = 0; e < hd; ++e) x += q(b, i, h * hd + e) * k(b, j, h * hd + e);
          x /= std::sqrt(static_cast<Real>(hd));
          if (c.softcap > 0) {
            x = static_cast<Real>(c.softcap) * std::tanh(x / static_cast<Real>(c.softcap));
          }
          x -= m * std::abs(static_cast<Real>(pos - j));
          s[static_cast<std::size_t>(j)] = causal && j > pos ? -INFINITY : x;
          top = std::max(top, s[static_cast<std::size_t>(j)]);
        }
        Real denominator = sinks.empty() ? 0 : std::exp(sinks[static_cast<std::size_t>(h)] - top);
        for (Index j = 0; j < tk; ++j)
          denominator += std::exp(s[static_cast<std::size_t>(j)] - top);
        for (Index e = 0; e < hd; ++e) {
          Real total = 0;
          for (Index j = 0; j < tk; ++j) {
            total += std::exp(s[static_cast<std::size_t>(j)] - top) * v(b, j, h * hd + e);
          }
          ctx(b, i, h * hd + e) = total / denominator;
        }
      }
    }
  }
  const Tensor<Real, 3> y =
      w.wo.size() > 0 ? ref::linear(ctx.view(), w.wo.view(), w.bo.view()) : ctx;
  Tensor<double, 3> out(y.shape());
  for (Index e = 0; e < y.size(); ++e) out.data()[e] = static_cast<double>(y.data()[e]);
  return out;
}

/// Sets the module's sinks (H) to distinct values per head (their initial 0, the same for
/// every head, would hide a sink read from another head), returned as the reference reads
/// them.
template <class Scalar>
std::vector<Real> set_sinks(TensorView<Scalar, 1> sinks, Index first = 0) {
  std::vector<Real> values;
  for (Index h = 0; h < sinks.extent(0); ++h) {
    sinks(h) = static_cast<Scalar>(-0.5 + 0.6 * static_cast<double>(first + h));
    values.push_back(static_cast<Real>(sinks(h)));
  }
  return values;
}

/// Weights of all heads of a wrapper, stacked as one multi-head module's (no out_proj).
template <class Scalar>
WideWeights stacked(const attn::MultiHeadAttentionWrapper<Scalar>& m) {
  WideWeights w;
  const Index heads = m.num_heads(), hd = m.head(0).d_out(), d = m.d_in();
  const bool bias = m.head(0).w_query().has_bias();
  w.wq = w.wk = w.wv = Tensor<Real, 2>({heads * hd, d});
  if (bias) w.bq = w.bk = w.bv = Tensor<Real, 1>(Shape<1>{heads * hd});
  for (Index h = 0; h < heads; ++h) {
    const WideWeights one =
        attn::test::wide(static_cast<const attn::SelfAttention<Scalar>&>(m.head(h)));
    for (Index r = 0; r < hd; ++r) {
      for (Index e = 0; e < d; ++e) {
        w.wq(h * hd + r, e) = one.wq(r, e);
        w.wk(h * hd + r, e) = one.wk(r, e);
        w.wv(h * hd + r, e) = one.wv(r, e);
      }
      if (bias) {
        w.bq(h * hd + r) = one.bq(r);
        w.bk(h * hd + r) = one.bk(r);
        w.bv(h * hd + r) = one.bv(r);
      }
    }
  }
  return w;
}

/// One module of each kind with the variants of `c`, its forward, and the reference of that
/// forward (`x` self-attention: B 2, T 6, d_in 8; cross: x_q B 2, T_q 5, x_kv T_kv 7, d 6).
template <class Scalar>
struct Modules {
  const ModuleCase& c;
  Tensor<Scalar, 3> x = attn::test::random_tensor<Scalar>(Shape<3>{2, 6, 8}, 51);
  Tensor<Scalar, 3> xkv = attn::test::random_tensor<Scalar>(Shape<3>{2, 7, 6}, 52);
  Tensor<Scalar, 3> xq = attn::test::random_tensor<Scalar>(Shape<3>{2, 5, 8}, 53);

  attn::SelfAttention<Scalar> self() const {
    attn::manual_seed(5);
    attn::SelfAttention<Scalar> m(8, 4, true, c.variants(1));
    return m;
  }
  attn::CausalAttention<Scalar> causal() const {
    attn::manual_seed(6);
    attn::CausalAttention<Scalar> m(8, 4, 16, 0.0, true, c.variants(1));
    return m;
  }
  attn::CrossAttention<Scalar> cross() const {
    attn::manual_seed(7);
    attn::CrossAttention<Scalar> m(8, 6, 8, 2, true, 0.0, c.variants(2));
    return m;
  }
  attn::MultiHeadAttentionWrapper<Scalar> wrapper() const {
    attn::manual_seed(8);
    attn::MultiHeadAttentionWrapper<Scalar> m(8, 3, 16, 0.0, 3, true, c.variants(3));
    return m;
  }

  // Each module's sinks set (set_sinks), its output, and the reference's.
  template <class M>
  std::pair<Tensor<Scalar, 3>, Tensor<double, 3>> self_like(M m, bool causal_module,
                                                            bool with_variant = true) const {
    const ModuleCase plain{"plain", 0.0, 0.0, false, false};
    const std::vector<Real> sinks = c.sinks ? set_sinks(m.sinks()) : std::vector<Real>();
    return {m.forward(x.view()), reference<Scalar>(x.view(), x.view(), attn::test::wide(m), 1,
                                                   causal_module, with_variant ? c : plain,
                                                   with_variant ? sinks : std::vector<Real>())};
  }
  std::pair<Tensor<Scalar, 3>, Tensor<double, 3>> run_cross(bool with_variant = true) const {
    attn::CrossAttention<Scalar> m = cross();
    const ModuleCase plain{"plain", 0.0, 0.0, false, false};
    const std::vector<Real> sinks = c.sinks ? set_sinks(m.module().sinks()) : std::vector<Real>();
    return {
        m.forward(xq.view(), xkv.view()),
        reference<Scalar>(xq.view(), xkv.view(), attn::test::wide(m.module()), 2, false,
                          with_variant ? c : plain, with_variant ? sinks : std::vector<Real>())};
  }
  std::pair<Tensor<Scalar, 3>, Tensor<double, 3>> run_wrapper(bool with_variant = true) const {
    attn::MultiHeadAttentionWrapper<Scalar> m = wrapper();
    const ModuleCase plain{"plain", 0.0, 0.0, false, false};
    std::vector<Real> sinks;
    for (Index h = 0; c.sinks && h < 3; ++h) sinks.push_back(set_sinks(m.head(h).sinks(), h)[0]);
    return {m.forward(x.view()),
            reference<Scalar>(x.view(), x.view(), stacked(m), 3, true, with_variant ? c : plain,
                              with_variant ? sinks : std::vector<Real>())};
  }
};

template <class Scalar>
class OtherModuleVariants : public ::testing::Test {};
TYPED_TEST_SUITE(OtherModuleVariants, Scalars, );

// Every module with each variant against the reference. Tolerance: module_tolerance (see
// module_test_support.hpp), the variants adding a tanh, a product and one exp per row, each
// within an ulp; a variant that is not applied (or applied with another head's slope or
// sink) is off by more than 1e-3, which the test checks on the reference itself.
TYPED_TEST(OtherModuleVariants, ForwardMatchesTheFormulas) {
  using S = TypeParam;
  for (const ModuleCase& c : kModuleCases) {
    SCOPED_TRACE(c.name);
    const Modules<S> m{c};
    const double tol = 2 * module_tolerance<S>(8, 4, 7, 8);
    const auto check = [&](const char* module,
                           const std::pair<Tensor<S, 3>, Tensor<double, 3>>& got,
                           const Tensor<double, 3>& plain) {
      SCOPED_TRACE(module);
      EXPECT_TRUE(ref::all_near(TensorView<const S, 3>(got.first.view()), got.second.view(), tol));
      EXPECT_GT(max_diff<double>(got.second.view(), plain.view()), 1e-3);
    };
    check("SelfAttention", m.self_like(m.self(), false),
          m.self_like(m.self(), false, false).second);
    check("CausalAttention", m.self_like(m.causal(), true),
          m.self_like(m.causal(), true, false).second);
    check("CrossAttention", m.run_cross(), m.run_cross(false).second);
    check("MultiHeadAttentionWrapper", m.run_wrapper(), m.run_wrapper(false).second);
  }
}

/// The backward of `m`'s training forward on x (self-attention) or (x_q, x_kv) against
/// central differences of sum(grad_out * m(inputs)) in double: every parameter (sinks
/// included) and every input element. fd::check's step and tolerance (see
/// finite_difference.hpp): the modules' double forward is smooth in each of them.
template <class M>
void check_backward(M& m, Tensor<double, 3>& x, Tensor<double, 3>* xkv = nullptr) {
  constexpr bool cross = std::is_same_v<M, attn::CrossAttention<double>>;
  const auto forward = [&] {
    if constexpr (cross) {
      return m.forward(x.view(), xkv->view());
    } else {
      return m.forward(x.view());
    }
  };
  const Tensor<double, 3> y = forward();
  const auto grad_out = attn::test::random_tensor<double>(y.shape(), 61);
  attn::SavedForward<double> saved;
  attn::Workspace ws;
  Tensor<double, 3> out(y.shape()), grad_x(x.shape());
  Tensor<double, 3> grad_kv(xkv != nullptr ? xkv->shape() : Shape<3>{0, 0, 0});
  attn::Gradients<double> grads(m.named_parameters());
  if constexpr (cross) {
    m.forward(x.view(), xkv->view(), out.view(), saved, ws);
    m.backward(grad_out.view(), saved, grad_x.view(), grad_kv.view(), grads, ws);
  } else {
    m.forward(x.view(), out.view(), saved, ws);
    m.backward(grad_out.view(), saved, grad_x.view(), grads, ws);
  }
  std::vector<attn::test::fd::Variable> variables, sinks;
  for (const auto& p : m.named_parameters()) {
    const bool sink = p.name().find("sinks") != std::string::npos;
    (sink ? sinks : variables)
        .push_back(attn::test::fd::variable(p.name(), p.matrix(), grads.at(p.name()).matrix()));
  }
  variables.push_back(attn::test::fd::variable("x", x.view(), grad_x.view()));
  if (xkv != nullptr)
    variables.push_back(attn::test::fd::variable("x_kv", xkv->view(), grad_kv.view()));
  const auto loss = [&] { return attn::test::fd::weighted_sum(forward().view(), grad_out.view()); };
  // Every 4th weight and input element (a wrong term moves them all), every sink.
  attn::test::fd::Options every_fourth;
  every_fourth.stride = 4;
  EXPECT_TRUE(attn::test::fd::check(loss, variables, every_fourth));
  if (!sinks.empty()) {
    EXPECT_TRUE(attn::test::fd::check(loss, sinks));
  }
}

// One test per module (each well under a second): every case of kModuleCases.
TEST(OtherModuleVariantsBackward, SelfAttentionMatchesFiniteDifferences) {
  for (const ModuleCase& c : kModuleCases) {
    SCOPED_TRACE(c.name);
    Modules<double> m{c};
    auto self = m.self();
    if (c.sinks) set_sinks(self.sinks());
    check_backward(self, m.x);
  }
}

TEST(OtherModuleVariantsBackward, CausalAttentionMatchesFiniteDifferences) {
  for (const ModuleCase& c : kModuleCases) {
    SCOPED_TRACE(c.name);
    Modules<double> m{c};
    auto causal = m.causal();
    if (c.sinks) set_sinks(causal.sinks());
    check_backward(causal, m.x);
  }
}

TEST(OtherModuleVariantsBackward, CrossAttentionMatchesFiniteDifferences) {
  for (const ModuleCase& c : kModuleCases) {
    SCOPED_TRACE(c.name);
    Modules<double> m{c};
    auto cross = m.cross();
    if (c.sinks) set_sinks(cross.module().sinks());
    check_backward(cross, m.xq, &m.xkv);
  }
}

TEST(OtherModuleVariantsBackward, WrapperMatchesFiniteDifferences) {
  for (const ModuleCase& c : kModuleCases) {
    SCOPED_TRACE(c.name);
    Modules<double> m{c};
    auto wrapper = m.wrapper();
    for (Index h = 0; c.sinks && h < 3; ++h) set_sinks(wrapper.head(h).sinks(), h);
    check_backward(wrapper, m.x);
    if (c.sinks) {  // each head its own parameter, named under its head
      EXPECT_NE(attn::Gradients<double>(wrapper.named_parameters()).find("heads.2.sinks"), nullptr);
    }
  }
}

// The options are checked as MultiHeadAttention's, naming the module.
TEST(OtherModuleVariantsOptions, BadVariantsThrowNamingTheModule) {
  attn::AttentionVariants bad;
  bad.softcap = -2.0;
  EXPECT_THAT(
      attn::test::thrown<ConfigError>([&] { attn::SelfAttention<float> m(4, 4, false, bad); }),
      AllOf(HasSubstr("SelfAttention"), HasSubstr("softcap=-2 must be 0 (off)")));
  EXPECT_THAT(attn::test::thrown<ConfigError>(
                  [&] { attn::CrossAttention<float> m(4, 4, 4, 2, false, 0.0, bad); }),
              HasSubstr("softcap=-2"));
  attn::AttentionVariants slopes;
  slopes.alibi_slopes = {0.5, 0.25};
  EXPECT_THAT(attn::test::thrown<ConfigError>([&] {
                attn::MultiHeadAttentionWrapper<float> m(4, 2, 8, 0.0, 3, false, slopes);
              }),
              HasSubstr("alibi_slopes has 2 values, expected one per head: num_heads=3"));
  EXPECT_THAT(attn::test::thrown<ConfigError>(
                  [&] { attn::CausalAttention<float> m(4, 4, 8, 0.0, false, slopes); }),
              HasSubstr("CausalAttention"));
}

}  // namespace
}  // namespace module_variants_test

#include "support/bodies_end.hpp"
