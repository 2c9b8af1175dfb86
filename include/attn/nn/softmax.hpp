// SPDX-License-Identifier: MIT
// attn/nn/softmax.hpp: numerically stable softmax; a fully masked row gives zeros.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// In-place softmax of a contiguous row of n values on the active kernel set (see
/// kernels/generic/softmax.inl): max-subtracted, so logits of 1e4 do not overflow; -inf
/// entries get weight 0 and a row with no finite entry becomes all zeros. Strided rows are
/// gathered first (see softmax_), so every row of every axis goes through this one sequence
/// of operations.
template <class Scalar>
void softmax_row(Isa isa, Scalar* row, Index n) {
  with_kernels(isa, [&](auto set) { set.softmax_row(row, n); });
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
  detail::require_distinct_elements("softmax_", "x", x);  // written in place
  if (x.empty()) return;
  // Iterate over every position of the other axes; each is one row along `axis`.
  const auto moved = transpose(x, axis, Rank - 1);
  Shape<Rank> outer_shape = moved.shape();
  outer_shape[Rank - 1] = 1;
  Scalar* data = moved.data();
  const Index n = moved.extent(Rank - 1), stride = moved.stride(Rank - 1);
  const Isa isa = detail::kernel_isa();
  if (stride == 1) {
    detail::for_each_offset(outer_shape, moved.strides(), moved.strides(),
                            [&](Index o, Index) { detail::softmax_row(isa, data + o, n); });
    return;
  }
  // A strided row is gathered into one contiguous buffer so that it goes through the same
  // (SIMD) arithmetic as a contiguous row: softmax over any axis gives bit-identical values
  // to moving that axis last and taking a contiguous softmax.
  std::vector<Scalar> row(static_cast<std::size_t>(n));
  detail::for_each_offset(outer_shape, moved.strides(), moved.strides(), [&](Index o, Index) {
    for (Index j = 0; j < n; ++j) row[std::size_t(j)] = data[o + j * stride];
    detail::softmax_row(isa, row.data(), n);
    for (Index j = 0; j < n; ++j) data[o + j * stride] = row[std::size_t(j)];
  });
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
