// SPDX-License-Identifier: MIT
// attn/nn/softmax_backward.hpp: the gradient of softmax over any axis, from its output.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// One row of the softmax backward, strided: dx[j] += y[j] * (dy[j] - sum_k dy[k] y[k]).
/// The sum runs in order k = 0, 1, ... in Scalar, and both multiply-adds are explicit FMAs:
/// left to the compiler, contraction into FMAs differs between the loop versions it makes
/// for different strides (measured: the last axis and a moved one differed in the last bit
/// under GCC 12 -O3 -march=native). So every axis gives the same bits as moving it last,
/// whatever the build flags.
template <class Scalar>
void softmax_backward_row(const Scalar* y, Index ys, const Scalar* dy, Index dys, Scalar* dx,
                          Index dxs, Index n) noexcept {
  Scalar dot = 0;
  for (Index j = 0; j < n; ++j) dot = std::fma(dy[j * dys], y[j * ys], dot);
  for (Index j = 0; j < n; ++j) dx[j * dxs] = std::fma(y[j * ys], dy[j * dys] - dot, dx[j * dxs]);
}

}  // namespace detail

/// The backward of y = softmax(x) over `axis` (softmax_(), softmax()): adds
/// d loss / d x = y * (grad_y - sum_axis(grad_y * y)) into `grad_x` (as PyTorch's autograd adds
/// into .grad; zero grad_x first for the gradient alone, or use the allocating form). Only the
/// output y is needed. Entries of y that are 0 (-inf logits, fully masked rows) get zero
/// gradient, so a fully masked row stays all zeros, never NaN.
///
/// Shapes: y, grad_y and grad_x all of one shape; any strides (Scalar and Rank come from
/// grad_x; y and grad_y may be mutable views or tensors).
/// @throws ShapeError if the shapes differ or axis >= Rank.
template <class Scalar, std::size_t Rank>
void softmax_backward(TensorView<const typename TensorView<Scalar, Rank>::value_type, Rank> y,
                      TensorView<const typename TensorView<Scalar, Rank>::value_type, Rank> grad_y,
                      TensorView<Scalar, Rank> grad_x, std::size_t axis = Rank - 1) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::softmax_backward: Scalar must be float or double");
  detail::require(axis < Rank && grad_y.shape() == y.shape() && grad_x.shape() == y.shape(),
                  "softmax_backward", [&] {
                    return "y " + detail::to_string(y.shape()) + ", grad_y " +
                           detail::to_string(grad_y.shape()) + ", grad_x " +
                           detail::to_string(grad_x.shape()) + ", axis " + std::to_string(axis) +
                           ": expected one shape and an axis below " + std::to_string(Rank);
                  });
  if (y.empty()) return;
  // Every position of the other axes is one row along `axis` (n > 0 here).
  const auto moved_y = transpose(y, axis, Rank - 1);
  const auto moved_dy = transpose(grad_y, axis, Rank - 1);
  const auto moved_dx = transpose(grad_x, axis, Rank - 1);
  const Index n = moved_y.extent(Rank - 1);
  const Index rows = y.size() / n;
  for (Index r = 0; r < rows; ++r) {
    Index rest = r, oy = 0, ody = 0, odx = 0;  // row r's offsets, last outer axis fastest
    for (std::size_t ax = Rank - 1; ax-- > 0;) {
      const Index i = rest % moved_y.extent(ax);
      rest /= moved_y.extent(ax);
      oy += i * moved_y.stride(ax);
      ody += i * moved_dy.stride(ax);
      odx += i * moved_dx.stride(ax);
    }
    detail::softmax_backward_row(moved_y.data() + oy, moved_y.stride(Rank - 1),
                                 moved_dy.data() + ody, moved_dy.stride(Rank - 1),
                                 moved_dx.data() + odx, moved_dx.stride(Rank - 1), n);
  }
}

/// The gradient alone, allocated: y * (grad_y - sum_axis(grad_y * y)).
template <class Y, class G, std::size_t Rank>
Tensor<std::remove_const_t<Y>, Rank> softmax_backward(TensorView<Y, Rank> y,
                                                      TensorView<G, Rank> grad_y,
                                                      std::size_t axis = Rank - 1) {
  using S = std::remove_const_t<Y>;
  static_assert(std::is_same_v<std::remove_const_t<G>, S>,
                "attn::softmax_backward: y and grad_y must hold one Scalar");
  Tensor<S, Rank> grad_x(y.shape());
  softmax_backward<S, Rank>(y, grad_y, grad_x.view(), axis);
  return grad_x;
}

ATTN_NAMESPACE_END
