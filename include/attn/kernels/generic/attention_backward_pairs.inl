// SPDX-License-Identifier: MIT
// attn/kernels/generic/attention_backward_pairs.inl: the bfloat16 products of the attention
// backward (a bfloat16 module's backward), included by generic/all.inl before
// generic/attention_backward.inl, whose tasks call them.
//
// With p.path kAmx or kDot on float operands (the avx512 set; the caller's Q, K, V, O and dO
// hold bfloat16 values widened), the five products of a block, S^T = K Q^T, dA^T = V dO^T,
// dV += A^T dO, dK += dS^T Q and dQ += dS K, take bfloat16 operands with float sums, on AMX
// tiles (amx_tiles()) or vdpbf16ps micro-tiles (bf16_dot_tile_rows()), as the forward's
// products do: A and dS are rounded to bfloat16 (nearest even) before they multiply, as
// FlashAttention and PyTorch's CPU kernels round them; the softmax, D and dS = P (dP - D)
// stay float. The scale multiplies S^T after its product and dK, dQ once at the end (one
// rounding each). AMX needs d and d_v multiples of 16 (whole C tiles); other shapes, other
// sets and kWiden run the float products. The functions below use the avx512 set's kernels:
// the tasks call them only under with_backward_pairs()'s std::true_type, which no other set
// and no other Scalar instantiates.

/// Whether this set compiles the bfloat16 products for Scalar.
template <class Scalar>
inline constexpr bool kBackwardPairs = kSetIsa == Isa::kAvx512&& std::is_same_v<Scalar, float>;

/// Whether this call's backward takes bfloat16 products (see above).
template <class Scalar>
bool backward_pairs_active(const AttentionBackwardArgs<Scalar>& p) noexcept {
  if constexpr (kBackwardPairs<Scalar>) {
    if (p.path == Bf16Path::kDot) return true;
    return p.path == Bf16Path::kAmx && p.q.extent(3) % 16 == 0 && p.v.extent(3) % 16 == 0;
  } else {
    return false;
  }
}

/// f(std::true_type()) when this call's backward takes bfloat16 products
/// (backward_pairs_active()), else f(std::false_type()): a task written once over both, with
/// `if constexpr` on the constant where they differ.
template <class Scalar, class F>
void with_backward_pairs(const AttentionBackwardArgs<Scalar>& p, F&& f) noexcept {
  if constexpr (kBackwardPairs<Scalar>) {
    if (backward_pairs_active(p)) return f(std::true_type());
  }
  f(std::false_type());
}

/// A task's bfloat16 operands (pair_backward_scratch_size(), past the float scratch): the
/// query tile's Q and dO rounded (qb, gb: (rows, d) and (rows, d_v)), as k-pairs along d and
/// d_v (qp, gp: Q^T and dO^T, the B of S^T and dA^T; words to whole AMX tiles, kQueryBlock
/// columns, +0 past the rows) and along the rows (qr, gr: the B of dK and dV; words to 32,
/// +0 past the rows); a K and a V tile rounded into whole tiles (ka, va: rows to a multiple of
/// 16, row strides lk = d and lv = d_v rounded up to 32, +0 padded) unless they are read in
/// place (p.narrow: the dot product always, AMX when d, d_v are multiples of 32 and the tile's
/// keys of 16), K along its rows (kr: the B of dQ, its non-finite values +0); A^T and dS^T rounded
/// (at_b, ds_b: (keys, kQueryBlock)), or dS (ds_b: (rows, keys rounded up to 32)).
template <class Scalar>
struct BackwardPairs {
  bool amx = false;
  bool rounded = false;  // backward_block() rounds A^T and dS^T into at_b and ds_b
  Index lk = 0, lv = 0;
  // The key tile's K and V as the products read them: in place (p.narrow) or ka, va.
  const bfloat16 *k_tile = nullptr, *v_tile = nullptr;
  Index k_ld = 0, v_ld = 0;
  bfloat16 *qb = nullptr, *gb = nullptr, *ka = nullptr, *va = nullptr;
  bfloat16 *at_b = nullptr, *ds_b = nullptr;
  Scalar *qp = nullptr, *gp = nullptr, *qr = nullptr, *gr = nullptr, *kr = nullptr;
};

/// The bfloat16 operands' places in `scratch` (stream_backward_scratch_size() floats in).
template <class Scalar>
BackwardPairs<Scalar> backward_pairs(const AttentionBackwardArgs<Scalar>& p,
                                     Scalar* scratch) noexcept {
  const Index d = p.q.extent(3), dv = p.v.extent(3);
  BackwardPairs<Scalar> bp;
  bp.amx = p.path == Bf16Path::kAmx;
  bp.lk = (d + 31) / 32 * 32, bp.lv = (dv + 31) / 32 * 32;
  Scalar* cursor = scratch + stream_backward_scratch_size(d, dv);
  const auto take = [&](Index floats) {  // 64-byte aligned parts
    const auto at = reinterpret_cast<std::uintptr_t>(cursor);
    Scalar* part = reinterpret_cast<Scalar*>((at + 63) / 64 * 64);
    cursor = part + floats;
    return part;
  };
  bp.qb = reinterpret_cast<bfloat16*>(take(kQueryBlock * d / 2 + 1));
  bp.gb = reinterpret_cast<bfloat16*>(take(kQueryBlock * dv / 2 + 1));
  bp.qp = take(bp.lk / 2 * kQueryBlock);
  bp.gp = take(bp.lv / 2 * kQueryBlock);
  bp.qr = take(kQueryBlock / 2 * d);
  bp.gr = take(kQueryBlock / 2 * dv);
  bp.ka = reinterpret_cast<bfloat16*>(take(kKeyBlock * bp.lk / 2));
  bp.va = reinterpret_cast<bfloat16*>(take(kKeyBlock * bp.lv / 2));
  bp.kr = take(kKeyBlock / 2 * d);
  bp.at_b = reinterpret_cast<bfloat16*>(take(kKeyBlock * kQueryBlock / 2));
  bp.ds_b = reinterpret_cast<bfloat16*>(take(kKeyBlock * kQueryBlock / 2));
  return bp;
}

/// Loads (`on`) or releases (not `on`) the tile configuration of a task whose bfloat16
/// products run on AMX.
template <class Scalar>
void pair_tiles(const BackwardPairs<Scalar>& bp, bool on) noexcept {
  if (!bp.amx) return;
  if (on) {
    amx_configure(bp);
  } else {
    amx_release(bp);
  }
}

/// Rows [0, n) x columns [0, cols) of a float matrix (row stride ldx) rounded to bfloat16
/// into out (row stride ldo): +0 in columns [cols, ldo) and in rows [n, padded).
/// (x bfloat16: copied).
template <class From>
void pair_round_rows(const From* x, Index ldx, Index n, Index cols, Index padded, bfloat16* out,
                     Index ldo) noexcept {
  for (Index r = 0; r < n; ++r) {
    if constexpr (std::is_same_v<From, bfloat16>) {
      std::copy(x + r * ldx, x + r * ldx + cols, out + r * ldo);
    } else {
      convert_row(x + r * ldx, out + r * ldo, cols);
    }
    std::fill(out + r * ldo + cols, out + (r + 1) * ldo, bfloat16::from_bits(0));
  }
  std::fill(out + n * ldo, out + padded * ldo, bfloat16::from_bits(0));
}

/// C (rows x cols, row stride ldc) = (accumulate ? C : 0) + A B on bfloat16 operands with
/// float sums: A `rows` rows of `a` (row stride lda, `depth` deep), B k-pair words (row
/// stride ldb). AMX (tiles configured): whole tiles, so cols a multiple of 16, A's rows to a
/// multiple of 16 and both operands' depth to one of 32 +0 padded, and C room for the rows
/// rounded up to 16; else vdpbf16ps micro-tiles of kMicroRows rows x micro_cols().
template <class Scalar>
void pair_gemm(bool amx, Index rows, Index cols, Index depth, const bfloat16* a, Index lda,
               const Scalar* b, Index ldb, Scalar* c, Index ldc, bool accumulate) noexcept {
  if (amx) {
    amx_tiles((rows + 15) / 16, cols / 16, (depth + 31) / 32, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  const Index col_group = micro_cols<Scalar>();
  Scalar* crow[kMicroRows];
  for (Index r0 = 0; r0 < rows; r0 += kMicroRows) {
    const Index group = std::min<Index>(kMicroRows, rows - r0);
    for (Index c0 = 0; c0 < cols; c0 += col_group) {
      for (Index r = 0; r < group; ++r) crow[r] = c + (r0 + r) * ldc + c0;
      bf16_dot_tile_rows(group, depth, a + r0 * lda, lda, b + c0, ldb, crow,
                         std::min(col_group, cols - c0), accumulate, nullptr);
    }
  }
}

/// The query tile's bfloat16 operands (BackwardPairs qb, gb, qp, gp, qr, gr): rows [i0, i0 +
/// rows) of Q and dO of head (b, h).
template <class Scalar>
void pair_query_tile(const AttentionBackwardArgs<Scalar>& p, const BackwardPairs<Scalar>& bp,
                     Index b, Index h, Index i0, Index rows) noexcept {
  const Index d = p.q.extent(3), dv = p.v.extent(3);
  const Scalar* q = p.q.data() + b * p.q.stride(0) + h * p.q.stride(1) + i0 * p.q.stride(2);
  const Scalar* go = p.grad_out.data() + b * p.grad_out.stride(0) + h * p.grad_out.stride(1) +
                     i0 * p.grad_out.stride(2);
  const bfloat16* qn = bp.qb;  // Q's rows in bfloat16: in place, or rounded into qb
  Index q_ld = d;
  if (p.narrow.q.data() != nullptr) {
    const auto& n = p.narrow.q;
    qn = n.data() + b * n.stride(0) + h * n.stride(1) + i0 * n.stride(2), q_ld = n.stride(2);
  } else {
    pair_round_rows(q, p.q.stride(2), rows, d, rows, bp.qb, d);
  }
  pair_round_rows(go, p.grad_out.stride(2), rows, dv, rows, bp.gb, dv);
  std::fill(bp.qp, bp.qp + bp.lk / 2 * kQueryBlock, Scalar(0));
  std::fill(bp.gp, bp.gp + bp.lv / 2 * kQueryBlock, Scalar(0));
  pack_pairs(qn, q_ld, 0, rows, 0, d, bp.qp, kQueryBlock);
  pack_pairs(bp.gb, dv, 0, rows, 0, dv, bp.gp, kQueryBlock);
  pack_row_pairs(qn, q_ld, rows, d, bp.qr, d);
  pack_row_pairs(bp.gb, dv, rows, dv, bp.gr, dv);
  const Index words = (rows + 1) / 2;
  std::fill(bp.qr + words * d, bp.qr + kQueryBlock / 2 * d, Scalar(0));
  std::fill(bp.gr + words * dv, bp.gr + kQueryBlock / 2 * dv, Scalar(0));
}

/// A key tile's bfloat16 operands (BackwardPairs ka, va and, with `k_pairs`, kr): keys [j0,
/// j0 + width) of K and V of key/value head (b, kvh).
template <class Scalar>
void pair_key_tile(const AttentionBackwardArgs<Scalar>& p, BackwardPairs<Scalar>& bp, Index b,
                   Index kvh, Index j0, Index width, bool k_pairs) noexcept {
  const Index d = p.q.extent(3), dv = p.v.extent(3), padded = (width + 15) / 16 * 16;
  // One operand: in place when its tiles stay inside the keys and the depth, else copied
  // (bfloat16) or rounded (float) into whole tiles.
  const auto operand = [&](const TensorView<const Scalar, 4>& wide,
                           const TensorView<const bfloat16, 4>& narrow, Index cols, bfloat16* tiles,
                           Index ld, const bfloat16*& tile, Index& tile_ld) {
    if (narrow.data() != nullptr) {
      const bfloat16* x =
          narrow.data() + b * narrow.stride(0) + kvh * narrow.stride(1) + j0 * narrow.stride(2);
      if (!bp.amx || (cols % 32 == 0 && width % 16 == 0)) {
        tile = x, tile_ld = narrow.stride(2);
        return;
      }
      pair_round_rows(x, narrow.stride(2), width, cols, padded, tiles, ld);
    } else {
      const Scalar* x =
          wide.data() + b * wide.stride(0) + kvh * wide.stride(1) + j0 * wide.stride(2);
      pair_round_rows(x, wide.stride(2), width, cols, padded, tiles, ld);
    }
    tile = tiles, tile_ld = ld;
  };
  operand(p.k, p.narrow.k, d, bp.ka, bp.lk, bp.k_tile, bp.k_ld);
  operand(p.v, p.narrow.v, dv, bp.va, bp.lv, bp.v_tile, bp.v_ld);
  if (k_pairs) {
    pack_row_pairs(bp.k_tile, bp.k_ld, width, d, bp.kr, d);
    std::fill(bp.kr + (width + 1) / 2 * d, bp.kr + (width + 31) / 32 * 16 * d, Scalar(0));
    // dQ += dS K covers every key of the tile, so a non-finite key that a query cannot see
    // (dS = 0) would reach it as 0 * NaN: such entries of K are +0 here. A query that sees
    // one has dS NaN there already, or 0 (a score of -inf, or a softcap saturated): the
    // key takes no weight and passes no gradient.
    zero_nonfinite_pairs(bp.kr, (width + 1) / 2 * d);
  }
}
