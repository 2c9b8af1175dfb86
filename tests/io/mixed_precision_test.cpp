// SPDX-License-Identifier: MIT
// tests/io/mixed_precision_test.cpp: optim::MixedPrecision<AdamW<float>> on a bfloat16
// MultiHeadAttention against PyTorch 1.13's hand-written mixed-precision loop (float32 masters,
// torch.optim.AdamW over them, the bfloat16 weights copied from the masters after each step;
// tests/fixtures/io/bf16_adamw/, scripts/bf16_training_reference.py), bit for bit; and its
// checks. On a float16 module, against AdamW<float> run on float copies; and its dynamic loss
// scaling (GradScaler's rules: unscaling, skipped steps, backoff, growth, the options' checks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "attn/io/io.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace mixed_precision_test {

namespace {

using attn::bfloat16;
using attn::float16;
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

// How many of `mp`'s masters differ from the 16-bit weight rounded from them, of how many.
template <class MixedPrecision>
std::pair<Index, Index> masters_off_their_weights(const MixedPrecision& mp) {
  Index differ = 0, total = 0;
  const auto& params = mp.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto m = mp.master_parameters()[i].matrix();
    const auto w = params[i].matrix();
    for (Index r = 0; r < m.extent(0); ++r) {
      for (Index c = 0; c < m.extent(1); ++c) {
        differ += m(r, c) != static_cast<float>(w(r, c)) ? 1 : 0;
        total += 1;
      }
    }
  }
  return {differ, total};
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
  const auto [moved_master, moved_weight] = masters_off_their_weights(adamw);
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

// ---- float16 modules and loss scaling ----

// Deterministic values k * 2^exponent, k an integer in [-max_k, max_k], rounded to Element (and
// exact in it while max_k fits its mantissa).
template <class Element>
void fill_integers(attn::TensorView<Element, 2> view, std::uint32_t seed, int max_k, int exponent) {
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (Index r = 0; r < view.extent(0); ++r) {
    for (Index c = 0; c < view.extent(1); ++c) {
      x = x * 1664525u + 1013904223u;
      const int k = static_cast<int>((x >> 8) % static_cast<std::uint32_t>(2 * max_k + 1)) - max_k;
      view(r, c) = Element(std::ldexp(static_cast<float>(k), exponent));
    }
  }
}

// Every parameter of a module filled with k * 2^-10, |k| <= 512 (weights in [-0.5, 0.5]).
template <class Element>
void fill_weights(const attn::ParameterList<Element>& params, std::uint32_t seed) {
  std::uint32_t i = 0;
  for (const auto& p : params) fill_integers(p.matrix(), seed + 7 * i++, 512, -10);
}

std::uint32_t bits_of(float x) {
  std::uint32_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The bits of every element of a list of float parameters or gradients, in order.
template <class List>
std::vector<std::uint32_t> float_bits(const List& list) {
  std::vector<std::uint32_t> out;
  for (const auto& p : list) {
    const auto m = p.matrix();
    for (Index r = 0; r < m.extent(0); ++r) {
      for (Index c = 0; c < m.extent(1); ++c) out.push_back(bits_of(m(r, c)));
    }
  }
  return out;
}

// The bits of every 16-bit weight, in order.
template <class Element>
std::vector<std::uint16_t> weight_bits(const attn::ParameterList<Element>& params) {
  std::vector<std::uint16_t> out;
  for (const auto& p : params) {
    const auto m = p.matrix();
    for (Index r = 0; r < m.extent(0); ++r) {
      for (Index c = 0; c < m.extent(1); ++c) out.push_back(m(r, c).bits());
    }
  }
  return out;
}

// Every weight is its master rounded to Element (to nearest even, as param.copy_(master)).
template <class Optimizer, class Element>
void expect_weights_rounded_from_masters(
    const attn::optim::MixedPrecision<Optimizer, Element>& mp) {
  const auto& params = mp.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto w = params[i].matrix();
    const auto m = mp.master_parameters()[i].matrix();
    for (Index r = 0; r < w.extent(0); ++r) {
      for (Index c = 0; c < w.extent(1); ++c) {
        ASSERT_EQ(w(r, c).bits(), Element(m(r, c)).bits())
            << params[i].name() << " (" << r << ", " << c << "): master " << m(r, c);
      }
    }
  }
}

// Writes `grads` times `scale` into `scaled` (exact for the fill_integers() gradients here:
// checked).
template <class Element>
void scale_gradients(const attn::Gradients<Element>& grads, float scale,
                     const attn::Gradients<Element>& scaled) {
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const auto g = grads[i].matrix();
    const auto s = scaled[i].matrix();
    for (Index r = 0; r < g.extent(0); ++r) {
      for (Index c = 0; c < g.extent(1); ++c) {
        const float want = static_cast<float>(g(r, c)) * scale;
        s(r, c) = Element(want);
        ASSERT_EQ(static_cast<float>(s(r, c)), want) << "g * S is not exact in the 16-bit type";
      }
    }
  }
}

attn::optim::AdamWOptions adamw_options() {
  attn::optim::AdamWOptions options;
  options.lr = 1e-3;
  options.weight_decay = 1e-2;
  return options;
}

// A float16 module's MixedPrecision without loss scaling is AdamW<float> on float copies of
// the masters with the widened gradients, bit for bit, over three steps; its weights are the
// masters rounded to float16. The gradients are spread over float16's normal range (down to
// 2^-14) and its subnormals, so that a widening that lost bits would show.
TEST(MixedPrecision, Float16StepIsAdamWOnTheWidenedGradients) {
  attn::MultiHeadAttention<float16> mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  const attn::ParameterList<float16> params = mha.named_parameters();
  fill_weights(params, 1);
  std::vector<attn::Tensor<float, 2>> copies;
  copies.reserve(params.size());
  attn::ParameterList<float> ref_params;
  for (const auto& p : params) {
    copies.push_back(attn::convert<float>(p.matrix()));
    ref_params.add(p.name(), copies.back().view());
  }
  attn::optim::MixedPrecision<attn::optim::AdamW<float>, float16> mp(params, adamw_options());
  attn::optim::AdamW<float> ref(ref_params, adamw_options());
  EXPECT_FALSE(mp.loss_scaling().enabled);
  EXPECT_EQ(mp.loss_scale(), 1.0f);
  const std::vector<std::uint16_t> initial = weight_bits(params);
  ASSERT_EQ(float_bits(mp.master_parameters()), float_bits(ref_params));  // widened, exact

  attn::Gradients<float16> grads(params);
  attn::Gradients<float> ref_grads(ref_params);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      fill_integers(grads[i].matrix(), static_cast<std::uint32_t>(100 * step + i), 1000,
                    -14 - static_cast<int>(i % 8));
      attn::convert(grads[i].matrix(), ref_grads[i].matrix());
    }
    EXPECT_TRUE(mp.step(grads));
    ref.step(ref_grads);
    ASSERT_EQ(float_bits(mp.master_gradients()), float_bits(ref_grads));
    ASSERT_EQ(float_bits(mp.master_parameters()), float_bits(ref_params));
    expect_weights_rounded_from_masters(mp);
  }
  EXPECT_EQ(mp.optimizer().steps(), 3);
  EXPECT_NE(weight_bits(params), initial);
  // The masters hold what float16 cannot: most differ from their rounded weight.
  const auto [differ, total] = masters_off_their_weights(mp);
  EXPECT_GT(differ, total / 2);
}

// With loss scaling on, steps from the gradients times S = loss_scale() give the masters of
// an unscaled MixedPrecision stepped with the gradients themselves, bit for bit (S a power of
// two, every g * S exact in Element). Then a gradient of 3 * 2^-26, which float16 cannot hold
// (bfloat16 can), scaled by S arrives in the master gradient exactly.
template <class Element>
void expect_scaled_steps_match(int max_k) {
  attn::MultiHeadAttention<Element> plain_mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::MultiHeadAttention<Element> scaled_mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  const attn::ParameterList<Element> plain_params = plain_mha.named_parameters();
  const attn::ParameterList<Element> scaled_params = scaled_mha.named_parameters();
  fill_weights(plain_params, 2);
  fill_weights(scaled_params, 2);
  attn::optim::MixedPrecision<attn::optim::AdamW<float>, Element> plain(plain_params,
                                                                        adamw_options());
  attn::optim::MixedPrecision<attn::optim::AdamW<float>, Element> scaled(scaled_params,
                                                                         adamw_options());
  scaled.set_loss_scaling({});
  const float S = scaled.loss_scale();
  ASSERT_EQ(S, 65536.0f);
  attn::Gradients<Element> grads(plain_params), scaled_grads(scaled_params);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      fill_integers(grads[i].matrix(), static_cast<std::uint32_t>(10 * step + i), max_k, -20);
    }
    scale_gradients(grads, S, scaled_grads);
    ASSERT_TRUE(plain.step(grads));
    ASSERT_TRUE(scaled.step(scaled_grads));
    ASSERT_EQ(float_bits(scaled.master_gradients()), float_bits(plain.master_gradients()));
    ASSERT_EQ(float_bits(scaled.master_parameters()), float_bits(plain.master_parameters()));
    ASSERT_EQ(weight_bits(scaled_params), weight_bits(plain_params));
    EXPECT_EQ(scaled.loss_scale(), S);
    EXPECT_EQ(scaled.good_steps(), step + 1);
  }
  EXPECT_EQ(scaled.optimizer().steps(), 3);
  EXPECT_EQ(scaled.skipped_steps(), 0);

  const float tiny = 3.0f * std::ldexp(1.0f, -26);
  if constexpr (std::is_same_v<Element, float16>) {
    EXPECT_NE(static_cast<float>(Element(tiny)), tiny);  // below float16's subnormals' bits
  } else {
    EXPECT_EQ(static_cast<float>(Element(tiny)), tiny);  // bfloat16 has float's range
  }
  scaled_grads.zero();
  scaled_grads[0].matrix()(0, 0) = Element(tiny * S);
  ASSERT_TRUE(scaled.step(scaled_grads));
  EXPECT_EQ(scaled.master_gradients()[0].matrix()(0, 0), tiny);
}

TEST(MixedPrecision, Float16ScaledGradientsStepAsUnscaledOnes) {
  expect_scaled_steps_match<float16>(1024);
}

TEST(MixedPrecision, BFloat16ScaledGradientsStepAsUnscaledOnes) {
  // The default Storage is bfloat16: the MixedPrecision<AdamW<float>> of existing code.
  static_assert(std::is_same_v<attn::optim::MixedPrecision<attn::optim::AdamW<float>>,
                               attn::optim::MixedPrecision<attn::optim::AdamW<float>, bfloat16>>);
  expect_scaled_steps_match<bfloat16>(128);
}

// A gradient holding an Inf, or a NaN, skips the step: masters, weights, the optimizer's
// moments and step count unchanged, the scale halved, the good steps back to 0; the next
// finite step steps again at the halved scale.
TEST(MixedPrecision, NonFiniteGradientSkipsTheStep) {
  for (const float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE("gradient " + std::to_string(bad));
    attn::MultiHeadAttention<float16> mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
    const attn::ParameterList<float16> params = mha.named_parameters();
    fill_weights(params, 3);
    attn::optim::MixedPrecision<attn::optim::AdamW<float>, float16> mp(params, adamw_options());
    mp.set_loss_scaling({});
    attn::Gradients<float16> grads(params);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      fill_integers(grads[i].matrix(), static_cast<std::uint32_t>(i), 1000, -4);
    }
    ASSERT_TRUE(mp.step(grads));
    ASSERT_EQ(mp.good_steps(), 1);
    const std::vector<std::uint32_t> masters = float_bits(mp.master_parameters());
    const std::vector<std::uint32_t> exp_avg = float_bits(mp.optimizer().exp_avg());
    const std::vector<std::uint32_t> exp_avg_sq = float_bits(mp.optimizer().exp_avg_sq());
    const std::vector<std::uint16_t> weights = weight_bits(params);

    const auto g = grads.at("out_proj.weight").matrix();
    const float16 kept = g(3, 5);
    g(3, 5) = float16(bad);
    EXPECT_FALSE(mp.step(grads));
    EXPECT_EQ(float_bits(mp.master_parameters()), masters);
    EXPECT_EQ(float_bits(mp.optimizer().exp_avg()), exp_avg);
    EXPECT_EQ(float_bits(mp.optimizer().exp_avg_sq()), exp_avg_sq);
    EXPECT_EQ(weight_bits(params), weights);
    EXPECT_EQ(mp.optimizer().steps(), 1);
    EXPECT_EQ(mp.loss_scale(), 32768.0f);
    EXPECT_EQ(mp.good_steps(), 0);
    EXPECT_EQ(mp.skipped_steps(), 1);

    g(3, 5) = kept;
    EXPECT_TRUE(mp.step(grads));
    EXPECT_EQ(mp.optimizer().steps(), 2);
    EXPECT_NE(float_bits(mp.master_parameters()), masters);
    EXPECT_EQ(mp.loss_scale(), 32768.0f);
    EXPECT_EQ(mp.good_steps(), 1);
  }
}

// Without loss scaling nothing is checked: a step with an Inf in a gradient steps.
TEST(MixedPrecision, WithoutScalingEveryStepSteps) {
  attn::MultiHeadAttention<float16> mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::optim::MixedPrecision<attn::optim::SGD<float>, float16> mp(mha.named_parameters(),
                                                                   attn::optim::SGDOptions{0.1});
  attn::Gradients<float16> grads(mha.named_parameters());
  grads.at("out_proj.weight").matrix()(1, 2) = float16(std::numeric_limits<float>::infinity());
  EXPECT_TRUE(mp.step(grads));
  EXPECT_EQ(mp.optimizer().steps(), 1);
  EXPECT_EQ(mp.loss_scale(), 1.0f);
  EXPECT_EQ(mp.skipped_steps(), 0);
  EXPECT_TRUE(std::isinf(mp.master_parameters()[2].matrix()(1, 2)));
}

// growth_interval good steps in a row multiply the scale by growth_factor; a skipped step
// multiplies it by backoff_factor and starts the count again; the scale does not grow past
// float's range; the state restored with set_loss_scale_state() carries on alike.
TEST(MixedPrecision, ScaleGrowsAfterGrowthIntervalGoodSteps) {
  attn::MultiHeadAttention<float16> mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::optim::MixedPrecision<attn::optim::SGD<float>, float16> mp(mha.named_parameters(),
                                                                   attn::optim::SGDOptions{0.01});
  attn::optim::LossScaling scaling;
  scaling.init_scale = 1024.0f;
  scaling.growth_interval = 3;
  scaling.backoff_factor = 0.25f;
  mp.set_loss_scaling(scaling);
  attn::Gradients<float16> good(mha.named_parameters()), bad(mha.named_parameters());
  for (std::size_t i = 0; i < good.size(); ++i) {
    fill_integers(good[i].matrix(), static_cast<std::uint32_t>(i), 100, -8);
  }
  bad.at("in_proj_weight").matrix()(0, 0) = float16(std::numeric_limits<float>::infinity());

  const auto expect = [&](bool stepped, float scale, int good_steps) {
    EXPECT_TRUE(stepped);
    EXPECT_EQ(mp.loss_scale(), scale);
    EXPECT_EQ(mp.good_steps(), good_steps);
  };
  expect(mp.step(good), 1024.0f, 1);
  expect(mp.step(good), 1024.0f, 2);
  EXPECT_FALSE(mp.step(bad));  // the count starts again
  EXPECT_EQ(mp.loss_scale(), 256.0f);
  EXPECT_EQ(mp.good_steps(), 0);
  expect(mp.step(good), 256.0f, 1);
  expect(mp.step(good), 256.0f, 2);
  expect(mp.step(good), 512.0f, 0);  // the third in a row: x2
  expect(mp.step(good), 512.0f, 1);
  expect(mp.step(good), 512.0f, 2);
  expect(mp.step(good), 1024.0f, 0);
  EXPECT_EQ(mp.optimizer().steps(), 8);
  EXPECT_EQ(mp.skipped_steps(), 1);

  // Restored into another MixedPrecision, the state carries on as in this one.
  attn::MultiHeadAttention<float16> other(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::optim::MixedPrecision<attn::optim::SGD<float>, float16> restored(
      other.named_parameters(), attn::optim::SGDOptions{0.01});
  attn::Gradients<float16> other_good(other.named_parameters());
  expect(mp.step(good), 1024.0f, 1);
  restored.set_loss_scaling(mp.loss_scaling());
  restored.set_loss_scale_state(mp.loss_scale(), mp.good_steps());
  EXPECT_EQ(restored.loss_scaling().growth_interval, 3);
  EXPECT_EQ(restored.loss_scaling().backoff_factor, 0.25f);
  EXPECT_TRUE(restored.step(other_good));
  EXPECT_TRUE(restored.step(other_good));
  EXPECT_EQ(restored.loss_scale(), 2048.0f);
  EXPECT_EQ(restored.good_steps(), 0);

  // Growth stops short of float's range (GradScaler keeps the scale when x2 overflows).
  const float largest = std::ldexp(1.0f, 127);
  mp.set_loss_scale_state(largest, 2);
  expect(mp.step(good), largest, 0);
}

// The options and a restored state are checked, naming the values; nothing changes on a throw.
TEST(MixedPrecision, LossScalingOptionsAreChecked) {
  const attn::optim::LossScaling defaults;  // GradScaler's
  EXPECT_EQ(defaults.init_scale, 65536.0f);
  EXPECT_EQ(defaults.growth_factor, 2.0f);
  EXPECT_EQ(defaults.backoff_factor, 0.5f);
  EXPECT_EQ(defaults.growth_interval, 2000);
  EXPECT_TRUE(defaults.enabled);

  attn::MultiHeadAttention<float16> mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  attn::optim::MixedPrecision<attn::optim::SGD<float>, float16> mp(mha.named_parameters(),
                                                                   attn::optim::SGDOptions{0.1});
  // Off: no state to restore.
  EXPECT_THROW(mp.set_loss_scale_state(1024.0f, 0), attn::ConfigError);

  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<attn::optim::LossScaling> invalid;
  for (const float v : {0.0f, -1.0f, inf, nan}) {
    invalid.push_back(defaults);
    invalid.back().init_scale = v;
  }
  for (const float v : {1.0f, 0.5f, inf, nan}) {
    invalid.push_back(defaults);
    invalid.back().growth_factor = v;
  }
  for (const float v : {0.0f, 1.0f, 1.5f, -0.5f, nan}) {
    invalid.push_back(defaults);
    invalid.back().backoff_factor = v;
  }
  for (const int v : {0, -3}) {
    invalid.push_back(defaults);
    invalid.back().growth_interval = v;
  }
  for (const auto& s : invalid) {
    EXPECT_THROW(mp.set_loss_scaling(s), attn::ConfigError)
        << s.init_scale << " " << s.growth_factor << " " << s.backoff_factor << " "
        << s.growth_interval;
    EXPECT_FALSE(mp.loss_scaling().enabled);
    EXPECT_EQ(mp.loss_scale(), 1.0f);
  }
  try {
    attn::optim::LossScaling s;
    s.growth_interval = 0;
    mp.set_loss_scaling(s);
    ADD_FAILURE() << "growth_interval 0 accepted";
  } catch (const attn::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("growth_interval=0"), std::string::npos) << e.what();
  }
  try {
    attn::optim::LossScaling s;
    s.backoff_factor = 1.5f;
    mp.set_loss_scaling(s);
    ADD_FAILURE() << "backoff_factor 1.5 accepted";
  } catch (const attn::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("backoff_factor=1.5"), std::string::npos) << e.what();
  }

  attn::optim::LossScaling scaling;
  scaling.growth_interval = 10;
  mp.set_loss_scaling(scaling);
  EXPECT_EQ(mp.loss_scale(), 65536.0f);
  for (const float scale : {0.0f, -2.0f, inf, nan}) {
    EXPECT_THROW(mp.set_loss_scale_state(scale, 0), attn::ConfigError) << scale;
  }
  EXPECT_THROW(mp.set_loss_scale_state(1024.0f, -1), attn::ConfigError);
  EXPECT_THROW(mp.set_loss_scale_state(1024.0f, 10), attn::ConfigError);
  EXPECT_EQ(mp.loss_scale(), 65536.0f);
  EXPECT_EQ(mp.good_steps(), 0);
  mp.set_loss_scale_state(1024.0f, 9);
  EXPECT_EQ(mp.loss_scale(), 1024.0f);
  EXPECT_EQ(mp.good_steps(), 9);

  // Turned off again: a scale of 1.
  scaling.enabled = false;
  mp.set_loss_scaling(scaling);
  EXPECT_EQ(mp.loss_scale(), 1.0f);
}

// bfloat16 with loss scaling: an Inf skips the step and halves the scale; and with a scale
// below 1, a finite gradient that overflows float when unscaled skips it too.
TEST(MixedPrecision, BFloat16LossScalingSkipsNonFiniteSteps) {
  attn::MultiHeadAttention<bfloat16> mha(attn::MultiHeadAttentionOptions::pytorch(16, 2));
  const attn::ParameterList<bfloat16> params = mha.named_parameters();
  fill_weights(params, 4);
  attn::optim::MixedPrecision<attn::optim::AdamW<float>> mp(params, adamw_options());
  mp.set_loss_scaling({});
  attn::Gradients<bfloat16> grads(params);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    fill_integers(grads[i].matrix(), static_cast<std::uint32_t>(i), 100, -2);
  }
  ASSERT_TRUE(mp.step(grads));
  const std::vector<std::uint32_t> masters = float_bits(mp.master_parameters());
  const std::vector<std::uint16_t> weights = weight_bits(params);
  const auto g = grads.at("in_proj_bias").matrix();
  const bfloat16 kept = g(0, 7);
  g(0, 7) = bfloat16(-std::numeric_limits<float>::infinity());
  EXPECT_FALSE(mp.step(grads));
  EXPECT_EQ(mp.loss_scale(), 32768.0f);
  EXPECT_EQ(float_bits(mp.master_parameters()), masters);
  EXPECT_EQ(weight_bits(params), weights);
  EXPECT_EQ(mp.optimizer().steps(), 1);

  g(0, 7) = std::numeric_limits<bfloat16>::max();  // finite, and 2x overflows float
  ASSERT_TRUE(std::isfinite(static_cast<float>(g(0, 7))));
  mp.set_loss_scale_state(0.5f, 0);
  EXPECT_FALSE(mp.step(grads));
  EXPECT_EQ(mp.loss_scale(), 0.25f);
  EXPECT_EQ(float_bits(mp.master_parameters()), masters);
  EXPECT_EQ(mp.optimizer().steps(), 1);
  EXPECT_EQ(mp.skipped_steps(), 2);

  g(0, 7) = kept;
  EXPECT_TRUE(mp.step(grads));
  EXPECT_EQ(mp.optimizer().steps(), 2);
}

}  // namespace

}  // namespace mixed_precision_test

#include "support/bodies_end.hpp"
