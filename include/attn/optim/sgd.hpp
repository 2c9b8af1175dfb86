// SPDX-License-Identifier: MIT
// attn/optim/sgd.hpp: stochastic gradient descent with momentum, dampening, weight decay and
// Nesterov momentum, PyTorch 1.13's exact update (torch.optim.SGD, foreach=False).
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

/// torch.optim.SGD's arguments and defaults. lr has no default, as in PyTorch: set it.
struct SGDOptions {
  double lr = std::numeric_limits<double>::quiet_NaN();
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

/// SGD, step for step what PyTorch 1.13's torch.optim.SGD computes with foreach=False (bit
/// for bit in double, tested over several steps; float32 runs match PyTorch's float32).
/// Per element, with g the gradient (negated if maximize):
///
///     d = fma(p, weight_decay, g)                   d_p = d_p.add(param, alpha=weight_decay)
///     buf = d  (first step)                         buf = torch.clone(d_p)
///     buf = fma(d, 1 - dampening, buf * momentum)   buf.mul_(momentum).add_(d_p, alpha=1 -
///     dampening) d = nesterov ? fma(buf, momentum, d) : buf    d_p = d_p.add(buf, alpha=momentum)
///     p = fma(d, -lr, p)                            param.add_(d_p, alpha=-lr)
///
/// (weight decay and momentum steps only when non-zero, as in PyTorch). Every add with an
/// alpha is one FMA in ATen's CPU kernels (measured against PyTorch 1.13), so here too.
///
/// The optimizer keeps views of the parameters (take them from the non-const
/// named_parameters(); do not freeze() while training) and, with momentum, a momentum buffer
/// allocated once: step() never allocates. Each step checks that the parameters still exist
/// (ConfigError once their module was destroyed or assigned over; moving the module is fine).
///
/// @tparam Scalar float or double.
template <class Scalar>
class SGD : public detail::OptimizerBase<SGD<Scalar>, Scalar, SGDOptions> {
  static_assert(std::is_floating_point_v<Scalar>, "attn::optim::SGD: float or double");
  using Base = detail::OptimizerBase<SGD<Scalar>, Scalar, SGDOptions>;
  friend Base;

 public:
  /// @throws ConfigError on an option PyTorch rejects (lr not set or < 0, momentum < 0,
  ///         weight_decay < 0, nesterov without momentum or with dampening), or parameters
  ///         that repeat a name or share memory.
  SGD(ParameterList<Scalar> params, const SGDOptions& options)
      : Base(detail::checked_parameters(std::move(params)), options) {
    if (this->options_.momentum != 0.0) momentum_buffer_ = Gradients<Scalar>(this->params_);
  }

  /// One update from `grads` (made from the same parameters, any naming).
  /// @throws ConfigError if `grads` belong to other parameters, or the parameters no longer
  ///         exist (their module was destroyed or assigned over); nothing is updated then.
  void step(const Gradients<Scalar>& grads) {
    detail::check_gradients("optim::SGD::step", this->params_, grads);
    const SGDOptions& o = this->options_;
    const auto weight_decay = static_cast<Scalar>(o.weight_decay);
    const auto momentum = static_cast<Scalar>(o.momentum);
    const auto one_minus_dampening = static_cast<Scalar>(1.0 - o.dampening);
    const auto neg_lr = static_cast<Scalar>(-o.lr);
    const bool decay = o.weight_decay != 0.0, with_momentum = o.momentum != 0.0;
    const bool first = this->steps_ == 0;
    detail::for_each_parameter(
        this->params_, grads, [&](std::size_t i, TensorView<Scalar, 2> p, const Scalar* grad) {
          Scalar* w = p.data();
          Scalar* buf = with_momentum ? momentum_buffer_[i].matrix().data() : nullptr;
          attn::detail::for_each_parameter_offset(p, [&](Index e) {
            Scalar d = o.maximize ? -grad[e] : grad[e];
            if (decay) d = std::fma(w[e], weight_decay, d);
            if (with_momentum) {
              buf[e] = first ? d : std::fma(d, one_minus_dampening, buf[e] * momentum);
              d = o.nesterov ? std::fma(buf[e], momentum, d) : buf[e];
            }
            w[e] = std::fma(d, neg_lr, w[e]);
          });
        });
    ++this->steps_;
  }

  /// state['momentum_buffer'] by parameter name (empty without momentum; zero before the
  /// first step, which sets it to the first gradient).
  const Gradients<Scalar>& momentum_buffer() const noexcept { return momentum_buffer_; }

 private:
  static SGDOptions checked(const SGDOptions& o) {
    const char* who = "optim::SGD";
    detail::check_option(o.lr >= 0.0, who, "lr", o.lr, "must be set and >= 0");
    detail::check_option(o.momentum >= 0.0, who, "momentum", o.momentum, "must be >= 0");
    detail::check_option(o.weight_decay >= 0.0, who, "weight_decay", o.weight_decay,
                         "must be >= 0");
    detail::check_option(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), who, "momentum",
                         o.momentum,
                         "Nesterov momentum requires a momentum > 0 and zero dampening");
    return o;
  }

  Gradients<Scalar> momentum_buffer_;
};

}  // namespace optim
ATTN_NAMESPACE_END
