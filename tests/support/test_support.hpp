// SPDX-License-Identifier: MIT
// tests/support/test_support.hpp: helpers shared by the tests (views to vectors, rows,
// tolerances, a tiny deterministic random source).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"

namespace attn::test {

/// The elements of any view in row-major index order.
template <class Scalar, std::size_t Rank>
std::vector<std::remove_const_t<Scalar>> to_vector(TensorView<Scalar, Rank> v) {
  using Value = std::remove_const_t<Scalar>;
  if constexpr (std::is_same_v<Value, bool>) {  // std::vector<bool> has no data()
    std::vector<bool> out;
    out.reserve(static_cast<std::size_t>(v.size()));
    detail::for_each_offset(v.shape(), v.strides(), v.strides(),
                            [&](Index o, Index) { out.push_back(v.data()[o]); });
    return out;
  } else {
    // Through raw pointers: push_back and data() are calls in -O0 and sanitizer builds, where
    // this copy took about a tenth of the generation tests' time.
    std::vector<Value> out(static_cast<std::size_t>(v.size()));
    Value* dst = out.data();
    const Scalar* const src = v.data();
    detail::for_each_offset(v.shape(), v.strides(), v.strides(),
                            [&](Index o, Index) { *dst++ = src[o]; });
    return out;
  }
}
template <class Scalar, std::size_t Rank>
std::vector<Scalar> to_vector(const Tensor<Scalar, Rank>& t) {
  return to_vector(t.view());
}

/// Row i of a rank-2 tensor, or row (b, i) of a rank-3 tensor, as a vector.
template <class Scalar>
std::vector<Scalar> row(const Tensor<Scalar, 2>& t, Index i) {
  return to_vector(select(t.view(), 0, i));
}
template <class Scalar>
std::vector<Scalar> row(const Tensor<Scalar, 3>& t, Index b, Index i) {
  return to_vector(select(select(t.view(), 0, b), 0, i));
}

/// The value std::uniform_real_distribution<double>(lo, hi)(gen) gives under libstdc++, bit
/// for bit, without its cost: its std::generate_canonical takes two long-double logarithms
/// per call, which unoptimised and sanitizer builds do not fold (12 % of the sanitizer build's
/// GEMM tests went to logl).
inline double uniform_double(std::mt19937_64& gen, double lo, double hi) {
  double u = static_cast<double>(gen()) * 0x1p-64;  // exact: a power of two
  if (u >= 1.0) u = std::nextafter(1.0, 0.0);
  return u * (hi - lo) + lo;
}

/// A tensor of uniform values in [lo, hi) from a seeded std::mt19937_64 (independent of
/// attn's own generators, so tests do not test the generator with itself).
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> random_tensor(const Shape<Rank>& shape, std::uint64_t seed, double lo = -1.0,
                                   double hi = 1.0) {
  Tensor<Scalar, Rank> t(shape);
  std::mt19937_64 gen(seed);
  for (Index i = 0; i < t.size(); ++i)
    t.data()[i] = static_cast<Scalar>(uniform_double(gen, lo, hi));
  return t;
}

/// Largest |a - b| over two views of the same shape (infinity if the shapes differ).
template <class A, class B, std::size_t Rank>
double max_abs_diff(TensorView<A, Rank> a, TensorView<B, Rank> b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  const auto va = to_vector(a);
  const auto vb = to_vector(b);
  double worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double d = std::abs(static_cast<double>(va[i]) - static_cast<double>(vb[i]));
    if (!(d <= worst)) worst = d;  // NaN propagates as the worst
  }
  return worst;
}

/// Tolerance for comparing two computations of a reduction of length n in Scalar:
/// abs + rel * |ref| with both ~ n * epsilon (llm.c's validate_result style).
template <class Scalar>
constexpr double reduction_tolerance(Index n) {
  return 8.0 * static_cast<double>(n) * std::numeric_limits<Scalar>::epsilon();
}

/// The kernel set this run of the suite uses: the one ATTN_ISA names (clamped to the CPU), or
/// the widest. Read from the environment, not from active_isa(), so a test that has called
/// set_isa() still sees it.
inline Isa run_isa() {
  Isa isa = best_isa();
  const char* env = std::getenv("ATTN_ISA");
  if (env != nullptr && *env != '\0' && !parse_isa(env, isa)) isa = best_isa();
  return isa < best_isa() ? isa : best_isa();
}

/// The kernel sets for a test that loops over sets itself (set_isa() each; test_main restores
/// the run's set after every test), narrowest first. In a run on the widest set (the test
/// command's first run, and the sanitizer tree's): every set this CPU runs. In a run that
/// ATTN_ISA narrows: that set alone. The test command runs the suite once per set, so the
/// narrower runs check their own set without repeating the loops of the widest run.
inline std::vector<Isa> runnable_sets() {
  const Isa run = run_isa();
  if (run < best_isa()) return {run};
  std::vector<Isa> sets;
  for (const Isa isa : {Isa::kScalar, Isa::kSse2, Isa::kAvx2, Isa::kAvx512}) {
    if (isa <= best_isa()) sets.push_back(isa);
  }
  return sets;
}

}  // namespace attn::test
