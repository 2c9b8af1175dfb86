// SPDX-License-Identifier: MIT
// attn/kernels/generic/attention.inl: both attention paths for one task, (batch, head, up to
// kQueryBlock query rows), written once over a set's Vec and micro-kernel. The driver
// (attn/attention/detail/kernel.hpp) resolves the task's mask and dropout stream and runs
// the tasks on its threads.
// Glossary: B = batch, H = heads, T_q / T_k = query / key lengths, d = head dim, d_v =
// value head dim.

// ---- values that are NaN or infinite ----
//
// A query's output is sum_j P(i, j) V_j over the keys it sees. Both paths multiply by weight
// blocks in which invisible keys have weight 0 (masked, past a causal or length bound inside a
// tile), and 0 * inf or 0 * NaN is NaN: a non-finite value the query cannot see would leak
// into its output. So the value rows of a block are checked first (one multiply-add per
// element, against the block's O(rows * d_v) multiply-adds per key); only when one is not
// finite does the block go through a copy with those rows zeroed, and those rows are then
// added for exactly the queries that see them (IEEE arithmetic: 0 * inf = NaN there, as in
// PyTorch).

/// Whether v's rows [0, n) (d_v wide, row stride v_rs) hold a NaN or an infinity; if so,
/// copies them to `clean` (n x d_v) with those rows zeroed.
template <class Scalar>
bool clean_values(const Scalar* v, Index v_rs, Index n, Index dv, Scalar* clean) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const auto finite = [&](const Scalar* row) {  // x * 0 is 0 for finite x, NaN otherwise
    auto t = V::zero();
    Index e = 0;
    for (; e + W <= dv; e += W) t = V::add(t, V::mul(V::load(row + e), V::zero()));
    if (e < dv) t = V::add(t, V::mul(V::load_partial(row + e, dv - e), V::zero()));
    return V::reduce_add(t) == Scalar(0);
  };
  Index first_bad = 0;
  while (first_bad < n && finite(v + first_bad * v_rs)) ++first_bad;
  if (first_bad == n) return false;
  for (Index j = 0; j < n; ++j) {
    const Scalar* row = v + j * v_rs;
    Scalar* to = clean + j * dv;
    if (j >= first_bad && !finite(row)) {
      std::fill(to, to + dv, Scalar(0));
    } else {
      std::copy(row, row + dv, to);
    }
  }
  return true;
}

/// What clean_values() left out: out row r += P(r, j) v_j for each key j < n whose value row
/// is not finite, for the rows r that see it (sees(r, j)). P(r, j) = p[r * prs + j * pcs].
template <class Scalar, class Sees>
void add_nonfinite_values(Index rows, Index n, Index dv, const Scalar* p, Index prs, Index pcs,
                          const Scalar* v, Index v_rs, const Scalar* clean, Scalar* out,
                          Index ldo, Sees&& sees) noexcept {
  for (Index j = 0; j < n; ++j) {
    const Scalar* row = v + j * v_rs;
    if (std::equal(row, row + dv, clean + j * dv)) continue;  // copied: finite (NaN != NaN)
    for (Index r = 0; r < rows; ++r) {
      if (!sees(r, j)) continue;
      const Scalar w = p[r * prs + j * pcs];
      for (Index e = 0; e < dv; ++e) out[r * ldo + e] += w * row[e];
    }
  }
}

/// lse(b, h, i) = max + log(sum) (the logsumexp of a row's visible scores, given its max
/// and the sum of exp(score - max)), or +inf when the masks hide every key (`any` false).
template <class Scalar>
void write_lse(const AttentionArgs<Scalar>& p, Index b, Index h, Index i, Scalar max, Scalar sum,
               bool any = true) noexcept {
  p.lse.data()[b * p.lse.stride(0) + h * p.lse.stride(1) + i * p.lse.stride(2)] =
      any ? static_cast<Scalar>(static_cast<double>(max) + std::log(static_cast<double>(sum)))
          : std::numeric_limits<Scalar>::infinity();
}

/// Materialised path for query rows [i0, i1) of head (b, h): the full score rows, an
/// exact (two-pass) softmax, then weights times V. Straightforward on purpose: it is the
/// reference the streaming path is tested against, and what returns weights.
/// A row whose masks hide every key gets zero weights and output; otherwise the softmax
/// follows IEEE over the keys it sees (NaN in, NaN out; every visible score -inf: NaN, as
/// PyTorch computes). scratch: materialized_scratch_size() elements.
template <class Scalar>
void materialized_tile(const AttentionArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                       const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                       Scalar* scratch) {
  const Index rows = i1 - i0, tk = p.k.extent(2), d = p.q.extent(3), dv = p.v.extent(3);
  Scalar* scores = scratch;                // (rows, T_k)
  Scalar* kt = scratch + kQueryBlock * tk;  // K^T (d, T_k), then V cleaned (T_k, d_v)
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
    const Index seen = mask.elementwise() ? mask.apply(i, 0, s, end) : end;
    if (seen > 0) {
      const Scalar top = p.lse.data() != nullptr ? *std::max_element(s, s + end) : Scalar(0);
      const Scalar sum = softmax_row(s, end, /*all_minus_inf_is_masked=*/false);
      if (p.lse.data() != nullptr) write_lse(p, b, h, i, top, sum);
    } else {
      std::fill(s, s + end, Scalar(0));
      if (p.lse.data() != nullptr) write_lse(p, b, h, i, Scalar(0), Scalar(0), false);
    }
    std::fill(s + end, s + tk, Scalar(0));
    if (drop.active) {
      const std::uint64_t key = drop.row_key(i);
      for (Index j = 0; j < end; ++j) {
        s[j] = DropoutStream::keep(key, j, drop.threshold) ? s[j] * keep_scale : Scalar(0);
      }
    }
  }
  // pass 3: out (rows, d_v) = weights (rows, T_k) v (T_k, d_v), over the keys some row sees
  // (the weights of the rest are 0), value rows that are not finite only where seen.
  Scalar* out = p.out.data() + b * p.out.stride(0) + h * p.out.stride(1) + i0 * p.out.stride(2);
  const Index ldo = p.out.stride(2), v_rs = p.v.stride(2);
  Index key_end = 0;
  for (Index i = i0; i < i1; ++i) key_end = std::max(key_end, mask.row_end(i));
  Scalar* clean = kt;
  if (clean_values(v, v_rs, key_end, dv, clean)) {
    micro_gemm<Scalar>(rows, dv, key_end, scores, tk, 1, clean, dv, out, ldo, Scalar(1), false,
                       nullptr);
    add_nonfinite_values(rows, key_end, dv, scores, tk, 1, v, v_rs, clean, out, ldo,
                         [&](Index r, Index j) { return mask.sees(i0 + r, j); });
  } else {
    micro_gemm<Scalar>(rows, dv, key_end, scores, tk, 1, v, v_rs, out, ldo, Scalar(1), false,
                       nullptr);
  }
  if (p.weights.data() != nullptr) {
    Scalar* w = p.weights.data() + b * p.weights.stride(0) + h * p.weights.stride(1) +
                i0 * p.weights.stride(2);
    for (Index r = 0; r < rows; ++r) {
      std::copy(scores + r * tk, scores + (r + 1) * tk, w + r * p.weights.stride(2));
    }
  }
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
void streaming_tile(const AttentionArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                    const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                    Scalar* scratch) {
  using V = Vec<Scalar>;
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
  Scalar* seen = corr + kQueryBlock;       // 1 once a query has seen a key its masks allow
  Scalar* clean = seen + kQueryBlock;      // a V tile with non-finite rows zeroed (rarely)
  std::fill(acc, acc + rows * dv, Scalar(0));
  std::fill(m, m + kQueryBlock, kNegInf);
  std::fill(l, l + kQueryBlock, Scalar(0));
  std::fill(seen, seen + kQueryBlock, Scalar(0));

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
        if (mask.apply(i0 + r, j0, column, visible) > 0) seen[r] = Scalar(1);
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
      V::store(corr + c, vexp<V>(V::sub(V::max(m_old, lowest), sh)));
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
          const auto e = vexp<V>(V::sub(V::load(x), sh));
          V::store(x, e);
          sum = V::add(sum, e);
        }
      } else {
        for (Index j = 0; j < width; ++j) {
          Scalar* x = st + j * ld + c;
          const auto e = vexp<V>(V::sub(V::load_partial(x, n), sh));
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
    // of p^T, and each group of queries stops at its last visible key. Value rows that are
    // not finite enter only for the queries that see them (see clean_values()).
    const Scalar* vt = v + j0 * v_rs;
    Index vt_rs = v_rs;
    const Index tile_need = std::clamp<Index>(mask.row_end(i1 - 1) - j0, 0, width);
    const bool dirty = clean_values(vt, v_rs, tile_need, dv, clean);
    if (dirty) vt = clean, vt_rs = dv;
    for (Index r0 = 0; r0 < rows; r0 += kMicroRows) {
      const Index group = std::min<Index>(kMicroRows, rows - r0);
      const Index need =
          std::clamp<Index>(mask.row_end(i0 + r0 + group - 1) - j0, 0, width);
      if (need > 0) {
        micro_gemm<Scalar>(group, dv, need, st + r0, 1, ld, vt, vt_rs, acc + r0 * dv, dv,
                           Scalar(1), true, nullptr);
      }
    }
    if (dirty) {
      add_nonfinite_values(rows, tile_need, dv, st, 1, ld, v + j0 * v_rs, v_rs, clean, acc, dv,
                           [&](Index r, Index j) { return mask.sees(i0 + r, j0 + j); });
    }
  }
  // pass 6: normalise into out. A query its masks hide every key from stays zero; the others
  // divide by l, IEEE (l = 0 when every visible score was -inf: 0/0 = NaN, as in PyTorch).
  Scalar* out = p.out.data() + b * p.out.stride(0) + h * p.out.stride(1) + i0 * p.out.stride(2);
  const double keep = 1.0 - (drop.active ? p.dropout : 0.0);
  for (Index r = 0; r < rows; ++r) {
    Scalar* o = out + r * p.out.stride(2);
    const bool any = elementwise ? seen[r] != Scalar(0) : mask.row_end(i0 + r) > 0;
    if (any) {
      const Scalar inv = static_cast<Scalar>(1.0 / (static_cast<double>(l[r]) * keep));
      for (Index e = 0; e < dv; ++e) o[e] = acc[r * dv + e] * inv;
    } else {
      std::fill(o, o + dv, Scalar(0));
    }
    if (p.lse.data() != nullptr) write_lse(p, b, h, i0 + r, m[r], l[r], any);
  }
}
