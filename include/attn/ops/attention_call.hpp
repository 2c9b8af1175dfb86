// SPDX-License-Identifier: MIT
// attn/ops/attention_call.hpp: AttentionCall, the one description of an attention call that
// every front end builds (the public scaled_dot_product_attention, the module core, the
// incremental forward through a KV cache, both backward paths) and the drivers read: its
// operands, its resolved mask (CallMask), its scale, dropout and path.
// Glossary: B = batch, H = heads, H_kv = key/value heads, T_q / T_k = query / key tokens,
// L_b = item b's key count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attn/config.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/kernels/head_mask.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// No causal diagonal from a constant offset (CallMask::causal_offset).
inline constexpr Index kNoCausalOffset = std::numeric_limits<Index>::max() / 2;

/// An attention call's mask, resolved: every part a front end had (the caller's
/// AttentionMask, a module's own causal bound and window, a cache's lengths and ring) folded
/// into loop bounds and element-wise views. Row i of item b sees key j when
///   key_first[b] <= j < min(L_b, mask_keys) (L_b = key_lengths(b), or T_k),
///   causal: j <= i + offset_b, offset_b = min(causal_offset, per_item ? L_b - T_q : inf),
///   window: j > i + offset_b - window,
/// and the element-wise parts allow it. HeadMask is the same for one (b, h), as pointers.
/// Query i sits at key position i + offset_b (causal), else i + T_k - T_q: what ALiBi's
/// distances are measured from.
template <class Scalar>
struct CallMask {
  // Element-wise parts: rank-4 broadcast views (a B or H extent of 1 broadcasts; null: none).
  TensorView<const bool, 4> bool_mask;
  bool bool_allows = false;  ///< true: a true entry may attend; false: a true entry is blocked
  TensorView<const Scalar, 4> additive;  ///< added to the scaled scores; -inf blocks
  TensorView<const bool, 4> padding;     ///< (B, 1, 1, T_k), true = padding (blocked)
  /// Keys j >= mask_keys are hidden: the width of element-wise parts narrower than T_k
  /// (AttentionMask::pad_keys(), ONNX's padding of a narrow mask).
  Index mask_keys = std::numeric_limits<Index>::max();
  // Loop bounds.
  TensorView<const Index, 1> key_lengths;  ///< L_b per item (null: T_k for every item)
  const Index* key_first = nullptr;        ///< per item: keys before it are gone (a ring)
  bool causal = false;
  Index causal_offset = kNoCausalOffset;  ///< the constant part of the causal offset
  bool per_item = false;                  ///< also bound by L_b - T_q (bottom-right per item)
  Index window = 0;                       ///< sliding window (0: none; with causal)

  /// Head (b, h)'s mask for T_q queries over T_k keys. The loop bounds do not depend on h.
  HeadMask<Scalar> head(Index b, Index h, Index tq, Index tk) const noexcept {
    HeadMask<Scalar> m;
    m.key_limit = key_lengths.data() != nullptr ? key_lengths(b) : tk;
    if (key_first != nullptr) m.key_first = key_first[b];
    m.position = tk - tq;
    if (causal) {
      m.causal = true;
      m.causal_offset = per_item ? std::min(causal_offset, m.key_limit - tq) : causal_offset;
      m.window = window;
      m.position = m.causal_offset;
    }
    m.key_limit = std::min(m.key_limit, mask_keys);
    if (bool_mask.data() != nullptr) {
      m.bool_row0 = bool_mask.data() + (bool_mask.extent(0) == 1 ? 0 : b * bool_mask.stride(0)) +
                    (bool_mask.extent(1) == 1 ? 0 : h * bool_mask.stride(1));
      m.bool_rs = bool_mask.stride(2);
      m.bool_cs = bool_mask.stride(3);
      m.bool_allows = bool_allows;
    }
    if (padding.data() != nullptr) {
      m.pad = padding.data() + b * padding.stride(0);
      m.pad_cs = padding.stride(3);
    }
    if (additive.data() != nullptr) {
      m.add_row0 = additive.data() + (additive.extent(0) == 1 ? 0 : b * additive.stride(0)) +
                   (additive.extent(1) == 1 ? 0 : h * additive.stride(1));
      m.add_rs = additive.stride(2);
      m.add_cs = additive.stride(3);
    }
    return m;
  }
};

/// One attention call, complete: what the plan and the drivers read, and nothing else.
/// - args: q (B, H, T_q, d), k (B, H_kv, T_k, d), v (B, H_kv, T_k, d_v) with H_kv dividing
///   H (query head h reads key/value head h / (H / H_kv)), out (B, H, T_q, d_v), the
///   optional weights (B, H, T_q, T_k) and logsumexp (B, H, T_q), the resolved scale, the
///   dropout probability, and the ring size of a sliding-window cache's keys;
/// - mask: the resolved mask;
/// - the dropout stream's seed and call number (the keep decisions are a hash of them and
///   of (batch, head, query, key)), and the batch index of its item 0 in that hash (a packed
///   batch runs sequence s as a call of one item, dropout_item s);
/// - materialize: the materialised path (weights wanted, or asked for); else streaming.
/// A front end builds it once, after its checks; a backward reads the forward's call.
/// Operand bfloat16 or float16 (Scalar float): q, k, v and out of that type (AttentionArgs).
template <class Scalar, class Operand = Scalar>
struct AttentionCall {
  AttentionArgs<Scalar, Operand> args;
  CallMask<Scalar> mask;
  std::uint64_t dropout_seed = 0, dropout_call = 0;
  Index dropout_item = 0;
  bool materialize = false;

  Index batch() const noexcept { return args.q.extent(0); }
  Index heads() const noexcept { return args.q.extent(1); }
  Index kv_heads() const noexcept { return args.k.extent(1); }
  Index queries() const noexcept { return args.q.extent(2); }
  Index keys() const noexcept { return args.k.extent(2); }
  Index head_dim() const noexcept { return args.q.extent(3); }
  Index value_dim() const noexcept { return args.v.extent(3); }
  /// Head (b, h)'s mask.
  HeadMask<Scalar> head_mask(Index b, Index h) const noexcept {
    return mask.head(b, h, queries(), keys());
  }
};

}  // namespace detail
ATTN_NAMESPACE_END
