// SPDX-License-Identifier: MIT
// attn/kernels/generic/key_chunks.inl: the merge of a split-keys attention call (decoding:
// streaming_tile over 512-key chunks, each leaving a partial softmax state per row), in
// chunk order so the result does not depend on the thread count. Written once over a set's
// Vec, like attention.inl.

/// Combines the partial states of one row over `chunks` key chunks (chunk c's at
/// partial + c * stride, in chunk order) into its output o (d_v), as streaming_tile's pass 6
/// would have: out = sum_c acc_c e^(m_c - M) / (keep sum_c l_c e^(m_c - M)), M the largest m_c.
/// A sink logit (-inf: none) joins the denominator once, as e^(sink - M) (with M the larger
/// of the chunks' maxima and the sink).
template <class Scalar>
void merge_partials(const Scalar* partial, Index chunks, Index stride, Index dv, double keep,
                    Scalar* o, Scalar sink) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const Scalar lowest = std::numeric_limits<Scalar>::lowest();
  Scalar top = -std::numeric_limits<Scalar>::infinity(), l = 0;
  bool any = false;
  for (Index c = 0; c < chunks; ++c) {
    top = std::max(top, partial[c * stride]);
    any = any || partial[c * stride + 2] != Scalar(0);
  }
  if (!any) {
    std::fill(o, o + dv, Scalar(0));
    return;
  }
  if (sink != -std::numeric_limits<Scalar>::infinity()) top = std::max(top, sink);
  const auto shift = V::set1(std::max(top, lowest));
  std::fill(o, o + dv, Scalar(0));
  for (Index c = 0; c < chunks; ++c) {
    const Scalar* row = partial + c * stride;
    const auto factor = vexp<V>(V::sub(V::set1(std::max(row[0], lowest)), shift));
    l = V::reduce_max(V::fmadd(V::set1(row[1]), factor, V::set1(l)));
    const Scalar* a = row + kPartialExtra;
    Index e = 0;
    for (; e + W <= dv; e += W) V::store(o + e, V::fmadd(V::load(a + e), factor, V::load(o + e)));
    if (e < dv) {
      V::store_partial(
          o + e, V::fmadd(V::load_partial(a + e, dv - e), factor, V::load_partial(o + e, dv - e)),
          dv - e);
    }
  }
  if (sink != -std::numeric_limits<Scalar>::infinity()) {
    l += V::reduce_max(vexp<V>(V::sub(V::set1(sink), shift)));
  }
  const Scalar inv = static_cast<Scalar>(1.0 / (static_cast<double>(l) * keep));
  for (Index e = 0; e < dv; ++e) o[e] *= inv;
}
