// SPDX-License-Identifier: MIT
// attn/kernels/generic/kv_load.inl: the one dequantising loader of stored key/value rows (a
// quantised KVCache, attn/kernels/kv_storage.hpp), written once for every set: a set's
// <set>/convert.inl may provide widen_int8_part() and widen_int4_blocks() for float (and
// convert_vector_part() for the float formats); the scalar loops here do the rest and give
// the same values (each element is q times its scale, one rounding).

/// No vector form in this set: nothing done.
template <class Scalar>
inline Index widen_int8_part(const std::int8_t*, Scalar*, Index) noexcept {
  return 0;
}
template <class Scalar>
inline Index widen_int4_blocks(const unsigned char*, Scalar*, Index) noexcept {
  return 0;
}

/// One kInt4Block of 16 bytes into 32 values q (the unscaled levels, -8 .. 7).
template <class Scalar>
inline void widen_int4_block(const unsigned char* b, Scalar* o) noexcept {
  constexpr Index half = kInt4Block / 2;
  for (Index i = 0; i < half; ++i) {
    o[i] = static_cast<Scalar>(static_cast<int>(b[i] & 0x0Fu) - 8);
    o[i + half] = static_cast<Scalar>(static_cast<int>(b[i] >> 4) - 8);
  }
}

/// Rows slot .. slot + n - 1 of item b, key/value head h of `s` (no ring wrap inside), each
/// `width` elements, dequantised into out (n, width) (row stride width).
template <class Scalar>
void load_stored_rows(const StoredRows& s, Index b, Index h, Index slot, Index n, Index width,
                      Scalar* out) noexcept {
  for (Index j = 0; j < n; ++j) {
    const unsigned char* row = s.row(b, h, slot + j);
    const float* scales = s.scales_of(b, h, slot + j);
    Scalar* o = out + j * width;
    switch (s.element) {
      case KVElement::kBFloat16:
        convert_row(reinterpret_cast<const bfloat16*>(row), o, width);
        break;
      case KVElement::kFloat16:
        convert_row(reinterpret_cast<const float16*>(row), o, width);
        break;
      case KVElement::kFloat8E4M3:
        convert_row(reinterpret_cast<const float8_e4m3*>(row), o, width);
        break;
      case KVElement::kFloat8E5M2:
        convert_row(reinterpret_cast<const float8_e5m2*>(row), o, width);
        break;
      case KVElement::kInt8: {
        const auto* q = reinterpret_cast<const std::int8_t*>(row);
        for (Index e = widen_int8_part(q, o, width); e < width; ++e) {
          o[e] = static_cast<Scalar>(q[e]);
        }
        break;
      }
      case KVElement::kInt4: {
        const Index full = width / kInt4Block;
        for (Index k = widen_int4_blocks(row, o, full); k < full; ++k) {
          widen_int4_block(row + k * (kInt4Block / 2), o + k * kInt4Block);
        }
        if (full * kInt4Block < width) {  // a partial last block, through a small buffer
          Scalar last[kInt4Block];
          widen_int4_block(row + full * (kInt4Block / 2), last);
          std::copy(last, last + (width - full * kInt4Block), o + full * kInt4Block);
        }
        break;
      }
      case KVElement::kScalar:
        break;
    }
    if (scales == nullptr) continue;
    for (Index e0 = 0, g = 0; e0 < width; e0 += s.group, ++g) {
      scale_row(o + e0, std::min(s.group, width - e0), static_cast<Scalar>(scales[g]));
    }
  }
}
