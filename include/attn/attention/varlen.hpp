// SPDX-License-Identifier: MIT
// attn/attention/varlen.hpp: packed variable-length batches: the tokens of many sequences in
// one tensor without padding, cut by cumulative offsets (FlashAttention's cu_seqlens):
// SequenceOffsets, PackedSequences, the checks, the split of a packed call into one call per
// sequence (run together, in one parallel region), and the public
// scaled_dot_product_attention_varlen() and its backward. The modules' packed forwards
// (module.hpp) and the packed prefill of a KVCache (cached_forward.hpp) build on the same
// split.
// Glossary: H = heads, H_kv = key/value heads, d = head dim, d_v = value head dim, N =
// sequences, total_q / total_k = query / key rows of all sequences, T_q(s) / T_k(s) =
// sequence s's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attention/detail/call.hpp"
#include "attn/attention/options.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/mask.hpp"
#include "attn/ops/attention.hpp"
#include "attn/ops/attention_backward.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/types/element.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// The cumulative offsets of a packed batch of N sequences (FlashAttention's cu_seqlens):
/// N + 1 values 0 = o_0 <= o_1 <= ... <= o_N = total; sequence s is rows [o_s, o_{s+1}) of
/// the packed tensor (an empty sequence is allowed). Given as a std::vector (copied) or as a
/// view of the caller's Index values (not copied: it must outlive the call). The values are
/// checked by the call that reads them (ShapeError naming them).
class SequenceOffsets {
 public:
  SequenceOffsets() = default;
  SequenceOffsets(std::vector<Index> offsets) : owned_(std::move(offsets)) {}  // NOLINT: implicit
  SequenceOffsets(std::initializer_list<Index> offsets) : owned_(offsets) {}   // NOLINT: implicit
  SequenceOffsets(TensorView<const Index, 1> offsets) noexcept : view_(offsets) {}  // NOLINT
  SequenceOffsets(TensorView<Index, 1> offsets) noexcept : view_(offsets) {}        // NOLINT

  /// The offsets of sequences of the given lengths: 0, l_0, l_0 + l_1, ...
  static SequenceOffsets from_lengths(const std::vector<Index>& lengths) {
    std::vector<Index> offsets(lengths.size() + 1, 0);
    for (std::size_t s = 0; s < lengths.size(); ++s) offsets[s + 1] = offsets[s] + lengths[s];
    return SequenceOffsets(std::move(offsets));
  }

  /// The N + 1 values.
  TensorView<const Index, 1> view() const noexcept {
    if (view_.data() != nullptr) return view_;
    return {owned_.data(), {static_cast<Index>(owned_.size())}};
  }
  /// N, the number of sequences (0 when fewer than two values).
  Index sequences() const noexcept { return std::max<Index>(0, view().extent(0) - 1); }
  /// Sequence s's first row and its length.
  Index begin(Index s) const noexcept { return view()(s); }
  Index length(Index s) const noexcept { return view()(s + 1) - view()(s); }
  /// The longest sequence (FlashAttention's max_seqlen).
  Index max_length() const noexcept {
    Index longest = 0;
    for (Index s = 0; s < sequences(); ++s) longest = std::max(longest, length(s));
    return longest;
  }
  bool empty() const noexcept { return view().extent(0) == 0; }

 private:
  std::vector<Index> owned_;
  TensorView<const Index, 1> view_{};
};

/// A packed batch's offsets: the queries', and the keys' (cross-attention; empty: the
/// queries', self-attention).
struct PackedSequences {
  SequenceOffsets query, key;

  PackedSequences(SequenceOffsets q) : query(std::move(q)) {}     // NOLINT: implicit
  PackedSequences(std::vector<Index> q) : query(std::move(q)) {}  // NOLINT: implicit
  PackedSequences(TensorView<const Index, 1> q) : query(q) {}     // NOLINT: implicit
  PackedSequences(SequenceOffsets q, SequenceOffsets k) : query(std::move(q)), key(std::move(k)) {}

  /// The keys' offsets.
  const SequenceOffsets& keys() const noexcept { return key.empty() ? query : key; }
};

namespace detail {

/// The first values of `o`, for messages.
inline std::string describe_offsets(const SequenceOffsets& o) {
  const TensorView<const Index, 1> v = o.view();
  std::string text = "[";
  const Index shown = std::min<Index>(v.extent(0), 8);
  for (Index i = 0; i < shown; ++i) text += (i > 0 ? ", " : "") + std::to_string(v(i));
  if (shown < v.extent(0)) text += ", ... (" + std::to_string(v.extent(0)) + " values)";
  return text + "]";
}

/// Checks the offsets `name` of a packed tensor `rows` of shape `shape` (total rows first):
/// at least two values, the first 0, none below the one before it, the last the total.
/// @throws ShapeError naming the offsets, the entry and the tensor.
template <std::size_t Rank>
void check_offsets(const char* where, const char* name, const SequenceOffsets& o, const char* rows,
                   const Shape<Rank>& shape) {
  const TensorView<const Index, 1> v = o.view();
  const Index total = shape[0];
  const auto fail = [&](const std::string& what) {
    return std::string(name) + " = " + describe_offsets(o) + " " + what;
  };
  require(v.extent(0) >= 2, where, [&] {
    return fail("has " + std::to_string(v.extent(0)) +
                " values; a packed batch of N sequences needs N + 1 >= 2 cumulative offsets "
                "(0, then each sequence's end)");
  });
  require(v(0) == 0, where, [&] { return fail("starts at " + std::to_string(v(0)) + ", not 0"); });
  for (Index i = 1; i < v.extent(0); ++i) {
    require(v(i) >= v(i - 1), where, [&] {
      return fail("decreases at entry " + std::to_string(i) + " (" + std::to_string(v(i - 1)) +
                  " then " + std::to_string(v(i)) + "): offsets must be non-decreasing");
    });
  }
  require(v(v.extent(0) - 1) == total, where, [&] {
    return fail("ends at " + std::to_string(v(v.extent(0) - 1)) + ", but " + rows + " " +
                to_string(shape) + " has " + std::to_string(total) +
                " rows: the last offset is the total");
  });
}

/// Checks a packed batch's offsets against its query rows (the tensor `queries` of shape
/// `query_shape`, total rows first) and key rows: check_offsets() for each, and as many key
/// ranges as query ranges. @throws ShapeError naming the offsets and the shapes.
template <std::size_t Rank>
void check_packed_offsets(const char* where, const PackedSequences& seqs, const char* queries,
                          const Shape<Rank>& query_shape, const char* keys,
                          const Shape<Rank>& key_shape) {
  const SequenceOffsets &cq = seqs.query, &ck = seqs.keys();
  check_offsets(where, seqs.key.empty() ? "cu_seqlens" : "cu_seqlens_q", cq, queries, query_shape);
  check_offsets(where, "cu_seqlens_k", ck, keys, key_shape);
  require(cq.sequences() == ck.sequences(), where, [&] {
    return "cu_seqlens_q = " + describe_offsets(cq) + " holds " + std::to_string(cq.sequences()) +
           " sequences, cu_seqlens_k = " + describe_offsets(ck) + " holds " +
           std::to_string(ck.sequences()) + ": one key range per query range";
  });
}

/// A packed (total, H, d) tensor as the (1, H, total, d) view the drivers read.
template <class T>
TensorView<T, 4> packed_heads(TensorView<T, 3> x) noexcept {
  return {x.data(),
          {1, x.extent(1), x.extent(0), x.extent(2)},
          {x.extent(0) * x.stride(0), x.stride(1), x.stride(0), x.stride(2)}};
}

/// The mask of a packed call: its causal bound and sliding window only (the element-wise
/// parts and key lengths describe a padded batch). @throws ShapeError otherwise.
template <class Scalar>
void check_packed_mask(const char* where, const AttentionMask<Scalar>& mask) {
  require(mask.bool_mask().data() == nullptr && mask.additive_mask().data() == nullptr &&
              !mask.has_key_padding() && !mask.has_key_lengths(),
          where, [] {
            return std::string(
                "a packed batch takes only the causal bound and sliding window of a mask "
                "(applied per sequence); boolean, additive and key padding masks and key "
                "lengths describe a padded batch: the offsets already bound each sequence");
          });
}

/// Splits `whole`, a checked call over packed (1, H, total, .) views, into one call per
/// sequence with queries (written in place into `calls`, room for seqs.query.sequences();
/// sequences without queries left out; returns how many), each a call of one
/// item over its rows: the mask (causal bound and window) and the module's bound resolved
/// per sequence, the dropout hash's batch index the sequence's. A sequence with queries and
/// no keys gets one key row hidden by a key length of 0 (its rows give zeros, as a query
/// that sees no key does). With `whole_grads`, `grads` (as much room) receives each call's
/// gradients (grad_sinks shared: each call adds its own sum, in sequence order), and with
/// `whole_narrow` (a bfloat16 module's backward: the forward's Q, K, V and O in bfloat16,
/// BackwardNarrow) `narrows` each call's rows of them.
/// Operand: q, k, v and out's element type (Scalar, or a storage type: no gradients).
/// @throws ShapeError for offsets that do not fit (check_offsets()), or a kSquare causal
///         bound over a sequence with T_q(s) != T_k(s).
template <class Scalar, class Operand = Scalar>
Index split_packed(const char* where, const AttentionCall<Scalar, Operand>& whole,
                   const PackedSequences& seqs, const AttentionMask<Scalar>& mask,
                   const CausalBound& module, AttentionCall<Scalar, Operand>* calls,
                   const AttentionGradients<Scalar>* whole_grads = nullptr,
                   AttentionGradients<Scalar>* grads = nullptr,
                   const BackwardNarrow* whole_narrow = nullptr,
                   BackwardNarrow* narrows = nullptr) {
  static constexpr Index kNoKeys = 0;
  const SequenceOffsets &cq = seqs.query, &ck = seqs.keys();
  const Index total_q = whole.queries(), total_k = whole.keys();
  check_packed_offsets(where, seqs, "q", Shape<3>{total_q, whole.heads(), whole.head_dim()}, "k",
                       Shape<3>{total_k, whole.kv_heads(), whole.head_dim()});
  check_packed_mask(where, mask);
  const bool square = (mask.is_causal() && mask.alignment() == CausalAlignment::kSquare) ||
                      (module.causal && module.alignment == CausalAlignment::kSquare);
  Index count = 0;
  for (Index s = 0; s < cq.sequences(); ++s) {
    const Index q0 = cq.begin(s), tq = cq.length(s), k0 = ck.begin(s), tk = ck.length(s);
    require(!square || tq == tk, where, [&] {
      return "causal attention with CausalAlignment::kSquare needs T_q == T_k in every "
             "sequence; sequence " +
             std::to_string(s) + " has T_q=" + std::to_string(tq) + ", T_k=" + std::to_string(tk) +
             ": choose CausalAlignment::kTopLeft or kBottomRight explicitly";
    });
    if (tq == 0) continue;
    // A sequence without keys reads one real row, hidden by a key length of 0.
    const Index j0 = tk > 0 ? k0 : std::min(k0, total_k - 1), j1 = tk > 0 ? k0 + tk : j0 + 1;
    AttentionCall<Scalar, Operand> call = whole;
    call.args.q = slice(whole.args.q, 2, q0, q0 + tq);
    call.args.k = slice(whole.args.k, 2, j0, j1);
    call.args.v = slice(whole.args.v, 2, j0, j1);
    call.args.out = slice(whole.args.out, 2, q0, q0 + tq);
    if (whole.args.lse.data() != nullptr) call.args.lse = slice(whole.args.lse, 2, q0, q0 + tq);
    call.mask = mask.resolve(where, tq, j1 - j0, module);
    if (tk == 0) call.mask.key_lengths = TensorView<const Index, 1>(&kNoKeys, {1});
    call.dropout_item = s;
    new (calls + count) AttentionCall<Scalar, Operand>(call);
    if constexpr (std::is_same_v<Operand, Scalar>) {
      if (grads != nullptr) {
        AttentionGradients<Scalar> g = *whole_grads;
        g.grad_out = slice(whole_grads->grad_out, 2, q0, q0 + tq);
        g.grad_q = slice(whole_grads->grad_q, 2, q0, q0 + tq);
        g.grad_k = slice(whole_grads->grad_k, 2, j0, j1);
        g.grad_v = slice(whole_grads->grad_v, 2, j0, j1);
        new (grads + count) AttentionGradients<Scalar>(g);
      }
      if (narrows != nullptr) {
        new (narrows + count) BackwardNarrow{
            slice(whole_narrow->q, 2, q0, q0 + tq), slice(whole_narrow->k, 2, j0, j1),
            slice(whole_narrow->v, 2, j0, j1), slice(whole_narrow->out, 2, q0, q0 + tq)};
      }
    }
    ++count;
  }
  return count;
}

/// The packed forward: make_call() on the whole packed views (the shapes, options, memory
/// and scale, checked once), the split into one call per sequence, and one run of them all.
/// q (1, H, total_q, d), k and v (1, H_kv, total_k, .), out (1, H, total_q, d_v), lse empty
/// or (1, H, total_q). Operand: q, k, v and out's element type (Scalar, or a storage type with
/// a float Scalar: the streaming path, as attend_storage()).
template <class Scalar, class Operand = Scalar>
void attend_packed(const char* where, TensorView<const identity_t<Operand>, 4> q,
                   TensorView<const identity_t<Operand>, 4> k,
                   TensorView<const identity_t<Operand>, 4> v, TensorView<Operand, 4> out,
                   const PackedSequences& seqs, const AttentionMask<Scalar>& mask,
                   const AttentionOptions& options, Workspace& ws, const CausalBound& module = {},
                   TensorView<Scalar, 3> lse = {}) {
  check_packed_mask(where, mask);
  if constexpr (!std::is_same_v<Operand, Scalar>) {
    require_config(options.path != AttentionPath::kMaterialized, where, [] {
      return std::string(element_name<Operand>()) +
             " operands take the streaming path only; kMaterialized needs float or double";
    });
  }
  const AttentionCall<Scalar, Operand> whole =
      make_call<Scalar, Operand>(where, q, k, v, out, {}, lse, AttentionMask<Scalar>(), options);
  AttentionCall<Scalar, Operand>* const calls =
      std::get<0>(workspace_tables<AttentionCall<Scalar, Operand>>(ws, WorkspaceSlot::kCallTable,
                                                                   seqs.query.sequences()));
  run_attention(calls, split_packed(where, whole, seqs, mask, module, calls), ws);
}

/// The backward of `whole`, a checked backward call over packed (1, H, total, .) views made
/// without a mask or module bound (backward_call()), and its gradients `grads`: the split
/// (split_packed(): `mask` and `module` resolved per sequence), one run. `narrow`, when not
/// null, the whole call's q, k, v and out in bfloat16 (BackwardNarrow), split with them.
/// The calls' tables are the workspace's (kCallTable).
template <class Scalar>
void run_packed_backward(const char* where, const AttentionCall<Scalar>& whole,
                         const AttentionGradients<Scalar>& grads, const PackedSequences& seqs,
                         const AttentionMask<Scalar>& mask, const CausalBound& module,
                         Workspace& ws, const BackwardNarrow* narrow = nullptr) {
  const auto [calls, call_grads, narrows] =
      workspace_tables<AttentionCall<Scalar>, AttentionGradients<Scalar>, BackwardNarrow>(
          ws, WorkspaceSlot::kCallTable, seqs.query.sequences());
  const Index count = split_packed(where, whole, seqs, mask, module, calls, &grads, call_grads,
                                   narrow, narrow != nullptr ? narrows : nullptr);
  run_attention_backward(calls, call_grads, count, ws, narrow != nullptr ? narrows : nullptr);
}

/// The packed backward: backward_call() on the whole packed views (the forward's checks,
/// then the gradients', the logsumexp's and their memory), the split, one run
/// (run_packed_backward()).
template <class Scalar>
void attend_packed_backward(const char* where, TensorView<const Scalar, 4> q,
                            TensorView<const Scalar, 4> k, TensorView<const Scalar, 4> v,
                            TensorView<const Scalar, 4> out, TensorView<const Scalar, 3> lse,
                            const AttentionGradients<Scalar>& grads, const PackedSequences& seqs,
                            const AttentionMask<Scalar>& mask, const AttentionOptions& options,
                            Workspace& ws, const CausalBound& module = {},
                            bool own_gradients = false) {
  check_packed_mask(where, mask);
  run_packed_backward(where,
                      backward_call<Scalar>(where, q, k, v, out, lse, grads,
                                            AttentionMask<Scalar>(), options, {}, own_gradients),
                      grads, seqs, mask, module, ws);
}

}  // namespace detail

/// Scaled dot-product attention over a packed batch of variable-length sequences
/// (FlashAttention's flash_attn_varlen_func): the rows of N sequences back to back, no
/// padding. q (total_q, H, d), k (total_k, H_kv, d), v (total_k, H_kv, d_v) -> out (total_q,
/// H, d_v); sequence s's queries are rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q and out,
/// its keys rows [cu_seqlens_k[s], cu_seqlens_k[s+1]) of k and v, and each sequence attends
/// only to its own keys. Self-attention passes the same offsets twice; cross-attention
/// (different query and key lengths) two.
///
/// The mask may hold a causal bound and a sliding window, applied per sequence with the
/// sequence's own T_q(s) and T_k(s) (kBottomRight: the last query of each sequence sees its
/// last key; kSquare needs T_q(s) == T_k(s)); element-wise masks and key lengths are refused
/// (the offsets bound each sequence). The options are those of
/// scaled_dot_product_attention(), variants included (softcap, ALiBi measured within each
/// sequence, sinks); dropout's keep decisions hash sequence s as batch item s. No weights.
///
/// One parallel region runs the tasks of every sequence (a long sequence's query tiles and
/// a short one's share the threads). Each sequence's rows are bit-identical to
/// scaled_dot_product_attention() on that sequence alone ((1, H, T, d) views, the same mask
/// and options, dropout aside), and to any thread count. A sequence with queries but no
/// keys gives zero rows. The offsets: N + 1 values each, from 0, non-decreasing, ending at
/// the tensor's rows (SequenceOffsets). The workspace's buffers (the table of N sequences'
/// calls too) serve any later call as large: then nothing is allocated.
///
/// Scalar may also be bfloat16 or float16 (q, k, v and out of that type; the mask and the
/// options' per-head values in float), computed as scaled_dot_product_attention() computes
/// those types (the streaming path only), each sequence's rows again bit-identical to that
/// call on the sequence alone.
///
/// @throws ShapeError on offsets that do not fit (naming them and the shapes), shapes that do
///         not fit, a mask with element-wise parts, and as scaled_dot_product_attention().
template <class Scalar>
void scaled_dot_product_attention_varlen(TensorView<const detail::identity_t<Scalar>, 3> q,
                                         TensorView<const detail::identity_t<Scalar>, 3> k,
                                         TensorView<const detail::identity_t<Scalar>, 3> v,
                                         const SequenceOffsets& cu_seqlens_q,
                                         const SequenceOffsets& cu_seqlens_k,
                                         TensorView<Scalar, 3> out, Workspace& workspace,
                                         const AttentionMask<compute_type_t<Scalar>>& mask = {},
                                         const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar> || std::is_same_v<Scalar, bfloat16> ||
                    std::is_same_v<Scalar, float16>,
                "attn::scaled_dot_product_attention_varlen: Scalar must be float, double, "
                "bfloat16 or float16");
  detail::attend_packed<compute_type_t<Scalar>, Scalar>(
      "scaled_dot_product_attention_varlen", detail::packed_heads(q), detail::packed_heads(k),
      detail::packed_heads(v), detail::packed_heads(out), {cu_seqlens_q, cu_seqlens_k}, mask,
      options, workspace);
}

/// The same, also writing each query's logsumexp into `logsumexp` (H, total_q) (as
/// FlashAttention's varlen softmax_lse): what the backward reads.
template <class Scalar>
void scaled_dot_product_attention_varlen(TensorView<const detail::identity_t<Scalar>, 3> q,
                                         TensorView<const detail::identity_t<Scalar>, 3> k,
                                         TensorView<const detail::identity_t<Scalar>, 3> v,
                                         const SequenceOffsets& cu_seqlens_q,
                                         const SequenceOffsets& cu_seqlens_k,
                                         TensorView<Scalar, 3> out, TensorView<Scalar, 2> logsumexp,
                                         Workspace& workspace,
                                         const AttentionMask<detail::identity_t<Scalar>>& mask = {},
                                         const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention_varlen: Scalar must be float or double");
  detail::require(logsumexp.data() != nullptr, "scaled_dot_product_attention_varlen",
                  [] { return std::string("logsumexp is empty"); });
  detail::attend_packed<Scalar>("scaled_dot_product_attention_varlen", detail::packed_heads(q),
                                detail::packed_heads(k), detail::packed_heads(v),
                                detail::packed_heads(out), {cu_seqlens_q, cu_seqlens_k}, mask,
                                options, workspace, {}, unsqueeze(logsumexp, 0));
}

/// The backward of scaled_dot_product_attention_varlen(): given grad_out (total_q, H, d_v),
/// ADDS dL/dq, dL/dk, dL/dv into grad_q, grad_k, grad_v (zero them first), as
/// scaled_dot_product_attention_backward() does per sequence (the same paths; the streaming
/// one reads the forward's `logsumexp` (H, total_q)), in one parallel region, each
/// sequence's rows bit-identical to its backward alone. With sinks and a `grad_sinks` (H),
/// each sequence's dL/dsink_h is added into it in sequence order.
/// @throws as the forward, and as scaled_dot_product_attention_backward().
template <class Scalar>
void scaled_dot_product_attention_varlen_backward(
    TensorView<const detail::identity_t<Scalar>, 3> q,
    TensorView<const detail::identity_t<Scalar>, 3> k,
    TensorView<const detail::identity_t<Scalar>, 3> v, const SequenceOffsets& cu_seqlens_q,
    const SequenceOffsets& cu_seqlens_k, TensorView<const detail::identity_t<Scalar>, 3> out,
    TensorView<const detail::identity_t<Scalar>, 3> grad_out,
    TensorView<const detail::identity_t<Scalar>, 2> logsumexp, TensorView<Scalar, 3> grad_q,
    TensorView<Scalar, 3> grad_k, TensorView<Scalar, 3> grad_v, Workspace& workspace,
    const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}, TensorView<Scalar, 1> grad_sinks = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention_varlen_backward: Scalar must be float or "
                "double");
  using detail::packed_heads;
  const TensorView<const Scalar, 3> lse =
      logsumexp.data() != nullptr ? unsqueeze(logsumexp, 0) : TensorView<const Scalar, 3>();
  detail::attend_packed_backward<Scalar>("scaled_dot_product_attention_varlen_backward",
                                         packed_heads(q), packed_heads(k), packed_heads(v),
                                         packed_heads(out), lse,
                                         {packed_heads(grad_out), packed_heads(grad_q),
                                          packed_heads(grad_k), packed_heads(grad_v), grad_sinks},
                                         {cu_seqlens_q, cu_seqlens_k}, mask, options, workspace);
}

ATTN_NAMESPACE_END
