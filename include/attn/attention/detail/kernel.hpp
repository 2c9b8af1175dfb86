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


#include "attn/config.hpp"
#include "attn/detail/gemm.hpp"
#include "attn/detail/microkernel.hpp"
#include "attn/detail/simd.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/softmax.hpp"
#include "attn/nn/random.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
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

/// Materialised path for query rows [i0, i1) of head (b, h): the full score rows, an
/// exact (two-pass, scalar-exp) softmax, then weights times V. Straightforward on purpose:
/// it is the reference the streaming path is tested against, and what returns weights.
/// scratch: materialized_scratch_size() elements.
template <class Scalar>
constexpr Index materialized_scratch_size(Index head_dim, Index keys) noexcept {
  return kQueryBlock * keys + head_dim * keys + 64;
}

template <class Scalar>
void materialized_tile(const KernelParams<Scalar>& p, const HeadMask<Scalar>& mask,
                       const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                       Scalar* scratch) {
  const Index rows = i1 - i0, tk = p.k.extent(2), d = p.q.extent(3), dv = p.v.extent(3);
  Scalar* scores = scratch;                // (rows, T_k)
  Scalar* kt = scratch + kQueryBlock * tk;  // K^T (d, T_k)
  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1) + i0 * p.q.stride(2);
  const Scalar* k = p.k.data() + b * p.k.stride(0) + h * p.k.stride(1);
  const Scalar* v = p.v.data() + b * p.v.stride(0) + h * p.v.stride(1);
  // pass 1: scores (rows, T_k) = q k^T * scale (the micro-kernel never threads, so the
  // result does not depend on the thread count).
  pack_transposed(k, p.k.stride(2), 0, tk, 0, d, kt);
  micro_gemm<Scalar>(rows, tk, d, q, p.q.stride(2), 1, kt, tk, scores, tk, p.scale, false,
                     nullptr);
  const Scalar keep_scale =
      drop.active ? Scalar(1) / static_cast<Scalar>(1.0 - p.dropout) : Scalar(1);
  for (Index r = 0; r < rows; ++r) {
    const Index i = i0 + r;
    Scalar* s = scores + r * tk;
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
  Scalar* out = p.out.data() + b * p.out.stride(0) + h * p.out.stride(1) + i0 * p.out.stride(2);
  micro_gemm<Scalar>(rows, dv, tk, scores, tk, 1, v, p.v.stride(2), out, p.out.stride(2),
                     Scalar(1), false, nullptr);
  if (p.weights.data() != nullptr) {
    Scalar* w = p.weights.data() + b * p.weights.stride(0) + h * p.weights.stride(1) +
                i0 * p.weights.stride(2);
    for (Index r = 0; r < rows; ++r) {
      std::copy(scores + r * tk, scores + (r + 1) * tk, w + r * p.weights.stride(2));
    }
  }
}

// ---- vectorised row operations of the online softmax ----

/// x[j] *= factor for j < n.
template <class Scalar>
inline void scale_row(Scalar* x, Index n, Scalar factor) noexcept {
  using V = simd::Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const auto f = V::set1(factor);
  Index j = 0;
  for (; j + W <= n; j += W) V::store(x + j, V::mul(V::load(x + j), f));
  for (; j < n; ++j) x[j] *= factor;
}

/// Scratch elements streaming_tile() needs.
template <class Scalar>
constexpr Index stream_scratch_size(Index head_dim, Index value_dim) noexcept {
  return head_dim * kQueryBlock + kKeyBlock * kQueryBlock + kQueryBlock * value_dim +
         4 * kQueryBlock + 64;
}

/// Streaming path for query rows [i0, i1) of head (b, h): tiles of K/V with an online
/// softmax (running max m and sum l per query). It works on transposed scores
/// S^T (keys x queries), so
///  - Q^T is packed once per task and K, V are read in place (no per-tile packing);
///  - the softmax statistics of all queries are vectors: max, exp and sums run across
///    queries with no horizontal reductions;
///  - causal tiles wholly above the diagonal are never visited, and inside the diagonal
///    tile each group of keys is multiplied only with the queries that can see it.
template <class Scalar>
void streaming_tile(const KernelParams<Scalar>& p, const HeadMask<Scalar>& mask,
                    const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                    Scalar* scratch) {
  using V = simd::Vec<Scalar>;
  constexpr Index W = V::kWidth;
  constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
  constexpr Index ld = kQueryBlock;  // row stride of s^T
  static_assert(kQueryBlock % W == 0, "the per-query statistics are whole vectors");
  const Index rows = i1 - i0, d = p.q.extent(3), dv = p.v.extent(3);
  Scalar* qt = scratch;                    // Q^T (d, rows)
  Scalar* st = qt + d * kQueryBlock;       // s^T, then p^T (keys, queries)
  Scalar* acc = st + kKeyBlock * ld;       // unnormalised output (rows, d_v)
  Scalar* m = acc + kQueryBlock * dv;      // running max per query
  Scalar* l = m + kQueryBlock;             // running sum per query
  Scalar* shift = l + kQueryBlock;         // this tile's exp shift per query
  Scalar* corr = shift + kQueryBlock;      // rescale factor per query
  std::fill(acc, acc + rows * dv, Scalar(0));
  std::fill(m, m + kQueryBlock, kNegInf);
  std::fill(l, l + kQueryBlock, Scalar(0));

  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1) + i0 * p.q.stride(2);
  const Scalar* k = p.k.data() + b * p.k.stride(0) + h * p.k.stride(1);
  const Scalar* v = p.v.data() + b * p.v.stride(0) + h * p.v.stride(1);
  const Index q_rs = p.q.stride(2), k_rs = p.k.stride(2), v_rs = p.v.stride(2);
  pack_transposed(q, q_rs, 0, rows, 0, d, qt);

  // Key j is visible to query i iff j < row_end(i); row_end is non-decreasing in i for
  // causal and key-length bounds, so query i sees j iff i >= first_query(j).
  Index key_end = 0;
  for (Index i = i0; i < i1; ++i) key_end = std::max(key_end, mask.row_end(i));
  const auto first_row = [&](Index j) -> Index {  // first local row that may see key j
    if (!mask.causal) return 0;
    return std::clamp<Index>(j - mask.causal_offset - i0, 0, rows);
  };
  const bool elementwise = mask.elementwise();
  const Index col_group = micro_cols<Scalar>();

  for (Index j0 = 0; j0 < key_end; j0 += kKeyBlock) {
    const Index width = std::min(kKeyBlock, key_end - j0);
    // pass 1: s^T (width, rows) = k[j0:j0+width] q^T * scale; each group of keys only
    // against the queries that can see its first key.
    for (Index g = 0; g < width; g += kMicroRows) {
      const Index group = std::min<Index>(kMicroRows, width - g);
      const Index c0 = first_row(j0 + g) / col_group * col_group;
      if (c0 >= rows) continue;
      micro_gemm<Scalar>(group, rows - c0, d, k + (j0 + g) * k_rs, k_rs, 1, qt + c0, rows,
                         st + g * ld + c0, ld, p.scale, false, nullptr);
    }
    // pass 2: masks. Causal / key-length bounds: -inf before each key's first query.
    // Element-wise parts (boolean, additive, padding) where present.
    for (Index j = 0; j < width; ++j) {
      const Index c = first_row(j0 + j);
      std::fill(st + j * ld, st + j * ld + c, kNegInf);
    }
    if (elementwise) {
      alignas(64) Scalar column[kKeyBlock];
      for (Index r = 0; r < rows; ++r) {
        const Index visible = std::clamp<Index>(mask.row_end(i0 + r) - j0, 0, width);
        for (Index j = 0; j < visible; ++j) column[j] = st[j * ld + r];
        mask.apply(i0 + r, j0, column, visible);
        for (Index j = 0; j < visible; ++j) st[j * ld + r] = column[j];
      }
    }
    // pass 3: per-query tile max -> new running max m, the exp shift, and the factor
    // corr = exp(m_old - shift) that rescales l and acc, all as vectors across queries.
    // shift = max(m_new, lowest): a query with no visible key so far keeps m = -inf and gets
    // a finite shift, so its exps are exp(-inf) = 0 and its corr is exp(0) = 1 (acc and l
    // are still 0), never NaN.
    // (Full-width chunks use plain loads and stores: masked stores are slow on some CPUs.)
    const auto lowest = V::set1(std::numeric_limits<Scalar>::lowest());
    for (Index c = 0; c < rows; c += W) {
      const Index n = std::min(W, rows - c);
      auto tmax = V::set1(kNegInf);
      if (n == W) {
        for (Index j = 0; j < width; ++j) tmax = V::max(tmax, V::load(st + j * ld + c));
      } else {
        for (Index j = 0; j < width; ++j) {
          tmax = V::max(tmax, V::load_partial(st + j * ld + c, n));
        }
      }
      // m, shift and corr have kQueryBlock lanes, so full-width access is always in bounds.
      const auto m_old = V::load(m + c);
      const auto m_new = V::max(m_old, tmax);
      const auto sh = V::max(m_new, lowest);
      V::store(m + c, m_new);
      V::store(shift + c, sh);
      V::store(corr + c, V::exp(V::sub(V::max(m_old, lowest), sh)));
    }
    // pass 4: p^T = exp(s^T - shift), column sums into l (before dropout, which only
    // zeroes entries of the numerator), acc rows rescaled.
    for (Index c = 0; c < rows; c += W) {
      const Index n = std::min(W, rows - c);
      const auto sh = V::load(shift + c);
      auto sum = V::zero();
      if (n == W) {
        for (Index j = 0; j < width; ++j) {
          Scalar* x = st + j * ld + c;
          const auto e = V::exp(V::sub(V::load(x), sh));
          V::store(x, e);
          sum = V::add(sum, e);
        }
      } else {
        for (Index j = 0; j < width; ++j) {
          Scalar* x = st + j * ld + c;
          const auto e = V::exp(V::sub(V::load_partial(x, n), sh));
          V::store_partial(x, e, n);
          sum = V::add(sum, e);
        }
      }
      V::store(l + c, V::fmadd(V::load(l + c), V::load(corr + c), sum));
    }
    for (Index r = 0; r < rows; ++r) {
      if (corr[r] != Scalar(1)) scale_row(acc + r * dv, dv, corr[r]);
    }
    if (drop.active) {
      for (Index r = 0; r < rows; ++r) {
        const std::uint64_t key = drop.row_key(i0 + r);
        for (Index j = 0; j < width; ++j) {
          if (!DropoutStream::keep(key, j0 + j, drop.threshold)) st[j * ld + r] = Scalar(0);
        }
      }
    }
    // pass 5: acc (rows, d_v) += p (rows, width) v[j0:j0+width]; p is read transposed out
    // of p^T, and each group of queries stops at its last visible key.
    for (Index r0 = 0; r0 < rows; r0 += kMicroRows) {
      const Index group = std::min<Index>(kMicroRows, rows - r0);
      const Index need =
          std::clamp<Index>(mask.row_end(i0 + r0 + group - 1) - j0, 0, width);
      if (need > 0) {
        micro_gemm<Scalar>(group, dv, need, st + r0, 1, ld, v + j0 * v_rs, v_rs, acc + r0 * dv,
                           dv, Scalar(1), true, nullptr);
      }
    }
  }
  // pass 6: normalise into out; a query that saw no key stays zero.
  Scalar* out = p.out.data() + b * p.out.stride(0) + h * p.out.stride(1) + i0 * p.out.stride(2);
  const double keep = 1.0 - (drop.active ? p.dropout : 0.0);
  for (Index r = 0; r < rows; ++r) {
    Scalar* o = out + r * p.out.stride(2);
    if (l[r] > Scalar(0)) {
      const Scalar inv = static_cast<Scalar>(1.0 / (static_cast<double>(l[r]) * keep));
      for (Index e = 0; e < dv; ++e) o[e] = acc[r * dv + e] * inv;
    } else {
      std::fill(o, o + dv, Scalar(0));
    }
  }
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
  const Index batch = p.q.extent(0), heads = p.q.extent(1), tq = p.q.extent(2);
  const Index tk = p.k.extent(2), dv = p.v.extent(3);
  const Index tiles = (tq + kQueryBlock - 1) / kQueryBlock;
  const Index tasks = batch * heads * tiles;
  const Index scratch = materialize ? materialized_scratch_size<Scalar>(p.q.extent(3), tk)
                                    : stream_scratch_size<Scalar>(p.q.extent(3), dv);
  const int threads = static_cast<int>(std::min<Index>(num_threads(), tasks));
  for (int t = 0; t < threads; ++t) workspace_get<Scalar>(ws, WorkspaceSlot::kThread, scratch, t);

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
      Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread, thread_id());
#pragma omp for schedule(dynamic, 1)
      for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
    }
    return;
  }
#endif
  Scalar* buffer = workspace_peek<Scalar>(ws, WorkspaceSlot::kThread);
  for (Index task = 0; task < tasks; ++task) run_task(task, buffer);
}

}  // namespace detail
ATTN_NAMESPACE_END
