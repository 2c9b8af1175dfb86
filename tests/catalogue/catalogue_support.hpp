// SPDX-License-Identifier: MIT
// tests/catalogue/catalogue_support.hpp: helpers for the notebook catalogue tests (C arrays
// from fixtures/notebook/catalogue.hpp to tensors, vectors and gmock matchers).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "fixtures/notebook/catalogue.hpp"

namespace attn::test::catalogue {

/// The scalar types every computation is checked in.
using Scalars = ::testing::Types<float, double>;

/// Readable typed-test names: "Suite/float", "Suite/double".
struct ScalarName {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "float" : "double";
  }
};

namespace detail {

template <class T>
void append(std::vector<double>& out, const T& value) {
  if constexpr (std::is_array_v<T>) {
    for (const auto& element : value) append(out, element);
  } else {
    out.push_back(static_cast<double>(value));
  }
}

template <class T, std::size_t... Axes>
constexpr Shape<sizeof...(Axes)> extents_of(std::index_sequence<Axes...>) {
  return {static_cast<Index>(std::extent_v<T, Axes>)...};
}

}  // namespace detail

/// The elements of a (nested) C array in row-major order, as doubles (bool -> 0/1).
template <class T>
std::vector<double> flat(const T& array) {
  std::vector<double> out;
  detail::append(out, array);
  return out;
}

/// The same, each value rounded to float32 first: what a bit-exact float result must equal.
template <class T>
std::vector<double> flat_float32(const T& array) {
  std::vector<double> out = flat(array);
  for (double& v : out) v = static_cast<double>(static_cast<float>(v));
  return out;
}

/// The extents of a C array type as an attn::Shape.
template <class T>
constexpr Shape<std::rank_v<T>> shape_of(const T&) {
  return detail::extents_of<T>(std::make_index_sequence<std::rank_v<T>>{});
}

/// A 1-D catalogue shape (e.g. shape_q = {2, 2, 10, 4}) as an attn::Shape.
template <std::size_t N>
Shape<N> shape(const std::ptrdiff_t (&extents)[N]) {
  Shape<N> s{};
  for (std::size_t i = 0; i < N; ++i) s[i] = extents[i];
  return s;
}

/// A tensor holding a catalogue array (input data or weights), converted to Scalar.
template <class Scalar, class T>
Tensor<Scalar, std::rank_v<T>> tensor(const T& array) {
  Tensor<Scalar, std::rank_v<T>> t(shape_of(array));
  const std::vector<double> values = flat(array);
  for (std::size_t i = 0; i < values.size(); ++i) {
    t.data()[i] = static_cast<Scalar>(values[i]);
  }
  return t;
}

/// The elements of any view (any element type, any strides) in row-major order, as doubles.
template <class Element, std::size_t Rank>
std::vector<double> values(TensorView<Element, Rank> v) {
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(v.size()));
  const Element* data = v.data();
  attn::detail::for_each_offset(v.shape(), v.strides(), v.strides(), [&](Index o, Index) {
    out.push_back(static_cast<double>(data[o]));
  });
  return out;
}
template <class Element, std::size_t Rank>
std::vector<double> values(const Tensor<Element, Rank>& t) {
  return values(t.view());
}

/// Matches a vector of doubles (from values()) element-wise within `atol` of a catalogue
/// array. Equal infinities match (gmock's DoubleNear compares for equality first); NaN
/// never matches.
template <class T>
auto Near(const T& expected, double atol) {
  return ::testing::Pointwise(::testing::DoubleNear(atol), flat(expected));
}

/// Matches a vector of doubles exactly (masks, bit-exact float32 weights).
template <class T>
auto Exactly(const T& expected) {
  return ::testing::ElementsAreArray(flat(expected));
}
template <class T>
auto ExactlyFloat32(const T& expected) {
  return ::testing::ElementsAreArray(flat_float32(expected));
}

/// Largest |a[i] - b[i]| (infinity if the sizes differ).
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

/// Copies a catalogue weight (nn.Linear layout [out][in]) into a Linear or a LinearView.
template <class Scalar, class Layer, class T>
void load_weight(Layer&& layer, const T& weight_out_in) {
  const Tensor<Scalar, 2> w = tensor<Scalar>(weight_out_in);
  layer.set_weight(w.view());
}

/// (n, rows, cols) batch holding `n` copies of x: torch.stack((x, x, ...), dim=0),
/// assembled with attn::copy into attn::select views.
template <class Scalar>
Tensor<Scalar, 3> stack_copies(const Tensor<Scalar, 2>& x, Index n) {
  Tensor<Scalar, 3> batch({n, x.extent(0), x.extent(1)});
  for (Index b = 0; b < n; ++b) copy(x.view(), select(batch.view(), 0, b));
  return batch;
}

/// Notebook 003's 6x3 `inputs` ("Your journey starts with one step", In [168]) as the
/// catalogue stores it (In [185]'s input; every 003 case uses the same literal).
template <class Scalar>
Tensor<Scalar, 2> journey_inputs() {
  return tensor<Scalar>(notebook::nb003::in185::input_inputs);
}

}  // namespace attn::test::catalogue
