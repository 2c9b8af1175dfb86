// SPDX-License-Identifier: MIT
// attn/ops/convert.hpp: element-type conversion between views, PyTorch's tensor.to(dtype):
// float, double, bfloat16, float16, float8_e4m3 and float8_e5m2, any strides, rounding once.
// The driver, detail::convert_views(), checks shapes and overlap and runs the rows on the
// active kernel set (attn/kernels/generic/convert.inl and <set>/convert.inl); convert() and
// convert_saturate() are the public calls.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The read-only view of `v` (one driver instantiation for a mutable and a const source).
template <class Scalar, std::size_t Rank>
TensorView<const std::remove_const_t<Scalar>, Rank> read_only(TensorView<Scalar, Rank> v) noexcept {
  return v;
}

/// Checks, then converts src into dst: one contiguous row when both views are contiguous, rows
/// along the last axis when its stride is 1 in both, element by element otherwise. Every path
/// gives the same bits (the kernel sets' rows equal the scalar conversion). The active set
/// supplies only the row function: the loops around it are compiled once per type pair and
/// rank, not once per kernel set.
template <bool Saturate, class From, class To, std::size_t Rank>
void convert_views(const char* where, TensorView<const From, Rank> src, TensorView<To, Rank> dst) {
  static_assert(is_element_type_v<From> && is_element_type_v<To>,
                "attn::convert: element types are float, double, bfloat16, float16, float8_e4m3 "
                "and float8_e5m2");
  static_assert(!std::is_const_v<To>, "attn::convert: the destination must be writable");
  require(src.shape() == dst.shape(), where, [&] {
    return std::string("src has shape ") + to_string(src.shape()) + " (" + element_name<From>() +
           "), dst has shape " + to_string(dst.shape()) + " (" + element_name<To>() + ")";
  });
  require_distinct_elements(where, "dst", dst);
  require_disjoint(where, "dst", dst, "src", src);
  if (dst.empty()) return;

  const From* in = src.data();
  To* out = dst.data();
  void (*row)(const From*, To*, Index) noexcept = nullptr;
  with_kernels(kernel_isa(), [&](auto set) {
    using Set = decltype(set);
    if constexpr (Saturate) {
      row = &Set::template convert_row_saturate<From, To>;
    } else {
      row = &Set::template convert_row<From, To>;
    }
  });
  if (src.is_contiguous() && dst.is_contiguous()) {
    row(in, out, src.size());
    return;
  }
  const Index inner = src.extent(Rank - 1);
  const Index in_step = src.stride(Rank - 1), out_step = dst.stride(Rank - 1);
  Shape<Rank> outer = src.shape();
  outer[Rank - 1] = 1;
  for_each_offset(outer, src.strides(), dst.strides(), [&](Index i, Index o) {
    if (in_step == 1 && out_step == 1) {
      row(in + i, out + o, inner);
    } else {
      for (Index j = 0; j < inner; ++j) {
        if constexpr (Saturate) {
          out[o + j * out_step] = saturate_element<To>(in[i + j * in_step]);
        } else {
          out[o + j * out_step] = convert_element<To>(in[i + j * in_step]);
        }
      }
    }
  });
}

}  // namespace detail

/// Writes src's elements into dst converted to dst's element type (PyTorch's
/// `dst.copy_(src)` across dtypes): float, double, bfloat16, float16, float8_e4m3 and
/// float8_e5m2, any pair. Widening is exact; narrowing rounds once, to nearest even, from the
/// exact value (bfloat16 -> float8 goes through float exactly; double -> bfloat16 does not
/// round to float first, see attn::bfloat16). NaN, infinity and overflow follow the destination
/// type's constructor (docs/precision.md). Any strides; contiguous views, and rows whose last
/// stride is 1, run on the active kernel set at memory speed for float <-> bfloat16 and
/// float <-> float16. Same bits on every kernel set.
///
/// Shapes: src and dst the same shape.
/// @throws ShapeError if the shapes differ (naming both, with their element types), if dst
///         has elements that share memory, or if dst overlaps src.
template <class Source, class To, std::size_t Rank>
void convert(TensorView<Source, Rank> src, TensorView<To, Rank> dst) {
  detail::convert_views<false>("convert", detail::read_only(src), dst);
}

/// A new tensor holding src's elements converted to To (PyTorch's `src.to(dtype)`; see
/// convert(src, dst)). E.g. attn::convert<attn::bfloat16>(x.view()).
template <class To, class Source, std::size_t Rank>
Tensor<To, Rank> convert(TensorView<Source, Rank> src) {
  Tensor<To, Rank> result;
  result.resize(src.shape());
  convert(src, result.view());
  return result;
}

template <class To, class From, std::size_t Rank>
Tensor<To, Rank> convert(const Tensor<From, Rank>& src) {
  return convert<To>(src.view());
}

/// Like convert(src, dst), to float8_e4m3 or float8_e5m2 with saturation: magnitudes beyond
/// the type's largest finite value (448, 57344) and the infinities become +-that value; a NaN
/// stays NaN (the OCP FP8 specification's saturating mode, CUDA's __NV_SATFINITE).
/// @throws ShapeError as convert(src, dst).
template <class Source, class To, std::size_t Rank>
void convert_saturate(TensorView<Source, Rank> src, TensorView<To, Rank> dst) {
  detail::convert_views<true>("convert_saturate", detail::read_only(src), dst);
}

ATTN_NAMESPACE_END
