// SPDX-License-Identifier: MIT
// tests/attention/qkv_projection_test.cpp: QkvProjection (attn/attention/qkv_projection.hpp):
// its storage follows the input sizes, project() is x W^T + b written head-major for every
// storage and call form (bit for bit the Linear product: the same GEMM), with as many or fewer
// key/value heads (grouped-query, multi-query), freezing changes no bit, and the initialisers
// draw what PyTorch draws.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "attention/reference_attention.hpp"
#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace qkv_projection_test {
namespace {

using attn::Index;
using attn::QkvProjection;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace ref = attn::test::ref;

template <class Scalar>
class QkvProjectionTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(QkvProjectionTest, Scalars, );

/// x (B, T, in) W^T + b as (B, H, T, hd), through Linear's path.
template <class Scalar>
Tensor<Scalar, 4> linear_heads(TensorView<const Scalar, 3> x, attn::LinearView<const Scalar> w,
                               Index heads) {
  const Tensor<Scalar, 3> y = w.forward(x);
  return Tensor<Scalar, 4>(attn::split_heads(y.view(), heads));
}

struct Dims {
  Index d_in, kdim, vdim;
};

struct Heads {
  Index heads, kv_heads;
};

TYPED_TEST(QkvProjectionTest, ProjectIsLinearPerHeadForEveryStorageAndCallForm) {
  using Scalar = TypeParam;
  const Index b = 2, tq = 7, tk = 13, hd = 24;  // hd does not divide a micro-panel
  for (const Heads hh : {Heads{3, 3}, Heads{3, 1}, Heads{4, 2}})
    for (const Dims dims : {Dims{16, 16, 16}, Dims{16, 10, 10}, Dims{16, 10, 12}}) {
      const Index heads = hh.heads, kv_heads = hh.kv_heads;
      SCOPED_TRACE("d_in=" + std::to_string(dims.d_in) + " kdim=" + std::to_string(dims.kdim) +
                   " vdim=" + std::to_string(dims.vdim) + " H=" + std::to_string(heads) +
                   " H_kv=" + std::to_string(kv_heads));
      QkvProjection<Scalar> proj(dims.d_in, dims.kdim, dims.vdim, heads, hd, true, kv_heads);
      EXPECT_EQ(proj.fused(), dims.kdim == dims.d_in && dims.vdim == dims.d_in);
      EXPECT_EQ(proj.width(), heads * hd);
      EXPECT_EQ(proj.num_kv_heads(), kv_heads);
      EXPECT_EQ(proj.weight(1).shape(), (Shape<2>{kv_heads * hd, dims.kdim}));
      EXPECT_EQ(proj.weight(2).shape(), (Shape<2>{kv_heads * hd, dims.vdim}));
      EXPECT_EQ(proj.bias(2).extent(0), kv_heads * hd);
      EXPECT_EQ(proj.fused_bias().extent(0), (heads + 2 * kv_heads) * hd);
      EXPECT_EQ(proj.bias(2).data(), proj.fused_bias().data() + (heads + kv_heads) * hd);
      attn::TorchGenerator gen(1);
      proj.init_linear(gen);
      const auto query = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, dims.d_in}, 2);
      const auto key = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, dims.kdim}, 3);
      const auto value = attn::test::random_tensor<Scalar>(Shape<3>{b, tk, dims.vdim}, 4);
      const auto w = [&](int p) {
        const QkvProjection<Scalar>& c = proj;
        return attn::LinearView<const Scalar>(c.weight(p), c.bias(p));
      };
      const auto check = [&](const typename QkvProjection<Scalar>::Heads& h,
                             TensorView<const Scalar, 3> q, TensorView<const Scalar, 3> k,
                             TensorView<const Scalar, 3> v) {
        EXPECT_TRUE(ref::same_bits(h.query, linear_heads(q, w(0), heads).view()));
        EXPECT_TRUE(ref::same_bits(h.key, linear_heads(k, w(1), kv_heads).view()));
        EXPECT_TRUE(ref::same_bits(h.value, linear_heads(v, w(2), kv_heads).view()));
      };
      for (const bool frozen : {false, true}) {
        SCOPED_TRACE(frozen ? "frozen" : "packed per call");
        if (frozen) proj.freeze();
        EXPECT_EQ(proj.is_frozen(), frozen);
        attn::Workspace ws;
        if (proj.fused()) {  // self-attention: one GEMM into (B, H + 2 H_kv, T, hd)
          const auto h = proj.project(query.view(), query.view(), query.view(), ws);
          EXPECT_EQ(h.key.data(), h.query.data() + tq * heads * hd);
          check(h, query.view(), query.view(), query.view());
        }
        if (dims.kdim == dims.vdim) {  // key == value: one GEMM for K and V
          const auto h = proj.project(query.view(), key.view(), key.view(), ws);
          EXPECT_EQ(h.value.data(), h.key.data() + tk * kv_heads * hd);
          check(h, query.view(), key.view(), key.view());
        }
        check(proj.project(query.view(), key.view(), value.view(), ws), query.view(), key.view(),
              value.view());
        // A strided query is staged contiguously first.
        const auto wide = attn::test::random_tensor<Scalar>(Shape<3>{b, tq, dims.d_in + 5}, 5);
        const auto strided =
            attn::slice(TensorView<const Scalar, 3>(wide.view()), 2, 1, 1 + dims.d_in);
        check(proj.project(strided, key.view(), value.view(), ws), strided, key.view(),
              value.view());
      }
      static_cast<void>(proj.weight(0));  // a non-const weight view unfreezes
      EXPECT_FALSE(proj.is_frozen());
    }
}

TYPED_TEST(QkvProjectionTest, GroupedQueryFusedWeightIsStackedQThenKThenV) {
  using Scalar = TypeParam;
  const Index d = 8, heads = 4, kv_heads = 2, hd = 3;
  QkvProjection<Scalar> proj(d, d, d, heads, hd, true, kv_heads);
  const Index rows = (heads + 2 * kv_heads) * hd;
  const auto w = attn::test::random_tensor<Scalar>(Shape<2>{rows, d}, 1);
  const auto bias = attn::test::random_tensor<Scalar>(Shape<1>{rows}, 2);
  proj.set_fused(w.view(), bias.view(), attn::QkvLayout::kStacked, "test");
  const QkvProjection<Scalar>& c = proj;
  EXPECT_TRUE(ref::same_bits(c.weight(0), attn::slice(w.view(), 0, 0, 12)));
  EXPECT_TRUE(ref::same_bits(c.weight(1), attn::slice(w.view(), 0, 12, 18)));
  EXPECT_TRUE(ref::same_bits(c.weight(2), attn::slice(w.view(), 0, 18, 24)));
  EXPECT_TRUE(ref::same_bits(c.bias(1), attn::slice(bias.view(), 0, 12, 18)));
  const auto wrong = attn::test::random_tensor<Scalar>(Shape<2>{3 * heads * hd, d}, 3);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>(
                  [&] { proj.set_fused(wrong.view(), {}, attn::QkvLayout::kStacked, "test"); }),
              HasSubstr("expected (24, 8)"));
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { proj.set_fused(w.view(), {}, attn::QkvLayout::kPerHead, "test"); }),
              AllOf(HasSubstr("per-head"), HasSubstr("num_kv_heads == num_heads")));
}

TYPED_TEST(QkvProjectionTest, InitialisersDrawWhatPyTorchDraws) {
  using Scalar = TypeParam;
  QkvProjection<Scalar> proj(5, 5, 5, 2, 3, true);
  attn::TorchGenerator gen(123), reference(123);
  proj.init_linear(gen);
  for (int p = 0; p < 3; ++p) {  // three nn.Linear(5, 6) in a row: weight then bias each
    const attn::Linear<Scalar> layer(5, 6, true, reference);
    EXPECT_TRUE(ref::same_bits(std::as_const(proj).weight(p), layer.weight()));
    EXPECT_TRUE(ref::same_bits(std::as_const(proj).bias(p), layer.bias()));
  }
  QkvProjection<Scalar> raw(4, 4, 4, 1, 3, false);
  attn::TorchGenerator gen_raw(7), reference_raw(7);
  raw.init_rand(gen_raw);
  for (int p = 0; p < 3; ++p) {  // torch.rand(d_in, d_out), stored transposed
    const auto w = attn::rand<Scalar>(Shape<2>{4, 3}, reference_raw);
    EXPECT_TRUE(ref::same_bits(std::as_const(raw).weight(p), attn::transpose(w.view())));
  }
  attn::TorchGenerator gen_xavier(9);
  proj.init_xavier(gen_xavier);  // biases zero; the weights within xavier's bound
  for (const Scalar v : attn::test::to_vector(std::as_const(proj).fused_bias())) EXPECT_EQ(v, 0);
  const double bound = attn::detail::xavier_uniform_bound(5, 18);
  for (const Scalar v : attn::test::to_vector(std::as_const(proj).fused_weight("test"))) {
    EXPECT_LE(std::abs(static_cast<double>(v)), bound);
  }
}

TYPED_TEST(QkvProjectionTest, FusedWeightExistsOnlyWhenTheDimsAgree) {
  using Scalar = TypeParam;
  QkvProjection<Scalar> proj(6, 4, 4, 2, 3, false);
  EXPECT_FALSE(proj.fused());
  EXPECT_THAT(attn::test::thrown<attn::ConfigError>(
                  [&] { proj.fused_weight("MultiHeadAttention::in_proj_weight"); }),
              AllOf(HasSubstr("attn::MultiHeadAttention::in_proj_weight"),
                    HasSubstr("kdim=4 and vdim=4 differ from d_in=6")));
  EXPECT_EQ(proj.weight(1).shape(), (Shape<2>{6, 4}));
  EXPECT_FALSE(proj.has_bias());
  EXPECT_EQ(proj.bias(0).data(), nullptr);
}

}  // namespace
}  // namespace qkv_projection_test

#include "support/bodies_end.hpp"
