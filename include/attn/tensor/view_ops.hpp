// SPDX-License-Identifier: MIT
// attn/tensor/view_ops.hpp: slice, select, permute/transpose, reshape, split/merge heads.
// Every function here changes extents and strides only; none copies data except
// contiguous() and copy(), which say so.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

// The checks of the view ops below, written once for every element type (and rank, where
// they take the extents as a pointer): a program holds views of many element types.

inline void check_slice(const Index* shape, std::size_t rank, std::size_t axis, Index begin,
                        Index end) {
  require(axis < rank && 0 <= begin && begin <= end && end <= shape[axis], "slice", [&] {
    return "range [" + std::to_string(begin) + ", " + std::to_string(end) + ") on axis " +
           std::to_string(axis) + " of a view of shape " + to_string(shape, rank) +
           " is out of bounds";
  });
}

inline void check_select(const Index* shape, std::size_t rank, std::size_t axis, Index index) {
  require(axis < rank && 0 <= index && index < shape[axis], "select", [&] {
    return "index " + std::to_string(index) + " on axis " + std::to_string(axis) +
           " of a view of shape " + to_string(shape, rank) + " is out of bounds";
  });
}

inline void check_permutation(const Index* shape, std::size_t rank, const std::size_t* axes) {
  bool ok = true;
  for (std::size_t r = 0; r < rank; ++r) {
    if (axes[r] >= rank) ok = false;
    for (std::size_t s = 0; s < r; ++s) {
      if (axes[s] == axes[r]) ok = false;
    }
  }
  require(ok, "permute", [&] {
    std::string text = "axes (";
    for (std::size_t r = 0; r < rank; ++r) text += (r ? ", " : "") + std::to_string(axes[r]);
    return text + ") are not a permutation of the " + std::to_string(rank) +
           " axes of a view of shape " + to_string(shape, rank);
  });
}

inline void check_transpose(const Index* shape, std::size_t rank, std::size_t a, std::size_t b) {
  require(a < rank && b < rank, "transpose", [&] {
    return "axes " + std::to_string(a) + " and " + std::to_string(b) +
           " do not exist in a view of shape " + to_string(shape, rank);
  });
}

inline void check_unsqueeze(const Index* shape, std::size_t rank, std::size_t axis) {
  require(axis <= rank, "unsqueeze", [&] {
    return "axis " + std::to_string(axis) + " is out of range for a view of shape " +
           to_string(shape, rank);
  });
}

}  // namespace detail

/// Elements [begin, end) along `axis`; same rank. Like PyTorch's `x.narrow(axis, begin,
/// end - begin)` or `x[..., begin:end, ...]`.
/// @throws ShapeError if axis >= Rank or the range is outside [0, extent].
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank> slice(TensorView<Scalar, Rank> v, std::size_t axis, Index begin,
                               Index end) {
  detail::check_slice(v.shape().data(), Rank, axis, begin, end);
  Shape<Rank> shape = v.shape();
  shape[axis] = end - begin;
  return {v.data() + begin * v.stride(axis), shape, v.strides()};
}

/// The sub-view at `index` along `axis`; rank drops by one. Like `x.select(axis, index)`.
/// @throws ShapeError if axis >= Rank or index is out of bounds.
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank - 1> select(TensorView<Scalar, Rank> v, std::size_t axis, Index index) {
  static_assert(Rank >= 2, "attn::select: the view must have rank 2 or more");
  detail::check_select(v.shape().data(), Rank, axis, index);
  Shape<Rank - 1> shape{}, strides{};
  for (std::size_t r = 0, o = 0; r < Rank; ++r) {
    if (r == axis) continue;
    shape[o] = v.extent(r);
    strides[o++] = v.stride(r);
  }
  return {v.data() + index * v.stride(axis), shape, strides};
}

/// Reorders the axes: result axis r is input axis `axes[r]` (PyTorch's `permute`).
/// @throws ShapeError if `axes` is not a permutation of 0..Rank-1.
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank> permute(TensorView<Scalar, Rank> v,
                                 const std::array<std::size_t, Rank>& axes) {
  detail::check_permutation(v.shape().data(), Rank, axes.data());
  Shape<Rank> shape{}, strides{};
  for (std::size_t r = 0; r < Rank; ++r) {
    shape[r] = v.extent(axes[r]);
    strides[r] = v.stride(axes[r]);
  }
  return {v.data(), shape, strides};
}

/// Swaps two axes (PyTorch's `transpose(a, b)`).
/// @throws ShapeError if an axis is out of range.
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank> transpose(TensorView<Scalar, Rank> v, std::size_t a, std::size_t b) {
  detail::check_transpose(v.shape().data(), Rank, a, b);
  std::array<std::size_t, Rank> axes{};
  for (std::size_t r = 0; r < Rank; ++r) axes[r] = r;
  std::swap(axes[a], axes[b]);
  return permute(v, axes);
}

/// The matrix transpose of a rank-2 view (`x.T`).
template <class Scalar>
TensorView<Scalar, 2> transpose(TensorView<Scalar, 2> v) {
  return transpose(v, 0, 1);
}

/// Inserts an axis of extent 1 at `axis` (PyTorch's `unsqueeze`).
/// @throws ShapeError if axis > Rank.
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank + 1> unsqueeze(TensorView<Scalar, Rank> v, std::size_t axis) {
  detail::check_unsqueeze(v.shape().data(), Rank, axis);
  Shape<Rank + 1> shape{}, strides{};
  for (std::size_t r = 0, i = 0; r <= Rank; ++r) {
    if (r == axis) {
      shape[r] = 1;
      strides[r] = (i < Rank) ? v.stride(i) * v.extent(i) : 1;
    } else {
      shape[r] = v.extent(i);
      strides[r] = v.stride(i);
      ++i;
    }
  }
  return {v.data(), shape, strides};
}

namespace detail {

/// PyTorch's view rule (ATen computeStride): new strides for `new_shape` over the same
/// memory, or false when the existing strides cannot express it without a copy.
template <std::size_t Rank, std::size_t NewRank>
bool compute_view_strides(const Shape<Rank>& shape, const Shape<Rank>& strides,
                          const Shape<NewRank>& new_shape, Shape<NewRank>& new_strides) {
  if (shape_size(shape) == 0) {
    new_strides = row_major_strides(new_shape);
    return true;
  }
  // Walk the old axes from the last, grouping runs that are contiguous with each other;
  // each run must be covered exactly by a run of new axes.
  std::ptrdiff_t view_d = static_cast<std::ptrdiff_t>(NewRank) - 1;
  Index chunk_base_stride = strides[Rank - 1];
  Index tensor_numel = 1, view_numel = 1;
  for (std::ptrdiff_t d = static_cast<std::ptrdiff_t>(Rank) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

/// reshape()'s checks and new strides, for every element type: resolves a -1 extent of
/// `new_shape` and sets `new_strides`.
/// @throws ShapeError as reshape().
template <std::size_t Rank, std::size_t NewRank>
void reshape_layout(const Shape<Rank>& shape, const Shape<Rank>& strides, Shape<NewRank>& new_shape,
                    Shape<NewRank>& new_strides) {
  const Index size = shape_size(shape);
  const auto describe = [&] {
    return "cannot view shape " + to_string(shape) + " as " + to_string(new_shape);
  };
  Index known = 1;
  std::size_t inferred = NewRank;
  for (std::size_t r = 0; r < NewRank; ++r) {
    if (new_shape[r] == -1) {
      require(inferred == NewRank, "reshape",
              [&] { return describe() + ": only one extent may be -1"; });
      inferred = r;
    } else {
      require(new_shape[r] >= 0, "reshape",
              [&] { return describe() + ": extents must be non-negative"; });
      require(checked_mul(known, new_shape[r], known), "reshape",
              [&] { return describe() + ": the element count overflows"; });
    }
  }
  if (inferred != NewRank) {
    require(known != 0 && size % known == 0, "reshape",
            [&] { return describe() + ": the -1 extent cannot be inferred"; });
    new_shape[inferred] = size / known;
  }
  require(shape_size(new_shape) == size, "reshape", [&] {
    return describe() + ": " + std::to_string(size) + " elements vs " +
           std::to_string(shape_size(new_shape));
  });
  require(compute_view_strides(shape, strides, new_shape, new_strides), "reshape", [&] {
    return describe() + " with strides " + to_string(strides) +
           " without a copy; call attn::contiguous() first";
  });
}

}  // namespace detail

/// The same elements with a new shape, as a view (PyTorch's `view`): works whenever the
/// existing strides allow it (always for contiguous views). One extent may be -1 and is
/// then inferred.
/// @throws ShapeError if the element counts differ, or if the strides make a copy
///         necessary (call contiguous() first).
template <class Scalar, std::size_t Rank, std::size_t NewRank>
TensorView<Scalar, NewRank> reshape(TensorView<Scalar, Rank> v, Shape<NewRank> new_shape) {
  Shape<NewRank> new_strides{};
  detail::reshape_layout(v.shape(), v.strides(), new_shape, new_strides);
  return {v.data(), new_shape, new_strides};
}

/// (B, T, D) -> (B, H, T, D/H) by changing strides only; no data moves. This is the
/// correct `x.view(b, t, h, hd).transpose(1, 2)`.
/// @throws ShapeError if num_heads <= 0 or D is not divisible by num_heads.
template <class Scalar>
TensorView<Scalar, 4> split_heads(TensorView<Scalar, 3> x, Index num_heads) {
  const Index batch = x.extent(0), tokens = x.extent(1), dim = x.extent(2);
  detail::require(num_heads > 0 && dim % num_heads == 0, "split_heads", [&] {
    return "x has shape " + detail::to_string(x.shape()) +
           "; its last extent is not divisible by num_heads=" + std::to_string(num_heads);
  });
  const Index head_dim = dim / num_heads;
  return {x.data(),
          {batch, num_heads, tokens, head_dim},
          {x.stride(0), head_dim * x.stride(2), x.stride(1), x.stride(2)}};
}

/// (B, H, T, hd) -> (B, T, H * hd), the inverse of split_heads, as a view. Works on any
/// view produced by split_heads (and on every layout where heads sit side by side in
/// memory); otherwise the merge needs a copy.
/// @throws ShapeError if the strides do not allow a merge without a copy.
template <class Scalar>
TensorView<Scalar, 3> merge_heads(TensorView<Scalar, 4> x) {
  const auto moved = permute(x, {0, 2, 1, 3});  // (B, T, H, hd)
  const Shape<3> merged{x.extent(0), x.extent(2), x.extent(1) * x.extent(3)};
  Shape<3> strides{};
  detail::require(detail::compute_view_strides(moved.shape(), moved.strides(), merged, strides),
                  "merge_heads", [&] {
                    return "x has shape " + detail::to_string(x.shape()) + " and strides " +
                           detail::to_string(x.strides()) +
                           ": its heads do not sit side by side in memory, so (B, T, H * hd) = " +
                           detail::to_string(merged) +
                           " needs a copy (e.g. contiguous(permute(x, {0, 2, 1, 3})))";
                  });
  return {x.data(), merged, strides};
}

/// Copies `source` into `destination` element by element (any strides).
/// @throws ShapeError if the shapes differ.
template <class SourceScalar, class Scalar, std::size_t Rank>
void copy(TensorView<SourceScalar, Rank> source, TensorView<Scalar, Rank> destination) {
  static_assert(std::is_same_v<std::remove_const_t<SourceScalar>, Scalar>,
                "attn::copy: element types must match");
  detail::require(source.shape() == destination.shape(), "copy", [&] {
    return "source has shape " + detail::to_string(source.shape()) + ", destination " +
           detail::to_string(destination.shape());
  });
  Scalar* out = destination.data();
  const SourceScalar* in = source.data();
  detail::for_each_offset(source.shape(), destination.strides(), source.strides(),
                          [&](Index o, Index i) { out[o] = in[i]; });
}

/// A contiguous row-major copy of any view (PyTorch's `contiguous()`, always copying).
template <class Scalar, std::size_t Rank>
Tensor<std::remove_const_t<Scalar>, Rank> contiguous(TensorView<Scalar, Rank> v) {
  return Tensor<std::remove_const_t<Scalar>, Rank>(v);
}

ATTN_NAMESPACE_END
