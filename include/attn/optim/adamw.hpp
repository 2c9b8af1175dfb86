// SPDX-License-Identifier: MIT
// attn/optim/adamw.hpp: AdamW with PyTorch 1.13's exact update (torch.optim.AdamW,
// foreach=False), over a module's named_parameters() and its Gradients.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "attn/config.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/optim/optimizer.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace optim {

/// torch.optim.AdamW's arguments and defaults (betas = (beta1, beta2)).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

/// AdamW (Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019), step for
/// step what PyTorch 1.13's torch.optim.AdamW computes with foreach=False, so a run in
/// double matches PyTorch's bit for bit (tested over several steps), and one in float
/// matches PyTorch's float32 run. Per element, with g the gradient (negated if maximize):
///
///     step += 1
///     p = p * (1 - lr * weight_decay)         param.mul_(1 - lr * weight_decay)
///     m = fma(g, 1 - beta1, m * beta1)        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
///     v = fma((1 - beta2) * g, g, v * beta2)  exp_avg_sq.mul_(beta2)
///                                                       .addcmul_(grad, grad, value=1 - beta2)
///     vmax = max(vmax, v)                     (amsgrad; v below is then vmax)
///     denom = sqrt(v) / sqrt(1 - beta2^step) + eps
///     p = p + (-(lr / (1 - beta1^step)) * m) / denom
///                                             param.addcdiv_(exp_avg, denom, value=-step_size)
///
/// The scalars are formed in double as Python does, then rounded to Scalar as ATen's kernels
/// take them. The FMAs are where ATen's CPU kernels fuse (its vectorised add_ with alpha and
/// addcmul_ compute fmadd; measured against PyTorch 1.13 on AVX2, vector body and scalar
/// tail alike), and nowhere else.
///
/// The optimizer keeps views of the parameters (take them from the non-const
/// named_parameters(), which unfreezes the module; do not freeze() while training) and its
/// state in Gradients-shaped buffers allocated once: step() never allocates. Each step checks
/// that the parameters still exist (ConfigError once their module was destroyed or assigned
/// over; moving the module is fine).
///
/// @tparam Scalar float or double.
template <class Scalar>
class AdamW : public detail::OptimizerBase<AdamW<Scalar>, Scalar, AdamWOptions> {
  static_assert(std::is_floating_point_v<Scalar>, "attn::optim::AdamW: float or double");
  using Base = detail::OptimizerBase<AdamW<Scalar>, Scalar, AdamWOptions>;
  friend Base;

 public:
  /// @throws ConfigError on an option PyTorch rejects (lr < 0, eps < 0, a beta outside
  ///         [0, 1), weight_decay < 0), or parameters that repeat a name or share memory.
  explicit AdamW(ParameterList<Scalar> params, const AdamWOptions& options = {})
      : Base(std::move(params), options), exp_avg_(this->params_), exp_avg_sq_(this->params_) {
    if (this->options_.amsgrad) max_exp_avg_sq_ = Gradients<Scalar>(this->params_);
  }

  /// One update from `grads` (made from the same parameters, any naming).
  /// @throws ConfigError if `grads` belong to other parameters, or the parameters no longer
  ///         exist (their module was destroyed or assigned over); nothing is updated then.
  void step(const Gradients<Scalar>& grads) {
    detail::check_gradients("optim::AdamW::step", this->params_, grads);  // before anything changes
    const std::int64_t step = ++this->steps_;
    const AdamWOptions& o = this->options_;
    const double t = static_cast<double>(step);
    const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
    const auto decay = static_cast<Scalar>(1.0 - o.lr * o.weight_decay);
    const auto beta1 = static_cast<Scalar>(o.beta1), beta2 = static_cast<Scalar>(o.beta2);
    const auto one_minus_beta1 = static_cast<Scalar>(1.0 - o.beta1);
    const auto one_minus_beta2 = static_cast<Scalar>(1.0 - o.beta2);
    const auto correction2_sqrt = static_cast<Scalar>(std::sqrt(bias_correction2));
    const auto eps = static_cast<Scalar>(o.eps);
    const auto neg_step_size = static_cast<Scalar>(-(o.lr / bias_correction1));
    const bool maximize = o.maximize, amsgrad = o.amsgrad;
    detail::for_each_parameter(
        this->params_, grads, [&](std::size_t i, TensorView<Scalar, 2> p, const Scalar* grad) {
          Scalar* w = p.data();
          Scalar* m = exp_avg_[i].matrix().data();
          Scalar* v = exp_avg_sq_[i].matrix().data();
          Scalar* vmax = amsgrad ? max_exp_avg_sq_[i].matrix().data() : nullptr;
          attn::detail::for_each_parameter_offset(p, [&](Index e) {
            const Scalar g = maximize ? -grad[e] : grad[e];
            const Scalar decayed = detail::rounded(w[e] * decay);
            m[e] = std::fma(g, one_minus_beta1, m[e] * beta1);
            v[e] = std::fma(one_minus_beta2 * g, g, v[e] * beta2);
            Scalar second = v[e];
            if (amsgrad) {
              // torch.maximum: NaN if either is NaN.
              const Scalar a = vmax[e];
              vmax[e] = (a != a || a > second) ? a : second;
              second = vmax[e];
            }
            const Scalar denom = std::sqrt(second) / correction2_sqrt + eps;
            w[e] = decayed + (neg_step_size * m[e]) / denom;
          });
        });
  }

  /// state['exp_avg'], state['exp_avg_sq'] and (amsgrad) state['max_exp_avg_sq'], by
  /// parameter name.
  const Gradients<Scalar>& exp_avg() const noexcept { return exp_avg_; }
  const Gradients<Scalar>& exp_avg_sq() const noexcept { return exp_avg_sq_; }
  const Gradients<Scalar>& max_exp_avg_sq() const noexcept { return max_exp_avg_sq_; }

 private:
  static AdamWOptions checked(const AdamWOptions& o) {
    const char* who = "optim::AdamW";
    detail::check_option(o.lr >= 0.0, who, "lr", o.lr, "must be >= 0");
    detail::check_option(o.eps >= 0.0, who, "eps", o.eps, "must be >= 0");
    detail::check_option(o.beta1 >= 0.0 && o.beta1 < 1.0, who, "beta1", o.beta1,
                         "must be in [0, 1)");
    detail::check_option(o.beta2 >= 0.0 && o.beta2 < 1.0, who, "beta2", o.beta2,
                         "must be in [0, 1)");
    detail::check_option(o.weight_decay >= 0.0, who, "weight_decay", o.weight_decay,
                         "must be >= 0");
    return o;
  }

  Gradients<Scalar> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
};

}  // namespace optim
ATTN_NAMESPACE_END
