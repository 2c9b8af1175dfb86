// SPDX-License-Identifier: MIT
// attn/kernels/generic/variants.inl: what the attention variants add to a block of scores,
// written once over a set's Vec: the softcap C tanh(s / C) (and its derivative), ALiBi's
// -m |i + position - j|, and a learned sink's share of a row's softmax. Each runs only when
// its variant is on (AttentionArgs), so the plain kernels pay one branch per tile.
// docs/variants.md has the formulas.

// ---- tanh ----
//
// float: Cephes' tanhf, an odd polynomial of degree 11 for |x| < 0.625 (about 1 ulp), else
// 1 - 2 / (exp(2|x|) + 1) with x's sign. double: Cephes' tanh, x + x z P(z) / Q(z) (z = x^2,
// a (2, 3) rational) for |x| < 0.625, else the same exp form. Edges: tanh(+-inf) = +-1 (exp
// overflows to inf, 2 / inf = 0), NaN -> NaN.

template <class V, std::enable_if_t<std::is_same_v<typename V::Scalar, float>, int> = 0>
inline typename V::Reg tanh_small(typename V::Reg x) noexcept {
  const auto z = V::mul(x, x);
  auto p = V::set1(-5.70498872745e-3f);
  p = V::fmadd(p, z, V::set1(2.06390887954e-2f));
  p = V::fmadd(p, z, V::set1(-5.37397155531e-2f));
  p = V::fmadd(p, z, V::set1(1.33314422036e-1f));
  p = V::fmadd(p, z, V::set1(-3.33332819422e-1f));
  return V::fmadd(V::mul(p, z), x, x);
}

template <class V, std::enable_if_t<std::is_same_v<typename V::Scalar, double>, int> = 0>
inline typename V::Reg tanh_small(typename V::Reg x) noexcept {
  const auto z = V::mul(x, x);
  auto p = V::set1(-9.64399179425052238628e-1);
  p = V::fmadd(p, z, V::set1(-9.92877231001918586564e1));
  p = V::fmadd(p, z, V::set1(-1.61468768441708447952e3));
  auto q = V::add(z, V::set1(1.12811678491632931402e2));
  q = V::fmadd(q, z, V::set1(2.23548839060100448583e3));
  q = V::fmadd(q, z, V::set1(4.84406305325125486048e3));
  return V::fmadd(V::mul(x, z), V::div(p, q), x);
}

/// tanh of every lane (see above). When every lane is below 0.625 (softcapped scores mostly
/// are: |s| < 0.625 softcap), the polynomial alone, without the exp form's exp and division:
/// softcap cost 1.20-1.30x the plain streaming kernel with both computed for every lane (B8
/// T512 H8 hd 64, AVX-512), about 1.1x with this (docs/benchmarks.md#attention-variants). A
/// NaN lane fails the test (and gives NaN on the exp form's branch).
template <class V>
inline typename V::Reg vtanh(typename V::Reg x) noexcept {
  using S = typename V::Scalar;
  const auto zero = V::zero(), one = V::set1(S(1));
  const auto ax = V::max(x, V::sub(zero, x));
  const auto small = V::less(ax, V::set1(S(0.625)));
  if (V::all(small)) return tanh_small<V>(x);
  const auto e = vexp<V>(V::add(ax, ax));
  auto big = V::sub(one, V::div(V::set1(S(2)), V::add(e, one)));
  big = V::select(V::less(x, zero), V::sub(zero, big), big);
  return V::select(small, tanh_small<V>(x), big);
}

/// x[o * ld + e] = cap * tanh(x[o * ld + e] / cap) for o < outer, e < inner; with `deriv`
/// (same layout) also its derivative 1 - tanh^2 there, what the backward multiplies by.
template <class Scalar>
void softcap_block(Scalar* x, Index outer, Index inner, Index ld, Scalar cap,
                   Scalar* deriv = nullptr) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const auto c = V::set1(cap), inv = V::set1(Scalar(1) / cap), one = V::set1(Scalar(1));
  for (Index o = 0; o < outer; ++o) {
    Scalar* row = x + o * ld;
    for (Index e = 0; e < inner; e += W) {
      const Index n = std::min(W, inner - e);
      const auto t = vtanh<V>(V::mul(n == W ? V::load(row + e) : V::load_partial(row + e, n), inv));
      const auto y = V::mul(c, t);
      if (n == W) {
        V::store(row + e, y);
      } else {
        V::store_partial(row + e, y, n);
      }
      if (deriv != nullptr) {
        const auto g = V::fnmadd(t, t, one);
        if (n == W) {
          V::store(deriv + o * ld + e, g);
        } else {
          V::store_partial(deriv + o * ld + e, g, n);
        }
      }
    }
  }
}

/// ALiBi on a transposed block s^T (keys x rows, row stride ld): s^T[j][r] -= slope[r] *
/// |pos[r] - (j0 + j)| for j < width, r < rows. pos[r] is row r's key position (query index
/// plus HeadMask::position) and slope[r] its head's slope, kQueryBlock entries each (the
/// lanes past `rows` are read, not used).
template <class Scalar>
void alibi_block_t(Scalar* st, Index width, Index rows, Index ld, Index j0, const Scalar* pos,
                   const Scalar* slope) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  const auto zero = V::zero();
  for (Index c = 0; c < rows; c += W) {
    const Index n = std::min(W, rows - c);
    const auto p = V::load(pos + c), m = V::load(slope + c);
    for (Index j = 0; j < width; ++j) {
      Scalar* x = st + j * ld + c;
      const auto dist = V::sub(p, V::set1(static_cast<Scalar>(j0 + j)));
      const auto ad = V::max(dist, V::sub(zero, dist));
      if (n == W) {
        V::store(x, V::fnmadd(m, ad, V::load(x)));
      } else {
        V::store_partial(x, V::fnmadd(m, ad, V::load_partial(x, n)), n);
      }
    }
  }
}

/// ALiBi on one row of scores s[0..n) over keys j0 .. j0 + n - 1: s[j] -= slope |pos - key|.
template <class Scalar>
void alibi_row(Scalar* s, Index n, Index j0, Scalar pos, Scalar slope) noexcept {
  using V = Vec<Scalar>;
  constexpr Index W = V::kWidth;
  alignas(64) Scalar iota[W];
  for (Index e = 0; e < W; ++e) iota[e] = static_cast<Scalar>(e);
  const auto lanes = V::load(iota), m = V::set1(slope), zero = V::zero();
  for (Index j = 0; j < n; j += W) {
    const Index w = std::min(W, n - j);
    const auto dist = V::sub(V::set1(pos - static_cast<Scalar>(j0 + j)), lanes);
    const auto ad = V::max(dist, V::sub(zero, dist));
    if (w == W) {
      V::store(s + j, V::fnmadd(m, ad, V::load(s + j)));
    } else {
      V::store_partial(s + j, V::fnmadd(m, ad, V::load_partial(s + j, w)), w);
    }
  }
}

/// A softmax row's normaliser with a sink logit. The row's exponentials e_j = exp(s_j - top)
/// sum to `sum`; the sink adds exp(sink - top) to the denominator. `scale` turns e_j into
/// its probability e_j / (sum + exp(sink - top)), computed with the larger of top and sink
/// as the shift (no overflow); `lse` is the row's logsumexp with the sink, `sink_p` the
/// sink's own probability. A row whose exponentials are all 0 (top = -inf: every visible
/// score -inf) gives the sink the whole row; a sink of -inf is no sink.
struct SinkShare {
  double scale = 0.0, lse = 0.0, sink_p = 0.0;
};
template <class Scalar>
SinkShare sink_share(Scalar top, Scalar sum, Scalar sink) noexcept {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const double t = static_cast<double>(top), s = static_cast<double>(sink);
  const double l = static_cast<double>(sum);
  SinkShare share;
  if (s == kNegInf) {
    share.scale = 1.0 / l;
    share.lse = t + std::log(l);
    return share;
  }
  const double shift = s > t ? s : t;  // a NaN top stays NaN
  const double a = t == kNegInf ? 0.0 : std::exp(t - shift);
  const double z = l * a + std::exp(s - shift);
  share.scale = a / z;
  share.lse = shift + std::log(z);
  share.sink_p = std::exp(s - shift) / z;
  return share;
}
