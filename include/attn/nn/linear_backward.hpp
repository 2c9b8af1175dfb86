// SPDX-License-Identifier: MIT
// attn/nn/linear_backward.hpp: the backward of a fully connected layer y = x W^T + b, shared
// by Linear and the modules' projections (QkvProjection): in the layer's own type, and for
// bfloat16 and float16 layers with products on their own operands and float sums (the operands
// staged in L1-sized tiles).
#pragma once

#include <algorithm>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/ops/convert.hpp"
#include "attn/ops/gemm.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// The backward of y = x W^T + b over `rows` rows, ADDING into the gradients given (a null
/// pointer or empty layout skips one): grad_x += grad_y W, grad_w += grad_y^T x (W's
/// (out, in) row-major layout), grad_b += the column sums of grad_y. x is row-major with
/// leading dimension ldx; grad_y and grad_x in any GemmOutput layout (head-major included).
template <class Scalar>
void linear_backward(Index rows, TensorView<const Scalar, 2> weight, const Scalar* x, Index ldx,
                     const GemmOutput<const Scalar>& grad_y, const GemmOutput<Scalar>& grad_x,
                     Scalar* grad_w, Scalar* grad_b, Workspace* ws) {
  const Index out = weight.extent(0), in = weight.extent(1);
  ATTN_ASSERT(weight.is_contiguous());
  if (grad_x.data != nullptr) {
    gemm_nn(rows, in, out, grad_y, false, weight.data(), in, grad_x, true, ws);
  }
  if (grad_w != nullptr) {
    gemm_nn(out, in, rows, grad_y, true, x, ldx, GemmOutput<Scalar>::row_major(grad_w, in), true,
            ws);
  }
  if (grad_b != nullptr) column_sums(rows, out, grad_y, grad_b);
}

/// dst (cols, rows), leading dimension ldd, = the transpose of src (rows, cols), leading
/// dimension lds, for 16-bit elements, on the active kernel set (transpose_16bit(): in
/// registers with AVX-512, in L1-sized tiles everywhere).
template <class T>
void transpose_tiles(Index rows, Index cols, const T* src, Index lds, T* dst, Index ldd) {
  with_kernels(kernel_isa(),
               [&](auto set) { set.transpose_16bit(rows, cols, src, lds, dst, ldd); });
}

/// to[i] = Narrow(float(to[i]) + add[i]) for i < count (Narrow bfloat16 or float16): each
/// gradient widened, the float result added and rounded once (nearest even), through the
/// kernel set's conversions (the same bits as the scalar ones) a stack chunk at a time.
template <class Narrow>
void add_rounded(Narrow* to, const float* add, Index count) {
  with_kernels(kernel_isa(), [&](auto set) {
    constexpr Index kChunk = 512;  // 2 KiB of floats
    float wide[kChunk];
    for (Index e = 0; e < count; e += kChunk) {
      const Index run = std::min(kChunk, count - e);
      set.convert_row(static_cast<const Narrow*>(to + e), wide, run);
      for (Index i = 0; i < run; ++i) wide[i] += add[e + i];
      set.convert_row(static_cast<const float*>(wide), to + e, run);
    }
  });
}

/// The backward of a layer y = x W^T + b of Narrow (bfloat16 or float16) over m rows, with
/// products on Narrow operands and float sums (the GEMM on 16-bit operands, gemm_nt: bfloat16 on
/// the path bf16_path() names, float16 widened, exact products), ADDING into the Narrow
/// gradients given, each element rounded once. grad_y (m, n) in any GemmOutput layout, of
/// Narrow or of float (then rounded once to Narrow here: the GEMMs' operand); W (n, in)
/// contiguous; x row-major with leading dimension ldx.
///   - grad_x_wide, when not null: dY W (m, in), row-major, written in float (not added);
///     else grad_x, when not empty: += dY W;
///   - grad_w (n, in) row-major, when not null: += dY^T X;
///   - grad_b (n), when not null: += the column sums of grad_y as given (float, rows in
///     order: the float values, not their rounding, when grad_y is float).
/// The GEMM takes row-major A and B^T only, so W^T, dY^T and X^T are staged as Narrow and dY
/// too unless it is a row-major Narrow matrix already (WorkspaceSlot::kNarrowBackward:
/// O(m n + in (m + n)) copies beside the O(m n in) products): conversions on the kernel set,
/// transposes in L1-sized tiles (transpose_tiles). W^T is staged on every call, not kept: the
/// optimizer rewrites W between backwards, and its transpose costs a copy of W. The float
/// products wait in kWideOutput before they are added.
///   1. dY (m, n) as Narrow rows, and the float column sums of dY (the bias gradient);
///   2. dX = dY W: W^T (in, n), then gemm_nt(dY, W^T), added into grad_x (or written wide);
///   3. dW = dY^T X: dY^T (n, m) and X^T (in, m), then gemm_nt(dY^T, X^T), added into grad_w.
template <class Narrow, class DyElement>
void linear_backward_narrow(Index m, TensorView<const Narrow, 2> weight, const Narrow* x, Index ldx,
                            const GemmOutput<const DyElement>& grad_y, float* grad_x_wide,
                            const GemmOutput<Narrow>& grad_x, Narrow* grad_w, Narrow* grad_b,
                            Workspace& ws) {
  static_assert(is_gemm_storage_v<Narrow>, "a bfloat16 or float16 layer");
  const Index n = weight.extent(0), in = weight.extent(1);
  ATTN_ASSERT(weight.is_contiguous());
  if (m <= 0 || n <= 0) return;
  const auto lines = [](Index count) { return (count + 31) / 32 * 32; };  // whole 64-byte lines
  // Scratch: dY (m, n), dY^T (n, m), W^T (in, n), X^T (in, m).
  Narrow* dy = workspace_get<Narrow>(ws, WorkspaceSlot::kNarrowBackward,
                                     2 * lines(m * n) + lines(in * n) + in * m);
  Narrow* dyt = dy + lines(m * n);
  Narrow* wt = dyt + lines(m * n);
  Narrow* xt = wt + lines(in * n);
  // Float scratch: the column sums (n), then one product, (m, in) or (n, in).
  float* sums =
      workspace_get<float>(ws, WorkspaceSlot::kWideOutput, lines(n) + std::max(m, n) * in);
  float* product = sums + lines(n);
  std::fill(sums, sums + n, 0.0f);

  // 1. dY's rows (ldy apart) and the column sums.
  const Index segment = grad_y.segment > 0 ? grad_y.segment : n;
  const Narrow* dy_rows = dy;
  Index ldy = n;
  // Each row of dY in its runs of contiguous columns (one per segment), into dy's rows.
  const auto for_each_run = [&](auto&& copy) {
    for (Index i = 0; i < m; ++i) {
      for (Index c = 0; c < n;) {
        const Index run = std::min(segment - c % segment, n - c);
        copy(grad_y.row(i) + grad_y.column(c, segment), dy + i * n + c, run);
        c += run;
      }
    }
  };
  if constexpr (std::is_same_v<DyElement, float>) {
    column_sums(m, n, grad_y, sums);
    with_kernels(kernel_isa(), [&](auto set) {
      for_each_run(
          [&](const float* from, Narrow* to, Index run) { set.convert_row(from, to, run); });
    });
  } else {
    static_assert(std::is_same_v<DyElement, Narrow>, "grad_y of the layer's type or float");
    if (grad_y.rows_per_batch <= 0 && segment >= n) {  // row-major already: read in place
      dy_rows = grad_y.data;
      ldy = grad_y.ldc;
    } else {
      for_each_run(
          [](const Narrow* from, Narrow* to, Index run) { std::copy(from, from + run, to); });
    }
    with_kernels(kernel_isa(), [&](auto set) {  // widened exactly, a stack chunk at a time
      constexpr Index kChunk = 512;
      float wide[kChunk];
      for (Index i = 0; i < m; ++i) {
        for (Index c = 0; c < n; c += kChunk) {
          const Index run = std::min(kChunk, n - c);
          set.convert_row(dy_rows + i * ldy + c, wide, run);
          for (Index j = 0; j < run; ++j) sums[c + j] += wide[j];
        }
      }
    });
  }

  // 2. dX = dY W.
  const float* no_bias = nullptr;
  if (grad_x_wide != nullptr || grad_x.data != nullptr) {
    transpose_tiles(n, in, weight.data(), in, wt, n);
    float* dx = grad_x_wide != nullptr ? grad_x_wide : product;
    gemm_nt<float, Narrow>(m, in, n, dy_rows, ldy, wt, n, dx, in, no_bias, {}, &ws);
    if (grad_x_wide == nullptr) {
      for (Index i = 0; i < m; ++i) add_rounded(grad_x.row(i), dx + i * in, in);
    }
  }
  // 3. dW = dY^T X.
  if (grad_w != nullptr) {
    transpose_tiles(m, n, dy_rows, ldy, dyt, m);
    transpose_tiles(m, in, x, ldx, xt, m);
    gemm_nt<float, Narrow>(n, in, m, dyt, m, xt, m, product, in, no_bias, {}, &ws);
    add_rounded(grad_w, product, n * in);
  }
  if (grad_b != nullptr) add_rounded(grad_b, sums, n);
}

}  // namespace detail

ATTN_NAMESPACE_END
