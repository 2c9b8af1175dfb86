// SPDX-License-Identifier: MIT
// tests/tensor/eigen_test.cpp: the bridge both ways. View -> Eigen::Map (as_matrix,
// as_vector): layout, outer strides, refusal of non-unit inner strides, writes through maps.
// Eigen -> view (as_view): column- and row-major matrices, arrays, maps, refs, blocks and
// vectors, const-correctness, no copies, and the modules taking such views directly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"
#include "attn/detail/eigen_core.hpp"  // Eigen after attn/config.hpp (GCC 12 AVX-512 warnings)
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace eigen_test {

namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> arange(const Shape<Rank>& shape) {
  Tensor<Scalar, Rank> t(shape);
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = Scalar(i);
  return t;
}

template <class Scalar>
class EigenBridgeTest : public ::testing::Test {};
TYPED_TEST_SUITE(EigenBridgeTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(EigenBridgeTest, ContiguousViewMapsRowMajor) {
  auto t = arange<TypeParam>(Shape<2>{3, 4});
  const auto m = attn::as_matrix(t.view());
  EXPECT_EQ(m.rows(), 3);
  EXPECT_EQ(m.cols(), 4);
  EXPECT_EQ(m.outerStride(), 4);
  EXPECT_EQ(m.data(), t.data());
  for (Index i = 0; i < 3; ++i) {
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(m(i, j), t(i, j));
  }
  // Not Eigen's column-major default: (0, 1) is the second element in memory.
  EXPECT_EQ(&m(0, 1), t.data() + 1);
}

TYPED_TEST(EigenBridgeTest, ColumnSliceKeepsTheOuterStride) {
  auto t = arange<TypeParam>(Shape<2>{3, 6});
  const auto block = attn::slice(t.view(), 1, 2, 5);  // t[:, 2:5]
  const auto m = attn::as_matrix(block);
  EXPECT_EQ(m.rows(), 3);
  EXPECT_EQ(m.cols(), 3);
  EXPECT_EQ(m.outerStride(), 6);
  EXPECT_EQ(m(2, 0), TypeParam(14));
  EXPECT_EQ(m(1, 2), TypeParam(10));
  EXPECT_EQ(m.sum(), TypeParam((2 + 3 + 4) + (8 + 9 + 10) + (14 + 15 + 16)));
}

TYPED_TEST(EigenBridgeTest, BatchAndHeadSlicesMap) {
  // One head of one batch item of (B, H, T, hd) from split_heads: rows T, stride D.
  auto x = arange<TypeParam>(Shape<3>{2, 5, 6});
  const auto heads = attn::split_heads(x.view(), 3);                // (2, 3, 5, 2)
  const auto head = attn::select(attn::select(heads, 0, 1), 0, 2);  // batch 1, head 2: (5, 2)
  const auto m = attn::as_matrix(head);
  EXPECT_EQ(m.outerStride(), 6);
  for (Index t = 0; t < 5; ++t) {
    for (Index d = 0; d < 2; ++d) EXPECT_EQ(m(t, d), x(1, t, 4 + d));
  }
}

TYPED_TEST(EigenBridgeTest, RefusesNonUnitInnerStride) {
  auto t = arange<TypeParam>(Shape<2>{2, 3});
  const auto transposed = attn::transpose(t.view());  // (3, 2), strides (1, 3)
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::as_matrix(transposed); }),
              AllOf(HasSubstr("as_matrix"), HasSubstr("(3, 2)"), HasSubstr("inner stride 3")));
  auto wide = arange<TypeParam>(Shape<2>{2, 8});
  const TensorView<TypeParam, 2> every_other(wide.data(), {2, 4}, {8, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::as_matrix(every_other); }),
              AllOf(HasSubstr("(2, 4)"), HasSubstr("inner stride 2")));
}

TYPED_TEST(EigenBridgeTest, SingleColumnNeedsNoUnitInnerStride) {
  auto t = arange<TypeParam>(Shape<2>{3, 4});
  const auto col = attn::slice(attn::transpose(t.view()), 0, 1, 2);  // (1, 3), strides (1, 4)
  EXPECT_THAT(col.strides(), ElementsAre(1, 4));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::as_matrix(col); }),
              HasSubstr("(1, 3)"));
  const auto column = attn::slice(t.view(), 1, 3, 4);  // t[:, 3:4]: (3, 1), strides (4, 1)
  const auto m = attn::as_matrix(column);
  EXPECT_EQ(m(0, 0), TypeParam(3));
  EXPECT_EQ(m(2, 0), TypeParam(11));
}

TYPED_TEST(EigenBridgeTest, WritesGoThroughTheMap) {
  Tensor<TypeParam, 2> t({3, 6});
  auto block = attn::as_matrix(attn::slice(t.view(), 1, 1, 3));
  block.setConstant(TypeParam(2));
  block(2, 1) = TypeParam(9);
  EXPECT_THAT(attn::test::row(t, 0), ElementsAre(0, 2, 2, 0, 0, 0));
  EXPECT_THAT(attn::test::row(t, 2), ElementsAre(0, 2, 9, 0, 0, 0));

  auto whole = attn::as_matrix(t);  // Tensor& overload
  whole.row(1).setLinSpaced(6, TypeParam(0), TypeParam(5));
  EXPECT_THAT(attn::test::row(t, 1), ElementsAre(0, 1, 2, 3, 4, 5));
}

TYPED_TEST(EigenBridgeTest, ProductIntoAStridedOutput) {
  // C[:, 1:3] = A B^T with A and B column blocks of wider tensors: GEMM on outer strides.
  auto a_storage = arange<TypeParam>(Shape<2>{2, 5});
  auto b_storage = arange<TypeParam>(Shape<2>{2, 4});
  Tensor<TypeParam, 2> c({2, 4}, TypeParam(-1));
  const auto a = attn::slice(TensorView<const TypeParam, 2>(a_storage.view()), 1, 1, 4);  // (2, 3)
  const auto b = attn::slice(TensorView<const TypeParam, 2>(b_storage.view()), 1, 0, 3);  // (2, 3)
  attn::as_matrix(attn::slice(c.view(), 1, 1, 3)).noalias() =
      attn::as_matrix(a) * attn::as_matrix(b).transpose();
  for (Index i = 0; i < 2; ++i) {
    for (Index j = 0; j < 2; ++j) {
      TypeParam expected = 0;
      for (Index k = 0; k < 3; ++k) expected += a(i, k) * b(j, k);
      EXPECT_EQ(c(i, 1 + j), expected);
    }
    EXPECT_EQ(c(i, 0), TypeParam(-1));
    EXPECT_EQ(c(i, 3), TypeParam(-1));
  }
}

TYPED_TEST(EigenBridgeTest, ConstTensorGivesAConstMap) {
  const auto t = arange<TypeParam>(Shape<2>{2, 2});
  const auto m = attn::as_matrix(t);
  static_assert(std::is_same_v<decltype(m), const attn::MatrixMap<const TypeParam>>);
  EXPECT_EQ(m(1, 0), TypeParam(2));
  const attn::RowMatrix<TypeParam> copy = m;  // an owning row-major copy
  EXPECT_TRUE(attn::RowMatrix<TypeParam>::IsRowMajor);
  EXPECT_EQ(copy(1, 1), TypeParam(3));
}

TYPED_TEST(EigenBridgeTest, VectorMapsAndWrites) {
  Tensor<TypeParam, 1> v({5});
  auto m = attn::as_vector(v);
  m.setLinSpaced(5, TypeParam(1), TypeParam(5));
  EXPECT_THAT(v.to_vector(), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(m.size(), 5);

  auto t = arange<TypeParam>(Shape<2>{3, 4});
  const auto row = attn::as_vector(attn::select(t.view(), 0, 2));
  EXPECT_EQ(row.sum(), TypeParam(8 + 9 + 10 + 11));
  const auto sub = attn::as_vector(attn::slice(attn::select(t.view(), 0, 1), 0, 1, 3));
  EXPECT_EQ(sub(0), TypeParam(5));
  EXPECT_EQ(sub(1), TypeParam(6));

  const Tensor<TypeParam, 1>& cv = v;
  EXPECT_EQ(attn::as_vector(cv)(4), TypeParam(5));
}

TYPED_TEST(EigenBridgeTest, VectorRefusesNonUnitStride) {
  auto t = arange<TypeParam>(Shape<2>{3, 4});
  const auto column = attn::select(t.view(), 1, 2);  // t[:, 2]: stride 4
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { attn::as_vector(column); }),
              AllOf(HasSubstr("as_vector"), HasSubstr("(3)"), HasSubstr("stride 4")));
  // A single element has no stride to speak of.
  EXPECT_EQ(attn::as_vector(attn::slice(column, 0, 2, 3))(0), TypeParam(10));
}

TYPED_TEST(EigenBridgeTest, EmptyViewsMapToEmptyMatrices) {
  Tensor<TypeParam, 2> t({0, 4});
  EXPECT_EQ(attn::as_matrix(t).size(), 0);
  Tensor<TypeParam, 1> v;
  EXPECT_EQ(attn::as_vector(v).size(), 0);
}

// ---- Eigen -> view ----

TYPED_TEST(EigenBridgeTest, NullMapWithElementsIsRejected) {
  const Eigen::Map<const Eigen::Matrix<TypeParam, Eigen::Dynamic, Eigen::Dynamic>> null_map(nullptr,
                                                                                            3, 4);
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] { (void)attn::as_view(null_map); }),
              HasSubstr("null data with shape (3, 4)"));
}

template <class Scalar>
using ColMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;  // Eigen's default

template <class M>
void fill_arange(M& m) {
  for (Index i = 0; i < m.rows(); ++i) {
    for (Index j = 0; j < m.cols(); ++j) m(i, j) = typename M::Scalar(10 * i + j);
  }
}

TYPED_TEST(EigenBridgeTest, ColumnMajorMatrixIsAStridedViewWithoutCopy) {
  ColMatrix<TypeParam> m(3, 4);
  fill_arange(m);
  const auto v = attn::as_view(m);
  static_assert(std::is_same_v<decltype(v), const TensorView<TypeParam, 2>>);
  EXPECT_THAT(v.shape(), ElementsAre(3, 4));
  EXPECT_THAT(v.strides(), ElementsAre(1, 3));  // column-major: rows are adjacent
  EXPECT_EQ(v.data(), m.data());
  for (Index i = 0; i < 3; ++i) {
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(v(i, j), m(i, j));
  }
  v(2, 1) = TypeParam(-5);  // writes go into the matrix
  EXPECT_EQ(m(2, 1), TypeParam(-5));
  attn::RowMatrix<TypeParam> r(2, 3);
  fill_arange(r);
  EXPECT_THAT(attn::as_view(r).strides(), ElementsAre(3, 1));
  // Both ways: a row-major view maps back onto the same memory.
  EXPECT_EQ(attn::as_matrix(attn::as_view(r)).data(), r.data());
}

TYPED_TEST(EigenBridgeTest, BlocksMapsRefsAndArraysKeepTheirStrides) {
  ColMatrix<TypeParam> m(5, 6);
  fill_arange(m);
  const auto block = attn::as_view(m.block(1, 2, 3, 2));  // rows 1..3, cols 2..3
  EXPECT_THAT(block.shape(), ElementsAre(3, 2));
  EXPECT_THAT(block.strides(), ElementsAre(1, 5));
  EXPECT_EQ(block(2, 1), m(3, 3));
  EXPECT_EQ(block.data(), &m(1, 2));
  std::vector<TypeParam> buffer(20);
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = TypeParam(i);
  const Eigen::Map<attn::RowMatrix<TypeParam>, 0, Eigen::OuterStride<>> map(
      buffer.data(), 3, 4, Eigen::OuterStride<>(6));
  const auto mv = attn::as_view(map);
  EXPECT_THAT(mv.strides(), ElementsAre(6, 1));
  EXPECT_EQ(mv(2, 3), TypeParam(15));
  Eigen::Ref<ColMatrix<TypeParam>> ref(m);
  EXPECT_EQ(attn::as_view(ref).data(), m.data());
  Eigen::Array<TypeParam, Eigen::Dynamic, Eigen::Dynamic> a(2, 3);
  fill_arange(a);
  EXPECT_EQ(attn::as_view(a)(1, 2), TypeParam(12));
}

TYPED_TEST(EigenBridgeTest, VectorsAreOneDimensional) {
  Eigen::Matrix<TypeParam, Eigen::Dynamic, 1> column(4);
  column << 1, 2, 3, 4;
  const auto v = attn::as_view(column);
  static_assert(std::is_same_v<decltype(v), const TensorView<TypeParam, 1>>);
  EXPECT_THAT(v.strides(), ElementsAre(1));
  EXPECT_EQ(v(3), TypeParam(4));
  ColMatrix<TypeParam> m(3, 4);
  fill_arange(m);
  const auto row = attn::as_view(m.row(2));  // a row of a column-major matrix: stride 3
  EXPECT_THAT(row.shape(), ElementsAre(4));
  EXPECT_THAT(row.strides(), ElementsAre(3));
  EXPECT_EQ(row(3), TypeParam(23));
  attn::RowMatrix<TypeParam> r(3, 4);
  fill_arange(r);
  EXPECT_THAT(attn::as_view(r.col(1)).strides(), ElementsAre(4));
  EXPECT_EQ(attn::as_view(r.col(1))(2), TypeParam(21));
}

TYPED_TEST(EigenBridgeTest, ConstObjectsGiveReadOnlyViews) {
  const ColMatrix<TypeParam> m = ColMatrix<TypeParam>::Ones(2, 3);
  static_assert(std::is_same_v<decltype(attn::as_view(m)), TensorView<const TypeParam, 2>>);
  static_assert(
      std::is_same_v<decltype(attn::as_view(m.block(0, 0, 1, 2))), TensorView<const TypeParam, 2>>);
  std::vector<TypeParam> buffer(6, TypeParam(1));
  const Eigen::Map<const attn::RowMatrix<TypeParam>> map(buffer.data(), 2, 3);
  static_assert(std::is_same_v<decltype(attn::as_view(map)), TensorView<const TypeParam, 2>>);
  static_assert(!std::is_convertible_v<TensorView<const TypeParam, 2>, TensorView<TypeParam, 2>>);
  EXPECT_EQ(attn::as_view(m).data(), m.data());
}

TYPED_TEST(EigenBridgeTest, ModulesTakeEigenViewsDirectly) {
  // A notebook module on column-major Eigen data, into a column-major Eigen output.
  attn::manual_seed(123);
  const attn::MultiHeadAttention<TypeParam> mha(3, 4, 6, 0.0, 2, true);
  ColMatrix<TypeParam> x(6, 3);
  fill_arange(x);
  x /= TypeParam(40);
  const Tensor<TypeParam, 2> copy(attn::as_view(x));  // contiguous row-major
  const Tensor<TypeParam, 2> expected = mha.forward(copy.view());
  EXPECT_EQ(mha.forward(attn::as_view(x)).to_vector(), expected.to_vector());
  ColMatrix<TypeParam> y(6, 4);
  attn::Workspace ws;
  mha.forward(attn::as_view(x), attn::as_view(y), ws);
  for (Index t = 0; t < 6; ++t) {
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(y(t, j), expected(t, j));
  }
}

}  // namespace

}  // namespace eigen_test

#include "support/bodies_end.hpp"
