// SPDX-License-Identifier: MIT
// attn/kernels/prefetch.hpp: what a decode pass over stored keys and values asks the memory for
// ahead of its reads (software prefetches): the plan of a pass (KeyPrefetch, key_prefetch()),
// its requests key by key (KeyRequests, prefetch_for_key()) and the one request every pass
// goes through (prefetch_line(), which the optimiser keeps).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attn/config.hpp"
#include "attn/kernels/kv_storage.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// How far ahead of the key it scores a pass asks for a key row, at least (KeyPrefetch::keys):
/// about 300-600 ns of scoring ahead at hd 128. The hardware prefetcher alone left an int8
/// decode step from memory waiting on its rows (the step 1.25-1.35x slower without these
/// requests at B 1 L 16384 on Zen 3); 8, 16 and 32 keys measured alike, within that machine's
/// noise.
inline constexpr Index kKeysAhead = 16;

/// What a score pass over stored keys asks the memory for while it runs (software prefetches,
/// spread a few lines per key: KeyRequests, below): the first k_bytes of the key row `keys`
/// keys ahead of the key it scores, and the first v_bytes of the value row of each key it
/// scores (row j at v + j * v_rs; v null: none), which the value pass reads next; and the
/// rows' scales, where they have them (key j's at ks + j * ks_rs, value j's at vs + j * vs_rs,
/// strides in bytes; null: none). A paged cache's run of rows ends inside a pass: keys j >=
/// split ask for key j + keys's row at k_alt + j * k_rs and its scales at ks_alt + j * ks_rs
/// (the rows that follow the run in the block table; wrapping arithmetic). Empty: nothing
/// asked for (a set without these requests ignores the plan).
struct KeyPrefetch {
  Index keys = kKeysAhead;  // keys_ahead() in a plan of key_prefetch()
  Index k_bytes = 0;
  const unsigned char* v = nullptr;
  Index v_rs = 0, v_bytes = 0;
  const unsigned char* ks = nullptr;
  const unsigned char* vs = nullptr;
  Index ks_rs = 0, vs_rs = 0;
  Index split = std::numeric_limits<Index>::max();
  std::uintptr_t k_alt = 0, ks_alt = 0;
};

/// The key bytes a pass asks for ahead of the key it scores, at least kKeysAhead rows
/// (keys_ahead()): 32 keys of int4 rows at hd 128 (64 bytes), 16 of every longer row. Measured
/// on Zen 5 (the same decode step both ways in one process, alternated, B 8 from memory,
/// median ratios): int4 rows 24 to 96 keys ahead instead of 16 took 0.95-0.96x the time at
/// L 8192 and 32768, over a paged cache as over a contiguous one; int8 rows (128 bytes) 32 keys
/// 0.985x contiguous but 1.03x paged, 48 keys 1.045x; float rows (512 bytes) 24 to 48 keys
/// 1.00-1.02x. Short rows need more keys in flight, not more bytes.
inline constexpr Index kBytesAhead = 2048;

/// How many keys ahead a pass over rows of `row_bytes` asks for a key row: kBytesAhead of rows,
/// and at least kKeysAhead.
inline constexpr Index keys_ahead(Index row_bytes) noexcept {
  return row_bytes > 0 ? std::max(kKeysAhead, kBytesAhead / row_bytes) : kKeysAhead;
}

/// Asks for the line holding `address` (an integer address: it may lie in memory the caller
/// does not read; a prefetch never faults) to be brought into the cache. Every software
/// prefetch of a decode pass goes through here. The empty volatile asm (it emits nothing) keeps
/// the request: GCC 12 takes an inline function whose only effect is __builtin_prefetch for one
/// without effects and may delete its calls: several passes asked for nothing (the widening
/// pass over stored rows in every kernel set, the int8 scores on AVX-512 CPUs without VNNI, a
/// tile's rows asked for at once), and tests/codegen/prefetch_kept.cpp checks that they ask.
inline void prefetch_line(std::uintptr_t address) noexcept {
#if defined(__GNUC__)
  __builtin_prefetch(reinterpret_cast<const void*>(address), 0, 3);
  __asm__ volatile("");
#else
  static_cast<void>(address);
#endif
}

/// Asks for the 64-byte lines of `bytes` bytes from `address` (prefetch_line()).
/// The first line asked for ahead of the loop: rows of at most 64 bytes (int4 keys and values
/// at hd 128) then test the count once and run no loop (the int4 step 0.96x the time in cache,
/// B 1 L 2048 on Zen 5, with these requests made for each key; the int8 step 0.98x).
inline void prefetch_lines(std::uintptr_t address, Index bytes) noexcept {
  if (bytes <= 0) return;
  prefetch_line(address);
  for (Index o = 64; o < bytes; o += 64) prefetch_line(address + static_cast<std::uintptr_t>(o));
}

/// The requests of a KeyPrefetch plan for one pass over the key rows at k (row stride k_rs),
/// its addresses and line counts worked out once:
///  - requests(j), for each key j the pass scores: key j + keys's row and key j's value
///    row, a few lines per key. Spread so, not bunched: a whole tile's value rows asked for at
///    once were measured no faster than none on Zen 3 (presumably dropped once the core's
///    misses in flight fill its buffers); on Zen 5 a tile's value rows and scales asked for
///    at once as well took 1.05x the int8 step's time in cache (B 1 L 2048), and a paged
///    cache's next tile of keys 1.08x (int4) and 1.12x (int8) from memory (B 8 L 8192);
///  - requests.scales(j), once per 4 keys j .. j + 3 (a line for up to 4 scales a row): the
///    scales of those keys `keys` ahead and of those values. Without, the value pass over
///    an int4 cache from memory waited on its scales (a quarter of its time; the int4 step
///    took 0.84x the time with these requests, B 8 L 8192 on Zen 5).
/// The rows ahead may lie past the pass; a paged run's rows ahead past its end are asked for
/// where the block table puts them (KeyPrefetch::split, k_alt). The integer score passes and the
/// widening passes bind one KeyRequests before their loops (asked key by key from the plan, its
/// fields were reloaded for each key); the float score passes ask through prefetch_for_key()
/// (below).
class KeyRequests {
 public:
  KeyRequests(const KeyPrefetch& ahead, const unsigned char* k, Index k_rs) noexcept
      : k_(address(k, ahead.keys * k_rs)),
        k_rs_(static_cast<std::uintptr_t>(k_rs)),
        k_bytes_(ahead.k_bytes),
        v_(address(ahead.v, 0)),
        v_rs_(static_cast<std::uintptr_t>(ahead.v_rs)),
        v_bytes_(ahead.v != nullptr ? ahead.v_bytes : 0),
        ks_(address(ahead.ks, ahead.keys * ahead.ks_rs)),
        ks_rs_(static_cast<std::uintptr_t>(ahead.ks_rs)),
        vs_(address(ahead.vs, 0)),
        vs_rs_(static_cast<std::uintptr_t>(ahead.vs_rs)),
        split_(ahead.split),
        k_alt_(ahead.k_alt),
        ks_alt_(ahead.ks_alt) {}

  void operator()(Index j) const noexcept {
    const auto at = static_cast<std::uintptr_t>(j);
    prefetch_lines((j < split_ ? k_ : k_alt_) + at * k_rs_, k_bytes_);
    prefetch_lines(v_ + at * v_rs_, v_bytes_);
  }

  void scales(Index j) const noexcept {
    const auto at = static_cast<std::uintptr_t>(j);
    if (ks_ != 0) prefetch_lines((j < split_ ? ks_ : ks_alt_) + at * ks_rs_, Index(4 * ks_rs_));
    if (vs_ != 0) prefetch_lines(vs_ + at * vs_rs_, Index(4 * vs_rs_));
  }

 private:
  static std::uintptr_t address(const unsigned char* p, Index offset) noexcept {
    return p == nullptr ? 0
                        : reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(offset);
  }
  std::uintptr_t k_, k_rs_;
  Index k_bytes_;
  std::uintptr_t v_, v_rs_;
  Index v_bytes_;
  std::uintptr_t ks_, ks_rs_, vs_, vs_rs_;
  Index split_;
  std::uintptr_t k_alt_, ks_alt_;
};

/// KeyRequests's row requests for key j of a pass over the key rows at k (row stride k_rs),
/// reading the plan key by key: for the float passes (decode_rows.inl, bf16_rows.inl), whose
/// tiles of accumulators leave no registers for a bound KeyRequests (bound, the decode step
/// over a bfloat16 cache took 1.10x the time, over a float cache 1.05x, from memory at B 8
/// L 8192 on Zen 5).
inline void prefetch_for_key(const KeyPrefetch& ahead, const unsigned char* k, Index k_rs,
                             Index j) noexcept {
  prefetch_lines((j < ahead.split ? reinterpret_cast<std::uintptr_t>(k) +
                                        static_cast<std::uintptr_t>(ahead.keys * k_rs)
                                  : ahead.k_alt) +
                     static_cast<std::uintptr_t>(j * k_rs),
                 ahead.k_bytes);
  if (ahead.v != nullptr) {
    prefetch_lines(reinterpret_cast<std::uintptr_t>(ahead.v + j * ahead.v_rs), ahead.v_bytes);
  }
}

/// The plan for a score pass over a run of `run` stored keys from slot `slot` of item b, head h
/// of `keys` (width d), `rest` keys of the pass from that slot on (the run's and the runs after
/// it), with `values` (width dv; null: no value rows asked for); rows of the Scalar kind are
/// `scalar` bytes an element (a paged float cache's: 4). A paged run's rows ahead past its end
/// are asked for in the rows that follow it in the block table (the pass's next run, or the
/// next tile's first block).
inline KeyPrefetch key_prefetch(const StoredRows& keys, const StoredRows* values, Index b, Index h,
                                Index slot, Index run, Index rest, Index d, Index dv,
                                Index scalar = 1) noexcept {
  const auto bytes = [scalar](KVElement e, Index width) {
    return e == KVElement::kScalar ? width * scalar : stored_row_bytes(e, width);
  };
  KeyPrefetch ahead;
  ahead.k_bytes = bytes(keys.element, d);
  ahead.keys = keys_ahead(ahead.k_bytes);
  if (keys.scales != nullptr) {
    ahead.ks = reinterpret_cast<const unsigned char*>(keys.scales_of(b, h, slot));
    ahead.ks_rs = keys.scale_row_stride * Index(sizeof(float));
  }
  // Past the run's end: the rows that follow it in the block table, when the table has an
  // entry for them (the pass's next run, the next tile's first block; past the sequence,
  // block 0: a request for nothing useful). Those rows are one run of neighbouring blocks
  // for as far as the requests reach only when the table says so: otherwise (a fragmented
  // pool) the plan asks kKeysAhead keys ahead, the next block's rows (with blocks of 16).
  if (keys.table != nullptr && (run < rest || (slot + run) / keys.block_rows < keys.table_stride)) {
    const Index* table = keys.table + b * keys.table_stride;
    Index block = (slot + run) / keys.block_rows;
    Index following = keys.block_rows - (slot + run) % keys.block_rows;
    while (following < ahead.keys && block + 1 < keys.table_stride &&
           table[block + 1] == table[block] + 1) {
      ++block, following += keys.block_rows;
    }
    ahead.keys = std::min(ahead.keys, std::max(kKeysAhead, following));
    // Key j + keys >= run: row (or scales) j + keys - run of the next rows.
    const auto back = static_cast<std::uintptr_t>(ahead.keys - run);
    ahead.split = run - ahead.keys;
    ahead.k_alt = reinterpret_cast<std::uintptr_t>(keys.row(b, h, slot + run)) +
                  back * static_cast<std::uintptr_t>(keys.row_stride);
    if (keys.scales != nullptr) {
      ahead.ks_alt = reinterpret_cast<std::uintptr_t>(keys.scales_of(b, h, slot + run)) +
                     back * static_cast<std::uintptr_t>(ahead.ks_rs);
    }
  }
  if (values != nullptr) {
    ahead.v = values->row(b, h, slot);
    ahead.v_rs = values->row_stride;
    ahead.v_bytes = bytes(values->element, dv);
    if (values->scales != nullptr) {
      ahead.vs = reinterpret_cast<const unsigned char*>(values->scales_of(b, h, slot));
      ahead.vs_rs = values->scale_row_stride * Index(sizeof(float));
    }
  }
  return ahead;
}

}  // namespace detail
ATTN_NAMESPACE_END
