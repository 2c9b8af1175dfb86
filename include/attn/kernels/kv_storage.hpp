// SPDX-License-Identifier: MIT
// attn/kernels/kv_storage.hpp: the element types a KVCache may store its keys and values in,
// the one quantisation rule of each (applied when the cache appends), and the descriptor the
// attention kernels read stored rows through (dequantised in the kernel's loops,
// attn/kernels/generic/kv_load.inl).
// Glossary: hd = a row's width (the key or value head dim).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attn/config.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

/// What a KVCache stores its keys and values as. Every kind but kScalar is dequantised to
/// the cache's Scalar inside the attention kernel, row by row, as the kernel reads it.
///  - kScalar: the cache's Scalar (float or double), exact;
///  - kBFloat16, kFloat16: one rounding to nearest even, no scale;
///  - kFloat8E4M3, kFloat8E5M2: with a scale (KVCacheOptions::float8_scale, the default), one
///    float per token and head, s = max|x| / (the format's largest finite value), x / s
///    rounded to the format; without one, x itself, saturated at the format's largest value;
///  - kInt8: symmetric, one float scale per token and head (as ONNX Runtime's and OpenVINO's
///    int8 KV caches): s = max|x| / 127, q = round(x / s) in [-127, 127], x ~ q s;
///  - kInt4: symmetric, q = round(x / s) in [-7, 7], two per byte, one float scale per group
///    of KVCacheOptions::int4_group elements of a row (32 by default; 0: one per token and
///    head).
enum class KVElement : std::uint8_t {
  kScalar,
  kBFloat16,
  kFloat16,
  kFloat8E4M3,
  kFloat8E5M2,
  kInt8,
  kInt4,
};

/// The element kind's name, as error messages and benchmarks print it.
inline const char* kv_element_name(KVElement e) noexcept {
  switch (e) {
    case KVElement::kScalar:
      return "scalar";
    case KVElement::kBFloat16:
      return "bf16";
    case KVElement::kFloat16:
      return "fp16";
    case KVElement::kFloat8E4M3:
      return "fp8e4m3";
    case KVElement::kFloat8E5M2:
      return "fp8e5m2";
    case KVElement::kInt8:
      return "int8";
    case KVElement::kInt4:
      return "int4";
  }
  return "?";
}

namespace detail {

/// int4 rows are stored in blocks of kInt4Block elements, 16 bytes each: byte i of a block
/// holds element i (low nibble) and element i + 16 (high nibble), as q + 8. A vector of
/// bytes then widens into two runs of consecutive elements, with no interleaving.
inline constexpr Index kInt4Block = 32;

/// Bytes of one stored row of `width` elements of kind e (not kScalar).
inline Index stored_row_bytes(KVElement e, Index width) noexcept {
  switch (e) {
    case KVElement::kBFloat16:
    case KVElement::kFloat16:
      return 2 * width;
    case KVElement::kInt4:
      return (width + kInt4Block - 1) / kInt4Block * (kInt4Block / 2);
    default:
      return width;
  }
}

/// Stored rows of keys or values of kind `element`, as the kernels read them: the row of
/// item b, key/value head h, slot s starts at row(b, h, s); its scales (null: none) at
/// scales_of(b, h, s), one per `group` elements. Addressing is in these two members only.
/// Paged rows (a PagedKVCache; `table` not null): slot s of item b lives in row s %
/// block_rows of block table[b * table_stride + s / block_rows], a block addressed as an item
/// (item_stride and scale_item_stride are a block's). kScalar rows are read only when paged
/// (a contiguous Scalar cache is read in place through AttentionArgs::k and v).
struct StoredRows {
  KVElement element = KVElement::kScalar;
  const unsigned char* data = nullptr;
  Index item_stride = 0, head_stride = 0, row_stride = 0;  // bytes
  const float* scales = nullptr;
  Index scale_item_stride = 0, scale_head_stride = 0, scale_row_stride = 0;  // floats
  Index group = 1;                                                           // elements per scale
  const Index* table = nullptr;  // paged: per item, its blocks in position order
  Index table_stride = 0, block_rows = 1;

  /// (item, slot) -> (block, row in the block) when paged; unchanged otherwise.
  void locate(Index& b, Index& s) const noexcept {
    if (table == nullptr) return;
    b = table[b * table_stride + s / block_rows];
    s %= block_rows;
  }
  const unsigned char* row(Index b, Index h, Index s) const noexcept {
    locate(b, s);
    return data + b * item_stride + h * head_stride + s * row_stride;
  }
  const float* scales_of(Index b, Index h, Index s) const noexcept {
    if (scales == nullptr) return nullptr;
    locate(b, s);
    return scales + b * scale_item_stride + h * scale_head_stride + s * scale_row_stride;
  }
};

/// The keys and values of an attention call when they are stored rows (a quantised KVCache,
/// or a PagedKVCache of any element type): the kernels read these instead of
/// AttentionArgs::k and v, whose shapes still describe them. Inactive (element kScalar, no
/// block table): k and v are read.
struct StoredKeyValues {
  StoredRows k, v;
  bool active() const noexcept { return k.element != KVElement::kScalar || k.table != nullptr; }
};

/// Query rows quantised for integer dot products with int8 keys (the streaming kernel's
/// decode path over an int8 cache): row r's `width` levels at q + r * ld (int8 in [-127, 127]
/// by quantize_row()'s int8 rule, zero from width to ld, ld a multiple of 64), their sum
/// sums[r], and scales[r] = the row's quantisation scale times the softmax scale. Rows past
/// `rows`, to a multiple of 4, repeat the last row (kernels may compute them and ignore them).
struct QuantizedQuery {
  const std::int8_t* q = nullptr;
  Index ld = 0;
  const std::int32_t* sums = nullptr;
  const float* scales = nullptr;
  Index rows = 0, width = 0;
};

/// Bytes of a quantised query row of `width` elements (QuantizedQuery::ld).
inline constexpr Index quantized_query_ld(Index width) noexcept { return (width + 63) / 64 * 64; }

/// Scales per stored row of `width` elements of kind e: one for int8 and scaled float8, one
/// per `int4_group` elements (0: the row) for int4, none otherwise.
inline Index stored_row_scales(KVElement e, Index width, bool float8_scale,
                               Index int4_group) noexcept {
  switch (e) {
    case KVElement::kInt8:
      return 1;
    case KVElement::kFloat8E4M3:
    case KVElement::kFloat8E5M2:
      return float8_scale ? 1 : 0;
    case KVElement::kInt4: {
      const Index g = int4_group > 0 ? int4_group : width;
      return (width + g - 1) / g;
    }
    default:
      return 0;
  }
}

/// The largest finite magnitude of a float8 kind.
inline float float8_max(KVElement e) noexcept {
  return e == KVElement::kFloat8E4M3 ? 448.0f : 57344.0f;
}

/// x rounded to the nearest integer, ties to even, for |x| <= 2^22 (the int8 and int4 levels
/// before their conversion): std::nearbyint's value in the default rounding mode, as two adds
/// the compiler can vectorise (std::nearbyint is a library call per element without
/// -fno-trapping-math: most of the time of a decode step's query quantisation).
inline float round_to_level(float x) noexcept {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: the sum's ulp is 1
  return (x + kMagic) - kMagic;
}

/// Stores `width` elements of x (stride `stride`) as kind e into `to` (stored_row_bytes(e,
/// width) bytes) and, for the scaled kinds, their scales (one per `group` elements). The one
/// quantisation rule of every kind (see KVElement); a zero row gets scale 0. Finite inputs.
template <class Scalar>
void quantize_row(KVElement e, const Scalar* x, Index stride, Index width, Index group,
                  unsigned char* to, float* scales) noexcept {
  const auto at = [&](Index i) { return static_cast<float>(x[i * stride]); };
  const auto absmax = [&](Index i0, Index i1) {
    float top = 0.0f;
    for (Index i = i0; i < i1; ++i) top = std::max(top, std::fabs(at(i)));
    return top;
  };
  switch (e) {
    case KVElement::kBFloat16:
      for (Index i = 0; i < width; ++i) {
        const bfloat16 y = convert_element<bfloat16>(x[i * stride]);
        std::memcpy(to + 2 * i, &y, 2);
      }
      return;
    case KVElement::kFloat16:
      for (Index i = 0; i < width; ++i) {
        const float16 y = convert_element<float16>(x[i * stride]);
        std::memcpy(to + 2 * i, &y, 2);
      }
      return;
    case KVElement::kFloat8E4M3:
    case KVElement::kFloat8E5M2: {
      float inv = 1.0f;
      if (scales != nullptr) {
        const float top = absmax(0, width);
        scales[0] = top / float8_max(e);
        inv = top > 0.0f ? float8_max(e) / top : 0.0f;
      }
      for (Index i = 0; i < width; ++i) {
        const float y = at(i) * inv;
        to[i] = e == KVElement::kFloat8E4M3 ? saturate_element<float8_e4m3>(y).bits()
                                            : saturate_element<float8_e5m2>(y).bits();
      }
      return;
    }
    case KVElement::kInt8: {
      const float top = absmax(0, width);
      scales[0] = top / 127.0f;
      const float inv = top > 0.0f ? 127.0f / top : 0.0f;
      for (Index i = 0; i < width; ++i) {
        const float q = round_to_level(std::clamp(at(i) * inv, -127.0f, 127.0f));
        to[i] = static_cast<unsigned char>(static_cast<std::int8_t>(q));
      }
      return;
    }
    case KVElement::kInt4: {
      const Index blocks = (width + kInt4Block - 1) / kInt4Block;
      std::memset(to, 0x88, static_cast<std::size_t>(blocks * (kInt4Block / 2)));  // q = 0
      const Index g = group > 0 ? group : width;
      for (Index i0 = 0, n = 0; i0 < width; i0 += g, ++n) {
        const Index i1 = std::min(width, i0 + g);
        const float top = absmax(i0, i1);
        scales[n] = top / 7.0f;
        const float inv = top > 0.0f ? 7.0f / top : 0.0f;
        for (Index i = i0; i < i1; ++i) {
          const float q = round_to_level(std::clamp(at(i) * inv, -7.0f, 7.0f));
          const auto nibble = static_cast<unsigned>(static_cast<int>(q) + 8);
          unsigned char& byte = to[i / kInt4Block * (kInt4Block / 2) + i % (kInt4Block / 2)];
          byte = i % kInt4Block < kInt4Block / 2
                     ? static_cast<unsigned char>((byte & 0xF0u) | nibble)
                     : static_cast<unsigned char>((byte & 0x0Fu) | (nibble << 4));
        }
      }
      return;
    }
    case KVElement::kScalar:
      return;
  }
}

/// The values a stored row of `width` elements of kind e holds (the inverse of quantize_row,
/// in float; scales: one per `group` elements, or null), into x. The reference the kernels'
/// loader (attn/kernels/generic/kv_load.inl) gives the same values as.
inline void dequantize_row(KVElement e, const unsigned char* row, const float* scales, Index group,
                           Index width, float* x) noexcept {
  // One switch per row and one scale per group, the element loop inside (a switch and a
  // division per element made a sink cache's reads, which dequantise S + W rows per token,
  // 8x slower for int8).
  const auto each = [&](auto&& element) {
    if (scales == nullptr) {
      for (Index i = 0; i < width; ++i) x[i] = element(i);
      return;
    }
    for (Index g0 = 0; g0 < width; g0 += group) {
      const float scale = scales[g0 / group];
      for (Index i = g0; i < std::min(width, g0 + group); ++i) x[i] = element(i) * scale;
    }
  };
  switch (e) {
    case KVElement::kBFloat16:
      each([&](Index i) {
        bfloat16 y;
        std::memcpy(&y, row + 2 * i, 2);
        return static_cast<float>(y);
      });
      return;
    case KVElement::kFloat16:
      each([&](Index i) {
        float16 y;
        std::memcpy(&y, row + 2 * i, 2);
        return static_cast<float>(y);
      });
      return;
    case KVElement::kFloat8E4M3:
      each([&](Index i) { return static_cast<float>(float8_e4m3::from_bits(row[i])); });
      return;
    case KVElement::kFloat8E5M2:
      each([&](Index i) { return static_cast<float>(float8_e5m2::from_bits(row[i])); });
      return;
    case KVElement::kInt8:
      each([&](Index i) { return static_cast<float>(static_cast<std::int8_t>(row[i])); });
      return;
    case KVElement::kInt4:
      each([&](Index i) {
        const unsigned char byte = row[i / kInt4Block * (kInt4Block / 2) + i % (kInt4Block / 2)];
        const unsigned nibble = i % kInt4Block < kInt4Block / 2 ? byte & 0x0Fu : byte >> 4;
        return static_cast<float>(static_cast<int>(nibble) - 8);
      });
      return;
    case KVElement::kScalar:
      each([](Index) { return 0.0f; });
      return;
  }
}

/// A stored row of `width` elements as Scalars at `to`: copied when the rows are Scalars
/// (KVElement::kScalar), else dequantised through `wide` (room for `width` floats).
template <class Scalar>
void stored_row_to(KVElement e, const unsigned char* row, const float* scales, Index group,
                   Index width, Scalar* to, float* wide) noexcept {
  if (e == KVElement::kScalar) {
    std::copy_n(reinterpret_cast<const Scalar*>(row), width, to);
    return;
  }
  dequantize_row(e, row, scales, group, width, wide);
  for (Index i = 0; i < width; ++i) to[i] = static_cast<Scalar>(wide[i]);
}

}  // namespace detail
ATTN_NAMESPACE_END
