// SPDX-License-Identifier: MIT
// attn/tensor/shape.hpp: Shape<Rank>, row-major strides and element counts.
#pragma once

#include <array>
#include <cstddef>

#include "attn/config.hpp"

namespace attn {

/// Extents (or strides) of a Rank-dimensional tensor. Rank is compile-time, extents
/// are run-time (like Eigen's Tensor<T, N> and std::dextents).
template <std::size_t Rank>
using Shape = std::array<Index, Rank>;

/// Row-major (C, PyTorch-contiguous) strides for `shape`: the last index is fastest.
template <std::size_t Rank>
constexpr Shape<Rank> row_major_strides(const Shape<Rank>& shape) noexcept {
  Shape<Rank> strides{};
  Index step = 1;
  for (std::size_t r = Rank; r-- > 0;) {
    strides[r] = step;
    step *= shape[r];
  }
  return strides;
}

/// Number of elements of `shape` (1 for rank 0, 0 if any extent is 0).
template <std::size_t Rank>
constexpr Index shape_size(const Shape<Rank>& shape) noexcept {
  Index count = 1;
  for (const Index extent : shape) count *= extent;
  return count;
}

}  // namespace attn
