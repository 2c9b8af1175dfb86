// SPDX-License-Identifier: MIT
// attn/kernels/generic/attention_backward.inl: the backward pass of both attention paths, per
// task, written once over a set's Vec and micro-kernel. The driver
// (attn/ops/attention_backward.hpp) resolves masks and dropout streams and runs the
// tasks on its threads.
// Glossary: B = batch, H = heads, T_q / T_k = query / key lengths, d = head dim, d_v = value
// head dim; P the attention probabilities (before dropout), A = P Z / (1 - p) the weights
// after dropout (Z the keep decisions), O = A V the output, dO its gradient.
//
// With dA = dO V^T, dP = dA Z / (1 - p) and D_i = sum_j P_ij dP_ij = dO_i . O_i:
//   dV = A^T dO,  dS = P (dP - D),  dQ = scale dS K,  dK = scale dS^T Q.
// An entry with P = 0 (a key the query cannot see, or an exp that underflowed) gets dS = 0
// exactly, whatever dP holds there (a value row the query cannot see, or memory the masked
// tile never computed), unless P is NaN: select(P > 0, P (dP - D), P * 0).
//
// Variants: a softcap c = C tanh(s / C) multiplies dS by dc/ds = 1 - tanh^2 (inside the same
// select); ALiBi adds a constant; a sink enters through the logsumexp (P = exp(S - lse), lse
// with the sink) and has its own gradient, dL/dsink_h = -sum_i P_sink(i) D_i over the rows of
// head h (the sink's column has dP = 0).
// With bfloat16 products (a bfloat16 module's backward) the tasks call the functions of
// generic/attention_backward_pairs.inl.

/// The key/value head query head h reads (grouped-query attention: H / H_kv heads share one).
template <class Scalar>
Index backward_kv_head(const AttentionBackwardArgs<Scalar>& p, Index h) noexcept {
  return h / (p.q.extent(1) / p.k.extent(1));
}

/// The operands of one query tile, rows [i0, i0 + rows) of head (b, h), as every block of
/// the streaming backward reads them: Q^T (d, rows), dO^T (d_v, rows), D_i = dO_i . O_i
/// and the forward's logsumexp, padded with +inf to kQueryBlock lanes; when Paired, the
/// bfloat16 operands (pair_query_tile() into `pairs`) instead of Q^T and dO^T.
template <bool Paired, class Scalar>
void backward_query_tile(const AttentionBackwardArgs<Scalar>& p, Index b, Index h, Index i0,
                         Index rows, Scalar* qt, Scalar* dot, Scalar* dvec, Scalar* lse,
                         const BackwardPairs<Scalar>& pairs) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const Index d = p.q.extent(3), dv = p.v.extent(3);
  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1) + i0 * p.q.stride(2);
  const Scalar* go = p.grad_out.data() + b * p.grad_out.stride(0) + h * p.grad_out.stride(1) +
                     i0 * p.grad_out.stride(2);
  const Scalar* o = p.out.data() + b * p.out.stride(0) + h * p.out.stride(1) + i0 * p.out.stride(2);
  if constexpr (Paired) {
    pair_query_tile(p, pairs, b, h, i0, rows);
  } else {
    pack_transposed(q, p.q.stride(2), 0, rows, 0, d, qt);
    pack_transposed(go, p.grad_out.stride(2), 0, rows, 0, dv, dot);
  }
  // D_i: with a bfloat16 O (p.narrow.out), its row widened (exactly) a stack chunk at a time
  // into the same sum, so D has the bits of the float O's.
  const auto& no = p.narrow.out;
  constexpr Index kChunk = 256;  // a multiple of every set's W
  alignas(64) Scalar wide[std::is_same_v<Scalar, float> ? kChunk : 1];
  for (Index r = 0; r < rows; ++r) {
    auto acc = V::zero();
    for (Index e0 = 0; e0 < dv; e0 += kChunk) {
      const Index n = std::min(kChunk, dv - e0);
      const Scalar* g = go + r * p.grad_out.stride(2) + e0;
      const Scalar* x = o + r * p.out.stride(2) + e0;
      if constexpr (std::is_same_v<Scalar, float>) {
        if (no.data() != nullptr) {
          convert_row(
              no.data() + b * no.stride(0) + h * no.stride(1) + (i0 + r) * no.stride(2) + e0, wide,
              n);
          x = wide;
        }
      }
      Index e = 0;
      for (; e + W <= n; e += W) acc = V::fmadd(V::load(g + e), V::load(x + e), acc);
      if (e < n) acc = V::fmadd(V::load_partial(g + e, n - e), V::load_partial(x + e, n - e), acc);
    }
    dvec[r] = V::reduce_add(acc);
  }
  std::fill(dvec + rows, dvec + kQueryBlock, Scalar(0));
  const Scalar* l = p.lse.data() + b * p.lse.stride(0) + h * p.lse.stride(1) + i0 * p.lse.stride(2);
  for (Index r = 0; r < kQueryBlock; ++r) {
    lse[r] = r < rows ? l[r * p.lse.stride(2)] : std::numeric_limits<Scalar>::infinity();
  }
}

/// One block of the streaming backward: query rows [i0, i0 + rows) (their operands from
/// backward_query_tile()) against keys [j0, j0 + width). Leaves A^T (width, rows) in `at`
/// and dS^T (width, rows, not yet multiplied by the scale) in `dst`, row stride
/// kQueryBlock; entries a query cannot see are 0 in both. The scores are computed, masked
/// and bounded exactly as the forward's streaming_tile() does; P = exp(S - lse) from the
/// forward's logsumexp. `zf` holds the dropout factors when dropout is active, `cf` the
/// softcap's derivative when there is one. When Paired (`pairs`: the query tile's and the
/// key tile's bfloat16 operands), S^T and dA^T on bfloat16 products over every query row.
template <bool Paired, class Scalar>
void backward_block(const AttentionBackwardArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                    const DropoutStream& drop, Index b, Index h, Index i0, Index rows, Index j0,
                    Index width, const Scalar* qt, const Scalar* dot, const Scalar* dvec,
                    const Scalar* lse, Scalar* at, Scalar* dst, Scalar* zf, Scalar* cf,
                    const BackwardPairs<Scalar>& pairs) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  constexpr Index ld = kQueryBlock;
  constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
  const Index d = p.q.extent(3), dv = p.v.extent(3), kvh = backward_kv_head(p, h);
  const Scalar* k = p.k.data() + b * p.k.stride(0) + kvh * p.k.stride(1);
  const Scalar* v = p.v.data() + b * p.v.stride(0) + kvh * p.v.stride(1);
  const Index k_rs = p.k.stride(2), v_rs = p.v.stride(2);
  const auto first_row = [&](Index j) -> Index {  // first local row that may see key j
    if (!mask.causal) return 0;
    return std::clamp<Index>(j - mask.causal_offset - i0, 0, rows);
  };
  const Index col_group = micro_cols<Scalar>();
  // S^T = K Q^T scale and dA^T = V dO^T, each group of keys only against the queries that
  // may see its first key (the rest of its row is zero in dA^T and -inf in S^T below).
  // bfloat16 products: every row (columns to a multiple of 16, +0 operands past `rows`), the
  // scale after; the masks below hide what the float products skip.
  if constexpr (Paired) {
    const Index cols = (rows + 15) / 16 * 16;
    pair_gemm(pairs.amx, width, cols, d, pairs.k_tile, pairs.k_ld, pairs.qp, kQueryBlock, at, ld,
              false);
    pair_gemm(pairs.amx, width, cols, dv, pairs.v_tile, pairs.v_ld, pairs.gp, kQueryBlock, dst, ld,
              false);
    const auto scale = V::set1(p.scale);
    for (Index j = 0; j < width; ++j) {
      for (Index c = 0; c < rows; c += W)
        V::store(at + j * ld + c, V::mul(V::load(at + j * ld + c), scale));
    }
  }
  for (Index g = 0; g < (Paired ? 0 : width); g += kMicroRows) {
    const Index group = std::min<Index>(kMicroRows, width - g);
    const Index c0 = std::min(first_row(j0 + g) / col_group * col_group, rows);
    for (Index r = 0; r < group; ++r)
      std::fill(dst + (g + r) * ld, dst + (g + r) * ld + c0, Scalar(0));
    if (c0 >= rows) continue;
    micro_gemm<Scalar>(group, rows - c0, d, k + (j0 + g) * k_rs, k_rs, 1, qt + c0, rows,
                       at + g * ld + c0, ld, p.scale, false, nullptr);
    micro_gemm<Scalar>(group, rows - c0, dv, v + (j0 + g) * v_rs, v_rs, 1, dot + c0, rows,
                       dst + g * ld + c0, ld, Scalar(1), false, nullptr);
  }
  // The variants, as the forward applies them: softcap (keeping its derivative), ALiBi.
  const bool capped = p.softcap != Scalar(0);
  if (capped) softcap_block(at, width, rows, ld, p.softcap, cf);
  if (p.has_alibi()) {
    alignas(64) Scalar pos[kQueryBlock], slope[kQueryBlock];
    const Scalar m = alibi_slope(p, h);
    for (Index r = 0; r < kQueryBlock; ++r) {
      pos[r] = static_cast<Scalar>(i0 + r + mask.position);
      slope[r] = m;
    }
    alibi_block_t(at, width, rows, ld, j0, pos, slope);
  }
  // Masks, as the forward applies them: the causal diagonal, then per row the keys before
  // its window and past its end, and the element-wise parts in between.
  for (Index j = 0; j < width; ++j) {
    const Index c = first_row(j0 + j);
    std::fill(at + j * ld, at + j * ld + c, kNegInf);
  }
  alignas(64) Scalar column[kKeyBlock];
  for (Index r = 0; r < rows; ++r) {
    const Index visible = std::clamp<Index>(mask.row_end(i0 + r) - j0, 0, width);
    const Index first = std::clamp<Index>(mask.row_begin(i0 + r) - j0, 0, visible);
    for (Index j = 0; j < first; ++j) at[j * ld + r] = kNegInf;
    if (mask.elementwise() && visible > first) {
      for (Index j = first; j < visible; ++j) column[j - first] = at[j * ld + r];
      mask.apply(i0 + r, j0 + first, column, visible - first);
      for (Index j = first; j < visible; ++j) at[j * ld + r] = column[j - first];
    }
    for (Index j = visible; j < width; ++j) at[j * ld + r] = kNegInf;
  }
  if (drop.active) {
    const Scalar inv = Scalar(1) / static_cast<Scalar>(1.0 - p.dropout);
    for (Index r = 0; r < rows; ++r) {
      const std::uint64_t key = drop.row_key(i0 + r);
      for (Index j = 0; j < width; ++j) {
        zf[j * ld + r] = DropoutStream::keep(key, j0 + j, drop.threshold) ? inv : Scalar(0);
      }
    }
  }
  // P = exp(S - lse); dP = dA Z / (1 - p); dS = P (dP - D); A = P Z / (1 - p). Vectors run
  // across queries.
  const auto zero = V::zero();
  for (Index c = 0; c < rows; c += W) {
    const Index n = std::min(W, rows - c);
    const auto l = V::load(lse + c);  // kQueryBlock lanes: always in bounds
    const auto dd = V::load(dvec + c);
    for (Index j = 0; j < width; ++j) {
      Scalar* a = at + j * ld + c;
      Scalar* s = dst + j * ld + c;
      const auto pr = vexp<V>(V::sub(n == W ? V::load(a) : V::load_partial(a, n), l));
      auto dp = n == W ? V::load(s) : V::load_partial(s, n);
      auto weight = pr;
      if (drop.active) {
        const auto z = n == W ? V::load(zf + j * ld + c) : V::load_partial(zf + j * ld + c, n);
        dp = V::mul(dp, z);
        weight = V::mul(pr, z);
      }
      auto grad = V::mul(pr, V::sub(dp, dd));
      if (capped) {
        grad =
            V::mul(grad, n == W ? V::load(cf + j * ld + c) : V::load_partial(cf + j * ld + c, n));
      }
      const auto ds = V::select(V::greater(pr, zero), grad, V::mul(pr, zero));
      if constexpr (Paired) {
        if (pairs.rounded) {  // whole vectors: +0 in the lanes past rows
          store_rounded(pairs.at_b + j * ld + c, weight);
          store_rounded(pairs.ds_b + j * ld + c, ds);
          continue;
        }
      }
      if (n == W) {
        V::store(a, weight);
        V::store(s, ds);
      } else {
        V::store_partial(a, weight, n);
        V::store_partial(s, ds, n);
      }
    }
  }
}

/// Streaming backward, key tile [j0, j0 + width) as query head (b, h) sees it: that head's
/// share of dK and dV of those keys, summed over every query tile that can see one of them,
/// in query order, then added into grad_k and grad_v of its key/value head. The driver runs
/// the heads of a key/value group one after the other in one task, which owns those rows.
/// scratch: stream_backward_scratch_size(). Paired: bfloat16 products (with_backward_pairs()).
template <bool Paired, class Scalar>
void backward_key_tile(const AttentionBackwardArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                       const DropoutStream& drop, Index b, Index h, Index j0, Index width,
                       Scalar* scratch) noexcept {
  const Index tq = p.q.extent(2), d = p.q.extent(3), dv = p.v.extent(3);
  constexpr Index ld = kQueryBlock;
  Scalar* qt = scratch;
  Scalar* dot = qt + d * kQueryBlock;
  Scalar* dvec = dot + dv * kQueryBlock;
  Scalar* lse = dvec + kQueryBlock;
  Scalar* at = lse + kQueryBlock;
  Scalar* dst = at + kKeyBlock * ld;
  Scalar* zf = dst + kKeyBlock * ld;
  Scalar* cf = zf + kKeyBlock * ld;
  Scalar* dk = cf + kKeyBlock * ld;  // (width, d)
  Scalar* dvv = dk + kKeyBlock * d;  // (width, d_v)
  std::fill(dk, dk + width * d, Scalar(0));
  std::fill(dvv, dvv + width * dv, Scalar(0));
  // bfloat16 products: the key tile's K and V rounded once; dK summed unscaled.
  BackwardPairs<Scalar> bp;
  if constexpr (Paired) {
    bp = backward_pairs(p, scratch);
    bp.rounded = true;
    pair_key_tile(p, bp, b, backward_kv_head(p, h), j0, width, false);
    pair_tiles(bp, true);
  }
  // The first query that may see key j0 (row_end is non-decreasing in the query).
  Index first = 0;
  if (mask.causal) first = std::clamp<Index>(j0 - mask.causal_offset, 0, tq);
  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1);
  const Scalar* go = p.grad_out.data() + b * p.grad_out.stride(0) + h * p.grad_out.stride(1);
  const Index q_rs = p.q.stride(2), go_rs = p.grad_out.stride(2);
  for (Index i0 = first / kQueryBlock * kQueryBlock; i0 < tq; i0 += kQueryBlock) {
    const Index rows = std::min(kQueryBlock, tq - i0);
    // Windows: row_begin is non-decreasing too, so once a tile's first query starts past
    // these keys, so do all later ones.
    if (mask.row_begin(i0) >= j0 + width) break;
    const Index end = std::min(width, mask.row_end(i0 + rows - 1) - j0);  // keys seen here
    if (end <= 0) continue;
    backward_query_tile<Paired>(p, b, h, i0, rows, qt, dot, dvec, lse, bp);
    backward_block<Paired>(p, mask, drop, b, h, i0, rows, j0, end, qt, dot, dvec, lse, at, dst, zf,
                           cf, bp);
    // bfloat16 products: A^T and dS^T, rounded by backward_block() (queries to a multiple of
    // 16), padded with +0 to kQueryBlock queries and keys to a multiple of 16, then dV += A^T
    // dO and dK += dS^T Q over the tile's rows.
    if constexpr (Paired) {
      const Index keys = (end + 15) / 16 * 16, cols = (rows + 15) / 16 * 16;
      for (bfloat16* x : {bp.at_b, bp.ds_b}) {
        for (Index j = 0; j < (cols < ld ? end : 0); ++j) {
          std::fill(x + j * ld + cols, x + (j + 1) * ld, bfloat16::from_bits(0));
        }
        std::fill(x + end * ld, x + keys * ld, bfloat16::from_bits(0));
      }
      pair_gemm(bp.amx, end, dv, rows, bp.at_b, kQueryBlock, bp.gr, dv, dvv, dv, true);
      pair_gemm(bp.amx, end, d, rows, bp.ds_b, kQueryBlock, bp.qr, d, dk, d, true);
      continue;
    }
    // dV += A^T dO and dK += scale dS^T Q, each group of keys from its first query on.
    for (Index g = 0; g < end; g += kMicroRows) {
      const Index group = std::min<Index>(kMicroRows, end - g);
      const Index c0 =
          mask.causal ? std::clamp<Index>(j0 + g - mask.causal_offset - i0, 0, rows) : 0;
      if (c0 >= rows) continue;
      micro_gemm<Scalar>(group, dv, rows - c0, at + g * ld + c0, ld, 1, go + (i0 + c0) * go_rs,
                         go_rs, dvv + g * dv, dv, Scalar(1), true, nullptr);
      micro_gemm<Scalar>(group, d, rows - c0, dst + g * ld + c0, ld, 1, q + (i0 + c0) * q_rs, q_rs,
                         dk + g * d, d, p.scale, true, nullptr);
    }
  }
  if constexpr (Paired) pair_tiles(bp, false);
  const auto add_rows = [&](const TensorView<Scalar, 4>& grad, const Scalar* acc, Index cols,
                            Scalar factor) {
    Scalar* to = grad.data() + b * grad.stride(0) + backward_kv_head(p, h) * grad.stride(1) +
                 j0 * grad.stride(2);
    for (Index j = 0; j < width; ++j) {
      Scalar* row = to + j * grad.stride(2);
      for (Index e = 0; e < cols; ++e) row[e] += acc[j * cols + e] * factor;
    }
  };
  add_rows(p.grad_k, dk, d, Paired ? p.scale : Scalar(1));
  add_rows(p.grad_v, dvv, dv, Scalar(1));
}

/// backward_key_tile() with or without bfloat16 products, as the call takes them.
template <class Scalar>
void backward_key_task(const AttentionBackwardArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                       const DropoutStream& drop, Index b, Index h, Index j0, Index width,
                       Scalar* scratch) noexcept {
  with_backward_pairs(p, [&](auto paired) {
    backward_key_tile<decltype(paired)::value>(p, mask, drop, b, h, j0, width, scratch);
  });
}

/// The K rows of key/value head (b, kvh) that the dQ products read: the driver's copy with
/// non-finite values +0 (row stride d) when there is one, else K (row stride k.stride(2)).
template <class Scalar>
const Scalar* dq_keys(const AttentionBackwardArgs<Scalar>& p, Index b, Index kvh) noexcept {
  if (p.clean_k != nullptr) {
    return p.clean_k + (b * p.k.extent(1) + kvh) * p.k.extent(2) * p.k.extent(3);
  }
  return p.k.data() + b * p.k.stride(0) + kvh * p.k.stride(1);
}

/// Streaming backward, query rows [i0, i1) of head (b, h): dQ of those queries (this task
/// owns them), summed over the key tiles they see, in key order, then added into grad_q.
/// Paired: bfloat16 products (with_backward_pairs()).
template <bool Paired, class Scalar>
void backward_query_rows(const AttentionBackwardArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                         const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                         Scalar* scratch) noexcept {
  const Index rows = i1 - i0, d = p.q.extent(3), dv = p.v.extent(3);
  constexpr Index ld = kQueryBlock;
  Scalar* qt = scratch;
  Scalar* dot = qt + d * kQueryBlock;
  Scalar* dvec = dot + dv * kQueryBlock;
  Scalar* lse = dvec + kQueryBlock;
  Scalar* at = lse + kQueryBlock;
  Scalar* dst = at + kKeyBlock * ld;
  Scalar* zf = dst + kKeyBlock * ld;
  Scalar* cf = zf + kKeyBlock * ld;
  Scalar* dq = cf + kKeyBlock * ld;  // (rows, d)
  std::fill(dq, dq + rows * d, Scalar(0));
  Index key_end = 0;
  for (Index i = i0; i < i1; ++i) key_end = std::max(key_end, mask.row_end(i));
  const Index key_begin = std::min(mask.row_begin(i0), key_end);  // non-decreasing in i
  const Scalar* k = dq_keys(p, b, backward_kv_head(p, h));
  const Index k_rs = p.clean_k != nullptr ? d : p.k.stride(2);
  // bfloat16 products: the query tile's Q and dO rounded once; dQ summed unscaled.
  BackwardPairs<Scalar> bp;
  if constexpr (Paired) {
    bp = backward_pairs(p, scratch);
    pair_tiles(bp, true);
  }
  if (key_end > key_begin) backward_query_tile<Paired>(p, b, h, i0, rows, qt, dot, dvec, lse, bp);
  if (p.sink_partials != nullptr) {  // this tile's share of dL/dsink_h: -sum_i P_sink(i) D_i
    double share = 0.0;
    for (Index r = 0; key_end > key_begin && r < rows; ++r) {
      share += std::exp(static_cast<double>(p.sinks[h]) - static_cast<double>(lse[r])) *
               static_cast<double>(dvec[r]);
    }
    const Index tiles = (p.q.extent(2) + kQueryBlock - 1) / kQueryBlock;
    p.sink_partials[(b * p.q.extent(1) + h) * tiles + i0 / kQueryBlock] =
        static_cast<Scalar>(-share);
  }
  for (Index j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
    const Index width = std::min(kKeyBlock, key_end - j0);
    if constexpr (Paired) pair_key_tile(p, bp, b, backward_kv_head(p, h), j0, width, true);
    backward_block<Paired>(p, mask, drop, b, h, i0, rows, j0, width, qt, dot, dvec, lse, at, dst,
                           zf, cf, bp);
    // bfloat16 products: dS (rows, keys to a multiple of 32) transposed out of dS^T and
    // rounded (pack_probabilities()), then dQ += dS K over the tile's keys.
    if constexpr (Paired) {
      const Index lw = (width + 31) / 32 * 32;
      pack_probabilities(dst, ld, width, rows, (rows + 15) / 16 * 16, bp.ds_b, lw);
      pair_gemm(bp.amx, rows, d, width, bp.ds_b, lw, bp.kr, d, dq, d, true);
      continue;
    }
    // dQ += scale dS K: dS read transposed out of dS^T; each group of queries stops at its
    // last visible key.
    for (Index r0 = 0; r0 < rows; r0 += kMicroRows) {
      const Index group = std::min<Index>(kMicroRows, rows - r0);
      const Index need = std::clamp<Index>(mask.row_end(i0 + r0 + group - 1) - j0, 0, width);
      if (need > 0) {
        micro_gemm<Scalar>(group, d, need, dst + r0, 1, ld, k + j0 * k_rs, k_rs, dq + r0 * d, d,
                           p.scale, true, nullptr);
      }
    }
  }
  if constexpr (Paired) pair_tiles(bp, false);
  Scalar* to =
      p.grad_q.data() + b * p.grad_q.stride(0) + h * p.grad_q.stride(1) + i0 * p.grad_q.stride(2);
  const Scalar factor = Paired ? p.scale : Scalar(1);
  for (Index r = 0; r < rows; ++r) {
    Scalar* row = to + r * p.grad_q.stride(2);
    for (Index e = 0; e < d; ++e) row[e] += dq[r * d + e] * factor;
  }
}

/// backward_query_rows() with or without bfloat16 products, as the call takes them.
template <class Scalar>
void backward_query_task(const AttentionBackwardArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                         const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                         Scalar* scratch) noexcept {
  with_backward_pairs(p, [&](auto paired) {
    backward_query_rows<decltype(paired)::value>(p, mask, drop, b, h, i0, i1, scratch);
  });
}

/// Materialised backward of head (b, h): P recomputed over whole rows exactly as the
/// forward's materialized_tile() computes it (the same scores, masks and softmax_row), then
/// the dense formulas with D_i = sum_j P_ij dP_ij. The simple form the streaming backward is
/// tested against. Adds into grad_k and grad_v of h's key/value head: the driver runs the
/// heads of a group one after the other in one task. scratch:
/// materialized_backward_scratch_size().
template <class Scalar>
void materialized_backward_task(const AttentionBackwardArgs<Scalar>& p,
                                const HeadMask<Scalar>& mask, const DropoutStream& drop, Index b,
                                Index h, Scalar* scratch) noexcept {
  const Index tq = p.q.extent(2), tk = p.k.extent(2), d = p.q.extent(3), dv = p.v.extent(3);
  const bool capped = p.softcap != Scalar(0);
  Scalar* prob = scratch;                          // P, then A (T_q, T_k)
  Scalar* grad = prob + tq * tk;                   // dA, then dS (T_q, T_k)
  Scalar* cf = grad + tq * tk;                     // softcap: its derivative (T_q, T_k)
  Scalar* packed = capped ? cf + tq * tk : cf;     // K^T (d, T_k), then V^T (d_v, T_k)
  Scalar* sink_p = packed + std::max(d, dv) * tk;  // sinks: each row's P_sink (T_q)
  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1);
  const Index kvh = backward_kv_head(p, h);
  const Scalar* k = p.k.data() + b * p.k.stride(0) + kvh * p.k.stride(1);
  const Scalar* v = p.v.data() + b * p.v.stride(0) + kvh * p.v.stride(1);
  const Scalar* go = p.grad_out.data() + b * p.grad_out.stride(0) + h * p.grad_out.stride(1);
  const Index q_rs = p.q.stride(2), k_rs = p.k.stride(2), v_rs = p.v.stride(2);
  const Index go_rs = p.grad_out.stride(2);
  // P, as the forward: scores = q k^T scale in blocks of kQueryBlock rows, masks, softmax.
  pack_transposed(k, k_rs, 0, tk, 0, d, packed);
  for (Index i0 = 0; i0 < tq; i0 += kQueryBlock) {
    const Index rows = std::min(kQueryBlock, tq - i0);
    micro_gemm<Scalar>(rows, tk, d, q + i0 * q_rs, q_rs, 1, packed, tk, prob + i0 * tk, tk, p.scale,
                       false, nullptr);
  }
  if (capped) softcap_block(prob, tq, tk, tk, p.softcap, cf);
  const Scalar slope = p.has_alibi() ? alibi_slope(p, h) : Scalar(0);
  for (Index i = 0; i < tq; ++i) {
    Scalar* s = prob + i * tk;
    const Index end = mask.row_end(i), begin = std::min(mask.row_begin(i), end);
    if (p.has_alibi()) {
      alibi_row(s + begin, end - begin, begin, static_cast<Scalar>(i + mask.position), slope);
    }
    const Index seen =
        mask.elementwise() ? mask.apply(i, begin, s + begin, end - begin) : end - begin;
    if (p.sinks != nullptr) sink_p[i] = Scalar(0);
    if (seen > 0) {
      const Scalar top = p.sinks != nullptr ? *std::max_element(s + begin, s + end) : Scalar(0);
      const Scalar sum = softmax_row(s + begin, end - begin, /*all_minus_inf_is_masked=*/false);
      if (p.sinks != nullptr) {  // as the forward: the sink joins the denominator
        const SinkShare share = sink_share(top, sum, p.sinks[h]);
        if (top == -std::numeric_limits<Scalar>::infinity()) {
          std::fill(s + begin, s + end, Scalar(0));
        } else {
          scale_row(s + begin, end - begin,
                    static_cast<Scalar>(static_cast<double>(sum) * share.scale));
        }
        sink_p[i] = static_cast<Scalar>(share.sink_p);
      }
    } else {
      std::fill(s + begin, s + end, Scalar(0));
    }
    std::fill(s, s + begin, Scalar(0));
    std::fill(s + end, s + tk, Scalar(0));
  }
  // dA = dO V^T.
  pack_transposed(v, v_rs, 0, tk, 0, dv, packed);
  micro_gemm<Scalar>(tq, tk, dv, go, go_rs, 1, packed, tk, grad, tk, Scalar(1), false, nullptr);
  const Scalar inv = drop.active ? Scalar(1) / static_cast<Scalar>(1.0 - p.dropout) : Scalar(1);
  double sink_share_sum = 0.0;  // sum_i P_sink(i) D_i
  for (Index i = 0; i < tq; ++i) {
    Scalar* pr = prob + i * tk;
    Scalar* g = grad + i * tk;
    const Index end = mask.row_end(i), begin = std::min(mask.row_begin(i), end);
    const std::uint64_t key = drop.active ? drop.row_key(i) : 0;
    const auto factor = [&](Index j) {
      return !drop.active ? Scalar(1)
                          : (DropoutStream::keep(key, j, drop.threshold) ? inv : Scalar(0));
    };
    // D_i = sum_j P_ij dP_ij over the keys with P_ij != 0: a key an element-wise mask hides
    // inside [begin, end) has P_ij = 0 and dP_ij NaN when its value is (0 * NaN). Leaving out
    // terms that are 0 does not change a sum that starts at +0.
    Scalar dsum = 0;
    for (Index j = begin; j < end; ++j) {
      g[j] *= factor(j);
      if (pr[j] != Scalar(0)) dsum += pr[j] * g[j];
    }
    for (Index j = 0; j < tk; ++j) {
      g[j] = j >= begin && j < end && pr[j] > Scalar(0)
                 ? pr[j] * (g[j] - dsum) * (capped ? cf[i * tk + j] : Scalar(1))
                 : pr[j] * Scalar(0);
      if (j < end) pr[j] *= factor(j);
    }
    if (p.sinks != nullptr) sink_share_sum += static_cast<double>(sink_p[i]) * dsum;
  }
  if (p.sink_partials != nullptr) {
    p.sink_partials[b * p.q.extent(1) + h] = static_cast<Scalar>(-sink_share_sum);
  }
  const auto target = [&](const TensorView<Scalar, 4>& t, Index head) {
    return t.data() + b * t.stride(0) + head * t.stride(1);
  };
  // dV += A^T dO, dQ += scale dS K, dK += scale dS^T Q: added straight into the gradients
  // (this task owns the head).
  micro_gemm<Scalar>(tk, dv, tq, prob, 1, tk, go, go_rs, target(p.grad_v, kvh), p.grad_v.stride(2),
                     Scalar(1), true, nullptr);
  micro_gemm<Scalar>(tq, d, tk, grad, tk, 1, dq_keys(p, b, kvh), p.clean_k != nullptr ? d : k_rs,
                     target(p.grad_q, h), p.grad_q.stride(2), p.scale, true, nullptr);
  micro_gemm<Scalar>(tk, d, tq, grad, 1, tk, q, q_rs, target(p.grad_k, kvh), p.grad_k.stride(2),
                     p.scale, true, nullptr);
}
