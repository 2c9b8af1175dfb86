// SPDX-License-Identifier: MIT
// attn/optim/mixed_precision.hpp: MixedPrecision, the training of a bfloat16 or float16 module
// with float master weights: any optimizer (AdamW<float>, SGD<float>) steps the masters, and the
// module's 16-bit weights are rounded from them after each step; and LossScaling, the dynamic
// loss scale of PyTorch's GradScaler that float16 gradients need.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/ops/convert.hpp"
#include "attn/optim/optimizer.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"

ATTN_NAMESPACE_BEGIN
namespace optim {

/// Dynamic loss scaling, the options of PyTorch's torch.cuda.amp.GradScaler and its defaults
/// (MixedPrecision::set_loss_scaling). The loss, and so every gradient, is multiplied by a
/// scale that starts at init_scale; a step whose unscaled gradients hold an Inf or a NaN is
/// skipped and multiplies the scale by backoff_factor; growth_interval steps in a row without
/// one multiply it by growth_factor. A MixedPrecision scales nothing until it is given one.
struct LossScaling {
  float init_scale = 65536.0f;  ///< 2^16; positive and finite
  float growth_factor = 2.0f;   ///< > 1 (and finite)
  float backoff_factor = 0.5f;  ///< in (0, 1)
  int growth_interval = 2000;   ///< >= 1
  /// As GradScaler(enabled=...): false turns the scaling off (a scale of 1, every step steps).
  bool enabled = true;
};

/// Mixed-precision training of a bfloat16 or float16 module, as PyTorch users write it by hand:
/// a float master copy of every parameter, the optimizer (and its state) over the masters, and
/// after each step the module's 16-bit weights rounded from the masters. Per step():
///
///     master.grad = param.grad.float()      each 16-bit gradient widened (exact)
///     optimizer.step()                      Optimizer's own float update of the masters
///     param.copy_(master)                   each master rounded once, to nearest even
///
/// so that updates smaller than half an ulp of a weight still accumulate in its master (an
/// AdamW step of lr = 1e-3 moves a weight of 1 by an eighth of its bfloat16 ulp, 2^-7, and by
/// about one float16 ulp, 2^-10: stepping the 16-bit weights themselves would round it away,
/// or to a whole ulp).
///
/// ```cpp
/// attn::MultiHeadAttention<attn::bfloat16> mha(attn::MultiHeadAttentionOptions::pytorch(64, 4));
/// attn::Gradients<attn::bfloat16> grads(mha.named_parameters());
/// attn::optim::MixedPrecision<attn::optim::AdamW<float>> adamw(mha.named_parameters(), options);
/// ... grads.zero(); mha.backward(...); adamw.step(grads);
/// ```
///
/// A float16 module needs a loss scale besides (set_loss_scaling()): float16's smallest
/// normal number is 6.1e-5, and small gradients underflow to zero or lose their bits, where
/// bfloat16 has float's range. The scaling is PyTorch's GradScaler's, step for step: the user
/// multiplies dL/dy by loss_scale() before the backward, and step() widens each gradient,
/// multiplies it by the float reciprocal of the scale, and checks the unscaled gradients.
/// One holding an Inf or a NaN skips the step (masters, weights and the optimizer's state
/// and step count untouched; step() returns false), and the scale is multiplied by
/// backoff_factor; otherwise the optimizer steps, and after growth_interval such steps in a
/// row the scale is multiplied by growth_factor (unless that overflows float). Scaling is off
/// until set_loss_scaling(): a scale of 1, and every step steps, whatever its gradients.
///
/// ```cpp
/// attn::MultiHeadAttention<attn::float16> mha(attn::MultiHeadAttentionOptions::pytorch(64, 4));
/// attn::Gradients<attn::float16> grads(mha.named_parameters());
/// attn::optim::MixedPrecision<attn::optim::AdamW<float>, attn::float16> adamw(
///     mha.named_parameters(), options);
/// adamw.set_loss_scaling({});  // GradScaler's defaults: 2^16, x2 every 2000 steps, x0.5
/// ... grad_y = dL/dy * adamw.loss_scale(); grads.zero(); mha.backward(...);
/// adamw.step(grads);           // false when skipped: a gradient overflowed
/// ```
///
/// The masters start as the module's weights widened (exact); after loading other weights
/// into the module, reload_masters(). The optimizer is built on the masters with the
/// arguments after the parameters (AdamWOptions, SGDOptions), so its results are its own,
/// bit for bit, on the widened (and unscaled) gradients. step() never allocates. Parameters
/// are views of the module, kept as the optimizers keep theirs: a step checks that they still
/// exist (ConfigError otherwise, nothing changed). Movable (the masters' memory moves with
/// it), not copyable.
///
/// @tparam Optimizer an optimizer over float parameters: AdamW<float> or SGD<float>.
/// @tparam Storage the module's element type: bfloat16 or float16.
template <class Optimizer, class Storage = bfloat16>
class MixedPrecision {
  static_assert(std::is_same_v<Storage, bfloat16> || std::is_same_v<Storage, float16>,
                "attn::optim::MixedPrecision: Storage (the module's element type) must be "
                "attn::bfloat16 or attn::float16");

 public:
  /// Masters widened from `params` (a 16-bit module's non-const named_parameters()), and
  /// Optimizer(masters, args...). Loss scaling is off.
  /// @throws ConfigError for parameters that repeat a name or share memory, or as Optimizer's
  ///         constructor for its options.
  template <class... Args>
  explicit MixedPrecision(ParameterList<Storage> params, Args&&... args)
      : params_(detail::checked_parameters(std::move(params))),
        masters_(make_masters(params_)),
        master_params_(master_list(params_, masters_)),
        master_grads_(master_params_),
        optimizer_(master_params_, std::forward<Args>(args)...) {}

  MixedPrecision(const MixedPrecision&) = delete;
  MixedPrecision& operator=(const MixedPrecision&) = delete;
  MixedPrecision(MixedPrecision&&) = default;
  MixedPrecision& operator=(MixedPrecision&&) = default;
  ~MixedPrecision() = default;

  /// One update from the 16-bit gradients `grads` (made from the same parameters, any
  /// naming): widened into the masters' gradients (and unscaled, with loss scaling on), the
  /// optimizer's step on the masters, then every parameter rounded from its master.
  /// @returns whether the optimizer stepped: false when loss scaling is on and an unscaled
  ///          gradient is an Inf or a NaN (the step is skipped, the scale backs off).
  /// @throws ConfigError if `grads` belong to other parameters, or the parameters no longer
  ///         exist; nothing is updated then.
  bool step(const Gradients<Storage>& grads) {
    detail::check_gradients("optim::MixedPrecision::step", params_, grads);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      convert(grads.of(params_[i].matrix()), master_grads_[i].matrix());
    }
    if (scaling_.enabled && !unscale_master_gradients()) {
      scale_ *= scaling_.backoff_factor;
      good_steps_ = 0;
      ++skipped_steps_;
      return false;
    }
    optimizer_.step(master_grads_);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      convert(master_params_[i].matrix(), params_[i].matrix());
    }
    if (scaling_.enabled && ++good_steps_ == scaling_.growth_interval) {
      const float grown = scale_ * scaling_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      good_steps_ = 0;
    }
    return true;
  }

  /// Turns dynamic loss scaling on with `scaling` (or off, if !scaling.enabled): the scale
  /// starts again at scaling.init_scale (1 when off), the counts at 0.
  /// @throws ConfigError naming the option and its value unless init_scale is positive and
  ///         finite, growth_factor > 1 and finite, 0 < backoff_factor < 1 and
  ///         growth_interval >= 1 (checked whether on or off); nothing changes then.
  void set_loss_scaling(const LossScaling& scaling) {
    const char* who = "optim::MixedPrecision::set_loss_scaling";
    detail::check_option(std::isfinite(scaling.init_scale) && scaling.init_scale > 0.0f, who,
                         "init_scale", scaling.init_scale, "must be positive and finite");
    detail::check_option(std::isfinite(scaling.growth_factor) && scaling.growth_factor > 1.0f, who,
                         "growth_factor", scaling.growth_factor, "must be > 1 and finite");
    detail::check_option(scaling.backoff_factor > 0.0f && scaling.backoff_factor < 1.0f, who,
                         "backoff_factor", scaling.backoff_factor, "must be in (0, 1)");
    detail::check_option(scaling.growth_interval >= 1, who, "growth_interval",
                         scaling.growth_interval, "must be >= 1");
    scaling_ = scaling;
    scale_ = scaling.enabled ? scaling.init_scale : 1.0f;
    good_steps_ = 0;
    skipped_steps_ = 0;
  }

  /// Restores the scaling's state saved from loss_scale() and good_steps() (GradScaler's
  /// load_state_dict(); the options come back with set_loss_scaling(), first).
  /// @throws ConfigError, changing nothing, when loss scaling is off, `scale` is not positive
  ///         and finite, or `good_steps` is outside [0, growth_interval).
  void set_loss_scale_state(float scale, int good_steps) {
    const char* who = "optim::MixedPrecision::set_loss_scale_state";
    attn::detail::require_config(scaling_.enabled, who, [] {
      return std::string("loss scaling is off; call set_loss_scaling() first");
    });
    detail::check_option(std::isfinite(scale) && scale > 0.0f, who, "scale", scale,
                         "must be positive and finite");
    attn::detail::require_config(good_steps >= 0 && good_steps < scaling_.growth_interval, who,
                                 [&] {
                                   return "good_steps=" + std::to_string(good_steps) +
                                          " is invalid: must be in [0, growth_interval=" +
                                          std::to_string(scaling_.growth_interval) + ")";
                                 });
    scale_ = scale;
    good_steps_ = good_steps;
  }

  /// The loss scaling's options (enabled == false until set_loss_scaling()).
  const LossScaling& loss_scaling() const noexcept { return scaling_; }
  /// The factor to multiply the loss's gradient (dL/dy) by before the backward: the current
  /// scale, or 1 with loss scaling off (GradScaler's get_scale()).
  float loss_scale() const noexcept { return scale_; }
  /// The steps counted towards the next growth (GradScaler's growth tracker): steps in a row
  /// without an Inf or a NaN, back to 0 after a skipped step and when it reaches
  /// growth_interval (the scale grows then).
  int good_steps() const noexcept { return good_steps_; }
  /// Steps skipped for an Inf or a NaN since set_loss_scaling().
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }

  /// Widens the module's current weights into the masters again (after loading weights into
  /// the module; the optimizer's state is kept).
  /// @throws ConfigError if the parameters no longer exist.
  void reload_masters() {
    attn::detail::require_config(!params_.expired(), "optim::MixedPrecision::reload_masters", [] {
      return std::string("the parameters it was built on no longer exist");
    });
    for (std::size_t i = 0; i < params_.size(); ++i) {
      convert(params_[i].matrix(), master_params_[i].matrix());
    }
  }

  /// The module's 16-bit parameters, as given.
  const ParameterList<Storage>& parameters() const noexcept { return params_; }
  /// The float masters, under the parameters' names (each contiguous, in the parameter's shape).
  const ParameterList<float>& master_parameters() const noexcept { return master_params_; }
  /// The masters' gradients of the last step(), stepped or skipped: the 16-bit gradients
  /// widened, and unscaled with loss scaling on.
  const Gradients<float>& master_gradients() const noexcept { return master_grads_; }
  /// The optimizer over the masters (its state, steps(), set_lr()).
  Optimizer& optimizer() noexcept { return optimizer_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }

 private:
  static std::vector<Tensor<float, 2>> make_masters(const ParameterList<Storage>& params) {
    std::vector<Tensor<float, 2>> masters;
    masters.reserve(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      masters.push_back(convert<float>(params[i].matrix()));
    }
    return masters;
  }
  static ParameterList<float> master_list(const ParameterList<Storage>& params,
                                          std::vector<Tensor<float, 2>>& masters) {
    ParameterList<float> list;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const TensorView<float, 2> m = masters[i].view();
      if (params[i].rank() == 1) {
        list.add(params[i].name(), TensorView<float, 1>(m.data(), {m.extent(1)}));
      } else {
        list.add(params[i].name(), m);
      }
    }
    return list;
  }

  // GradScaler's unscale: every master gradient times inv_scale = 1 / scale, formed in double
  // and rounded to float as PyTorch forms it (the same float as float's own 1.0f / scale_).
  // True when every unscaled gradient is finite (so a finite gradient that overflows float
  // when unscaled, by a scale below 1, is caught too).
  bool unscale_master_gradients() noexcept {
    const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
    bool finite = true;
    for (std::size_t i = 0; i < master_grads_.size(); ++i) {
      const TensorView<float, 2> g = master_grads_[i].matrix();
      float* data = g.data();
      attn::detail::for_each_parameter_offset(g, [&](Index o) {
        data[o] *= inv_scale;
        finite &= std::isfinite(data[o]);
      });
    }
    return finite;
  }

  ParameterList<Storage> params_;
  std::vector<Tensor<float, 2>> masters_;  // one per parameter, contiguous
  ParameterList<float> master_params_;     // views of masters_
  Gradients<float> master_grads_;
  Optimizer optimizer_;
  LossScaling scaling_ = off();
  float scale_ = 1.0f;
  int good_steps_ = 0;
  std::int64_t skipped_steps_ = 0;

  static LossScaling off() noexcept {
    LossScaling s;
    s.enabled = false;
    return s;
  }
};

}  // namespace optim
ATTN_NAMESPACE_END
