// SPDX-License-Identifier: MIT
// attn/nn/softmax.hpp: numerically stable softmax; a fully masked row gives zeros.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/ops/softmax.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN
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
  detail::require_distinct_elements("softmax_", "x", x);  // written in place
  if (x.empty()) return;
  detail::softmax_rows(x, axis);
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

ATTN_NAMESPACE_END
