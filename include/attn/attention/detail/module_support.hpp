// SPDX-License-Identifier: MIT
// attn/attention/detail/module_support.hpp: input checks and staging shared by the modules.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// A (rows, cols) row-major matrix in memory: data, leading dimension.
template <class Scalar>
struct RowsRef {
  Scalar* data = nullptr;
  Index rows = 0, cols = 0, ld = 0;
};

/// x (B, T, d) as a (B*T, d) matrix with unit inner stride; copies into workspace `slot`
/// only when the strides do not allow that view.
template <class Scalar>
RowsRef<const Scalar> as_rows(TensorView<const Scalar, 3> x, Workspace& ws, WorkspaceSlot slot) {
  const Index batch = x.extent(0), tokens = x.extent(1), cols = x.extent(2);
  const Index rows = batch * tokens;
  Index ld = cols;
  bool direct = x.stride(2) == 1 || cols == 1;
  if (tokens == 1) {
    ld = batch == 1 ? cols : x.stride(0);
  } else {
    ld = x.stride(1);
    direct = direct && (batch == 1 || x.stride(0) == tokens * x.stride(1));
  }
  if (direct && ld >= cols) return {x.data(), rows, cols, ld};
  Scalar* staged = workspace_get<Scalar>(ws, slot, rows * cols);
  copy(x, TensorView<Scalar, 3>(staged, x.shape()));
  return {staged, rows, cols, cols};
}

template <class A, class B, std::size_t Rank>
bool same_view(const TensorView<A, Rank>& a, const TensorView<B, Rank>& b) noexcept {
  return static_cast<const void*>(a.data()) == static_cast<const void*>(b.data()) &&
         a.shape() == b.shape() && a.strides() == b.strides();
}

/// Throws ConfigError when a sequence is longer than the module's context length
/// (0 = unlimited).
inline void check_context(const char* where, const char* name, Index tokens, Index context_length) {
  require_config(context_length <= 0 || tokens <= context_length, where, [&] {
    return std::string(name) + " has " + std::to_string(tokens) +
           " tokens, more than context_length=" + std::to_string(context_length);
  });
}

/// Throws ShapeError unless x is (B, T, features) with every extent positive.
template <class Scalar>
void check_input(const char* where, const char* name, const TensorView<const Scalar, 3>& x,
                 Index features, const char* feature_name) {
  require(x.extent(2) == features && x.extent(0) > 0 && x.extent(1) > 0, where, [&] {
    if (x.empty()) {
      return std::string(name) + " has shape " + to_string(x.shape()) +
             ": empty inputs are not allowed";
    }
    return std::string(name) + " has shape " + to_string(x.shape()) + ", expected (B, T, " +
           std::to_string(features) + ") with " + feature_name + "=" + std::to_string(features);
  });
}

/// Throws ShapeError unless `out` has exactly `expected`.
template <class Scalar>
void check_output(const char* where, const TensorView<Scalar, 3>& out, const Shape<3>& expected) {
  require(out.shape() == expected, where, [&] {
    return "out has shape " + to_string(out.shape()) + ", expected " + to_string(expected);
  });
}

}  // namespace detail
ATTN_NAMESPACE_END
