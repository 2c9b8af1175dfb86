// SPDX-License-Identifier: MIT
// attn/attention/paged_kv_cache.hpp: PagedKVCache, the keys and values of one attention layer
// for many sequences, in fixed-size blocks from one pool (as vLLM's PagedAttention): each
// sequence owns a block table, blocks are shared copy-on-write between forks (beam search,
// shared prompt prefixes), and the attention kernel reads the rows through the tables.
// Glossary: H_kv = key/value heads, hd = head dim, hd_v = value head dim, N = blocks in the
// pool, S = tokens per block, T = new tokens, L = a sequence's length.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attention/kv_cache.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/kernels/kv_storage.hpp"
#include "attn/memory.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

/// Configuration of a PagedKVCache.
struct PagedKVCacheOptions {
  /// Blocks in the pool (N): every sequence's tokens come out of it.
  Index num_blocks = 0;
  /// Tokens per block (S; 16 as vLLM's default). A sequence of L tokens holds ceil(L / S)
  /// blocks, so at most S - 1 positions per sequence are unused.
  Index block_size = 16;
  Index num_kv_heads = 1;
  Index head_dim = 0;
  /// The value head dim hd_v (0: head_dim).
  Index value_head_dim = 0;
  /// What the keys and values are stored as, quantised by append() as KVCache does
  /// (KVCacheOptions::element, float8_scale and int4_group).
  KVElement element = KVElement::kScalar;
  bool float8_scale = true;
  Index int4_group = 32;
};

/// The stored rows of a batch of sequences of a PagedKVCache, as one attention call reads
/// them: item b is sequence seqs[b]; lengths (B values) and the rows' descriptors (their
/// block tables gathered into one (B, blocks) table). Valid until the cache changes.
struct PagedBatch {
  detail::StoredKeyValues stored;
  const Index* lengths = nullptr;
  Index batch = 0;
  Index slots = 0;  ///< positions the widest table covers (blocks x S)
};

/// The keys and values of one attention layer for many sequences, in blocks of a shared pool.
///
/// Storage. One 64-byte aligned allocation, zero-filled at construction, head-major: for
/// each key head, N blocks of S rows, then the same for the value heads, then the scales of
/// quantised rows in the same order (rows padded to 64 bytes as KVCache's). Block n is the
/// n-th run of S rows of every head, so a sequence whose blocks are consecutive numbers has
/// each head's rows consecutive in memory, as a contiguous cache does (the streaming read a
/// decode step makes). bytes() is fixed at construction, whatever the sequences.
///
/// Placement. A sequence's next block is the one after its last when that one is free;
/// otherwise it starts a new run in the middle of the longest run of free blocks (at block 0
/// in an empty pool). Sequences decoded side by side so keep their blocks in runs, read as
/// one stream (a 16-token block of int4 rows is one kilobyte per head: scattered, such blocks
/// took the int4 decode attention to 0.55-0.8x a contiguous cache's speed, in runs 1.0x).
/// Deterministic: the same calls give the same tables. A pool fragmented by sequences that
/// came and went is put back into runs by compact() (runs() counts them).
///
/// Sequences. add_sequence() returns a new empty sequence's id (ids of freed sequences are
/// reused). Sequence s holds length(s) tokens in block_table(s): position p is row p % S of
/// block block_table(s)[p / S]. append() writes whole chunks (a prefill, or one token to
/// decode) and takes blocks from the pool as the sequence grows; free_sequence() gives them
/// back. fork(s) makes a new sequence holding the same tokens in the same blocks (each
/// block's reference count goes up): a beam's candidates, or requests sharing a prompt. A
/// block shared by several sequences is never written: an append into a sequence whose
/// partly filled last block is shared first copies that block to a fresh one (copy on
/// write); full shared blocks stay shared for good.
///
/// Sliding windows. release_before(s, p) gives back the blocks wholly before position p,
/// which no query at p or later sees through a window; their block_table() entries become
/// -1 and first_position(s) moves past them. The incremental forward of a module with a
/// sliding window W calls it after every step (keeping the W - 1 positions the next query
/// sees), so a stream of any length holds at most ceil((W + T - 1) / S) + 1 blocks during a
/// step of T tokens: ceil(W / S) + 1 when decoding.
///
/// Element types. As KVCache (KVElement): append() quantises, the kernel reads the rows as
/// stored and dequantises them tile by tile; the same rows and scales give the same bits as a
/// contiguous KVCache holding the same tokens.
///
/// Errors. Every member checks its sequence ids, shapes and counts before anything is
/// written. When the pool has too few free blocks append() throws ConfigError naming the
/// blocks needed and free, and the cache is as it was (lengths, tables, reference counts and
/// rows): the caller may free or preempt sequences and retry.
///
/// Not thread-safe: every member that changes the cache, and batch(), need exclusive access.
///
/// A cache of a 16-bit storage type (PagedKVCache<bfloat16>, PagedKVCache<float16>: the paged
/// cache of a bfloat16 or float16 module) holds rows of that type, as KVCache<bfloat16> does
/// (KVElement::kScalar, or the element kind naming the type: the same rows); the kernel copies
/// each tile of them out of its blocks and reads it as operands of that type.
///
/// @tparam Scalar float, double, bfloat16 or float16.
template <class Scalar = float>
class PagedKVCache {
  static_assert(std::is_floating_point_v<Scalar> || detail::is_gemm_storage_v<Scalar>,
                "attn::PagedKVCache: Scalar must be float, double, bfloat16 or float16");

 public:
  /// An empty pool of no blocks (assign a real one before use).
  PagedKVCache() = default;

  /// @throws ConfigError naming the values if a size is not positive or the pool does not
  ///         fit memory sizes.
  explicit PagedKVCache(const PagedKVCacheOptions& options) : o_(options) {
    if (o_.value_head_dim == 0) o_.value_head_dim = o_.head_dim;
    if constexpr (is_storage_type_v<Scalar>) {
      // Rows of the storage type itself: the kernel reads them as its operands (it
      // dequantises other rows for float and double operands only).
      detail::require_config(
          o_.element == KVElement::kScalar || o_.element == kv_element_of<Scalar>(), "PagedKVCache",
          [&] {
            return describe() + ": a " + std::string(element_name<Scalar>()) + " cache stores " +
                   element_name<Scalar>() +
                   " rows (KVElement::kScalar); quantised rows need a float cache";
          });
      o_.element = KVElement::kScalar;
    }
    detail::require_config(o_.num_blocks > 0 && o_.block_size > 0 && o_.num_kv_heads > 0 &&
                               o_.head_dim > 0 && o_.value_head_dim > 0 && o_.int4_group >= 0,
                           "PagedKVCache", [&] {
                             return describe() +
                                    ": sizes must be positive (value_head_dim and int4_group: 0 "
                                    "or positive)";
                           });
    k_scales_ = detail::kv_row_scales(o_, o_.head_dim);
    v_scales_ = detail::kv_row_scales(o_, o_.value_head_dim);
    const Index heads = o_.num_kv_heads, line = static_cast<Index>(detail::kAlignment);
    Index k_part = 0, v_part = 0, v_end = 0, k_scales = 0, v_scales = 0, scale_bytes = 0;
    Index total = 0;
    const bool fits =
        detail::kv_row_bytes<Scalar>(o_, o_.head_dim, k_row_) &&
        detail::kv_row_bytes<Scalar>(o_, o_.value_head_dim, v_row_) &&
        detail::checked_mul(o_.block_size, k_row_, k_run_) &&
        detail::checked_mul(o_.block_size, v_row_, v_run_) &&
        detail::checked_product(k_part, heads, o_.num_blocks, k_run_) &&
        detail::checked_product(v_part, heads, o_.num_blocks, v_run_) &&
        detail::checked_sum(v_end, k_part, line - 1, v_part, line - 1) &&
        detail::checked_product(k_scales, heads, o_.num_blocks, o_.block_size, k_scales_) &&
        detail::checked_product(v_scales, heads, o_.num_blocks, o_.block_size, v_scales_) &&
        detail::checked_sum(scale_bytes, k_scales, v_scales) &&
        detail::checked_mul(scale_bytes, Index(sizeof(float)), scale_bytes) &&
        detail::checked_add(v_end, scale_bytes, total) &&
        static_cast<std::size_t>(total) <= detail::kMaxObjectBytes;
    detail::require_config(fits, "PagedKVCache", [&] { return describe() + ": too large"; });
    v_at_ = (k_part + line - 1) / line * line;  // each part starts 64-byte aligned
    scales_at_ = (v_at_ + v_part + line - 1) / line * line;
    k_srun_ = o_.block_size * k_scales_, v_srun_ = o_.block_size * v_scales_;
    v_sat_ = k_scales;
    storage_ = detail::AlignedBuffer<unsigned char>(static_cast<std::size_t>(total));
    std::fill_n(storage_.data(), total, static_cast<unsigned char>(0));
    refs_.assign(static_cast<std::size_t>(o_.num_blocks), 0);
    free_bits_.resize(static_cast<std::size_t>((o_.num_blocks + 63) / 64));
    free_from(0);
  }

  // ---- sizes and state ----

  Index num_blocks() const noexcept { return o_.num_blocks; }
  Index block_size() const noexcept { return o_.block_size; }
  Index num_kv_heads() const noexcept { return o_.num_kv_heads; }
  Index head_dim() const noexcept { return o_.head_dim; }
  Index value_head_dim() const noexcept { return o_.value_head_dim; }
  KVElement element() const noexcept { return o_.element; }
  /// Blocks no sequence holds.
  Index free_blocks() const noexcept { return free_count_; }
  /// How many sequences hold block n (0: free).
  /// @throws IndexError if n is not in [0, N).
  Index ref_count(Index n) const {
    detail::require_that<IndexError>(n >= 0 && n < o_.num_blocks, "PagedKVCache::ref_count", [&] {
      return "block " + std::to_string(n) + " is outside N=" + std::to_string(o_.num_blocks);
    });
    return refs_[static_cast<std::size_t>(n)];
  }
  /// Bytes held (the pool and its scales).
  std::size_t bytes() const noexcept { return storage_.capacity(); }
  /// The bytes of one position over all heads, keys and values with their scales, without
  /// padding: what a decode step reads per cached token.
  std::size_t bytes_per_token() const noexcept {
    return detail::kv_bytes_per_token<Scalar>(o_, k_scales_, v_scales_);
  }
  /// The whole allocation as Scalars: what overlap checks compare.
  TensorView<const Scalar, 1> memory() const noexcept {
    return {reinterpret_cast<const Scalar*>(storage_.data()),
            {static_cast<Index>(storage_.capacity() / sizeof(Scalar))}};
  }

  // ---- sequences ----

  /// A new empty sequence; its id.
  Index add_sequence() { return insert(Sequence{}); }
  /// Whether s is a sequence of the cache (added or forked, not freed).
  bool contains(Index s) const noexcept {
    return s >= 0 && s < static_cast<Index>(seqs_.size()) && seq(s).live;
  }
  /// The sequences of the cache.
  Index num_sequences() const noexcept {
    return static_cast<Index>(seqs_.size() - free_ids_.size());
  }
  /// Tokens sequence s holds: the position of its next token.
  /// @throws IndexError (as every member taking a sequence) if s is not a sequence.
  Index length(Index s) const { return seq(checked("PagedKVCache::length", s)).length; }
  /// Sequence s's blocks in position order (ceil(length / S) of them; -1 for the blocks
  /// released before first_position(s)).
  const std::vector<Index>& block_table(Index s) const {
    return seq(checked("PagedKVCache::block_table", s)).blocks;
  }
  /// The first position sequence s still holds: 0, or past the blocks release_before() gave
  /// back (a multiple of S).
  Index first_position(Index s) const {
    return seq(checked("PagedKVCache::first_position", s)).released * o_.block_size;
  }
  /// Blocks the pool must have free for sequence s to take t_new more tokens: the new blocks,
  /// and one more when its partly filled last block is shared (copied before it is written).
  /// @throws ConfigError for a negative t_new or a length that would overflow.
  Index blocks_needed(Index s, Index t_new) const {
    return needed("PagedKVCache::blocks_needed", &s, 1, t_new);
  }

  /// A new sequence holding sequence s's tokens in the same blocks, shared copy-on-write; its
  /// id. Takes no block from the pool.
  Index fork(Index s) {
    const Index id = insert(seq(checked("PagedKVCache::fork", s)));
    for (Index n : seq(id).blocks) {
      if (n >= 0) ++refs_[static_cast<std::size_t>(n)];
    }
    return id;
  }
  /// Frees sequence s: its blocks that no other sequence holds go back to the pool, and its
  /// id may be reused.
  void free_sequence(Index s) {
    Sequence& x = seq(checked("PagedKVCache::free_sequence", s));
    release(x.blocks, 0);
    x.length = 0;
    x.released = 0;
    x.live = false;
    free_ids_.push_back(s);  // capacity reserved by insert()
  }
  /// Keeps sequence s's first n tokens (rolls back rejected speculative tokens); blocks past
  /// them go back to the pool (when no other sequence holds them).
  /// @throws ConfigError naming the values if n is before first_position(s) or past
  ///         length(s).
  void truncate(Index s, Index n) {
    Sequence& x = seq(checked("PagedKVCache::truncate", s));
    detail::require_config(
        n >= x.released * o_.block_size && n <= x.length, "PagedKVCache::truncate", [&] {
          return "cannot keep " + std::to_string(n) + " tokens of sequence " + std::to_string(s) +
                 " (length " + std::to_string(x.length) + ", first position held " +
                 std::to_string(x.released * o_.block_size) + ")";
        });
    release(x.blocks, (n + o_.block_size - 1) / o_.block_size);
    x.length = n;
  }
  /// Gives back sequence s's blocks wholly before `position` (clamped to [0, length(s)]):
  /// tokens that a sliding window of queries at `position` and later no longer sees. Each
  /// goes back to the pool when no other sequence holds it: a fork keeps the blocks it shares
  /// until it releases them too. Their block_table(s) entries become -1 and first_position(s)
  /// moves to the first block still held; the released positions can no longer be attended
  /// to (the attention calls check the window), read (dequantize() gives zeros) or truncated
  /// back to.
  void release_before(Index s, Index position) {
    Sequence& x = seq(checked("PagedKVCache::release_before", s));
    const Index end = std::clamp<Index>(position, 0, x.length) / o_.block_size;
    for (; x.released < end; ++x.released) {
      Index& block = x.blocks[static_cast<std::size_t>(x.released)];
      if (--refs_[static_cast<std::size_t>(block)] == 0) give_back(block);
      block = -1;
    }
  }

  /// Runs of neighbouring blocks in the live sequences' tables (a run is a block whose
  /// predecessor in its table is not the block before it in the pool): at least one per
  /// sequence holding a block, each more a jump the attention's reads make. compact() brings
  /// it down.
  Index runs() const noexcept {
    Index count = 0;
    for (const Sequence& x : seqs_) {
      for (std::size_t i = 0; x.live && i < x.blocks.size(); ++i) {
        const Index b = x.blocks[i];
        if (b >= 0 && (i == 0 || x.blocks[i - 1] < 0 || b != x.blocks[i - 1] + 1)) ++count;
      }
    }
    return count;
  }

  /// Moves the held blocks so that each sequence's blocks lie one after another in table
  /// order, the sequences in id order from block 0 (a block shared by several sequences where
  /// its first holder puts it), and the free blocks after them: a pool fragmented by sequences
  /// that came and went is read as runs again. Rows, scales, lengths, reference counts and
  /// results are unchanged; block ids (block_table(), batch()) change. Moves each held block
  /// at most once (about the pool's bytes), so call it between steps when runs() has grown
  /// well past num_sequences().
  /// @throws std::bad_alloc, the cache unchanged.
  void compact() {
    const Index n = o_.num_blocks;
    std::vector<Index> source(static_cast<std::size_t>(n), -1);  // position <- old block
    std::vector<Index> target(static_cast<std::size_t>(n), -1);  // old block -> position
    std::vector<unsigned char> moved(static_cast<std::size_t>(n), 0);
    std::vector<unsigned char> spare(static_cast<std::size_t>(block_bytes()));
    std::vector<Index> refs(static_cast<std::size_t>(n), 0);
    Index held = 0;  // no throw from here
    for (const Sequence& x : seqs_) {
      for (const Index b : x.blocks) {
        if (x.live && b >= 0 && target[static_cast<std::size_t>(b)] < 0) {
          target[static_cast<std::size_t>(b)] = held, source[static_cast<std::size_t>(held)] = b;
          ++held;
        }
      }
    }
    for (Index b = 0, at = held; b < n; ++b) {  // the free blocks after, in their order
      if (target[static_cast<std::size_t>(b)] < 0) {
        target[static_cast<std::size_t>(b)] = at, source[static_cast<std::size_t>(at++)] = b;
      }
    }
    // The permutation in place, cycle by cycle: position j takes old block source[j].
    for (Index i = 0; i < n; ++i) {
      if (moved[static_cast<std::size_t>(i)] != 0 || source[static_cast<std::size_t>(i)] == i) {
        continue;
      }
      block_segments(i, spare.data(), false);
      Index j = i;
      for (; source[static_cast<std::size_t>(j)] != i; j = source[static_cast<std::size_t>(j)]) {
        copy_block(source[static_cast<std::size_t>(j)], j);
        moved[static_cast<std::size_t>(j)] = 1;
      }
      block_segments(j, spare.data(), true);
      moved[static_cast<std::size_t>(j)] = 1;
    }
    for (Index b = 0; b < n; ++b) {
      refs[static_cast<std::size_t>(target[static_cast<std::size_t>(b)])] =
          refs_[static_cast<std::size_t>(b)];
    }
    refs_.swap(refs);
    for (Sequence& x : seqs_) {
      for (Index& b : x.blocks) {
        if (x.live && b >= 0) b = target[static_cast<std::size_t>(b)];
      }
    }
    free_from(held);
  }

  // ---- writing ----

  /// Appends k_new (H_kv, T, hd) and v_new (H_kv, T, hd_v) (any strides) to sequence s at
  /// positions length(s) .. length(s) + T - 1, quantised to the element type, taking blocks
  /// from the pool (and copying a shared last block first).
  /// @throws IndexError if s is not a sequence; ShapeError on wrong shapes; ConfigError when
  ///         the pool has fewer free blocks than blocks_needed(s, T) (naming both): nothing
  ///         is changed then.
  void append(Index s, TensorView<const Scalar, 3> k_new, TensorView<const Scalar, 3> v_new) {
    const char* where = "PagedKVCache::append";
    checked(where, s);
    const Index t_new = k_new.extent(1);
    const Shape<3> k_shape{o_.num_kv_heads, t_new, o_.head_dim};
    const Shape<3> v_shape{o_.num_kv_heads, t_new, o_.value_head_dim};
    detail::require(k_new.shape() == k_shape && v_new.shape() == v_shape, where, [&] {
      return "k_new " + detail::to_string(k_new.shape()) + " and v_new " +
             detail::to_string(v_new.shape()) + ": expected " + detail::to_string(k_shape) +
             " and " + detail::to_string(v_shape) + " (H_kv, T, hd) and (H_kv, T, hd_v)";
    });
    prepare(where, &s, 1, t_new);
    const Index first = seq(s).length;
    for (Index h = 0; h < o_.num_kv_heads; ++h) {
      for (Index t = 0; t < t_new; ++t) {
        store_row(&k_new(h, t, 0), k_new.stride(2), s, 0, h, first + t);
        store_row(&v_new(h, t, 0), v_new.stride(2), s, 1, h, first + t);
      }
    }
    seq(s).length += t_new;
  }

  // ---- reading ----

  /// Sequence s's keys (H_kv, L, hd) and values (H_kv, L, hd_v) as Scalar, in position
  /// order: dequantised for quantised rows, copied otherwise.
  /// @throws IndexError if s is not a sequence; ShapeError unless k_out and v_out have those
  ///         shapes.
  void dequantize(Index s, TensorView<Scalar, 3> k_out, TensorView<Scalar, 3> v_out) const {
    const char* where = "PagedKVCache::dequantize";
    const Index n = seq(checked(where, s)).length;
    detail::dequantize_rows(where, o_, n, k_out, v_out, [&](int part, Index h, Index p) {
      using Row = std::pair<const unsigned char*, const float*>;
      const Index block = seq(s).blocks[static_cast<std::size_t>(p / o_.block_size)];
      const Index r = p % o_.block_size;
      if (block < 0) return Row(nullptr, nullptr);  // released behind a window
      return Row(row_at(block, part, h, r), scales_at(block, part, h, r));
    });
  }

  /// The rows of sequences seqs[0 .. count - 1] as one attention call over them reads them
  /// (see PagedBatch; the gathered tables live in the cache until the next batch()).
  /// @throws IndexError if an entry is not a sequence.
  PagedBatch batch(const Index* seqs, Index count) const {
    return batch_into(seqs, count, table_, lengths_);
  }
  /// As batch(), the tables and lengths gathered into `table` and `lengths` (which must
  /// outlive the call's use of the result): several calls over one cache at once.
  PagedBatch batch_into(const Index* seqs, Index count, std::vector<Index>& table,
                        std::vector<Index>& lengths) const {
    table.resize(static_cast<std::size_t>(batch_table_size(seqs, count)));
    lengths.resize(static_cast<std::size_t>(count));
    return batch_into(seqs, count, table.data(), lengths.data());
  }
  /// The entries of the table batch() gathers for seqs[0 .. count - 1]: count times the most
  /// blocks one of them holds (at least 1).
  /// @throws IndexError if an entry is not a sequence.
  Index batch_table_size(const Index* seqs, Index count) const {
    Index widest = 1;
    for (Index b = 0; b < count; ++b) {
      widest = std::max(
          widest, static_cast<Index>(seq(checked("PagedKVCache::batch", seqs[b])).blocks.size()));
    }
    return count * widest;
  }
  /// As batch(), into caller memory: `table` of batch_table_size() entries and `lengths` of
  /// `count` (allocates nothing).
  PagedBatch batch_into(const Index* seqs, Index count, Index* table, Index* lengths) const {
    const Index widest = count > 0 ? batch_table_size(seqs, count) / count : 1;
    std::fill(table, table + count * widest, Index(0));
    for (Index b = 0; b < count; ++b) {
      const Sequence& x = seq(seqs[b]);
      // (Released blocks as block 0: the kernel never reads a key behind the window.)
      std::transform(x.blocks.begin(), x.blocks.end(), table + b * widest,
                     [](Index n) { return std::max<Index>(n, 0); });
      lengths[b] = x.length;
    }
    PagedBatch out;
    out.batch = count;
    out.slots = widest * o_.block_size;
    out.lengths = lengths;
    const auto rows = [&](int part, Index width, Index scales) {
      detail::StoredRows r;
      r.element = o_.element;
      r.data = row_at(0, part, 0, 0);
      r.item_stride = run(part), r.head_stride = o_.num_blocks * run(part);
      r.row_stride = part == 0 ? k_row_ : v_row_;
      if (scales > 0) {
        r.scales = scales_at(0, part, 0, 0);
        r.scale_item_stride = scale_run(part),
        r.scale_head_stride = o_.num_blocks * scale_run(part);
        r.scale_row_stride = scales;
        r.group = group(width);
      }
      r.table = table, r.table_stride = widest, r.block_rows = o_.block_size;
      return r;
    };
    out.stored.k = rows(0, o_.head_dim, k_scales_);
    out.stored.v = rows(1, o_.value_head_dim, v_scales_);
    return out;
  }

  // ---- for the incremental forward (its caller checked everything first) ----

  /// Blocks the pool must have free for every sequence of seqs[0 .. count - 1] (distinct) to
  /// take t_new more tokens (sequence seqs[i]: t_new[i * t_stride]; stride 0: the same for
  /// all). A block shared by k of them and held by r sequences in all is copied by each of
  /// them but the last writer when k = r, so k - (k == r) copies.
  /// @throws IndexError for an entry that is not a sequence; ConfigError for a repeated one,
  ///         a negative t_new or a length that would overflow.
  Index needed(const char* where, const Index* seqs, Index count, const Index* tokens,
               Index t_stride) const {
    Index total = 0;
    std::vector<Index>& shared = shared_;  // the shared, partly filled last blocks written into
    shared.clear();
    for (Index i = 0; i < count; ++i) {
      const Index t_new = tokens[i * t_stride];
      detail::require_config(t_new >= 0, where, [&] {
        return "T_new=" + std::to_string(t_new) + " is negative: a token count must not be";
      });
      const Sequence& x = seq(checked(where, seqs[i]));
      for (Index j = 0; j < i; ++j) {
        detail::require_config(seqs[j] != seqs[i], where, [&] {
          return "sequence " + std::to_string(seqs[i]) + " appears twice in one batch";
        });
      }
      Index end = 0;
      detail::require_config(detail::checked_add(x.length, t_new, end) &&
                                 end <= std::numeric_limits<Index>::max() - o_.block_size,
                             where, [&] {
                               return "sequence " + std::to_string(seqs[i]) + " at length " +
                                      std::to_string(x.length) +
                                      ": T_new=" + std::to_string(t_new) +
                                      " more overflow the position counter";
                             });
      total += blocks_for(end) - static_cast<Index>(x.blocks.size());
      if (t_new > 0 && x.length % o_.block_size != 0) {
        const Index last = x.blocks.back();
        if (refs_[static_cast<std::size_t>(last)] > 1) shared.push_back(last);
      }
    }
    std::sort(shared.begin(), shared.end());
    for (std::size_t i = 0; i < shared.size();) {
      std::size_t j = i;
      while (j < shared.size() && shared[j] == shared[i]) ++j;
      const Index k = static_cast<Index>(j - i);
      total += k - (k == refs_[static_cast<std::size_t>(shared[i])] ? 1 : 0);
      i = j;
    }
    return total;
  }
  Index needed(const char* where, const Index* seqs, Index count, Index t_new) const {
    return needed(where, seqs, count, &t_new, 0);
  }

  /// Makes room for t_new more tokens in each of seqs[0 .. count - 1] (distinct): copies
  /// shared partly filled last blocks, takes new blocks; lengths are not changed (write the
  /// rows with store_row(), then advance()). Strong guarantee.
  /// @throws as needed(); ConfigError naming the blocks needed and free when the pool is
  ///         short.
  void prepare(const char* where, const Index* seqs, Index count, Index t_new) {
    prepare(where, seqs, count, &t_new, 0);
  }
  /// As above, sequence seqs[i] taking t_new[i * t_stride] tokens.
  void prepare(const char* where, const Index* seqs, Index count, const Index* tokens,
               Index t_stride) {
    const Index need = needed(where, seqs, count, tokens, t_stride);
    detail::require_config(need <= free_blocks(), where, [&] {
      std::string names;
      for (Index i = 0; i < std::min<Index>(count, 8); ++i) {
        names += (i ? ", " : "") + std::to_string(seqs[i]);
      }
      if (count > 8) names += ", ...";
      Index t_new = 0;
      for (Index i = 0; i < count; ++i) t_new += tokens[i * t_stride];
      return "the block pool is exhausted: " + std::to_string(t_new) + " more tokens for " +
             (count == 1 ? "sequence " : "sequences ") + names + " need " + std::to_string(need) +
             " blocks of " + std::to_string(o_.block_size) + " tokens, " +
             std::to_string(free_blocks()) + " of N=" + std::to_string(o_.num_blocks) +
             " are free (free or preempt sequences, or build a larger pool)";
    });
    for (Index i = 0; i < count; ++i) {  // may throw std::bad_alloc: nothing changed yet
      // (Tables grow geometrically: a sequence decoded token by token reallocates its table
      // about log2(blocks) times, not once per block.)
      Sequence& x = seq(seqs[i]);
      const auto need = static_cast<std::size_t>(blocks_for(x.length + tokens[i * t_stride]));
      if (x.blocks.capacity() < need) x.blocks.reserve(std::max(need, 2 * x.blocks.capacity()));
    }
    for (Index i = 0; i < count; ++i) {  // no throw from here
      Sequence& x = seq(seqs[i]);
      const Index t_new = tokens[i * t_stride];
      if (t_new == 0) continue;
      if (x.length % o_.block_size != 0 && refs_[static_cast<std::size_t>(x.blocks.back())] > 1) {
        const Index old = x.blocks.back();
        const Index copy = take(x.blocks.size() > 1 ? x.blocks[x.blocks.size() - 2] : -1);
        copy_block(old, copy);
        --refs_[static_cast<std::size_t>(old)];
        x.blocks.back() = copy;
      }
      while (static_cast<Index>(x.blocks.size()) < blocks_for(x.length + t_new)) {
        x.blocks.push_back(take(x.blocks.empty() ? -1 : x.blocks.back()));
      }
    }
  }
  /// Writes one row of `width(part)` elements (stride `stride`) at sequence s's `position`
  /// (a prepared one), quantised to the element type.
  void store_row(const Scalar* from, Index stride, Index s, int part, Index h,
                 Index position) noexcept {
    const Index block = seq(s).blocks[static_cast<std::size_t>(position / o_.block_size)];
    const Index r = position % o_.block_size, n = part == 0 ? o_.head_dim : o_.value_head_dim;
    unsigned char* to = row_at(block, part, h, r);
    if (o_.element == KVElement::kScalar) {
      Scalar* x = reinterpret_cast<Scalar*>(to);
      for (Index e = 0; e < n; ++e) x[e] = from[e * stride];
      return;
    }
    detail::quantize_row(o_.element, from, stride, n, group(n), to, scales_at(block, part, h, r));
  }
  /// Counts t_new more tokens of sequence s, whose rows were prepared and written.
  void advance(Index s, Index t_new) noexcept { seq(s).length += t_new; }

 private:
  struct Sequence {
    std::vector<Index> blocks;
    Index length = 0;
    Index released = 0;  ///< leading blocks given back by release_before() (-1 in blocks)
    bool live = true;
  };

  std::string describe() const {
    std::string text =
        "N=" + std::to_string(o_.num_blocks) + ", block_size=" + std::to_string(o_.block_size) +
        ", H_kv=" + std::to_string(o_.num_kv_heads) + ", head_dim=" + std::to_string(o_.head_dim);
    if (o_.value_head_dim != o_.head_dim) {
      text += ", value_head_dim=" + std::to_string(o_.value_head_dim);
    }
    if (o_.element != KVElement::kScalar) text += std::string(", ") + kv_element_name(o_.element);
    return text;
  }

  Index checked(const char* where, Index s) const {
    detail::require_that<IndexError>(contains(s), where, [&] {
      return "sequence " + std::to_string(s) + " is not a sequence of the cache (added, " +
             "forked and not freed; " + std::to_string(num_sequences()) + " live)";
    });
    return s;
  }
  Sequence& seq(Index s) noexcept { return seqs_[static_cast<std::size_t>(s)]; }
  const Sequence& seq(Index s) const noexcept { return seqs_[static_cast<std::size_t>(s)]; }
  Index blocks_for(Index tokens) const noexcept {
    return tokens / o_.block_size + (tokens % o_.block_size != 0 ? 1 : 0);
  }

  /// A new live sequence (a reused id first); free_ids_ keeps room for every id.
  Index insert(Sequence x) {
    x.live = true;
    if (!free_ids_.empty()) {
      const Index id = free_ids_.back();
      seq(id) = std::move(x);
      free_ids_.pop_back();
      return id;
    }
    free_ids_.reserve(seqs_.size() + 1);
    seqs_.push_back(std::move(x));
    return static_cast<Index>(seqs_.size()) - 1;
  }

  // ---- block placement (the class comment's "Placement") ----
  //
  // The free blocks are a bitmap. place() scans it only when the block after a sequence's
  // last is held, O(N / 64 + the runs of free blocks) at most, up to where no longer run can
  // follow: rarely, for sequences growing in runs.

  bool is_free(Index n) const noexcept {
    return (free_bits_[static_cast<std::size_t>(n / 64)] >> (n % 64) & 1u) != 0;
  }
  /// The first block from `from` on that is free (held when `free` is false), or N.
  Index next_block(Index from, bool free) const noexcept {
    const Index n = o_.num_blocks, words = static_cast<Index>(free_bits_.size());
    if (from >= n) return n;
    const std::uint64_t flip = free ? 0 : ~std::uint64_t{0};
    Index w = from / 64;
    std::uint64_t bits =
        (free_bits_[static_cast<std::size_t>(w)] ^ flip) & (~std::uint64_t{0} << from % 64);
    while (bits == 0) {
      if (++w == words) return n;
      bits = free_bits_[static_cast<std::size_t>(w)] ^ flip;
    }
#if defined(__GNUC__)
    const Index bit = __builtin_ctzll(bits);
#else
    Index bit = 0;
    while ((bits >> bit & 1u) == 0) ++bit;
#endif
    return std::min(n, w * 64 + bit);
  }
  /// Where a sequence whose last block is `after` (-1: none) takes its next block (above).
  Index place(Index after) const noexcept {
    if (after >= 0 && after + 1 < o_.num_blocks && is_free(after + 1)) return after + 1;
    Index best = 0, longest = 0;
    // (Stops once the blocks left to scan could not hold a longer run: the same choice.)
    for (Index a = next_block(0, true); a < o_.num_blocks && o_.num_blocks - a > longest;) {
      const Index e = next_block(a, false);
      if (e - a > longest) best = a, longest = e - a;
      a = next_block(e, true);
    }
    return best == 0 ? 0 : best + longest / 2;
  }
  /// Takes a free block for a sequence whose last block is `after` (-1: none).
  Index take(Index after) noexcept {
    const Index n = place(after);
    free_bits_[static_cast<std::size_t>(n / 64)] &= ~(std::uint64_t{1} << n % 64);
    --free_count_;
    refs_[static_cast<std::size_t>(n)] = 1;
    return n;
  }
  /// Blocks [first, N) free, the others held (the bits past N too, so that no free run
  /// reaches past the pool).
  void free_from(Index first) noexcept {
    std::fill(free_bits_.begin(), free_bits_.end(), std::uint64_t{0});
    for (Index b = first; b < o_.num_blocks; ++b) {
      free_bits_[static_cast<std::size_t>(b / 64)] |= std::uint64_t{1} << b % 64;
    }
    free_count_ = o_.num_blocks - first;
  }
  void give_back(Index n) noexcept {
    free_bits_[static_cast<std::size_t>(n / 64)] |= std::uint64_t{1} << n % 64;
    ++free_count_;
  }
  /// Drops the blocks of `blocks` from index `keep` on (each back to the pool when no other
  /// sequence holds it).
  void release(std::vector<Index>& blocks, Index keep) noexcept {
    for (std::size_t i = static_cast<std::size_t>(keep); i < blocks.size(); ++i) {
      if (blocks[i] >= 0 && --refs_[static_cast<std::size_t>(blocks[i])] == 0) {
        give_back(blocks[i]);
      }
    }
    blocks.resize(std::min(blocks.size(), static_cast<std::size_t>(keep)));
  }
  /// Bytes of one block over every head and part, scales included.
  Index block_bytes() const noexcept {
    return o_.num_kv_heads *
           (k_run_ + v_run_ + (k_srun_ + v_srun_) * static_cast<Index>(sizeof(float)));
  }
  /// Copies block n's rows and scales (every head and part) into `bytes` (block_bytes()), or
  /// back from them when `restore`.
  void block_segments(Index n, unsigned char* bytes, bool restore) noexcept {
    const auto move = [&](unsigned char* at, Index count) {
      if (restore) {
        std::copy_n(bytes, count, at);
      } else {
        std::copy_n(at, count, bytes);
      }
      bytes += count;
    };
    for (int part = 0; part < 2; ++part) {
      for (Index h = 0; h < o_.num_kv_heads; ++h) {
        move(row_at(n, part, h, 0), run(part));
        if (scale_run(part) > 0) {
          move(reinterpret_cast<unsigned char*>(scales_at(n, part, h, 0)),
               scale_run(part) * static_cast<Index>(sizeof(float)));
        }
      }
    }
  }
  void copy_block(Index from, Index to) noexcept {
    for (int part = 0; part < 2; ++part) {
      for (Index h = 0; h < o_.num_kv_heads; ++h) {
        std::copy_n(row_at(from, part, h, 0), run(part), row_at(to, part, h, 0));
        if (scale_run(part) > 0) {
          std::copy_n(scales_at(from, part, h, 0), scale_run(part), scales_at(to, part, h, 0));
        }
      }
    }
  }

  // ---- layout (bytes; see the class comment) ----

  /// Elements per scale (kv_group()).
  Index group(Index width) const noexcept { return detail::kv_group(o_, width); }
  /// Bytes of one head's S rows in a block, and floats of their scales.
  Index run(int part) const noexcept { return part == 0 ? k_run_ : v_run_; }
  Index scale_run(int part) const noexcept { return part == 0 ? k_srun_ : v_srun_; }
  unsigned char* row_at(Index block, int part, Index h, Index r) const noexcept {
    return storage_.data() + (part == 0 ? 0 : v_at_) + (h * o_.num_blocks + block) * run(part) +
           r * (part == 0 ? k_row_ : v_row_);
  }
  float* scale_base() const noexcept {
    return reinterpret_cast<float*>(storage_.data() + scales_at_);
  }
  float* scales_at(Index block, int part, Index h, Index r) const noexcept {
    const Index n = part == 0 ? k_scales_ : v_scales_;
    if (n == 0) return nullptr;
    return scale_base() + (part == 0 ? 0 : v_sat_) + (h * o_.num_blocks + block) * scale_run(part) +
           r * n;
  }

  PagedKVCacheOptions o_{};
  Index k_row_ = 0, v_row_ = 0, k_run_ = 0, v_run_ = 0;  // bytes: a row, a head's S rows
  Index v_at_ = 0, scales_at_ = 0;                       // bytes: where values, scales start
  Index k_scales_ = 0, v_scales_ = 0, k_srun_ = 0, v_srun_ = 0;  // floats: per row, per S rows
  Index v_sat_ = 0;  // floats: where the values' scales start
  detail::AlignedBuffer<unsigned char> storage_;
  std::vector<Index> refs_;               // per block: the sequences holding it
  std::vector<std::uint64_t> free_bits_;  // bit n % 64 of word n / 64: block n is free
  Index free_count_ = 0;
  std::vector<Sequence> seqs_;                  // by id; freed ones not live
  std::vector<Index> free_ids_;                 // ids of freed sequences (capacity: every id)
  mutable std::vector<Index> table_, lengths_;  // batch()'s gathered tables and lengths
  mutable std::vector<Index> shared_;           // needed()'s bookkeeping
};

ATTN_NAMESPACE_END
