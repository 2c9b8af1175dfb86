// SPDX-License-Identifier: MIT
// tests/nn/parameter_test.cpp: NamedParameter and ParameterList (attn/nn/parameter.hpp), the
// (name, view) list every module's named_parameters() returns.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "attn/attn.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace parameter_test {

namespace {

using attn::NamedParameter;
using attn::ParameterList;
using attn::Tensor;
using attn::TensorView;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(NamedParameter, MatrixAndVectorViewTheirData) {
  Tensor<float, 2> w({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor<float, 1> b({3}, {7, 8, 9});
  const NamedParameter<float> weight("weight", w.view());
  const NamedParameter<float> bias("bias", b.view());
  EXPECT_EQ(weight.rank(), 2u);
  EXPECT_THAT(weight.shape(), ElementsAre(2, 3));
  EXPECT_EQ(weight.size(), 6);
  EXPECT_EQ(bias.rank(), 1u);
  EXPECT_THAT(bias.shape(), ElementsAre(3));
  EXPECT_EQ(bias.matrix().shape(), (attn::Shape<2>{1, 3}));  // a vector as one row
  bias.vector()(2) = 10;                                     // writes go into the tensor
  EXPECT_EQ(b(2), 10.0f);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { weight.vector(); }),
              HasSubstr("'weight' has shape (2, 3)"));
  // A transposed view is a parameter too (SelfAttention_v1's raw W, (d_in, d_out)).
  const NamedParameter<float> raw("W", attn::transpose(w.view()));
  EXPECT_THAT(raw.shape(), ElementsAre(3, 2));
  EXPECT_EQ(raw.matrix()(2, 1), 6.0f);
  // Mutable converts to read-only.
  const NamedParameter<const float> read_only = weight;
  EXPECT_EQ(read_only.matrix().data(), w.data());
}

TEST(ParameterList, KeepsOrderPrefixesSubmodulesAndRecordsAbsentNames) {
  Tensor<double, 2> w({2, 2});
  Tensor<double, 1> b({2});
  ParameterList<double> layer;
  layer.add("weight", w.view()).add("bias", TensorView<double, 1>());  // no bias: absent
  EXPECT_THAT(layer.names(), ElementsAre("weight"));
  ASSERT_EQ(layer.absent().size(), 1u);
  EXPECT_EQ(layer.absent()[0].name, "bias");
  EXPECT_THAT(layer.absent()[0].reason, HasSubstr("built without that bias"));
  ParameterList<double> module;
  module.add("in_proj_bias", b.view()).append("out_proj.", layer);
  EXPECT_THAT(module.names(), ElementsAre("in_proj_bias", "out_proj.weight"));
  EXPECT_EQ(module.absent()[0].name, "out_proj.bias");
  ASSERT_NE(module.find("out_proj.weight"), nullptr);
  EXPECT_EQ(module.find("out_proj.weight")->matrix().data(), w.data());
  EXPECT_EQ(module.find("weight"), nullptr);
  const ParameterList<const double> read_only = module;
  EXPECT_EQ(read_only.size(), 2u);
  EXPECT_EQ(read_only.absent().size(), 1u);
}

}  // namespace

}  // namespace parameter_test

#include "support/bodies_end.hpp"
