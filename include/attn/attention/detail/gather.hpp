// SPDX-License-Identifier: MIT
// attn/attention/detail/gather.hpp: gather_in_place, items[b] = items[src[b]] for every b at
// once, in place and without allocation (KVCache::reorder for beam search).
#pragma once

#include <algorithm>

#include "attn/config.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Makes item b a copy of the old item src(b) for every b in [0, n) (n = src's extent;
/// entries in range, repeats allowed), through copy(from, to) and swap(a, b) of whole items,
/// with `scratch` (2 n Index) as the only extra memory.
///
/// The map b -> src(b) is a set of cycles with trees hanging off them. 1: an item nobody
/// still reads from (a leaf) can be overwritten at once; filling it may free its source, so
/// this repeats until only cycles are left, each item read by exactly one other. 2: a cycle
/// b0 <- b1 <- ... <- b_{L-1} <- b0 (b_{i+1} = src(b_i)) is L - 1 swaps along it: swapping
/// b_i with b_{i+1} gives b_i its final contents and carries b0's old contents onwards, to
/// b_{L-1} at the end. Each item is written once in step 1 or swapped at most twice in step 2.
template <class Copy, class Swap>
void gather_in_place(TensorView<const Index, 1> src, Index* scratch, Copy&& copy, Swap&& swap) {
  const Index n = src.extent(0);
  Index* readers = scratch;   // readers[j]: items b != j still to be filled from j
  Index* done = scratch + n;  // done[b]: b holds its final contents
  std::fill_n(readers, n, Index(0));
  for (Index b = 0; b < n; ++b) {
    done[b] = src(b) == b;
    if (!done[b]) ++readers[src(b)];
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (Index b = 0; b < n; ++b) {
      if (done[b] || readers[b] != 0) continue;
      copy(src(b), b);  // src(b) is unchanged: b still read from it
      done[b] = 1;
      --readers[src(b)];
      progress = true;
    }
  }
  for (Index b0 = 0; b0 < n; ++b0) {
    if (done[b0]) continue;
    Index b = b0;
    for (; src(b) != b0; b = src(b)) {
      swap(b, src(b));
      done[b] = 1;
    }
    done[b] = 1;
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
