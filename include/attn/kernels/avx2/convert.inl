// SPDX-License-Identifier: MIT
// attn/kernels/avx2/convert.inl: float <-> bfloat16, float16, float8_e4m3 and float8_e5m2 rows,
// 8 lanes per ymm (the tail is left to the scalar conversion). Included by
// attn/kernels/avx2.hpp; each gives the bits of the scalar conversions in attn/types/ (tested
// over every float, every 16-bit pattern and a dense set of floats for float8). bfloat16 rounds
// with integer adds; float16 uses F16C's vcvtps2ph / vcvtph2ps, which round to nearest even
// from the immediate (not MXCSR) and keep subnormals, after NaN lanes are replaced by
// sign | 0x7FC00000 (so a NaN comes out as sign | 0x7E00, and a signalling NaN raises no
// invalid-operation flag); float8 as in the AVX-512 set (avx512/convert.inl).

namespace convert_ops {

/// All-ones in the lanes of u (float bits) that hold a NaN: |u| > 0x7F800000 (signed compare:
/// both sides are below 2^31).
inline __m256i nan_lanes(__m256i u) noexcept {
  return _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                            _mm256_set1_epi32(0x7F800000));
}

/// 8 floats (as integer lanes) -> 8 bfloat16 in the low halves of 32-bit lanes.
inline __m256i bfloat16_lanes(__m256i u) noexcept {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan_lanes(u));
}

inline __m256i load(const float* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

/// 8 floats (as integer lanes) -> 8 values of the 8-bit Format in the low bytes of 32-bit
/// lanes: detail::encode_bits() on every lane, with AVX2's variable shifts (see the AVX-512
/// form, attn/kernels/avx512/convert.inl). Every lane value stays below 2^31, so the signed
/// compares are exact.
template <class Format, bool Saturate>
inline __m256i float8_lanes(__m256i u) noexcept {
  constexpr int tm = Format::kMantissaBits;
  const __m256i one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i e_raw = _mm256_srli_epi32(a, 23);
  const __m256i implicit =
      _mm256_andnot_si256(_mm256_cmpeq_epi32(e_raw, zero), _mm256_set1_epi32(0x00800000));
  const __m256i m = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x007FFFFF)), implicit);
  const __m256i t =
      _mm256_add_epi32(_mm256_max_epi32(e_raw, one), _mm256_set1_epi32(Format::kBias - 127));
  const __m256i shift =
      _mm256_min_epi32(_mm256_add_epi32(_mm256_max_epi32(_mm256_sub_epi32(one, t), zero),
                                        _mm256_set1_epi32(23 - tm)),
                       _mm256_set1_epi32(25));
  const __m256i half_less_one =
      _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(shift, one)), one);
  const __m256i lsb = _mm256_and_si256(_mm256_srlv_epi32(m, shift), one);
  const __m256i q =
      _mm256_srlv_epi32(_mm256_add_epi32(_mm256_add_epi32(m, half_less_one), lsb), shift);
  __m256i r =
      _mm256_add_epi32(_mm256_slli_epi32(_mm256_max_epi32(_mm256_sub_epi32(t, one), zero), tm), q);
  const auto overflow = static_cast<int>(Saturate ? Format::kMaxFinite : Format::kOverflow);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(overflow),
                         _mm256_cmpgt_epi32(r, _mm256_set1_epi32(Format::kMaxFinite)));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7F), nan_lanes(u));
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80)));
}

template <class Format, bool Saturate, class T>
inline Index float8_row(const float* src, T* dst, Index n) noexcept {
  // byte 0 of each 32-bit lane to the front of each 128-bit half
  const __m256i gather =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i r = _mm256_shuffle_epi8(float8_lanes<Format, Saturate>(load(src + i)), gather);
    const __m128i bytes =
        _mm_unpacklo_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), bytes);
  }
  return i;
}

/// 8 float8 values (bytes, zero-extended to 16-bit lanes) -> 8 floats, exactly (see the
/// AVX-512 form).
template <class Format>
inline __m256 float8_floats(__m128i b) noexcept {
  if constexpr (Format::kExponentBits == 5) {
    return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
  } else {
    const __m128i magnitude = _mm_and_si128(b, _mm_set1_epi16(0x7F));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(magnitude, 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(magnitude, _mm_set1_epi16(0x7F)));
    const __m256i quiet = _mm256_or_si256(
        _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(static_cast<int>(0x80000000u))),
        _mm256_set1_epi32(0x7FF00000));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_castps_si256(x), quiet, nan));
  }
}

template <class Format, class T>
inline Index float8_to_float_row(const T* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, float8_floats<Format>(b));
  }
  return i;
}

}  // namespace convert_ops

inline Index convert_vector_part(const float* src, bfloat16* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = convert_ops::bfloat16_lanes(convert_ops::load(src + i));
    const __m256i b = convert_ops::bfloat16_lanes(convert_ops::load(src + i + 8));
    // packus works within 128-bit halves: a0 b0 | a1 b1 -> reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i a = convert_ops::bfloat16_lanes(convert_ops::load(src + i));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, a), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  return i;
}

/// 8 elements of a 16-bit row as floats, exactly (bfloat16: the high halves of float lanes;
/// float16: F16C's vcvtph2ps).
inline __m256 widen8(const bfloat16* at) noexcept {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 widen8(const float16* at) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
}

inline Index convert_vector_part(const bfloat16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen8(src + i));
  return i;
}

inline Index convert_vector_part(const float* src, float16* dst, Index n) noexcept {
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i quiet = _mm256_set1_epi32(0x7FC00000);
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = convert_ops::load(src + i);
    const __m256i canonical = _mm256_or_si256(_mm256_and_si256(u, sign), quiet);
    const __m256 x =
        _mm256_castsi256_ps(_mm256_blendv_epi8(u, canonical, convert_ops::nan_lanes(u)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

inline Index convert_vector_part(const float16* src, float* dst, Index n) noexcept {
  Index i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen8(src + i));
  return i;
}

inline Index convert_vector_part(const float* src, float8_e4m3* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E4M3Format, false>(src, dst, n);
}
inline Index convert_vector_part(const float* src, float8_e5m2* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E5M2Format, false>(src, dst, n);
}
inline Index convert_saturate_vector_part(const float* src, float8_e4m3* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E4M3Format, true>(src, dst, n);
}
inline Index convert_saturate_vector_part(const float* src, float8_e5m2* dst, Index n) noexcept {
  return convert_ops::float8_row<Float8E5M2Format, true>(src, dst, n);
}
inline Index convert_vector_part(const float8_e4m3* src, float* dst, Index n) noexcept {
  return convert_ops::float8_to_float_row<Float8E4M3Format>(src, dst, n);
}
inline Index convert_vector_part(const float8_e5m2* src, float* dst, Index n) noexcept {
  return convert_ops::float8_to_float_row<Float8E5M2Format>(src, dst, n);
}

// ---- the integer levels of a quantised KVCache's rows (generic/kv_load.inl) ----

/// The first multiple of 8 of n int8 values times `scale` as floats.
inline Index widen_int8_part(const std::int8_t* src, float* dst, Index n, float scale) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  Index i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s));
  }
  return i;
}

/// One int4 block (16 bytes: elements i and i + 16 in byte i, as q + 8) as the floats q
/// times `scale`.
inline bool widen_int4_block(const unsigned char* src, float* dst, float scale) noexcept {
  const __m256i low = _mm256_set1_epi32(0x0F), eight = _mm256_set1_epi32(8);
  const __m256 s = _mm256_set1_ps(scale);
  for (Index half = 0; half < 16; half += 8) {
    const __m256i w =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + half)));
    const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(w, low), eight);
    const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(w, 4), eight);
    _mm256_storeu_ps(dst + half, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), s));
    _mm256_storeu_ps(dst + 16 + half, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), s));
  }
  return true;
}

// ---- a decode step over int8 rows (generic/kv_load.inl) ----

#include "attn/kernels/avx2/int8_madd.inl"

// int8_key_scores_part(): avx2/int8_dispatch.inl (after the AVX-VNNI form it may call).

/// int4_key_scores() with vpmaddubsw (int4_key_scores_madd()).
inline bool int4_key_scores_part(const QuantizedQuery& q, const unsigned char* k, Index k_rs,
                                 const float* ks, Index ks_rs, Index group, Index n, float* st,
                                 Index ld, const KeyPrefetch& ahead) noexcept {
  return int4_key_scores_madd(q, k, k_rs, ks, ks_rs, group, n, st, ld, ahead);
}

/// The register block of the P V passes below: acc rows r0 .. r0 + 3 (row stride dv; rows past
/// `rows` repeat the last, computed and not stored), elements e0 .. e0 + 7 and e1 .. e1 + 7 +=
/// sum over keys j < n of weight(j, i) times key j's elements there, which widen(j, x) puts in
/// x[0] and x[1]: 8 accumulators in registers, each key's 4 weights broadcast, one pass over
/// the keys.
template <class Weight, class Widen>
inline void values_block(Index r0, Index rows, Index e0, Index e1, Index n, Index dv, float* acc,
                         Weight&& weight, Widen&& widen) noexcept {
  const Index nr = std::min<Index>(4, rows - r0);
  __m256 a[4][2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const Index r = std::min(r0 + i, rows - 1);  // a repeat past `rows`: not stored
    a[i][0] = _mm256_loadu_ps(acc + r * dv + e0);
    a[i][1] = _mm256_loadu_ps(acc + r * dv + e1);
  }
  for (Index j = 0; j < n; ++j) {
    __m256 x[2];
    widen(j, x);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256 wi = _mm256_set1_ps(weight(j, i));
      a[i][0] = _mm256_fmadd_ps(wi, x[0], a[i][0]);
      a[i][1] = _mm256_fmadd_ps(wi, x[1], a[i][1]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // (constant indices: a stays in registers)
    if (i < nr) {
      _mm256_storeu_ps(acc + (r0 + i) * dv + e0, a[i][0]);
      _mm256_storeu_ps(acc + (r0 + i) * dv + e1, a[i][1]);
    }
  }
}

/// acc rows r0 .. r0 + 3 (row stride dv; rows past `rows` weigh 0) += P V over n int8 value
/// rows (row j at v[j], its scale at vs[j][0]), P read transposed out of p^T (pt[j * ld + r]):
/// each row's scale folded into its weights (p * scale, one rounding), the bytes widened in
/// registers, products accumulated in float. 16 elements per pass (values_block()): 8 from
/// each half of the rows, so that the first pass over a tile's keys already asks for every
/// cache line of their rows (at hd 128 a row is two lines; passes over one half at a time left
/// the second lines' misses for the fifth pass, and the decode step read an int8 cache from
/// memory at 0.85x the speed of the halves paired: B 1 L 16384 and B 8 L 4096, AVX2, Zen 3;
/// software prefetches of the tile's rows did not recover it there). The same products in the
/// same order per element: the same bits. dv a multiple of 16 (int8_values_part() checks).
inline void int8_values_fma(const unsigned char* const* v, const float* const* vs, Index n,
                            Index dv, const float* pt, Index ld, Index rows, Index r0,
                            float* acc) noexcept {
  alignas(32) float w[kKeyBlock * 4];
  const Index nr = std::min<Index>(4, rows - r0);
  for (Index j = 0; j < n; ++j) {
    const float scale = vs[j][0];
    for (Index i = 0; i < 4; ++i) w[j * 4 + i] = i < nr ? pt[j * ld + r0 + i] * scale : 0.0f;
  }
  const Index half = dv / 2;
  for (Index e0 = 0; e0 < half; e0 += 8) {
    values_block(
        r0, rows, e0, e0 + half, n, dv, acc, [&](Index j, int i) { return w[j * 4 + i]; },
        [&](Index j, __m256* x) {
          const auto* row = v[j] + e0;
          x[0] = _mm256_cvtepi32_ps(
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row))));
          x[1] = _mm256_cvtepi32_ps(
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + half))));
        });
  }
}

/// acc rows r0 .. r0 + 3 (row stride dv; rows past `rows` weigh 0) += P V over n int4 value
/// rows (row j at v[j], its scales, one per `group` elements, at vs[j]), P read transposed out
/// of p^T (pt[j * ld + r]): each key's scale of a group folded into its weights (p * scale, one
/// rounding, once per group), each 8 bytes' low and high nibbles (elements i and i + 16 of a
/// block) widened in registers to their exact levels q = nibble - 8, products accumulated in
/// float (no float copy of the rows). 16 elements per pass (values_block()). dv a multiple of
/// 16 and every block under one scale (int4_values_part() checks). (The scales folded into the
/// weights, with no branch per row: 0.74x the instructions of scaling each level in registers,
/// the int4 decode's P V at hd 128.)
inline void int4_values_fma(const unsigned char* const* v, const float* const* vs, Index group,
                            Index n, Index dv, const float* pt, Index ld, Index rows, Index r0,
                            float* acc) noexcept {
  constexpr Index kBlockBytes = kInt4Block / 2;
  const __m256i low = _mm256_set1_epi32(0x0F), eight = _mm256_set1_epi32(8);
  alignas(32) float w[kKeyBlock * 4];
  const Index nr = std::min<Index>(4, rows - r0);
  for (Index e0 = 0, s = -1; e0 < dv;) {
    if (e0 / group != s) {  // the weights of this group: p * its scale per key
      s = e0 / group;
      for (Index j = 0; j < n; ++j) {
        const float scale = vs[j][s];
        for (Index i = 0; i < 4; ++i) w[j * 4 + i] = i < nr ? pt[j * ld + r0 + i] * scale : 0.0f;
      }
    }
    const Index offset = e0 / kInt4Block * kBlockBytes;
    const auto weight = [&](Index j, int i) { return w[j * 4 + i]; };
    if (e0 + kInt4Block <= dv) {  // a whole block: each 8 bytes' low and high nibbles
      for (Index c = 0; c < kBlockBytes; c += 8) {
        values_block(r0, rows, e0 + c, e0 + c + kBlockBytes, n, dv, acc, weight,
                     [&](Index j, __m256* x) {
                       const __m256i b = _mm256_cvtepu8_epi32(
                           _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v[j] + offset + c)));
                       x[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, low), eight));
                       x[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight));
                     });
      }
      e0 += kInt4Block;
    } else {  // the row's last 16 elements: the low nibbles of its last block's 16 bytes
      values_block(r0, rows, e0, e0 + 8, n, dv, acc, weight, [&](Index j, __m256* x) {
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {
          const __m256i b = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v[j] + offset + 8 * c)));
          x[c] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, low), eight));
        }
      });
      e0 += 16;
    }
  }
}

// int8_values_part(), int4_values_part(): avx2/int8_dispatch.inl (after the AVX-VNNI forms
// they may call).
