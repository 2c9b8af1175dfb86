// SPDX-License-Identifier: MIT
// attn/ops/softmax.hpp: the softmax driver: every row along an axis through the active
// kernel set's softmax_row (attn/kernels/generic/softmax.inl).
#pragma once

#include <cstddef>
#include <vector>

#include "attn/config.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// In-place softmax of a contiguous row of n values on the active kernel set (see
/// kernels/generic/softmax.inl): max-subtracted, so logits of 1e4 do not overflow; -inf
/// entries get weight 0 and a row with no finite entry becomes all zeros. Strided rows are
/// gathered first (see softmax_rows), so every row of every axis goes through this one
/// sequence of operations.
template <class Scalar>
void softmax_row(Isa isa, Scalar* row, Index n) {
  with_kernels(isa, [&](auto set) { set.softmax_row(row, n); });
}

/// Softmax of every row of x along `axis` (< Rank), in place.
template <class Scalar, std::size_t Rank>
void softmax_rows(TensorView<Scalar, Rank> x, std::size_t axis) {
  // Iterate over every position of the other axes; each is one row along `axis`.
  const auto moved = transpose(x, axis, Rank - 1);
  Shape<Rank> outer_shape = moved.shape();
  outer_shape[Rank - 1] = 1;
  Scalar* data = moved.data();
  const Index n = moved.extent(Rank - 1), stride = moved.stride(Rank - 1);
  const Isa isa = kernel_isa();
  if (stride == 1) {
    for_each_offset(outer_shape, moved.strides(), moved.strides(),
                    [&](Index o, Index) { softmax_row(isa, data + o, n); });
    return;
  }
  // A strided row is gathered into one contiguous buffer so that it goes through the same
  // (SIMD) arithmetic as a contiguous row: softmax over any axis gives bit-identical values
  // to moving that axis last and taking a contiguous softmax.
  std::vector<Scalar> row(static_cast<std::size_t>(n));
  for_each_offset(outer_shape, moved.strides(), moved.strides(), [&](Index o, Index) {
    for (Index j = 0; j < n; ++j) row[std::size_t(j)] = data[o + j * stride];
    softmax_row(isa, row.data(), n);
    for (Index j = 0; j < n; ++j) data[o + j * stride] = row[std::size_t(j)];
  });
}

}  // namespace detail
ATTN_NAMESPACE_END
