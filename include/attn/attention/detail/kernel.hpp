// SPDX-License-Identifier: MIT
// attn/attention/detail/kernel.hpp: the two attention paths (materialised and streaming)
// and the parallel driver over (batch, head, query tile).
// Glossary: B = batch, H = heads, T_q / T_k = query / key lengths, d = head dim, d_v =
// value head dim.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <Eigen/Core>

#include "attn/config.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/softmax.hpp"
#include "attn/nn/random.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/eigen.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/workspace.hpp"

namespace attn {
namespace detail {

/// Query rows per task, and key columns per streaming tile.
inline constexpr Index kQueryBlock = 64;
inline constexpr Index kKeyBlock = 128;

template <class Scalar>
struct KernelParams {
  TensorView<const Scalar, 4> q, k, v;
  TensorView<Scalar, 4> out, weights;
  const AttentionMask<Scalar>* mask = nullptr;
  bool module_causal = false;  // a module's own causal flag, combined with `mask`
  CausalAlignment module_alignment = CausalAlignment::kSquare;
  Scalar scale = 1;
  double dropout = 0.0;
  std::uint64_t dropout_seed = 0, dropout_call = 0;
};

/// The mask of one (batch, head), resolved to pointers and a per-row visible bound.
template <class Scalar>
struct HeadMask {
  Index key_limit = 0;         // keys j >= key_limit are invisible (lengths, T_k)
  bool causal = false;
  Index causal_offset = 0;     // row i sees j <= i + causal_offset
  const bool* bool_row0 = nullptr;
  Index bool_rs = 0, bool_cs = 0;
  bool bool_allows = false;
  const bool* pad = nullptr;   // key padding, true = blocked
  Index pad_cs = 0;
  const Scalar* add_row0 = nullptr;
  Index add_rs = 0, add_cs = 0;

  /// One past the last key row i may see (the loop bound).
  Index row_end(Index i) const noexcept {
    Index end = key_limit;
    if (causal) end = std::min(end, i + causal_offset + 1);
    return std::max<Index>(end, 0);
  }
  bool elementwise() const noexcept {
    return bool_row0 != nullptr || pad != nullptr || add_row0 != nullptr;
  }
  /// Applies the element-wise parts to scores s[0..n) of row i, columns j0..j0+n.
  void apply(Index i, Index j0, Scalar* s, Index n) const noexcept {
    constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
    if (add_row0 != nullptr) {
      const Scalar* a = add_row0 + i * add_rs + j0 * add_cs;
      for (Index j = 0; j < n; ++j) s[j] += a[j * add_cs];
    }
    if (bool_row0 != nullptr) {
      const bool* m = bool_row0 + i * bool_rs + j0 * bool_cs;
      for (Index j = 0; j < n; ++j) {
        if (m[j * bool_cs] != bool_allows) s[j] = kNegInf;
      }
    }
    if (pad != nullptr) {
      const bool* m = pad + j0 * pad_cs;
      for (Index j = 0; j < n; ++j) {
        if (m[j * pad_cs]) s[j] = kNegInf;
      }
    }
  }
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

template <class Scalar>
using ConstMap = MatrixMap<const Scalar>;
template <class Scalar>
using MutMap = MatrixMap<Scalar>;

template <class Scalar>
ConstMap<Scalar> block(const TensorView<const Scalar, 4>& x, Index b, Index h, Index row0,
                       Index rows) {
  return ConstMap<Scalar>(x.data() + b * x.stride(0) + h * x.stride(1) + row0 * x.stride(2), rows,
                          x.extent(3), Eigen::OuterStride<>(std::max<Index>(x.stride(2), 1)));
}
template <class Scalar>
MutMap<Scalar> block(const TensorView<Scalar, 4>& x, Index b, Index h, Index row0, Index rows) {
  return MutMap<Scalar>(x.data() + b * x.stride(0) + h * x.stride(1) + row0 * x.stride(2), rows,
                        x.extent(3), Eigen::OuterStride<>(std::max<Index>(x.stride(2), 1)));
}

/// Materialised path for query rows [i0, i1) of head (b, h). scratch: (i1 - i0) x T_k.
template <class Scalar>
void materialized_tile(const KernelParams<Scalar>& p, const HeadMask<Scalar>& mask,
                       const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                       Scalar* scratch) {
  const Index rows = i1 - i0, tk = p.k.extent(2);
  MutMap<Scalar> scores(scratch, rows, tk, Eigen::OuterStride<>(tk));
  // pass 1: scores (rows, T_k) = q k^T * scale.
  scores.noalias() = (block(p.q, b, h, i0, rows) * block(p.k, b, h, 0, tk).transpose()) * p.scale;
  const Scalar keep_scale = drop.active ? Scalar(1) / static_cast<Scalar>(1.0 - p.dropout) : Scalar(1);
  for (Index r = 0; r < rows; ++r) {
    const Index i = i0 + r;
    Scalar* s = scratch + r * tk;
    // pass 2: masks (a loop bound, then element-wise parts) and a stable softmax over
    // the visible keys; invisible keys get weight 0.
    const Index end = mask.row_end(i);
    if (mask.elementwise()) mask.apply(i, 0, s, end);
    softmax_row(s, end);
    std::fill(s + end, s + tk, Scalar(0));
    if (drop.active) {
      const std::uint64_t key = drop.row_key(i);
      for (Index j = 0; j < end; ++j) {
        s[j] = DropoutStream::keep(key, j, drop.threshold) ? s[j] * keep_scale : Scalar(0);
      }
    }
  }
  // pass 3: out (rows, d_v) = weights (rows, T_k) v (T_k, d_v).
  block(p.out, b, h, i0, rows).noalias() = scores * block(p.v, b, h, 0, tk);
  if (p.weights.data() != nullptr) block(p.weights, b, h, i0, rows) = scores;
}

/// Streaming path for query rows [i0, i1) of head (b, h): tiles of K/V with an online
/// softmax (running max m and sum l per row). scratch: rows x (kKeyBlock + d_v + 2).
template <class Scalar>
void streaming_tile(const KernelParams<Scalar>& p, const HeadMask<Scalar>& mask,
                    const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                    Scalar* scratch) {
  constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
  const Index rows = i1 - i0, dv = p.v.extent(3);
  MutMap<Scalar> acc(scratch, rows, dv, Eigen::OuterStride<>(dv));
  Scalar* s_buf = scratch + rows * dv;
  Scalar* m = s_buf + rows * kKeyBlock;
  Scalar* l = m + rows;
  acc.setZero();
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, Scalar(0));
  // Keys at or past the largest row bound are invisible to every row of the tile: causal
  // tiles wholly above the diagonal are skipped here, not masked.
  Index key_end = 0;
  for (Index i = i0; i < i1; ++i) key_end = std::max(key_end, mask.row_end(i));
  for (Index j0 = 0; j0 < key_end; j0 += kKeyBlock) {
    const Index width = std::min(kKeyBlock, key_end - j0);
    MutMap<Scalar> s(s_buf, rows, width, Eigen::OuterStride<>(width));
    // pass 1: s (rows, width) = q k[j0:j0+width]^T * scale.
    s.noalias() = (block(p.q, b, h, i0, rows) * block(p.k, b, h, j0, width).transpose()) * p.scale;
    // pass 2: online softmax; p = exp(s - m_new) replaces s, acc and l are rescaled.
    for (Index r = 0; r < rows; ++r) {
      const Index i = i0 + r;
      Scalar* row = s_buf + r * width;
      const Index visible = std::clamp<Index>(mask.row_end(i) - j0, 0, width);
      if (mask.elementwise()) mask.apply(i, j0, row, visible);
      Scalar tile_max = kNegInf;
      for (Index j = 0; j < visible; ++j) tile_max = std::max(tile_max, row[j]);
      if (tile_max == kNegInf) {  // nothing visible in this tile for this row
        std::fill(row, row + width, Scalar(0));
        continue;
      }
      const Scalar m_new = std::max(m[r], tile_max);
      const Scalar correction = m[r] == kNegInf ? Scalar(0) : std::exp(m[r] - m_new);
      Scalar sum = 0;
      for (Index j = 0; j < visible; ++j) {
        const Scalar e = std::exp(row[j] - m_new);
        row[j] = e;
        sum += e;
      }
      std::fill(row + visible, row + width, Scalar(0));
      if (drop.active) {
        const std::uint64_t key = drop.row_key(i);
        for (Index j = 0; j < visible; ++j) {
          if (!DropoutStream::keep(key, j0 + j, drop.threshold)) row[j] = Scalar(0);
        }
      }
      l[r] = l[r] * correction + sum;
      if (correction != Scalar(1)) acc.row(r) *= correction;
      m[r] = m_new;
    }
    // pass 3: acc (rows, d_v) += p (rows, width) v[j0:j0+width].
    acc.noalias() += s * block(p.v, b, h, j0, width);
  }
  // pass 4: normalise; a row that saw no key stays zero.
  auto out = block(p.out, b, h, i0, rows);
  const double keep = 1.0 - (drop.active ? p.dropout : 0.0);
  for (Index r = 0; r < rows; ++r) {
    if (l[r] > Scalar(0)) {
      out.row(r) = acc.row(r) * static_cast<Scalar>(1.0 / (static_cast<double>(l[r]) * keep));
    } else {
      out.row(r).setZero();
    }
  }
}

/// Runs one path over every (batch, head, query tile) task, in parallel when OpenMP is on.
/// Each output element is written by exactly one task in a fixed order, so results do not
/// depend on the thread count or schedule.
template <class Scalar>
void run_attention(const KernelParams<Scalar>& p, bool materialize, Workspace& ws) {
  const Index batch = p.q.extent(0), heads = p.q.extent(1), tq = p.q.extent(2);
  const Index tk = p.k.extent(2), dv = p.v.extent(3);
  const Index tiles = (tq + kQueryBlock - 1) / kQueryBlock;
  const Index tasks = batch * heads * tiles;
  const Index scratch = materialize ? kQueryBlock * tk : kQueryBlock * (kKeyBlock + dv + 2);
  const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
  for (int t = 0; t < threads; ++t) ws.get<Scalar>(Workspace::kThreadBase + t, scratch);

  const auto run_task = [&](Index task, Scalar* buffer) {
    const Index tile = task % tiles, bh = task / tiles;
    const Index b = bh / heads, h = bh % heads;
    const Index i0 = tile * kQueryBlock, i1 = std::min(tq, i0 + kQueryBlock);
    const HeadMask<Scalar> mask =
        resolve_mask(*p.mask, p.module_causal, p.module_alignment, b, h, tq, tk);
    const DropoutStream drop =
        make_dropout_stream(p.dropout, p.dropout_seed, p.dropout_call, b, h);
    if (materialize) {
      materialized_tile(p, mask, drop, b, h, i0, i1, buffer);
    } else {
      streaming_tile(p, mask, drop, b, h, i0, i1, buffer);
    }
  };
#if ATTN_HAS_OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      Scalar* buffer = ws.peek<Scalar>(Workspace::kThreadBase + thread_id());
#pragma omp for schedule(dynamic, 1)
      for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
    }
    return;
  }
#endif
  Scalar* buffer = ws.peek<Scalar>(Workspace::kThreadBase);
  for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
}

}  // namespace detail
}  // namespace attn
