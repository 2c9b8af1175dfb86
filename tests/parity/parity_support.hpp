// SPDX-License-Identifier: MIT
// tests/parity/parity_support.hpp: helpers of the PyTorch parity tests: fixture arrays as
// attn views, masks from fixtures, and tolerance / bit-exact checks that log the worst error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "fixtures/pytorch/fixture_types.hpp"
#include "support/test_support.hpp"

namespace attn::test::pytorch {

// ---- fixture arrays as attn views ----

/// A fixture array as a read-only view of rank `Rank`.
/// @throws std::logic_error if the array is absent or has another rank (a broken fixture).
template <std::size_t Rank, class T>
TensorView<const T, Rank> view(const Array<T>& a) {
  if (!a.present() || a.rank != static_cast<int>(Rank)) {
    throw std::logic_error("fixture array has rank " + std::to_string(a.rank) +
                           (a.present() ? "" : " (absent)") + ", expected rank " +
                           std::to_string(Rank));
  }
  Shape<Rank> shape{};
  for (std::size_t r = 0; r < Rank; ++r) shape[r] = a.shape[r];
  return TensorView<const T, Rank>(a.values, shape);
}

/// Calls fn(view) with the array as a view of its own rank (2, 3 or 4).
template <class T, class Fn>
void with_view(const Array<T>& a, Fn&& fn) {
  switch (a.rank) {
    case 2:
      fn(view<2>(a));
      break;
    case 3:
      fn(view<3>(a));
      break;
    case 4:
      fn(view<4>(a));
      break;
    default:
      throw std::logic_error("fixture mask of rank " + std::to_string(a.rank));
  }
}

inline CausalAlignment alignment(Causal c) {
  switch (c) {
    case Causal::kTopLeft:
      return CausalAlignment::kTopLeft;
    case Causal::kBottomRight:
      return CausalAlignment::kBottomRight;
    default:
      return CausalAlignment::kSquare;
  }
}

/// Shape of a fixture array as attn prints shapes, for messages.
template <class T>
std::string shape_string(const Array<T>& a) {
  std::string s = "(";
  for (int r = 0; r < a.rank; ++r) {
    s += (r ? ", " : "") + std::to_string(a.shape[static_cast<std::size_t>(r)]);
  }
  return s + ")";
}

// gtest prints a parameter on failure; the case name is what identifies it.
template <class S>
void PrintTo(const MhaCase<S>& c, std::ostream* os) {
  *os << c.name << " (" << c.covers << ")";
}
template <class S>
void PrintTo(const SdpaCase<S>& c, std::ostream* os) {
  *os << c.name << " (" << c.covers << ")";
}
template <class S>
void PrintTo(const NotebookCase<S>& c, std::ostream* os) {
  *os << c.name << " (" << c.covers << ")";
}
template <class S>
void PrintTo(const MhaInitCase<S>& c, std::ostream* os) {
  *os << c.name;
}
template <class S>
void PrintTo(const LinearInitCase<S>& c, std::ostream* os) {
  *os << c.name;
}

/// Names instantiated parameterised tests after the fixture case.
struct CaseName {
  template <class Info>
  std::string operator()(const Info& info) const {
    return info.param.name;
  }
};

// ---- error summary ----

/// Worst errors seen by near() in this test program, per scalar type; printed at exit so
/// the margin between observed error and tolerance stays visible in the test log.
struct ErrorSummary {
  double max_abs = 0;    // largest |attn - expected|
  double max_ratio = 0;  // largest |attn - expected| / allowed
  std::string where_abs, where_ratio;
  long long compared = 0;
};

template <class S>
ErrorSummary& error_summary() {
  static ErrorSummary summary;
  return summary;
}

class ErrorSummaryPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    print("float", error_summary<float>());
    print("double", error_summary<double>());
  }

 private:
  static void print(const char* type, const ErrorSummary& s) {
    if (s.compared == 0) return;
    std::printf(
        "[  parity  ] %-6s %lld values: max |error| %.3g (%s); max error/tolerance %.3g (%s)\n",
        type, s.compared, s.max_abs, s.where_abs.c_str(), s.max_ratio, s.where_ratio.c_str());
  }
};

inline const bool kErrorSummaryRegistered =
    (::testing::AddGlobalTestEnvironment(new ErrorSummaryPrinter), true);

// ---- expected values ----

/// Expected values as doubles. PyTorch returns NaN for a query row that sees no key; attn
/// returns zero context (so zero weights, and out_proj's bias after the output projection)
/// by design. Those entries are replaced by `fill(flat index)` and must match exactly.
struct Expected {
  std::vector<double> values;
  std::vector<bool> exact;
  Index replaced = 0;  // how many NaN entries were replaced
};

template <class S, class Fill>
Expected expected_values(const Array<S>& a, Fill&& fill) {
  Expected e;
  const Index n = a.size();
  e.values.resize(static_cast<std::size_t>(n));
  e.exact.resize(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) {
    const double v = static_cast<double>(a.values[i]);
    const bool nan = std::isnan(v);
    e.values[static_cast<std::size_t>(i)] = nan ? static_cast<double>(fill(i)) : v;
    e.exact[static_cast<std::size_t>(i)] = nan;
    e.replaced += nan ? 1 : 0;
  }
  return e;
}
template <class S>
Expected expected_values(const Array<S>& a) {
  return expected_values(a, [](Index) { return 0.0; });
}

/// Checks every element: |actual - expected| <= tol * (1 + |expected|), i.e. abs + rel*|ref|
/// with abs = rel = tol, and equality for the replaced NaN entries. Logs the worst error.
template <class T, std::size_t Rank, class S>
::testing::AssertionResult near(TensorView<T, Rank> actual, const Array<S>& reference,
                                const Expected& expected, double tol, const std::string& what) {
  using Value = std::remove_const_t<T>;
  static_assert(std::is_same_v<Value, S>, "near: actual and reference scalar types differ");
  bool shape_ok = reference.rank == static_cast<int>(Rank);
  for (std::size_t r = 0; shape_ok && r < Rank; ++r) {
    shape_ok = actual.extent(r) == reference.shape[r];
  }
  if (!shape_ok) {
    return ::testing::AssertionFailure()
           << what << ": attn gives shape " << detail::to_string(actual.shape()) << ", PyTorch "
           << shape_string(reference);
  }
  const std::vector<Value> got = to_vector(actual);
  ErrorSummary& summary = error_summary<S>();
  Index failures = 0, worst = -1;
  double worst_ratio = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = static_cast<double>(got[i]), e = expected.values[i];
    const double err = std::abs(a - e);
    const double allowed = expected.exact[i] ? 0.0 : tol * (1.0 + std::abs(e));
    const bool ok = err <= allowed;  // false for NaN
    if (!ok) ++failures;
    const double ratio =
        ok ? (allowed > 0 ? err / allowed : 0.0) : std::numeric_limits<double>::infinity();
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = static_cast<Index>(i);
    }
    if (!(err <= summary.max_abs)) {
      summary.max_abs = err;
      summary.where_abs = what;
    }
    if (ok && ratio > summary.max_ratio) {
      summary.max_ratio = ratio;
      summary.where_ratio = what;
    }
  }
  summary.compared += static_cast<long long>(got.size());
  if (failures == 0) return ::testing::AssertionSuccess();
  const auto w = static_cast<std::size_t>(worst);
  std::ostringstream msg;
  msg.precision(std::numeric_limits<double>::max_digits10);
  msg << what << ": " << failures << " of " << got.size() << " values differ; worst at flat index "
      << worst << ": attn " << static_cast<double>(got[w]) << ", expected " << expected.values[w]
      << (expected.exact[w] ? " exactly (PyTorch NaN: no visible key)" : "") << ", |diff| "
      << std::abs(static_cast<double>(got[w]) - expected.values[w]) << " > allowed "
      << (expected.exact[w] ? 0.0 : tol * (1.0 + std::abs(expected.values[w])));
  return ::testing::AssertionFailure() << msg.str();
}

/// Bit-exact equality of two views (initial weights drawn from the same seed).
template <class T, class S, std::size_t Rank>
::testing::AssertionResult bit_equal(TensorView<T, Rank> actual,
                                     TensorView<const S, Rank> reference, const std::string& what) {
  static_assert(std::is_same_v<std::remove_const_t<T>, S>, "bit_equal: scalar types differ");
  if (actual.shape() != reference.shape()) {
    return ::testing::AssertionFailure()
           << what << ": attn has shape " << detail::to_string(actual.shape()) << ", PyTorch "
           << detail::to_string(reference.shape());
  }
  const std::vector<S> got = to_vector(actual), want = to_vector(reference);
  Index mismatches = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i]) && mismatches++ == 0) first = static_cast<Index>(i);
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  const auto f = static_cast<std::size_t>(first);
  char buffer[160];
  std::snprintf(buffer, sizeof buffer, "attn %a, PyTorch %a", static_cast<double>(got[f]),
                static_cast<double>(want[f]));
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << got.size()
         << " values differ; first at flat index " << first << ": " << buffer;
}

/// Bit-exact equality with a whole fixture array.
template <class T, std::size_t Rank, class S>
::testing::AssertionResult bit_equal(TensorView<T, Rank> actual, const Array<S>& reference,
                                     const std::string& what) {
  if (reference.rank != static_cast<int>(Rank)) {
    return ::testing::AssertionFailure()
           << what << ": attn has shape " << detail::to_string(actual.shape()) << ", PyTorch "
           << shape_string(reference);
  }
  return bit_equal(actual, view<Rank>(reference), what);
}

}  // namespace attn::test::pytorch
