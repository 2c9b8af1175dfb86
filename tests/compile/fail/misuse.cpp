// SPDX-License-Identifier: MIT
// tests/compile/fail/misuse.cpp: code that must NOT compile, one case per ATTN_MISUSE_CASE.
// tests/cmake/CMakeLists.txt builds each case and checks the compiler's message; case 0 is the
// control and must compile. (Not in tests/compile/*.cpp, which must all compile.)
// Only the headers the cases need, so each case compiles in a second or two.
#include <vector>

#include "attn/nn/linear.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#if ATTN_MISUSE_CASE == 8
#include "attn/tensor/eigen.hpp"
#endif
#if ATTN_MISUSE_CASE == 9
#include "attn/nn/gradients.hpp"
#include "attn/types/float8.hpp"
#endif
#if ATTN_MISUSE_CASE == 10
#include "attn/attention/multi_head_attention.hpp"
#endif
#if ATTN_MISUSE_CASE == 11
#include "attn/optim/mixed_precision.hpp"
#include "attn/optim/sgd.hpp"
#endif

namespace {

[[maybe_unused]] void misuse() {
  float data[6] = {0, 1, 2, 3, 4, 5};
  const attn::TensorView<float, 2> mutable_view(data, {2, 3});
  const attn::TensorView<const float, 2> const_view = mutable_view;
  const attn::Tensor<float, 2> const_tensor({2, 3});
#if ATTN_MISUSE_CASE == 0
  mutable_view(1, 2) = const_view(0, 0) + const_tensor(0, 0);  // the control: all fine
#elif ATTN_MISUSE_CASE == 1
  const_view(0, 0) = 1.0f;  // a read-only view hands out const elements
#elif ATTN_MISUSE_CASE == 2
  attn::TensorView<float, 2> back = const_view;  // never read-only -> mutable
  back(0, 0) = 1.0f;
#elif ATTN_MISUSE_CASE == 3
  attn::TensorView<float, 2> from_const = const_tensor;  // a const tensor gives read-only views
  from_const(0, 0) = 1.0f;
#elif ATTN_MISUSE_CASE == 4
  mutable_view(1) = 1.0f;  // rank 2 takes two indices
#elif ATTN_MISUSE_CASE == 5
  attn::Tensor<const float, 2> t;
  (void)t;
#elif ATTN_MISUSE_CASE == 6
  attn::Linear<int> layer;
  (void)layer;
#elif ATTN_MISUSE_CASE == 7
  const attn::TensorView<float, 1> line(data, {6});
  (void)attn::select(line, 0, 1);
#elif ATTN_MISUSE_CASE == 8
  const Eigen::MatrixXf matrix = Eigen::MatrixXf::Zero(2, 2);
  attn::TensorView<float, 2> writable = attn::as_view(matrix);  // a const object is read-only
  writable(0, 0) = 1.0f;
#elif ATTN_MISUSE_CASE == 9
  // float8 is a storage type for KV caches and conversions: no module of it trains.
  (void)const_view;
  (void)sizeof(attn::Gradients<attn::float8_e4m3>);
#elif ATTN_MISUSE_CASE == 10
  // A bfloat16 module returns no attention weights.
  (void)const_view;
  const attn::MultiHeadAttention<attn::bfloat16> m(attn::MultiHeadAttentionOptions::pytorch(8, 2));
  const attn::Tensor<attn::bfloat16, 3> x({1, 2, 8});
  (void)m.forward_with_weights(x.view());  // the streaming kernel returns no weights
#elif ATTN_MISUSE_CASE == 11
  (void)const_view;
  // MixedPrecision keeps float masters of a 16-bit module, not of a float one.
  (void)sizeof(attn::optim::MixedPrecision<attn::optim::SGD<float>, float>);
#endif
}

}  // namespace
