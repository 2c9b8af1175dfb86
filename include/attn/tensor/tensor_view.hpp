// SPDX-License-Identifier: MIT
// attn/tensor/tensor_view.hpp: non-owning, strided view; row-major by default.
#pragma once

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// TensorView's constructor checks, written once for every element type and rank (the view
/// types of a program are many: a unit of the test suite had 162 constructor instantiations).
/// @throws ShapeError if an extent or a stride is negative, the element count overflows, or
///         the data is null while the shape holds elements.
inline void check_view_layout(const Index* shape, const Index* strides, std::size_t rank,
                              bool null_data) {
  for (std::size_t r = 0; r < rank; ++r) {
    require(shape[r] >= 0 && strides[r] >= 0, "TensorView", [&] {
      return "shape " + to_string(shape, rank) + " with strides " + to_string(strides, rank) +
             " has a negative extent or stride";
    });
  }
  const Index count = checked_shape_size(shape, rank, "TensorView");  // size() never overflows
  require(!null_data || count == 0, "TensorView", [&] {
    return "null data with shape " + to_string(shape, rank) + " (" + std::to_string(count) +
           " elements); only an empty view may have null data";
  });
}

}  // namespace detail

/// A non-owning view of `Rank`-dimensional data with run-time extents and strides
/// (in elements). Like std::span and mdspan it is shallow-const: a `const TensorView<float,
/// 3>` still writes elements; `TensorView<const float, 3>` is the read-only view. Pass it by
/// value. Copying a view never copies data.
///
/// @tparam Scalar  element type (optionally const): float or double, a storage type (bfloat16,
///                 float16, float8_e4m3, float8_e5m2; attn/types/), bool for masks, or
///                 another arithmetic type.
/// @tparam Rank    number of dimensions (compile-time); extents are run-time.
///
/// Constructed from a shape alone, strides are row-major (last index fastest), which is
/// PyTorch's contiguous layout. Strides may be zero (broadcast) or any positive value;
/// negative strides are not supported.
template <class Scalar, std::size_t Rank>
class TensorView {
  static_assert(Rank >= 1, "attn::TensorView: Rank must be at least 1");
  static_assert(std::is_arithmetic_v<std::remove_const_t<Scalar>> || is_storage_type_v<Scalar>,
                "attn::TensorView: Scalar must be an arithmetic type (float, double, bool) or a "
                "storage type (bfloat16, float16, float8_e4m3, float8_e5m2), optionally const");

 public:
  using element_type = Scalar;
  using value_type = std::remove_const_t<Scalar>;

  /// An empty view: null data, every extent 0.
  TensorView() = default;

  /// A view of contiguous row-major data with the given shape.
  /// @throws ShapeError as the constructor with strides.
  TensorView(Scalar* data, const Shape<Rank>& shape)
      : TensorView(data, shape, row_major_strides(shape)) {}

  /// A view with explicit strides (in elements).
  /// @throws ShapeError if an extent or a stride is negative, the element count overflows, or
  ///         `data` is null while the shape holds elements (so no view that attn's functions
  ///         receive has null data unless it is empty).
  TensorView(Scalar* data, const Shape<Rank>& shape, const Shape<Rank>& strides)
      : data_(data), shape_(shape), strides_(strides) {
    detail::check_view_layout(shape.data(), strides.data(), Rank, data == nullptr);
  }

  /// Mutable -> read-only is implicit; the reverse does not compile.
  template <class Other,
            class = std::enable_if_t<std::is_const_v<Scalar> && !std::is_const_v<Other> &&
                                     std::is_same_v<const Other, Scalar>>>
  TensorView(const TensorView<Other, Rank>& other) noexcept  // NOLINT(google-explicit-constructor)
      : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

  static constexpr std::size_t rank() noexcept { return Rank; }
  Index extent(std::size_t r) const noexcept { return shape_[r]; }
  Index stride(std::size_t r) const noexcept { return strides_[r]; }
  const Shape<Rank>& shape() const noexcept { return shape_; }
  const Shape<Rank>& strides() const noexcept { return strides_; }
  Scalar* data() const noexcept { return data_; }

  /// Number of elements (product of the extents).
  Index size() const noexcept { return detail::extent_product(shape_); }
  bool empty() const noexcept { return size() == 0; }

  /// True when the strides are exactly row-major for the shape (extent-1 axes ignored).
  bool is_contiguous() const noexcept {
    Index step = 1;
    for (std::size_t r = Rank; r-- > 0;) {
      if (shape_[r] != 1 && strides_[r] != step) return false;
      step *= shape_[r];
    }
    return true;
  }

  /// Element access without bounds checks (ATTN_ASSERT in debug builds). (Plain arrays and
  /// pointers inside, as Tensor's: fewer calls per element at -O0.)
  template <class... Indices>
  Scalar& operator()(Indices... idx) const noexcept {
    static_assert(sizeof...(Indices) == Rank,
                  "attn::TensorView: number of indices must equal Rank");
    const Index index[] = {static_cast<Index>(idx)...};
    [[maybe_unused]] const Index* extent = shape_.data();  // (read by the assertion only)
    const Index* stride = strides_.data();
    Index offset = 0;
    for (std::size_t r = 0; r < Rank; ++r) {
      ATTN_ASSERT(index[r] >= 0 && index[r] < extent[r]);
      offset += index[r] * stride[r];
    }
    return data_[offset];
  }

  /// Element access with bounds checks.
  /// @throws IndexError (a std::out_of_range) "index 7 is out of bounds for axis 1 with
  ///         size 6".
  template <class... Indices>
  Scalar& at(Indices... idx) const {
    static_assert(sizeof...(Indices) == Rank,
                  "attn::TensorView: number of indices must equal Rank");
    const std::array<Index, Rank> index{static_cast<Index>(idx)...};
    Index offset = 0;
    for (std::size_t r = 0; r < Rank; ++r) {
      if (index[r] < 0 || index[r] >= shape_[r]) {
        throw IndexError("attn::TensorView::at: index " + std::to_string(index[r]) +
                         " is out of bounds for axis " + std::to_string(r) + " with size " +
                         std::to_string(shape_[r]));
      }
      offset += index[r] * strides_[r];
    }
    return data_[offset];
  }

 private:
  Scalar* data_ = nullptr;
  Shape<Rank> shape_{};
  Shape<Rank> strides_{};
};

/// Calls `fn(offset_in_a, offset_in_b)` for every element of two views of the same shape,
/// in row-major index order. Used by copies and element-wise helpers.
namespace detail {

template <std::size_t Rank, class Fn>
void for_each_offset(const Shape<Rank>& shape, const Shape<Rank>& strides_a,
                     const Shape<Rank>& strides_b, Fn&& fn) {
  if (shape_size(shape) == 0) return;
  std::array<Index, Rank> index{};
  Index offset_a = 0, offset_b = 0;
  const Index inner = shape[Rank - 1];
  const Index inner_a = strides_a[Rank - 1], inner_b = strides_b[Rank - 1];
  while (true) {
    for (Index i = 0; i < inner; ++i) fn(offset_a + i * inner_a, offset_b + i * inner_b);
    // advance the outer indices (odometer), innermost outer axis first
    std::size_t r = Rank - 1;
    while (true) {
      if (r == 0) return;
      --r;
      ++index[r];
      offset_a += strides_a[r];
      offset_b += strides_b[r];
      if (index[r] < shape[r]) break;
      offset_a -= strides_a[r] * shape[r];
      offset_b -= strides_b[r] * shape[r];
      index[r] = 0;
    }
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
