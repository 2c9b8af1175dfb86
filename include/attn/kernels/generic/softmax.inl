// SPDX-License-Identifier: MIT
// attn/kernels/generic/softmax.inl: row operations of both softmax forms, written once over
// a set's Vec: the two-pass softmax of a whole row (nn::softmax_, the materialised kernel)
// and the rescaling the streaming kernel's online softmax applies.

/// In-place softmax of a contiguous row of n values: the max, exp and sum over whole vectors
/// and a partial one for the tail. Subtracts the row max, so logits of 1e4 do not overflow.
/// -inf entries get weight 0. A row with no entry above -inf (or n == 0) becomes all zeros
/// when `all_minus_inf_is_masked` (nn::softmax_: -inf marks masked entries), else NaN as
/// IEEE gives (the attention kernels: their masks are tracked apart from the scores, so such
/// a row's -inf came from the data). NaN anywhere gives NaN everywhere, as in PyTorch.
/// Returns the sum of the exponentials (0 for a row made zeros).
template <class Scalar>
Scalar softmax_row(Scalar* row, Index n, bool all_minus_inf_is_masked = true) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  constexpr Scalar kNegInf = -std::numeric_limits<Scalar>::infinity();
  const Index full = n / W * W, tail = n - full;
  auto vmax = V::set1(kNegInf);
  for (Index j = 0; j < full; j += W) vmax = V::max(vmax, V::load(row + j));
  // The tail's missing lanes read as 0: mask them to -inf so they cannot raise the max.
  if (tail > 0) {
    const auto lanes = V::load_partial(row + full, tail);
    alignas(64) Scalar fill[W];
    for (Index j = 0; j < W; ++j) fill[j] = j < tail ? Scalar(0) : kNegInf;
    vmax = V::max(vmax, V::add(lanes, V::load(fill)));
  }
  const Scalar row_max = V::reduce_max(vmax);
  if (row_max == kNegInf && all_minus_inf_is_masked) {
    // Entirely masked, unless a NaN hid from the max (max() keeps its second operand when
    // either is NaN): NaN in, NaN out.
    const bool has_nan = std::any_of(row, row + n, [](Scalar x) { return x != x; });
    std::fill(row, row + n, has_nan ? std::numeric_limits<Scalar>::quiet_NaN() : Scalar(0));
    return has_nan ? std::numeric_limits<Scalar>::quiet_NaN() : Scalar(0);
  }
  // row_max may be NaN (a NaN entry) or -inf: exp(x - NaN) and exp(-inf - -inf) are NaN.
  const auto shift = V::set1(row_max);
  auto vsum = V::zero();
  for (Index j = 0; j < full; j += W) {
    const auto e = vexp<V>(V::sub(V::load(row + j), shift));
    V::store(row + j, e);
    vsum = V::add(vsum, e);
  }
  if (tail > 0) {
    const auto e = vexp<V>(V::sub(V::load_partial(row + full, tail), shift));
    V::store_partial(row + full, e, tail);
    alignas(64) Scalar lanes[W];
    V::store(lanes, e);
    for (Index j = tail; j < W; ++j) lanes[j] = Scalar(0);
    vsum = V::add(vsum, V::load(lanes));
  }
  const Scalar sum = V::reduce_add(vsum);
  const auto vinv = V::set1(Scalar(1) / sum);
  for (Index j = 0; j < full; j += W) V::store(row + j, V::mul(V::load(row + j), vinv));
  if (tail > 0) {
    V::store_partial(row + full, V::mul(V::load_partial(row + full, tail), vinv), tail);
  }
  return sum;
}

/// x[j] *= factor for j < n.
template <class Scalar>
inline void scale_row(Scalar* x, Index n, Scalar factor) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const auto f = V::set1(factor);
  Index j = 0;
  for (; j + W <= n; j += W) V::store(x + j, V::mul(V::load(x + j), f));
  for (; j < n; ++j) x[j] *= factor;
}
