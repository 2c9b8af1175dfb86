// SPDX-License-Identifier: MIT
// attn/attention/scaled_dot_product.hpp: the shared kernel, softmax(Q K^T * scale + mask) V,
// with a materialised path (returns weights; the reference) and a streaming path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "attn/attention/detail/kernel.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/kernels/types.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/mask.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

/// Which algorithm computes the attention. Both give the same result within rounding
/// (see the README's tolerance table); kAuto picks streaming unless weights are requested.
enum class AttentionPath {
  kAuto,
  /// Scores (T_q, T_k) per head, softmax, weights times V. Can return the weights.
  kMaterialized,
  /// Tiles of K/V with an online softmax: O(T * head_dim) extra memory, causal tiles above
  /// the diagonal skipped. Cannot return weights.
  kStreaming,
};

/// Options of scaled_dot_product_attention().
struct AttentionOptions {
  /// Multiplies Q K^T; unset means 1/sqrt(head_dim). Set 1.0 for unscaled attention. It must
  /// be finite in the attention's scalar type (|scale| <= 3.4e38 for float); one that rounds
  /// to 0 there is accepted (scores that small give uniform weights anyway).
  std::optional<double> scale;
  /// Inverted dropout on the attention weights with this probability (0 = off). The
  /// keep decisions are a hash of (dropout_seed, dropout_call, batch, head, query, key).
  double dropout = 0.0;
  std::uint64_t dropout_seed = kDefaultDropoutSeed;
  std::uint64_t dropout_call = 0;
  AttentionPath path = AttentionPath::kAuto;
};

namespace detail {

template <class Scalar>
const char* scalar_name() noexcept {
  return std::is_same_v<Scalar, float> ? "float" : "double";
}

/// The memory a call writes: `out` and `weights` (empty: none) each have one location per
/// element, share none with each other, and none with the mask's tensors (boolean, additive,
/// key padding), which are read while they are written. For the kernel and every module
/// (whose `out` is (B, T_q, D)).
template <class Scalar, std::size_t OutRank>
void check_output_memory(const char* where, TensorView<Scalar, OutRank> out,
                         TensorView<Scalar, 4> weights, const AttentionMask<Scalar>& mask) {
  require_distinct_elements(where, "out", out);
  require_distinct_elements(where, "weights", weights);
  require_disjoint(where, "weights", weights, "out", out);
  const auto mask_disjoint = [&](const char* name, const auto& written) {
    require_disjoint(where, name, written, "the boolean mask", mask.bool_mask());
    require_disjoint(where, name, written, "the additive mask", mask.additive_mask());
    require_disjoint(where, name, written, "the key padding mask", mask.padding_mask());
  };
  mask_disjoint("out", out);
  mask_disjoint("weights", weights);
}

/// Memory contract of the kernel: check_output_memory(), and neither output shares memory
/// with k or v; `out` is either disjoint from q or q itself (same data, shape and strides).
/// That exact aliasing is safe on both paths: each task (one batch, head and query tile) reads
/// its q rows (into the packed Q^T, or into the scores) before it writes the same out rows,
/// and no task reads another's rows. A partial overlap is not.
template <class Scalar>
void check_sdpa_memory(const char* where, TensorView<const Scalar, 4> q,
                       TensorView<const Scalar, 4> k, TensorView<const Scalar, 4> v,
                       TensorView<Scalar, 4> out, TensorView<Scalar, 4> weights,
                       const AttentionMask<Scalar>& mask) {
  check_output_memory(where, out, weights, mask);
  if (!same_view(q, out)) require_disjoint(where, "out", out, "q", q);
  require_disjoint(where, "out", out, "k", k);
  require_disjoint(where, "out", out, "v", v);
  require_disjoint(where, "weights", weights, "q", q);
  require_disjoint(where, "weights", weights, "k", k);
  require_disjoint(where, "weights", weights, "v", v);
}

template <class Scalar>
void check_sdpa(const char* where, TensorView<const Scalar, 4> q, TensorView<const Scalar, 4> k,
                TensorView<const Scalar, 4> v, TensorView<Scalar, 4> out,
                TensorView<Scalar, 4> weights, const AttentionMask<Scalar>& mask,
                const AttentionOptions& options) {
  const Index b = q.extent(0), h = q.extent(1), tq = q.extent(2), d = q.extent(3);
  const Index tk = k.extent(2), dv = v.extent(3);
  const auto shapes = [&] {
    return "q " + to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " +
           to_string(v.shape());
  };
  require(!q.empty() && !k.empty() && !v.empty(), where,
          [&] { return "empty input: " + shapes() + " (every extent must be positive)"; });
  require(k.extent(0) == b && v.extent(0) == b, where,
          [&] { return "batch sizes differ: " + shapes(); });
  require(k.extent(1) == v.extent(1), where,
          [&] { return "key and value must have the same number of heads: " + shapes(); });
  require(h % k.extent(1) == 0, where, [&] {
    return "number of heads in key and value must divide the number of heads in query "
           "(grouped-query attention: query head h reads key/value head h / (H / H_kv)): " +
           shapes();
  });
  require(k.extent(3) == d, where, [&] { return "q and k head dimensions differ: " + shapes(); });
  require(v.extent(2) == tk, where, [&] { return "k and v sequence lengths differ: " + shapes(); });
  const Shape<4> out_shape{b, h, tq, dv};
  require(out.shape() == out_shape, where, [&] {
    return "out has shape " + to_string(out.shape()) + ", expected " + to_string(out_shape) +
           " for " + shapes();
  });
  require(weights.data() == nullptr || weights.shape() == Shape<4>{b, h, tq, tk}, where, [&] {
    return "weights has shape " + to_string(weights.shape()) + ", expected " +
           to_string(Shape<4>{b, h, tq, tk});
  });
  const auto unit = [](const auto& view) { return view.stride(3) == 1 || view.extent(3) == 1; };
  require(
      unit(q) && unit(k) && unit(v) && unit(out) && (weights.data() == nullptr || unit(weights)),
      where, [&] {
        return "the last axis of q, k, v, out and weights must have stride 1 (got q " +
               to_string(q.strides()) + ", k " + to_string(k.strides()) + ", v " +
               to_string(v.strides()) + ", out " + to_string(out.strides()) +
               "); pass contiguous() copies";
      });
  require_config(options.dropout >= 0.0 && options.dropout < 1.0, where,
                 [&] { return "dropout=" + number(options.dropout) + " must be in [0, 1)"; });
  require_config(!options.scale || std::isfinite(*options.scale), where,
                 [&] { return "scale=" + number(*options.scale) + " must be finite"; });
  // The kernel multiplies by the scale in Scalar: a double past Scalar's range would become
  // inf there (and every score inf or NaN). A scale that underflows to 0 is kept: scores that
  // small give uniform weights in any precision.
  require_config(
      !options.scale || std::abs(*options.scale) <= std::numeric_limits<Scalar>::max(), where, [&] {
        return "scale=" + number(*options.scale) + " is not finite as " + scalar_name<Scalar>() +
               " (largest " + number(std::numeric_limits<Scalar>::max()) + ")";
      });
  require(!(options.path == AttentionPath::kStreaming && weights.data() != nullptr), where, [] {
    return std::string("the streaming path cannot return attention weights; use kMaterialized");
  });
  const bool materialized =
      weights.data() != nullptr || options.path == AttentionPath::kMaterialized;
  require(!materialized || materialized_scratch_fits<Scalar>(d, dv, tk), where, [&] {
    return "the materialised path would need a score block of " + std::to_string(kQueryBlock) +
           " x " + std::to_string(tk) +
           " elements per thread, more than fits in memory: " + shapes();
  });
  mask.check(where, b, h, tq, tk);
  check_sdpa_memory(where, q, k, v, out, weights, mask);
}

/// A logsumexp output (B, H, T_q) for q: its shape, one location per element, and no memory
/// shared with the inputs, the other outputs or the mask.
template <class Scalar>
void check_logsumexp(const char* where, TensorView<const Scalar, 4> q,
                     TensorView<const Scalar, 4> k, TensorView<const Scalar, 4> v,
                     TensorView<Scalar, 3> lse, TensorView<Scalar, 4> out,
                     TensorView<Scalar, 4> weights, const AttentionMask<Scalar>& mask) {
  const Shape<3> expected{q.extent(0), q.extent(1), q.extent(2)};
  require(lse.shape() == expected, where, [&] {
    return "logsumexp has shape " + to_string(lse.shape()) + ", expected " + to_string(expected) +
           " (B, H, T_q) for q " + to_string(q.shape());
  });
  require_distinct_elements(where, "logsumexp", lse);
  require_disjoint(where, "logsumexp", lse, "q", q);
  require_disjoint(where, "logsumexp", lse, "k", k);
  require_disjoint(where, "logsumexp", lse, "v", v);
  require_disjoint(where, "logsumexp", lse, "out", out);
  require_disjoint(where, "logsumexp", lse, "weights", weights);
  require_disjoint(where, "logsumexp", lse, "the boolean mask", mask.bool_mask());
  require_disjoint(where, "logsumexp", lse, "the additive mask", mask.additive_mask());
  require_disjoint(where, "logsumexp", lse, "the key padding mask", mask.padding_mask());
}

/// Checks, then runs the kernel. `module_causal` adds a module's own causal bound to `mask`
/// without copying the mask. `lse`, when not empty, (B, H, T_q) receives each query's
/// logsumexp (for the backward, attention/scaled_dot_product_backward.hpp).
template <class Scalar>
void attend(const char* where, TensorView<const Scalar, 4> q, TensorView<const Scalar, 4> k,
            TensorView<const Scalar, 4> v, TensorView<Scalar, 4> out,
            const AttentionMask<Scalar>& mask, const AttentionOptions& options,
            TensorView<Scalar, 4> weights, Workspace& workspace, bool module_causal = false,
            CausalAlignment module_alignment = CausalAlignment::kSquare, Index module_window = 0,
            TensorView<Scalar, 3> lse = {}) {
  check_sdpa(where, q, k, v, out, weights, mask, options);
  if (lse.data() != nullptr) check_logsumexp(where, q, k, v, lse, out, weights, mask);
  if (module_causal && module_alignment == CausalAlignment::kSquare) {
    require(q.extent(2) == k.extent(2), where, [&] {
      return "causal attention with T_q=" + std::to_string(q.extent(2)) +
             " != T_k=" + std::to_string(k.extent(2)) +
             ": set a causal alignment (kTopLeft or kBottomRight) explicitly";
    });
  }
  KernelParams<Scalar> params;
  params.q = q;
  params.k = k;
  params.v = v;
  params.out = out;
  params.weights = weights;
  params.lse = lse;
  params.mask = &mask;
  params.module_causal = module_causal;
  params.module_alignment = module_alignment;
  params.module_window = module_window;
  params.scale = static_cast<Scalar>(
      options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(q.extent(3))));
  params.dropout = options.dropout;
  params.dropout_seed = options.dropout_seed;
  params.dropout_call = options.dropout_call;
  const bool materialize =
      weights.data() != nullptr || options.path == AttentionPath::kMaterialized;
  run_attention(params, materialize, workspace);
}

}  // namespace detail

namespace detail {

/// T itself, in a non-deduced context: q, k and v take any view that converts to a const
/// view of the Scalar that `out` fixes (mutable views included).
template <class T>
struct identity {
  using type = T;
};
template <class T>
using identity_t = typename identity<T>::type;

}  // namespace detail

/// Scaled dot-product attention on strided views, writing into `out`:
/// out = softmax(q k^T * scale + mask) v, per (batch, head), with optional inverted dropout
/// on the weights. Vaswani et al., "Attention Is All You Need" (2017).
///
/// Arguments come in the order every attn call uses: inputs, outputs, workspace, mask,
/// options (the modules' forward(x, out, ws, mask) is the same order). The workspace may be
/// left out (a temporary one is used); with one, a steady-state call does not allocate.
///
/// Shapes: q (B, H, T_q, d), k (B, H_kv, T_k, d), v (B, H_kv, T_k, d_v) -> out (B, H, T_q,
/// d_v). H_kv = H is multi-head attention; H_kv dividing H is grouped-query (H_kv = 1:
/// multi-query) attention, PyTorch's enable_gqa: query head h reads key/value head
/// h / (H / H_kv), with no copy of K or V. Masks and weights have H heads.
/// The last axis of every view must have stride 1; the other strides are free (heads split
/// by view work directly). `out` may be `q` itself (same data, shape and strides: in place,
/// when d_v == d); otherwise `out` and `weights` must share no memory with q, k, v, the
/// mask or each other, and each needs one location per element (no zero strides).
///
/// A query row with no visible key (fully masked) gives zeros in `out`. Runs in parallel
/// over (batch, head, query tile) when built with OpenMP; results are bit-identical for any
/// thread count.
///
/// @throws ShapeError on mismatched or empty shapes, a misfitting mask, non-unit inner
///         strides, or outputs that share memory as above; ConfigError on dropout outside
///         [0, 1) or a scale that is not finite as a double or as Scalar.
template <class Scalar>
void scaled_dot_product_attention(TensorView<const detail::identity_t<Scalar>, 4> q,
                                  TensorView<const detail::identity_t<Scalar>, 4> k,
                                  TensorView<const detail::identity_t<Scalar>, 4> v,
                                  TensorView<Scalar, 4> out, Workspace& workspace,
                                  const AttentionMask<detail::identity_t<Scalar>>& mask = {},
                                  const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention: Scalar must be float or double");
  detail::attend("scaled_dot_product_attention", q, k, v, out, mask, options, {}, workspace);
}

/// The same with a temporary workspace.
template <class Scalar>
void scaled_dot_product_attention(TensorView<const detail::identity_t<Scalar>, 4> q,
                                  TensorView<const detail::identity_t<Scalar>, 4> k,
                                  TensorView<const detail::identity_t<Scalar>, 4> v,
                                  TensorView<Scalar, 4> out,
                                  const AttentionMask<detail::identity_t<Scalar>>& mask = {},
                                  const AttentionOptions& options = {}) {
  Workspace workspace;
  scaled_dot_product_attention<Scalar>(q, k, v, out, workspace, mask, options);
}

/// Also writes the attention weights (after dropout), (B, H, T_q, T_k), into `weights`,
/// which forces the materialised path (an empty `weights` view: none are written).
/// @throws as scaled_dot_product_attention(), and ShapeError with AttentionPath::kStreaming.
template <class Scalar>
void scaled_dot_product_attention_with_weights(
    TensorView<const detail::identity_t<Scalar>, 4> q,
    TensorView<const detail::identity_t<Scalar>, 4> k,
    TensorView<const detail::identity_t<Scalar>, 4> v, TensorView<Scalar, 4> out,
    TensorView<Scalar, 4> weights, Workspace& workspace,
    const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::scaled_dot_product_attention: Scalar must be float or double");
  detail::attend("scaled_dot_product_attention", q, k, v, out, mask, options, weights, workspace);
}

/// The same with a temporary workspace.
template <class Scalar>
void scaled_dot_product_attention_with_weights(
    TensorView<const detail::identity_t<Scalar>, 4> q,
    TensorView<const detail::identity_t<Scalar>, 4> k,
    TensorView<const detail::identity_t<Scalar>, 4> v, TensorView<Scalar, 4> out,
    TensorView<Scalar, 4> weights, const AttentionMask<detail::identity_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  Workspace workspace;
  scaled_dot_product_attention_with_weights<Scalar>(q, k, v, out, weights, workspace, mask,
                                                    options);
}

/// The result of every call that returns attention weights (the allocating
/// scaled_dot_product_attention_with_weights() and every module's forward_with_weights()):
/// the output (..., T_q, d_v) and the weights (..., T_q, T_k), after dropout. The weights
/// have rank WeightsRank: the output's for the kernel and single-head modules, one more
/// (a heads axis, (B, H, T_q, T_k)) for multi-head modules.
template <class Scalar, std::size_t Rank, std::size_t WeightsRank = Rank>
struct AttentionResult {
  Tensor<Scalar, Rank> output;
  Tensor<Scalar, WeightsRank> weights;
};

namespace detail {

template <class Scalar, std::size_t Rank>
TensorView<Scalar, 4> to_rank4(TensorView<Scalar, Rank> x) {
  static_assert(Rank >= 2 && Rank <= 4,
                "attn::scaled_dot_product_attention: inputs have rank 2 (T, d), 3 (B, T, d) "
                "or 4 (B, H, T, d)");
  if constexpr (Rank == 4) {
    return x;
  } else if constexpr (Rank == 3) {
    return unsqueeze(x, 1);
  } else {
    return unsqueeze(unsqueeze(x, 0), 0);
  }
}

template <class Scalar, std::size_t Rank>
AttentionResult<Scalar, Rank> sdpa_allocating(TensorView<const Scalar, Rank> q,
                                              TensorView<const Scalar, Rank> k,
                                              TensorView<const Scalar, Rank> v,
                                              const AttentionMask<Scalar>& mask,
                                              const AttentionOptions& options, bool need_weights) {
  Shape<Rank> out_shape = q.shape(), weights_shape = q.shape();
  out_shape[Rank - 1] = v.extent(Rank - 1);
  weights_shape[Rank - 1] = k.extent(Rank - 2);
  // Validate with the caller's rank first so messages show the shapes the caller passed.
  require(k.extent(Rank - 2) == v.extent(Rank - 2) && q.extent(Rank - 1) == k.extent(Rank - 1),
          "scaled_dot_product_attention", [&] {
            return "q " + to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " +
                   to_string(v.shape()) +
                   " do not fit (..., T_q, d), (..., T_k, d), (..., T_k, d_v)";
          });
  AttentionResult<Scalar, Rank> result;
  result.output = Tensor<Scalar, Rank>(out_shape);
  if (need_weights) result.weights = Tensor<Scalar, Rank>(weights_shape);
  TensorView<Scalar, 4> weights4{};
  if (need_weights) weights4 = to_rank4(result.weights.view());
  scaled_dot_product_attention_with_weights<Scalar>(to_rank4(q), to_rank4(k), to_rank4(v),
                                                    to_rank4(result.output.view()), weights4, mask,
                                                    options);
  return result;
}

}  // namespace detail

/// Allocating form for rank 2 (T, d), 3 (B, T, d; one head) or 4 (B, H, T, d) inputs.
/// Masks broadcast as described in AttentionMask.
template <class Scalar, std::size_t Rank>
Tensor<std::remove_const_t<Scalar>, Rank> scaled_dot_product_attention(
    TensorView<Scalar, Rank> q, TensorView<Scalar, Rank> k, TensorView<Scalar, Rank> v,
    const AttentionMask<std::remove_const_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  using S = std::remove_const_t<Scalar>;
  return detail::sdpa_allocating<S, Rank>(q, k, v, mask, options, false).output;
}

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> scaled_dot_product_attention(const Tensor<Scalar, Rank>& q,
                                                  const Tensor<Scalar, Rank>& k,
                                                  const Tensor<Scalar, Rank>& v,
                                                  const AttentionMask<Scalar>& mask = {},
                                                  const AttentionOptions& options = {}) {
  return detail::sdpa_allocating<Scalar, Rank>(q.view(), k.view(), v.view(), mask, options, false)
      .output;
}

/// Allocating form that also returns the attention weights (..., T_q, T_k), computed on
/// the materialised path.
template <class Scalar, std::size_t Rank>
AttentionResult<std::remove_const_t<Scalar>, Rank> scaled_dot_product_attention_with_weights(
    TensorView<Scalar, Rank> q, TensorView<Scalar, Rank> k, TensorView<Scalar, Rank> v,
    const AttentionMask<std::remove_const_t<Scalar>>& mask = {},
    const AttentionOptions& options = {}) {
  using S = std::remove_const_t<Scalar>;
  return detail::sdpa_allocating<S, Rank>(q, k, v, mask, options, true);
}

template <class Scalar, std::size_t Rank>
AttentionResult<Scalar, Rank> scaled_dot_product_attention_with_weights(
    const Tensor<Scalar, Rank>& q, const Tensor<Scalar, Rank>& k, const Tensor<Scalar, Rank>& v,
    const AttentionMask<Scalar>& mask = {}, const AttentionOptions& options = {}) {
  return detail::sdpa_allocating<Scalar, Rank>(q.view(), k.view(), v.view(), mask, options, true);
}

ATTN_NAMESPACE_END
