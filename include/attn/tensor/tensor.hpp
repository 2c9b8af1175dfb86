// SPDX-License-Identifier: MIT
// attn/tensor/tensor.hpp: Tensor<Scalar, Rank>, owning, 64-byte aligned, contiguous row-major.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/memory.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// Tensor::resize's checks, written once for every element type and rank: the element count
/// of a shape whose extents are all non-negative and whose bytes fit one allocation.
/// @throws ShapeError naming the shape otherwise.
inline std::size_t checked_tensor_count(const Index* shape, std::size_t rank,
                                        std::size_t element_size) {
  for (std::size_t r = 0; r < rank; ++r) {
    require(shape[r] >= 0, "Tensor::resize",
            [&] { return "shape " + to_string(shape, rank) + " has a negative extent"; });
  }
  const auto count = static_cast<std::size_t>(checked_shape_size(shape, rank, "Tensor"));
  std::size_t bytes = 0;
  require(checked_bytes(count, element_size, bytes), "Tensor", [&] {
    return "shape " + to_string(shape, rank) + " needs " + std::to_string(count) + " x " +
           std::to_string(element_size) + " bytes, more than one allocation can hold";
  });
  return count;
}

}  // namespace detail

/// An owning tensor: contiguous row-major storage, 64-byte aligned, deep-copied on copy.
/// Arithmetic goes through views and Eigen maps (attn/tensor/eigen.hpp); there are no
/// expression templates.
///
/// @tparam Scalar  float, double, a storage type (bfloat16, float16, float8_e4m3,
///                 float8_e5m2), or bool (masks).
/// @tparam Rank    number of dimensions.
template <class Scalar, std::size_t Rank>
class Tensor {
  static_assert(!std::is_const_v<Scalar>, "attn::Tensor: Scalar must not be const");
  static_assert(std::is_arithmetic_v<Scalar> || is_storage_type_v<Scalar>,
                "attn::Tensor: Scalar must be arithmetic or a storage type");

 public:
  using value_type = Scalar;

  /// An empty tensor (every extent 0).
  Tensor() = default;

  /// A zero-filled tensor of the given shape.
  /// @throws ShapeError if an extent is negative.
  explicit Tensor(const Shape<Rank>& shape) : Tensor(shape, Scalar(0)) {}

  /// A tensor of the given shape with every element equal to `fill`.
  Tensor(const Shape<Rank>& shape, Scalar fill) {
    resize(shape);
    std::fill_n(data(), size(), fill);
  }

  /// A tensor of the given shape filled row-major from `values`.
  /// @throws ShapeError if the counts differ.
  Tensor(const Shape<Rank>& shape, std::initializer_list<Scalar> values) {
    resize(shape);
    detail::require(static_cast<Index>(values.size()) == size(), "Tensor", [&] {
      return "shape " + detail::to_string(shape) + " holds " + std::to_string(size()) +
             " elements, got " + std::to_string(values.size()) + " values";
    });
    std::copy(values.begin(), values.end(), data());
  }

  /// A deep, contiguous copy of any view (of the same or const element type).
  template <class ViewScalar,
            class = std::enable_if_t<std::is_same_v<std::remove_const_t<ViewScalar>, Scalar>>>
  explicit Tensor(TensorView<ViewScalar, Rank> source) {
    resize(source.shape());
    Scalar* out = data();
    const ViewScalar* in = source.data();
    detail::for_each_offset(shape_, row_major_strides(shape_), source.strides(),
                            [&](Index o, Index i) { out[o] = in[i]; });
  }

  /// A rank-2 tensor from nested rows, e.g. the notebooks' 6x3 `inputs`.
  /// @throws ShapeError if the rows have different lengths.
  template <std::size_t R = Rank, class = std::enable_if_t<R == 2>>
  static Tensor from_rows(std::initializer_list<std::initializer_list<Scalar>> rows) {
    const Index n_rows = static_cast<Index>(rows.size());
    const Index n_cols = n_rows == 0 ? 0 : static_cast<Index>(rows.begin()->size());
    Tensor result(Shape<2>{n_rows, n_cols});
    Index i = 0;
    for (const auto& row : rows) {
      detail::require(static_cast<Index>(row.size()) == n_cols, "Tensor::from_rows", [&] {
        return "row " + std::to_string(i) + " has " + std::to_string(row.size()) +
               " values, row 0 has " + std::to_string(n_cols);
      });
      std::copy(row.begin(), row.end(), result.data() + i * n_cols);
      ++i;
    }
    return result;
  }

  Tensor(const Tensor& other) : Tensor(other.view()) {}
  Tensor& operator=(const Tensor& other) {
    if (this != &other) {
      resize(other.shape());
      std::copy_n(other.data(), other.size(), data());
    }
    return *this;
  }
  Tensor(Tensor&& other) noexcept
      : storage_(std::move(other.storage_)), shape_(std::exchange(other.shape_, Shape<Rank>{})) {}
  Tensor& operator=(Tensor&& other) noexcept {
    storage_ = std::move(other.storage_);
    shape_ = std::exchange(other.shape_, Shape<Rank>{});
    return *this;
  }
  ~Tensor() = default;

  /// Changes the shape. Reallocates only when the new size exceeds the capacity, so a
  /// tensor reused as a workspace stops allocating. Element values are unspecified after
  /// a resize that changes the size (call fill() if needed).
  /// @throws ShapeError if an extent is negative, or the element or byte count overflows.
  void resize(const Shape<Rank>& shape) {
    storage_.reserve(detail::checked_tensor_count(shape.data(), Rank, sizeof(Scalar)));
    shape_ = shape;
  }

  void fill(Scalar value) { std::fill_n(data(), size(), value); }

  TensorView<Scalar, Rank> view() noexcept { return {data(), shape_, row_major_strides(shape_)}; }
  TensorView<const Scalar, Rank> view() const noexcept {
    return {data(), shape_, row_major_strides(shape_)};
  }
  // Implicit conversions make `module.forward(tensor)` read like PyTorch. A view of a
  // temporary dangles once the full expression ends: do not store one.
  operator TensorView<Scalar, Rank>() noexcept { return view(); }              // NOLINT
  operator TensorView<const Scalar, Rank>() const noexcept { return view(); }  // NOLINT

  static constexpr std::size_t rank() noexcept { return Rank; }
  Index extent(std::size_t r) const noexcept { return shape_[r]; }
  const Shape<Rank>& shape() const noexcept { return shape_; }
  Shape<Rank> strides() const noexcept { return row_major_strides(shape_); }
  Index size() const noexcept { return detail::extent_product(shape_); }
  bool empty() const noexcept { return size() == 0; }
  Scalar* data() noexcept { return storage_.data(); }
  const Scalar* data() const noexcept { return storage_.data(); }

  /// Element access (bounds asserted in debug builds, as a view's), from the extents alone:
  /// building a view per element made element-wise loops several times slower at -O0.
  template <class... Indices>
  Scalar& operator()(Indices... idx) noexcept {
    return storage_.data()[offset_of(idx...)];
  }
  template <class... Indices>
  const Scalar& operator()(Indices... idx) const noexcept {
    return storage_.data()[offset_of(idx...)];
  }
  /// @throws IndexError (a std::out_of_range) naming the axis and its extent.
  template <class... Indices>
  Scalar& at(Indices... idx) {
    return view().at(idx...);
  }
  template <class... Indices>
  const Scalar& at(Indices... idx) const {
    return view().at(idx...);
  }

  /// The elements in row-major order (handy in tests and examples).
  std::vector<Scalar> to_vector() const { return std::vector<Scalar>(data(), data() + size()); }

 private:
  /// The row-major offset of an index (Horner's scheme over the extents). Plain arrays and
  /// pointers, no std::array operator[]: element loops at -O0 (debug and sanitizer builds)
  /// spent most of their time in those calls.
  template <class... Indices>
  Index offset_of(Indices... idx) const noexcept {
    static_assert(sizeof...(Indices) == Rank, "attn::Tensor: number of indices must equal Rank");
    const Index index[] = {static_cast<Index>(idx)...};
    const Index* extent = shape_.data();
    Index offset = 0;
    for (std::size_t r = 0; r < Rank; ++r) {
      ATTN_ASSERT(index[r] >= 0 && index[r] < extent[r]);
      offset = offset * extent[r] + index[r];
    }
    return offset;
  }

  detail::AlignedBuffer<Scalar> storage_;
  Shape<Rank> shape_{};
};

ATTN_NAMESPACE_END
