// SPDX-License-Identifier: MIT
// tests/io/variants_fixtures_test.cpp: learned sinks and ALiBi against PyTorch references
// written from the models' own code (tests/fixtures/variants/, by
// scripts/variants_reference.py): gpt-oss's sdpa() with sinks (grouped-query heads, with and
// without a sliding window) and BLOOM's build_alibi_tensor() with BloomAttention (6 heads),
// forward and backward (dq, dk, dv, dsinks) in double on both paths, and forward in float on
// every kernel set. Then whole modules (MultiHeadAttention with MultiHeadAttentionOptions'
// variants), built from the fixtures' state_dicts: gpt-oss's attention (learned sinks,
// grouped-query heads, a window), Gemma 2's softcap (grouped-query heads, head_dim set) and
// BLOOM's ALiBi (6 heads), DeepSeek-V3's value heads of their own size (value_head_dim, read
// from v_proj's rows), forward and every gradient (the input's and each parameter's, sinks
// included); and a state_dict round trip of a module with sinks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "io/file_test_support.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace variants_fixtures_test {
namespace {

using attn::AttentionMask;
using attn::AttentionOptions;
using attn::AttentionPath;
using attn::Index;
using attn::Tensor;
using attn::TensorView;
using attn::io::SafetensorsFile;

const std::string kDir = std::string(ATTN_IO_FIXTURES_DIR) + "/../variants";
const AttentionPath kPaths[] = {AttentionPath::kMaterialized, AttentionPath::kStreaming};

/// One fixture's tensors as attn's (B, H, T, d) views, and the call's mask and options.
template <class Scalar>
struct Case {
  SafetensorsFile file;
  std::vector<Scalar> q, k, v, out, grad_out, grad_q, grad_k, grad_v, sinks, grad_sinks, slopes;
  Index b = 1, h = 0, hkv = 0, t = 0, d = 0;
  attn::Shape<4> q_strides{}, k_strides{};
  AttentionMask<Scalar> mask;
  AttentionOptions options;
  Tensor<Scalar, 1> sink_tensor, slope_tensor;

  explicit Case(const std::string& name) : file(SafetensorsFile::open(kDir + "/" + name)) {
    for (auto [vec, key] : {std::pair{&q, "q"},
                            {&k, "k"},
                            {&v, "v"},
                            {&out, "out"},
                            {&grad_out, "grad_out"},
                            {&grad_q, "grad_q"},
                            {&grad_k, "grad_k"},
                            {&grad_v, "grad_v"}}) {
      *vec = file.values<Scalar>(key);
    }
    const auto& meta = file.metadata();
    options.scale = std::stod(meta.at("scale"));
    if (file.contains("sinks")) {  // gpt-oss: q (T, H_kv, q_mult, d), k and v (T, H_kv, d)
      const std::vector<Index>& s = file.shape("q");
      t = s[0], hkv = s[1], h = s[1] * s[2], d = s[3];
      q_strides = {t * h * d, d, h * d, 1};
      k_strides = {t * hkv * d, d, hkv * d, 1};
      sinks = file.values<Scalar>("sinks");
      grad_sinks = file.values<Scalar>("grad_sinks");
      sink_tensor = Tensor<Scalar, 1>(attn::Shape<1>{h});
      std::copy(sinks.begin(), sinks.end(), sink_tensor.data());
      options.sinks = sink_tensor.view();
      mask.causal();
      const Index window = std::stol(meta.at("sliding_window"));
      if (window > 0) mask.sliding_window(window);
    } else {  // BLOOM: q, k, v (B, H, T, d)
      const std::vector<Index>& s = file.shape("q");
      b = s[0], h = hkv = s[1], t = s[2], d = s[3];
      q_strides = k_strides = {h * t * d, t * d, d, 1};
      slopes = file.values<Scalar>("slopes");
      options.alibi_max_bias = 8.0;  // the standard slopes, checked against the file's below
      mask.causal();
    }
  }
  TensorView<const Scalar, 4> view(const std::vector<Scalar>& x, bool query_like) const {
    return {x.data(), {b, query_like ? h : hkv, t, d}, query_like ? q_strides : k_strides};
  }
  TensorView<Scalar, 4> out_view(std::vector<Scalar>& x, bool query_like) const {
    return {x.data(), {b, query_like ? h : hkv, t, d}, query_like ? q_strides : k_strides};
  }
};

template <class Scalar>
double max_diff(const std::vector<Scalar>& a, const std::vector<Scalar>& b) {
  double worst = a.size() == b.size() ? 0.0 : HUGE_VAL;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return worst;
}

const char* const kFixtures[] = {"gpt_oss_sinks.safetensors", "gpt_oss_sinks_window.safetensors",
                                 "bloom_alibi.safetensors"};

TEST(VariantsFixtures, BloomSlopesAreTheStandardSeries) {
  const Case<double> c("bloom_alibi.safetensors");
  const std::vector<double> slopes = attn::alibi_slopes(c.h);
  ASSERT_EQ(slopes.size(), c.slopes.size());
  for (std::size_t i = 0; i < slopes.size(); ++i) EXPECT_DOUBLE_EQ(slopes[i], c.slopes[i]) << i;
}

TEST(VariantsFixtures, ForwardAndBackwardMatchPyTorchInDouble) {
  for (const char* name : kFixtures) {
    for (const AttentionPath path : kPaths) {
      SCOPED_TRACE(std::string(name) +
                   (path == AttentionPath::kMaterialized ? " materialised" : " streaming"));
      Case<double> c(name);
      c.options.path = path;
      std::vector<double> out(c.out.size()), lse(static_cast<std::size_t>(c.b * c.h * c.t));
      const TensorView<double, 3> lse_view(lse.data(), {c.b, c.h, c.t});
      attn::Workspace ws;
      attn::scaled_dot_product_attention<double>(c.view(c.q, true), c.view(c.k, false),
                                                 c.view(c.v, false), c.out_view(out, true),
                                                 lse_view, ws, c.mask, c.options);
      EXPECT_LE(max_diff(out, c.out), 1e-13);
      std::vector<double> gq(c.q.size()), gk(c.k.size()), gv(c.v.size()), gs(c.sinks.size());
      attn::scaled_dot_product_attention_backward<double>(
          c.view(c.q, true), c.view(c.k, false), c.view(c.v, false), c.view(out, true),
          c.view(c.grad_out, true), lse_view, c.out_view(gq, true), c.out_view(gk, false),
          c.out_view(gv, false),
          c.sinks.empty() ? TensorView<double, 1>() : TensorView<double, 1>(gs.data(), {c.h}), ws,
          c.mask, c.options);
      EXPECT_LE(max_diff(gq, c.grad_q), 1e-12);
      EXPECT_LE(max_diff(gk, c.grad_k), 1e-12);
      EXPECT_LE(max_diff(gv, c.grad_v), 1e-12);
      if (!c.sinks.empty()) {
        EXPECT_LE(max_diff(gs, c.grad_sinks), 1e-12);
      }
    }
  }
}

TEST(VariantsFixtures, ForwardMatchesPyTorchInFloatOnEverySet) {
  for (const char* name : kFixtures) {
    Case<float> c(name);
    for (const attn::Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      for (const AttentionPath path : kPaths) {
        c.options.path = path;
        std::vector<float> out(c.out.size());
        attn::scaled_dot_product_attention<float>(c.view(c.q, true), c.view(c.k, false),
                                                  c.view(c.v, false), c.out_view(out, true), c.mask,
                                                  c.options);
        EXPECT_LE(max_diff(out, c.out), 2e-6) << name << " " << attn::isa_name(isa);
      }
    }
  }
  attn::set_isa(attn::best_isa());
}

// ---- modules ----

/// A module fixture: the MultiHeadAttention its state_dict ("module.*", Hugging Face's names)
/// and metadata describe, its input x, and PyTorch's output and gradients.
template <class Scalar>
struct ModuleCase {
  SafetensorsFile file;
  attn::MultiHeadAttention<Scalar> module;
  Tensor<Scalar, 3> x, grad_out;

  explicit ModuleCase(const std::string& name)
      : file(SafetensorsFile::open(kDir + "/" + name)), module(options(file)) {
    attn::io::load_state_dict(module, file, "module.");
    module.eval();
    x = file.get<Scalar, 3>("x");
    grad_out = file.get<Scalar, 3>("grad_out");
  }
  static attn::MultiHeadAttentionOptions options(const SafetensorsFile& f) {
    const auto& meta = f.metadata();
    // Sizes, biases and sinks from the tensors; the rest from the metadata.
    attn::MultiHeadAttentionOptions o =
        attn::io::options_from_state_dict(f, std::stol(meta.at("num_heads")), "module.");
    o.causal = meta.at("causal") == "1";
    o.sliding_window = std::stol(meta.at("sliding_window"));
    o.softcap = std::stod(meta.at("softcap"));
    o.alibi_max_bias = std::stod(meta.at("alibi_max_bias"));
    return o;
  }
};

template <class Scalar>
std::vector<Scalar> flat(TensorView<const Scalar, 2> m) {
  std::vector<Scalar> v;
  for (Index i = 0; i < m.extent(0); ++i) {
    for (Index j = 0; j < m.extent(1); ++j) v.push_back(m(i, j));
  }
  return v;
}

const char* const kModuleFixtures[] = {
    "gpt_oss_module.safetensors", "gemma2_softcap_module.safetensors",
    "bloom_alibi_module.safetensors", "deepseek_value_heads_module.safetensors"};

TEST(VariantsFixtures, ModulesAreBuiltWithTheirVariants) {
  const ModuleCase<double> gpt("gpt_oss_module.safetensors");
  EXPECT_EQ(gpt.module.num_kv_heads(), 2);
  ASSERT_EQ(gpt.module.sinks().extent(0), 4);  // options_from_state_dict found `sinks`
  EXPECT_EQ(gpt.module.sinks()(3), gpt.file.values<double>("module.sinks")[3]);
  const ModuleCase<double> gemma("gemma2_softcap_module.safetensors");
  EXPECT_EQ(gemma.module.head_dim(), 3);
  EXPECT_EQ(gemma.module.value_head_dim(), 3);
  EXPECT_EQ(gemma.module.sinks().extent(0), 0);
  // options_from_state_dict reads the value heads' size from v_proj.weight.
  const ModuleCase<double> deepseek("deepseek_value_heads_module.safetensors");
  EXPECT_EQ(deepseek.module.head_dim(), 6);
  EXPECT_EQ(deepseek.module.value_head_dim(), 4);
  EXPECT_EQ(deepseek.module.num_kv_heads(), 2);
}

// Tolerances: the double results differ from PyTorch's by rounding alone (measured: at most
// 1.4e-15 over every output and gradient), so 1e-14; a missing or misplaced variant moves
// them by 1e-2 or more. Float: the projections and kernel in float, bounded by about
// (D + hd + T + D) eps ~ 5e-6 (tests/attention/module_test_support.hpp's module_tolerance);
// measured at most 1.1e-7 on every kernel set.
constexpr double kDoubleTol = 1e-14, kFloatTol = 5e-6;
TEST(VariantsFixtures, ModulesMatchPyTorchForwardAndEveryGradientInDouble) {
  for (const char* name : kModuleFixtures) {
    SCOPED_TRACE(name);
    ModuleCase<double> c(name);
    const std::vector<double> expected = c.file.values<double>("out");
    const Tensor<double, 3> out = c.module.forward(c.x.view());
    EXPECT_LE(max_diff(std::vector<double>(out.data(), out.data() + out.size()), expected),
              kDoubleTol);
    // The training forward and backward (the materialised path too, through weights).
    attn::SavedForward<double> saved;
    attn::Workspace ws;
    Tensor<double, 3> train_out(c.x.shape());
    c.module.forward(c.x.view(), train_out.view(), saved, ws);
    EXPECT_LE(max_diff(std::vector<double>(train_out.data(), train_out.data() + train_out.size()),
                       expected),
              kDoubleTol);
    attn::Gradients<double> grads(c.module.named_parameters(attn::ParameterNames::kLlama));
    Tensor<double, 3> grad_x(c.x.shape());
    c.module.backward(c.grad_out.view(), saved, grad_x.view(), grads, ws);
    EXPECT_LE(max_diff(std::vector<double>(grad_x.data(), grad_x.data() + grad_x.size()),
                       c.file.values<double>("grad.x")),
              kDoubleTol);
    std::size_t checked = 0;
    for (const auto& g : grads) {
      SCOPED_TRACE(g.name());
      EXPECT_LE(max_diff(flat<double>(g.matrix()), c.file.values<double>("grad." + g.name())),
                kDoubleTol);
      ++checked;
    }
    // Every parameter of the file has its gradient compared (sinks included).
    std::size_t params = 0;
    for (const std::string& n : c.file.names()) params += n.rfind("module.", 0) == 0;
    EXPECT_EQ(checked, params);
  }
}

TEST(VariantsFixtures, ModulesMatchPyTorchInFloatOnEverySet) {
  for (const char* name : kModuleFixtures) {
    const ModuleCase<float> c(name);
    const std::vector<float> expected = c.file.values<float>("out");
    for (const attn::Isa isa : attn::test::runnable_sets()) {
      attn::set_isa(isa);
      const Tensor<float, 3> out = c.module.forward(c.x.view());
      EXPECT_LE(max_diff(std::vector<float>(out.data(), out.data() + out.size()), expected),
                kFloatTol)
          << name << " " << attn::isa_name(isa);
    }
  }
  attn::set_isa(attn::best_isa());
}

TEST(VariantsFixtures, SinksRoundTripThroughAStateDict) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 12;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.qkv_bias = true;
  o.causal = true;
  o.sinks = true;
  attn::TorchGenerator gen(5);
  attn::MultiHeadAttention<float> m(o, gen);
  for (Index h = 0; h < 4; ++h) m.sinks()(h) = 0.25f * static_cast<float>(h) - 0.4f;
  attn::test::TempDir dir;
  for (const attn::ParameterNames names :
       {attn::ParameterNames::kDefault, attn::ParameterNames::kLlama}) {
    const std::string path = dir.file("gqa_sinks.safetensors");
    attn::io::save_state_dict(m, path, names);
    const SafetensorsFile file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.contains("sinks"));
    attn::MultiHeadAttentionOptions loaded_options = o;
    loaded_options.init = attn::InitScheme::kNone;
    attn::MultiHeadAttention<float> loaded(loaded_options);
    attn::io::load_state_dict(loaded, file);
    for (Index h = 0; h < 4; ++h) EXPECT_EQ(loaded.sinks()(h), m.sinks()(h)) << h;
    const auto x = attn::test::random_tensor<float>(attn::Shape<3>{2, 7, 12}, 3);
    const Tensor<float, 3> a = m.forward(x.view()), b = loaded.forward(x.view());
    EXPECT_TRUE(std::equal(a.data(), a.data() + a.size(), b.data()));
  }
  // A module with sinks refuses a file without them (strict), naming the tensor.
  attn::MultiHeadAttentionOptions plain = o;
  plain.sinks = false;
  attn::MultiHeadAttention<float> without(plain, gen);
  const std::string path = dir.file("no_sinks.safetensors");
  attn::io::save_state_dict(without, path);
  EXPECT_THAT(
      attn::test::thrown<attn::io::StateDictError>([&] { attn::io::load_state_dict(m, path); }),
      ::testing::HasSubstr("'sinks'"));
  // And options_from_state_dict checks the sinks' length against num_heads.
  attn::io::save_state_dict(m, dir.file("sinks.safetensors"));
  EXPECT_THAT(attn::test::thrown<attn::io::StateDictError>([&] {
                attn::io::options_from_state_dict(
                    SafetensorsFile::open(dir.file("sinks.safetensors")), 2);
              }),
              ::testing::HasSubstr("tensor 'sinks' has shape [4], expected [2] (one per head"));
}

}  // namespace
}  // namespace variants_fixtures_test

#include "support/bodies_end.hpp"
