// SPDX-License-Identifier: MIT
// attn/kernels/head_mask.hpp: the mask of one (batch, head) as the attention kernels read it:
// loop bounds and pointers to the element-wise parts.
#pragma once

#include <algorithm>
#include <limits>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The mask of one (batch, head), resolved to pointers and per-row visible bounds: row i
/// sees keys j in [row_begin(i), row_end(i)) that the element-wise parts do not hide.
template <class Scalar>
struct HeadMask {
  Index key_limit = 0;  // keys j >= key_limit are invisible (lengths, T_k)
  Index key_first = 0;  // keys j < key_first are invisible (a ring's overwritten positions)
  bool causal = false;
  Index causal_offset = 0;  // row i sees j <= i + causal_offset
  Index window = 0;         // with causal: row i sees j > i + causal_offset - window (0: none)
  const bool* bool_row0 = nullptr;
  Index bool_rs = 0, bool_cs = 0;
  bool bool_allows = false;
  const bool* pad = nullptr;  // key padding, true = blocked
  Index pad_cs = 0;
  const Scalar* add_row0 = nullptr;
  Index add_rs = 0, add_cs = 0;
  Index position = 0;  // query i sits at key position i + position (ALiBi's distances)

  /// One past the last key row i may see (the loop bound).
  Index row_end(Index i) const noexcept {
    Index end = key_limit;
    if (causal) end = std::min(end, i + causal_offset + 1);
    return std::max<Index>(end, 0);
  }
  /// The first key row i may see (a sliding window's lower bound).
  Index row_begin(Index i) const noexcept {
    Index begin = key_first;
    if (causal && window > 0) begin = std::max(begin, i + causal_offset - window + 1);
    return std::max<Index>(begin, 0);
  }
  bool elementwise() const noexcept {
    return bool_row0 != nullptr || pad != nullptr || add_row0 != nullptr;
  }
  /// Whether the element-wise parts hide key j from row i: a blocked boolean entry, key
  /// padding, or an additive -inf.
  bool hides(Index i, Index j) const noexcept {
    return (bool_row0 != nullptr && bool_row0[i * bool_rs + j * bool_cs] != bool_allows) ||
           (pad != nullptr && pad[j * pad_cs]) ||
           (add_row0 != nullptr &&
            add_row0[i * add_rs + j * add_cs] == -std::numeric_limits<Scalar>::infinity());
  }
  /// Whether row i sees key j: inside the loop bounds and not hidden.
  bool sees(Index i, Index j) const noexcept {
    return j < row_end(i) && j >= row_begin(i) && !hides(i, j);
  }
  /// Applies the element-wise parts to scores s[0..n) of row i, columns j0..j0+n: a hidden
  /// score becomes -inf (whatever it was: a NaN score the row cannot see must not reach it),
  /// the additive mask is added to the others. Returns how many it left visible.
  Index apply(Index i, Index j0, Scalar* s, Index n) const noexcept {
    constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
    Index visible = 0;
    for (Index j = 0; j < n; ++j) {
      if (hides(i, j0 + j)) {
        s[j] = kNegInf;
      } else {
        if (add_row0 != nullptr) s[j] += add_row0[i * add_rs + (j0 + j) * add_cs];
        ++visible;
      }
    }
    return visible;
  }
};

}  // namespace detail
ATTN_NAMESPACE_END
