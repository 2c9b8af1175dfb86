// SPDX-License-Identifier: MIT
// examples/example_support.hpp: printing in PyTorch's style and self-checks for the examples.
//
// Every example prints what its notebook prints and checks each printed value against the
// number the notebook shows (or, where the notebook is buggy, the corrected value from
// tests/fixtures/notebook/CASES.md). A check prints one line, `OK` or `MISMATCH`; main()
// returns Checker::finish(), which is non-zero when any check failed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attn.hpp"

namespace example {

using attn::Index;

// ---- tolerances -------------------------------------------------------------------------

/// A value the notebook prints with 4 decimals is within half a unit of the last digit
/// (5e-5) of the exact result; 1e-6 more covers float32 rounding in our own computation.
constexpr double kPrinted4dp = 0.5e-4 + 1e-6;
/// CASES.md gives its derived (corrected) values with 6 decimals.
constexpr double kPrinted6dp = 0.5e-6 + 1e-6;
/// Notebook 003 In [183] prints float32 weights with 17 significant digits.
constexpr double kFullPrecision = 1e-6;
/// Results computed from 4-decimal printed inputs (004 In [68] -> In [74]) carry the
/// inputs' rounding too; CASES.md recommends 2e-4.
constexpr double kFromPrintedInputs = 2e-4;
/// Two attn code paths that compute the same maths in float (e.g. a module vs. the same
/// steps spelled out with Eigen).
constexpr double kSameMaths = 1e-5;
/// Masks, shapes, copies, exact arithmetic.
constexpr double kExact = 0.0;

// ---- PyTorch-style printing ---------------------------------------------------------------

namespace detail {

inline std::string format_number(double value, int decimals, bool integral) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  if (integral) {
    std::snprintf(buffer, sizeof buffer, "%.0f.", value);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  }
  return buffer;
}

template <class T>
std::vector<double> to_doubles(const std::vector<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

/// "(i, j, k)" for the flat row-major position `flat` in `shape`.
template <std::size_t Rank>
std::string index_of(Index flat, const attn::Shape<Rank>& shape) {
  attn::Shape<Rank> index{};
  for (std::size_t r = Rank; r-- > 0;) {
    const Index extent = std::max<Index>(shape[r], 1);
    index[r] = flat % extent;
    flat /= extent;
  }
  return attn::detail::to_string(index);
}

}  // namespace detail

/// Formats a view like PyTorch's repr: `tensor([[0.4300, 0.1500], ...])`. Floats use
/// `decimals` decimals (PyTorch's default is 4), or `2.` style when every finite element is
/// a whole number; bools print True/False; columns are right-aligned to a common width.
/// Scientific notation and line wrapping are not implemented (the examples print small
/// tensors only).
template <class Scalar, std::size_t Rank>
std::string format(attn::TensorView<Scalar, Rank> t, int decimals = 4) {
  using Value = std::remove_const_t<Scalar>;
  const std::vector<Value> values = attn::contiguous(t).to_vector();
  std::vector<std::string> cells;
  cells.reserve(values.size());
  if constexpr (std::is_same_v<Value, bool>) {
    for (const bool v : values) cells.emplace_back(v ? "True" : "False");
  } else {
    bool integral = true;
    for (const Value v : values) {
      if (std::isfinite(v) && v != std::round(v)) integral = false;
    }
    for (const Value v : values) {
      cells.push_back(detail::format_number(static_cast<double>(v), decimals, integral));
    }
  }
  std::size_t width = 0;
  for (const auto& c : cells) width = std::max(width, c.size());
  for (auto& c : cells) c.insert(0, width - c.size(), ' ');

  // Nested brackets: between sub-tensors of axis `axis`, one newline per remaining axis
  // and an indent of len("tensor(") + axis + 1, as PyTorch does.
  std::string text = "tensor(";
  std::size_t next = 0;
  const auto emit = [&](const auto& self, std::size_t axis) -> void {
    text += '[';
    for (Index i = 0; i < t.extent(axis); ++i) {
      if (i > 0) {
        text += ',';
        if (axis + 1 == Rank) {
          text += ' ';
        } else {
          text += std::string(Rank - 1 - axis, '\n') + std::string(7 + axis + 1, ' ');
        }
      }
      if (axis + 1 == Rank) {
        text += cells[next++];
      } else {
        self(self, axis + 1);
      }
    }
    text += ']';
  };
  emit(emit, 0);
  return text + ")";
}

template <class Scalar, std::size_t Rank>
std::string format(const attn::Tensor<Scalar, Rank>& t, int decimals = 4) {
  return format(t.view(), decimals);
}

/// A 0-d tensor as PyTorch prints it: `tensor(0.9544)`, or `tensor(1.)` for a whole number.
inline std::string format_scalar(double value, int decimals = 4) {
  return "tensor(" + detail::format_number(value, decimals, value == std::round(value)) + ")";
}

/// A shape as attn writes it in messages: `(2, 6, 3)`.
template <std::size_t Rank>
std::string format_shape(const attn::Shape<Rank>& shape) {
  return attn::detail::to_string(shape);
}

template <class T>
void print(const T& tensor_or_view, int decimals = 4) {
  std::printf("%s\n", format(tensor_or_view, decimals).c_str());
}
inline void print_scalar(double value, int decimals = 4) {
  std::printf("%s\n", format_scalar(value, decimals).c_str());
}
inline void print_text(const std::string& text) { std::printf("%s\n", text.c_str()); }

/// Starts a notebook cell: a blank line, then e.g. `In [190]: all_context_vecs = ...`.
inline void cell(const std::string& cell_id, const std::string& code) {
  std::printf("\n%s: %s\n", cell_id.c_str(), code.c_str());
}
/// Explanatory text that is not notebook output.
inline void note(const std::string& text) { std::printf("  # %s\n", text.c_str()); }

// ---- checks ---------------------------------------------------------------------------------

/// Counts checks, prints one OK / MISMATCH line per check and the summary.
class Checker {
 public:
  explicit Checker(std::string program) : program_(std::move(program)) {
    std::printf("%s\n%s\n", program_.c_str(), std::string(program_.size(), '=').c_str());
  }

  /// Every element of `actual` (row-major order) within `tol` of `expected`. Equal
  /// infinities of the same sign match; NaN never matches.
  template <class Scalar, std::size_t Rank>
  void close(const std::string& label, attn::TensorView<Scalar, Rank> actual,
             std::initializer_list<double> expected, double tol) {
    close_values(label, detail::to_doubles(attn::contiguous(actual).to_vector()), actual.shape(),
                 std::vector<double>(expected), tol);
  }
  template <class Scalar, std::size_t Rank>
  void close(const std::string& label, const attn::Tensor<Scalar, Rank>& actual,
             std::initializer_list<double> expected, double tol) {
    close(label, actual.view(), expected, tol);
  }
  /// Two tensors (or views) of the same shape.
  template <class A, class B, std::size_t Rank>
  void close(const std::string& label, attn::TensorView<A, Rank> actual,
             attn::TensorView<B, Rank> expected, double tol) {
    if (actual.shape() != expected.shape()) {
      fail(label, "shape " + format_shape(actual.shape()) + ", expected " +
                      format_shape(expected.shape()));
      return;
    }
    close_values(label, detail::to_doubles(attn::contiguous(actual).to_vector()), actual.shape(),
                 detail::to_doubles(attn::contiguous(expected).to_vector()), tol);
  }
  template <class A, class B, std::size_t Rank>
  void close(const std::string& label, const attn::Tensor<A, Rank>& actual,
             const attn::Tensor<B, Rank>& expected, double tol) {
    close(label, actual.view(), expected.view(), tol);
  }
  /// One number.
  void close(const std::string& label, double actual, double expected, double tol) {
    close_values(label, {actual}, attn::Shape<1>{1}, {expected}, tol);
  }

  /// A boolean view against the expected pattern (1 = true), exactly.
  template <class Scalar, std::size_t Rank>
  void pattern(const std::string& label, attn::TensorView<Scalar, Rank> actual,
               std::initializer_list<int> expected) {
    std::vector<double> want(expected.begin(), expected.end());
    close_values(label, detail::to_doubles(attn::contiguous(actual).to_vector()), actual.shape(),
                 want, kExact);
  }
  template <class Scalar, std::size_t Rank>
  void pattern(const std::string& label, const attn::Tensor<Scalar, Rank>& actual,
               std::initializer_list<int> expected) {
    pattern(label, actual.view(), expected);
  }

  template <std::size_t Rank>
  void shape(const std::string& label, const attn::Shape<Rank>& actual,
             const attn::Shape<Rank>& expected) {
    if (actual == expected) {
      pass(label, format_shape(actual));
    } else {
      fail(label, "got " + format_shape(actual) + ", expected " + format_shape(expected));
    }
  }

  /// A fact that is true or not; `detail` says what was compared.
  void that(const std::string& label, bool ok, const std::string& detail = "") {
    if (ok) {
      pass(label, detail);
    } else {
      fail(label, detail);
    }
  }

  /// `fn()` throws `Error` whose what() contains `needle`.
  template <class Error, class Fn>
  void throws(const std::string& label, Fn&& fn, const std::string& needle) {
    try {
      fn();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find(needle) != std::string::npos) {
        pass(label, "threw: " + what);
      } else {
        fail(label, "threw, but the message lacks \"" + needle + "\": " + what);
      }
      return;
    } catch (const std::exception& e) {
      fail(label, std::string("threw the wrong exception type: ") + e.what());
      return;
    }
    fail(label, "did not throw");
  }

  int checks() const noexcept { return checks_; }
  int mismatches() const noexcept { return mismatches_; }

  /// Prints the summary; the value to return from main().
  int finish() const {
    std::printf("\n%s: %d checks, %d mismatches -> %s\n", program_.c_str(), checks_, mismatches_,
                mismatches_ == 0 ? "OK" : "MISMATCH");
    return mismatches_ == 0 ? 0 : 1;
  }

 private:
  template <std::size_t Rank>
  void close_values(const std::string& label, const std::vector<double>& actual,
                    const attn::Shape<Rank>& shape, const std::vector<double>& expected,
                    double tol) {
    if (actual.size() != expected.size()) {
      fail(label,
           std::to_string(actual.size()) + " values, expected " + std::to_string(expected.size()));
      return;
    }
    double worst = 0;
    std::size_t worst_at = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      const double a = actual[i], e = expected[i];
      double diff;
      if (std::isinf(a) || std::isinf(e)) {
        diff = (a == e) ? 0.0 : HUGE_VAL;
      } else {
        diff = std::fabs(a - e);
        if (std::isnan(diff)) diff = HUGE_VAL;
      }
      if (diff > worst || i == 0) {
        worst = diff;
        worst_at = i;
      }
    }
    char buffer[160];
    if (worst <= tol) {
      if (tol == 0) {
        std::snprintf(buffer, sizeof buffer, "%zu value%s, exact", actual.size(),
                      actual.size() == 1 ? "" : "s");
      } else {
        std::snprintf(buffer, sizeof buffer, "%zu value%s, max |diff| %.1e <= %.1e", actual.size(),
                      actual.size() == 1 ? "" : "s", worst, tol);
      }
      pass(label, buffer);
    } else {
      std::snprintf(buffer, sizeof buffer, "at %s: got %.6g, expected %.6g (|diff| %.1e > %.1e)",
                    detail::index_of(static_cast<Index>(worst_at), shape).c_str(), actual[worst_at],
                    expected[worst_at], worst, tol);
      fail(label, buffer);
    }
  }

  void pass(const std::string& label, const std::string& detail) {
    ++checks_;
    std::printf("  OK        %s%s%s\n", label.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }
  void fail(const std::string& label, const std::string& detail) {
    ++checks_;
    ++mismatches_;
    std::printf("  MISMATCH  %s%s%s\n", label.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }

  std::string program_;
  int checks_ = 0;
  int mismatches_ = 0;
};

// ---- small conveniences -------------------------------------------------------------------

/// Notebook 003's six 3-d embeddings of "Your journey starts with one step" (In [168]).
inline attn::Tensor<float, 2> journey_inputs() {
  return attn::Tensor<float, 2>::from_rows({
      {0.43f, 0.15f, 0.89f},  // Your    (x^1)
      {0.55f, 0.87f, 0.66f},  // journey (x^2)
      {0.57f, 0.85f, 0.64f},  // starts  (x^3)
      {0.22f, 0.58f, 0.33f},  // with    (x^4)
      {0.77f, 0.25f, 0.10f},  // one     (x^5)
      {0.05f, 0.80f, 0.55f},  // step    (x^6)
  });
}

/// `torch.stack((x, x), dim=0)`: attn has no stack(), so copy into select() views.
inline attn::Tensor<float, 3> stack2(const attn::Tensor<float, 2>& a,
                                     const attn::Tensor<float, 2>& b) {
  attn::Tensor<float, 3> batch({2, a.extent(0), a.extent(1)});
  attn::copy(a.view(), attn::select(batch.view(), 0, 0));
  attn::copy(b.view(), attn::select(batch.view(), 0, 1));
  return batch;
}

/// `torch.arange(n).float().reshape(shape)`: element i (row-major) holds i.
template <std::size_t Rank>
attn::Tensor<float, Rank> arange(const attn::Shape<Rank>& shape) {
  attn::Tensor<float, Rank> t(shape);
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i);
  return t;
}

/// Uniform values in [lo, hi) from an attn::TorchGenerator with the given seed, for the
/// notebooks' unseeded `torch.randn` inputs (only their shapes are reproducible).
template <std::size_t Rank>
attn::Tensor<float, Rank> random_input(const attn::Shape<Rank>& shape, std::uint64_t seed,
                                       double lo = -1.0, double hi = 1.0) {
  attn::TorchGenerator gen(seed);
  attn::Tensor<float, Rank> t(shape);
  gen.fill_uniform(t.view(), lo, hi);
  return t;
}

}  // namespace example
