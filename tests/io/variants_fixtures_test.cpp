// SPDX-License-Identifier: MIT
// tests/io/variants_fixtures_test.cpp: learned sinks and ALiBi against PyTorch references
// written from the models' own code (tests/fixtures/variants/, by
// scripts/variants_reference.py): gpt-oss's sdpa() with sinks (grouped-query heads, with and
// without a sliding window) and BLOOM's build_alibi_tensor() with BloomAttention (6 heads),
// forward and backward (dq, dk, dv, dsinks) in double on both paths, and forward in float on
// every kernel set.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"
#include "support/test_support.hpp"

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

}  // namespace
}  // namespace variants_fixtures_test
