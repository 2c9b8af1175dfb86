// SPDX-License-Identifier: MIT
// attn/attention/detail/kv_rows.hpp: the stored rows of both key/value caches (KVCache,
// PagedKVCache): a row's bytes and scales, the bytes of a token, and the rows read back as
// the cache's Scalar. `Options` is either cache's options (element, float8_scale, int4_group,
// num_kv_heads, head_dim, value_head_dim).
// Glossary: H_kv = key/value heads, hd / hd_v = key / value head dim.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/kernels/kv_storage.hpp"
#include "attn/memory.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Elements per scale of a row of `width`: int4_group for kInt4 (0: the row), else the row.
template <class Options>
Index kv_group(const Options& o, Index width) noexcept {
  return o.element == KVElement::kInt4 && o.int4_group > 0 ? o.int4_group : width;
}

/// Scales per row of `width` elements (stored_row_scales()).
template <class Options>
Index kv_row_scales(const Options& o, Index width) noexcept {
  return stored_row_scales(o.element, width, o.float8_scale, o.int4_group);
}

/// A row's data bytes (Scalar or stored), unpadded: `row` false on overflow.
template <class Scalar, class Options>
bool kv_row_data_bytes(const Options& o, Index width, Index& row) noexcept {
  if (o.element == KVElement::kScalar) {
    return checked_mul(width, static_cast<Index>(sizeof(Scalar)), row);
  }
  if (width > std::numeric_limits<Index>::max() / 4) return false;
  row = stored_row_bytes(o.element, width);
  return true;
}

/// A row's bytes, padded to 64 when that costs at most 1/16 of it; false on overflow.
template <class Scalar, class Options>
bool kv_row_bytes(const Options& o, Index width, Index& row) noexcept {
  const Index line = static_cast<Index>(kAlignment);
  Index raw = 0, padded = 0;
  if (!kv_row_data_bytes<Scalar>(o, width, raw) || !checked_add(raw, line - 1, padded)) {
    return false;
  }
  padded = padded / line * line;
  row = 16 * (padded - raw) <= raw ? padded : raw;  // padded - raw < 64: no overflow
  return true;
}

/// The bytes one position takes over all its heads, keys and values with their scales
/// (k_scales, v_scales per row), without padding: what a decode step reads per cached token.
/// The sizes were checked when the cache was built.
template <class Scalar, class Options>
std::size_t kv_bytes_per_token(const Options& o, Index k_scales, Index v_scales) noexcept {
  const auto row = [&](Index width, Index scales) {
    Index data = 0;
    kv_row_data_bytes<Scalar>(o, width, data);
    return static_cast<std::size_t>(data + scales * static_cast<Index>(sizeof(float)));
  };
  return static_cast<std::size_t>(o.num_kv_heads) *
         (row(o.head_dim, k_scales) + row(o.value_head_dim, v_scales));
}

/// A cache's dequantize(): n positions of keys into k_out (H_kv, n, hd) and of values into
/// v_out (H_kv, n, hd_v) as Scalar, dequantised for stored rows, copied otherwise.
/// rows(part, h, j) gives position j's row of key (part 0) or value (part 1) head h and its
/// scales, as a pair; a null row (released) gives zeros.
/// @throws ShapeError unless k_out and v_out have those shapes.
template <class Scalar, class Options, class Rows>
void dequantize_rows(const char* where, const Options& o, Index n, TensorView<Scalar, 3> k_out,
                     TensorView<Scalar, 3> v_out, const Rows& rows) {
  const Shape<3> k_shape{o.num_kv_heads, n, o.head_dim};
  const Shape<3> v_shape{o.num_kv_heads, n, o.value_head_dim};
  require(k_out.shape() == k_shape && v_out.shape() == v_shape, where, [&] {
    return "k_out " + to_string(k_out.shape()) + " and v_out " + to_string(v_out.shape()) +
           ": expected " + to_string(k_shape) + " and " + to_string(v_shape);
  });
  const Index widest = std::max(o.head_dim, o.value_head_dim);
  std::vector<float> wide(static_cast<std::size_t>(widest));
  std::vector<Scalar> row(static_cast<std::size_t>(widest));
  for (int part = 0; part < 2; ++part) {
    const TensorView<Scalar, 3>& to = part == 0 ? k_out : v_out;
    const Index width = part == 0 ? o.head_dim : o.value_head_dim;
    for (Index h = 0; h < o.num_kv_heads; ++h) {
      for (Index j = 0; j < n; ++j) {
        const std::pair<const unsigned char*, const float*> at = rows(part, h, j);
        if (at.first == nullptr) {
          for (Index e = 0; e < width; ++e) to(h, j, e) = Scalar(0);
          continue;
        }
        stored_row_to(o.element, at.first, at.second, kv_group(o, width), width, row.data(),
                      wide.data());
        for (Index e = 0; e < width; ++e) to(h, j, e) = row[static_cast<std::size_t>(e)];
      }
    }
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
