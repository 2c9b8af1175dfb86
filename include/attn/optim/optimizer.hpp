// SPDX-License-Identifier: MIT
// attn/optim/optimizer.hpp: what the optimizers share: the parameters they update, the walk
// over (parameter, gradient, state) element by element, option checks and the rounding
// barrier that keeps their arithmetic PyTorch's.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace optim {
namespace detail {

using attn::detail::number;
using attn::detail::require_config;

/// `x`, rounded to Scalar right here: the compiler may not fuse the multiplication that
/// produced it into a following addition. GCC and Clang contract `a * b + c` into one FMA,
/// even across statements, under -ffp-contract=fast (the default of GNU C++ modes, and so of
/// CMake's default -std=gnu++17) when FMA instructions are enabled; PyTorch rounds there
/// (each of its in-place ops is a pass over memory), so the optimizers put this where
/// PyTorch does not fuse. Costs no instruction; only stops the fusion (and vectorisation of
/// the loop around it, which is not where training spends its time).
template <class Scalar>
inline Scalar rounded(Scalar x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
  __asm__("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  volatile Scalar stored = x;
  x = stored;
#endif
  return x;
}

/// The parameters an optimizer updates, checked once: Gradients of them must be buildable
/// (no name twice, no shared memory), which is what every step relies on.
template <class Scalar>
ParameterList<Scalar> checked_parameters(ParameterList<Scalar> params) {
  Gradients<Scalar> probe(params);  // throws ConfigError on a repeated name or shared memory
  return params;
}

/// Calls fn(i, param, grad) for every parameter i of `params`, with its matrix view and its
/// gradient's data (same layout: the offsets of for_each_parameter_offset(param, ...) index
/// both, and every other buffer that mirrors the parameter, like the optimizer's state).
/// @throws ConfigError (from Gradients::of) if `grads` were made for other parameters.
template <class Scalar, class Fn>
void for_each_parameter(const ParameterList<Scalar>& params, const Gradients<Scalar>& grads,
                        Fn&& fn) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorView<Scalar, 2> p = params[i].matrix();
    fn(i, p, grads.of(p).data());
  }
}

/// The checks of a step, before anything changes: the parameters still exist (their module
/// was neither destroyed nor assigned over since the optimizer was built: see ParameterList's
/// lifetime), and `grads` hold a gradient for every parameter (see for_each_parameter).
/// @throws ConfigError naming `who` otherwise.
template <class Scalar>
void check_gradients(const char* who, const ParameterList<Scalar>& params,
                     const Gradients<Scalar>& grads) {
  require_config(!params.expired(), who, [] {
    return std::string(
        "the parameters it was built on no longer exist (their module was destroyed, or "
        "replaced by assigning another one to it); build the optimizer from the module's "
        "named_parameters() again");
  });
  for_each_parameter(params, grads,
                     [](std::size_t, const TensorView<Scalar, 2>&, const Scalar*) {});
}

/// @throws ConfigError naming `who`, the option and its value unless `ok`.
inline void check_option(bool ok, const char* who, const char* option, double value,
                         const char* rule) {
  require_config(
      ok, who, [&] { return std::string(option) + "=" + number(value) + " is invalid: " + rule; });
}

/// What every optimizer has: the parameters it updates, its options (Options has an `lr`;
/// Derived::checked(options) validates them, naming the optimizer) and its step count.
///
/// The parameters are views into their module: the optimizer is valid while the module
/// lives (moving the module is fine, its memory moves with it). Every step first checks that
/// they still exist and that its gradients belong to them, and throws ConfigError, changing
/// nothing, when the module was destroyed or assigned over (`module = Module(...)`).
template <class Derived, class Scalar, class Options>
class OptimizerBase {
 public:
  /// Steps taken so far (PyTorch's state['step'] of every parameter: they step together).
  std::int64_t steps() const noexcept { return steps_; }
  const Options& options() const noexcept { return options_; }
  /// Changes the learning rate for later steps (a scheduler's param_group['lr'] = lr).
  /// @throws ConfigError if Derived rejects it (lr < 0).
  void set_lr(double lr) {
    Options o = options_;
    o.lr = lr;
    options_ = Derived::checked(o);
  }
  /// The parameters, as given (views into the module).
  const ParameterList<Scalar>& parameters() const noexcept { return params_; }

 protected:
  OptimizerBase(ParameterList<Scalar> params, const Options& options)
      : params_(std::move(params)), options_(Derived::checked(options)) {
    require_config(!params_.expired(), "optim", [] {
      return std::string("the parameters given no longer exist (their module was destroyed)");
    });
  }

  ParameterList<Scalar> params_;
  Options options_;
  std::int64_t steps_ = 0;
};

}  // namespace detail
}  // namespace optim
ATTN_NAMESPACE_END
