// SPDX-License-Identifier: MIT
// attn/attention/kv_cache.hpp: KVCache, the keys and values of one attention layer kept
// across generation steps: preallocated, ragged lengths, optionally a sliding-window ring.
// Glossary: B = batch, H_kv = key/value heads, hd = head dim, W = window, C = largest chunk.
#pragma once

#include <algorithm>
#include <cstddef>
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
/// Not thread-safe: append, truncate, reorder and reset need exclusive access.
///
/// @tparam Scalar float or double.
template <class Scalar = float>
class KVCache {
  static_assert(std::is_floating_point_v<Scalar>, "attn::KVCache: Scalar must be float or double");

 public:
  KVCache() = default;

  /// @throws ConfigError naming the values if a size is not positive, capacity is below
  ///         window + max_chunk - 1 with a window, or the storage does not fit memory sizes.
  explicit KVCache(const KVCacheOptions& options) : o_(checked(options)) {
    if (o_.window > 0 && o_.capacity == 0) o_.capacity = o_.window + o_.max_chunk - 1;
    if (o_.window == 0) o_.max_chunk = o_.capacity;
    constexpr Index line = static_cast<Index>(detail::kAlignment / sizeof(Scalar));
    const Index padded = (o_.head_dim + line - 1) / line * line;
    row_stride_ = 16 * (padded - o_.head_dim) <= o_.head_dim ? padded : o_.head_dim;
    Index rows = 0, total = 0;
    bool fits = detail::checked_mul(o_.capacity, row_stride_, rows);
    block_ = (rows + line - 1) / line * line;  // each head block starts 64-byte aligned
    fits = fits && detail::checked_mul(block_, 2 * o_.num_kv_heads, item_) &&
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
  Index length(Index b) const noexcept { return end_[static_cast<std::size_t>(b)]; }
  /// The first position item b still stores (0 without a window or before the ring wraps).
  Index first_position(Index b) const noexcept { return first_[static_cast<std::size_t>(b)]; }
  /// The positions item b stores: length(b) - first_position(b).
  Index stored(Index b) const noexcept { return length(b) - first_position(b); }
  /// length(b) for every item, B values (for the kernel; valid until the cache changes).
  const Index* lengths() const noexcept { return end_.data(); }
  const Index* first_positions() const noexcept { return first_.data(); }
  /// True when every item has the same length (and first position).
  bool uniform() const noexcept { return uniform(0, o_.batch); }

  /// Item b's stored positions as (at most two) slot ranges in position order.
  KVSegments segments(Index b) const noexcept {
    KVSegments s;
    s.first_position = first_position(b);
    const Index n = stored(b);
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
          copy_row(&k_new(i, h, t, 0), k_new.stride(3), k_slot(b, h, length(b) + t));
          copy_row(&v_new(i, h, t, 0), v_new.stride(3), v_slot(b, h, length(b) + t));
        }
      }
    }
    advance(t_new, first_item, items);
  }

  /// The row of absolute position `position` of item b, head h (slot position % capacity
  /// with a window): where a projection writes a new token before advance(). Unchecked.
  Scalar* k_slot(Index b, Index h, Index position) noexcept { return slot(b, 0, h, position); }
  Scalar* v_slot(Index b, Index h, Index position) noexcept { return slot(b, 1, h, position); }

  /// The rows the next t_new tokens of items first_item .. first_item + items - 1 (items < 0:
  /// to the last) will occupy, as (items, 2 H_kv, t_new, hd): heads 0 .. H_kv-1 are keys,
  /// H_kv .. 2 H_kv - 1 values, one stride between all of them (a head-major GEMM output).
  /// Write them, then advance(). Needs equal lengths over the items and no ring wrap inside.
  /// @throws ConfigError naming the values otherwise, or when the items would overflow.
  TensorView<Scalar, 4> next_rows(Index t_new, Index first_item = 0, Index items = -1) {
    const char* where = "KVCache::next_rows";
    if (items < 0) items = o_.batch - first_item;
    detail::require(first_item >= 0 && items >= 0 && first_item <= o_.batch - items, where, [&] {
      return "items [" + std::to_string(first_item) + ", " + std::to_string(first_item + items) +
             ") are outside B=" + std::to_string(o_.batch);
    });
    check_room(where, first_item, items, t_new);
    const Index len = items > 0 ? length(first_item) : 0;
    detail::require_config(
        uniform(first_item, first_item + items) && len % o_.capacity + t_new <= o_.capacity, where,
        [&] {
          return describe() + ": the next " + std::to_string(t_new) +
                 " rows are not one strided block (lengths differ or the "
                 "ring wraps); use k_slot()/v_slot() or append()";
        });
    return {storage_.data() + first_item * item_ + (len % o_.capacity) * row_stride_,
            {items, 2 * o_.num_kv_heads, t_new, o_.head_dim},
            {item_, block_, row_stride_, 1}};
  }

  /// Counts t_new more tokens for items first_item .. (items < 0: to the last) after their
  /// rows were written in place. @throws ConfigError when an item would overflow.
  void advance(Index t_new, Index first_item = 0, Index items = -1) {
    if (items < 0) items = o_.batch - first_item;
    check_room("KVCache::advance", first_item, items, t_new);
    for (Index b = first_item; b < first_item + items; ++b) {
      const auto i = static_cast<std::size_t>(b);
      end_[i] += t_new;
      first_[i] = std::max(first_[i], end_[i] - o_.capacity);
    }
  }

  // ---- editing ----

  /// Forgets every token (no memory is touched).
  void reset() noexcept {
    std::fill(end_.begin(), end_.end(), Index(0));
    std::fill(first_.begin(), first_.end(), Index(0));
  }

  /// Keeps item b's first n tokens (rolls back rejected speculative tokens).
  /// @throws ConfigError naming the values if n > length(b), n < 0, or (with a window) the
  ///         keys position n's window needs were already overwritten.
  void truncate(Index b, Index n) {
    detail::require(b >= 0 && b < o_.batch, "KVCache::truncate", [&] {
      return "item " + std::to_string(b) + " is outside B=" + std::to_string(o_.batch);
    });
    const Index needed = o_.window > 0 ? std::max<Index>(0, n - o_.window + 1) : 0;
    detail::require_config(
        n >= 0 && n <= length(b) && first_position(b) <= needed, "KVCache::truncate", [&] {
          return "cannot keep " + std::to_string(n) + " tokens of item " + std::to_string(b) +
                 " (length " + std::to_string(length(b)) + ", first stored position " +
                 std::to_string(first_position(b)) +
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
    detail::require_config(
        o.batch > 0 && o.num_kv_heads > 0 && o.head_dim > 0 && o.window >= 0 &&
            (window ? o.max_chunk > 0 : o.capacity > 0) &&
            (!window || o.capacity == 0 || o.capacity >= o.window + o.max_chunk - 1),
        "KVCache", [&] {
          return describe(o) +
                 ": sizes must be positive, and with a window capacity (0: "
                 "the least) must be at least window + max_chunk - 1";
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
      if (length(b) != length(begin) || first_position(b) != first_position(begin)) return false;
    }
    return true;
  }

  void check_room(const char* where, Index first_item, Index items, Index t_new) const {
    detail::require_config(t_new >= 0 && t_new <= o_.max_chunk, where, [&] {
      return "T_new=" + std::to_string(t_new) + " with " + describe() +
             (o_.window > 0 ? ": a sliding-window cache takes at most max_chunk tokens at once "
                              "(the chunk's first query needs the keys its last tokens would "
                              "overwrite); append a longer prefill in chunks"
                            : ": more tokens than the capacity");
    });
    if (o_.window > 0) return;  // a ring never overflows
    for (Index b = first_item; b < first_item + items; ++b) {
      detail::require_config(length(b) <= o_.capacity - t_new, where, [&] {
        return "item " + std::to_string(b) + " has length " + std::to_string(length(b)) +
               "; T_new=" + std::to_string(t_new) +
               " more exceeds capacity=" + std::to_string(o_.capacity);
      });
    }
  }

  Scalar* slot(Index b, int part, Index h, Index position) noexcept {
    return head_block(b, part * o_.num_kv_heads + h) + (position % o_.capacity) * row_stride_;
  }
  Index used_slots(Index b) const noexcept { return std::min(length(b), o_.capacity); }

  TensorView<Scalar, 4> storage_view(int part, Index rows) noexcept {
    return {storage_.data() + part * o_.num_kv_heads * block_,
            {o_.batch, o_.num_kv_heads, rows, o_.head_dim},
            {item_, block_, row_stride_, 1}};
  }
  TensorView<const Scalar, 3> item_view(Index b, int part) const {
    detail::require(b >= 0 && b < o_.batch, "KVCache::k", [&] {
      return "item " + std::to_string(b) + " is outside B=" + std::to_string(o_.batch);
    });
    return {storage_.data() + b * item_ + part * o_.num_kv_heads * block_,
            {o_.num_kv_heads, used_slots(b), o_.head_dim},
            {block_, row_stride_, 1}};
  }
  TensorView<const Scalar, 4> uniform_view(int part) const {
    detail::require_config(uniform() && first_position(0) == 0, "KVCache::k", [&] {
      std::string lengths;
      for (Index b = 0; b < o_.batch; ++b) {
        lengths += (b ? ", " : "") + std::to_string(length(b));
      }
      return "lengths (" + lengths + ") with first position " + std::to_string(first_position(0)) +
             " are not one (B, H_kv, len, hd) block; use k(b) and segments(b)";
    });
    return const_cast<KVCache*>(this)->storage_view(part, length(0));
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

  KVCacheOptions o_{};
  Index row_stride_ = 0, block_ = 0, item_ = 0;  // elements: row, head block, batch item
  detail::AlignedBuffer<Scalar> storage_;
  std::vector<Index> end_, first_;  // per item: one past the last position, first stored
  std::vector<Index> scratch_;      // reorder()'s bookkeeping, 2 B entries
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
