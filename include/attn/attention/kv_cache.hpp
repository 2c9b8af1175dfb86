// SPDX-License-Identifier: MIT
// attn/attention/kv_cache.hpp: KVCache, the keys and values of one attention layer kept
// across generation steps: preallocated, ragged lengths, optionally a sliding-window ring.
// Glossary: B = batch, H_kv = key/value heads, hd = head dim, W = window, C = largest chunk.
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
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/memory.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {
struct KVCacheAccess;
}  // namespace detail

/// Configuration of a KVCache.
struct KVCacheOptions {
  Index batch = 1;
  Index num_kv_heads = 1;
  Index head_dim = 0;
  /// Positions stored per item. Without a window: the longest sequence. With one: 0 means
  /// window + max_chunk - 1 (the least that works, see KVCache); a larger value is allowed.
  Index capacity = 0;
  /// Sliding window W (0: none): the query at position p sees keys in (p - W, p].
  Index window = 0;
  /// With a window: the most tokens one append() takes (a chunk of a prefill, or 1 to decode).
  Index max_chunk = 1;
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
/// hd). Keys and values of an item are one (2 H_kv, rows, hd) run with one head stride, so a
/// single GEMM with the stacked [W_k; W_v] can write both straight into the cache (the GEMM's
/// head-major output uses one stride between head segments; see next_rows()). Rows are padded
/// to a multiple of 64 bytes when that costs at most 1/16 of a row (hd = 64, 80, 96, 128 and
/// 256 floats need no padding), else kept dense; each head block starts 64-byte aligned. So
/// bytes() is within 6.25 % (plus 64 bytes per block) of the keys and values themselves.
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
/// @tparam Scalar float or double.
template <class Scalar = float>
class KVCache {
  static_assert(std::is_floating_point_v<Scalar>, "attn::KVCache: Scalar must be float or double");

 public:
  /// An empty cache of no items (assign a real one before use; every item index is refused).
  KVCache() noexcept : o_{0, 0, 0, 0, 0, 0} {}

  /// @throws ConfigError naming the values if a size is not positive, capacity is below
  ///         window + max_chunk - 1 with a window, or the storage does not fit memory sizes.
  explicit KVCache(const KVCacheOptions& options) : o_(checked(options)) {
    if (o_.window > 0 && o_.capacity == 0) {
      detail::checked_sum(o_.capacity, o_.window, o_.max_chunk, Index(-1));  // checked()
    }
    if (o_.window == 0) o_.max_chunk = o_.capacity;
    constexpr Index line = static_cast<Index>(detail::kAlignment / sizeof(Scalar));
    Index padded = 0, rows = 0, block = 0, heads = 0, total = 0;
    bool fits = detail::checked_add(o_.head_dim, line - 1, padded);
    padded = padded / line * line;
    // padded - head_dim < line <= 16: the product cannot overflow.
    row_stride_ = fits && 16 * (padded - o_.head_dim) <= o_.head_dim ? padded : o_.head_dim;
    fits = fits && detail::checked_mul(o_.capacity, row_stride_, rows) &&
           detail::checked_add(rows, line - 1, block);
    block_ = block / line * line;  // each head block starts 64-byte aligned
    fits = fits && detail::checked_mul(o_.num_kv_heads, Index(2), heads) &&
           detail::checked_product(item_, block_, heads) &&
           detail::checked_mul(item_, o_.batch, total) &&
           static_cast<std::size_t>(total) <= detail::kMaxObjectBytes / sizeof(Scalar);
    detail::require_config(fits, "KVCache", [&] { return describe() + ": too large"; });
    storage_ = detail::AlignedBuffer<Scalar>(static_cast<std::size_t>(total));
    std::fill_n(storage_.data(), total, Scalar(0));
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
  Index capacity() const noexcept { return o_.capacity; }
  /// The sliding window (0: none).
  Index window() const noexcept { return o_.window; }
  /// The most tokens one append() takes: max_chunk with a window, else capacity.
  Index max_chunk() const noexcept { return o_.max_chunk; }
  /// Elements between consecutive rows (head_dim, or padded to 64 bytes).
  Index row_stride() const noexcept { return row_stride_; }
  /// Bytes held, and the bytes of the keys and values themselves (2 B H_kv capacity hd).
  std::size_t bytes() const noexcept { return storage_.capacity() * sizeof(Scalar); }
  std::size_t payload_bytes() const noexcept {
    return static_cast<std::size_t>(2 * o_.batch * o_.num_kv_heads * o_.capacity * o_.head_dim) *
           sizeof(Scalar);
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
    s.slot[0] = s.first_position % o_.capacity;
    s.count[0] = std::min(n, o_.capacity - s.slot[0]);
    s.count[1] = n - s.count[0];
    return s;
  }

  // ---- views ----

  /// All slots, (B, H_kv, capacity, hd): what the kernel reads with lengths() and segments().
  TensorView<Scalar, 4> k_storage() noexcept { return storage_view(0, o_.capacity); }
  TensorView<Scalar, 4> v_storage() noexcept { return storage_view(1, o_.capacity); }
  TensorView<const Scalar, 4> k_storage() const noexcept {
    return const_cast<KVCache*>(this)->storage_view(0, o_.capacity);
  }
  TensorView<const Scalar, 4> v_storage() const noexcept {
    return const_cast<KVCache*>(this)->storage_view(1, o_.capacity);
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

  /// Appends k_new and v_new (B', H_kv, T_new, hd) (any strides) to items first_item ..
  /// first_item + B' - 1, each at its own length. Nothing is written unless every check passes.
  /// @throws ShapeError on wrong shapes or items; ConfigError when an item would overflow
  ///         capacity, or T_new exceeds max_chunk with a window (naming the values).
  void append(TensorView<const Scalar, 4> k_new, TensorView<const Scalar, 4> v_new,
              Index first_item = 0) {
    const char* where = "KVCache::append";
    const Index items = k_new.extent(0), t_new = k_new.extent(2);
    const Shape<4> expected{items, o_.num_kv_heads, t_new, o_.head_dim};
    detail::require(k_new.shape() == expected && v_new.shape() == expected && first_item >= 0 &&
                        first_item <= o_.batch - items,
                    where, [&] {
                      return "k_new " + detail::to_string(k_new.shape()) + " and v_new " +
                             detail::to_string(v_new.shape()) + " for items from " +
                             std::to_string(first_item) +
                             ": expected both (B', H_kv, T_new, hd) "
                             "with H_kv=" +
                             std::to_string(o_.num_kv_heads) +
                             ", hd=" + std::to_string(o_.head_dim) +
                             " and items within B=" + std::to_string(o_.batch);
                    });
    check_room(where, first_item, items, t_new);
    for (Index i = 0; i < items; ++i) {
      const Index b = first_item + i;
      for (Index h = 0; h < o_.num_kv_heads; ++h) {
        for (Index t = 0; t < t_new; ++t) {
          copy_row(&k_new(i, h, t, 0), k_new.stride(3), slot(b, 0, h, len(b) + t));
          copy_row(&v_new(i, h, t, 0), v_new.stride(3), slot(b, 1, h, len(b) + t));
        }
      }
    }
    advance(t_new, first_item, items);
  }

  /// The row of absolute position `position` of item b, head h (slot position % capacity
  /// with a window): where a projection writes a new token before advance().
  /// @throws IndexError if b is not in [0, B), h not in [0, H_kv), or the position is
  ///         negative or (without a window) not below capacity.
  Scalar* k_slot(Index b, Index h, Index position) {
    return slot(b, 0, checked_slot("KVCache::k_slot", b, h, position), position);
  }
  Scalar* v_slot(Index b, Index h, Index position) {
    return slot(b, 1, checked_slot("KVCache::v_slot", b, h, position), position);
  }

  /// The rows the next t_new tokens of items first_item .. first_item + items - 1 (items < 0:
  /// to the last) will occupy, as (items, 2 H_kv, t_new, hd): heads 0 .. H_kv-1 are keys,
  /// H_kv .. 2 H_kv - 1 values, one stride between all of them (a head-major GEMM output).
  /// Write them, then advance(). Needs equal lengths over the items and no ring wrap inside.
  /// @throws ConfigError naming the values otherwise, or when the items would overflow.
  TensorView<Scalar, 4> next_rows(Index t_new, Index first_item = 0, Index items = -1) {
    const char* where = "KVCache::next_rows";
    items = checked_items(where, first_item, items);
    check_room(where, first_item, items, t_new);
    if (items == 0) return {storage_.data(), {0, 2 * o_.num_kv_heads, t_new, o_.head_dim}};
    const Index length = len(first_item);  // capacity > 0: the cache has items
    detail::require_config(
        uniform(first_item, first_item + items) && length % o_.capacity + t_new <= o_.capacity,
        where, [&] {
          return describe() + ": the next " + std::to_string(t_new) +
                 " rows are not one strided block (lengths differ or the "
                 "ring wraps); use k_slot()/v_slot() or append()";
        });
    return {storage_.data() + first_item * item_ + (length % o_.capacity) * row_stride_,
            {items, 2 * o_.num_kv_heads, t_new, o_.head_dim},
            {item_, block_, row_stride_, 1}};
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
      first_[i] = std::max(first_[i], end_[i] - o_.capacity);
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
  static KVCacheOptions checked(const KVCacheOptions& o) {
    const bool window = o.window > 0;
    detail::require_config(o.batch > 0 && o.num_kv_heads > 0 && o.head_dim > 0 && o.window >= 0 &&
                               (window ? o.max_chunk > 0 && o.capacity >= 0 : o.capacity > 0),
                           "KVCache", [&] {
                             return describe(o) +
                                    ": sizes must be positive, and with a window capacity (0: "
                                    "the least) must be at least window + max_chunk - 1";
                           });
    if (!window) return o;
    Index least = 0;
    detail::require_config(detail::checked_sum(least, o.window, o.max_chunk, Index(-1)), "KVCache",
                           [&] { return describe(o) + ": window + max_chunk - 1 overflows"; });
    detail::require_config(o.capacity == 0 || o.capacity >= least, "KVCache", [&] {
      return describe(o) + ": with a window capacity (0: the least) must be at least window + " +
             "max_chunk - 1 = " + std::to_string(least);
    });
    return o;
  }
  static std::string describe(const KVCacheOptions& o) {
    std::string text = "B=" + std::to_string(o.batch) + ", H_kv=" + std::to_string(o.num_kv_heads) +
                       ", head_dim=" + std::to_string(o.head_dim) +
                       ", capacity=" + std::to_string(o.capacity);
    if (o.window != 0) {
      text += ", window=" + std::to_string(o.window) + ", max_chunk=" + std::to_string(o.max_chunk);
    }
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
  Scalar* slot(Index b, int part, Index h, Index position) noexcept {
    return head_block(b, part * o_.num_kv_heads + h) + (position % o_.capacity) * row_stride_;
  }
  Index used_slots(Index b) const noexcept { return std::min(len(b), o_.capacity); }

  TensorView<Scalar, 4> storage_view(int part, Index rows) noexcept {
    return {storage_.data() + part * o_.num_kv_heads * block_,
            {o_.batch, o_.num_kv_heads, rows, o_.head_dim},
            {item_, block_, row_stride_, 1}};
  }
  TensorView<const Scalar, 3> item_view(Index b, int part) const {
    detail::require(b >= 0 && b < o_.batch, part == 0 ? "KVCache::k" : "KVCache::v", [&] {
      return "item " + std::to_string(b) + " is outside B=" + std::to_string(o_.batch);
    });
    return {storage_.data() + b * item_ + part * o_.num_kv_heads * block_,
            {o_.num_kv_heads, used_slots(b), o_.head_dim},
            {block_, row_stride_, 1}};
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
    return const_cast<KVCache*>(this)->storage_view(part, len(0));
  }

  void copy_row(const Scalar* from, Index stride, Scalar* to) const noexcept {
    for (Index e = 0; e < o_.head_dim; ++e) to[e] = from[e * stride];
  }
  Scalar* head_block(Index b, Index head) noexcept {
    return storage_.data() + b * item_ + head * block_;
  }
  // Item `to` becomes item `from` (its used rows), or the two are swapped.
  void copy_item(Index from, Index to) noexcept {
    for (Index head = 0; head < 2 * o_.num_kv_heads; ++head) {
      std::copy_n(head_block(from, head), used_slots(from) * row_stride_, head_block(to, head));
    }
  }
  void swap_items(Index a, Index b) noexcept {
    const Index n = std::max(used_slots(a), used_slots(b)) * row_stride_;
    for (Index head = 0; head < 2 * o_.num_kv_heads; ++head) {
      std::swap_ranges(head_block(a, head), head_block(a, head) + n, head_block(b, head));
    }
  }

  friend struct detail::KVCacheAccess;

  KVCacheOptions o_{};
  Index row_stride_ = 0, block_ = 0, item_ = 0;  // elements: row, head block, batch item
  detail::AlignedBuffer<Scalar> storage_;
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
