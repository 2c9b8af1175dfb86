// SPDX-License-Identifier: MIT
// attn/kernels/generic/convert.inl: element-type conversion of a contiguous row, written once
// for every set. A set's <set>/convert.inl provides convert_vector_part() (and
// convert_saturate_vector_part()) overloads for the pairs it vectorises (float <-> bfloat16,
// float16, float8_e4m3, float8_e5m2); they convert a prefix of the row (all of it under
// AVX-512's lane masks) and return its length, and the scalar conversion of attn/types/ does
// the rest. Every set gives the scalar conversion's bits.

/// No vector form of this pair in this set: nothing done.
template <class From, class To>
inline Index convert_vector_part(const From*, To*, Index) noexcept {
  return 0;
}
template <class From, class To>
inline Index convert_saturate_vector_part(const From*, To*, Index) noexcept {
  return 0;
}

/// dst[i] = src[i] converted to To (detail::convert_element: one rounding, to nearest even),
/// for i < n. The rows must not overlap.
template <class From, class To>
void convert_row(const From* src, To* dst, Index n) noexcept {
  Index i = convert_vector_part(src, dst, n);
  for (; i < n; ++i) dst[i] = convert_element<To>(src[i]);
}

/// dst[i] = src[i] converted to the float8 type To with saturation (detail::saturate_element),
/// for i < n. The rows must not overlap.
template <class From, class To>
void convert_row_saturate(const From* src, To* dst, Index n) noexcept {
  Index i = convert_saturate_vector_part(src, dst, n);
  for (; i < n; ++i) dst[i] = saturate_element<To>(src[i]);
}
