// SPDX-License-Identifier: MIT
// tests/io/mixed_precision_test.cpp: optim::MixedPrecision<AdamW<float>> on a bfloat16
// MultiHeadAttention against PyTorch 1.13's hand-written mixed-precision loop (float32 masters,
// torch.optim.AdamW over them, the bfloat16 weights copied from the masters after each step;
// tests/fixtures/io/bf16_adamw/, scripts/bf16_training_reference.py), bit for bit; and its
// checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace mixed_precision_test {

namespace {

using attn::bfloat16;
using attn::Index;
using attn::io::SafetensorsFile;

const std::string kFile = std::string(ATTN_IO_FIXTURES_DIR) + "/bf16_adamw/adamw.safetensors";

// Writes the file's values of `tensor` (row-major, its shape) into `view` (the shape of a
// parameter's matrix: (1, n) for a vector), rounding to Element (exact for BF16 values).
template <class Element>
void fill(const SafetensorsFile& file, const std::string& tensor,
          attn::TensorView<Element, 2> view) {
  const std::vector<float> v = file.values<float>(tensor);
  ASSERT_EQ(static_cast<Index>(v.size()), view.size()) << tensor;
  for (Index r = 0; r < view.extent(0); ++r) {
    for (Index c = 0; c < view.extent(1); ++c) {
      view(r, c) = Element(v[static_cast<std::size_t>(r * view.extent(1) + c)]);
    }
  }
}

// The same bits: every element equal as floats, signs of zeros included.
template <class Element>
void expect_bits(const SafetensorsFile& file, const std::string& tensor,
                 attn::TensorView<const Element, 2> view) {
  const std::vector<float> v = file.values<float>(tensor);
  ASSERT_EQ(static_cast<Index>(v.size()), view.size()) << tensor;
  for (Index r = 0; r < view.extent(0); ++r) {
    for (Index c = 0; c < view.extent(1); ++c) {
      const float want = v[static_cast<std::size_t>(r * view.extent(1) + c)];
      const auto got = static_cast<float>(view(r, c));
      ASSERT_TRUE(got == want && std::signbit(got) == std::signbit(want))
          << tensor << " (" << r << ", " << c << "): " << got << ", PyTorch " << want;
    }
  }
}

// Three steps from PyTorch's own bfloat16 gradients (so that each step starts from the same
// weights in both): the float masters after each step equal torch.optim.AdamW's float32
// masters bit for bit (AdamW<float> replays PyTorch's update, docs/training.md), and the
// module's bfloat16 weights equal PyTorch's param.copy_(master) bit for bit (both round to
// nearest even). The updates (about lr = 1e-3) are near a weight's bfloat16 ulp (weights of
// ~0.1: 2^-11 to 2^-10), so a wrapper that stepped the bfloat16 weights themselves, or lost
// the masters' low bits between steps, would differ from the first step on; afterwards most
// masters still differ from their rounded weights.
TEST(MixedPrecision, AdamWOverFloatMastersMatchesPyTorch) {
  const SafetensorsFile file = SafetensorsFile::open(kFile);
  const auto& meta = file.metadata();
  const int steps = std::stoi(meta.at("steps"));
  ASSERT_EQ(meta.at("num_heads"), "4");
  attn::MultiHeadAttention<bfloat16> mha(attn::MultiHeadAttentionOptions::pytorch(32, 4));
  const attn::ParameterList<bfloat16> params =
      mha.named_parameters(attn::ParameterNames::kMultiheadAttention);
  for (const auto& p : params) fill(file, "weight." + p.name(), p.matrix());

  attn::optim::AdamWOptions options;
  options.lr = std::stod(meta.at("lr"));
  options.weight_decay = std::stod(meta.at("weight_decay"));
  attn::optim::MixedPrecision<attn::optim::AdamW<float>> adamw(params, options);
  attn::Gradients<bfloat16> grads(params);
  Index moved_master = 0, moved_weight = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::string prefix = "step" + std::to_string(step) + ".";
    for (const auto& g : grads) fill(file, prefix + "grad." + g.name(), g.matrix());
    adamw.step(grads);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name();
      expect_bits<float>(file, prefix + "master." + name, adamw.master_parameters()[i].matrix());
      expect_bits<bfloat16>(file, prefix + "weight." + name, params[i].matrix());
    }
  }
  // The masters hold what the weights cannot: most differ from their rounded weight.
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto m = adamw.master_parameters()[i].matrix();
    const auto w = params[i].matrix();
    for (Index r = 0; r < m.extent(0); ++r) {
      for (Index c = 0; c < m.extent(1); ++c) {
        moved_master += m(r, c) != static_cast<float>(w(r, c)) ? 1 : 0;
        moved_weight += 1;
      }
    }
  }
  EXPECT_GT(moved_master, moved_weight / 2);
  EXPECT_EQ(adamw.optimizer().steps(), steps);
}

// The wrapper's checks: gradients of another module are refused before anything changes; so
// is a step after the module is gone; reload_masters() widens the module's weights again.
TEST(MixedPrecision, ChecksAndReload) {
  auto mha = std::make_unique<attn::MultiHeadAttention<bfloat16>>(
      attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::optim::MixedPrecision<attn::optim::SGD<float>> sgd(mha->named_parameters(),
                                                           attn::optim::SGDOptions{0.1});
  attn::MultiHeadAttention<bfloat16> other(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::Gradients<bfloat16> foreign(other.named_parameters());
  const float before = mha->out_proj().weight()(1, 2);
  EXPECT_THROW(sgd.step(foreign), attn::ConfigError);
  EXPECT_EQ(static_cast<float>(mha->out_proj().weight()(1, 2)), before);

  attn::Gradients<bfloat16> grads(mha->named_parameters());
  grads.at("out_proj.weight").matrix()(1, 2) = bfloat16(1.0f);
  sgd.step(grads);  // w - 0.1 * 1, in the float master, then rounded
  const float master = sgd.master_parameters()[2].matrix()(1, 2);
  EXPECT_EQ(master, before - 0.1f);
  EXPECT_EQ(mha->out_proj().weight()(1, 2).bits(), bfloat16(master).bits());

  mha->out_proj().weight()(1, 2) = bfloat16(0.5f);
  sgd.reload_masters();
  EXPECT_EQ(sgd.master_parameters()[2].matrix()(1, 2), 0.5f);
  mha.reset();
  EXPECT_THROW(sgd.step(grads), attn::ConfigError);
}

}  // namespace

}  // namespace mixed_precision_test

#include "support/bodies_end.hpp"
