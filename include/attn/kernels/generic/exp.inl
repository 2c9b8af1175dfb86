// SPDX-License-Identifier: MIT
// attn/kernels/generic/exp.inl: exp over a set's vector primitives, written once for every
// set (each includes this file in its own namespace and target region).
//
// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two
// parts, so r is exact), exp(r) by a polynomial (float: Cephes' degree 6, about 1 ulp;
// double: Taylor to degree 13, below 1e-17 relative on |r| <= 0.347), 2^n by ldexp (two
// exact steps, so a subnormal result is rounded once, from exp(r)).
// Edges, as IEEE exp: NaN -> NaN, +inf and x > ln(max) -> +inf; results below the smallest
// normal are the subnormals they round to (within one subnormal step), and x below
// ln(min subnormal / 2) (-103.97 float, -745.13 double), -inf included, gives exactly 0, as
// the correctly rounded result is there.

template <class Scalar>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  static constexpr float kLo = -103.972077f;           // ln(2^-150): half the least subnormal
  static constexpr float kHi = 88.72283172607421875f;  // largest x with finite exp(x)
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo
  static constexpr float kLn2Lo = -2.12194440e-4f;
};

template <>
struct ExpConstants<double> {
  static constexpr double kLo = -745.1332191019411;  // ln(2^-1075): half the least subnormal
  static constexpr double kHi = 709.782712893384;    // ln(DBL_MAX), rounded down
  static constexpr double kLog2e = 1.4426950408889634;
  static constexpr double kLn2Hi = 6.93145751953125e-1;
  static constexpr double kLn2Lo = 1.42860682030941723212e-6;
};

/// exp(r) for |r| <= ln2/2, float: Cephes' minimax polynomial.
template <class V, std::enable_if_t<std::is_same_v<typename V::Scalar, float>, int> = 0>
inline typename V::Reg exp_reduced(typename V::Reg r) noexcept {
  auto p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, r, V::set1(1.6666665459e-1f));
  p = V::fmadd(p, r, V::set1(5.0000001201e-1f));
  return V::fmadd(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
}

/// exp(r) for |r| <= 0.347, double: Taylor polynomial of degree 13 (Horner).
template <class V, std::enable_if_t<std::is_same_v<typename V::Scalar, double>, int> = 0>
inline typename V::Reg exp_reduced(typename V::Reg r) noexcept {
  constexpr double kInverseFactorials[] = {1.0 / 6227020800.0,
                                           1.0 / 479001600.0,
                                           1.0 / 39916800.0,
                                           1.0 / 3628800.0,
                                           1.0 / 362880.0,
                                           1.0 / 40320.0,
                                           1.0 / 5040.0,
                                           1.0 / 720.0,
                                           1.0 / 120.0,
                                           1.0 / 24.0,
                                           1.0 / 6.0,
                                           0.5,
                                           1.0,
                                           1.0};
  auto p = V::set1(kInverseFactorials[0]);
  for (int i = 1; i < 14; ++i) p = V::fmadd(p, r, V::set1(kInverseFactorials[i]));
  return p;
}

/// exp(x) for x in [kLo, kHi] (or NaN), without vexp()'s edges: 2^n exp(r).
template <class V>
inline typename V::Reg vexp_core(typename V::Reg x) noexcept {
  using C = ExpConstants<typename V::Scalar>;
  const auto n = V::round(V::mul(x, V::set1(C::kLog2e)));
  auto r = V::fnmadd(n, V::set1(C::kLn2Hi), x);
  r = V::fnmadd(n, V::set1(C::kLn2Lo), r);
  return V::ldexp(exp_reduced<V>(r), n);
}

/// exp of every lane (see the file comment for accuracy and edges).
template <class V>
inline typename V::Reg vexp(typename V::Reg x) noexcept {
  using C = ExpConstants<typename V::Scalar>;
  const auto lo = V::set1(C::kLo), hi = V::set1(C::kHi);
  // min/max return their second operand when either is NaN, so NaN passes the clamp.
  auto y = vexp_core<V>(V::max(lo, V::min(hi, x)));
  y = V::select(V::greater(x, hi), V::set1(std::numeric_limits<typename V::Scalar>::infinity()), y);
  return V::select(V::less(x, lo), V::zero(), y);
}

/// The floor of vexp_normal(): ln(smallest normal) + 1.
template <class S>
inline S vexp_normal_floor() noexcept {
  return std::log(std::numeric_limits<S>::min()) + S(1);
}

/// exp of every lane, or 0 where the result would be below 2^-125 (2^-1021 for double): x
/// below ln(smallest normal) + 1 (-86.34 float, -707.4 double); NaN for NaN. What the
/// attention kernels exponentiate shifted scores with: each row's exponentials sum to at least
/// 1 there (the row's largest is exp(0)), so dropping terms that small changes nothing a float
/// (double) sum keeps, while producing or multiplying subnormals costs microcode assists on
/// x86 without FTZ/DAZ. (The + 1 keeps vexp's own result normal: exp(r) < 1 times 2^-126
/// would not be.) vexp()'s low edge is left out: past the floor its input is above kLo.
template <class V>
inline typename V::Reg vexp_normal(typename V::Reg x) noexcept {
  using S = typename V::Scalar;
  const auto floor = V::set1(vexp_normal_floor<S>());
  const auto hi = V::set1(ExpConstants<S>::kHi);
  // max(floor, x) keeps a NaN x (max returns its second operand then), and keeps vexp's
  // input where its result is normal.
  const auto xf = V::max(floor, x);
  auto y = vexp_core<V>(V::min(hi, xf));
  y = V::select(V::greater(xf, hi), V::set1(std::numeric_limits<S>::infinity()), y);
  return V::select(V::less(x, floor), V::zero(), y);
}

/// vexp_normal() for x <= 0 or NaN (a score less a shift at least as large as it: the
/// attention's softmax), with the same bits there and neither of vexp()'s edges: 16 vector
/// instructions on AVX-512 against vexp_normal()'s 18. x above 0 is taken as 0 (result 1):
/// a row's running maximum can miss a score when a NaN score came between (max returns its
/// second operand when either is NaN), and that row is NaN already; the clamp keeps vexp's
/// reduction in range (an infinite exponent would be an undefined conversion to int).
template <class V>
inline typename V::Reg vexp_nonpositive(typename V::Reg x) noexcept {
  const auto floor = V::set1(vexp_normal_floor<typename V::Scalar>());
  // min(0, x): x itself when x is NaN (the second operand), so NaN stays NaN.
  return V::select(V::less(x, floor), V::zero(), vexp_core<V>(V::max(floor, V::min(V::zero(), x))));
}
