// SPDX-License-Identifier: MIT
// attn/optim/mixed_precision.hpp: MixedPrecision, the training of a bfloat16 module with float
// master weights: any optimizer (AdamW<float>, SGD<float>) steps the masters, and the module's
// bfloat16 weights are rounded from them after each step.
#pragma once

#include <cstddef>
#include <string>
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

ATTN_NAMESPACE_BEGIN
namespace optim {

/// Mixed-precision training of a bfloat16 module, as PyTorch users write it by hand: a float
/// master copy of every parameter, the optimizer (and its state) over the masters, and after
/// each step the module's bfloat16 weights rounded from the masters. Per step():
///
///     master.grad = param.grad.float()      each bfloat16 gradient widened (exact)
///     optimizer.step()                      Optimizer's own float update of the masters
///     param.copy_(master)                   each master rounded once, to nearest even
///
/// so that updates smaller than half a bfloat16 ulp of a weight still accumulate in its master
/// (an AdamW step of lr = 1e-3 moves a weight of 1 by an eighth of its bfloat16 ulp, 2^-7:
/// stepping the bfloat16 weights themselves would round it away).
///
/// ```cpp
/// attn::MultiHeadAttention<attn::bfloat16> mha(attn::MultiHeadAttentionOptions::pytorch(64, 4));
/// attn::Gradients<attn::bfloat16> grads(mha.named_parameters());
/// attn::optim::MixedPrecision<attn::optim::AdamW<float>> adamw(mha.named_parameters(), options);
/// ... grads.zero(); mha.backward(...); adamw.step(grads);
/// ```
///
/// The masters start as the module's weights widened (exact); after loading other weights
/// into the module, reload_masters(). The optimizer is built on the masters with the
/// arguments after the parameters (AdamWOptions, SGDOptions), so its results are its own,
/// bit for bit, on the widened gradients. step() never allocates. Parameters are views of the
/// module, kept as the optimizers keep theirs: a step checks that they still exist
/// (ConfigError otherwise, nothing changed). Movable (the masters' memory moves with it), not
/// copyable.
///
/// @tparam Optimizer an optimizer over float parameters: AdamW<float> or SGD<float>.
template <class Optimizer>
class MixedPrecision {
 public:
  /// Masters widened from `params` (a bfloat16 module's non-const named_parameters()), and
  /// Optimizer(masters, args...).
  /// @throws ConfigError for parameters that repeat a name or share memory, or as Optimizer's
  ///         constructor for its options.
  template <class... Args>
  explicit MixedPrecision(ParameterList<bfloat16> params, Args&&... args)
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

  /// One update from the bfloat16 gradients `grads` (made from the same parameters, any
  /// naming): widened into the masters' gradients, the optimizer's step on the masters, then
  /// every parameter rounded from its master.
  /// @throws ConfigError if `grads` belong to other parameters, or the parameters no longer
  ///         exist; nothing is updated then.
  void step(const Gradients<bfloat16>& grads) {
    detail::check_gradients("optim::MixedPrecision::step", params_, grads);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      convert(grads.of(params_[i].matrix()), master_grads_[i].matrix());
    }
    optimizer_.step(master_grads_);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      convert(master_params_[i].matrix(), params_[i].matrix());
    }
  }

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

  /// The module's bfloat16 parameters, as given.
  const ParameterList<bfloat16>& parameters() const noexcept { return params_; }
  /// The float masters, under the parameters' names (each contiguous, in the parameter's shape).
  const ParameterList<float>& master_parameters() const noexcept { return master_params_; }
  /// The masters' gradients of the last step (the bfloat16 gradients widened).
  const Gradients<float>& master_gradients() const noexcept { return master_grads_; }
  /// The optimizer over the masters (its state, steps(), set_lr()).
  Optimizer& optimizer() noexcept { return optimizer_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }

 private:
  static std::vector<Tensor<float, 2>> make_masters(const ParameterList<bfloat16>& params) {
    std::vector<Tensor<float, 2>> masters;
    masters.reserve(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      masters.push_back(convert<float>(params[i].matrix()));
    }
    return masters;
  }
  static ParameterList<float> master_list(const ParameterList<bfloat16>& params,
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

  ParameterList<bfloat16> params_;
  std::vector<Tensor<float, 2>> masters_;  // one per parameter, contiguous
  ParameterList<float> master_params_;     // views of masters_
  Gradients<float> master_grads_;
  Optimizer optimizer_;
};

}  // namespace optim
ATTN_NAMESPACE_END
