// SPDX-License-Identifier: MIT
// attn/kernels/generic/kv_load.inl: the one dequantising loader of stored key/value rows (a
// quantised KVCache, attn/kernels/kv_storage.hpp), written once for every set: a set's
// <set>/convert.inl may provide widen_int8_part() and widen_int4_blocks() for float (and
// convert_vector_part() for the float formats); the scalar loops here do the rest and give
// the same values (each element is q times its scale, one rounding).

/// No vector form in this set: nothing done (false).
template <class Scalar>
inline Index widen_int8_part(const std::int8_t*, Scalar*, Index, float) noexcept {
  return 0;
}
template <class Scalar>
inline bool widen_int4_block(const unsigned char*, Scalar*, float) noexcept {
  return false;
}

/// Rows slot .. slot + n - 1 of item b, key/value head h of `s` (no ring wrap inside; paged
/// rows may cross blocks), each `width` elements, dequantised into out (n, width) (row
/// stride width): q times its scale, one rounding (the int8 and int4 levels are exact in
/// Scalar); Scalar rows copied.
template <class Scalar>
void load_stored_rows(const StoredRows& s, Index b, Index h, Index slot, Index n, Index width,
                      Scalar* out) noexcept {
  constexpr Index half = kInt4Block / 2;
  const auto load = [&](const unsigned char* row, const float* scales, Scalar* o) {
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
      case KVElement::kInt8: {  // one scale per row
        const auto* q = reinterpret_cast<const std::int8_t*>(row);
        const float scale = scales[0];
        for (Index e = widen_int8_part(q, o, width, scale); e < width; ++e) {
          o[e] = static_cast<Scalar>(static_cast<float>(q[e]) * scale);
        }
        return;
      }
      case KVElement::kInt4: {  // a block's elements share a scale when group % 32 == 0
        for (Index e0 = 0; e0 < width; e0 += kInt4Block) {
          const unsigned char* block = row + e0 / kInt4Block * half;
          const Index count = std::min(kInt4Block, width - e0);
          if (count == kInt4Block && s.group % kInt4Block == 0 &&
              widen_int4_block(block, o + e0, scales[e0 / s.group])) {
            continue;
          }
          for (Index i = 0; i < count; ++i) {
            const unsigned nibble = i < half ? block[i] & 0x0Fu : block[i - half] >> 4;
            o[e0 + i] = static_cast<Scalar>(static_cast<float>(static_cast<int>(nibble) - 8) *
                                            scales[(e0 + i) / s.group]);
          }
        }
        return;
      }
      case KVElement::kScalar:  // paged Scalar rows: copied as they are
        std::memcpy(o, row, static_cast<std::size_t>(width) * sizeof(Scalar));
        return;
    }
    if (scales == nullptr) return;
    for (Index e0 = 0, g = 0; e0 < width; e0 += s.group, ++g) {
      scale_row(o + e0, std::min(s.group, width - e0), static_cast<Scalar>(scales[g]));
    }
  };
  // Rows follow each other at row_stride to the end of the call, or of a block when paged:
  // one address lookup per run.
  for (Index j = 0; j < n;) {
    const Index run =
        s.table == nullptr ? n - j : std::min(n - j, s.block_rows - (slot + j) % s.block_rows);
    const unsigned char* row = s.row(b, h, slot + j);
    const float* scales = s.scales_of(b, h, slot + j);
    for (Index r = 0; r < run; ++r, ++j) {
      load(row + r * s.row_stride, scales != nullptr ? scales + r * s.scale_row_stride : nullptr,
           out + j * width);
    }
  }
}

/// Whether stored rows of this kind may hold a NaN or an infinity (the float formats may;
/// int8 and int4 levels times finite scales never do).
inline bool stored_may_be_nonfinite(KVElement e) noexcept {
  return e != KVElement::kInt8 && e != KVElement::kInt4;
}
