// SPDX-License-Identifier: MIT
// tests/tensor/tensor_test.cpp: TensorView (strides, const conversion, at(), contiguity) and
// Tensor (construction, copies, moves, resize, alignment, implicit views).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "support/scalar_types.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace tensor_test {

namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

template <class Scalar>
std::vector<Scalar> iota(std::size_t n) {
  std::vector<Scalar> v(n);
  std::iota(v.begin(), v.end(), Scalar(0));
  return v;
}

bool is_aligned_64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

// Helpers that only accept views: a Tensor must convert to them implicitly.
template <class Scalar>
Scalar sum_of(TensorView<const Scalar, 2> v) {
  Scalar total = 0;
  for (Index i = 0; i < v.extent(0); ++i) {
    for (Index j = 0; j < v.extent(1); ++j) total += v(i, j);
  }
  return total;
}
template <class Scalar>
void set_all(TensorView<Scalar, 2> v, Scalar value) {
  for (Index i = 0; i < v.extent(0); ++i) {
    for (Index j = 0; j < v.extent(1); ++j) v(i, j) = value;
  }
}

// ---- TensorView ----

template <class Scalar>
class TensorViewTest : public ::testing::Test {};
TYPED_TEST_SUITE(TensorViewTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(TensorViewTest, DefaultIsEmptyAndNull) {
  const TensorView<TypeParam, 3> v;
  EXPECT_EQ(v.data(), nullptr);
  EXPECT_THAT(v.shape(), ElementsAre(0, 0, 0));
  EXPECT_EQ(v.size(), 0);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ((TensorView<TypeParam, 3>::rank()), 3u);
}

TYPED_TEST(TensorViewTest, ShapeConstructorGivesRowMajorStrides) {
  auto data = iota<TypeParam>(24);
  const TensorView<TypeParam, 3> v(data.data(), {2, 3, 4});
  EXPECT_THAT(v.strides(), ElementsAre(12, 4, 1));
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.extent(1), 3);
  EXPECT_EQ(v.size(), 24);
  EXPECT_FALSE(v.empty());
  EXPECT_TRUE(v.is_contiguous());
  for (Index i = 0; i < 2; ++i) {
    for (Index j = 0; j < 3; ++j) {
      for (Index k = 0; k < 4; ++k) EXPECT_EQ(&v(i, j, k), data.data() + i * 12 + j * 4 + k);
    }
  }
  EXPECT_EQ(attn::row_major_strides(Shape<4>{2, 3, 4, 5}), (Shape<4>{60, 20, 5, 1}));
}

TYPED_TEST(TensorViewTest, ExplicitStridesAddressColumnMajorData) {
  // A 2x3 matrix stored column-major: element (i, j) at i + 2 j.
  const std::vector<TypeParam> data{0, 10, 1, 11, 2, 12};
  const TensorView<const TypeParam, 2> v(data.data(), {2, 3}, {1, 2});
  EXPECT_THAT(attn::test::to_vector(v), ElementsAre(0, 1, 2, 10, 11, 12));
  EXPECT_FALSE(v.is_contiguous());
}

TYPED_TEST(TensorViewTest, ZeroStrideBroadcastsOneRow) {
  const std::vector<TypeParam> data{1, 2, 3};
  const TensorView<const TypeParam, 2> v(data.data(), {4, 3}, {0, 1});
  EXPECT_THAT(attn::test::to_vector(v), ElementsAre(1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3));
  EXPECT_FALSE(v.is_contiguous());
}

TYPED_TEST(TensorViewTest, NegativeExtentOrStrideThrowsShapeError) {
  using View = TensorView<TypeParam, 2>;
  TypeParam x = 0;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                View(&x, {2, -1});
              }),
              HasSubstr("(2, -1)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                View(&x, {2, 3}, {3, -1});
              }),
              HasSubstr("(3, -1)"));
}

// A view with null data and elements used to reach the kernels and segfault there (SDPA,
// MultiHeadAttention): no such view can be built, so no entry point ever receives one.
TYPED_TEST(TensorViewTest, NullDataWithElementsThrowsShapeError) {
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] {
                (TensorView<const TypeParam, 4>(nullptr, {1, 1, 4, 8}));
              }),
              AllOf(HasSubstr("attn::TensorView: null data with shape (1, 1, 4, 8) (32 elements)"),
                    HasSubstr("only an empty view may have null data")));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] {
                (TensorView<TypeParam, 2>(nullptr, {3, 1}, {0, 0}));
              }),
              HasSubstr("null data with shape (3, 1)"));
  // Empty views may have null data: the default view, a zero extent.
  EXPECT_NO_THROW((TensorView<TypeParam, 3>(nullptr, {2, 0, 5})));
  EXPECT_EQ((TensorView<TypeParam, 3>(nullptr, {2, 0, 5})).size(), 0);
}

TYPED_TEST(TensorViewTest, ConvertsToConstViewOverTheSameElements) {
  auto data = iota<TypeParam>(6);
  const TensorView<TypeParam, 2> mutable_view(data.data(), {2, 3}, {1, 2});
  const TensorView<const TypeParam, 2> const_view = mutable_view;
  EXPECT_EQ(const_view.data(), mutable_view.data());
  EXPECT_EQ(const_view.shape(), mutable_view.shape());
  EXPECT_EQ(const_view.strides(), mutable_view.strides());
  mutable_view(1, 2) = TypeParam(42);
  EXPECT_EQ(const_view(1, 2), TypeParam(42));
}

TYPED_TEST(TensorViewTest, ConstViewObjectStillWritesElements) {
  // Shallow const, like std::span: constness of the view object is not constness of data.
  std::vector<TypeParam> data(4, TypeParam(0));
  const TensorView<TypeParam, 1> v(data.data(), {4});
  v(2) = TypeParam(7);
  v.at(3) = TypeParam(8);
  EXPECT_THAT(data, ElementsAre(0, 0, 7, 8));
}

TYPED_TEST(TensorViewTest, AtReadsAndWritesInBounds) {
  auto data = iota<TypeParam>(12);
  const TensorView<TypeParam, 2> v(data.data(), {2, 6});
  EXPECT_EQ(v.at(1, 5), TypeParam(11));
  v.at(0, 3) = TypeParam(-1);
  EXPECT_EQ(data[3], TypeParam(-1));
}

TYPED_TEST(TensorViewTest, AtThrowsOutOfRangeNamingIndexAxisAndSize) {
  auto data = iota<TypeParam>(12);
  const TensorView<TypeParam, 2> v(data.data(), {2, 6});
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { v.at(1, 7); }),
              HasSubstr("index 7 is out of bounds for axis 1 with size 6"));
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { v.at(1, 6); }),
              HasSubstr("index 6 is out of bounds for axis 1 with size 6"));
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { v.at(2, 0); }),
              HasSubstr("index 2 is out of bounds for axis 0 with size 2"));
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { v.at(-1, 0); }),
              HasSubstr("index -1 is out of bounds for axis 0 with size 2"));
}

TYPED_TEST(TensorViewTest, IsContiguousOnlyForRowMajorStrides) {
  auto data = iota<TypeParam>(24);
  EXPECT_TRUE((TensorView<TypeParam, 3>(data.data(), {2, 3, 4}).is_contiguous()));
  // Extent-1 axes may carry any stride (PyTorch ignores them too).
  EXPECT_TRUE((TensorView<TypeParam, 3>(data.data(), {2, 1, 4}, {4, 99, 1}).is_contiguous()));
  // A column slice keeps the row stride of the parent: not contiguous.
  EXPECT_FALSE((TensorView<TypeParam, 2>(data.data(), {4, 2}, {6, 1}).is_contiguous()));
  // Transposed.
  EXPECT_FALSE((TensorView<TypeParam, 2>(data.data(), {6, 4}, {1, 6}).is_contiguous()));
  // Padded rows.
  EXPECT_FALSE((TensorView<TypeParam, 2>(data.data(), {2, 3}, {4, 1}).is_contiguous()));
}

TYPED_TEST(TensorViewTest, EmptyExtentMeansEmptyView) {
  auto data = iota<TypeParam>(3);
  const TensorView<TypeParam, 2> v(data.data(), {0, 3});
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.size(), 0);
  EXPECT_TRUE(attn::test::to_vector(v).empty());
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { v.at(0, 0); }),
              HasSubstr("axis 0 with size 0"));
}

// ---- Tensor ----

template <class Scalar>
class TensorTest : public ::testing::Test {};
TYPED_TEST_SUITE(TensorTest, attn::test::ScalarTypes, attn::test::ScalarTypeNames);

TYPED_TEST(TensorTest, DefaultIsEmpty) {
  const Tensor<TypeParam, 2> t;
  EXPECT_TRUE(t.empty());
  EXPECT_THAT(t.shape(), ElementsAre(0, 0));
  EXPECT_EQ(t.view().size(), 0);
}

TYPED_TEST(TensorTest, ShapeConstructorZeroFills) {
  const Tensor<TypeParam, 3> t({2, 3, 4});
  EXPECT_THAT(t.shape(), ElementsAre(2, 3, 4));
  EXPECT_THAT(t.strides(), ElementsAre(12, 4, 1));
  EXPECT_EQ(t.size(), 24);
  EXPECT_EQ(t.extent(2), 4);
  EXPECT_THAT(t.to_vector(), ElementsAreArray(std::vector<TypeParam>(24, TypeParam(0))));
}

TYPED_TEST(TensorTest, FillConstructorAndFill) {
  Tensor<TypeParam, 2> t({3, 2}, TypeParam(1.5));
  EXPECT_THAT(t.to_vector(), ElementsAreArray(std::vector<TypeParam>(6, TypeParam(1.5))));
  t.fill(TypeParam(-2));
  EXPECT_THAT(t.to_vector(), ElementsAreArray(std::vector<TypeParam>(6, TypeParam(-2))));
}

TYPED_TEST(TensorTest, ValuesConstructorFillsRowMajor) {
  const Tensor<TypeParam, 2> t({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t(0, 2), TypeParam(3));
  EXPECT_EQ(t(1, 0), TypeParam(4));
  using Matrix = Tensor<TypeParam, 2>;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] {
                Matrix({2, 3}, {1, 2, 3, 4, 5});
              }),
              AllOf(HasSubstr("(2, 3)"), HasSubstr("5 values")));
}

TYPED_TEST(TensorTest, FromRowsBuildsTheNotebookInputs) {
  const auto t =
      Tensor<TypeParam, 2>::from_rows({{TypeParam(0.43), TypeParam(0.15), TypeParam(0.89)},
                                       {TypeParam(0.55), TypeParam(0.87), TypeParam(0.66)},
                                       {TypeParam(0.57), TypeParam(0.85), TypeParam(0.64)},
                                       {TypeParam(0.22), TypeParam(0.58), TypeParam(0.33)},
                                       {TypeParam(0.77), TypeParam(0.25), TypeParam(0.10)},
                                       {TypeParam(0.05), TypeParam(0.80), TypeParam(0.55)}});
  EXPECT_THAT(t.shape(), ElementsAre(6, 3));
  EXPECT_EQ(t(1, 1), TypeParam(0.87));
  EXPECT_EQ(t(5, 2), TypeParam(0.55));
  EXPECT_EQ(t(4, 0), TypeParam(0.77));
}

TYPED_TEST(TensorTest, FromRowsRejectsRaggedRows) {
  using Matrix = Tensor<TypeParam, 2>;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] {
                Matrix::from_rows({{1, 2, 3}, {4, 5}});
              }),
              HasSubstr("row 1 has 2 values, row 0 has 3"));
}

TYPED_TEST(TensorTest, FromViewIsAContiguousDeepCopy) {
  auto data = iota<TypeParam>(6);
  const TensorView<const TypeParam, 2> transposed(data.data(), {3, 2}, {1, 3});
  const Tensor<TypeParam, 2> t(transposed);
  EXPECT_NE(t.data(), data.data());
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_THAT(t.to_vector(), ElementsAre(0, 3, 1, 4, 2, 5));
}

TYPED_TEST(TensorTest, CopyIsDeep) {
  Tensor<TypeParam, 2> a({2, 2}, {1, 2, 3, 4});
  const Tensor<TypeParam, 2> b(a);
  a(0, 0) = TypeParam(100);
  EXPECT_NE(b.data(), a.data());
  EXPECT_THAT(b.to_vector(), ElementsAre(1, 2, 3, 4));

  Tensor<TypeParam, 2> c({5, 5});
  c = a;
  a(1, 1) = TypeParam(-100);
  EXPECT_THAT(c.shape(), ElementsAre(2, 2));
  EXPECT_THAT(c.to_vector(), ElementsAre(100, 2, 3, 4));

  const Tensor<TypeParam, 2>& alias = c;
  c = alias;  // self-assignment keeps the contents
  EXPECT_THAT(c.to_vector(), ElementsAre(100, 2, 3, 4));
}

TYPED_TEST(TensorTest, CopyOfEmptyIsEmpty) {
  const Tensor<TypeParam, 3> empty;
  const Tensor<TypeParam, 3> copy(empty);
  EXPECT_TRUE(copy.empty());
}

TYPED_TEST(TensorTest, MoveTransfersStorageAndEmptiesTheSource) {
  Tensor<TypeParam, 2> a({2, 3}, TypeParam(4));
  const TypeParam* storage = a.data();
  Tensor<TypeParam, 2> b(std::move(a));
  EXPECT_EQ(b.data(), storage);
  EXPECT_THAT(b.shape(), ElementsAre(2, 3));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): documented moved-from state

  Tensor<TypeParam, 2> c;
  c = std::move(b);
  EXPECT_EQ(c.data(), storage);
  EXPECT_THAT(c.to_vector(), ElementsAreArray(std::vector<TypeParam>(6, TypeParam(4))));
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
}

// A moved-from tensor is empty; resizing it must give it real storage again. (Regression:
// before ad78264 the buffer kept its old capacity after a move while its pointer was null,
// so a resize within that capacity allocated nothing and data() stayed null.)
TYPED_TEST(TensorTest, MovedFromTensorCanBeResizedAndReused) {
  Tensor<TypeParam, 1> a({8});
  Tensor<TypeParam, 1> b(std::move(a));
  a.resize({8});  // NOLINT(bugprone-use-after-move)
  ASSERT_NE(a.data(), nullptr) << "resize() after a move left the tensor without storage";
  a.fill(TypeParam(3));
  EXPECT_EQ(a(7), TypeParam(3));

  Tensor<TypeParam, 1> c({4});
  Tensor<TypeParam, 1> d;
  d = std::move(c);
  c.resize({2});  // NOLINT(bugprone-use-after-move)
  ASSERT_NE(c.data(), nullptr)
      << "resize() after a move-assignment left the tensor without storage";
}

// The same defect made copy-assignment into a moved-from tensor write through a null pointer
// (a segfault), so the assignment runs in a child process: a regression fails this test
// instead of taking the whole executable down.
TEST(TensorDeathTest, CopyAssignIntoMovedFromTensorWorks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  using Vector = Tensor<float, 1>;
  EXPECT_EXIT(
      {
        Vector a({8});
        Vector b(std::move(a));
        const Vector c({8}, 1.0f);
        a = c;  // NOLINT(bugprone-use-after-move): assigning to a moved-from object is valid
        std::exit(a(7) == 1.0f && a.data() != c.data() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TYPED_TEST(TensorTest, ResizeReusesCapacity) {
  Tensor<TypeParam, 2> t({4, 8});
  const TypeParam* storage = t.data();
  t.resize({2, 8});
  EXPECT_THAT(t.shape(), ElementsAre(2, 8));
  EXPECT_EQ(t.size(), 16);
  EXPECT_EQ(t.data(), storage);
  t.resize({8, 4});
  EXPECT_EQ(t.data(), storage);
  EXPECT_THAT(t.strides(), ElementsAre(4, 1));
  t.resize({0, 4});
  EXPECT_TRUE(t.empty());
  t.resize({4, 8});
  EXPECT_EQ(t.data(), storage);
  t.resize({16, 16});
  EXPECT_EQ(t.size(), 256);
  t.fill(TypeParam(1));  // the grown buffer is usable
  EXPECT_EQ(t(15, 15), TypeParam(1));
}

TYPED_TEST(TensorTest, ResizeRejectsNegativeExtents) {
  using Matrix = Tensor<TypeParam, 2>;
  Matrix t({2, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                t.resize({2, -3});
              }),
              HasSubstr("(2, -3)"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] { Matrix({-1, 2}); }), HasSubstr("(-1, 2)"));
}

// ---- sizes that overflow: a ShapeError naming the shape, never a short allocation ----

constexpr Index kTwo62 = Index(1) << 62;
constexpr Index kTwo32 = Index(1) << 32;

TYPED_TEST(TensorTest, ByteCountOverflowThrowsInsteadOfAllocatingTooLittle) {
  // 2^62 elements fit an index, but 2^62 x 4 bytes wrapped to 0: the allocation was empty
  // and at(1000) wrote out of bounds.
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] { (Tensor<TypeParam, 1>({kTwo62})); }),
              HasSubstr("attn::Tensor: shape (4611686018427387904) needs 4611686018427387904 x "));
  Tensor<TypeParam, 2> t({2, 2});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                t.resize({kTwo62, 2});
              }),
              HasSubstr("(4611686018427387904, 2)"));
  EXPECT_THAT(t.shape(), ElementsAre(2, 2));  // unchanged
}

TYPED_TEST(TensorTest, ElementCountOverflowThrows) {
  EXPECT_THAT(
      attn::test::thrown<attn::ShapeError>([] {
        (Tensor<TypeParam, 3>({kTwo32, kTwo32, 2}));
      }),
      HasSubstr("shape (4294967296, 4294967296, 2) has more elements than an index can count"));
  // no element, but the strides of the other axes would still overflow
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] {
                (Tensor<TypeParam, 3>({0, kTwo32, kTwo32}));
              }),
              HasSubstr("(0, 4294967296, 4294967296)"));
}

TEST(ShapeSize, OverflowThrowsNamingTheShape) {
  // was signed overflow (UBSan), giving 0: MultiHeadAttention then reported an "empty input"
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([] {
                attn::shape_size(Shape<3>{kTwo32, kTwo32, 2});
              }),
              HasSubstr("attn::shape_size: shape (4294967296, 4294967296, 2) has more elements"));
  EXPECT_EQ(attn::shape_size(Shape<3>{kTwo32, kTwo32 / 4 - 1, 2}),
            kTwo32 * (kTwo32 / 4 - 1) * 2);  // products just under 2^63 still work
  EXPECT_EQ(attn::shape_size(Shape<2>{0, kTwo62}), 0);
  // row-major strides of a shape that overflows are computed without undefined behaviour
  (void)attn::row_major_strides(Shape<3>{kTwo32, kTwo32, 2});
}

TEST(ShapeSize, ViewsOfShapesThatOverflowAreRejected) {
  float x = 0;
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                (TensorView<float, 3>(&x, {kTwo32, kTwo32, 2}, {0, 0, 0}));
              }),
              HasSubstr("attn::TensorView: shape (4294967296, 4294967296, 2) has more elements"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                (TensorView<float, 2>(&x, {kTwo32, kTwo32}));
              }),
              HasSubstr("(4294967296, 4294967296)"));
  const TensorView<float, 1> broadcast(&x, {kTwo62}, {0});  // fits: 2^62 elements
  EXPECT_EQ(broadcast.size(), kTwo62);
}

TEST(ShapeSize, ReshapeToAShapeThatOverflowsThrows) {
  float x[4] = {};
  const TensorView<float, 1> v(x, {4});
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                (attn::reshape(v, Shape<3>{kTwo32, kTwo32, -1}));
              }),
              HasSubstr("the element count overflows"));
  EXPECT_THAT(attn::test::thrown<attn::ShapeError>([&] {
                (attn::reshape(v, Shape<3>{kTwo32, kTwo32, 4}));
              }),
              HasSubstr("overflows"));
}

TYPED_TEST(TensorTest, StorageIs64ByteAligned) {
  for (const Index n : {1, 3, 7, 17, 100, 1001}) {
    Tensor<TypeParam, 2> t({n, 3});
    EXPECT_TRUE(is_aligned_64(t.data())) << "n=" << n;
    const Tensor<TypeParam, 2> copy(t);
    EXPECT_TRUE(is_aligned_64(copy.data())) << "n=" << n;
    t.resize({4 * n, 5});
    EXPECT_TRUE(is_aligned_64(t.data())) << "n=" << n;
  }
}

TYPED_TEST(TensorTest, ConvertsImplicitlyToViews) {
  Tensor<TypeParam, 2> t({2, 3});
  set_all<TypeParam>(t, TypeParam(2));  // Tensor& -> TensorView<Scalar, 2>
  const Tensor<TypeParam, 2>& ct = t;
  EXPECT_EQ(sum_of<TypeParam>(ct), TypeParam(12));  // const Tensor& -> read-only view
  EXPECT_EQ(sum_of<TypeParam>(t), TypeParam(12));   // Tensor& -> read-only view
  const TensorView<const TypeParam, 2> v = ct;
  EXPECT_EQ(v.data(), t.data());
  EXPECT_TRUE(v.is_contiguous());
}

TYPED_TEST(TensorTest, ElementAccessMatchesView) {
  Tensor<TypeParam, 3> t({2, 3, 4});
  for (Index i = 0; i < t.size(); ++i) t.data()[i] = TypeParam(i);
  EXPECT_EQ(t(1, 2, 3), TypeParam(23));
  EXPECT_EQ(t.at(1, 0, 2), TypeParam(14));
  t.at(0, 1, 1) = TypeParam(-5);
  EXPECT_EQ(t.view()(0, 1, 1), TypeParam(-5));
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { t.at(0, 3, 0); }),
              HasSubstr("index 3 is out of bounds for axis 1 with size 3"));
  const Tensor<TypeParam, 3>& ct = t;
  EXPECT_THAT(attn::test::thrown<std::out_of_range>([&] { ct.at(0, 0, 4); }),
              HasSubstr("index 4 is out of bounds for axis 2 with size 4"));
}

TEST(TensorBool, HoldsMasks) {
  Tensor<bool, 2> mask({2, 2});
  EXPECT_FALSE(mask(1, 1));
  mask(0, 1) = true;
  EXPECT_THAT(mask.to_vector(), ElementsAre(false, true, false, false));
}

}  // namespace

}  // namespace tensor_test

#include "support/bodies_end.hpp"
