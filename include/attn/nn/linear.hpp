// SPDX-License-Identifier: MIT
// attn/nn/linear.hpp: Linear<Scalar>, torch.nn.Linear's layout, init and maths.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/detail/identity.hpp"
#include "attn/error.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/linear_backward.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/random.hpp"
#include "attn/ops/convert.hpp"
#include "attn/ops/gemm.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// torch.nn.init.kaiming_uniform_(w, a=sqrt(5)) as nn.Linear calls it: the bound is
/// computed with Python's double arithmetic, step by step, so draws match bit for bit.
inline double linear_weight_bound(Index fan_in) {
  if (fan_in <= 0) return 0.0;
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double std_dev = gain / std::sqrt(static_cast<double>(fan_in));
  return std::sqrt(3.0) * std_dev;
}

/// nn.Linear's bias bound 1/sqrt(fan_in) (0 when fan_in is 0).
inline double linear_bias_bound(Index fan_in) {
  return fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
}

/// torch.nn.init.xavier_uniform_ (gain 1) for a (fan_out, fan_in) weight, as
/// nn.MultiheadAttention initialises in_proj_weight: computed step by step as PyTorch does,
/// std = gain * sqrt(2 / (fan_in + fan_out)) and bound = sqrt(3) * std, so draws match bit
/// for bit.
inline double xavier_uniform_bound(Index fan_in, Index fan_out) {
  const double std_dev = 1.0 * std::sqrt(2.0 / static_cast<double>(fan_out + fan_in));
  return std::sqrt(3.0) * std_dev;
}

/// y = x W^T + b over the last axis for any leading shape; W (out, in), bias may be null;
/// `packed` is W packed once (PackedGemmB), or empty to pack per call. y may share memory
/// with x (in place); it needs one location per element.
template <class Scalar, std::size_t Rank>
void linear_forward(const char* where, TensorView<const Scalar, 2> weight, const Scalar* bias,
                    TensorView<const Scalar, Rank> x, TensorView<Scalar, Rank> y,
                    PackedB<Scalar> packed = {}, Workspace* ws = nullptr) {
  const Index in = weight.extent(1), out = weight.extent(0);
  Shape<Rank> expected = x.shape();
  expected[Rank - 1] = out;
  require(x.extent(Rank - 1) == in && y.shape() == expected, where, [&] {
    return "x has shape " + to_string(x.shape()) + " and y " + to_string(y.shape()) +
           ", expected x (..., " + std::to_string(in) + ") and y (..., " + std::to_string(out) +
           ")";
  });
  require_distinct_elements(where, "y", y);
  ATTN_ASSERT(weight.is_contiguous());
  const Index rows = y.size() / std::max<Index>(out, 1);  // from y: in may be 0
  // The GEMM writes y while it still reads x: in place (y sharing memory with x) it goes
  // through the copies below, which read all of x first.
  const auto product = [&](const Scalar* xd, Scalar* yd) {
    if constexpr (is_gemm_storage_v<Scalar>) {  // float sums, rounded once into y
      Workspace local;
      gemm_nt_rounded(
          rows, out, in, xd, in, weight.data(), in, yd,
          [&](float* wide) { return GemmOutput<float>::row_major(wide, out); }, bias, packed,
          ws != nullptr ? *ws : local);
    } else {
      gemm_nt(rows, out, in, xd, in, weight.data(), in, yd, out, bias, packed, ws);
    }
  };
  if (x.is_contiguous() && y.is_contiguous() && !overlaps(x, y)) {
    product(x.data(), y.data());
    return;
  }
  const Tensor<Scalar, Rank> xc(x);
  Tensor<Scalar, Rank> yc(y.shape());
  product(xc.data(), yc.data());
  copy(yc.view(), y);
}

}  // namespace detail

/// A fully connected layer in PyTorch's layout: weight (out_features, in_features),
/// optional bias (out_features), y = x W^T + b over the last axis.
///
/// Initialised like torch.nn.Linear: weight ~ U(-b, b) with kaiming_uniform's bound
/// (a = sqrt(5)), then bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn from a TorchGenerator.
/// The constructors without a generator draw from the global one, so after
/// `attn::manual_seed(123)` they produce exactly the weights
/// `torch.manual_seed(123); nn.Linear(...)` produces.
///
/// freeze() packs the weight into the GEMM's layout once (for inference); forward() then
/// reads the pack, with results bit for bit those of the unfrozen layer. Every non-const
/// weight accessor unfreezes it, so a weight edited through the layer is always used.
///
/// Shapes: x (..., in_features) -> (..., out_features).
/// @tparam Scalar float or double; or bfloat16 or float16: weight, bias, x and y of that type,
///         products and sums in float (the GEMM on 16-bit operands), y rounded once; its
///         constructors draw a float layer's weights and round them; its backward takes
///         16-bit products with float sums too, each gradient rounded once where it is added.
template <class Scalar = float>
class Linear {
  static_assert(std::is_floating_point_v<Scalar> || detail::is_gemm_storage_v<Scalar>,
                "attn::Linear: Scalar must be float, double, bfloat16 or float16");

 public:
  /// An empty 0 x 0 layer (assign a real one before use).
  Linear() = default;

  /// @throws ConfigError if a feature count is negative.
  Linear(Index in_features, Index out_features, bool bias = true)
      : Linear(in_features, out_features, bias, nullptr) {}

  Linear(Index in_features, Index out_features, bool bias, TorchGenerator& gen)
      : Linear(in_features, out_features, bias, &gen) {}

  /// Redraws weight and bias like nn.Linear.reset_parameters().
  void reset_parameters(TorchGenerator& gen) {
    unfreeze();
    gen.fill_uniform(weight_.view(), -detail::linear_weight_bound(in_features()),
                     detail::linear_weight_bound(in_features()));
    if (has_bias()) {
      gen.fill_uniform(bias_.view(), -detail::linear_bias_bound(in_features()),
                       detail::linear_bias_bound(in_features()));
    }
  }

  Index in_features() const noexcept { return weight_.extent(1); }
  Index out_features() const noexcept { return weight_.extent(0); }
  bool has_bias() const noexcept { return has_bias_; }

  /// (out_features, in_features), writable in place (unfreezes the layer).
  TensorView<Scalar, 2> weight() noexcept {
    unfreeze();
    return weight_.view();
  }
  TensorView<const Scalar, 2> weight() const noexcept { return weight_.view(); }
  /// (out_features); an empty view when the layer has no bias.
  TensorView<Scalar, 1> bias() noexcept { return bias_.view(); }
  TensorView<const Scalar, 1> bias() const noexcept { return bias_.view(); }

  /// Copies new weights in (any strides).
  /// @throws ShapeError if the shape is not (out_features, in_features).
  void set_weight(TensorView<const Scalar, 2> weight) {
    detail::require(weight.shape() == weight_.shape(), "Linear::set_weight", [&] {
      return "weight has shape " + detail::to_string(weight.shape()) + ", expected " +
             detail::to_string(weight_.shape());
    });
    unfreeze();
    copy(weight, weight_.view());
  }

  /// Copies a new bias in.
  /// @throws ShapeError if the layer has no bias or the shape is not (out_features).
  void set_bias(TensorView<const Scalar, 1> bias) {
    detail::require(has_bias_ && bias.shape() == bias_.shape(), "Linear::set_bias", [&] {
      return has_bias_ ? "bias has shape " + detail::to_string(bias.shape()) + ", expected " +
                             detail::to_string(bias_.shape())
                       : std::string("this layer was built with bias=false");
    });
    copy(bias, bias_.view());
  }

  /// y = x W^T + b into a preallocated output (any leading shape, any strides). In place
  /// (y over x's memory, with in_features == out_features) is correct.
  /// @throws ShapeError if x's last extent is not in_features, y's shape does not match, or
  ///         elements of y share memory (a zero stride).
  template <class XScalar, std::size_t Rank>
  void forward(TensorView<XScalar, Rank> x, TensorView<Scalar, Rank> y) const {
    forward_impl<XScalar, Rank>(x, y, nullptr);
  }
  /// The same with a Workspace for the GEMM's packing buffers: no allocation once warm
  /// (contiguous x and y).
  template <class XScalar, std::size_t Rank>
  void forward(TensorView<XScalar, Rank> x, TensorView<Scalar, Rank> y, Workspace& ws) const {
    forward_impl<XScalar, Rank>(x, y, &ws);
  }

  /// y = x W^T + b, allocating y.
  template <class XScalar, std::size_t Rank>
  Tensor<Scalar, Rank> forward(TensorView<XScalar, Rank> x) const {
    Shape<Rank> shape = x.shape();
    shape[Rank - 1] = out_features();
    Tensor<Scalar, Rank> y(shape);
    forward(x, y.view());
    return y;
  }
  template <std::size_t Rank>
  Tensor<Scalar, Rank> forward(const Tensor<Scalar, Rank>& x) const {
    return forward(x.view());
  }

  /// The backward of y = forward(x): given grad_y = dL/dy, ADDS dL/dx = grad_y W into
  /// grad_x (an empty view skips it) and dL/dW = grad_y^T x, dL/db = the column sums of
  /// grad_y into grads.of(weight()) and grads.of(bias()) (PyTorch's .grad: zero them first).
  /// x (..., in), grad_y and grad_x with x's leading shape; `grads` made from this layer's
  /// (or its module's) named_parameters(). Deterministic (the GEMMs' fixed order) and, with
  /// a warm `ws` and contiguous views, allocation-free; other views are copied first.
  /// bfloat16 and float16: the products on the 16-bit operands with float sums (the GEMM of
  /// the forward), each gradient widened, the float result added and rounded once; the bias
  /// gradient from float column sums (the modules' backward does the same, docs/precision.md).
  /// @throws ShapeError on mismatched shapes; ConfigError when `grads` does not hold this
  ///         layer's parameters.
  template <class XScalar, class GScalar, std::size_t Rank>
  void backward(TensorView<XScalar, Rank> x, TensorView<GScalar, Rank> grad_y,
                TensorView<Scalar, Rank> grad_x, Gradients<Scalar>& grads, Workspace& ws) const {
    static_assert(std::is_same_v<std::remove_const_t<XScalar>, Scalar> &&
                      std::is_same_v<std::remove_const_t<GScalar>, Scalar>,
                  "attn::Linear::backward: x and grad_y must hold the layer's Scalar");
    const char* where = "Linear::backward";
    Shape<Rank> y_shape = x.shape();
    y_shape[Rank - 1] = out_features();
    detail::require(x.extent(Rank - 1) == in_features() && grad_y.shape() == y_shape &&
                        (grad_x.data() == nullptr || grad_x.shape() == x.shape()),
                    where, [&] {
                      return "x has shape " + detail::to_string(x.shape()) + ", grad_y " +
                             detail::to_string(grad_y.shape()) + " and grad_x " +
                             detail::to_string(grad_x.shape()) + ", expected x (..., " +
                             std::to_string(in_features()) + "), grad_y (..., " +
                             std::to_string(out_features()) + ") and grad_x like x";
                    });
    detail::require_distinct_elements(where, "grad_x", grad_x);
    const TensorView<Scalar, 2> gw = grads.of(weight_.view());
    const TensorView<Scalar, 1> gb = has_bias_ ? grads.of(bias_.view()) : TensorView<Scalar, 1>();
    detail::require(!detail::overlaps(grad_x, gw) && !detail::overlaps(grad_x, gb), where,
                    [] { return std::string("grad_x overlaps the parameter gradients"); });
    const Index rows = x.size() / std::max<Index>(in_features(), 1);
    // Contiguous copies of views the GEMMs cannot read in place.
    const auto contiguous = [](auto view) {
      using S = std::remove_const_t<typename decltype(view)::value_type>;
      return view.is_contiguous() ? Tensor<S, Rank>() : Tensor<S, Rank>(view);
    };
    const Tensor<Scalar, Rank> xc = contiguous(x), gc = contiguous(grad_y);
    const Scalar* xd = xc.empty() ? x.data() : xc.data();
    const Scalar* gd = gc.empty() ? grad_y.data() : gc.data();
    const bool direct_x = grad_x.data() == nullptr || grad_x.is_contiguous();
    Tensor<Scalar, Rank> gx;
    if (!direct_x) gx = Tensor<Scalar, Rank>(grad_x);
    Scalar* gxd = grad_x.data() == nullptr ? nullptr : direct_x ? grad_x.data() : gx.data();
    const auto dy = detail::GemmOutput<const Scalar>::row_major(gd, out_features());
    const auto dx = detail::GemmOutput<Scalar>::row_major(gxd, in_features());
    if constexpr (std::is_floating_point_v<Scalar>) {
      detail::linear_backward<Scalar>(rows, weight_.view(), xd, in_features(), dy, dx, gw.data(),
                                      has_bias_ ? gb.data() : nullptr, &ws);
    } else {
      detail::linear_backward_narrow(rows, weight_.view(), xd, in_features(), dy, nullptr, dx,
                                     gw.data(), has_bias_ ? gb.data() : nullptr, ws);
    }
    if (!direct_x) copy(gx.view(), grad_x);
  }
  /// The same with a temporary workspace.
  template <class XScalar, class GScalar, std::size_t Rank>
  void backward(TensorView<XScalar, Rank> x, TensorView<GScalar, Rank> grad_y,
                TensorView<Scalar, Rank> grad_x, Gradients<Scalar>& grads) const {
    Workspace ws;
    backward(x, grad_y, grad_x, grads, ws);
  }

  /// Packs the weight for the GEMM once (as much memory again as the weight); forward()
  /// stops repacking it per call. The bias is always read live.
  void freeze() {
    pack_ =
        detail::pack_gemm_b(out_features(), in_features(), weight_.data(), in_features(), Index{0});
    frozen_ = true;
  }
  /// Drops the pack (forward() packs per call again).
  void unfreeze() noexcept {
    frozen_ = false;
    pack_ = {};
  }
  bool is_frozen() const noexcept { return frozen_; }

  /// "weight" and "bias" (nn.Linear's names); the bias is listed as absent without one.
  /// The non-const form unfreezes the layer (its views may be written).
  ParameterList<Scalar> named_parameters() {
    unfreeze();
    return parameter_views();
  }
  ParameterList<const Scalar> named_parameters() const {
    return const_cast<Linear&>(*this).parameter_views();
  }

 private:
  Linear(Index in_features, Index out_features, bool bias, TorchGenerator* gen) : has_bias_(bias) {
    detail::require_config(in_features >= 0 && out_features >= 0, "Linear", [&] {
      return "in_features=" + std::to_string(in_features) +
             " and out_features=" + std::to_string(out_features) + " must be non-negative";
    });
    weight_ = Tensor<Scalar, 2>({out_features, in_features});
    if (bias) bias_ = Tensor<Scalar, 1>({out_features});
    if constexpr (detail::is_gemm_storage_v<Scalar>) {  // a float layer's draws, rounded
      const Linear<float> wide(in_features, out_features, bias, gen);
      convert(wide.weight(), weight_.view());
      if (bias) convert(wide.bias(), bias_.view());
    } else if (gen != nullptr) {
      reset_parameters(*gen);
    } else {
      with_global_generator([&](TorchGenerator& global) { reset_parameters(global); });
    }
  }

  // The views without unfreezing (the const named_parameters() hands them out read-only).
  ParameterList<Scalar> parameter_views() {
    ParameterList<Scalar> list;
    list.add("weight", weight_.view());
    list.add("bias", bias_.view());
    list.watch(identity_.watch());  // expires with weight_ and bias_ (see ParameterList)
    return list;
  }

  template <class>
  friend class Linear;

  Tensor<Scalar, 2> weight_;
  Tensor<Scalar, 1> bias_;
  bool has_bias_ = false;
  detail::ObjectIdentity identity_;
  template <class XScalar, std::size_t Rank>
  void forward_impl(TensorView<XScalar, Rank> x, TensorView<Scalar, Rank> y, Workspace* ws) const {
    static_assert(std::is_same_v<std::remove_const_t<XScalar>, Scalar>,
                  "attn::Linear::forward: x must hold the layer's Scalar");
    detail::linear_forward<Scalar, Rank>(
        "Linear::forward", weight_.view(), has_bias_ ? bias_.data() : nullptr, x, y,
        frozen_ ? detail::PackedB<Scalar>{&pack_, 0} : detail::PackedB<Scalar>{}, ws);
  }

  detail::PackedGemmB<Scalar> pack_;  // freeze()'s pack of weight_ (empty when not frozen)
  bool frozen_ = false;
};

/// A non-owning (weight, bias) pair in Linear's layout: what a module whose projections
/// share one buffer hands out for a single projection (e.g. MultiHeadAttention::w_query()).
/// Writes go straight into the module.
///
/// @tparam Scalar float or double, optionally const.
template <class Scalar>
class LinearView {
 public:
  using value_type = std::remove_const_t<Scalar>;

  /// `bias` may be an empty view (no bias).
  LinearView(TensorView<Scalar, 2> weight, TensorView<Scalar, 1> bias)
      : weight_(weight), bias_(bias) {}

  Index in_features() const noexcept { return weight_.extent(1); }
  Index out_features() const noexcept { return weight_.extent(0); }
  bool has_bias() const noexcept { return bias_.data() != nullptr; }
  TensorView<Scalar, 2> weight() const noexcept { return weight_; }
  TensorView<Scalar, 1> bias() const noexcept { return bias_; }

  /// @throws ShapeError if the shape is not (out_features, in_features).
  void set_weight(TensorView<const value_type, 2> weight) const {
    detail::require(weight.shape() == weight_.shape(), "LinearView::set_weight", [&] {
      return "weight has shape " + detail::to_string(weight.shape()) + ", expected " +
             detail::to_string(weight_.shape());
    });
    copy(weight, weight_);
  }
  /// @throws ShapeError if there is no bias or its shape is not (out_features).
  void set_bias(TensorView<const value_type, 1> bias) const {
    detail::require(has_bias() && bias.shape() == bias_.shape(), "LinearView::set_bias", [&] {
      return has_bias() ? "bias has shape " + detail::to_string(bias.shape()) + ", expected " +
                              detail::to_string(bias_.shape())
                        : std::string("this projection has no bias");
    });
    copy(bias, bias_);
  }

  /// y = x W^T + b (any leading shape), like Linear::forward.
  template <class XScalar, std::size_t Rank>
  Tensor<value_type, Rank> forward(TensorView<XScalar, Rank> x) const {
    static_assert(std::is_same_v<std::remove_const_t<XScalar>, value_type>,
                  "attn::LinearView::forward: x must hold the projection's Scalar");
    Shape<Rank> shape = x.shape();
    shape[Rank - 1] = out_features();
    Tensor<value_type, Rank> y(shape);
    detail::require(weight_.is_contiguous(), "LinearView::forward", [&] {
      return "weight view of shape " + detail::to_string(weight_.shape()) + " is not contiguous";
    });
    detail::require(!has_bias() || bias_.stride(0) == 1 || bias_.extent(0) <= 1,
                    "LinearView::forward", [] { return std::string("bias is not contiguous"); });
    detail::linear_forward<value_type, Rank>("LinearView::forward",
                                             TensorView<const value_type, 2>(weight_),
                                             has_bias() ? bias_.data() : nullptr, x, y.view());
    return y;
  }
  template <std::size_t Rank>
  Tensor<value_type, Rank> forward(const Tensor<value_type, Rank>& x) const {
    return forward(x.view());
  }

 private:
  TensorView<Scalar, 2> weight_;
  TensorView<Scalar, 1> bias_;
};

ATTN_NAMESPACE_END
