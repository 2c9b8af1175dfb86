// SPDX-License-Identifier: MIT
// attn/tensor/shape.hpp: Shape<Rank>, row-major strides and element counts.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <string>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"

ATTN_NAMESPACE_BEGIN

/// Extents (or strides) of a Rank-dimensional tensor. Rank is compile-time, extents
/// are run-time (like Eigen's Tensor<T, N> and std::dextents).
template <std::size_t Rank>
using Shape = std::array<Index, Rank>;

/// Row-major (C, PyTorch-contiguous) strides for `shape`: the last index is fastest.
/// Exact for every shape shape_size() accepts; for one whose size overflows (which every
/// view and tensor constructor rejects) the strides are unspecified but computing them is
/// not undefined behaviour.
template <std::size_t Rank>
constexpr Shape<Rank> row_major_strides(const Shape<Rank>& shape) noexcept {
  Shape<Rank> strides{};
  Index step = 1;
  for (std::size_t r = Rank; r-- > 0;) {
    strides[r] = step;
    if (!detail::checked_mul(step, shape[r], step)) step = std::numeric_limits<Index>::max();
  }
  return strides;
}

namespace detail {

/// shape_size() for `where`: throws ShapeError("attn::<where>: shape (...) has more elements
/// than an index can count") when the product of the non-zero extents does not fit Index.
/// (Written once for every rank: the checks of views and tensors of every element type and
/// rank call it.)
inline Index checked_shape_size(const Index* extents, std::size_t rank, const char* where) {
  struct Extents {
    const Index *first, *last;
    const Index* begin() const noexcept { return first; }
    const Index* end() const noexcept { return last; }
  };
  Index count = 0;
  require(checked_extent_product(Extents{extents, extents + rank}, count), where, [&] {
    return "shape " + to_string(extents, rank) + " has more elements than an index can count (" +
           std::to_string(std::numeric_limits<Index>::max()) + ")";
  });
  return count;
}

template <std::size_t Rank>
Index checked_shape_size(const Shape<Rank>& shape, const char* where) {
  return checked_shape_size(shape.data(), Rank, where);
}

/// The product of the extents, unchecked: the size() of a view or tensor, whose constructor
/// checked that the product fits Index (so no partial product overflows either). size() sits
/// in loop conditions, where the checked product was a measurable cost of unoptimised builds.
template <std::size_t Rank>
constexpr Index extent_product(const Shape<Rank>& shape) noexcept {
  Index count = 1;
  for (const Index e : shape) count *= e;
  return count;
}

}  // namespace detail

/// Number of elements of `shape` (1 for rank 0, 0 if any extent is 0).
/// @throws ShapeError naming the shape when the product of its non-zero extents does not fit
///         Index (its strides would overflow too).
template <std::size_t Rank>
Index shape_size(const Shape<Rank>& shape) {
  return detail::checked_shape_size(shape, "shape_size");
}

ATTN_NAMESPACE_END
