// SPDX-License-Identifier: MIT
// attn/attention/detail/kernel.hpp: the attention kernel's driver: each (batch, head)'s mask
// and dropout stream, the head-major K/V copy, and the parallel loop over (batch, head, query
// tile) tasks, each run by the active kernel set (attn/kernels/generic/attention.inl holds
// both paths).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>


#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/kernels/dispatch.hpp"
#include "attn/kernels/types.hpp"
#include "attn/nn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

template <class Scalar>
struct KernelParams {
  TensorView<const Scalar, 4> q, k, v;
  TensorView<Scalar, 4> out, weights;
  TensorView<Scalar, 3> lse;  // optional: each query's logsumexp (the backward's input)
  const AttentionMask<Scalar>* mask = nullptr;
  bool module_causal = false;  // a module's own causal flag, combined with `mask`
  CausalAlignment module_alignment = CausalAlignment::kSquare;
  Scalar scale = 1;
  double dropout = 0.0;
  std::uint64_t dropout_seed = 0, dropout_call = 0;
};

template <class Scalar>
HeadMask<Scalar> resolve_mask(const AttentionMask<Scalar>& mask, bool module_causal,
                              CausalAlignment module_alignment, Index b, Index h, Index tq,
                              Index tk) {
  HeadMask<Scalar> m;
  m.key_limit = mask.has_key_lengths() ? mask.lengths()[static_cast<std::size_t>(b)] : tk;
  const auto offset = [&](CausalAlignment a) {
    return a == CausalAlignment::kBottomRight ? tk - tq : Index{0};
  };
  if (mask.is_causal() || module_causal) {
    m.causal = true;
    m.causal_offset = std::numeric_limits<Index>::max() / 2;
    if (mask.is_causal()) m.causal_offset = std::min(m.causal_offset, offset(mask.alignment()));
    if (module_causal) m.causal_offset = std::min(m.causal_offset, offset(module_alignment));
  }
  if (const auto& bm = mask.bool_mask(); bm.data() != nullptr) {
    m.bool_row0 = bm.data() + (bm.extent(0) == 1 ? 0 : b * bm.stride(0)) +
                  (bm.extent(1) == 1 ? 0 : h * bm.stride(1));
    m.bool_rs = bm.stride(2);
    m.bool_cs = bm.stride(3);
    m.bool_allows = mask.bool_allows();
  }
  if (mask.has_key_padding()) {
    const auto& pm = mask.padding_mask();
    m.pad = pm.data() + b * pm.stride(0);
    m.pad_cs = pm.stride(3);
  }
  if (const auto& am = mask.additive_mask(); am.data() != nullptr) {
    m.add_row0 = am.data() + (am.extent(0) == 1 ? 0 : b * am.stride(0)) +
                 (am.extent(1) == 1 ? 0 : h * am.stride(1));
    m.add_rs = am.stride(2);
    m.add_cs = am.stride(3);
  }
  return m;
}

/// Keys whose rows of one head span more than this many bytes are copied head-major
/// before the streaming kernel walks them: every query tile re-reads all of a head's K and
/// V, and rows scattered over tens of MiB (a (B, T, 3D) fused projection split into heads)
/// cost a TLB miss and a poorly associated cache set per row on each pass. The copy is
/// O(T_k * d) per head against O(T_q * T_k * d) of work and changes no arithmetic.
inline constexpr std::size_t kKeyValueCopyBytes = std::size_t(8) << 20;

template <class Scalar>
bool wants_head_major_copy(const TensorView<const Scalar, 4>& x) {
  const Index rows = x.extent(2), width = x.extent(3), rs = x.stride(2);
  if (x.stride(3) != 1 || rs == width || rows < 2) return false;
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(rs) * sizeof(Scalar) >
         kKeyValueCopyBytes;
}

/// Runs one path over every (batch, head, query tile) task, in parallel when OpenMP is on.
/// Each output element is written by exactly one task in a fixed order, so results do not
/// depend on the thread count or schedule.
template <class Scalar>
void run_attention(const KernelParams<Scalar>& params, bool materialize, Workspace& ws) {
  KernelParams<Scalar> copied;
  const bool copy_k = !materialize && wants_head_major_copy(params.k);
  const bool copy_v = !materialize && wants_head_major_copy(params.v);
  if (copy_k || copy_v) {
    copied = params;
    const Index k_size = copy_k ? params.k.size() : 0, v_size = copy_v ? params.v.size() : 0;
    Scalar* buffer = workspace_get<Scalar>(ws, WorkspaceSlot::kKernelKeyValue, k_size + v_size);
    // Contiguous (B, H, T, d) copies: each head's rows back to back.
    if (copy_k) {
      const TensorView<Scalar, 4> k(buffer, params.k.shape());
      attn::copy(params.k, k);
      copied.k = k;
    }
    if (copy_v) {
      const TensorView<Scalar, 4> v(buffer + k_size, params.v.shape());
      attn::copy(params.v, v);
      copied.v = v;
    }
  }
  const KernelParams<Scalar>& p = (copy_k || copy_v) ? copied : params;
  AttentionArgs<Scalar> args;
  args.q = p.q, args.k = p.k, args.v = p.v, args.out = p.out, args.weights = p.weights;
  args.lse = p.lse;
  args.scale = p.scale;
  args.dropout = p.dropout;
  const Index batch = p.q.extent(0), heads = p.q.extent(1), tq = p.q.extent(2);
  const Index tk = p.k.extent(2), dv = p.v.extent(3);
  const Index tiles = (tq + kQueryBlock - 1) / kQueryBlock;
  const Index tasks = batch * heads * tiles;
  const Index scratch = materialize ? materialized_scratch_size(p.q.extent(3), dv, tk)
                                    : stream_scratch_size(p.q.extent(3), dv);
  const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);

  with_kernels(kernel_isa(), [&](auto set) {
    const auto run_task = [&](Index task, Scalar* buffer) {
      const Index tile = task % tiles, bh = task / tiles;
      const Index b = bh / heads, h = bh % heads;
      const Index i0 = tile * kQueryBlock, i1 = std::min(tq, i0 + kQueryBlock);
      const HeadMask<Scalar> mask =
          resolve_mask(*p.mask, p.module_causal, p.module_alignment, b, h, tq, tk);
      const DropoutStream drop =
          make_dropout_stream(p.dropout, p.dropout_seed, p.dropout_call, b, h);
      set.attention_task(args, mask, drop, materialize, b, h, i0, i1, buffer);
    };
#if ATTN_HAS_OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
      {
        Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread_id());
#pragma omp for schedule(dynamic, 1)
        for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
      }
      return;
    }
#endif
    Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread);
    for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
  });
}

}  // namespace detail
ATTN_NAMESPACE_END
