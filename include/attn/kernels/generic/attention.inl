// SPDX-License-Identifier: MIT
// attn/kernels/generic/attention.inl: both attention paths for one task, (batch, head, up to
// kQueryBlock query rows), written once over a set's Vec and micro-kernel. The driver
// (attn/ops/attention.hpp) resolves the task's mask and dropout stream and runs
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

/// Whether rows [0, n) of v (d_v wide, row stride v_rs) hold no NaN and no infinity: x * 0
/// is 0 for finite x, NaN otherwise, summed over the rows, the lanes looked at once.
template <class Scalar>
bool rows_finite(const Scalar* v, Index v_rs, Index n, Index dv) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  auto t = V::zero();
  for (Index j = 0; j < n; ++j) {
    const Scalar* row = v + j * v_rs;
    Index e = 0;
    for (; e + W <= dv; e += W) t = V::add(t, V::mul(V::load(row + e), V::zero()));
    if (e < dv) t = V::add(t, V::mul(V::load_partial(row + e, dv - e), V::zero()));
  }
  alignas(64) Scalar lanes[W];
  V::store(lanes, t);
  for (Index i = 0; i < W; ++i) {
    if (lanes[i] != Scalar(0)) return false;
  }
  return true;
}

/// Whether v's rows [0, n) (d_v wide, row stride v_rs) hold a NaN or an infinity; if so,
/// copies them to `clean` (n x d_v) with those rows zeroed.
template <class Scalar>
bool clean_values(const Scalar* v, Index v_rs, Index n, Index dv, Scalar* clean) noexcept {
  if (rows_finite(v, v_rs, n, dv)) return false;
  for (Index j = 0; j < n; ++j) {
    const Scalar* row = v + j * v_rs;
    Scalar* to = clean + j * dv;
    if (!rows_finite(row, v_rs, 1, dv)) {
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
                          const Scalar* v, Index v_rs, const Scalar* clean, Scalar* out, Index ldo,
                          Sees&& sees) noexcept {
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
template <class Scalar, class Operand>
void write_lse(const AttentionArgs<Scalar, Operand>& p, Index b, Index h, Index i, Scalar max,
               Scalar sum, bool any = true) noexcept {
  p.lse.data()[b * p.lse.stride(0) + h * p.lse.stride(1) + i * p.lse.stride(2)] =
      any ? static_cast<Scalar>(static_cast<double>(max) + std::log(static_cast<double>(sum)))
          : std::numeric_limits<Scalar>::infinity();
}

/// Materialised path for query rows [i0, i1) of head (b, h) (key/value head h / (H / H_kv)):
/// the full score rows, an exact (two-pass) softmax, then weights times V. Straightforward
/// on purpose: it is the reference the streaming path is tested against, and what returns
/// weights. A row whose masks hide every key gets zero weights and output; otherwise the
/// softmax follows IEEE over the keys it sees (NaN in, NaN out; every visible score -inf:
/// NaN, as PyTorch computes). scratch: materialized_scratch_size() elements.
template <class Scalar>
void materialized_tile(const AttentionArgs<Scalar>& p, const HeadMask<Scalar>& mask,
                       const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                       Scalar* scratch) {
  const Index rows = i1 - i0, tk = p.k.extent(2), d = p.q.extent(3), dv = p.v.extent(3);
  const Index kv_head = h / (p.q.extent(1) / p.k.extent(1));
  Scalar* scores = scratch;                 // (rows, T_k)
  Scalar* kt = scratch + kQueryBlock * tk;  // K^T (d, T_k), then V cleaned (T_k, d_v)
  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1) + i0 * p.q.stride(2);
  const Scalar* k = p.k.data() + b * p.k.stride(0) + kv_head * p.k.stride(1);
  const Scalar* v = p.v.data() + b * p.v.stride(0) + kv_head * p.v.stride(1);
  // pass 1: scores (rows, T_k) = q k^T * scale (the micro-kernel never threads, so the
  // result does not depend on the thread count).
  pack_transposed(k, p.k.stride(2), 0, tk, 0, d, kt);
  micro_gemm<Scalar>(rows, tk, d, q, p.q.stride(2), 1, kt, tk, scores, tk, p.scale, false, nullptr);
  // The scores at an earlier stage than the weights, when asked for (WeightsStage).
  Scalar* staged = p.weights.data() != nullptr && p.weights_stage != WeightsStage::kWeights
                       ? p.weights.data() + b * p.weights.stride(0) + h * p.weights.stride(1) +
                             i0 * p.weights.stride(2)
                       : nullptr;
  const Index staged_rs = staged != nullptr ? p.weights.stride(2) : 0;
  const auto stage_rows = [&](WeightsStage stage) {
    if (staged == nullptr || p.weights_stage != stage) return;
    for (Index r = 0; r < rows; ++r) {
      std::copy(scores + r * tk, scores + (r + 1) * tk, staged + r * staged_rs);
    }
  };
  // pass 1b: the variants on the scores: softcap, then ALiBi (per row, below).
  stage_rows(WeightsStage::kScaled);
  if (p.softcap != Scalar(0)) softcap_block(scores, rows, tk, tk, p.softcap);
  stage_rows(WeightsStage::kSoftcapped);
  const Scalar slope = p.has_alibi() ? alibi_slope(p, h) : Scalar(0);
  const Scalar keep_scale =
      drop.active ? Scalar(1) / static_cast<Scalar>(1.0 - p.dropout) : Scalar(1);
  Index key_begin = tk, key_end = 0;  // the keys some row sees
  for (Index r = 0; r < rows; ++r) {
    const Index i = i0 + r;
    Scalar* s = scores + r * tk;
    // pass 2: masks (loop bounds, then element-wise parts) and a stable softmax over the
    // visible keys; invisible keys get weight 0.
    const Index end = mask.row_end(i), begin = std::min(mask.row_begin(i), end);
    if (p.has_alibi()) {
      alibi_row(s + begin, end - begin, begin, static_cast<Scalar>(i + mask.position), slope);
    }
    const Index seen =
        mask.elementwise() ? mask.apply(i, begin, s + begin, end - begin) : end - begin;
    if (staged != nullptr && p.weights_stage == WeightsStage::kMasked) {
      Scalar* w = staged + r * staged_rs;
      std::fill(w, w + tk, -std::numeric_limits<Scalar>::infinity());
      std::copy(s + begin, s + end, w + begin);
    }
    if (seen > 0) {
      const bool want_top = p.lse.data() != nullptr || p.sinks != nullptr;
      const Scalar top = want_top ? *std::max_element(s + begin, s + end) : Scalar(0);
      const Scalar sum = softmax_row(s + begin, end - begin, /*all_minus_inf_is_masked=*/false);
      if (p.sinks != nullptr) {  // the sink joins the denominator
        const SinkShare share = sink_share(top, sum, p.sinks[h]);
        const Scalar factor = static_cast<Scalar>(static_cast<double>(sum) * share.scale);
        if (top == -std::numeric_limits<Scalar>::infinity()) {
          std::fill(s + begin, s + end, Scalar(0));  // the sink takes the row (not 0/0)
        } else {
          scale_row(s + begin, end - begin, factor);
        }
        if (p.lse.data() != nullptr) {
          p.lse.data()[b * p.lse.stride(0) + h * p.lse.stride(1) + i * p.lse.stride(2)] =
              static_cast<Scalar>(share.lse);
        }
      } else if (p.lse.data() != nullptr) {
        write_lse(p, b, h, i, top, sum);
      }
      key_begin = std::min(key_begin, begin);
      key_end = std::max(key_end, end);
    } else {
      std::fill(s + begin, s + end, Scalar(0));
      if (p.lse.data() != nullptr) write_lse(p, b, h, i, Scalar(0), Scalar(0), false);
    }
    std::fill(s, s + begin, Scalar(0));
    std::fill(s + end, s + tk, Scalar(0));
    if (staged != nullptr && p.weights_stage == WeightsStage::kProbabilities) {
      std::copy(s, s + tk, staged + r * staged_rs);
    }
    if (drop.active) {
      const std::uint64_t key = drop.row_key(i);
      for (Index j = begin; j < end; ++j) {
        s[j] = DropoutStream::keep(key, j, drop.threshold) ? s[j] * keep_scale : Scalar(0);
      }
    }
  }
  // pass 3: out (rows, d_v) = weights (rows, T_k) v (T_k, d_v), over the keys some row sees
  // (the weights of the rest are 0), value rows that are not finite only where seen.
  Scalar* out = p.out.data() + b * p.out.stride(0) + h * p.out.stride(1) + i0 * p.out.stride(2);
  const Index ldo = p.out.stride(2), v_rs = p.v.stride(2);
  key_begin = std::min(key_begin, key_end);
  const Index n = key_end - key_begin;
  const Scalar* w0 = scores + key_begin;
  const Scalar* v0 = v + key_begin * v_rs;
  Scalar* clean = kt;
  if (n == 0) {
    for (Index r = 0; r < rows; ++r) std::fill(out + r * ldo, out + r * ldo + dv, Scalar(0));
  } else if (clean_values(v0, v_rs, n, dv, clean)) {
    micro_gemm<Scalar>(rows, dv, n, w0, tk, 1, clean, dv, out, ldo, Scalar(1), false, nullptr);
    add_nonfinite_values(rows, n, dv, w0, tk, 1, v0, v_rs, clean, out, ldo,
                         [&](Index r, Index j) { return mask.sees(i0 + r, key_begin + j); });
  } else {
    micro_gemm<Scalar>(rows, dv, n, w0, tk, 1, v0, v_rs, out, ldo, Scalar(1), false, nullptr);
  }
  if (p.weights.data() != nullptr && p.weights_stage == WeightsStage::kWeights) {
    Scalar* w = p.weights.data() + b * p.weights.stride(0) + h * p.weights.stride(1) +
                i0 * p.weights.stride(2);
    for (Index r = 0; r < rows; ++r) {
      std::copy(scores + r * tk, scores + (r + 1) * tk, w + r * p.weights.stride(2));
    }
  }
}

/// sum_e a[e] b[e] over n elements, lanes then one reduction.
template <class Scalar>
inline Scalar dot(const Scalar* a, const Scalar* b, Index n) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  auto t0 = V::zero(), t1 = V::zero();
  Index e = 0;
  for (; e + 2 * W <= n; e += 2 * W) {
    t0 = V::fmadd(V::load(a + e), V::load(b + e), t0);
    t1 = V::fmadd(V::load(a + e + W), V::load(b + e + W), t1);
  }
  for (; e + W <= n; e += W) t0 = V::fmadd(V::load(a + e), V::load(b + e), t0);
  if (e < n) t1 = V::fmadd(V::load_partial(a + e, n - e), V::load_partial(b + e, n - e), t1);
  return V::reduce_add(V::add(t0, t1));
}

/// V's whole key tiles of item b, key/value head h (T_k / kKeyBlock of them) as k-pairs into
/// `pairs` (kKeyBlock / 2 x d_v words per tile), and per tile whether it holds a NaN or an
/// infinity (pack_row_pairs()), for AttentionArgs::value_pairs: the k-pair paths' tasks of
/// one (item, key/value head) all read the same V tiles, which each packed once per task
/// (8 % of the AMX call at B 8, H 8, T 512, d 64: perf). The same words as streaming_tile()'s
/// own packing of a whole tile, so the same bits. Float and double operands: the flags alone
/// (each task scanned each tile it read: the driver, attn/ops/attention.hpp, says what it
/// cost). Other sets and operand types: nothing.
template <class Scalar, class Operand>
void pack_value_tiles(const AttentionArgs<Scalar, Operand>& p, Index b, Index h, float* pairs,
                      unsigned char* dirty) noexcept {
  if constexpr (std::is_same_v<Operand, Scalar>) {
    const Index dv = p.v.extent(3), tiles = p.v.extent(2) / kKeyBlock, v_rs = p.v.stride(2);
    const Operand* v = p.v.data() + b * p.v.stride(0) + h * p.v.stride(1);
    for (Index t = 0; t < tiles; ++t) {
      dirty[t] = rows_finite(v + t * kKeyBlock * v_rs, v_rs, kKeyBlock, dv) ? 0 : 1;
    }
    static_cast<void>(pairs);
  } else if constexpr (kSetIsa == Isa::kAvx512 && std::is_same_v<Operand, bfloat16>) {
    const Index dv = p.v.extent(3), tiles = p.v.extent(2) / kKeyBlock, v_rs = p.v.stride(2);
    const Operand* v = p.v.data() + b * p.v.stride(0) + h * p.v.stride(1);
    for (Index t = 0; t < tiles; ++t) {
      dirty[t] = pack_row_pairs(v + t * kKeyBlock * v_rs, v_rs, kKeyBlock, dv,
                                pairs + t * (kKeyBlock / 2) * dv, dv)
                     ? 1
                     : 0;
    }
  } else {
    static_cast<void>(p), static_cast<void>(b), static_cast<void>(h);
    static_cast<void>(pairs), static_cast<void>(dirty);
  }
}

/// Streaming path for one task (see StreamTask): query rows of one or more heads of a
/// key/value group against tiles of K/V with an online softmax (running max m and sum l per
/// row). It works on transposed scores S^T (keys x rows), so
///  - Q^T is packed once per task and K, V are read in place (no per-tile packing), each
///    tile serving every row of the task: with short queries (decoding) the rows are the
///    whole group's heads, so a grouped K/V row is read once for all of them;
///  - the softmax statistics of all rows are vectors: max, exp and sums run across rows
///    with no horizontal reductions;
///  - tiles wholly outside every row's bounds (causal diagonal, sliding window) are never
///    visited, and inside a boundary tile each group of keys is multiplied only with the
///    rows that can see one of them.
/// Tiles end at multiples of kKeyBlock and, for keys in a ring, where the ring wraps.
///
/// Operands of a storage type (Operand bfloat16 or float16, Scalar float; scratch also
/// reduced_stream_scratch_size()) as PyTorch's CPU flash attention computes them: the
/// products accumulate in float, the softmax, its statistics and the rescaling run in float,
/// and P is rounded to Operand before it multiplies V. bfloat16 on the avx512 set with
/// p.path kAmx or kDot: both products on AMX tiles (avx512/amx_bf16.inl's amx_block()) or
/// vdpbf16ps (avx512/bf16_dot.inl), Q^T and each V tile packed in k-pairs (V's whole tiles
/// read from the call's, p.value_pairs, when the driver packed them), K read in place
/// (copied into whole tiles for AMX), the softmax passes between the products in
/// avx512/attention_pairs.inl; otherwise Q and each K and V tile widened to float for
/// the float path's products; few rows without the k-pair paths: the scores on K rows
/// widened in registers where the set can (decode_key_scores_part(): no float copy of a
/// tile), and for at most 4 rows P V too (half_values_part()). A V tile holding a
/// NaN or an infinity takes the widened product (see "values that are NaN or infinite"
/// above). Writes out in Operand, one rounding of the float result.
/// Stored keys and values (a quantised or a paged cache, p.stored; float operands only,
/// Operand == Scalar; scratch also stored_tile_scratch_size()) are dequantised (or copied)
/// tile by tile into the task's scratch (load_stored_rows()), then read as the tile would be
/// in place; except int8 and int4 keys of a float call, scored on integer dot products
/// against the query quantised once per task (stored_int8_scores(), stored_int4_scores()),
/// int8 and int4 values, widened in registers where the set can (stored_int8_values(),
/// stored_int4_values()), unscaled float, bfloat16 and float16 keys of few rows scored in
/// place, widened in registers where the set can (stored_decode_scores()), 16-bit values of at
/// most 4 rows likewise (stored_half_values()), paged Scalar keys elsewhere under one dot
/// product per (key, row) and paged
/// Scalar values (micro_gemm_gathered()), read in their blocks.
/// Paged rows of a storage type (a PagedKVCache<bfloat16> or <float16>: p.stored over rows of
/// Operand; scratch also stored_tile_scratch_size()) are copied tile by tile out of their
/// blocks (the same tiles, the same bits as a contiguous cache of those rows).
template <class Scalar, class Operand>
void streaming_tile(const AttentionArgs<Scalar, Operand>& p, const HeadMask<Scalar>* masks,
                    const DropoutStream* drops, const StreamTask<Scalar>& task, Scalar* scratch) {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
  Index ld = kQueryBlock;  // row stride of s^T (4 when packed, below)
  static_assert(kQueryBlock % W == 0, "the per-row statistics are whole vectors");
  const Index nq = task.i1 - task.i0, rows = task.heads * nq, d = p.q.extent(3);
  const Index dv = p.v.extent(3), i0 = task.i0;
  Scalar* qt = scratch;                        // Q^T (d, rows)
  Scalar* st = qt + d * kQueryBlock;           // s^T, then p^T (keys, rows)
  Scalar* acc = st + kKeyBlock * kQueryBlock;  // unnormalised output (rows, d_v)
  Scalar* m = acc + kQueryBlock * dv;          // running max per row
  Scalar* l = m + kQueryBlock;                 // running sum per row
  Scalar* shift = l + kQueryBlock;             // this tile's exp shift per row
  Scalar* corr = shift + kQueryBlock;          // rescale factor per row
  Scalar* seen = corr + kQueryBlock;           // 1 once a row has seen a key its masks allow
  Scalar* clean = seen + kQueryBlock;          // a V tile with non-finite rows zeroed (rarely)
  // Storage-type operands (reduced_stream_scratch_size()):
  constexpr bool kReduced = !std::is_same_v<Operand, Scalar>;
  constexpr bool kPairs = kSetIsa == Isa::kAvx512 && std::is_same_v<Operand, bfloat16>;
  // vdpbf16ps with at most 4 rows (a decode step's grouped heads): 4 keys x 4 rows per step
  // and P V on pairs of keys (avx512/bf16_rows.inl), not the k-pair micro-tiles.
  const bool dot_rows_bf16 = kPairs && p.path == Bf16Path::kDot && rows <= 4;
  const bool pairs = kPairs && p.path != Bf16Path::kWiden && !dot_rows_bf16;  // AMX, vdpbf16ps
  const bool amx = kPairs && p.path == Bf16Path::kAmx;
  Scalar* qw = clean + kKeyBlock * dv;                 // Q widened (rows, d)
  Scalar* kw = qw + kQueryBlock * d;                   // a K tile widened, or in AMX tiles
  Scalar* vw = kw + kKeyBlock * (d + 32);              // a V tile widened (width, d_v)
  Scalar* qp = vw + kKeyBlock * dv;                    // Q^T in k-pairs (words, kQueryBlock)
  Scalar* vp = qp + ((d + 1) / 2 + 32) * kQueryBlock;  // a V tile in k-pairs (width / 2, d_v)
  Operand* pb = reinterpret_cast<Operand*>(vp + kKeyBlock / 2 * dv);  // P rounded (rows, width)
  Scalar* st_next = vp + kKeyBlock / 2 * dv + kQueryBlock * kKeyBlock / 2;  // the next s^T (AMX)
  // Stored keys and values (stored_tile_scratch_size(); float operands only, so the same
  // place as the storage types' buffers):
  Scalar* k_load = clean + kKeyBlock * dv;  // the K tile dequantised (kKeyBlock, d)
  Scalar* v_load = k_load + kKeyBlock * d;  // the V tile dequantised (kKeyBlock, d_v)
  const bool stored = !kReduced && p.stored.active();
  // Paged rows of a storage type: each tile's K (kKeyBlock, d) and V (kKeyBlock, d_v)
  // Operands copied after the storage types' buffers, then read as a tile in place.
  const bool gathered = kReduced && p.stored.active();
  Operand* k_gather = nullptr;
  Operand* v_gather = nullptr;
  if constexpr (kReduced) {
    k_gather = reinterpret_cast<Operand*>(qw + reduced_stream_scratch_size(d, dv));
    v_gather = k_gather + kKeyBlock * d;
  }
  std::fill(acc, acc + rows * dv, Scalar(0));
  std::fill(m, m + kQueryBlock, kNegInf);
  std::fill(l, l + kQueryBlock, Scalar(0));
  std::fill(seen, seen + kQueryBlock, Scalar(0));

  // Row r is query i0 + r % nq of head h0 + r / nq; it sees keys [begin[r], end[r]) of the
  // task's range, less what the element-wise parts hide.
  Index begin[kQueryBlock], end[kQueryBlock];
  Index lo = std::numeric_limits<Index>::max(), hi = 0, max_begin = 0;
  Index min_end = std::numeric_limits<Index>::max();
  for (Index r = 0; r < rows; ++r) {
    const HeadMask<Scalar>& mask = masks[r / nq];
    const Index i = i0 + r % nq;
    end[r] = std::min(mask.row_end(i), task.j_end);
    begin[r] = std::min(std::max(mask.row_begin(i), task.j_begin), end[r]);
    if (end[r] > begin[r]) lo = std::min(lo, begin[r]), hi = std::max(hi, end[r]);
    max_begin = std::max(max_begin, begin[r]);
    min_end = std::min(min_end, end[r]);
  }
  const Index q_rs = p.q.stride(2);
  const Index k_rs = stored || gathered ? d : p.k.stride(2);
  const Index v_rs = stored || gathered ? dv : p.v.stride(2);
  // K and V of the task's item and key/value head; stored: the dequantised tiles.
  const Operand* k = nullptr;
  const Operand* v = nullptr;
  if constexpr (kReduced) {
    k = gathered ? k_gather : p.k.data() + task.b * p.k.stride(0) + task.kv_head * p.k.stride(1);
    v = gathered ? v_gather : p.v.data() + task.b * p.v.stride(0) + task.kv_head * p.v.stride(1);
  } else {
    k = stored ? k_load : p.k.data() + task.b * p.k.stride(0) + task.kv_head * p.k.stride(1);
    v = stored ? v_load : p.v.data() + task.b * p.v.stride(0) + task.kv_head * p.v.stride(1);
  }
  const bool elementwise = masks[0].elementwise();
  const Index col_group = micro_cols<Scalar>();
  // Dot products cost rows (d / W + ~8 for the reduction) per key, the micro-kernel about
  // d kMicroVecs whatever the row count: 4x less for a decode step's 4 rows (AVX-512, d 128).
  const bool dot_rows = !pairs && rows * (d / W + 8) < d * kMicroVecs;
  const Operand* qsrc[kQueryBlock];
  const Scalar* qrow[kQueryBlock];
  Index q_ld = q_rs;  // row stride of qrow's rows
  for (Index r = 0; r < rows; ++r) {
    qsrc[r] = p.q.data() + task.b * p.q.stride(0) + (task.h0 + r / nq) * p.q.stride(1) +
              (i0 + r % nq) * q_rs;
    if constexpr (kReduced) {
      if (!pairs) convert_row(qsrc[r], qw + r * d, d);
      qrow[r] = qw + r * d, q_ld = d;
    } else {
      qrow[r] = qsrc[r];
    }
  }
  for (Index g = 0; g < (dot_rows || pairs ? 0 : task.heads); ++g) {
    pack_transposed(qrow[g * nq], q_ld, 0, nq, 0, d, qt + g * nq, rows);
  }
  // AMX and vdpbf16ps: Q^T as k-pairs (word (q, r) holds Q[r][2q], Q[r][2q + 1]), its words
  // run on with +0 to whole AMX tiles (gemm_words(kAmx, d) rows).
  if constexpr (kPairs) {
    if (pairs) {
      std::fill(qp, qp + gemm_words(Bf16Path::kAmx, d) * kQueryBlock, 0.0f);
      for (Index g = 0; g < task.heads; ++g) {
        pack_pairs(qsrc[g * nq], q_rs, 0, nq, 0, d, qp + g * nq, kQueryBlock);
      }
      if (amx) amx_configure(task);
    }
  }
  // int8 keys (float operands): the query rows quantised once per task, then each tile's
  // scores on integer dot products over the stored keys (stored_int8_scores()), which are not
  // dequantised. A query holding a NaN or an infinity takes the float path.
  // int4 keys: the same query, scored per block (stored_int4_scores()).
  QuantizedQuery qq;
  bool int8_keys = false, int4_keys = false;
  if constexpr (std::is_same_v<Scalar, float> && !kReduced) {
    const KVElement ke = p.stored.k.element;
    if (stored && (ke == KVElement::kInt8 || ke == KVElement::kInt4)) {
      auto* bytes = reinterpret_cast<std::int8_t*>(v_load + kKeyBlock * dv);
      auto* sums = reinterpret_cast<std::int32_t*>(bytes + kQueryBlock * quantized_query_ld(d));
      auto* scales = reinterpret_cast<float*>(sums + kQueryBlock);
      const bool quantized = quantize_query(qrow, rows, d, p.scale, bytes, sums, scales, qq);
      int8_keys = quantized && ke == KVElement::kInt8;
      int4_keys = quantized && ke == KVElement::kInt4;
    }
  }
  // The dot-product rows' keys (float, bfloat16 or float16: in place, a storage type's own, or
  // unscaled stored rows of a float call): scored 4 keys x 4 rows at a time with each key
  // widened in registers (decode_key_scores_part(), stored_decode_scores()), where the set has
  // that form (asked with a call over no keys); 16-bit values of at most 4 rows likewise
  // (half_rows: half_values_part(), stored_half_values()).
  bool row_keys = false, half_rows = false;
  if constexpr (std::is_same_v<Scalar, float>) {
    const auto has_form = [&](const auto* type) {
      return decode_key_scores_part(qrow, rows, type, 0, d, 0, p.scale, st, ld, KeyPrefetch());
    };
    if constexpr (kReduced) {
      const bool form = has_form(static_cast<const Operand*>(nullptr));
      row_keys = dot_rows && form;
      half_rows = rows <= 4 && !pairs && form;
    } else if (!stored) {
      row_keys = dot_rows && has_form(static_cast<const float*>(nullptr));
    } else {
      const auto form_of = [&](const StoredRows& s) {
        return s.scales == nullptr && with_decode_key_type(s.element, has_form);
      };
      row_keys = dot_rows && !int8_keys && !int4_keys && form_of(p.stored.k);
      half_rows = rows <= 4 && p.stored.v.element != KVElement::kScalar && form_of(p.stored.v);
    }
  }
  // A decode step's few rows (at most 4) over int8 or int4 keys, or keys scored 4 x 4, keep
  // s^T packed, 4 floats per key (ld 4, the score kernels' 4-row groups): the max and exp
  // passes then take W / 4 keys per vector instead of one key in a vector of W lanes.
  const bool packed = W % 4 == 0 && (int8_keys || int4_keys || row_keys) && rows <= 4;
  if (packed) ld = 4;
  // ALiBi: each row's key position and its head's slope.
  const bool alibi = p.has_alibi();
  alignas(64) Scalar pos[kQueryBlock], slope[kQueryBlock];
  // (The slope once per head, copied along its rows: the standard series' three pow calls
  // per row were 10 % of a B8 T512 H8 task's time.)
  for (Index r = 0; r < (alibi ? kQueryBlock : 0); ++r) {
    const Index g = std::min(r, rows - 1) / nq;
    const bool same_head = r > 0 && g == std::min(r - 1, rows - 1) / nq;
    pos[r] = static_cast<Scalar>(i0 + r % nq + masks[g].position);
    slope[r] = same_head ? slope[r - 1] : alibi_slope(p, task.h0 + g);
  }
  // AMX and vdpbf16ps with no softcap, ALiBi or element-wise mask: pass 3 scales the scores
  // and applies the loop bounds as it takes the max (pairs_scale_bound_max(): one pass over
  // s^T instead of three, the same bits).
  const bool fused = pairs && p.softcap == Scalar(0) && !alibi && !elementwise;
  // The keys of tile [j0, j0 + width) whose scores some row needs: all, or in a boundary tile
  // those before the last row's end (pass 2, or the fused pass 3, sets the rest to -inf).
  const auto tile_keys = [&](Index j0, Index width) {
    if (j0 >= max_begin && j0 + width <= min_end) return width;
    Index keys = 0;
    for (Index r = 0; r < rows; ++r) keys = std::max(keys, end[r] - j0);
    return std::clamp<Index>(keys, 0, width);
  };
  // AMX: rows [0, keys) of a K tile as the A operand of whole tiles (ka, row stride ka_ld):
  // read in place when its tiles stay inside the tile's keys and d (d a multiple of 32, keys
  // of 16), else copied into whole tiles in kw (amx_pack_a()).
  const auto amx_keys = [&](const auto* k_tile, Index keys, const auto*& ka, Index& ka_ld) {
    ka = k_tile, ka_ld = k_rs;
    if (d % 32 != 0 || keys % 16 != 0) {
      auto* tiles = reinterpret_cast<bfloat16*>(kw);
      amx_pack_a(k_tile, k_rs, keys, d, tiles);
      ka = tiles, ka_ld = (d + 31) / 32 * 32;
    }
  };
  // AMX with the fused passes, no dropout, K and V in place and d_v a multiple of 16:
  // pipelined. A tile instruction holds the reorder buffer until its tiles are done, so a
  // whole product (64 to 128 tdpbf16ps) followed by a vector pass runs one after the other;
  // here the next tile's scores (into st_next) are issued a block at a time between this
  // tile's blocks of exponentials, and this tile's P V between the next tile's groups of
  // pass 3 (queue: AmxTileQueue), so that the tiles compute while the vector units run. The
  // products are the same, in the same order into each element: the same bits.
  const bool pipelined =
      amx && fused && !drops[0].active && !stored && !gathered && p.ring == 0 && dv % 16 == 0;
  auto queue = [&] {
    if constexpr (kPairs) {
      return amx_tile_queue(task);
    } else {
      return 0;
    }
  }();
  bool next_scores = false;     // st_next holds the next tile's scores
  alignas(64) Scalar lanes[W];  // packed: a vector's lanes, folded 4 by 4 into rows

  for (Index j0 = lo, width = 0; j0 < hi; j0 += width) {
    const bool scores_ready = next_scores;
    if (next_scores) std::swap(st, st_next), next_scores = false;
    width = std::min(hi, (j0 / kKeyBlock + 1) * kKeyBlock) - j0;
    if (p.ring > 0) width = std::min(width, p.ring - j0 % p.ring);  // no tile crosses the wrap
    const Index slot = p.ring > 0 ? j0 % p.ring : j0;
    const Operand* k_tile = stored || gathered ? k : k + slot * k_rs;
    const Operand* v_tile = stored || gathered ? v : v + slot * v_rs;
    // K and V rows in place: what a pass over the tile's keys asks for.
    KeyPrefetch inplace_ahead;
    if (!stored && !gathered) {
      constexpr Index kBytes = Index(sizeof(Operand));
      inplace_ahead.k_bytes = d * kBytes;
      inplace_ahead.keys = keys_ahead(inplace_ahead.k_bytes);
      inplace_ahead.v = reinterpret_cast<const unsigned char*>(v_tile);
      inplace_ahead.v_rs = v_rs * kBytes, inplace_ahead.v_bytes = dv * kBytes;
    }
    if constexpr (kReduced) {
      const auto gather = [&](const StoredRows& s, Index n, Operand* to) {
        stored_runs(s, task.b, task.kv_head, slot, width,
                    [&](const unsigned char* row, const float*, Index j, Index run) {
                      for (Index r = 0; r < run; ++r) {
                        std::memcpy(to + (j + r) * n, row + r * s.row_stride,
                                    static_cast<std::size_t>(n) * sizeof(Operand));
                      }
                    });
      };
      if (gathered) gather(p.stored.k, d, k_gather), gather(p.stored.v, dv, v_gather);
    }
    // Paged quantised rows of a scattered pool: the next tile's keys asked for now through the
    // block table (prefetch_scattered_rows(); float rows, whose blocks span whole pages,
    // measured slower with it).
    if (stored && p.ring == 0 && p.stored.k.element != KVElement::kScalar) {
      prefetch_scattered_rows(p.stored.k, task.b, task.kv_head, j0 + width,
                              std::min(kKeyBlock, hi - j0 - width), d);
    }
    // Paged Scalar keys with one dot product per (key, row): read in place from their blocks.
    const bool keys_in_place =
        stored && dot_rows && !row_keys && p.stored.k.element == KVElement::kScalar;
    if constexpr (std::is_same_v<Scalar, float> && !kReduced) {
      if (int4_keys) {  // (the value rows asked for as for int8 keys, below)
        stored_int4_scores(p.stored.k, task.b, task.kv_head, slot, width, qq, st, ld, &p.stored.v,
                           dv);
      }
    }
    // Keys scored 4 x 4 (the value rows asked for with them, as for int8 keys).
    if constexpr (std::is_same_v<Scalar, float>) {
      if (row_keys) {
        if (!stored) {
          bool dotted = false;
          if constexpr (kPairs) {
            if (dot_rows_bf16) {
              dot_rows_scores(qsrc, rows, k_tile, k_rs, d, width, p.scale, st, ld, inplace_ahead);
              dotted = true;
            }
          }
          if (!dotted) {
            decode_key_scores_part(qrow, rows, k_tile, k_rs, d, width, p.scale, st, ld,
                                   inplace_ahead);
          }
        } else if constexpr (!kReduced) {
          with_decode_key_type(p.stored.k.element, [&](const auto* type) {
            using Key = std::remove_cv_t<std::remove_pointer_t<decltype(type)>>;
            return stored_decode_scores<Key>(p.stored.k, task.b, task.kv_head, slot, width, qrow,
                                             rows, d, p.scale, st, ld, &p.stored.v, dv);
          });
        }
      }
    }
    // s^T already holds the tile's scores
    const bool scored = int8_keys || int4_keys || row_keys;
    if (stored && !scored && !keys_in_place) {
      load_stored_rows(p.stored.k, task.b, task.kv_head, slot, width, d, k_load, &p.stored.v, dv);
    }
    // pass 0 (storage types, widening): the K tile (width, d) widened into kw, asking for the
    // keys ahead (keys_ahead()) and the same keys' value rows as it goes (KeyRequests; a
    // bfloat16 module's decode step took 1.07x the time without at B 1 L 8192 on Zen 5).
    // Keys scored 4 x 4 in registers: nothing to widen.
    const Scalar* kt = nullptr;
    Index kt_rs = k_rs;
    if constexpr (kReduced) {
      const KeyRequests requests(inplace_ahead, reinterpret_cast<const unsigned char*>(k_tile),
                                 k_rs * Index(sizeof(Operand)));
      for (Index j = 0; j < (pairs || row_keys ? 0 : width); ++j) {
        requests(j);
        convert_row(k_tile + j * k_rs, kw + j * d, d);
      }
      kt = kw, kt_rs = d;
    } else {
      kt = k_tile;
    }
    // Every row sees every key of the tile (no bound inside it)?
    const bool full = j0 >= max_begin && j0 + width <= min_end;
    // pass 1: s^T (width, rows) = k[j0:j0+width] q^T * scale; in a boundary tile each group
    // of keys only against the column groups holding rows that see one of its keys. With few
    // rows (decoding) one dot product per (key, row) instead: the micro-kernel's tile would
    // be mostly idle lanes.
    if constexpr (std::is_same_v<Scalar, float> && !kReduced) {
      if (int8_keys) {
        // The tile's value rows start arriving while its scores are computed: asked for key by
        // key with the keys ahead inside the score pass, with the scales of both (key_prefetch(),
        // KeyRequests, which says why not all at once).
        stored_int8_scores(p.stored.k, task.b, task.kv_head, slot, width, qq, st, ld, &p.stored.v,
                           dv);
      }
    }
    if (keys_in_place) {
      stored_runs(p.stored.k, task.b, task.kv_head, slot, width,
                  [&](const unsigned char* row, const float*, Index j0, Index run) {
                    for (Index j = 0; j < run; ++j) {
                      const auto* key =
                          reinterpret_cast<const Scalar*>(row + j * p.stored.k.row_stride);
                      for (Index r = 0; r < rows; ++r) {
                        st[(j0 + j) * ld + r] = dot(key, qrow[r], d) * p.scale;
                      }
                    }
                  });
    } else if (dot_rows && !scored) {
      for (Index j = 0; j < width; ++j) {
        for (Index r = 0; r < rows; ++r) {
          st[j * ld + r] = dot(kt + j * kt_rs, qrow[r], d) * p.scale;
        }
      }
    }
    // AMX: s^T on whole 16 x 16 tiles (amx_tiles(); s^T has room for them, and the columns
    // past `rows` are never read), K read in place when its tiles stay inside the tile's keys
    // and d (d a multiple of 32, width of 16), else copied into whole tiles (amx_pack_a());
    // vdpbf16ps: K read in place, kMicroRows keys x micro_cols() rows per micro-tile. Every
    // row, boundary tile or not; the scale after (one rounding, as alpha), in pass 3 when the
    // passes are fused. In a boundary tile only the keys before the last row's end: pass 2 (or
    // the fused pass 3) sets the rest to -inf in every row.
    if constexpr (kPairs) {
      const Index keys = tile_keys(j0, width);
      if (amx) {
        // No software requests for this tile's values or the next tile's keys: the rows are
        // left to the hardware prefetcher until such requests are measured on AMX hardware
        // (a tile's rows asked for at once slowed the int8 decode step on Zen 5; KeyRequests).
        if (!scores_ready) {
          const bfloat16* ka = nullptr;
          Index ka_ld = 0;
          amx_keys(k_tile, keys, ka, ka_ld);
          amx_tiles((keys + 15) / 16, (rows + 15) / 16, (d + 31) / 32, ka, ka_ld, qp, kQueryBlock,
                    st, ld, false);
        }
      } else if (pairs) {
        float* crow[kMicroRows];
        for (Index gk = 0; gk < keys; gk += kMicroRows) {
          const Index group = std::min<Index>(kMicroRows, keys - gk);
          for (Index c0 = 0; c0 < rows; c0 += col_group) {
            for (Index r = 0; r < group; ++r) crow[r] = st + (gk + r) * ld + c0;
            bf16_dot_tile_rows(group, d, k_tile + gk * k_rs, k_rs, qp + c0, kQueryBlock, crow,
                               std::min(col_group, rows - c0), false, nullptr);
          }
        }
      }
      for (Index j = 0; j < (pairs && !fused ? keys : 0); ++j) {
        scale_row(st + j * ld, rows, p.scale);
      }
    }
    for (Index gk = 0; gk < (dot_rows || pairs || scored ? 0 : width); gk += kMicroRows) {
      const Index group = std::min<Index>(kMicroRows, width - gk);
      const Index first = j0 + gk, last = first + group - 1;
      for (Index c = 0; c < rows;) {
        Index c0 = 0, c1 = rows;
        if (!full) {  // the next run of rows that see one of these keys
          while (c < rows && (end[c] <= first || begin[c] > last)) ++c;
          c1 = c;
          while (c1 < rows && end[c1] > first && begin[c1] <= last) ++c1;
          if (c == rows) break;
          c0 = c / col_group * col_group;
          c1 = std::min(rows, (c1 + col_group - 1) / col_group * col_group);
        }
        micro_gemm<Scalar>(group, c1 - c0, d, kt + gk * kt_rs, kt_rs, 1, qt + c0, rows,
                           st + gk * ld + c0, ld, p.scale, false, nullptr);
        c = c1;
      }
    }
    // pass 1b: the variants: softcap, then ALiBi (entries no row sees are -inf after pass 2).
    if (p.softcap != Scalar(0)) softcap_block(st, width, rows, ld, p.softcap);
    if (alibi) alibi_block_t(st, width, rows, ld, j0, pos, slope);
    // pass 2: masks. Loop bounds: -inf outside each row's [begin, end). Element-wise parts
    // (boolean, additive, padding) where present.
    if (!full && !fused) {
      for (Index r = 0; r < rows; ++r) {
        const Index a = std::clamp<Index>(begin[r] - j0, 0, width);
        const Index e = std::clamp<Index>(end[r] - j0, 0, width);
        for (Index j = 0; j < a; ++j) st[j * ld + r] = kNegInf;
        for (Index j = std::max(a, e); j < width; ++j) st[j * ld + r] = kNegInf;
        if (e <= a) {
          for (Index j = 0; j < width; ++j) st[j * ld + r] = kNegInf;
        }
      }
    }
    if (elementwise) {
      alignas(64) Scalar column[kKeyBlock];
      for (Index r = 0; r < rows; ++r) {
        const Index a = std::clamp<Index>(begin[r] - j0, 0, width);
        const Index e = std::clamp<Index>(end[r] - j0, a, width);
        for (Index j = a; j < e; ++j) column[j] = st[j * ld + r];
        if (masks[r / nq].apply(i0 + r % nq, j0 + a, column + a, e - a) > 0) seen[r] = Scalar(1);
        for (Index j = a; j < e; ++j) st[j * ld + r] = column[j];
      }
    }
    // pass 3: per-query tile max -> new running max m, the exp shift, and the factor
    // corr = exp(m_old - shift) that rescales l and acc, all as vectors across queries.
    // shift = max(m_new, lowest): a query with no visible key so far keeps m = -inf and gets
    // a finite shift, so its exps are exp(-inf) = 0 and its corr is exp(0) = 1 (acc and l
    // are still 0), never NaN.
    // (Full-width chunks use plain loads and stores: masked stores are slow on some CPUs.)
    const auto lowest = V::set1(std::numeric_limits<Scalar>::lowest());
    // Packed: the tile's keys to a whole number of vectors with -inf (exp 0: nothing added),
    // each vector's lane t a score of row t % 4.
    const Index packed_end = packed ? (width * 4 + W - 1) / W * W : 0;
    std::fill(st + (packed ? width * 4 : 0), st + packed_end, kNegInf);
    for (Index c = 0; c < rows; c += W) {
      const Index n = std::min(W, rows - c);
      auto tmax = V::set1(kNegInf);
      if (packed) {
        for (Index i = 0; i < packed_end; i += W) tmax = V::max(tmax, V::load(st + i));
        V::store(lanes, tmax);
        for (Index t = 4; t < W; ++t) lanes[t % 4] = std::max(lanes[t % 4], lanes[t]);
        tmax = V::load(lanes);  // (lanes past row 3: not read)
      } else if (fused) {
        if constexpr (kPairs) {
          queue.step();  // pipelined: a block of the last tile's P V
          tmax =
              pairs_scale_bound_max(st + c, ld, width, n, p.scale, !full, begin + c, end + c, j0);
        }
      } else if (n == W) {
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
      V::store(corr + c, vexp_nonpositive<V>(V::sub(V::max(m_old, lowest), sh)));
    }
    if constexpr (kPairs) queue.drain();  // before acc, P and the V tile change
    // Each group of rows needs keys up to its last visible one (pass 5).
    const auto need_of = [&](Index r0, Index r1) {
      Index need = 0;
      for (Index r = r0; r < r1; ++r) need = std::max(need, end[r] - j0);
      return std::clamp<Index>(need, 0, width);
    };
    const Index tile_need = need_of(0, rows);
    // V's k-pairs for this tile (pass 5a): the call's (AttentionArgs::value_pairs) for a whole
    // tile every key of which some row needs, else packed here into vp; returns whether the
    // tile's first `need` rows hold a NaN or an infinity.
    // This tile's index among those the call prepared (AttentionArgs::value_pairs_dirty: the
    // driver prepares none for a ring's or stored rows), or -1: none, or not a whole tile.
    const auto prepared_tile = [&]() -> Index {
      if (p.value_pairs_dirty == nullptr || j0 % kKeyBlock != 0 || j0 + kKeyBlock > p.v.extent(2)) {
        return -1;
      }
      return p.value_tiles_per_head * (task.b * p.k.extent(1) + task.kv_head) + j0 / kKeyBlock;
    };
    const Scalar* vpairs = vp;
    const auto pack_values = [&](Index need) {
      if constexpr (kPairs) {
        if (const Index t = prepared_tile(); t >= 0 && need == kKeyBlock) {
          vpairs = p.value_pairs + t * (kKeyBlock / 2) * dv;
          return p.value_pairs_dirty[t] != 0;
        }
        vpairs = vp;
        return pack_row_pairs(v_tile, v_rs, need, dv, vp, dv);
      } else {
        return false;
      }
    };
    static_cast<void>(pack_values), static_cast<void>(prepared_tile);
    // pass 4: p^T = exp(s^T - shift), column sums into l (before dropout, which only
    // zeroes entries of the numerator), acc rows rescaled.
    // AMX and vdpbf16ps without dropout: the V tile packed first (pass 5a), and when it is
    // finite, the exponentials go straight into P, transposed and rounded
    // (pairs_exp_probabilities(): s^T is not written back), the same sums and bits.
    bool v_packed = false, v_dirty = false, exps_packed = false;
    if constexpr (kPairs) {
      if (pairs && !drops[0].active && tile_need > 0) {
        v_packed = true;
        v_dirty = pack_values(tile_need);
        if (!v_dirty) {
          const Index next = j0 + width;
          if (pipelined && next < hi) {  // the next tile's scores, during the exponentials
            const Index next_keys =
                tile_keys(next, std::min(hi, (next / kKeyBlock + 1) * kKeyBlock) - next);
            const bfloat16* ka = nullptr;
            Index ka_ld = 0;
            amx_keys(k + next * k_rs, next_keys, ka, ka_ld);
            queue.push((next_keys + 15) / 16, (rows + 15) / 16, (d + 31) / 32, ka, ka_ld, qp,
                       kQueryBlock, st_next, ld, false);
            next_scores = true;
          }
          alignas(64) Scalar sums[kQueryBlock];
          const Index a_ld = (tile_need + 31) / 32 * 32;
          pairs_exp_probabilities(st, ld, tile_need, rows, (rows + 31) / 32 * 32, shift, !full,
                                  begin, end, j0, sums, pb, a_ld, [&] { queue.step(); });
          queue.drain();
          for (Index c = 0; c < rows; c += W) {
            V::store(l + c, V::fmadd(V::load(l + c), V::load(corr + c), V::load(sums + c)));
          }
          exps_packed = true;
        }
      }
    }
    if (packed) {  // W / 4 keys per vector; each row's sum over its lanes in lane order
      for (Index t = 0; t < W; ++t) lanes[t] = shift[t % 4];
      const auto sh = V::load(lanes);
      auto sum = V::zero();
      for (Index i = 0; i < packed_end; i += W) {
        const auto e = vexp_nonpositive<V>(V::sub(V::load(st + i), sh));
        V::store(st + i, e);
        sum = V::add(sum, e);
      }
      V::store(lanes, sum);
      for (Index t = 4; t < W; ++t) lanes[t % 4] += lanes[t];
      for (Index t = 4; t < W; ++t) lanes[t] = Scalar(0);
      V::store(l, V::fmadd(V::load(l), V::load(corr), V::load(lanes)));
    }
    // The k-pair paths exponentiate with pairs_exp_shifted() here too (dropout, a V tile that
    // is not finite), so that P does not depend on which pass made it.
    const auto exp_shifted = [&](auto x) {
      if constexpr (kPairs) {
        if (pairs) return pairs_exp_shifted(x);
      }
      return vexp_nonpositive<V>(x);
    };
    for (Index c = 0; c < (exps_packed || packed ? 0 : rows); c += W) {
      const Index n = std::min(W, rows - c);
      const auto sh = V::load(shift + c);
      auto sum = V::zero();
      if (n == W) {
        for (Index j = 0; j < width; ++j) {
          Scalar* x = st + j * ld + c;
          const auto e = exp_shifted(V::sub(V::load(x), sh));
          V::store(x, e);
          sum = V::add(sum, e);
        }
      } else {
        for (Index j = 0; j < width; ++j) {
          Scalar* x = st + j * ld + c;
          const auto e = exp_shifted(V::sub(V::load_partial(x, n), sh));
          V::store_partial(x, e, n);
          sum = V::add(sum, e);
        }
      }
      V::store(l + c, V::fmadd(V::load(l + c), V::load(corr + c), sum));
    }
    for (Index r = 0; r < rows; ++r) {
      if (corr[r] != Scalar(1)) scale_row(acc + r * dv, dv, corr[r]);
    }
    if (drops[0].active) {
      for (Index r = 0; r < rows; ++r) {
        const DropoutStream& drop = drops[r / nq];
        const std::uint64_t key = drop.row_key(i0 + r % nq);
        for (Index j = 0; j < width; ++j) {
          if (!DropoutStream::keep(key, j0 + j, drop.threshold)) st[j * ld + r] = Scalar(0);
        }
      }
    }
    // pass 5: acc (rows, d_v) += p (rows, width) v[j0:j0+width]; p is read transposed out
    // of p^T, and each group of rows stops at its last visible key. Value rows that are
    // not finite enter only for the rows that see them (see clean_values()).
    // int8 and int4 values (float operands): widened in registers where the set can
    // (stored_int8_values(), stored_int4_values(); the weights of keys a row does not see are
    // 0, and integer rows are finite), else dequantised into v_load.
    if constexpr (std::is_same_v<Scalar, float> && !kReduced) {
      if (stored && p.stored.v.element == KVElement::kInt8 &&
          stored_int8_values(p.stored.v, task.b, task.kv_head, slot, tile_need, dv, st, ld, rows,
                             acc)) {
        continue;
      }
      if (stored && p.stored.v.element == KVElement::kInt4 &&
          stored_int4_values(p.stored.v, task.b, task.kv_head, slot, tile_need, dv, st, ld, rows,
                             acc)) {
        continue;
      }
      // 16-bit values: widened in registers where the set can and the tile's rows are finite.
      if (half_rows && (p.stored.v.element == KVElement::kBFloat16
                            ? stored_half_values<bfloat16>(p.stored.v, task.b, task.kv_head, slot,
                                                           tile_need, dv, st, ld, rows, acc)
                            : stored_half_values<float16>(p.stored.v, task.b, task.kv_head, slot,
                                                          tile_need, dv, st, ld, rows, acc))) {
        continue;
      }
    }
    // Value rows that may hold a NaN or an infinity: with few rows (a decode step's), checked
    // after the product on the accumulators it changed (rows x d_v) rather than scanned before
    // it (tile_need x d_v rows; the scan was 13 % of a float decode step at B 8 L 8192 on Zen 5).
    // A value that is not finite, times any weight, leaves its element of acc not finite, and
    // adding keeps it so: acc finite after the product means no row took a product with such
    // a value, and the product was the scanned path's, bit for bit. Otherwise acc is put back
    // (from `clean`, which the scanned path overwrites only after) and the tile is scanned;
    // once per tile (a paged tile that failed it goes on to the copied rows unchecked).
    bool tried_after = false;
    const auto checked_after = [&](bool may_be_dirty, auto&& product) {
      if (!may_be_dirty || tried_after || 4 * rows > tile_need) return false;
      tried_after = true;
      std::copy(acc, acc + rows * dv, clean);
      product();
      if (rows_finite(acc, dv, rows, dv)) return true;
      std::copy(clean, clean + rows * dv, acc);
      return false;
    };
    // Paged Scalar values: read in place from their blocks, one address per row, in the
    // micro-kernel's order over the rows (so the bits of a contiguous cache); a tile holding a
    // row that is not finite is copied and cleaned below instead.
    if constexpr (!kReduced) {
      if (stored && p.stored.v.element == KVElement::kScalar && tile_need > 0) {
        const Scalar* vrow[kKeyBlock];
        stored_runs(p.stored.v, task.b, task.kv_head, slot, tile_need,
                    [&](const unsigned char* row, const float*, Index r0, Index run) {
                      const auto* first = reinterpret_cast<const Scalar*>(row);
                      const Index rs = p.stored.v.row_stride / Index(sizeof(Scalar));
                      for (Index j = 0; j < run; ++j) vrow[r0 + j] = first + j * rs;
                    });
        const auto product_in_place = [&] {
          for (Index r0 = 0; r0 < rows; r0 += kMicroRows) {
            const Index group = std::min<Index>(kMicroRows, rows - r0);
            const Index need = need_of(r0, r0 + group);
            if (need > 0) {
              micro_gemm_gathered<Scalar>(group, dv, need, st + r0, 1, ld, vrow, acc + r0 * dv, dv,
                                          Scalar(1), true);
            }
          }
        };
        if (checked_after(true, product_in_place)) continue;
        bool finite = true;
        stored_runs(p.stored.v, task.b, task.kv_head, slot, tile_need,
                    [&](const unsigned char* row, const float*, Index, Index run) {
                      const Index rs = p.stored.v.row_stride / Index(sizeof(Scalar));
                      finite =
                          finite && rows_finite(reinterpret_cast<const Scalar*>(row), rs, run, dv);
                    });
        if (finite) {
          product_in_place();
          continue;
        }
      }
    }
    if (stored) load_stored_rows(p.stored.v, task.b, task.kv_head, slot, tile_need, dv, v_load);
    const Scalar* vt = nullptr;
    Index vt_rs = v_rs;
    if constexpr (kReduced) {
      // A decode step's few rows: P rounded to Operand as its weights are taken, the V rows
      // widened in registers (half_values_part()), where the set can and they are finite.
      if (half_rows) {
        const Operand* vrow[kKeyBlock];
        for (Index j = 0; j < tile_need; ++j) vrow[j] = v_tile + j * v_rs;
        if (tile_need == 0) continue;
        if constexpr (kPairs) {
          if (dot_rows_bf16 && dot_rows_values(vrow, tile_need, dv, st, ld, rows, acc)) continue;
        }
        if (half_values_part(vrow, tile_need, dv, st, ld, rows, true, acc)) continue;
      }
      // pass 5a (storage types): P rounded to Operand (in place, as floats, when widening).
      // AMX and vdpbf16ps: P (rows, need) transposed out of p^T and rounded into pb, rows
      // to a multiple of 32 and keys to one of 32 (a_ld) with +0; V's rows in k-pairs.
      bool dirty = false;
      if constexpr (kPairs) {
        const Index a_ld = (tile_need + 31) / 32 * 32;  // AMX's whole tiles (amx_depth())
        dirty = v_packed ? v_dirty : tile_need > 0 && pairs && pack_values(tile_need);
        if (pairs && !dirty && tile_need > 0) {
          if (!exps_packed) {
            pack_probabilities(st, ld, tile_need, rows, (rows + 31) / 32 * 32, pb, a_ld);
          }
          if (vpairs == vp) {
            std::fill(vp + (tile_need + 1) / 2 * dv,
                      vp + gemm_words(Bf16Path::kAmx, tile_need) * dv, 0.0f);
          }
          // pass 5b: acc += P V on whole AMX tiles when d_v is a multiple of 16 (acc has
          // room for rows to a multiple of 16; P's rows past `rows` are +0), else 32 rows x
          // 128 columns per amx_block(); or kMicroRows rows up to their last visible key x
          // micro_cols() per vdpbf16ps micro-tile.
          const bool whole = amx && dv % 16 == 0;
          if (whole && pipelined) {  // issued during the next tile's pass 3
            queue.push((rows + 15) / 16, dv / 16, a_ld / 32, pb, a_ld, vpairs, dv, acc, dv, true);
          } else if (whole) {
            amx_tiles((rows + 15) / 16, dv / 16, a_ld / 32, pb, a_ld, vpairs, dv, acc, dv, true);
          }
          const GemmOutput<float> out = GemmOutput<float>::row_major(acc, dv);
          for (Index r0 = 0; r0 < (amx && !whole ? rows : 0); r0 += 32) {
            for (Index c0 = 0; c0 < dv; c0 += 128) {
              amx_block(std::min<Index>(32, rows - r0), tile_need, pb + r0 * a_ld, vpairs + c0, dv,
                        std::min<Index>(128, dv - c0), out, r0, c0, true, nullptr);
            }
          }
          float* crow[kMicroRows];
          for (Index r0 = 0; r0 < (amx ? 0 : rows); r0 += kMicroRows) {
            const Index group = std::min<Index>(kMicroRows, rows - r0);
            const Index need = need_of(r0, r0 + group);
            for (Index c0 = 0; c0 < (need > 0 ? dv : 0); c0 += col_group) {
              for (Index r = 0; r < group; ++r) crow[r] = acc + (r0 + r) * dv + c0;
              bf16_dot_tile_rows(group, need, pb + r0 * a_ld, a_ld, vpairs + c0, dv, crow,
                                 std::min(col_group, dv - c0), true, nullptr);
            }
          }
          continue;
        }
      }
      static_cast<void>(dirty);
      static_cast<void>(v_packed), static_cast<void>(v_dirty);
      // Widened: P rounded in place, the V tile (need, d_v) widened into vw.
      Operand* rounded = reinterpret_cast<Operand*>(vw);
      for (Index j = 0; j < width; ++j) {
        convert_row(st + j * ld, rounded, rows);
        convert_row(rounded, st + j * ld, rows);
      }
      for (Index j = 0; j < tile_need; ++j) convert_row(v_tile + j * v_rs, vw + j * dv, dv);
      vt = vw, vt_rs = dv;
    } else {
      vt = v_tile;
    }
    const Scalar* vc = vt;
    Index vc_rs = vt_rs;
    // (A whole tile the call's flags say holds no NaN and no infinity is not scanned again.)
    bool flagged_finite = false;
    if constexpr (!kReduced) {
      const Index t = prepared_tile();
      flagged_finite = t >= 0 && p.value_pairs_dirty[t] == 0;
    }
    const bool may_be_dirty =
        !flagged_finite && (!stored || stored_may_be_nonfinite(p.stored.v.element));
    const auto product = [&] {
      for (Index r0 = 0; r0 < rows; r0 += kMicroRows) {
        const Index group = std::min<Index>(kMicroRows, rows - r0);
        const Index need = need_of(r0, r0 + group);
        if (need > 0) {
          micro_gemm<Scalar>(group, dv, need, st + r0, 1, ld, vc, vc_rs, acc + r0 * dv, dv,
                             Scalar(1), true, nullptr);
        }
      }
    };
    if (checked_after(may_be_dirty, product)) continue;
    const bool dirty = may_be_dirty && clean_values(vt, vt_rs, tile_need, dv, clean);
    if (dirty) vc = clean, vc_rs = dv;
    product();
    if (dirty) {
      add_nonfinite_values(rows, tile_need, dv, st, 1, ld, vt, vt_rs, clean, acc, dv,
                           [&](Index r, Index j) {
                             return j0 + j >= begin[r] && j0 + j < end[r] &&
                                    !masks[r / nq].hides(i0 + r % nq, j0 + j);
                           });
    }
  }
  if constexpr (kPairs) queue.drain();
  // pass 6: normalise into out. A row its masks hide every key from stays zero; the others
  // divide by l, IEEE (l = 0 when every visible score was -inf: 0/0 = NaN, as in PyTorch).
  // A task over one chunk of the keys leaves (m, l, seen, acc) for merge_partials().
  const double keep = 1.0 - (drops[0].active ? p.dropout : 0.0);
  for (Index r = 0; r < rows; ++r) {
    const bool any = elementwise ? seen[r] != Scalar(0) : end[r] > begin[r];
    if (task.partial != nullptr) {
      Scalar* row = task.partial + r * partial_row_size(dv);
      row[0] = m[r], row[1] = l[r], row[2] = any ? Scalar(1) : Scalar(0);
      std::copy(acc + r * dv, acc + (r + 1) * dv, row + kPartialExtra);
      continue;
    }
    Operand* out = p.out.data() + task.b * p.out.stride(0) + (task.h0 + r / nq) * p.out.stride(1) +
                   (i0 + r % nq) * p.out.stride(2);
    Scalar* o = nullptr;  // the float row; storage types: rounded into out after
    if constexpr (kReduced) {
      o = clean;
    } else {
      o = out;
    }
    if (any && p.sinks != nullptr) {  // the sink joins the denominator
      const Index h = task.h0 + r / nq;
      const SinkShare share = sink_share(m[r], l[r], p.sinks[h]);
      const Scalar inv = static_cast<Scalar>(share.scale / keep);
      for (Index e = 0; e < dv; ++e) o[e] = acc[r * dv + e] * inv;
      if (p.lse.data() != nullptr) {
        p.lse.data()[task.b * p.lse.stride(0) + h * p.lse.stride(1) +
                     (i0 + r % nq) * p.lse.stride(2)] = static_cast<Scalar>(share.lse);
      }
    } else {
      if (any) {
        const Scalar inv = static_cast<Scalar>(1.0 / (static_cast<double>(l[r]) * keep));
        for (Index e = 0; e < dv; ++e) o[e] = acc[r * dv + e] * inv;
      } else {
        std::fill(o, o + dv, Scalar(0));
      }
      if (p.lse.data() != nullptr) {
        write_lse(p, task.b, task.h0 + r / nq, i0 + r % nq, m[r], l[r], any);
      }
    }
    if constexpr (kReduced) convert_row(o, out, dv);
  }
  if constexpr (kPairs) {
    if (amx) amx_release(task);
  }
}
