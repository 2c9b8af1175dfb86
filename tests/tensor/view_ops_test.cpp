// SPDX-License-Identifier: MIT
// tests/tensor/view_ops_test.cpp: slice, select, permute/transpose, unsqueeze, reshape
// (PyTorch's view rules), split_heads/merge_heads, copy and contiguous.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace view_ops_test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

/// torch.arange(n).view(shape): element i holds i.
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> arange(const Shape<Rank>& shape) {
  Tensor<Scalar, Rank> t(shape);
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = Scalar(i);
  return t;
}

template <class Scalar>
class ViewOpsTest : public ::testing::Test {};
TYPED_TEST_SUITE(ViewOpsTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

// ---- slice ----

TYPED_TEST(ViewOpsTest, SliceNarrowsOneAxisWithoutCopying) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto s = attn::slice(x.view(), 1, 2, 5);  // x[:, 2:5, :]
  EXPECT_THAT(s.shape(), ElementsAre(2, 3, 4));
  EXPECT_THAT(s.strides(), ElementsAre(24, 4, 1));
  EXPECT_EQ(s.data(), x.data() + 8);
  EXPECT_EQ(s(1, 0, 3), TypeParam(24 + 8 + 3));
  s(0, 0, 0) = TypeParam(-1);
  EXPECT_EQ(x(0, 2, 0), TypeParam(-1));

  const auto last = attn::slice(x.view(), 2, 1, 3);  // x[..., 1:3]
  EXPECT_THAT(last.shape(), ElementsAre(2, 6, 2));
  EXPECT_FALSE(last.is_contiguous());
  EXPECT_EQ(last(1, 5, 1), x(1, 5, 2));
}

TYPED_TEST(ViewOpsTest, SliceAllowsEmptyAndFullRanges) {
  auto x = arange<TypeParam>(Shape<2>{3, 4});
  EXPECT_TRUE(attn::slice(x.view(), 0, 3, 3).empty());
  const auto all = attn::slice(x.view(), 1, 0, 4);
  EXPECT_EQ(all.data(), x.data());
  EXPECT_TRUE(all.is_contiguous());
}

TYPED_TEST(ViewOpsTest, SliceOutOfBoundsThrowsNamingTheShape) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto v = x.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::slice(v, 1, 4, 7); }),
              AllOf(HasSubstr("slice"), HasSubstr("(2, 6, 4)"), HasSubstr("[4, 7)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::slice(v, 1, 3, 2); }),
              HasSubstr("(2, 6, 4)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::slice(v, 0, -1, 1); }),
              HasSubstr("(2, 6, 4)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::slice(v, 3, 0, 1); }),
              AllOf(HasSubstr("axis 3"), HasSubstr("(2, 6, 4)")));
}

// ---- select ----

TYPED_TEST(ViewOpsTest, SelectDropsAnAxis) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto batch1 = attn::select(x.view(), 0, 1);  // x[1]
  EXPECT_THAT(batch1.shape(), ElementsAre(6, 4));
  EXPECT_EQ(batch1.data(), x.data() + 24);
  EXPECT_TRUE(batch1.is_contiguous());

  const auto token2 = attn::select(x.view(), 1, 2);  // x[:, 2]
  EXPECT_THAT(token2.shape(), ElementsAre(2, 4));
  EXPECT_THAT(token2.strides(), ElementsAre(24, 1));
  EXPECT_THAT(attn::test::to_vector(token2), ElementsAre(8, 9, 10, 11, 32, 33, 34, 35));

  const auto feature3 = attn::select(x.view(), 2, 3);  // x[..., 3]
  EXPECT_THAT(feature3.strides(), ElementsAre(24, 4));
  EXPECT_EQ(feature3(1, 5), TypeParam(47));
}

TYPED_TEST(ViewOpsTest, SelectOutOfBoundsThrowsNamingTheShape) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto v = x.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::select(v, 1, 6); }),
              AllOf(HasSubstr("select"), HasSubstr("index 6"), HasSubstr("(2, 6, 4)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::select(v, 0, -1); }),
              HasSubstr("(2, 6, 4)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::select(v, 3, 0); }),
              HasSubstr("(2, 6, 4)"));
}

// ---- permute / transpose ----

TYPED_TEST(ViewOpsTest, PermuteReordersExtentsAndStrides) {
  auto x = arange<TypeParam>(Shape<3>{2, 3, 4});
  const auto p = attn::permute(x.view(), {2, 0, 1});  // x.permute(2, 0, 1)
  EXPECT_THAT(p.shape(), ElementsAre(4, 2, 3));
  EXPECT_THAT(p.strides(), ElementsAre(1, 12, 4));
  EXPECT_EQ(p.data(), x.data());
  for (Index i = 0; i < 2; ++i) {
    for (Index j = 0; j < 3; ++j) {
      for (Index k = 0; k < 4; ++k) EXPECT_EQ(p(k, i, j), x(i, j, k));
    }
  }
}

TYPED_TEST(ViewOpsTest, PermuteRejectsANonPermutation) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto v = x.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::permute(v, {0, 0, 1});
              }),
              AllOf(HasSubstr("(0, 0, 1)"), HasSubstr("(2, 6, 4)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::permute(v, {0, 1, 3});
              }),
              AllOf(HasSubstr("(0, 1, 3)"), HasSubstr("(2, 6, 4)")));
}

TYPED_TEST(ViewOpsTest, TransposeSwapsTwoAxes) {
  auto m = arange<TypeParam>(Shape<2>{2, 3});
  const auto t = attn::transpose(m.view());  // m.T
  EXPECT_THAT(t.shape(), ElementsAre(3, 2));
  EXPECT_THAT(t.strides(), ElementsAre(1, 3));
  EXPECT_THAT(attn::test::to_vector(t), ElementsAre(0, 3, 1, 4, 2, 5));

  auto x = arange<TypeParam>(Shape<3>{2, 3, 4});
  const auto xt = attn::transpose(x.view(), 1, 2);  // keys.transpose(1, 2)
  EXPECT_THAT(xt.shape(), ElementsAre(2, 4, 3));
  EXPECT_EQ(xt(1, 3, 2), x(1, 2, 3));
  const auto same = attn::transpose(x.view(), 1, 1);
  EXPECT_EQ(same.strides(), x.view().strides());
}

TYPED_TEST(ViewOpsTest, TransposeRejectsMissingAxes) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto v = x.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::transpose(v, 1, 3); }),
              AllOf(HasSubstr("transpose"), HasSubstr("(2, 6, 4)")));
}

// ---- unsqueeze ----

TYPED_TEST(ViewOpsTest, UnsqueezeMatchesPyTorchStrides) {
  // torch.empty(2, 3).unsqueeze(d).stride() for d = 0, 1, 2: (6, 3, 1), (3, 3, 1), (3, 1, 1)
  auto x = arange<TypeParam>(Shape<2>{2, 3});
  const auto u0 = attn::unsqueeze(x.view(), 0);
  const auto u1 = attn::unsqueeze(x.view(), 1);
  const auto u2 = attn::unsqueeze(x.view(), 2);
  EXPECT_THAT(u0.shape(), ElementsAre(1, 2, 3));
  EXPECT_THAT(u0.strides(), ElementsAre(6, 3, 1));
  EXPECT_THAT(u1.shape(), ElementsAre(2, 1, 3));
  EXPECT_THAT(u1.strides(), ElementsAre(3, 3, 1));
  EXPECT_THAT(u2.shape(), ElementsAre(2, 3, 1));
  EXPECT_THAT(u2.strides(), ElementsAre(3, 1, 1));
  EXPECT_TRUE(u0.is_contiguous() && u1.is_contiguous() && u2.is_contiguous());
  EXPECT_EQ(u1(1, 0, 2), TypeParam(5));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::unsqueeze(x.view(), 3); }),
              AllOf(HasSubstr("axis 3"), HasSubstr("(2, 3)")));
}

// ---- reshape: PyTorch's view() rules ----

TYPED_TEST(ViewOpsTest, ReshapeContiguousKeepsDataAndOrder) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto r = attn::reshape(x.view(), Shape<2>{12, 4});
  EXPECT_EQ(r.data(), x.data());
  EXPECT_THAT(r.strides(), ElementsAre(4, 1));
  EXPECT_EQ(r(7, 2), TypeParam(30));
  const auto flat = attn::reshape(x.view(), Shape<1>{48});
  EXPECT_THAT(attn::test::to_vector(flat), ElementsAreArray(x.to_vector()));
  const auto up = attn::reshape(x.view(), Shape<4>{2, 3, 2, 4});
  EXPECT_EQ(up(1, 2, 1, 3), x(1, 5, 3));
}

TYPED_TEST(ViewOpsTest, ReshapeInfersOneMinusOneExtent) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  EXPECT_THAT(attn::reshape(x.view(), Shape<2>{2, -1}).shape(), ElementsAre(2, 24));
  EXPECT_THAT(attn::reshape(x.view(), Shape<3>{-1, 3, 4}).shape(), ElementsAre(4, 3, 4));
  EXPECT_THAT(attn::reshape(x.view(), Shape<1>{-1}).shape(), ElementsAre(48));
}

TYPED_TEST(ViewOpsTest, ReshapeRejectsBadShapesNamingBoth) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto v = x.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::reshape(v, Shape<2>{5, 5});
              }),
              AllOf(HasSubstr("(2, 6, 4)"), HasSubstr("(5, 5)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::reshape(v, Shape<2>{-1, -1});
              }),
              AllOf(HasSubstr("(2, 6, 4)"), HasSubstr("-1")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::reshape(v, Shape<2>{5, -1});
              }),
              AllOf(HasSubstr("(2, 6, 4)"), HasSubstr("(5, -1)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::reshape(v, Shape<3>{-2, 6, -4});
              }),
              HasSubstr("(2, 6, 4)"));
}

TYPED_TEST(ViewOpsTest, ReshapeOfStridedViewsFollowsPyTorch) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  // torch.arange(48.).view(2, 6, 4)[:, :, 0:2].view(12, 2).stride() == (4, 1)
  const auto cols = attn::slice(x.view(), 2, 0, 2);
  const auto merged = attn::reshape(cols, Shape<2>{12, 2});
  EXPECT_THAT(merged.strides(), ElementsAre(4, 1));
  EXPECT_EQ(merged.data(), x.data());
  EXPECT_EQ(merged(7, 1), x(1, 1, 1));
  // ... but .view(24) needs a copy.
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::reshape(cols, Shape<1>{24}); }),
              AllOf(HasSubstr("(2, 6, 2)"), HasSubstr("(24)"), HasSubstr("contiguous")));

  // torch.arange(24.).view(4, 6).t(): stride (1, 6); .view(6, 2, 2).stride() == (1, 12, 6)
  auto m = arange<TypeParam>(Shape<2>{4, 6});
  const auto t = attn::transpose(m.view());
  const auto split = attn::reshape(t, Shape<3>{6, 2, 2});
  EXPECT_THAT(split.strides(), ElementsAre(1, 12, 6));
  EXPECT_EQ(split(5, 1, 0), m(2, 5));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::reshape(t, Shape<1>{24}); }),
              AllOf(HasSubstr("(6, 4)"), HasSubstr("(24)")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                attn::reshape(t, Shape<2>{4, 6});
              }),
              AllOf(HasSubstr("(6, 4)"), HasSubstr("(4, 6)")));

  // A batch slice x[1:2] is still viewable: (1, 6, 4) -> (6, 4) with strides (4, 1).
  const auto batch = attn::slice(x.view(), 0, 1, 2);
  EXPECT_THAT(attn::reshape(batch, Shape<2>{6, 4}).strides(), ElementsAre(4, 1));
  // A token slice x[:, 1:5] keeps (24, 1) after merging T and D.
  const auto tokens = attn::slice(x.view(), 1, 1, 5);
  const auto rows = attn::reshape(tokens, Shape<2>{2, 16});
  EXPECT_THAT(rows.strides(), ElementsAre(24, 1));
  EXPECT_EQ(rows(1, 15), x(1, 4, 3));
}

TYPED_TEST(ViewOpsTest, ReshapeOfEmptyViewIsContiguous) {
  auto x = arange<TypeParam>(Shape<2>{0, 4});
  const auto r = attn::reshape(x.view(), Shape<3>{2, 0, 3});
  EXPECT_THAT(r.shape(), ElementsAre(2, 0, 3));
  EXPECT_TRUE(r.empty());
}

// ---- split_heads / merge_heads ----

TYPED_TEST(ViewOpsTest, SplitHeadsIsAStrideChangeMatchingViewThenTranspose) {
  const Index b = 2, t = 6, h = 2, hd = 2;
  auto x = arange<TypeParam>(Shape<3>{b, t, h * hd});
  const auto heads = attn::split_heads(x.view(), h);
  EXPECT_THAT(heads.shape(), ElementsAre(b, h, t, hd));
  // torch.arange(24.).view(2, 6, 4).view(2, 6, 2, 2).transpose(1, 2).stride() == (24, 2, 4, 1)
  EXPECT_THAT(heads.strides(), ElementsAre(24, 2, 4, 1));
  EXPECT_EQ(heads.data(), x.data());  // no copy

  // The notebook's x.view(b, t, h, hd).transpose(1, 2), element by element.
  const auto notebook = attn::transpose(attn::reshape(x.view(), Shape<4>{b, t, h, hd}), 1, 2);
  EXPECT_EQ(notebook.shape(), heads.shape());
  for (Index bi = 0; bi < b; ++bi) {
    for (Index hi = 0; hi < h; ++hi) {
      for (Index ti = 0; ti < t; ++ti) {
        for (Index d = 0; d < hd; ++d) {
          EXPECT_EQ(&heads(bi, hi, ti, d), &notebook(bi, hi, ti, d));
          EXPECT_EQ(heads(bi, hi, ti, d), x(bi, ti, hi * hd + d));
        }
      }
    }
  }
  // Head 1 of batch 0 (PyTorch: [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19], [22, 23]]).
  EXPECT_THAT(attn::test::to_vector(attn::select(attn::select(heads, 0, 0), 0, 1)),
              ElementsAre(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23));
}

TYPED_TEST(ViewOpsTest, SplitHeadsWorksOnStridedInput) {
  auto big = arange<TypeParam>(Shape<3>{3, 6, 8});
  const auto x = attn::slice(attn::slice(big.view(), 0, 1, 3), 2, 2, 6);  // (2, 6, 4), strided
  const auto heads = attn::split_heads(x, 2);
  for (Index bi = 0; bi < 2; ++bi) {
    for (Index hi = 0; hi < 2; ++hi) {
      for (Index ti = 0; ti < 6; ++ti) {
        for (Index d = 0; d < 2; ++d) EXPECT_EQ(heads(bi, hi, ti, d), x(bi, ti, hi * 2 + d));
      }
    }
  }
}

TYPED_TEST(ViewOpsTest, SplitHeadsRejectsIndivisibleWidth) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  const auto v = x.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::split_heads(v, 3); }),
              AllOf(HasSubstr("(2, 6, 4)"), HasSubstr("num_heads=3")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::split_heads(v, 0); }),
              AllOf(HasSubstr("(2, 6, 4)"), HasSubstr("num_heads=0")));
}

TYPED_TEST(ViewOpsTest, MergeHeadsInvertsSplitHeads) {
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  for (const Index h : {1, 2, 4}) {
    const auto merged = attn::merge_heads(attn::split_heads(x.view(), h));
    EXPECT_EQ(merged.data(), x.data());
    EXPECT_EQ(merged.shape(), x.shape());
    EXPECT_EQ(merged.strides(), x.view().strides());
  }
  // Also on a strided input.
  auto big = arange<TypeParam>(Shape<3>{2, 6, 8});
  const auto cols = attn::slice(big.view(), 2, 4, 8);
  const auto merged = attn::merge_heads(attn::split_heads(cols, 2));
  EXPECT_EQ(merged.data(), cols.data());
  EXPECT_EQ(merged.strides(), cols.strides());
}

TYPED_TEST(ViewOpsTest, MergeHeadsOfContiguousHeadsNeedsACopy) {
  // A contiguous (B, H, T, hd) tensor is not a (B, T, D) layout: merging needs a copy.
  auto heads = arange<TypeParam>(Shape<4>{2, 2, 6, 2});
  const auto v = heads.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::merge_heads(v); }),
              HasSubstr("contiguous"));
}

// The message should name merge_heads and the shape the caller passed, not the internal
// reshape of a permuted view the caller never saw.
TYPED_TEST(ViewOpsTest, MergeHeadsErrorNamesTheCallersShape) {
  auto heads = arange<TypeParam>(Shape<4>{2, 2, 6, 2});
  const auto v = heads.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::merge_heads(v); }),
              AllOf(HasSubstr("merge_heads"), HasSubstr("(2, 2, 6, 2)")));
}

TYPED_TEST(ViewOpsTest, MergeHeadsAfterCopyToTokenMajorLayout) {
  // The kernel writes (B, T, H, hd); viewed as (B, H, T, hd) it merges back for free.
  auto x = arange<TypeParam>(Shape<3>{2, 6, 4});
  Tensor<TypeParam, 3> out({2, 6, 4});
  attn::copy(attn::split_heads(TensorView<const TypeParam, 3>(x.view()), 2),
             attn::split_heads(out.view(), 2));
  EXPECT_THAT(out.to_vector(), ElementsAreArray(x.to_vector()));
}

// ---- copy / contiguous ----

TYPED_TEST(ViewOpsTest, CopyHandlesAnyStrides) {
  auto src = arange<TypeParam>(Shape<2>{3, 4});
  Tensor<TypeParam, 2> dst_storage({4, 3}, TypeParam(-7));
  // Write the transpose of src into dst: dst viewed transposed has src's shape.
  attn::copy(TensorView<const TypeParam, 2>(src.view()), attn::transpose(dst_storage.view()));
  for (Index i = 0; i < 3; ++i) {
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(dst_storage(j, i), src(i, j));
  }
  // Into a slice: the rest is untouched.
  Tensor<TypeParam, 2> wide({3, 6}, TypeParam(-1));
  attn::copy(src.view(), attn::slice(wide.view(), 1, 1, 5));
  EXPECT_THAT(attn::test::row(wide, 1), ElementsAre(-1, 4, 5, 6, 7, -1));
}

TYPED_TEST(ViewOpsTest, CopyRejectsShapeMismatchNamingBoth) {
  auto src = arange<TypeParam>(Shape<3>{2, 6, 4});
  Tensor<TypeParam, 3> dst({2, 4, 6});
  const auto s = src.view();
  const auto d = dst.view();
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::copy(s, d); }),
              AllOf(HasSubstr("(2, 6, 4)"), HasSubstr("(2, 4, 6)")));
}

TYPED_TEST(ViewOpsTest, ContiguousAlwaysCopies) {
  auto x = arange<TypeParam>(Shape<2>{3, 4});
  const auto same = attn::contiguous(x.view());
  EXPECT_NE(same.data(), x.data());
  EXPECT_THAT(same.to_vector(), ElementsAreArray(x.to_vector()));

  const auto t = attn::contiguous(attn::transpose(TensorView<const TypeParam, 2>(x.view())));
  EXPECT_THAT(t.shape(), ElementsAre(4, 3));
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_THAT(t.to_vector(), ElementsAre(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11));
  // The copy is now viewable as anything.
  EXPECT_THAT(attn::reshape(t.view(), Shape<1>{12}).strides(), ElementsAre(1));
}

}  // namespace
}  // namespace view_ops_test

#include "support/bodies_end.hpp"
