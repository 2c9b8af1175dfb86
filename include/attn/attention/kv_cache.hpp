// SPDX-License-Identifier: MIT
// attn/attention/kv_cache.hpp: KVCache, the keys and values of one attention layer kept
// across generation steps: preallocated, ragged lengths, optionally a sliding-window ring,
// optionally keeping attention sinks, optionally quantised (int8, int4, float8, bfloat16,
// float16 rows read by the kernel).
// Glossary: B = batch, H_kv = key/value heads, hd = head dim, hd_v = value head dim,
// W = window, C = largest chunk, S = sink tokens.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attention/detail/gather.hpp"
#include "attn/attention/detail/kv_rows.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/kernels/kv_storage.hpp"
#include "attn/memory.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {
struct KVCacheAccess;
}  // namespace detail

/// The element kind whose rows hold values of type T: kBFloat16 for bfloat16, kFloat16 for
/// float16, else kScalar (float and double: a cache's own rows).
template <class T>
constexpr KVElement kv_element_of() noexcept {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return KVElement::kBFloat16;
  } else if constexpr (std::is_same_v<T, float16>) {
    return KVElement::kFloat16;
  } else {
    return KVElement::kScalar;
  }
}

/// Configuration of a KVCache.
struct KVCacheOptions {
  Index batch = 1;
  Index num_kv_heads = 1;
  Index head_dim = 0;
  /// Positions stored per item. Without a window: the longest sequence. With one: 0 means
  /// sink_tokens + window + max_chunk - 1 (the least that works, see KVCache); a larger
  /// value is allowed.
  Index capacity = 0;
  /// Sliding window W (0: none): the query at position p sees keys in (p - W, p].
  Index window = 0;
  /// With a window: the most tokens one append() takes (a chunk of a prefill, or 1 to decode).
  Index max_chunk = 1;
  /// With a window: S, the first positions kept for good as attention sinks (StreamingLLM):
  /// a query sees them and the W latest tokens, at positions within the cache (see KVCache,
  /// "Attention sinks"). 0: none.
  Index sink_tokens = 0;
  /// The value head dim hd_v (0: head_dim), e.g. 128 against keys of 192 (DeepSeek's MLA
  /// with its decompressed heads).
  Index value_head_dim = 0;
  /// What the keys and values are stored as (KVElement; the cache's Scalar by default).
  /// Quantised rows are written by append() and read by the attention kernel, which
  /// dequantises them tile by tile as it reads: the cache's bytes are what a decode step
  /// streams from memory.
  KVElement element = KVElement::kScalar;
  /// kFloat8E4M3 / kFloat8E5M2: one float scale per token and head (false: none, values
  /// beyond the format's range saturate).
  bool float8_scale = true;
  /// kInt4: elements per scale (0: one per token and head).
  Index int4_group = 32;
};

/// Where item b's stored positions live, in position order: positions first_position ..
/// first_position + count[0] - 1 in slots slot[0] ..; the next count[1] in slots 0 ...
/// count[1] is 0 unless a ring has wrapped.
struct KVSegments {
  Index first_position = 0;
  Index slot[2] = {0, 0};
  Index count[2] = {0, 0};
};

/// The keys and values of one attention layer, kept across generation steps.
///
/// Storage. One 64-byte aligned allocation, zero-filled (touched) at construction so no step
/// pays first-touch page faults. Per batch item: the H_kv key heads, then the H_kv value heads,
/// each a block of `capacity` rows; k_storage() and v_storage() view it as (B, H_kv, capacity,
/// hd) and (B, H_kv, capacity, hd_v). With hd_v = hd, keys and values of an item are one
/// (2 H_kv, rows, hd) run with one head stride, so a single GEMM with the stacked [W_k; W_v]
/// can write both straight into the cache (the GEMM's head-major output uses one stride
/// between head segments; see next_rows()). Rows are padded to a multiple of 64 bytes when
/// that costs at most 1/16 of a row (hd = 64, 80, 96, 128 and 256 floats need no padding),
/// else kept dense; each head block starts 64-byte aligned. So bytes() is within 6.25 % (plus
/// 64 bytes per block) of the keys and values themselves.
///
/// Element types. With options.element other than kScalar the rows hold quantised keys and
/// values (KVElement: int8, int4, float8, bfloat16, float16) and, for the scaled kinds, their
/// float scales, after the rows in the same allocation. append() quantises; the attention
/// kernel reads the rows as they are and dequantises each tile in its loops, so a decode step
/// streams bytes_per_token() per position and head group rather than 2 (hd + hd_v) Scalars.
/// There is no Scalar view of quantised rows: k(), v(), k_storage(), v_storage(), k_slot(),
/// v_slot() and next_rows() throw ConfigError; dequantize() copies an item's rows out. The
/// element type is an option rather than a template parameter: a model's code (its
/// modules' forward(x, out, ws, cache)) is the same whatever the cache stores, and the choice
/// can come from a command line or a configuration file.
///
/// Lengths. Each item has its own length (ragged batches): length(b) is the number of tokens
/// item b has seen, i.e. the position of its next token.
///
/// Sliding window. With window W the cache is a ring addressed by absolute position: position
/// p lives in slot p % capacity, so memory stays bounded however long generation runs. A
/// chunk of C new tokens at positions P .. P+C-1 is appended before the attention runs over
/// the cache, and its first query still needs the keys P-W+1 .. P: the ring must hold W+C-1
/// positions, so capacity defaults to window + max_chunk - 1 and append() takes at most
/// max_chunk tokens (ConfigError beyond). A prefill longer than max_chunk therefore runs in
/// chunks of at most max_chunk tokens (the incremental forward does this), each attending
/// its own keys before the next chunk overwrites the oldest ones. first_position(b) is the
/// first position still stored, segments(b) the (at most two) slot ranges in position order.
///
/// Attention sinks. With sink_tokens S (and a window W) the query at position p sees the
/// first S positions and the W positions (p - W, p], S + W keys once p >= S + W - 1, so
/// generation runs indefinitely in bounded memory (StreamingLLM, Xiao et al. 2023; Hugging
/// Face's SinkCache). Positions are those within the cache: the i-th key the query sees is at
/// position i (visible_position() maps it back to the stream), the query at the last one,
/// and the incremental forward applies the rotary embedding at those positions, so they stay
/// below S + W however long the stream runs. The rows keep un-rotated keys: a key moves to
/// a lower cache position with every new token, and rotating it when it is read is exact,
/// where rewriting the stored row would round it (and requantise a quantised one) at every
/// move. The ring (capacity - S rows, position p in row p % (capacity - S)) is followed by
/// S rows that keep the sinks for good. A prefill splits into steps of max_chunk tokens as
/// with a window, and the result does not depend on the split: every token attends as if
/// decoded alone. Rows are written with append() (k_slot(), v_slot() and next_rows() are
/// refused: they would miss the sink rows); k(b) and dequantize() show every row, the ring's
/// in slot order, then the sinks'.
///
/// Indices and sizes. Every member that takes an item, a head, a position, a token count or
/// an item range checks it (IndexError for an item, head or position outside the cache;
/// ShapeError for an item range; ConfigError for a count the cache cannot take), before
/// anything is written; the sizes of the configuration are checked for overflow once, in
/// the constructor.
///
/// Owner. The incremental forward of a module (forward(x, out, ws, cache)) records the
/// module's identity in the cache when it writes into an empty one, and refuses a cache that
/// holds another module's keys (or those of a module since assigned over): keys and values
/// are only meaningful to the projections (and rotary embedding) that made them. reset(), or
/// truncating every item to 0, frees the cache for any module. Rows written by hand
/// (append(), next_rows(), k_slot()) claim nothing.
///
/// Not thread-safe: append, truncate, reorder and reset need exclusive access.
///
/// A cache of a 16-bit storage type (KVCache<bfloat16>, KVCache<float16>: the cache of a
/// bfloat16 or float16 module) holds rows of that type (kScalar, or the element kind naming
/// the type, kv_element_of<Scalar>(): the same rows); the kernel reads them as operands of
/// that type.
///
/// @tparam Scalar float, double, bfloat16 or float16.
template <class Scalar = float>
class KVCache {
  static_assert(std::is_floating_point_v<Scalar> || detail::is_gemm_storage_v<Scalar>,
                "attn::KVCache: Scalar must be float, double, bfloat16 or float16");

 public:
  /// An empty cache of no items (assign a real one before use; every item index is refused).
  KVCache() noexcept : o_{0, 0, 0, 0, 0, 0} {}

  /// @throws ConfigError naming the values if a size is not positive, capacity is below
  ///         sink_tokens + window + max_chunk - 1 with a window, sink_tokens is negative or
  ///         set without a window, or the storage does not fit memory sizes.
  explicit KVCache(const KVCacheOptions& options) : o_(checked(options)) {
    if (o_.window > 0 && o_.capacity == 0) {  // checked(): no overflow
      detail::checked_sum(o_.capacity, o_.sink_tokens, o_.window, o_.max_chunk, Index(-1));
    }
    if (o_.window == 0) o_.max_chunk = o_.capacity;
    if (o_.value_head_dim == 0) o_.value_head_dim = o_.head_dim;
    const Index heads = o_.num_kv_heads, line = static_cast<Index>(detail::kAlignment);
    k_scales_ = detail::kv_row_scales(o_, o_.head_dim);
    v_scales_ = detail::kv_row_scales(o_, o_.value_head_dim);
    Index blocks = 0, data = 0, padded = 0, scales = 0, scale_bytes = 0, total = 0;
    bool fits = block_bytes(o_.head_dim, k_row_, k_block_) &&
                block_bytes(o_.value_head_dim, v_row_, v_block_) &&
                detail::checked_add(k_block_, v_block_, blocks) &&
                detail::checked_mul(blocks, heads, item_) &&
                detail::checked_mul(item_, o_.batch, data) &&
                detail::checked_add(data, line - 1, padded) &&
                detail::checked_product(scale_item_, heads, o_.capacity, k_scales_ + v_scales_) &&
                detail::checked_mul(scale_item_, o_.batch, scales) &&
                detail::checked_mul(scales, Index(sizeof(float)), scale_bytes) &&
                detail::checked_add(padded / line * line, scale_bytes, total) &&
                static_cast<std::size_t>(total) <= detail::kMaxObjectBytes;
    detail::require_config(fits, "KVCache", [&] { return describe() + ": too large"; });
    scales_at_ = padded / line * line;  // the scales start 64-byte aligned after the rows
    storage_ = detail::AlignedBuffer<unsigned char>(static_cast<std::size_t>(total));
    std::fill_n(storage_.data(), total, static_cast<unsigned char>(0));
    end_.assign(static_cast<std::size_t>(o_.batch), 0);
    first_.assign(static_cast<std::size_t>(o_.batch), 0);
    scratch_.assign(static_cast<std::size_t>(2 * o_.batch), 0);
  }

  /// A cache without a window for sequences of up to `capacity` tokens.
  KVCache(Index batch, Index num_kv_heads, Index head_dim, Index capacity)
      : KVCache(KVCacheOptions{batch, num_kv_heads, head_dim, capacity, 0, 1}) {}

  /// A sliding-window ring of capacity window + max_chunk - 1.
  static KVCache sliding_window(Index batch, Index num_kv_heads, Index head_dim, Index window,
                                Index max_chunk = 1) {
    return KVCache(KVCacheOptions{batch, num_kv_heads, head_dim, 0, window, max_chunk});
  }

  // ---- sizes and state ----

  Index batch() const noexcept { return o_.batch; }
  Index num_kv_heads() const noexcept { return o_.num_kv_heads; }
  Index head_dim() const noexcept { return o_.head_dim; }
  /// hd_v: the value rows' width (head_dim unless options.value_head_dim said otherwise).
  Index value_head_dim() const noexcept { return o_.value_head_dim; }
  /// What the rows hold (KVElement::kScalar: Scalar).
  KVElement element() const noexcept { return o_.element; }
  Index capacity() const noexcept { return o_.capacity; }
  /// The sliding window (0: none).
  Index window() const noexcept { return o_.window; }
  /// S, the attention sinks kept for good (0: none).
  Index sink_tokens() const noexcept { return o_.sink_tokens; }
  /// With sink_tokens: how many keys the query at position p sees (min(p + 1, S + W)); its
  /// own cache position is one less.
  Index visible_keys(Index p) const noexcept {
    return std::min<Index>(p + 1, o_.sink_tokens + o_.window);
  }
  /// With sink_tokens: the stream position of the key at cache position i (< visible_keys(p))
  /// for the query at position p: i for a sink, else i's place counted back from p.
  Index visible_position(Index p, Index i) const noexcept {
    return i < o_.sink_tokens ? i : p - visible_keys(p) + 1 + i;
  }
  /// The most tokens one append() takes: max_chunk with a window, else capacity.
  Index max_chunk() const noexcept { return o_.max_chunk; }
  /// Scalars between consecutive key rows of the Scalar views (head_dim, or padded to 64
  /// bytes), and the same for value rows; with quantised rows, their bytes.
  Index row_stride() const noexcept { return k_row_ / element_bytes(); }
  Index value_row_stride() const noexcept { return v_row_ / element_bytes(); }
  /// Bytes held, and the bytes of the keys and values themselves (B H_kv capacity (hd +
  /// hd_v) elements, with their scales).
  std::size_t bytes() const noexcept { return storage_.capacity(); }
  std::size_t payload_bytes() const noexcept {
    return static_cast<std::size_t>(o_.batch * o_.capacity) * bytes_per_token();
  }
  /// The bytes one position of one item takes over all its heads, keys and values with their
  /// scales, without padding: what a decode step reads per cached token.
  std::size_t bytes_per_token() const noexcept {
    return detail::kv_bytes_per_token<Scalar>(o_, k_scales_, v_scales_);
  }

  /// Tokens item b has seen: the position of its next token.
  /// @throws IndexError (as every member taking an item) if b is not in [0, B).
  Index length(Index b) const { return len(checked_item("KVCache::length", b)); }
  /// The first position item b still stores (0 without a window or before the ring wraps).
  Index first_position(Index b) const { return first(checked_item("KVCache::first_position", b)); }
  /// The positions item b stores: length(b) - first_position(b).
  Index stored(Index b) const {
    checked_item("KVCache::stored", b);
    return len(b) - first(b);
  }
  /// length(b) for every item, B values (for the kernel; valid until the cache changes).
  const Index* lengths() const noexcept { return end_.data(); }
  const Index* first_positions() const noexcept { return first_.data(); }
  /// True when every item has the same length (and first position).
  bool uniform() const noexcept { return uniform(0, o_.batch); }
  /// True when no item holds a token (after reset(), or truncating every item to 0).
  bool empty() const noexcept {
    return std::all_of(end_.begin(), end_.end(), [](Index n) { return n == 0; });
  }
  /// The identity of the module whose incremental forward wrote the stored tokens (0: none;
  /// see the class comment).
  std::uint64_t owner() const noexcept { return owner_; }

  /// Item b's stored positions as (at most two) slot ranges in position order.
  KVSegments segments(Index b) const {
    checked_item("KVCache::segments", b);
    KVSegments s;
    s.first_position = first(b);
    const Index n = len(b) - first(b);
    s.slot[0] = s.first_position % ring();
    s.count[0] = std::min(n, ring() - s.slot[0]);
    s.count[1] = n - s.count[0];
    return s;
  }

  // ---- views (rows of Scalar: options.element kScalar; else ConfigError) ----

  /// All slots, (B, H_kv, capacity, hd) and (B, H_kv, capacity, hd_v): what the kernel reads
  /// with lengths() and segments().
  TensorView<Scalar, 4> k_storage() { return storage_view("KVCache::k_storage", 0, o_.capacity); }
  TensorView<Scalar, 4> v_storage() { return storage_view("KVCache::v_storage", 1, o_.capacity); }
  TensorView<const Scalar, 4> k_storage() const {
    return const_cast<KVCache*>(this)->storage_view("KVCache::k_storage", 0, o_.capacity);
  }
  TensorView<const Scalar, 4> v_storage() const {
    return const_cast<KVCache*>(this)->storage_view("KVCache::v_storage", 1, o_.capacity);
  }
  /// The whole allocation as Scalars (rows, padding and scales): what overlap checks compare.
  TensorView<const Scalar, 1> memory() const noexcept {
    return {reinterpret_cast<const Scalar*>(storage_.data()),
            {static_cast<Index>(storage_.capacity() / sizeof(Scalar))}};
  }
  /// The stored rows as the attention kernel reads them (quantised caches; kScalar: inactive).
  detail::StoredKeyValues stored() const noexcept {
    detail::StoredKeyValues s;
    if (o_.element == KVElement::kScalar) return s;
    const auto rows = [&](int part, Index width, Index scales) {
      detail::StoredRows r;
      r.element = o_.element;
      r.data = storage_.data() + part * o_.num_kv_heads * k_block_;
      r.item_stride = item_, r.head_stride = part == 0 ? k_block_ : v_block_;
      r.row_stride = part == 0 ? k_row_ : v_row_;
      if (scales > 0) {
        r.scales = scale_base() + part * o_.num_kv_heads * o_.capacity * k_scales_;
        r.scale_item_stride = scale_item_, r.scale_head_stride = o_.capacity * scales;
        r.scale_row_stride = scales;
        r.group = group(width);
      }
      return r;
    };
    s.k = rows(0, o_.head_dim, k_scales_);
    s.v = rows(1, o_.value_head_dim, v_scales_);
    return s;
  }
  /// Item b's keys (H_kv, n, hd) and values (H_kv, n, hd_v) as Scalar, in the slot order of
  /// k(b) (n = min(length(b), capacity)): dequantised for quantised rows, copied otherwise.
  /// @throws IndexError for an item outside [0, B); ShapeError unless k_out and v_out have
  ///         those shapes.
  void dequantize(Index b, TensorView<Scalar, 3> k_out, TensorView<Scalar, 3> v_out) const {
    const char* where = "KVCache::dequantize";
    checked_item(where, b);
    detail::dequantize_rows(where, o_, used_slots(b), k_out, v_out,
                            [&](int part, Index h, Index j) {
                              return std::pair<const unsigned char*, const float*>(
                                  row_at(b, part, h, j), scales_at(b, part, h, j));
                            });
  }
  /// Item b's keys (H_kv, n, hd): positions 0 .. n-1 (n = length(b)) without a window; with
  /// one, the used slots (n = min(length(b), capacity)) in slot order (see segments()).
  TensorView<const Scalar, 3> k(Index b) const { return item_view(b, 0); }
  TensorView<const Scalar, 3> v(Index b) const { return item_view(b, 1); }
  /// Every item's keys (B, H_kv, len, hd) when all have length len and nothing has wrapped.
  /// @throws ConfigError naming the lengths otherwise (use k(b)).
  TensorView<const Scalar, 4> k() const { return uniform_view(0); }
  TensorView<const Scalar, 4> v() const { return uniform_view(1); }

  // ---- writing ----

  /// Appends k_new (B', H_kv, T_new, hd) and v_new (B', H_kv, T_new, hd_v) (any strides) to
  /// items first_item .. first_item + B' - 1, each at its own length, quantised to the
  /// cache's element type. Nothing is written unless every check passes.
  /// @throws ShapeError on wrong shapes or items; ConfigError when an item would overflow
  ///         capacity, or T_new exceeds max_chunk with a window (naming the values).
  void append(TensorView<const Scalar, 4> k_new, TensorView<const Scalar, 4> v_new,
              Index first_item = 0) {
    const char* where = "KVCache::append";
    const Index items = k_new.extent(0), t_new = k_new.extent(2);
    const Shape<4> expected{items, o_.num_kv_heads, t_new, o_.head_dim};
    const Shape<4> expected_v{items, o_.num_kv_heads, t_new, o_.value_head_dim};
    detail::require(k_new.shape() == expected && v_new.shape() == expected_v && first_item >= 0 &&
                        first_item <= o_.batch - items,
                    where, [&] {
                      return "k_new " + detail::to_string(k_new.shape()) + " and v_new " +
                             detail::to_string(v_new.shape()) + " for items from " +
                             std::to_string(first_item) +
                             ": expected (B', H_kv, T_new, hd) and (B', H_kv, T_new, hd_v) "
                             "with H_kv=" +
                             std::to_string(o_.num_kv_heads) +
                             ", hd=" + std::to_string(o_.head_dim) +
                             ", hd_v=" + std::to_string(o_.value_head_dim) +
                             " and items within B=" + std::to_string(o_.batch);
                    });
    check_room(where, first_item, items, t_new);
    for (Index i = 0; i < items; ++i) {
      const Index b = first_item + i;
      for (Index h = 0; h < o_.num_kv_heads; ++h) {
        for (Index t = 0; t < t_new; ++t) {
          store_row(&k_new(i, h, t, 0), k_new.stride(3), b, 0, h, len(b) + t);
          store_row(&v_new(i, h, t, 0), v_new.stride(3), b, 1, h, len(b) + t);
        }
      }
    }
    advance(t_new, first_item, items);
  }

  /// The row of absolute position `position` of item b, head h (slot position % capacity
  /// with a window): where a projection writes a new token before advance().
  /// @throws IndexError if b is not in [0, B), h not in [0, H_kv), or the position is
  ///         negative or (without a window) not below capacity; ConfigError for quantised rows
  ///         or a cache with sink_tokens.
  Scalar* k_slot(Index b, Index h, Index position) {
    require_scalar("KVCache::k_slot");
    require_no_sinks("KVCache::k_slot");
    return slot(b, 0, checked_slot("KVCache::k_slot", b, h, position), position);
  }
  Scalar* v_slot(Index b, Index h, Index position) {
    require_scalar("KVCache::v_slot");
    require_no_sinks("KVCache::v_slot");
    return slot(b, 1, checked_slot("KVCache::v_slot", b, h, position), position);
  }

  /// The rows the next t_new tokens of items first_item .. first_item + items - 1 (items < 0:
  /// to the last) will occupy, as (items, 2 H_kv, t_new, hd): heads 0 .. H_kv-1 are keys,
  /// H_kv .. 2 H_kv - 1 values, one stride between all of them (a head-major GEMM output).
  /// Write them, then advance(). Needs equal lengths over the items and no ring wrap inside,
  /// Scalar rows, hd_v = hd and no sink_tokens.
  /// @throws ConfigError naming the values otherwise, or when the items would overflow.
  TensorView<Scalar, 4> next_rows(Index t_new, Index first_item = 0, Index items = -1) {
    const char* where = "KVCache::next_rows";
    require_scalar(where);
    require_no_sinks(where);
    detail::require_config(o_.value_head_dim == o_.head_dim, where, [&] {
      return describe() +
             ": keys and values of different widths are not one strided block; "
             "use append()";
    });
    items = checked_items(where, first_item, items);
    check_room(where, first_item, items, t_new);
    if (items == 0) return {scalars(0), {0, 2 * o_.num_kv_heads, t_new, o_.head_dim}};
    const Index length = len(first_item);  // capacity > 0: the cache has items
    detail::require_config(
        uniform(first_item, first_item + items) && length % o_.capacity + t_new <= o_.capacity,
        where, [&] {
          return describe() + ": the next " + std::to_string(t_new) +
                 " rows are not one strided block (lengths differ or the "
                 "ring wraps); use k_slot()/v_slot() or append()";
        });
    const Index e = element_bytes();
    return {scalars(first_item * item_ + (length % o_.capacity) * k_row_),
            {items, 2 * o_.num_kv_heads, t_new, o_.head_dim},
            {item_ / e, k_block_ / e, k_row_ / e, 1}};
  }

  /// Counts t_new more tokens for items first_item .. first_item + items - 1 (items < 0: to
  /// the last) after their rows were written in place.
  /// @throws ShapeError for items outside [0, B); ConfigError for a negative t_new, one past
  ///         max_chunk (a window) or one that would overflow an item (naming the values).
  void advance(Index t_new, Index first_item = 0, Index items = -1) {
    const char* where = "KVCache::advance";
    items = checked_items(where, first_item, items);
    check_room(where, first_item, items, t_new);
    for (Index b = first_item; b < first_item + items; ++b) {
      const auto i = static_cast<std::size_t>(b);
      end_[i] += t_new;  // check_room(): no overflow
      first_[i] = std::max(first_[i], end_[i] - ring());
    }
  }

  // ---- editing ----

  /// Forgets every token and the owner (no memory is touched).
  void reset() noexcept {
    std::fill(end_.begin(), end_.end(), Index(0));
    std::fill(first_.begin(), first_.end(), Index(0));
    owner_ = 0;
  }

  /// Keeps item b's first n tokens (rolls back rejected speculative tokens).
  /// @throws ConfigError naming the values if n > length(b), n < 0, or (with a window) the
  ///         keys position n's window needs were already overwritten.
  void truncate(Index b, Index n) {
    detail::require(b >= 0 && b < o_.batch, "KVCache::truncate", [&] {
      return "item " + std::to_string(b) + " is outside B=" + std::to_string(o_.batch);
    });
    // n <= length(b) is checked first: n - window + 1 cannot overflow then.
    const Index needed =
        o_.window > 0 && n >= 0 && n <= len(b) ? std::max<Index>(0, n - o_.window + 1) : 0;
    detail::require_config(n >= 0 && n <= len(b) && first(b) <= needed, "KVCache::truncate", [&] {
      return "cannot keep " + std::to_string(n) + " tokens of item " + std::to_string(b) +
             " (length " + std::to_string(len(b)) + ", first stored position " +
             std::to_string(first(b)) +
             (o_.window > 0 ? ", window " + std::to_string(o_.window) : std::string()) + ")";
    });
    end_[static_cast<std::size_t>(b)] = n;
  }

  /// Beam search: item b becomes a copy of item src[b] (B entries; repeats allowed), in place,
  /// with no allocation (detail::gather_in_place: items nobody reads from are filled first,
  /// the remaining permutation cycles are applied by swapping items).
  /// @throws ShapeError if src has not B entries; IndexError for an entry outside [0, B).
  void reorder(TensorView<const Index, 1> src);
  void reorder(const std::vector<Index>& src) {
    reorder(TensorView<const Index, 1>(src.data(), {static_cast<Index>(src.size())}));
  }

 private:
  static KVCacheOptions checked(const KVCacheOptions& given) {
    KVCacheOptions o = given;
    if constexpr (is_storage_type_v<Scalar>) {
      // Rows of the storage type itself: the kernel reads them as its operands (it
      // dequantises other rows for float and double operands only).
      detail::require_config(
          o.element == KVElement::kScalar || o.element == kv_element_of<Scalar>(), "KVCache", [&] {
            return describe(o) + ": a " + std::string(element_name<Scalar>()) + " cache stores " +
                   element_name<Scalar>() +
                   " rows (KVElement::kScalar); quantised rows need a float cache";
          });
      o.element = KVElement::kScalar;
    }
    const bool window = o.window > 0;
    detail::require_config(o.batch > 0 && o.num_kv_heads > 0 && o.head_dim > 0 && o.window >= 0 &&
                               o.value_head_dim >= 0 && o.int4_group >= 0 &&
                               (window ? o.max_chunk > 0 && o.capacity >= 0 : o.capacity > 0),
                           "KVCache", [&] {
                             return describe(o) +
                                    ": sizes must be positive (value_head_dim and int4_group: "
                                    "0 or positive), and with a window capacity (0: the "
                                    "least) must be at least window + max_chunk - 1";
                           });
    detail::require_config(o.sink_tokens == 0 || (window && o.sink_tokens > 0), "KVCache", [&] {
      return describe(o) +
             ": sink_tokens must be 0 or positive, and goes with a window (the sinks are kept "
             "beside a sliding window of the latest tokens)";
    });
    if (!window) return o;
    Index least = 0;
    const bool sinks = o.sink_tokens > 0;
    detail::require_config(
        detail::checked_sum(least, o.sink_tokens, o.window, o.max_chunk, Index(-1)), "KVCache",
        [&] {
          return describe(o) + (sinks ? ": sink_tokens + " : ": ") +
                 "window + max_chunk - 1 overflows";
        });
    detail::require_config(o.capacity == 0 || o.capacity >= least, "KVCache", [&] {
      return describe(o) + ": with a window capacity (0: the least) must be at least " +
             (sinks ? "sink_tokens + " : "") + "window + max_chunk - 1 = " + std::to_string(least);
    });
    return o;
  }
  static std::string describe(const KVCacheOptions& o) {
    std::string text = "B=" + std::to_string(o.batch) + ", H_kv=" + std::to_string(o.num_kv_heads) +
                       ", head_dim=" + std::to_string(o.head_dim) +
                       ", capacity=" + std::to_string(o.capacity);
    if (o.value_head_dim != 0 && o.value_head_dim != o.head_dim) {
      text += ", value_head_dim=" + std::to_string(o.value_head_dim);
    }
    if (o.element != KVElement::kScalar) text += std::string(", ") + kv_element_name(o.element);
    if (o.window != 0) {
      text += ", window=" + std::to_string(o.window) + ", max_chunk=" + std::to_string(o.max_chunk);
    }
    if (o.sink_tokens != 0) text += ", sink_tokens=" + std::to_string(o.sink_tokens);
    return text;
  }
  std::string describe() const { return describe(o_); }

  bool uniform(Index begin, Index end) const noexcept {
    for (Index b = begin + 1; b < end; ++b) {
      if (len(b) != len(begin) || first(b) != first(begin)) return false;
    }
    return true;
  }

  // ---- checks (each names the member and the values) ----

  /// b, when it is an item; else IndexError.
  Index checked_item(const char* where, Index b) const {
    detail::require_that<IndexError>(b >= 0 && b < o_.batch, where, [&] {
      return "item " + std::to_string(b) + " is outside B=" + std::to_string(o_.batch);
    });
    return b;
  }
  /// The item count of the range [first_item, first_item + items) (items < 0: to the last),
  /// when it lies in [0, B); else ShapeError.
  Index checked_items(const char* where, Index first_item, Index items) const {
    const bool to_last = items < 0;
    const bool ok =
        first_item >= 0 && first_item <= o_.batch && (to_last || items <= o_.batch - first_item);
    detail::require(ok, where, [&] {
      Index end = 0;
      const std::string last = to_last ? std::string("B")
                               : detail::checked_add(first_item, items, end)
                                   ? std::to_string(end)
                                   : std::to_string(first_item) + " + " + std::to_string(items);
      return "items [" + std::to_string(first_item) + ", " + last +
             ") are outside [0, B=" + std::to_string(o_.batch) + ")";
    });
    return to_last ? o_.batch - first_item : items;
  }
  /// h, when b and h are an item and a head and `position` a place of theirs: not negative
  /// and, without a window, below capacity (a ring holds position p in slot p % capacity).
  Index checked_slot(const char* where, Index b, Index h, Index position) const {
    checked_item(where, b);
    detail::require_that<IndexError>(h >= 0 && h < o_.num_kv_heads, where, [&] {
      return "head " + std::to_string(h) + " is outside H_kv=" + std::to_string(o_.num_kv_heads);
    });
    detail::require_that<IndexError>(
        position >= 0 && (o_.window > 0 || position < o_.capacity), where, [&] {
          return "position " + std::to_string(position) + " is outside " +
                 (o_.window > 0 ? std::string("[0, inf) (a ring)")
                                : "[0, capacity=" + std::to_string(o_.capacity) + ")");
        });
    return h;
  }
  /// Room for t_new more tokens in items [first_item, first_item + items) (a checked
  /// range): 0 <= t_new <= max_chunk, and no item past capacity (without a window) or past
  /// the largest position an Index holds (a ring, whose positions only grow).
  void check_room(const char* where, Index first_item, Index items, Index t_new) const {
    detail::require_config(t_new >= 0, where, [&] {
      return "T_new=" + std::to_string(t_new) + " is negative: a token count must not be";
    });
    detail::require_config(t_new <= o_.max_chunk, where, [&] {
      return "T_new=" + std::to_string(t_new) + " with " + describe() +
             (o_.window > 0 ? ": a sliding-window cache takes at most max_chunk tokens at once "
                              "(the chunk's first query needs the keys its last tokens would "
                              "overwrite); append a longer prefill in chunks"
                            : ": more tokens than the capacity");
    });
    const Index limit = o_.window > 0 ? std::numeric_limits<Index>::max() : o_.capacity;
    for (Index b = first_item; b < first_item + items; ++b) {
      detail::require_config(len(b) <= limit - t_new, where, [&] {
        if (o_.window > 0) {
          return "item " + std::to_string(b) + " is at position " + std::to_string(len(b)) +
                 "; T_new=" + std::to_string(t_new) + " more overflow the position counter";
        }
        return "item " + std::to_string(b) + " has length " + std::to_string(len(b)) +
               "; T_new=" + std::to_string(t_new) +
               " more exceeds capacity=" + std::to_string(o_.capacity);
      });
    }
  }

  // ---- unchecked internals (their callers checked) ----

  Index len(Index b) const noexcept { return end_[static_cast<std::size_t>(b)]; }
  Index first(Index b) const noexcept { return first_[static_cast<std::size_t>(b)]; }
  /// The ring's rows (capacity without sinks).
  Index ring() const noexcept { return o_.capacity - o_.sink_tokens; }
  /// Rows holding item b's tokens (with sinks: every row once one is written).
  Index used_slots(Index b) const noexcept {
    return o_.sink_tokens > 0 && len(b) > 0 ? o_.capacity : std::min(len(b), o_.capacity);
  }

  // ---- layout (bytes; see the class comment) ----

  Index element_bytes() const noexcept {
    return o_.element == KVElement::kScalar ? static_cast<Index>(sizeof(Scalar)) : 1;
  }
  /// Elements per scale (kv_group()).
  Index group(Index width) const noexcept { return detail::kv_group(o_, width); }
  /// A row's bytes (kv_row_bytes()) and its head block's (capacity rows, rounded up to 64
  /// bytes); false on overflow.
  bool block_bytes(Index width, Index& row, Index& block) const noexcept {
    const Index line = static_cast<Index>(detail::kAlignment);
    Index rows = 0;
    if (!detail::kv_row_bytes<Scalar>(o_, width, row) ||
        !detail::checked_mul(o_.capacity, row, rows) ||
        !detail::checked_add(rows, line - 1, block)) {
      return false;
    }
    block = block / line * line;
    return true;
  }
  Index row_bytes(int part) const noexcept { return part == 0 ? k_row_ : v_row_; }
  Index head_bytes(int part) const noexcept { return part == 0 ? k_block_ : v_block_; }
  Index width(int part) const noexcept { return part == 0 ? o_.head_dim : o_.value_head_dim; }
  /// Head `head` (0 .. 2 H_kv - 1: keys, then values) of item b.
  unsigned char* head_block(Index b, Index head) const noexcept {
    const Index h = head % o_.num_kv_heads;
    return storage_.data() + b * item_ +
           (head < o_.num_kv_heads ? h * k_block_ : o_.num_kv_heads * k_block_ + h * v_block_);
  }
  unsigned char* row_at(Index b, int part, Index h, Index slot_index) const noexcept {
    return head_block(b, part * o_.num_kv_heads + h) + slot_index * row_bytes(part);
  }
  Scalar* scalars(Index offset) const noexcept {
    return reinterpret_cast<Scalar*>(storage_.data() + offset);
  }
  float* scale_base() const noexcept {
    return reinterpret_cast<float*>(storage_.data() + scales_at_);
  }
  /// The scales of item b, part, head h, slot (null when the rows have none).
  float* scales_at(Index b, int part, Index h, Index slot_index) const noexcept {
    const Index n = part == 0 ? k_scales_ : v_scales_;
    if (n == 0) return nullptr;
    return scale_base() + b * scale_item_ + part * o_.num_kv_heads * o_.capacity * k_scales_ +
           (h * o_.capacity + slot_index) * n;
  }
  Scalar* slot(Index b, int part, Index h, Index position) noexcept {
    return reinterpret_cast<Scalar*>(row_at(b, part, h, position % ring()));
  }
  void require_scalar(const char* where) const {
    detail::require_config(o_.element == KVElement::kScalar, where, [&] {
      return describe() +
             ": the rows are quantised, with no Scalar view; write them with "
             "append() and read them with dequantize()";
    });
  }
  /// In-place writers (k_slot, v_slot, next_rows) write the ring alone: not with sinks.
  void require_no_sinks(const char* where) const {
    detail::require_config(o_.sink_tokens == 0, where, [&] {
      return describe() +
             ": a cache with sink_tokens keeps the sinks in rows of their own; write its "
             "rows with append()";
    });
  }
  /// Item b's row (part 0: key, 1: value) of head h at `position` as Scalars, a sink from
  /// the sink rows (the caller checked that the cache still holds the position); `wide`:
  /// room for a row of floats, for quantised rows (dequantised there, then converted).
  void load_row(Index b, int part, Index h, Index position, Scalar* to,
                float* wide) const noexcept {
    const Index n = width(part);
    const Index slot_index = position < o_.sink_tokens ? ring() + position : position % ring();
    detail::stored_row_to(o_.element, row_at(b, part, h, slot_index),
                          scales_at(b, part, h, slot_index), group(n), n, to, wide);
  }

  TensorView<Scalar, 4> storage_view(const char* where, int part, Index rows) {
    require_scalar(where);
    const Index e = element_bytes();
    return {scalars(part * o_.num_kv_heads * k_block_),
            {o_.batch, o_.num_kv_heads, rows, width(part)},
            {item_ / e, head_bytes(part) / e, row_bytes(part) / e, 1}};
  }
  TensorView<const Scalar, 3> item_view(Index b, int part) const {
    const char* where = part == 0 ? "KVCache::k" : "KVCache::v";
    detail::require(b >= 0 && b < o_.batch, where, [&] {
      return "item " + std::to_string(b) + " is outside B=" + std::to_string(o_.batch);
    });
    require_scalar(where);
    const Index e = element_bytes();
    return {reinterpret_cast<const Scalar*>(row_at(b, part, 0, 0)),
            {o_.num_kv_heads, used_slots(b), width(part)},
            {head_bytes(part) / e, row_bytes(part) / e, 1}};
  }
  TensorView<const Scalar, 4> uniform_view(int part) const {
    detail::require_config(uniform() && first(0) == 0, "KVCache::k", [&] {
      std::string lengths;
      for (Index b = 0; b < o_.batch; ++b) {
        lengths += (b ? ", " : "") + std::to_string(len(b));
      }
      return "lengths (" + lengths + ") with first position " + std::to_string(first(0)) +
             " are not one (B, H_kv, len, hd) block; use k(b) and segments(b)";
    });
    return const_cast<KVCache*>(this)->storage_view(part == 0 ? "KVCache::k" : "KVCache::v", part,
                                                    len(0));
  }

  /// Writes one row of `width(part)` elements (stride `stride`) at item b's `position`,
  /// quantised to the cache's element type (a sink also into its own row).
  void store_row(const Scalar* from, Index stride, Index b, int part, Index h,
                 Index position) noexcept {
    const Index n = width(part);
    const auto write = [&](Index slot_index) {
      unsigned char* to = row_at(b, part, h, slot_index);
      if (o_.element == KVElement::kScalar) {
        Scalar* x = reinterpret_cast<Scalar*>(to);
        for (Index e = 0; e < n; ++e) x[e] = from[e * stride];
        return;
      }
      detail::quantize_row(o_.element, from, stride, n, group(n), to,
                           scales_at(b, part, h, slot_index));
    };
    write(position % ring());
    if (position < o_.sink_tokens) write(ring() + position);
  }
  // Item `to` becomes item `from` (its used rows and their scales), or the two are swapped.
  template <class F>
  void for_each_run(Index a, Index b, Index rows, F&& f) const noexcept {
    for (Index head = 0; head < 2 * o_.num_kv_heads; ++head) {
      const int part = head < o_.num_kv_heads ? 0 : 1;
      const Index h = head % o_.num_kv_heads;
      f(row_at(a, part, h, 0), row_at(b, part, h, 0), rows * row_bytes(part));
      if (float* sa = scales_at(a, part, h, 0)) {
        const Index n = part == 0 ? k_scales_ : v_scales_;
        f(reinterpret_cast<unsigned char*>(sa),
          reinterpret_cast<unsigned char*>(scales_at(b, part, h, 0)),
          rows * n * static_cast<Index>(sizeof(float)));
      }
    }
  }
  void copy_item(Index from, Index to) noexcept {
    for_each_run(from, to, used_slots(from),
                 [](unsigned char* x, unsigned char* y, Index n) { std::copy_n(x, n, y); });
  }
  void swap_items(Index a, Index b) noexcept {
    for_each_run(
        a, b, std::max(used_slots(a), used_slots(b)),
        [](unsigned char* x, unsigned char* y, Index n) { std::swap_ranges(x, x + n, y); });
  }

  friend struct detail::KVCacheAccess;

  KVCacheOptions o_{};
  Index k_row_ = 0, v_row_ = 0, k_block_ = 0, v_block_ = 0, item_ = 0;  // bytes
  Index k_scales_ = 0, v_scales_ = 0, scale_item_ = 0;                  // floats: per row, per item
  Index scales_at_ = 0;  // bytes: where the scales start
  detail::AlignedBuffer<unsigned char> storage_;
  std::vector<Index> end_, first_;  // per item: one past the last position, first stored
  std::vector<Index> scratch_;      // reorder()'s bookkeeping, 2 B entries
  std::uint64_t owner_ = 0;         // the module whose keys it holds (see the class comment)
};

template <class Scalar>
void KVCache<Scalar>::reorder(TensorView<const Index, 1> src) {
  const char* where = "KVCache::reorder";
  const Index n = o_.batch;
  detail::require(src.extent(0) == n, where, [&] {
    return "src has " + std::to_string(src.extent(0)) + " entries, expected B=" + std::to_string(n);
  });
  for (Index b = 0; b < n; ++b) {
    detail::require_that<IndexError>(src(b) >= 0 && src(b) < n, where, [&] {
      return "src[" + std::to_string(b) + "]=" + std::to_string(src(b)) +
             " is not a batch item (B=" + std::to_string(n) + ")";
    });
  }
  const auto at = [](std::vector<Index>& v, Index b) -> Index& { return v[std::size_t(b)]; };
  detail::gather_in_place(
      src, scratch_.data(),
      [&](Index from, Index to) {  // `to` becomes a copy of `from`
        copy_item(from, to);
        at(end_, to) = at(end_, from);
        at(first_, to) = at(first_, from);
      },
      [&](Index a, Index b) {
        swap_items(a, b);
        std::swap(at(end_, a), at(end_, b));
        std::swap(at(first_, a), at(first_, b));
      });
}

ATTN_NAMESPACE_END
