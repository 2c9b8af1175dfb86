// SPDX-License-Identifier: MIT
// tests/nn/linear_test.cpp: TorchGenerator (bit-exact torch.manual_seed streams) and Linear
// (PyTorch layout y = x W^T + b, init, any leading rank, strided inputs, shape errors).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "support/finite_difference.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace linear_test {

namespace {

using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

using attn::Index;
using attn::Linear;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

template <class Scalar, std::size_t Rank>
TensorView<const Scalar, Rank> cview(const Tensor<Scalar, Rank>& t) {
  return t.view();
}

// ---- TorchGenerator ----

TEST(TorchGenerator, RandFloatMatchesTorchManualSeed123) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123); print(torch.rand(6).tolist())"
  attn::manual_seed(123);
  const auto r = attn::rand<float>(Shape<1>{6});
  EXPECT_THAT(r.to_vector(),
              ElementsAre(0.29611194133758545f, 0.516562283039093f, 0.2516707181930542f,
                          0.6885567903518677f, 0.07397246360778809f, 0.866521954536438f));
}

TEST(TorchGenerator, RandDoubleMatchesTorchManualSeed123) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123);
  //   print([repr(v) for v in torch.rand(6, dtype=torch.float64).tolist()])"
  attn::manual_seed(123);
  const auto r = attn::rand<double>(Shape<1>{6});
  EXPECT_THAT(r.to_vector(),
              ElementsAre(0.368895870664273, 0.013365949855291825, 0.5917800383018739,
                          0.09263931233897627, 0.472451921042887, 0.5220316791666796));
}

TEST(TorchGenerator, Random64MatchesTorchFullRangeRandom) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123);
  //   print([v & (2**64-1) for v in torch.empty(3, dtype=torch.int64).random_(-2**63,
  //   None).tolist()])"
  attn::TorchGenerator gen(123);
  EXPECT_EQ(gen.random64(), 12847588855871978861ULL);
  EXPECT_EQ(gen.random64(), 5278339153051796802ULL);
  EXPECT_EQ(gen.random64(), 4184670734919783522ULL);
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123);
  //   print([hex(v) for v in torch.empty(2, dtype=torch.int64).random_(0, 2**32-1).tolist()])"
  // random64() is two 32-bit draws, high word first.
  gen.manual_seed(123);
  EXPECT_EQ(gen.random(), 0xb24bcdfeU);
  EXPECT_EQ(gen.random(), 0xb6843d6dU);
}

TEST(TorchGenerator, ReseedingRestartsTheStream) {
  attn::TorchGenerator gen(7);
  const auto a = attn::rand<float>(Shape<2>{3, 3}, gen);
  const auto b = attn::rand<float>(Shape<2>{3, 3}, gen);
  EXPECT_NE(a.to_vector(), b.to_vector());
  gen.manual_seed(7);
  EXPECT_EQ(attn::rand<float>(Shape<2>{3, 3}, gen).to_vector(), a.to_vector());
  // A local generator seeded 123 is the global one after manual_seed(123).
  attn::TorchGenerator local(123);
  attn::manual_seed(123);
  EXPECT_EQ(attn::rand<double>(Shape<1>{4}, local).to_vector(),
            attn::rand<double>(Shape<1>{4}).to_vector());
}

TEST(TorchGenerator, FillUniformStaysInRangeInRowMajorOrder) {
  attn::TorchGenerator gen(5);
  Tensor<double, 2> storage({4, 4}, -9.0);
  gen.fill_uniform(attn::transpose(attn::slice(storage.view(), 1, 0, 2)), -0.5, 0.25);  // (2, 4)
  for (Index i = 0; i < 4; ++i) {
    for (Index j = 0; j < 4; ++j) {
      if (j < 2) {
        EXPECT_GE(storage(i, j), -0.5);
        EXPECT_LT(storage(i, j), 0.25);
      } else {
        EXPECT_EQ(storage(i, j), -9.0);
      }
    }
  }
  // Same draws as filling a contiguous (2, 4) tensor: index order, not memory order.
  gen.manual_seed(5);
  Tensor<double, 2> dense({2, 4});
  gen.fill_uniform(dense.view(), -0.5, 0.25);
  EXPECT_EQ(storage(3, 1), dense(1, 3));
  EXPECT_EQ(storage(1, 0), dense(0, 1));
}

// ---- Linear: initialisation ----

TEST(Linear, ManualSeed123ReproducesTorchWeightsExactly) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123);
  //   print(torch.nn.Linear(3, 2, bias=False).weight.tolist())"
  attn::manual_seed(123);
  const Linear<float> layer(3, 2, /*bias=*/false);
  EXPECT_FALSE(layer.has_bias());
  EXPECT_THAT(layer.weight().shape(), ElementsAre(2, 3));
  EXPECT_THAT(attn::test::to_vector(layer.weight()),
              ElementsAre(-0.23542964458465576f, 0.019124476239085197f, -0.28674593567848206f,
                          0.21772661805152893f, -0.491934210062027f, 0.423223078250885f));
}

TEST(Linear, ManualSeed123ReproducesTorchWeightAndBias) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123); l = torch.nn.Linear(3, 2);
  //   print(l.weight.tolist(), l.bias.tolist())"
  attn::manual_seed(123);
  const Linear<float> layer(3, 2);
  EXPECT_THAT(attn::test::to_vector(layer.weight()),
              ElementsAre(-0.23542964458465576f, 0.019124476239085197f, -0.28674593567848206f,
                          0.21772661805152893f, -0.491934210062027f, 0.423223078250885f));
  EXPECT_THAT(attn::test::to_vector(layer.bias()),
              ElementsAre(-0.4196414053440094f, -0.45901766419410706f));
}

TEST(Linear, ManualSeed123ReproducesTorchFloat64Weights) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123);
  //   l = torch.nn.Linear(3, 2, dtype=torch.float64);
  //   print([repr(v) for v in l.weight.flatten().tolist()], [repr(v) for v in l.bias.tolist()])"
  // PyTorch's AVX2 uniform_ kernel evaluates unit * (to - from) + from with a fused
  // multiply-add; several of these values differ in the last bit without one (attn at -O0
  // before d28db50; PyTorch itself under ATEN_CPU_CAPABILITY=default prints
  // -0.15138600872770702 first), so this test pins down that rounding too.
  attn::manual_seed(123);
  const Linear<double> layer(3, 2);
  EXPECT_THAT(attn::test::to_vector(layer.weight()),
              ElementsAre(-0.151386008727707, -0.5619165996957702, 0.10597845963964207,
                          -0.4703796053567262, -0.03180978160309248, 0.025439991795163857));
  EXPECT_THAT(attn::test::to_vector(layer.bias()),
              ElementsAre(0.12133905932396792, 0.036137569002258466));
}

TEST(Linear, ForwardMatchesTorchFromSeed123) {
  // /usr/bin/python3 -c "import torch; torch.manual_seed(123); l = torch.nn.Linear(4, 3);
  //   x = torch.tensor([[0.43, 0.15, 0.89, 0.55], [0.87, 0.66, 0.57, 0.85]]); print(l(x).tolist())"
  attn::manual_seed(123);
  const Linear<float> layer(4, 3);
  const auto x =
      Tensor<float, 2>::from_rows({{0.43f, 0.15f, 0.89f, 0.55f}, {0.87f, 0.66f, 0.57f, 0.85f}});
  const auto y = layer.forward(x);
  EXPECT_THAT(y.to_vector(),
              Pointwise(FloatNear(1e-6f),
                        {-0.6268590688705444f, -0.9736558198928833f, -0.3469920754432678f,
                         -0.5720906257629395f, -0.9771435856819153f, -0.2552686333656311f}));
}

TEST(Linear, GeneratorConstructorDrawsFromThatGenerator) {
  attn::TorchGenerator gen(123);
  attn::manual_seed(999);
  const Linear<float> from_gen(3, 2, false, gen);
  EXPECT_EQ(from_gen.weight()(0, 0), -0.23542964458465576f);
  // ... and leaves the global generator alone.
  attn::TorchGenerator expected(999);
  EXPECT_EQ(attn::rand<float>(Shape<1>{2}).to_vector(),
            attn::rand<float>(Shape<1>{2}, expected).to_vector());

  Linear<float> layer(3, 2, false, gen);
  gen.manual_seed(123);
  layer.reset_parameters(gen);
  EXPECT_EQ(attn::test::to_vector(layer.weight()), attn::test::to_vector(from_gen.weight()));
}

template <class Scalar>
class LinearTest : public ::testing::Test {};
TYPED_TEST_SUITE(LinearTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(LinearTest, InitStaysWithinKaimingBounds) {
  // nn.Linear: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)).
  attn::TorchGenerator gen(2024);
  const Linear<TypeParam> layer(64, 32, true, gen);
  const double bound = 1.0 / std::sqrt(64.0);
  const auto w = attn::test::to_vector(layer.weight());
  const auto b = attn::test::to_vector(layer.bias());
  ASSERT_EQ(w.size(), 64u * 32u);
  ASSERT_EQ(b.size(), 32u);
  double w_max = 0, b_max = 0, w_sum = 0;
  for (const TypeParam v : w) {
    EXPECT_LE(std::abs(double(v)), bound);
    w_max = std::max(w_max, std::abs(double(v)));
    w_sum += double(v);
  }
  for (const TypeParam v : b) {
    EXPECT_LE(std::abs(double(v)), bound);
    b_max = std::max(b_max, std::abs(double(v)));
  }
  // The draws fill the range (2048 uniform draws reach within 1% of the bound).
  EXPECT_GT(w_max, 0.99 * bound);
  EXPECT_GT(b_max, 0.5 * bound);
  // Mean of 2048 draws of U(-b, b): standard deviation b / sqrt(3 * 2048) ~ 0.0016.
  EXPECT_LT(std::abs(w_sum / double(w.size())), 0.01);
}

TYPED_TEST(LinearTest, NegativeFeatureCountsThrowInvalidArgument) {
  using Layer = Linear<TypeParam>;
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([] { Layer(-1, 2); }),
              AllOf(HasSubstr("in_features=-1"), HasSubstr("out_features=2")));
  EXPECT_THAT(attn::test::thrown<std::invalid_argument>([] { Layer(3, -4); }),
              HasSubstr("out_features=-4"));
}

// ---- Linear: forward ----

template <class Scalar>
Linear<Scalar> known_layer(bool bias) {
  // W (2, 3) = [[1, 2, 3], [4, 5, 6]], b = [0.5, -1]
  Linear<Scalar> layer(3, 2, bias);
  layer.set_weight(Tensor<Scalar, 2>({2, 3}, {1, 2, 3, 4, 5, 6}));
  if (bias) layer.set_bias(Tensor<Scalar, 1>({2}, {Scalar(0.5), Scalar(-1)}));
  return layer;
}

TYPED_TEST(LinearTest, ComputesXTimesWTransposePlusBias) {
  const auto layer = known_layer<TypeParam>(true);
  EXPECT_EQ(layer.in_features(), 3);
  EXPECT_EQ(layer.out_features(), 2);
  const Tensor<TypeParam, 2> x({2, 3}, {1, 0, -1, 2, 1, 0});
  const auto y = layer.forward(x);
  EXPECT_THAT(y.shape(), ElementsAre(2, 2));
  // [1, 0, -1] . [1, 2, 3] + 0.5 = -1.5; . [4, 5, 6] - 1 = -3; [2, 1, 0] -> 4.5, 12
  EXPECT_THAT(y.to_vector(), ElementsAre(-1.5, -3, 4.5, 12));
}

TYPED_TEST(LinearTest, NoBiasFormOmitsTheBias) {
  const auto layer = known_layer<TypeParam>(false);
  EXPECT_FALSE(layer.has_bias());
  EXPECT_TRUE(layer.bias().empty());
  const Tensor<TypeParam, 2> x({2, 3}, {1, 0, -1, 2, 1, 0});
  EXPECT_THAT(layer.forward(x).to_vector(), ElementsAre(-2, -2, 4, 13));
}

TYPED_TEST(LinearTest, AcceptsAnyLeadingRank) {
  attn::TorchGenerator gen(11);
  const Linear<TypeParam> layer(5, 3, true, gen);
  const auto x3 = attn::test::random_tensor<TypeParam, 3>({2, 4, 5}, 1);
  const auto rows = attn::reshape(cview(x3), Shape<2>{8, 5});
  const auto y2 = layer.forward(rows);
  const auto y3 = layer.forward(x3);
  EXPECT_THAT(y3.shape(), ElementsAre(2, 4, 3));
  EXPECT_EQ(y3.to_vector(), y2.to_vector());

  const auto y4 = layer.forward(attn::reshape(cview(x3), Shape<4>{2, 2, 2, 5}));
  EXPECT_THAT(y4.shape(), ElementsAre(2, 2, 2, 3));
  EXPECT_EQ(y4.to_vector(), y2.to_vector());

  const auto y1 = layer.forward(attn::select(rows, 0, 5));  // a single (5) vector
  EXPECT_THAT(y1.shape(), ElementsAre(3));
  EXPECT_EQ(y1.to_vector(), attn::test::row(y2, 5));
}

TYPED_TEST(LinearTest, MatchesALoopReference) {
  attn::TorchGenerator gen(3);
  const Linear<TypeParam> layer(17, 9, true, gen);
  const auto x = attn::test::random_tensor<TypeParam, 2>({6, 17}, 2);
  const auto y = layer.forward(x);
  const auto w = layer.weight();
  const auto b = layer.bias();
  for (Index i = 0; i < 6; ++i) {
    for (Index o = 0; o < 9; ++o) {
      double ref = double(b(o));
      for (Index k = 0; k < 17; ++k) ref += double(x(i, k)) * double(w(o, k));
      EXPECT_NEAR(double(y(i, o)), ref, attn::test::reduction_tolerance<TypeParam>(17))
          << i << "," << o;
    }
  }
}

TYPED_TEST(LinearTest, NonContiguousInputAndOutput) {
  attn::TorchGenerator gen(4);
  const Linear<TypeParam> layer(3, 4, true, gen);
  const auto storage = attn::test::random_tensor<TypeParam, 2>({3, 5}, 9);
  const auto xt = attn::transpose(cview(storage));  // (5, 3), strides (1, 5)
  ASSERT_FALSE(xt.is_contiguous());
  const auto expected = layer.forward(cview(attn::contiguous(xt)));
  EXPECT_EQ(layer.forward(xt).to_vector(), expected.to_vector());

  // Output into a column block of a wider tensor; the other columns stay put.
  Tensor<TypeParam, 2> wide({5, 6}, TypeParam(-7));
  layer.forward(xt, attn::slice(wide.view(), 1, 1, 5));
  for (Index i = 0; i < 5; ++i) {
    EXPECT_EQ(wide(i, 0), TypeParam(-7));
    EXPECT_EQ(wide(i, 5), TypeParam(-7));
    for (Index o = 0; o < 4; ++o) EXPECT_EQ(wide(i, 1 + o), expected(i, o));
  }
  // A strided batch of (B, T, D) also works.
  const auto x3 = attn::test::random_tensor<TypeParam, 3>({4, 2, 3}, 5);
  const auto every_other = attn::permute(cview(x3), {1, 0, 2});  // (2, 4, 3)
  const auto y = layer.forward(every_other);
  const auto y_ref = layer.forward(cview(attn::contiguous(every_other)));
  EXPECT_EQ(y.to_vector(), y_ref.to_vector());
}

TYPED_TEST(LinearTest, InPlaceForwardIsCorrect) {
  // y over x's memory (in == out features): the GEMM wrote rows of y while it still read
  // them as x. 200 features span several column tiles and micro-panels on every ISA.
  attn::TorchGenerator gen(6);
  for (const bool frozen : {false, true}) {
    Linear<TypeParam> layer(200, 200, true, gen);
    if (frozen) layer.freeze();
    auto x = attn::test::random_tensor<TypeParam, 3>({2, 7, 200}, 8);
    const auto expected = layer.forward(cview(x));
    layer.forward(cview(x), x.view());
    EXPECT_EQ(x.to_vector(), expected.to_vector()) << (frozen ? "frozen" : "unfrozen");
  }
  // y partly over x (shifted by one row), through a strided view
  const Linear<TypeParam> small(4, 4, false, gen);
  Tensor<TypeParam, 2> buffer = attn::test::random_tensor<TypeParam, 2>({6, 4}, 9);
  const auto x = attn::slice(cview(buffer), 0, 0, 5);
  const auto expected = small.forward(x);
  small.forward(x, attn::slice(buffer.view(), 0, 1, 6));
  EXPECT_EQ(attn::test::to_vector(attn::slice(cview(buffer), 0, 1, 6)), expected.to_vector());
}

TYPED_TEST(LinearTest, OutputWhoseElementsShareMemoryIsRejected) {
  attn::TorchGenerator gen(7);
  const Linear<TypeParam> layer(3, 2, true, gen);
  const auto x = attn::test::random_tensor<TypeParam, 2>({4, 3}, 1);
  Tensor<TypeParam, 1> row({2});
  const TensorView<TypeParam, 2> broadcast(row.data(), {4, 2}, {0, 1});
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([&] { layer.forward(cview(x), broadcast); }),
      AllOf(HasSubstr("Linear::forward"), HasSubstr("y has shape (4, 2) and strides (0, 1)")));
}

TYPED_TEST(LinearTest, ForwardRejectsWrongShapesNamingThem) {
  attn::TorchGenerator gen(1);
  const Linear<TypeParam> layer(3, 2, true, gen);
  const Tensor<TypeParam, 3> x({2, 6, 4});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { layer.forward(x); }),
              AllOf(HasSubstr("Linear::forward"), HasSubstr("(2, 6, 4)"), HasSubstr("(..., 3)")));
  const Tensor<TypeParam, 3> good({2, 6, 3});
  Tensor<TypeParam, 3> y({2, 5, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { layer.forward(cview(good), y.view()); }),
              AllOf(HasSubstr("(2, 6, 3)"), HasSubstr("(2, 5, 2)")));
}

TYPED_TEST(LinearTest, SetWeightAndBiasCheckShapes) {
  attn::TorchGenerator gen(1);
  Linear<TypeParam> layer(3, 2, true, gen);
  const Tensor<TypeParam, 2> wrong({3, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { layer.set_weight(wrong); }),
              AllOf(HasSubstr("set_weight"), HasSubstr("(3, 2)"), HasSubstr("expected (2, 3)")));
  const Tensor<TypeParam, 1> wrong_bias({3});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { layer.set_bias(wrong_bias); }),
              AllOf(HasSubstr("set_bias"), HasSubstr("(3)"), HasSubstr("expected (2)")));
  // A transposed (strided) weight is copied element by element.
  const Tensor<TypeParam, 2> wt({3, 2}, {1, 4, 2, 5, 3, 6});
  layer.set_weight(attn::transpose(cview(wt)));
  EXPECT_THAT(attn::test::to_vector(layer.weight()), ElementsAre(1, 2, 3, 4, 5, 6));
  // Writes through weight() land in the layer.
  layer.weight()(0, 0) = TypeParam(10);
  EXPECT_EQ(std::as_const(layer).weight()(0, 0), TypeParam(10));

  Linear<TypeParam> no_bias(3, 2, false, gen);
  const Tensor<TypeParam, 1> bias({2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { no_bias.set_bias(bias); }),
              HasSubstr("bias=false"));
}

// /usr/bin/python3 -c "import torch; l = torch.nn.Linear(0, 2);
// torch.nn.init.constant_(l.bias, 1.0);
//   print(l(torch.zeros(3, 0)))"  -> every row is the bias. (attn computes the row count as
// x.size() / in_features, which is 0 here, so nothing is written.)
TYPED_TEST(LinearTest, ZeroInputFeaturesGiveTheBias) {
  Linear<TypeParam> layer(0, 2, true);
  layer.set_bias(Tensor<TypeParam, 1>({2}, {TypeParam(1), TypeParam(2)}));
  const Tensor<TypeParam, 2> x({3, 0});
  EXPECT_THAT(layer.forward(x).to_vector(), ElementsAre(1, 2, 1, 2, 1, 2));
}

// A caller holding a mutable view (a Tensor's view(), a slice of a workspace) must not need
// to spell TensorView<const Scalar, Rank>(v) first. (Before ad78264, Rank was deduced from a
// TensorView<const Scalar, Rank> parameter, so `layer.forward(t.view())` did not compile.)
template <class Layer, class X, class = void>
struct AcceptsView : std::false_type {};
template <class Layer, class X>
struct AcceptsView<Layer, X,
                   std::void_t<decltype(std::declval<const Layer&>().forward(std::declval<X>()))>>
    : std::true_type {};

// freeze() packs the weight once; results stay bit for bit, and every way of writing the
// weight through the layer drops the pack. A 700 x 300 weight spans several GEMM tiles.
TYPED_TEST(LinearTest, FrozenIsBitIdenticalAndWeightWritesUnfreeze) {
  using Scalar = TypeParam;
  attn::TorchGenerator gen(5);
  Linear<Scalar> layer(300, 700, true, gen);
  const auto x = attn::test::random_tensor<Scalar>(Shape<3>{2, 9, 300}, 6);
  const Tensor<Scalar, 3> expected = layer.forward(x.view());
  EXPECT_FALSE(layer.is_frozen());
  layer.freeze();
  EXPECT_TRUE(layer.is_frozen());
  EXPECT_EQ(layer.forward(x.view()).to_vector(), expected.to_vector());
  const Linear<Scalar> copy = layer;  // a copy keeps its own pack
  EXPECT_TRUE(copy.is_frozen());
  EXPECT_EQ(copy.forward(x.view()).to_vector(), expected.to_vector());
  layer.weight()(3, 4) += Scalar(1);
  EXPECT_FALSE(layer.is_frozen());
  EXPECT_NE(layer.forward(x.view()).to_vector(), expected.to_vector());
  layer.freeze();
  layer.set_weight(copy.weight());
  EXPECT_FALSE(layer.is_frozen());
  EXPECT_EQ(layer.forward(x.view()).to_vector(), expected.to_vector());
  layer.freeze();
  static_cast<void>(layer.named_parameters());
  EXPECT_FALSE(layer.is_frozen());
  layer.freeze();
  layer.unfreeze();
  EXPECT_FALSE(layer.is_frozen());
}

TYPED_TEST(LinearTest, NamedParametersAreWeightAndBias) {
  using Scalar = TypeParam;
  Linear<Scalar> with_bias(3, 2, true), without(3, 2, false);
  const auto params = with_bias.named_parameters();
  EXPECT_THAT(params.names(), ElementsAre("weight", "bias"));
  EXPECT_EQ(params[0].matrix().data(), with_bias.weight().data());
  EXPECT_THAT(params[1].shape(), ElementsAre(2));
  EXPECT_EQ(params[1].vector().data(), with_bias.bias().data());
  const auto lacking = std::as_const(without).named_parameters();
  EXPECT_THAT(lacking.names(), ElementsAre("weight"));
  ASSERT_EQ(lacking.absent().size(), 1u);
  EXPECT_EQ(lacking.absent()[0].name, "bias");
}

TEST(Linear, ForwardAcceptsMutableViews) {
  EXPECT_TRUE((AcceptsView<Linear<float>, TensorView<const float, 2>>::value));
  EXPECT_TRUE((AcceptsView<Linear<float>, TensorView<float, 2>>::value))
      << "Linear::forward(TensorView<float, 2>) does not compile; callers must convert to a "
         "const view by hand";
}

// ---- backward ----

// Central differences in double: y = x W^T + b with x (2, 3, 5) (and a strided x, every
// other row of a larger tensor), loss sum(w * y).
TEST(LinearBackward, MatchesFiniteDifferencesForInputWeightAndBias) {
  attn::manual_seed(3);
  for (const bool bias : {true, false}) {
    Linear<double> layer(5, 4, bias);
    auto big = attn::test::random_tensor<double>(attn::Shape<3>{2, 6, 5}, 1);
    const TensorView<double, 3> x(big.data(), {2, 3, 5}, {30, 10, 1});  // every other row
    const auto w = attn::test::random_tensor<double>(attn::Shape<3>{2, 3, 4}, 2);
    attn::Gradients<double> grads(layer.named_parameters());
    Tensor<double, 3> gx({2, 3, 5});
    layer.backward(x, w.view(), gx.view(), grads);
    const auto loss = [&] {
      return attn::test::fd::weighted_sum(layer.forward(x).view(), w.view());
    };
    std::vector<attn::test::fd::Variable> vars{
        attn::test::fd::variable("x", x, gx.view()),
        attn::test::fd::variable("weight", layer.weight(), grads.at("weight").matrix())};
    if (bias)
      vars.push_back(attn::test::fd::variable("bias", layer.bias(), grads.at("bias").vector()));
    EXPECT_TRUE(attn::test::fd::check(loss, vars)) << "bias " << bias;
  }
}

// The backward adds: twice gives twice, into a strided grad_x too; an empty grad_x is skipped.
TEST(LinearBackward, AddsIntoTheGradientsAndSkipsAnEmptyInputGradient) {
  attn::manual_seed(4);
  Linear<float> layer(7, 3);
  const auto x = attn::test::random_tensor<float>(attn::Shape<2>{9, 7}, 5);
  const auto w = attn::test::random_tensor<float>(attn::Shape<2>{9, 3}, 6);
  attn::Gradients<float> grads(layer.named_parameters());
  Tensor<float, 2> big({9, 14});
  const TensorView<float, 2> gx(big.data(), {9, 7}, {14, 1});  // strided rows
  attn::Workspace ws;
  layer.backward(x.view(), w.view(), gx, grads, ws);
  const auto once = attn::test::to_vector(gx);
  const auto w_once = attn::test::to_vector(grads.at("weight").matrix());
  layer.backward(x.view(), w.view(), TensorView<float, 2>(), grads, ws);
  EXPECT_EQ(attn::test::to_vector(gx), once);
  const auto w_twice = attn::test::to_vector(grads.at("weight").matrix());
  for (std::size_t i = 0; i < w_once.size(); ++i) EXPECT_FLOAT_EQ(w_twice[i], 2 * w_once[i]);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { layer.backward(x.view(), x.view(), gx, grads, ws); }),
              ::testing::HasSubstr("grad_y (9, 7)"));
  Linear<float> other(7, 3);
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { other.backward(x.view(), w.view(), gx, grads, ws); }),
              ::testing::HasSubstr("Gradients::of"));
}

// bfloat16 and float16 layers: the backward against a double layer holding the same rounded
// weights and bias, on the same rounded x (strided: the contiguous-copy path) and grad_y. Each
// gradient is a sum of exact products (16-bit operands) in float, rounded once into the 16-bit
// gradient: off by at most half its ulp, 2^-8 (bfloat16) or 2^-11 (float16) of its magnitude,
// plus the float sums' error (37 or 18 terms of O(1): under 1e-5 of the largest). Normalised
// to each tensor's largest element, the bound is that half ulp plus 1e-5; a dropped or
// transposed term is off by 10 % or more. grad_x starts at zero, so it is also one rounding.
template <class Narrow>
void check_narrow_backward(double half_ulp) {
  attn::manual_seed(6);
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    const Linear<Narrow> layer(37, 21, bias);
    Linear<double> wide(37, 21, bias);
    wide.set_weight(attn::convert<double>(layer.weight()));
    if (bias) wide.set_bias(attn::convert<double>(layer.bias()));
    const auto big =
        attn::convert<Narrow>(attn::test::random_tensor<float>(Shape<3>{2, 18, 37}, 7));
    const TensorView<const Narrow, 3> x(big.data(), {2, 9, 37}, {18 * 37, 2 * 37, 1});  // strided
    const auto gy = attn::convert<Narrow>(attn::test::random_tensor<float>(Shape<3>{2, 9, 21}, 8));
    attn::Gradients<Narrow> grads(layer.named_parameters());
    Tensor<Narrow, 3> gx({2, 9, 37});
    gx.fill(Narrow(0.0f));
    attn::Workspace ws;
    layer.backward(x, gy.view(), gx.view(), grads, ws);
    attn::Gradients<double> wide_grads(wide.named_parameters());
    Tensor<double, 3> wide_gx({2, 9, 37});
    wide_gx.fill(0.0);
    wide.backward(attn::convert<double>(x).view(), attn::convert<double>(gy.view()).view(),
                  wide_gx.view(), wide_grads);
    const auto error = [](const auto& got, const auto& want) {
      double scale = 0, err = 0;
      for (Index i = 0; i < want.size(); ++i) {
        const double w = want.data()[i], g = static_cast<double>(got.data()[i]);
        scale = std::max(scale, std::abs(w));
        err = std::max(err, std::abs(g - w));
      }
      return err / scale;
    };
    EXPECT_LE(error(gx, wide_gx), half_ulp + 1e-5) << "grad_x";
    EXPECT_LE(error(attn::Tensor<Narrow, 2>(grads.at("weight").matrix()),
                    attn::Tensor<double, 2>(wide_grads.at("weight").matrix())),
              half_ulp + 1e-5)
        << "grad_weight";
    if (bias) {
      EXPECT_LE(error(attn::Tensor<Narrow, 1>(grads.at("bias").vector()),
                      attn::Tensor<double, 1>(wide_grads.at("bias").vector())),
                half_ulp + 1e-5)
          << "grad_bias";
    }
  }
}

TEST(LinearBackward, Bfloat16MatchesTheDoubleLayer) {
  check_narrow_backward<attn::bfloat16>(1.0 / 256);
}
TEST(LinearBackward, Float16MatchesTheDoubleLayer) {
  check_narrow_backward<attn::float16>(1.0 / 2048);
}

}  // namespace

}  // namespace linear_test

#include "support/bodies_end.hpp"
