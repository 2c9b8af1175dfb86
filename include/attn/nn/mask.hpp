// SPDX-License-Identifier: MIT
// attn/nn/mask.hpp: AttentionMask (causal, boolean with explicit polarity, additive, key
// padding; broadcast and combinable) and the notebooks' mask helpers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/ops/attention_call.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// Where the causal diagonal sits when the query and key lengths differ.
enum class CausalAlignment {
  /// Only valid when T_q == T_k; a length mismatch throws and asks for one of the two below.
  kSquare,
  /// Query i sees keys j <= i (PyTorch SDPA's is_causal).
  kTopLeft,
  /// Query i sees keys j <= i + (T_k - T_q): the last query sees every key. This is what a
  /// KV cache needs (FlashAttention >= 2.1, ONNX). Queries with i + T_k - T_q < 0 see nothing.
  kBottomRight,
  /// Bottom-right per batch item, relative to the item's own key count L_b (its key length;
  /// T_k without key_lengths): query i of item b sees j <= i + (L_b - T_q), so the last query
  /// of every item sees that item's last key. A ragged batch of KV caches (FlashAttention's
  /// variable-length form).
  kBottomRightPerItem,
  /// Query i sees keys j <= i + offset for a given offset (CausalBound::offset,
  /// AttentionMask::causal(offset)): ONNX's causal rule with a past of P keys is offset P
  /// (mask[i, j] = -inf if P + i < j), whatever T_q and T_k are. A negative offset leaves the
  /// first queries no key.
  kOffset,
};

/// A causal bound with an optional sliding window: the loop-bound part of an AttentionMask,
/// and what a causal module adds to every call it makes. Both are folded into one bound per
/// call (AttentionMask::resolve()).
struct CausalBound {
  bool causal = false;
  CausalAlignment alignment = CausalAlignment::kSquare;
  Index window = 0;  ///< sliding window W (0: none): the query on diagonal p sees (p - W, p]
  Index offset = 0;  ///< the diagonal's offset with CausalAlignment::kOffset
};

namespace detail {

/// The constant offset of `bound`'s causal diagonal for T_q queries over T_k keys (row i
/// sees j <= i + offset), or kNoCausalOffset for kBottomRightPerItem, whose offset is per
/// item. @throws ShapeError for kSquare when T_q != T_k.
inline Index causal_offset(const char* where, const CausalBound& bound, Index tq, Index tk) {
  switch (bound.alignment) {
    case CausalAlignment::kSquare:
      require(tq == tk, where, [&] {
        return "causal attention with T_q=" + std::to_string(tq) + " != T_k=" + std::to_string(tk) +
               ": choose CausalAlignment::kTopLeft or kBottomRight explicitly";
      });
      return 0;
    case CausalAlignment::kTopLeft:
      return 0;
    case CausalAlignment::kBottomRight:
      return tk - tq;
    case CausalAlignment::kOffset:
      // Kept far from the sentinel kNoCausalOffset, so that i + offset cannot overflow.
      return std::clamp(bound.offset, -kNoCausalOffset / 2, kNoCausalOffset / 2);
    case CausalAlignment::kBottomRightPerItem:
      break;
  }
  return kNoCausalOffset;
}

}  // namespace detail

/// What a query may attend to, built from any combination of:
/// - `causal(alignment)`: a loop bound in the kernels, never -inf then exp; `causal(offset)`
///   puts the diagonal at a given offset (query i sees keys j <= i + offset);
/// - `allowed(m)` / `blocked(m)`: a boolean mask whose polarity is in the name
///   (`allowed`: true = may attend, like PyTorch SDPA and ONNX; `blocked`: true = masked,
///   like nn.MultiheadAttention's attn_mask);
/// - `additive(m)`: added to the scaled scores (-inf blocks), like a float attn_mask;
/// - `key_lengths({...})`: per-batch count of valid keys (key padding by lengths);
/// - `key_padding(m)`: (B, T_k) boolean, true = padding (nn.MultiheadAttention's
///   key_padding_mask);
/// - `sliding_window(W)`: the query at position p sees keys in (p - W, p] (Mistral), p its
///   causal diagonal; a loop bound like the causal one (it implies it), never a mask tensor.
/// Boolean and additive masks broadcast: (T_q, T_k), (B, T_q, T_k) or (B, H, T_q, T_k), where
/// any B, H or T_q extent may also be 1. With `pad_keys()` their last axis may be narrower
/// than T_k: the keys past it are hidden, as ONNX's Attention pads such a mask with -inf.
/// All parts combine (a key is visible only if every part allows it). A query row with no visible
/// key gives zero output and zero weights, never NaN. A mask with a zero extent ((0, 0), (0, T_q,
/// T_k), a (B, 0) key padding) is a ShapeError when it is added, never silently ignored.
///
/// The mask stores views of the caller's mask tensors (not copies): they must outlive it.
///
/// @tparam Scalar element type of the additive mask (the attention's scalar type).
template <class Scalar = float>
class AttentionMask {
 public:
  AttentionMask() = default;

  /// Adds a causal bound.
  AttentionMask& causal(CausalAlignment alignment = CausalAlignment::kSquare) {
    bound_.causal = true;
    bound_.alignment = alignment;
    return *this;
  }
  /// Adds a causal bound whose diagonal sits at `offset`: query i sees keys j <= i + offset
  /// (CausalAlignment::kOffset; ONNX's is_causal with a past of `offset` keys).
  AttentionMask& causal(Index offset) {
    bound_.causal = true;
    bound_.alignment = CausalAlignment::kOffset;
    bound_.offset = offset;
    return *this;
  }
  /// Lets the boolean and additive masks be narrower than T_k on their last axis: keys past
  /// a mask's width M are hidden (ONNX's Attention pads a mask narrower than the total key
  /// length with -inf, and one of width 1 too). Without it such a mask is a ShapeError.
  AttentionMask& pad_keys(bool on = true) {
    pad_keys_ = on;
    return *this;
  }
  /// Adds a boolean mask where true means "may attend".
  template <class Element, std::size_t Rank>
  AttentionMask& allowed(TensorView<Element, Rank> mask) {
    bool_ = broadcast_view<bool>(mask, "AttentionMask::allowed");
    bool_allows_ = true;
    return *this;
  }
  /// Adds a boolean mask where true means "masked out".
  template <class Element, std::size_t Rank>
  AttentionMask& blocked(TensorView<Element, Rank> mask) {
    bool_ = broadcast_view<bool>(mask, "AttentionMask::blocked");
    bool_allows_ = false;
    return *this;
  }
  /// Adds a float mask added to the scaled scores; -inf blocks a key.
  template <class Element, std::size_t Rank>
  AttentionMask& additive(TensorView<Element, Rank> mask) {
    additive_ = broadcast_view<Scalar>(mask, "AttentionMask::additive");
    return *this;
  }
  // Tensor overloads; a temporary tensor would dangle, so those are deleted.
  template <std::size_t Rank>
  AttentionMask& allowed(const Tensor<bool, Rank>& mask) {
    return allowed(mask.view());
  }
  template <std::size_t Rank>
  AttentionMask& blocked(const Tensor<bool, Rank>& mask) {
    return blocked(mask.view());
  }
  template <std::size_t Rank>
  AttentionMask& additive(const Tensor<Scalar, Rank>& mask) {
    return additive(mask.view());
  }
  template <std::size_t Rank>
  AttentionMask& allowed(Tensor<bool, Rank>&&) = delete;
  template <std::size_t Rank>
  AttentionMask& blocked(Tensor<bool, Rank>&&) = delete;
  template <std::size_t Rank>
  AttentionMask& additive(Tensor<Scalar, Rank>&&) = delete;

  /// Batch item b attends to its first lengths[b] keys only.
  /// @throws ConfigError if a length is negative.
  AttentionMask& key_lengths(std::vector<Index> lengths) {
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      detail::require_config(lengths[b] >= 0, "AttentionMask::key_lengths", [&] {
        return "length " + std::to_string(lengths[b]) + " of batch item " + std::to_string(b) +
               " is negative";
      });
    }
    lengths_ = std::move(lengths);
    external_lengths_ = {};
    has_lengths_ = true;
    return *this;
  }
  /// The same from the caller's memory, not copied (no allocation: what a decoding step
  /// passes, e.g. KVCache::lengths()); the view must outlive the mask.
  /// @throws ConfigError if a length is negative.
  AttentionMask& key_lengths(TensorView<const Index, 1> lengths) {
    for (Index b = 0; b < lengths.extent(0); ++b) {
      detail::require_config(lengths(b) >= 0, "AttentionMask::key_lengths", [&] {
        return "length " + std::to_string(lengths(b)) + " of batch item " + std::to_string(b) +
               " is negative";
      });
    }
    lengths_.clear();
    external_lengths_ = lengths;
    has_lengths_ = true;
    return *this;
  }
  /// Adds a sliding window of W keys: the query on causal diagonal position p (see
  /// CausalAlignment; causal() sets the alignment) sees keys in (p - W, p]. Implies the
  /// causal bound. @throws ConfigError unless W > 0.
  AttentionMask& sliding_window(Index window) {
    detail::require_config(window > 0, "AttentionMask::sliding_window", [&] {
      return "window=" + std::to_string(window) + " must be positive";
    });
    bound_.causal = true;
    bound_.window = window;
    return *this;
  }
  /// (B, T_k) boolean, true = padding (blocked), like key_padding_mask in PyTorch.
  template <class Element>
  AttentionMask& key_padding(TensorView<Element, 2> padding) {
    static_assert(std::is_same_v<std::remove_const_t<Element>, bool>,
                  "attn::AttentionMask::key_padding: the mask holds bool");
    require_elements(padding, "AttentionMask::key_padding");
    padding_ =
        TensorView<const bool, 4>(padding.data(), {padding.extent(0), 1, 1, padding.extent(1)},
                                  {padding.stride(0), 0, 0, padding.stride(1)});
    has_padding_ = true;
    return *this;
  }
  AttentionMask& key_padding(const Tensor<bool, 2>& padding) { return key_padding(padding.view()); }
  AttentionMask& key_padding(Tensor<bool, 2>&&) = delete;

  bool is_causal() const noexcept { return bound_.causal; }
  /// Whether masks narrower than T_k are padded (pad_keys()).
  bool pads_keys() const noexcept { return pad_keys_; }
  /// The sliding window (0: none).
  Index window() const noexcept { return bound_.window; }
  CausalAlignment alignment() const noexcept { return bound_.alignment; }
  /// The causal bound and window, as one value.
  const CausalBound& causal_bound() const noexcept { return bound_; }
  bool empty() const noexcept {
    return !bound_.causal && bool_.data() == nullptr && additive_.data() == nullptr &&
           !has_lengths_ && !has_padding_;
  }
  /// The parts as rank-4 broadcast views (null data when absent); for kernels and tests.
  const TensorView<const bool, 4>& bool_mask() const noexcept { return bool_; }
  bool bool_allows() const noexcept { return bool_allows_; }
  const TensorView<const Scalar, 4>& additive_mask() const noexcept { return additive_; }
  const TensorView<const bool, 4>& padding_mask() const noexcept { return padding_; }
  bool has_key_lengths() const noexcept { return has_lengths_; }
  bool has_key_padding() const noexcept { return has_padding_; }
  /// The key lengths given as a vector (empty when given as a view).
  const std::vector<Index>& lengths() const noexcept { return lengths_; }
  /// The key lengths however they were given (empty without key lengths).
  TensorView<const Index, 1> key_lengths_view() const noexcept {
    if (external_lengths_.data() != nullptr) return external_lengths_;
    return {lengths_.data(), {static_cast<Index>(lengths_.size())}};
  }

  /// The number of heads the boolean and additive parts distinguish (their H extent;
  /// 1 when they broadcast over heads or are absent).
  Index heads() const noexcept {
    return std::max<Index>(bool_.data() != nullptr ? bool_.extent(1) : 1,
                           additive_.data() != nullptr ? additive_.extent(1) : 1);
  }
  /// The mask of head h alone: per-head parts (H extent > 1) cut to (B, 1, T_q, T_k), the
  /// rest kept. For attention computed one head at a time (MultiHeadAttentionWrapper).
  /// Check the whole mask first: h must be below heads().
  AttentionMask select_head(Index h) const {
    AttentionMask m = *this;
    m.bool_ = head_of(bool_, h);
    m.additive_ = head_of(additive_, h);
    return m;
  }

  /// Checks every part against an attention of shape (B, H, T_q, T_k).
  /// @throws ShapeError naming `where`, the part and both shapes on a mismatch.
  void check(const char* where, Index batch, Index heads, Index tq, Index tk) const {
    const Shape<4> target{batch, heads, tq, tk};
    const auto fits = [&](const Shape<4>& s) {
      for (std::size_t r = 0; r < 3; ++r) {
        if (s[r] != target[r] && s[r] != 1) return false;
      }
      return s[3] == tk || (pad_keys_ && s[3] < tk);
    };
    const auto fail = [&](const char* part, const Shape<4>& s) {
      return std::string(part) + " mask has (broadcast) shape " + detail::to_string(s) +
             ", which does not fit attention of shape (B, H, T_q, T_k) = " +
             detail::to_string(target) +
             (pad_keys_ ? " (its last axis may be narrower than T_k, not wider)"
                        : (s[3] < tk ? " (pad_keys() hides the keys past a narrower mask)" : ""));
    };
    if (bool_.data() != nullptr) {
      detail::require(fits(bool_.shape()), where,
                      [&] { return fail(bool_allows_ ? "allowed" : "blocked", bool_.shape()); });
    }
    if (additive_.data() != nullptr) {
      detail::require(fits(additive_.shape()), where,
                      [&] { return fail("additive", additive_.shape()); });
    }
    if (has_padding_) {
      const Shape<4> s = padding_.shape();
      detail::require(s[0] == batch && s[3] == tk, where, [&] {
        return "key_padding mask has shape " + detail::to_string(Shape<2>{s[0], s[3]}) +
               ", expected (B, T_k) = " + detail::to_string(Shape<2>{batch, tk});
      });
    }
    if (has_lengths_) {
      const TensorView<const Index, 1> lengths = key_lengths_view();
      detail::require(lengths.extent(0) == batch, where, [&] {
        return "key_lengths has " + std::to_string(lengths.extent(0)) +
               " entries, expected one per batch item (B=" + std::to_string(batch) + ")";
      });
      for (Index b = 0; b < batch; ++b) {
        detail::require(lengths(b) <= tk, where, [&] {
          return "key_lengths[" + std::to_string(b) + "]=" + std::to_string(lengths(b)) +
                 " exceeds T_k=" + std::to_string(tk);
        });
      }
    }
    if (bound_.causal) detail::causal_offset(where, bound_, tq, tk);
  }

  /// This mask and a module's own causal bound `module`, folded into the one mask an
  /// attention call of T_q queries over T_k keys reads (check() it first). The causal
  /// diagonals combine to the tighter one per item, the windows to the narrower one.
  /// @throws ShapeError for a kSquare alignment (the mask's or the module's) when T_q != T_k.
  detail::CallMask<Scalar> resolve(const char* where, Index tq, Index tk,
                                   const CausalBound& module = {}) const {
    detail::CallMask<Scalar> m;
    m.bool_mask = bool_;
    m.bool_allows = bool_allows_;
    m.additive = additive_;
    if (has_padding_) m.padding = padding_;
    if (has_lengths_) m.key_lengths = key_lengths_view();
    if (pad_keys_) {
      if (bool_.data() != nullptr) m.mask_keys = std::min(m.mask_keys, bool_.extent(3));
      if (additive_.data() != nullptr) m.mask_keys = std::min(m.mask_keys, additive_.extent(3));
    }
    for (const CausalBound* c : {&bound_, &module}) {
      if (!c->causal) continue;
      m.causal = true;
      m.causal_offset = std::min(m.causal_offset, detail::causal_offset(where, *c, tq, tk));
      m.per_item = m.per_item || c->alignment == CausalAlignment::kBottomRightPerItem;
      if (c->window > 0) m.window = m.window > 0 ? std::min(m.window, c->window) : c->window;
    }
    return m;
  }

 private:
  template <class Element, class ViewElement, std::size_t Rank>
  static TensorView<const Element, 4> broadcast_view(TensorView<ViewElement, Rank> m,
                                                     const char* where) {
    static_assert(std::is_same_v<std::remove_const_t<ViewElement>, Element>,
                  "attn::AttentionMask: boolean masks hold bool, additive masks hold Scalar");
    static_assert(Rank >= 2 && Rank <= 4,
                  "attn::AttentionMask: a mask has rank 2 (T_q, T_k), 3 (B, T_q, T_k) or 4 "
                  "(B, H, T_q, T_k)");
    require_elements(m, where);
    Shape<4> shape{1, 1, 1, 1}, strides{0, 0, 0, 0};
    // Right-align the mask's axes into (B, H, T_q, T_k); a 3-D mask is (B, T_q, T_k).
    if constexpr (Rank == 2) {
      shape = {1, 1, m.extent(0), m.extent(1)};
      strides = {0, 0, m.stride(0), m.stride(1)};
    } else if constexpr (Rank == 3) {
      shape = {m.extent(0), 1, m.extent(1), m.extent(2)};
      strides = {m.stride(0), 0, m.stride(1), m.stride(2)};
    } else {
      shape = m.shape();
      strides = m.strides();
    }
    for (std::size_t r = 0; r < 3; ++r) {
      if (shape[r] == 1) strides[r] = 0;  // broadcast
    }
    return {m.data(), shape, strides};
  }

  // An empty mask would be indistinguishable from none (kernels test data() for presence),
  // and no empty shape broadcasts to an attention's (B, H, T_q, T_k), whose extents are all
  // positive: it is an error, not silently ignored.
  template <class Element, std::size_t Rank>
  static void require_elements(const TensorView<Element, Rank>& m, const char* where) {
    detail::require(!m.empty(), where, [&] {
      return "mask has shape " + detail::to_string(m.shape()) +
             ", which holds no element; a mask broadcasts to (B, H, T_q, T_k) and needs every "
             "extent positive";
    });
  }

  template <class Element>
  static TensorView<const Element, 4> head_of(const TensorView<const Element, 4>& v, Index h) {
    if (v.data() == nullptr || v.extent(1) == 1) return v;
    return {v.data() + h * v.stride(1),
            {v.extent(0), 1, v.extent(2), v.extent(3)},
            {v.stride(0), 0, v.stride(2), v.stride(3)}};
  }

  TensorView<const bool, 4> bool_{};
  TensorView<const Scalar, 4> additive_{};
  TensorView<const bool, 4> padding_{};
  std::vector<Index> lengths_;
  TensorView<const Index, 1> external_lengths_{};
  CausalBound bound_;
  bool bool_allows_ = false;
  bool has_lengths_ = false;
  bool has_padding_ = false;
  bool pad_keys_ = false;
};

/// `torch.triu(torch.ones(tq, tk), diagonal=1).bool()`: true strictly above the diagonal
/// (the future positions a causal mask blocks), top-left aligned. With a floating-point
/// Element it is the notebooks' `mask` buffer itself, `torch.triu(torch.ones(n, n), 1)`.
template <class Element = bool>
Tensor<Element, 2> causal_blocked_mask(Index tq, Index tk) {
  Tensor<Element, 2> mask({tq, tk});
  for (Index i = 0; i < tq; ++i) {
    for (Index j = i + 1; j < tk; ++j) mask(i, j) = Element(1);
  }
  return mask;
}
template <class Element = bool>
Tensor<Element, 2> causal_blocked_mask(Index n) {
  return causal_blocked_mask<Element>(n, n);
}

/// `torch.triu(torch.full((n, n), -inf), diagonal=1)`: 0 on and below the diagonal and
/// -inf above it, the additive form of the causal mask (notebook 004).
template <class Scalar = float>
Tensor<Scalar, 2> causal_additive_mask(Index n) {
  Tensor<Scalar, 2> mask({n, n});
  for (Index i = 0; i < n; ++i) {
    for (Index j = i + 1; j < n; ++j) mask(i, j) = -std::numeric_limits<Scalar>::infinity();
  }
  return mask;
}

/// `x.masked_fill(mask, value)` for a (broadcast-free) boolean mask of the same shape,
/// returning a new tensor. True entries of `mask` are replaced by `value`.
/// @throws ShapeError if the shapes differ.
template <class Scalar, class MaskElement, std::size_t Rank>
Tensor<std::remove_const_t<Scalar>, Rank> masked_fill(TensorView<Scalar, Rank> x,
                                                      TensorView<MaskElement, Rank> mask,
                                                      std::remove_const_t<Scalar> value) {
  static_assert(std::is_same_v<std::remove_const_t<MaskElement>, bool>,
                "attn::masked_fill: the mask holds bool");
  detail::require(x.shape() == mask.shape(), "masked_fill", [&] {
    return "x has shape " + detail::to_string(x.shape()) + " but mask has shape " +
           detail::to_string(mask.shape());
  });
  Tensor<std::remove_const_t<Scalar>, Rank> result(x);
  auto* out = result.data();
  const bool* m = mask.data();
  detail::for_each_offset(x.shape(), row_major_strides(x.shape()), mask.strides(),
                          [&](Index o, Index i) {
                            if (m[i]) out[o] = value;
                          });
  return result;
}

ATTN_NAMESPACE_END
