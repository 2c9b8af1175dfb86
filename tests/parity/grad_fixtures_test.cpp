// SPDX-License-Identifier: MIT
// tests/parity/grad_fixtures_test.cpp: the PyTorch autograd fixtures of every module
// (fixtures/pytorch/grad_cases.hpp, generate_grad_fixtures.py) fit attn: each case builds its
// attn module, whose named_parameters() lists exactly the fixture's parameter names in the
// same order and shapes; loaded with the fixture's weights, the module's forward (and its
// training forward) gives PyTorch's output; every gradient array has the shape of its input
// or parameter; and the module's backward gives PyTorch's gradients of every input and
// parameter, addressed by the parameter names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "fixtures/pytorch/grad_cases.hpp"
#include "parity/parity_support.hpp"
#include "support/scalar_types.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace grad_fixtures_test {

namespace {

using attn::AttentionMask;
using attn::Index;
using attn::Tensor;
using attn::TensorView;
using attn::test::reduction_tolerance;
using attn::test::pytorch::Array;
using attn::test::pytorch::GradModule;
using attn::test::pytorch::ModuleGradCase;
using attn::test::pytorch::NamedArray;
using attn::test::pytorch::view;

template <class Scalar>
class GradFixtures : public ::testing::Test {};
TYPED_TEST_SUITE(GradFixtures, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

/// Calls fn(module) with the case's attn module (weights not loaded yet).
template <class S, class Fn>
void with_module(const ModuleGradCase<S>& c, Fn&& fn) {
  switch (c.module) {
    case GradModule::kSimpleSelfAttention: {
      attn::SimpleSelfAttention<S> m(c.scaled);
      return fn(m);
    }
    case GradModule::kSelfAttentionV1: {
      attn::SelfAttention<S> m(c.d_in, c.d_out, attn::kRandInit);
      return fn(m);
    }
    case GradModule::kSelfAttentionV2: {
      attn::SelfAttention<S> m(c.d_in, c.d_out, c.qkv_bias);
      m.set_scaled(c.scaled);
      return fn(m);
    }
    case GradModule::kCausalAttention: {
      attn::CausalAttention<S> m(c.d_in, c.d_out, c.context_length, 0.0, c.qkv_bias);
      return fn(m);
    }
    case GradModule::kWrapper: {
      attn::MultiHeadAttentionWrapper<S> m(c.d_in, c.d_out, c.context_length, 0.0, c.num_heads,
                                           c.qkv_bias);
      return fn(m);
    }
    case GradModule::kMultiHeadAttention: {
      attn::MultiHeadAttention<S> m(c.d_in, c.d_out, c.context_length, 0.0, c.num_heads,
                                    c.qkv_bias);
      return fn(m);
    }
    case GradModule::kTorchMultiheadAttention: {
      attn::MultiHeadAttention<S> m(attn::MultiHeadAttentionOptions::pytorch(
          c.d_in, c.num_heads, c.qkv_bias, c.kdim, c.vdim));
      return fn(m);
    }
    case GradModule::kCrossAttention: {
      attn::CrossAttention<S> m(c.d_in, c.kdim, c.d_out, c.num_heads, c.qkv_bias);
      return fn(m);
    }
  }
  FAIL() << "unknown module kind";
}

/// What a case's module is called with: the mask, the inputs, the output's shape and the
/// parameter naming. The notebooks' MultiHeadAttention names its parameters as
/// nn.MultiheadAttention by default; the fixture keeps the notebook class's own names.
template <class S>
struct CaseCall {
  AttentionMask<S> mask;
  std::vector<TensorView<const S, 3>> inputs;
  attn::Shape<3> shape;
  attn::ParameterNames names;
  explicit CaseCall(const ModuleGradCase<S>& c)
      : shape(view<3>(c.output).shape()),
        names(c.module == GradModule::kMultiHeadAttention ? attn::ParameterNames::kNotebook
                                                          : attn::ParameterNames::kDefault) {
    if (c.attn_mask_bool.present()) mask.blocked(view<2>(c.attn_mask_bool));
    if (c.attn_mask_float.present()) mask.additive(view<2>(c.attn_mask_float));
    if (c.key_padding_mask.present()) mask.key_padding(view<2>(c.key_padding_mask));
    for (const auto& in : c.inputs) inputs.push_back(view<3>(in.array));
  }
};

/// A rank-1 or rank-2 fixture array copied into a parameter view (same shape).
template <class S>
void load(const attn::NamedParameter<S>& p, const Array<S>& values) {
  ASSERT_EQ(p.shape(), std::vector<Index>(values.shape.begin(), values.shape.begin() + values.rank))
      << p.name();
  const TensorView<S, 2> m = p.matrix();
  Index i = 0;
  for (Index r = 0; r < m.extent(0); ++r) {
    for (Index k = 0; k < m.extent(1); ++k) m(r, k) = values.values[i++];
  }
}

template <class S>
std::vector<std::string> names_of(const std::vector<NamedArray<S>>& list) {
  std::vector<std::string> names;
  for (const auto& a : list) names.emplace_back(a.name);
  return names;
}

/// The module's forward on the case's inputs, with `saved` a training forward.
/// (`shape`: the output's.)
template <class S, class Module>
Tensor<S, 3> run(const Module& m, const std::vector<TensorView<const S, 3>>& in,
                 const attn::Shape<3>& shape, const AttentionMask<S>& mask,
                 attn::SavedForward<S>* saved) {
  Tensor<S, 3> out(shape);
  attn::Workspace ws;
  if (saved != nullptr) {
    m.forward(in[0], out.view(), *saved, ws, mask);
  } else {
    m.forward(in[0], out.view(), ws, mask);
  }
  return out;
}
template <class S>
Tensor<S, 3> run(const attn::MultiHeadAttention<S>& m,
                 const std::vector<TensorView<const S, 3>>& in, const attn::Shape<3>& shape,
                 const AttentionMask<S>& mask, attn::SavedForward<S>* saved) {
  Tensor<S, 3> out(shape);
  attn::Workspace ws;
  const auto& q = in[0];
  const auto& k = in.size() > 1 ? in[1] : in[0];
  const auto& v = in.size() > 2 ? in[2] : k;  // two inputs: value is key
  if (saved != nullptr) {
    m.forward(q, k, v, out.view(), *saved, ws, mask);
  } else {
    m.forward(q, k, v, out.view(), ws, mask);
  }
  return out;
}
template <class S>
Tensor<S, 3> run(const attn::CrossAttention<S>& m, const std::vector<TensorView<const S, 3>>& in,
                 const attn::Shape<3>& shape, const AttentionMask<S>& mask,
                 attn::SavedForward<S>* saved) {
  Tensor<S, 3> out(shape);
  attn::Workspace ws;
  if (saved != nullptr) {
    m.forward(in[0], in[1], out.view(), *saved, ws, mask);
  } else {
    m.forward(in[0], in[1], out.view(), ws, mask);
  }
  return out;
}

/// The module's training forward on the case's inputs, then its backward for grad_output,
/// into `grads` and input gradients (same shapes as the inputs, zeroed first).
template <class S, class Module>
std::vector<Tensor<S, 3>> run_backward(const Module& m,
                                       const std::vector<TensorView<const S, 3>>& in,
                                       const attn::Shape<3>& shape, const AttentionMask<S>& mask,
                                       TensorView<const S, 3> grad_out, attn::Gradients<S>& grads) {
  Tensor<S, 3> out(shape);
  attn::Workspace ws;
  attn::SavedForward<S> saved;
  std::vector<Tensor<S, 3>> g;
  for (const auto& x : in) g.emplace_back(x.shape());  // zeroed
  if constexpr (std::is_same_v<Module, attn::MultiHeadAttention<S>>) {
    const auto& q = in[0];
    const auto& k = in.size() > 1 ? in[1] : in[0];
    const auto& v = in.size() > 2 ? in[2] : k;
    m.forward(q, k, v, out.view(), saved, ws, mask);
    const auto gq = g[0].view();
    const auto gk = in.size() > 1 ? g[1].view() : gq;
    const auto gv = in.size() > 2 ? g[2].view() : gk;
    m.backward(grad_out, saved, gq, gk, gv, grads, ws);
  } else if constexpr (std::is_same_v<Module, attn::CrossAttention<S>>) {
    m.forward(in[0], in[1], out.view(), saved, ws, mask);
    m.backward(grad_out, saved, g[0].view(), g[1].view(), grads, ws);
  } else {
    m.forward(in[0], out.view(), saved, ws, mask);
    m.backward(grad_out, saved, g[0].view(), grads, ws);
  }
  return g;
}

// The output is a chain of reductions (projection, scores, softmax sum, weights * V,
// out_proj); their lengths add (see mha_parity_test.cpp).
template <class S>
double output_tolerance(const ModuleGradCase<S>& c) {
  const Index tk = c.inputs.size() > 1 ? c.inputs[1].array.shape[1] : c.inputs[0].array.shape[1];
  return reduction_tolerance<S>(std::max({c.d_in, c.kdim, c.vdim}) + c.d_out + 2 * tk + c.d_out);
}

TYPED_TEST(GradFixtures, EveryModuleLoadsItsCaseAndComputesPyTorchsOutput) {
  using S = TypeParam;
  const auto cases = attn::test::pytorch::module_grad_cases<S>();
  ASSERT_EQ(cases.size(), 13u);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.name) + ": " + c.covers);
    EXPECT_EQ(names_of(c.grad_parameters), names_of(c.parameters));
    EXPECT_EQ(names_of(c.grad_inputs), names_of(c.inputs));
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      EXPECT_EQ(c.grad_inputs[i].array.shape, c.inputs[i].array.shape) << c.inputs[i].name;
    }
    for (std::size_t i = 0; i < c.parameters.size(); ++i) {
      EXPECT_EQ(c.grad_parameters[i].array.shape, c.parameters[i].array.shape)
          << c.parameters[i].name;
    }
    EXPECT_EQ(c.grad_output.shape, c.output.shape);
    const CaseCall<S> call(c);
    const auto& mask = call.mask;
    const auto& inputs = call.inputs;
    const auto& shape = call.shape;
    const auto names = call.names;
    with_module(c, [&](auto& m) {
      const auto params = m.named_parameters(names);
      ASSERT_EQ(params.names(), names_of(c.parameters));
      for (std::size_t i = 0; i < params.size(); ++i) load(params[i], c.parameters[i].array);
      const auto expected = attn::test::pytorch::expected_values(c.output);
      const double tol = output_tolerance(c);
      EXPECT_TRUE(attn::test::pytorch::near(
          run(m, inputs, shape, mask, static_cast<attn::SavedForward<S>*>(nullptr)).view(),
          c.output, expected, tol, std::string(c.name) + " forward"));
      attn::SavedForward<S> saved;
      EXPECT_TRUE(attn::test::pytorch::near(run(m, inputs, shape, mask, &saved).view(), c.output,
                                            expected, tol,
                                            std::string(c.name) + " training forward"));
      EXPECT_TRUE(saved.filled());
    });
  }
}

// Gradients are chains of the forward's reductions and the backward's: the forward's plus
// the sums over tokens (B T of them) of the weight gradients.
template <class S>
double gradient_tolerance(const ModuleGradCase<S>& c) {
  const Index b = c.inputs[0].array.shape[0], tq = c.inputs[0].array.shape[1];
  const Index tk = c.inputs.size() > 1 ? c.inputs[1].array.shape[1] : tq;
  return reduction_tolerance<S>(2 * std::max({c.d_in, c.kdim, c.vdim}) + 3 * c.d_out +
                                2 * (tq + tk) + b * std::max(tq, tk));
}

TYPED_TEST(GradFixtures, EveryModuleBackwardGivesPyTorchsGradients) {
  using S = TypeParam;
  for (const auto& c : attn::test::pytorch::module_grad_cases<S>()) {
    SCOPED_TRACE(std::string(c.name) + ": " + c.covers);
    const CaseCall<S> call(c);
    const auto& mask = call.mask;
    const auto& inputs = call.inputs;
    const auto& shape = call.shape;
    const auto names = call.names;
    const double tol = gradient_tolerance(c);
    with_module(c, [&](auto& m) {
      const auto params = m.named_parameters(names);
      for (std::size_t i = 0; i < params.size(); ++i) load(params[i], c.parameters[i].array);
      attn::Gradients<S> grads(m.named_parameters(names));
      const auto g = run_backward(m, inputs, shape, mask, view<3>(c.grad_output), grads);
      for (std::size_t i = 0; i < c.grad_inputs.size(); ++i) {
        const auto& ref = c.grad_inputs[i];
        EXPECT_TRUE(attn::test::pytorch::near(g[i].view(), ref.array,
                                              attn::test::pytorch::expected_values(ref.array), tol,
                                              std::string(c.name) + " grad " + ref.name));
      }
      ASSERT_EQ(grads.names(), names_of(c.grad_parameters));
      for (std::size_t i = 0; i < grads.size(); ++i) {
        const auto& ref = c.grad_parameters[i];
        const TensorView<const S, 2> got = grads[i].matrix();
        const TensorView<const S, 2> want(ref.array.values, {got.extent(0), got.extent(1)});
        for (Index r = 0; r < got.extent(0); ++r) {
          for (Index k = 0; k < got.extent(1); ++k) {
            const double e = want(r, k), a = got(r, k);
            EXPECT_LE(std::abs(a - e), tol * (1 + std::abs(e)))
                << c.name << " grad " << ref.name << " at (" << r << ", " << k << ")";
          }
        }
      }
    });
  }
}

}  // namespace

}  // namespace grad_fixtures_test

#include "support/bodies_end.hpp"
