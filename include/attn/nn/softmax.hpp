// SPDX-License-Identifier: MIT
// attn/nn/softmax.hpp: numerically stable softmax; a fully masked row gives zeros.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/detail/simd.hpp"
#include "attn/error.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// In-place softmax of a contiguous row of n values: SIMD max, exp and sum over whole
/// vectors, the same steps element by element on the tail. Subtracts the row max, so
/// logits of 1e4 do not overflow. -inf entries get weight 0; a row with no finite entry
/// (all -inf, or n == 0) becomes all zeros, never NaN. Returns the sum of the exponentials
/// (0 for a fully masked row). Strided rows are gathered first (see softmax_), so every
/// row of every axis goes through this one sequence of operations.
template <class Scalar>
Scalar softmax_row(Scalar* row, Index n) noexcept {
  using V = simd::Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const Index full = n / W * W;
  auto vmax = V::set1(-std::numeric_limits<Scalar>::infinity());
  for (Index j = 0; j < full; j += W) vmax = V::max(vmax, V::load(row + j));
  Scalar row_max = V::reduce_max(vmax);
  for (Index j = full; j < n; ++j) row_max = row[j] > row_max ? row[j] : row_max;
  if (row_max == -std::numeric_limits<Scalar>::infinity()) {
    for (Index j = 0; j < n; ++j) row[j] = Scalar(0);
    return Scalar(0);
  }
  const auto shift = V::set1(row_max);
  auto vsum = V::zero();
  for (Index j = 0; j < full; j += W) {
    const auto e = V::exp(V::sub(V::load(row + j), shift));
    V::store(row + j, e);
    vsum = V::add(vsum, e);
  }
  Scalar sum = V::reduce_add(vsum);
  for (Index j = full; j < n; ++j) {
    const Scalar e = std::exp(row[j] - row_max);
    row[j] = e;
    sum += e;
  }
  const Scalar inv = Scalar(1) / sum;
  const auto vinv = V::set1(inv);
  for (Index j = 0; j < full; j += W) V::store(row + j, V::mul(V::load(row + j), vinv));
  for (Index j = full; j < n; ++j) row[j] *= inv;
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
  if (stride == 1) {
    detail::for_each_offset(outer_shape, moved.strides(), moved.strides(),
                            [&](Index o, Index) { detail::softmax_row(data + o, n); });
    return;
  }
  // A strided row is gathered into one contiguous buffer so that it goes through the same
  // (SIMD) arithmetic as a contiguous row: softmax over any axis gives bit-identical values
  // to moving that axis last and taking a contiguous softmax.
  std::vector<Scalar> row(static_cast<std::size_t>(n));
  detail::for_each_offset(outer_shape, moved.strides(), moved.strides(), [&](Index o, Index) {
    for (Index j = 0; j < n; ++j) row[std::size_t(j)] = data[o + j * stride];
    detail::softmax_row(row.data(), n);
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
