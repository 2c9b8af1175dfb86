// SPDX-License-Identifier: MIT
// tests/support/finite_difference.hpp: central finite differences in double, the check every
// backward pass is held to: d loss / d input from (loss(x + h) - loss(x - h)) / 2h, element by
// element, against the analytic gradient.
//
// Step and tolerance. The error of a central difference is the truncation h^2 / 6 |f'''| plus
// the rounding of the loss, about eps |loss| / h, where eps is the rounding of the loss
// evaluation: 2^-64 for a long-double reference, 2^-53 for attn's double forward. With
// h = 1e-5 both are about 1e-11 for losses and third derivatives of order one (inputs in
// [-1, 1], softmax of logits of a few units), so the default tolerance 1e-6 (absolute) +
// 1e-6 (relative to the analytic value) leaves four orders of magnitude of margin, while a
// missing term, a wrong scale, mask or transpose moves a gradient by 1e-3 or more. Losses that
// are not smooth at the evaluation point (a ReLU at 0) are not checked this way; dropout with
// fixed keep decisions and masks are linear or constant in the inputs and are fine.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"

namespace attn::test::fd {

/// One input of a loss: the elements the check perturbs (in row-major order) and the
/// analytic gradient of the loss with respect to each, in the same order.
struct Variable {
  std::string name;
  std::vector<double*> elements;
  std::vector<double> analytic;
};

/// `x` (perturbed in place while checking, restored after) and its analytic gradient
/// `grad`, of the same shape.
template <std::size_t Rank, class GradScalar>
Variable variable(std::string name, TensorView<double, Rank> x, TensorView<GradScalar, Rank> grad) {
  Variable v{std::move(name), {}, {}};
  if (x.shape() != grad.shape()) {
    ADD_FAILURE() << v.name << ": value " << detail::to_string(x.shape()) << " and gradient "
                  << detail::to_string(grad.shape()) << " differ in shape";
    return v;
  }
  detail::for_each_offset(x.shape(), x.strides(), grad.strides(), [&](Index a, Index g) {
    v.elements.push_back(x.data() + a);
    v.analytic.push_back(static_cast<double>(grad.data()[g]));
  });
  return v;
}

struct Options {
  double step = 1e-5;  ///< h (see the file comment)
  double atol = 1e-6;  ///< |numeric - analytic| <= atol + rtol * |analytic|
  double rtol = 1e-6;
  Index stride = 1;  ///< check every stride-th element of each variable (large inputs)
};

/// Checks every (stride-th) element of every variable: perturbs it by +-h, evaluates
/// `loss` (which reads the variables' current values), restores it. On failure names the
/// worst element (variable, index, analytic and numeric values) and how many failed.
inline ::testing::AssertionResult check(const std::function<long double()>& loss,
                                        const std::vector<Variable>& variables,
                                        const Options& options = {}) {
  std::size_t checked = 0, failed = 0;
  double worst_excess = 0;
  std::string worst;
  for (const Variable& v : variables) {
    if (v.elements.size() != v.analytic.size()) {
      return ::testing::AssertionFailure() << v.name << ": elements and gradient differ";
    }
    for (std::size_t i = 0; i < v.elements.size(); i += static_cast<std::size_t>(options.stride)) {
      double* x = v.elements[i];
      const double saved = *x;
      *x = saved + options.step;
      const long double up = loss();
      *x = saved - options.step;
      const long double down = loss();
      *x = saved;
      const double numeric = static_cast<double>((up - down) / (2.0L * options.step));
      const double analytic = v.analytic[i];
      const double allowed = options.atol + options.rtol * std::abs(analytic);
      const double diff = std::abs(numeric - analytic);
      ++checked;
      if (!(diff <= allowed)) {  // NaN fails
        ++failed;
        const double excess = std::isnan(diff) ? 1e300 : diff / allowed;
        if (excess >= worst_excess) {
          worst_excess = excess;
          std::ostringstream text;
          text.precision(12);
          text << v.name << "[" << i << "]: analytic " << analytic << ", numeric " << numeric
               << " (|diff| " << diff << " > " << allowed << ")";
          worst = text.str();
        }
      }
    }
  }
  if (checked == 0) return ::testing::AssertionFailure() << "no element checked";
  if (failed == 0) return ::testing::AssertionSuccess() << checked << " elements checked";
  return ::testing::AssertionFailure()
         << failed << " of " << checked << " elements differ; worst " << worst;
}

/// sum(weights * y) over two views of the same shape, in long double: the scalar loss whose
/// gradient with respect to y is `weights` (a random "upstream gradient").
template <class Y, class W, std::size_t Rank>
long double weighted_sum(TensorView<Y, Rank> y, TensorView<W, Rank> weights) {
  long double total = 0;
  detail::for_each_offset(y.shape(), y.strides(), weights.strides(), [&](Index a, Index b) {
    total += static_cast<long double>(y.data()[a]) * static_cast<long double>(weights.data()[b]);
  });
  return total;
}

}  // namespace attn::test::fd
