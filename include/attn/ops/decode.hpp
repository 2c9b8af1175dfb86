// SPDX-License-Identifier: MIT
// attn/ops/decode.hpp: the split-keys form of the streaming attention, for few queries over
// many keys (a decode step): which calls take it, the key chunks a call's tasks cover, and
// the merge of their partial softmax states in chunk order (attn/kernels/generic/
// key_chunks.inl holds the per-row merge).
#pragma once

#include <algorithm>
#include <limits>

#include "attn/config.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/kernels/head_mask.hpp"
#include "attn/ops/attention_call.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Decoding (T_q <= kSplitKeysQueries): the keys of each (batch, key/value head) are split
/// into chunks of kKeyChunk, fixed in the logical key index (never in the thread count), each
/// a task whose partial softmax state is merged in chunk order: bit-identical for any thread
/// count, and two threads share even one head's keys at B = 1.
inline constexpr Index kKeyChunk = 512;
inline constexpr Index kSplitKeysQueries = 8;

/// Whether a streaming call splits its keys: few queries, and no logsumexp wanted (a
/// chunk's partial state has no logsumexp of the whole row; a training forward never splits,
/// and its shapes are long anyway).
template <class Scalar>
bool splits_keys(const AttentionCall<Scalar>& call) noexcept {
  return !call.materialize && call.queries() <= kSplitKeysQueries &&
         call.args.lse.data() == nullptr;
}

/// The key chunks [first, first + count) that cover every key some query of the call sees
/// (the bounds are non-decreasing in the query index and the same for every head); count 1
/// when no query sees a key.
struct KeyChunks {
  Index first = 0, count = 1;
};

template <class Scalar>
KeyChunks key_chunks(const AttentionCall<Scalar>& call) noexcept {
  const Index tq = call.queries();
  Index lo = std::numeric_limits<Index>::max(), hi = 0;
  for (Index b = 0; b < call.batch(); ++b) {
    const HeadMask<Scalar> m = call.head_mask(b, 0);
    const Index end = m.row_end(tq - 1), begin = m.row_begin(0);
    if (end > begin) lo = std::min(lo, begin), hi = std::max(hi, end);
  }
  KeyChunks chunks;
  if (hi > 0) {
    chunks.first = lo / kKeyChunk;
    chunks.count = (hi + kKeyChunk - 1) / kKeyChunk - chunks.first;
  }
  return chunks;
}

}  // namespace detail
ATTN_NAMESPACE_END
