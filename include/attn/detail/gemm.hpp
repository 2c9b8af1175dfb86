// SPDX-License-Identifier: MIT
// attn/detail/gemm.hpp: the matrix products behind Linear and the projections.
#pragma once

#include <Eigen/Core>

#include "attn/config.hpp"
#include "attn/tensor/eigen.hpp"

namespace attn {
namespace detail {

/// C (m, n) = A (m, k) * B (n, k)^T [+ bias (n) on every row]; all row-major with the
/// given leading dimensions. This is y = x W^T + b with W in torch.nn.Linear's layout.
template <class Scalar>
void gemm_nt(Index m, Index n, Index k, const Scalar* a, Index lda, const Scalar* b, Index ldb,
             Scalar* c, Index ldc, const Scalar* bias) {
  if (m <= 0 || n <= 0) return;
  MatrixMap<Scalar> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k <= 0) {
    cm.setZero();
  } else {
    MatrixMap<const Scalar> am(a, m, k, Eigen::OuterStride<>(lda));
    MatrixMap<const Scalar> bm(b, n, k, Eigen::OuterStride<>(ldb));
    cm.noalias() = am * bm.transpose();
  }
  if (bias != nullptr) cm.rowwise() += Eigen::Map<const RowVector<Scalar>>(bias, n);
}

}  // namespace detail
}  // namespace attn
