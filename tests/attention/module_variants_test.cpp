// SPDX-License-Identifier: MIT
// tests/attention/module_variants_test.cpp: the attention variants of the modules
// (MultiHeadAttentionOptions::softcap, alibi_max_bias / alibi_slopes, sinks), through the one
// core every module runs: the options' checks and messages; the incremental forward through a
// KVCache (prefill, chunks, single tokens, a sliding-window ring) equal to the whole-sequence
// forward, ALiBi at the cache's absolute positions; the training forward and backward against
// central finite differences (every gradient, the sinks' included); the sinks as a parameter
// like any other (names, Gradients, AdamW, freezing); the materialised path. PyTorch
// references of whole modules: tests/io/variants_fixtures_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention/module_test_support.hpp"
#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"

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
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
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

MultiHeadAttentionOptions options(const Variant& v, Index max_positions) {
  MultiHeadAttentionOptions o;
  o.d_in = v.d;
  o.num_heads = v.heads;
  o.num_kv_heads = v.kv_heads;
  o.head_dim = v.head_dim;
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
MultiHeadAttention<Scalar> make_module(const Variant& v, Index max_positions = 64) {
  attn::TorchGenerator gen(11);
  MultiHeadAttention<Scalar> m(options(v, max_positions), gen);
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
  for (const bool given_slopes : {false, true}) {
    SCOPED_TRACE(given_slopes ? "given slopes" : "standard slopes");
    Variant v{"all+window", 12, 4, 2, 4, 4, true, 1.5, 6.0, {}, true};
    if (given_slopes) v.alibi_max_bias = 0.0, v.slopes = {0.7, 0.05, 0.3, 1.1};
    MultiHeadAttention<double> m = make_module<double>(v);
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
  EXPECT_THAT(
      [&] {
        b.backward(TensorView<const float, 3>(out.view()), saved, TensorView<float, 3>(), grads,
                   ws);
      },
      ThrowsMessage<attn::ShapeError>(AllOf(HasSubstr("softcap=2"), HasSubstr("softcap=3"))));
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
    EXPECT_THAT(build(edit), ThrowsMessage<ConfigError>(
                                 AllOf(HasSubstr("MultiHeadAttention"), HasSubstr(message))));
  }
}

}  // namespace
}  // namespace module_variants_test
