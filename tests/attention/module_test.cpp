// SPDX-License-Identifier: MIT
// tests/attention/module_test.cpp: the API every module shares (attn/attention/module.hpp),
// checked the same way on every module: the forward set (allocating, into out, with a
// workspace, unbatched, with weights) gives the very same bits wherever it runs the same
// arithmetic; masks reach the kernel; train/eval/seed/freeze behave alike; named_parameters()
// lists the notebook's or PyTorch's names in state_dict order, as views into the module.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace module_test {

namespace {

using attn::AttentionMask;
using attn::Index;
using attn::ParameterNames;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
namespace ref = attn::test::ref;

using S = double;
using Input = Tensor<S, 3>;

// One case per module: how to build it, its inputs (B = 2, T_q = 9, T_k = 11 where keys are
// separate), and what it must call its parameters.
struct Simple {
  using Module = attn::SimpleSelfAttention<S>;
  static Module make() { return Module(true); }
  static std::tuple<Input> inputs() { return {attn::test::random_tensor<S>(Shape<3>{2, 9, 4}, 1)}; }
  static std::vector<std::string> names() { return {}; }
  static constexpr bool kDropout = false;
};
struct SelfV2 {
  using Module = attn::SelfAttention<S>;
  static Module make() {
    attn::manual_seed(1);
    return Module(4, 3, true);
  }
  static std::tuple<Input> inputs() { return Simple::inputs(); }
  static std::vector<std::string> names() {
    return {"W_query.weight", "W_query.bias",   "W_key.weight",
            "W_key.bias",     "W_value.weight", "W_value.bias"};
  }
  static constexpr bool kDropout = false;
};
struct SelfV1 {
  using Module = attn::SelfAttention<S>;
  static Module make() {
    attn::manual_seed(2);
    return Module(4, 3, attn::kRandInit);
  }
  static std::tuple<Input> inputs() { return Simple::inputs(); }
  static std::vector<std::string> names() { return {"W_query", "W_key", "W_value"}; }
  static constexpr bool kDropout = false;
};
struct Causal {
  using Module = attn::CausalAttention<S>;
  static Module make() {
    attn::manual_seed(3);
    return Module(4, 3, 9, 0.3);
  }
  static std::tuple<Input> inputs() { return Simple::inputs(); }
  static std::vector<std::string> names() {
    return {"W_query.weight", "W_key.weight", "W_value.weight"};
  }
  static constexpr bool kDropout = true;
};
struct Wrapper {
  using Module = attn::MultiHeadAttentionWrapper<S>;
  static Module make() {
    attn::manual_seed(4);
    return Module(4, 3, 9, 0.3, 2, true);
  }
  static std::tuple<Input> inputs() { return Simple::inputs(); }
  static std::vector<std::string> names() {
    std::vector<std::string> all;
    for (const std::string head : {"heads.0.", "heads.1."}) {
      for (const auto& name : SelfV2::names()) all.push_back(head + name);
    }
    return all;
  }
  static constexpr bool kDropout = true;
};
struct MhaNotebook {
  using Module = attn::MultiHeadAttention<S>;
  static Module make() {
    attn::manual_seed(5);
    return Module(4, 6, 9, 0.2, 2, true);
  }
  static std::tuple<Input> inputs() { return Simple::inputs(); }
  static std::vector<std::string> names() {
    return {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
  }
  static constexpr bool kDropout = true;
};
struct MhaKdimVdim {
  using Module = attn::MultiHeadAttention<S>;
  static Module make() {
    attn::TorchGenerator gen(6);
    return Module(attn::MultiHeadAttentionOptions::pytorch(6, 2, true, 5, 7, 0.1), gen);
  }
  static std::tuple<Input, Input, Input> inputs() {
    return {attn::test::random_tensor<S>(Shape<3>{2, 9, 6}, 7),
            attn::test::random_tensor<S>(Shape<3>{2, 11, 5}, 8),
            attn::test::random_tensor<S>(Shape<3>{2, 11, 7}, 9)};
  }
  static std::vector<std::string> names() {
    return {"q_proj_weight", "k_proj_weight",   "v_proj_weight",
            "in_proj_bias",  "out_proj.weight", "out_proj.bias"};
  }
  static constexpr bool kDropout = true;
};
struct Cross {
  using Module = attn::CrossAttention<S>;
  static Module make() {
    attn::manual_seed(10);
    return Module(6, 5, 8, 2, true, 0.1);
  }
  static std::tuple<Input, Input> inputs() {
    return {attn::test::random_tensor<S>(Shape<3>{2, 9, 6}, 11),
            attn::test::random_tensor<S>(Shape<3>{2, 11, 5}, 12)};
  }
  static std::vector<std::string> names() { return MhaKdimVdim::names(); }
  static constexpr bool kDropout = true;
};

template <class Case>
class ModuleApi : public ::testing::Test {
 protected:
  using Module = typename Case::Module;
  Module module = Case::make();
  decltype(Case::inputs()) inputs = Case::inputs();

  // Calls fn(views of the inputs...).
  template <class Fn>
  decltype(auto) with_inputs(Fn&& fn) const {
    return std::apply([&](const auto&... x) -> decltype(auto) { return fn(x.view()...); }, inputs);
  }
  // The same inputs as unbatched (T, features) views of batch item 0.
  template <class Fn>
  decltype(auto) with_unbatched(Fn&& fn) const {
    return std::apply(
        [&](const auto&... x) -> decltype(auto) { return fn(attn::select(x.view(), 0, 0)...); },
        inputs);
  }
  Tensor<S, 3> forward(const AttentionMask<S>& mask = {}) const {
    return with_inputs([&](auto... x) { return module.forward(x..., mask); });
  }
};
using Cases =
    ::testing::Types<Simple, SelfV2, SelfV1, Causal, Wrapper, MhaNotebook, MhaKdimVdim, Cross>;
TYPED_TEST_SUITE(ModuleApi, Cases, );

TYPED_TEST(ModuleApi, EveryForwardFormGivesTheSameBits) {
  this->module.eval();
  const Tensor<S, 3> y = this->forward();
  Tensor<S, 3> into(y.shape()), into_ws(y.shape());
  attn::Workspace ws;
  this->with_inputs([&](auto... x) { this->module.forward(x..., into.view()); });
  for (int call = 0; call < 2; ++call) {  // a cold, then a warm workspace
    this->with_inputs([&](auto... x) { this->module.forward(x..., into_ws.view(), ws); });
    EXPECT_TRUE(ref::same_bits(into_ws.view(), y.view()));
  }
  EXPECT_TRUE(ref::same_bits(into.view(), y.view()));
  // Unbatched: item 0 alone, allocating and into out.
  const Tensor<S, 2> y0 =
      this->with_unbatched([&](auto... x) { return this->module.forward(x...); });
  EXPECT_TRUE(ref::same_bits(y0.view(), attn::select(y.view(), 0, 0)));
  Tensor<S, 2> y0_into(y0.shape());
  this->with_unbatched([&](auto... x) { this->module.forward(x..., y0_into.view(), ws); });
  EXPECT_TRUE(ref::same_bits(y0_into.view(), y0.view()));
}

TYPED_TEST(ModuleApi, ForwardWithWeightsAllocatingAndIntoAgree) {
  this->module.eval();
  const auto r =
      this->with_inputs([&](auto... x) { return this->module.forward_with_weights(x...); });
  const Tensor<S, 3> y = this->forward();
  // The materialised path: the same maths as forward() (streaming), within rounding.
  EXPECT_LE(attn::test::max_abs_diff(r.output.view(), y.view()), 1e-12);
  auto out = Tensor<S, 3>(r.output.shape());
  auto weights = decltype(r.weights)(r.weights.shape());
  attn::Workspace ws;
  this->with_inputs(
      [&](auto... x) { this->module.forward_with_weights(x..., out.view(), weights.view(), ws); });
  EXPECT_TRUE(ref::same_bits(out.view(), r.output.view()));
  EXPECT_TRUE(ref::same_bits(weights.view(), r.weights.view()));
  // Every weights row of a query sums to one (no mask hides all keys here, dropout off).
  const auto rows = attn::test::to_vector(r.weights.view());
  const Index tk = r.weights.extent(r.weights.rank() - 1);
  for (std::size_t i = 0; i < rows.size(); i += static_cast<std::size_t>(tk)) {
    double sum = 0;
    for (Index j = 0; j < tk; ++j) sum += rows[i + static_cast<std::size_t>(j)];
    ASSERT_NEAR(sum, 1.0, 1e-12);
  }
  const auto r0 =
      this->with_unbatched([&](auto... x) { return this->module.forward_with_weights(x...); });
  EXPECT_TRUE(ref::same_bits(r0.weights.view(), attn::select(r.weights.view(), 0, 0)));
}

TYPED_TEST(ModuleApi, MasksReachTheKernel) {
  this->module.eval();
  const Tensor<S, 3> y = this->forward();
  const Index tq = y.extent(1),
              tk = std::get<std::tuple_size_v<decltype(this->inputs)> - 1>(this->inputs).extent(1);
  // Everything allowed: the same bits as no mask.
  const Tensor<bool, 2> all({tq, tk}, true);
  const Tensor<S, 3> y_all = this->forward(AttentionMask<S>().allowed(all.view()));
  EXPECT_TRUE(ref::same_bits(y_all.view(), y.view()));
  // Key 0 hidden from every query: a different result.
  Tensor<bool, 2> blocked({tq, tk}, false);
  for (Index i = 0; i < tq; ++i) blocked(i, 0) = true;
  const Tensor<S, 3> y_blocked = this->forward(AttentionMask<S>().blocked(blocked.view()));
  EXPECT_FALSE(ref::same_bits(y_blocked.view(), y.view()));
}

TYPED_TEST(ModuleApi, TrainEvalSeedAndFreezeBehaveAlike) {
  auto& m = this->module;
  EXPECT_TRUE(m.is_training());  // PyTorch modules start in training mode
  m.seed(7);
  const Tensor<S, 3> first = this->forward();
  m.seed(7);
  EXPECT_TRUE(ref::same_bits(this->forward().view(), first.view()));  // seeded: reproducible
  m.eval();
  EXPECT_FALSE(m.is_training());
  const Tensor<S, 3> y = this->forward();
  EXPECT_EQ(!ref::same_bits(first.view(), y.view()), TypeParam::kDropout);  // dropout in train()
  m.train();
  EXPECT_TRUE(m.is_training());
  m.eval();
  m.freeze();
  EXPECT_TRUE(m.is_frozen());
  EXPECT_TRUE(ref::same_bits(this->forward().view(), y.view()));
  m.unfreeze();
  EXPECT_EQ(m.is_frozen(), TypeParam::names().empty());  // nothing to pack: always frozen
  EXPECT_TRUE(ref::same_bits(this->forward().view(), y.view()));
}

TYPED_TEST(ModuleApi, NamedParametersAreTheStateDictNamesAsViews) {
  auto& m = this->module;
  m.eval();
  EXPECT_THAT(std::as_const(m).named_parameters().names(), ElementsAreArray(TypeParam::names()));
  const Tensor<S, 3> before = this->forward();
  m.freeze();
  auto params = m.named_parameters();  // views into the module; unfreezes it
  ASSERT_EQ(params.size(), TypeParam::names().size());
  if (params.empty()) return;
  EXPECT_FALSE(m.is_frozen());
  // Writing through a view changes the module (the frozen packs were dropped).
  const TensorView<S, 2> w = params[0].matrix();
  const S saved = w(0, 0);
  w(0, 0) += S(0.5);
  EXPECT_FALSE(ref::same_bits(this->forward().view(), before.view()));
  w(0, 0) = saved;
  EXPECT_TRUE(ref::same_bits(this->forward().view(), before.view()));
}

// ---- in place: out (and weights) over the inputs' memory ----

// Each input copied into the top-left corner of a buffer (B, max(T, T_q), max(features,
// d_out)), so that `out` (B, T_q, d_out) can be laid over any input's corner: over the query
// it is the usual in-place call (exactly x when d_out == features), over a key or value it
// is an output overwriting what the module still reads.
template <class Scalar>
TensorView<Scalar, 3> corner(Tensor<Scalar, 3>& buffer, Index t, Index features) {
  return attn::slice(attn::slice(buffer.view(), 1, 0, t), 2, 0, features);
}

template <class Case>
struct InPlace {
  std::vector<Tensor<S, 3>> buffers;
  decltype(Case::inputs()) inputs;

  InPlace(const decltype(Case::inputs())& original, Index tq, Index d_out) : inputs(original) {
    std::apply(
        [&](const auto&... x) {
          (buffers.emplace_back(
               Shape<3>{x.extent(0), std::max(x.extent(1), tq), std::max(x.extent(2), d_out)}),
           ...);
        },
        inputs);
    std::size_t i = 0;
    std::apply([&](const auto&... x) { (attn::copy(x.view(), view_of(i++, x)), ...); }, inputs);
  }
  TensorView<S, 3> view_of(std::size_t i, const Input& x) {
    return corner(buffers[i], x.extent(1), x.extent(2));
  }
  // Calls fn(the inputs as views of their buffers...).
  template <class Fn>
  decltype(auto) with_views(Fn&& fn) {
    return call(std::forward<Fn>(fn),
                std::make_index_sequence<std::tuple_size_v<decltype(Case::inputs())>>());
  }
  template <class Fn, std::size_t... I>
  decltype(auto) call(Fn&& fn, std::index_sequence<I...>) {
    return fn(TensorView<const S, 3>(view_of(I, std::get<I>(inputs)))...);
  }
};

TYPED_TEST(ModuleApi, InPlaceForwardIsCorrectOverEveryInput) {
  // MultiHeadAttentionWrapper::forward(x, x, ws) was wrong (error 0.22): its second head read
  // x after the first had written its slice. Every module now copies an input that shares
  // memory with out first, so the result is the out-of-place one, bit for bit.
  this->module.eval();
  const Tensor<S, 3> y = this->forward();
  const Index tq = y.extent(1), d_out = y.extent(2);
  constexpr std::size_t kInputs = std::tuple_size_v<decltype(TypeParam::inputs())>;
  attn::Workspace ws;
  for (std::size_t target = 0; target < kInputs; ++target) {
    SCOPED_TRACE("out over input " + std::to_string(target));
    InPlace<TypeParam> place(this->inputs, tq, d_out);
    // the reference: the same (strided) input views, out elsewhere
    const Tensor<S, 3> expected =
        place.with_views([&](auto... x) { return this->module.forward(x...); });
    EXPECT_LE(attn::test::max_abs_diff(expected.view(), y.view()), 1e-12);
    const TensorView<S, 3> out = corner(place.buffers[target], tq, d_out);
    place.with_views([&](auto... x) { this->module.forward(x..., out, ws); });
    EXPECT_TRUE(ref::same_bits(TensorView<const S, 3>(out), expected.view()));
    // forward_with_weights into out over the same input, and weights over another buffer
    InPlace<TypeParam> again(this->inputs, tq, d_out);
    const auto r =
        again.with_views([&](auto... x) { return this->module.forward_with_weights(x...); });
    auto weights = decltype(r.weights)(r.weights.shape());
    const TensorView<S, 3> out2 = corner(again.buffers[target], tq, d_out);
    again.with_views(
        [&](auto... x) { this->module.forward_with_weights(x..., out2, weights.view(), ws); });
    EXPECT_TRUE(ref::same_bits(TensorView<const S, 3>(out2), r.output.view()));
    EXPECT_TRUE(ref::same_bits(weights.view(), r.weights.view()));
  }
}

TYPED_TEST(ModuleApi, WeightsOverAnInputAreCorrect) {
  // The weights written over the query's memory: the inputs are copied first, as for out.
  this->module.eval();
  InPlace<TypeParam> place(this->inputs, 0, 0);
  const auto r =
      place.with_views([&](auto... x) { return this->module.forward_with_weights(x...); });
  // a buffer that starts with the query and is long enough for the weights
  Tensor<S, 1> buffer({std::max<Index>(r.weights.size(), place.buffers[0].size())});
  std::copy_n(place.buffers[0].data(), place.buffers[0].size(), buffer.data());
  const TensorView<const S, 3> query(buffer.data(), place.buffers[0].shape());
  auto weights =
      attn::reshape(attn::slice(buffer.view(), 0, 0, r.weights.size()), r.weights.shape());
  Tensor<S, 3> out(r.output.shape());
  attn::Workspace ws;
  place.with_views([&](auto, auto... rest) {
    this->module.forward_with_weights(query, rest..., out.view(), weights, ws);
  });
  EXPECT_TRUE(ref::same_bits(out.view(), r.output.view()));
  EXPECT_EQ(attn::test::to_vector(weights), r.weights.to_vector());
}

TYPED_TEST(ModuleApi, OutputsSharingMemoryWithEachOtherOrTheMaskAreShapeErrors) {
  this->module.eval();
  const auto r =
      this->with_inputs([&](auto... x) { return this->module.forward_with_weights(x...); });
  const Shape<3> out_shape = r.output.shape();
  const auto weights_shape = r.weights.shape();
  attn::Workspace ws;
  // weights over out
  Tensor<S, 1> shared({r.output.size() + r.weights.size()});
  const TensorView<S, 3> out(shared.data(), out_shape);
  const auto weights =
      attn::reshape(attn::slice(shared.view(), 0, 0, r.weights.size()), weights_shape);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                this->with_inputs(
                    [&](auto... x) { this->module.forward_with_weights(x..., out, weights, ws); });
              }),
              HasSubstr("overlaps out"));
  // out broadcast over the batch (a zero stride): both items would write one place
  Tensor<S, 2> rows({out_shape[1], out_shape[2]});
  const TensorView<S, 3> broadcast(rows.data(), out_shape, {0, out_shape[2], 1});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                this->with_inputs([&](auto... x) { this->module.forward(x..., broadcast, ws); });
              }),
              HasSubstr("share memory"));
  // an additive mask read from out's memory
  const Index tq = out_shape[1], tk = weights_shape[weights_shape.size() - 1];
  Tensor<S, 1> big({std::max(r.output.size(), tq * tk)});
  const TensorView<S, 3> out_big(big.data(), out_shape);
  const TensorView<const S, 2> additive(big.data(), {tq, tk});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                this->with_inputs([&](auto... x) {
                  this->module.forward(x..., out_big, ws, AttentionMask<S>().additive(additive));
                });
              }),
              HasSubstr("overlaps the additive mask"));
}

// ---- what is particular to one module ----

TEST(ModuleSpecifics, RawParametersAreTheTransposedWeights) {
  attn::manual_seed(123);
  const attn::SelfAttention<float> v1(3, 2, attn::kRandInit);
  const auto raw = v1.named_parameters();
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_THAT(raw[0].shape(), ElementsAre(3, 2));  // (d_in, d_out), applied as x @ W
  EXPECT_TRUE(ref::same_bits(raw[1].matrix(), attn::transpose(v1.w_key().weight())));
  const auto linear = v1.named_parameters(ParameterNames::kNotebook);
  EXPECT_THAT(linear.names(), ElementsAre("W_query.weight", "W_key.weight", "W_value.weight"));
  EXPECT_THAT(linear[0].shape(), ElementsAre(2, 3));
  // The module knows what it lacks, and why (for loaders' messages).
  ASSERT_EQ(linear.absent().size(), 3u);
  EXPECT_EQ(linear.absent()[0].name, "W_query.bias");
}

TEST(ModuleSpecifics, MultiHeadNamingsAndBuffers) {
  attn::manual_seed(1);
  const attn::MultiHeadAttention<float> mha(4, 6, 9, 0.0, 2, true);
  EXPECT_THAT(mha.named_parameters(ParameterNames::kNotebook).names(),
              ElementsAre("W_query.weight", "W_query.bias", "W_key.weight", "W_key.bias",
                          "W_value.weight", "W_value.bias", "out_proj.weight", "out_proj.bias"));
  EXPECT_THAT(mha.named_parameters(ParameterNames::kSeparateProjections).names(),
              ElementsAre("q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                          "out_proj.weight", "out_proj.bias"));
  EXPECT_TRUE(mha.named_buffers().empty());  // nn.MultiheadAttention has no buffers
  const auto buffers = mha.named_buffers(ParameterNames::kNotebook);
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].name, "mask");  // torch.triu(torch.ones(9, 9), diagonal=1)
  EXPECT_EQ(buffers[0].value.shape(), (Shape<2>{9, 9}));
  EXPECT_EQ(buffers[0].value(0, 1), 1.0f);
  EXPECT_EQ(buffers[0].value(1, 1), 0.0f);
  // The same memory under every naming.
  EXPECT_EQ(mha.named_parameters(ParameterNames::kNotebook)[2].matrix().data(),
            mha.named_parameters(ParameterNames::kSeparateProjections)[1].matrix().data());
}

TEST(ModuleSpecifics, SingleHeadModuleWritesAStridedOut) {
  attn::manual_seed(2);
  const attn::CausalAttention<float> ca(5, 4, 20, 0.0, true);
  const auto x = attn::test::random_tensor<float>(Shape<3>{2, 20, 5}, 3);
  const Tensor<float, 3> y = ca.forward(x.view());
  Tensor<float, 3> wide({2, 20, 8});
  const TensorView<float, 3> every_other(wide.data(), {2, 20, 4}, {160, 8, 2});
  attn::Workspace ws;
  ca.forward(x.view(), every_other, ws);
  EXPECT_TRUE(ref::same_bits(TensorView<const float, 3>(every_other), y.view()));
}

TEST(ModuleSpecifics, WrapperMaskPerHeadReachesEachHead) {
  attn::manual_seed(3);
  const attn::MultiHeadAttentionWrapper<float> wrapper(5, 4, 12, 0.0, 2);
  const auto x = attn::test::random_tensor<float>(Shape<3>{2, 12, 5}, 4);
  const auto per_head = ref::random_bools(Shape<4>{2, 2, 12, 12}, 5, 0.3);
  const Tensor<float, 3> y =
      wrapper.forward(x.view(), AttentionMask<float>().blocked(per_head.view()));
  for (Index h = 0; h < 2; ++h) {
    const auto own = attn::slice(per_head.view(), 1, h, h + 1);
    const Tensor<float, 3> alone =
        wrapper.head(h).forward(x.view(), AttentionMask<float>().blocked(own));
    EXPECT_TRUE(ref::same_bits(attn::slice(y.view(), 2, 4 * h, 4 * h + 4), alone.view()));
  }
  const auto three = ref::random_bools(Shape<4>{2, 3, 12, 12}, 6, 0.3);
  EXPECT_THROW(wrapper.forward(x.view(), AttentionMask<float>().blocked(three.view())),
               attn::ShapeError);
}

}  // namespace

}  // namespace module_test

#include "support/bodies_end.hpp"
