// SPDX-License-Identifier: MIT
// attn/nn/softmax.hpp: numerically stable softmax; a fully masked row gives zeros.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

namespace attn {
namespace detail {

/// In-place softmax of n values spaced `stride` apart. Subtracts the row max, so logits
/// of 1e4 do not overflow. -inf entries get weight 0; a row with no finite entry (all
/// -inf, or n == 0) becomes all zeros, never NaN. Returns the sum of the exponentials
/// (0 for a fully masked row).
template <class Scalar>
Scalar softmax_row(Scalar* row, Index n, Index stride = 1) noexcept {
  Scalar row_max = -std::numeric_limits<Scalar>::infinity();
  for (Index j = 0; j < n; ++j) row_max = row[j * stride] > row_max ? row[j * stride] : row_max;
  if (row_max == -std::numeric_limits<Scalar>::infinity()) {
    for (Index j = 0; j < n; ++j) row[j * stride] = Scalar(0);
    return Scalar(0);
  }
  Scalar sum = 0;
  for (Index j = 0; j < n; ++j) {
    const Scalar e = std::exp(row[j * stride] - row_max);
    row[j * stride] = e;
    sum += e;
  }
  const Scalar inv = Scalar(1) / sum;
  for (Index j = 0; j < n; ++j) row[j * stride] *= inv;
  return sum;
}

}  // namespace detail

/// Softmax over `axis` (default: the last), in place. Stable (max-subtracted); -inf
/// entries get weight 0 and a row that is entirely -inf becomes zeros instead of NaN.
/// @throws ShapeError if axis >= Rank.
template <class Scalar, std::size_t Rank>
void softmax_(TensorView<Scalar, Rank> x, std::size_t axis = Rank - 1) {
  static_assert(std::is_floating_point_v<Scalar>, "attn::softmax_: Scalar must be float or double");
  detail::require(axis < Rank, "softmax_", [&] {
    return "axis " + std::to_string(axis) + " does not exist in a view of shape " +
           detail::to_string(x.shape());
  });
  if (x.empty()) return;
  // Iterate over every position of the other axes; each is one row along `axis`.
  const auto moved = transpose(x, axis, Rank - 1);
  Shape<Rank> outer_shape = moved.shape();
  outer_shape[Rank - 1] = 1;
  Scalar* data = moved.data();
  const Index n = moved.extent(Rank - 1), stride = moved.stride(Rank - 1);
  detail::for_each_offset(outer_shape, moved.strides(), moved.strides(),
                          [&](Index o, Index) { detail::softmax_row(data + o, n, stride); });
}

/// Softmax over `axis` (default: the last) into a new tensor. See softmax_().
template <class Scalar, std::size_t Rank>
Tensor<std::remove_const_t<Scalar>, Rank> softmax(TensorView<Scalar, Rank> x,
                                                  std::size_t axis = Rank - 1) {
  Tensor<std::remove_const_t<Scalar>, Rank> result(x);
  softmax_(result.view(), axis);
  return result;
}

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> softmax(const Tensor<Scalar, Rank>& x, std::size_t axis = Rank - 1) {
  return softmax(x.view(), axis);
}

}  // namespace attn
