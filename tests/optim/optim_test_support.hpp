// SPDX-License-Identifier: MIT
// tests/optim/optim_test_support.hpp: runs a torch.optim fixture case
// (fixtures/pytorch/optim_cases.hpp) through an attn optimizer and compares the parameters
// after every step, and the state after the last, bit for bit.
//
// Why bit for bit, in float too: the optimizers replay PyTorch's element-wise operations in
// its order, in the parameter's type, fusing exactly where ATen fuses; every operation is
// then correctly rounded on both sides (IEEE +, *, /, sqrt, fma), so any difference is a
// wrong operation, order or rounding, not noise.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>

#include "attn/attn.hpp"
#include "fixtures/pytorch/optim_cases.hpp"

namespace attn::test::pytorch {

template <class S>
void PrintTo(const OptimCase<S>& c, std::ostream* os) {
  *os << c.name << " (" << c.covers << ")";
}

/// The fixture case called `name`. @throws std::logic_error if there is none.
template <class Scalar>
OptimCase<Scalar> optim_case(const std::string& name) {
  for (const auto& c : optim_cases<Scalar>()) {
    if (name == c.name) return c;
  }
  throw std::logic_error("no optim fixture case " + name);
}

/// The fixture's three parameters, owned: "weight" (4, 3), "bias" (4), "odd" (21).
template <class Scalar>
struct OptimParams {
  Tensor<Scalar, 2> weight;
  Tensor<Scalar, 1> bias, odd;

  explicit OptimParams(const OptimCase<Scalar>& c)
      : weight({c.weight.shape[0], c.weight.shape[1]}),
        bias({c.bias.shape[0]}),
        odd({c.odd.shape[0]}) {
    std::memcpy(weight.data(), c.weight.values, sizeof(Scalar) * std::size_t(weight.size()));
    std::memcpy(bias.data(), c.bias.values, sizeof(Scalar) * std::size_t(bias.size()));
    std::memcpy(odd.data(), c.odd.values, sizeof(Scalar) * std::size_t(odd.size()));
  }
  ParameterList<Scalar> list() {
    ParameterList<Scalar> p;
    p.add("weight", weight.view()).add("bias", bias.view()).add("odd", odd.view());
    return p;
  }
};

/// Element `step` of a (steps, ...) fixture array, flattened.
template <class Scalar>
const Scalar* at_step(const Array<Scalar>& a, Index step) {
  return a.values + step * (a.size() / a.shape[0]);
}

/// `n` values of `actual` (a parameter or gradient view, walked row-major) against `expected`,
/// bit for bit; names the first differing element.
template <class Scalar>
::testing::AssertionResult same_values(const NamedParameter<Scalar>& actual,
                                       const Scalar* expected) {
  const TensorView<Scalar, 2> m = actual.matrix();
  Index i = 0;
  for (Index r = 0; r < m.extent(0); ++r) {
    for (Index c = 0; c < m.extent(1); ++c, ++i) {
      const Scalar a = m(r, c), e = expected[i];
      if (std::memcmp(&a, &e, sizeof(Scalar)) != 0) {
        return ::testing::AssertionFailure()
               << actual.name() << " element " << i << ": " << a << " != " << e << " (diff "
               << static_cast<double>(a) - static_cast<double>(e) << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

/// Copies step `step`'s gradients of the fixture into `grads` (by name).
template <class Scalar>
void load_gradients(const OptimCase<Scalar>& c, Index step, Gradients<Scalar>& grads) {
  for (const auto* p : {&c.weight_grads, &c.bias_grads, &c.odd_grads}) {
    const char* name = p == &c.weight_grads ? "weight" : p == &c.bias_grads ? "bias" : "odd";
    const TensorView<Scalar, 2> g = grads.at(name).matrix();
    const Scalar* values = at_step(*p, step);
    Index i = 0;
    for (Index r = 0; r < g.extent(0); ++r) {
      for (Index col = 0; col < g.extent(1); ++col) g(r, col) = values[i++];
    }
  }
}

/// Runs every step of `c` with `optimizer` over `params` and checks the parameters after
/// each against PyTorch's.
template <class Scalar, class Optimizer>
void expect_steps_match(const OptimCase<Scalar>& c, OptimParams<Scalar>& params,
                        Optimizer& optimizer) {
  Gradients<Scalar> grads(params.list());
  for (Index t = 0; t < c.steps; ++t) {
    SCOPED_TRACE("step " + std::to_string(t + 1));
    load_gradients(c, t, grads);
    optimizer.step(grads);
    const ParameterList<Scalar> list = params.list();
    EXPECT_TRUE(same_values(list[0], at_step(c.weight_after, t)));
    EXPECT_TRUE(same_values(list[1], at_step(c.bias_after, t)));
    EXPECT_TRUE(same_values(list[2], at_step(c.odd_after, t)));
  }
}

/// A state buffer (Gradients) against the fixture's arrays for the three parameters.
template <class Scalar>
void expect_state(const Gradients<Scalar>& state, const Array<Scalar>& weight,
                  const Array<Scalar>& bias, const Array<Scalar>& odd) {
  EXPECT_TRUE(same_values(state.at("weight"), weight.values));
  EXPECT_TRUE(same_values(state.at("bias"), bias.values));
  EXPECT_TRUE(same_values(state.at("odd"), odd.values));
}

/// Runs every fixture case of `kind` in Scalar: make(parameters, case) builds the optimizer,
/// every step is checked (expect_steps_match), then the step count and check_state(optimizer,
/// case). Returns how many cases ran.
template <class Scalar, class Make, class CheckState>
int run_cases(Optimizer kind, Make&& make, CheckState&& check_state) {
  int ran = 0;
  for (const auto& c : optim_cases<Scalar>()) {
    if (c.optimizer != kind) continue;
    SCOPED_TRACE(std::string(c.name) + ": " + c.covers);
    ++ran;
    OptimParams<Scalar> params(c);
    auto optimizer = make(params.list(), c);
    expect_steps_match(c, params, optimizer);
    EXPECT_EQ(optimizer.steps(), c.steps);
    check_state(optimizer, c);
  }
  return ran;
}

}  // namespace attn::test::pytorch
