// SPDX-License-Identifier: MIT
// attn/attention/detail/call.hpp: the one place an attention call is checked and described.
// Every front end (scaled_dot_product_attention and its backward, the module core forward and
// backward, the incremental forward through a KVCache) calls make_call(), which checks the
// shapes, the mask, the options and the memory of the call, folds the module's own causal
// bound and window and the cache's keys into the mask, resolves the scale, and returns the
// AttentionCall the drivers in attn/ops/ run.
// Glossary: B = batch, H = heads, H_kv = key/value heads, T_q / T_k = query / key tokens,
// d = head dim, d_v = value head dim.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/options.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/nn/mask.hpp"
#include "attn/ops/attention.hpp"
#include "attn/ops/attention_backward.hpp"
#include "attn/ops/attention_call.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// T itself, in a non-deduced context: q, k and v take any view that converts to a const
/// view of the Scalar that `out` fixes (mutable views included).
template <class T>
struct identity {
  using type = T;
};
template <class T>
using identity_t = typename identity<T>::type;

template <class Scalar>
const char* scalar_name() noexcept {
  return std::is_same_v<Scalar, float> ? "float" : "double";
}

/// The memory a call writes: `out` and `weights` (empty: none) each have one location per
/// element, share none with each other, and none with the mask's tensors (boolean, additive,
/// key padding), which are read while they are written. For the kernel and every module
/// (whose `out` is (B, T_q, D)).
template <class Scalar, std::size_t OutRank, class MaskScalar>
void check_output_memory(const char* where, TensorView<Scalar, OutRank> out,
                         TensorView<Scalar, 4> weights, const AttentionMask<MaskScalar>& mask) {
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
/// Operand: the element type of q, k, v and out (Scalar, or a storage type: no weights).
template <class Scalar, class Operand = Scalar>
void check_sdpa_memory(const char* where, TensorView<const identity_t<Operand>, 4> q,
                       TensorView<const identity_t<Operand>, 4> k,
                       TensorView<const identity_t<Operand>, 4> v,
                       TensorView<identity_t<Operand>, 4> out, TensorView<Scalar, 4> weights,
                       const AttentionMask<Scalar>& mask) {
  if constexpr (std::is_same_v<Operand, Scalar>) {
    check_output_memory(where, out, weights, mask);
  } else {
    check_output_memory(where, TensorView<Scalar, 1>{}, weights, mask);
    require_distinct_elements(where, "out", out);
    require_disjoint(where, "out", out, "the boolean mask", mask.bool_mask());
    require_disjoint(where, "out", out, "the additive mask", mask.additive_mask());
    require_disjoint(where, "out", out, "the key padding mask", mask.padding_mask());
  }
  if (!same_view(q, out)) require_disjoint(where, "out", out, "q", q);
  require_disjoint(where, "out", out, "k", k);
  require_disjoint(where, "out", out, "v", v);
  require_disjoint(where, "weights", weights, "q", q);
  require_disjoint(where, "weights", weights, "k", k);
  require_disjoint(where, "weights", weights, "v", v);
}

/// The variants of `options` for a call of H query heads: a softcap that is finite (with a
/// finite inverse) in Scalar, ALiBi's max_bias finite and not negative, and per-head values
/// (sinks, ALiBi slopes) that are H contiguous Scalars.
/// @throws ConfigError naming the option and the values.
template <class Scalar>
void check_variants(const char* where, const AttentionOptions& options, Index heads) {
  const double cap = options.softcap;
  const bool cap_ok = [&] {
    if (cap == 0.0) return true;
    if (!std::isfinite(cap) || std::abs(cap) > std::numeric_limits<Scalar>::max()) return false;
    const Scalar c = static_cast<Scalar>(cap);
    return c != Scalar(0) && std::isfinite(Scalar(1) / c);
  }();
  require_config(cap_ok, where, [&] {
    return "softcap=" + number(cap) + " must be 0 (off) or finite, with a finite " +
           "inverse, as " + scalar_name<Scalar>();
  });
  require_config(std::isfinite(options.alibi_max_bias) && options.alibi_max_bias >= 0.0, where,
                 [&] {
                   return "alibi_max_bias=" + number(options.alibi_max_bias) +
                          " must be finite and not negative (0: off)";
                 });
  const auto per_head = [&](const HeadValues& values, const char* name) {
    if (values.empty()) return;
    require_config(values.holds<Scalar>(), where, [&] {
      return std::string(name) + " hold " + (std::is_same_v<Scalar, float> ? "double" : "float") +
             " values; this call computes in " + scalar_name<Scalar>() + " and reads them as such";
    });
    const TensorView<const Scalar, 1> v = values.view<Scalar>();
    require(v.extent(0) == heads && (v.stride(0) == 1 || heads == 1), where, [&] {
      return std::string(name) + " has shape " + to_string(v.shape()) + " and stride " +
             to_string(v.strides()) + ", expected (H) = (" + std::to_string(heads) +
             ") contiguous values, one per query head";
    });
  };
  per_head(options.sinks, "sinks");
  per_head(options.alibi_slopes, "alibi_slopes");
}

/// "q (..), k (..), v (..)", how the call's messages name its inputs.
inline std::string sdpa_shapes(const ViewSpan& q, const ViewSpan& k, const ViewSpan& v) {
  return "q " + to_string(q.shape, 4) + ", k " + to_string(k.shape, 4) + ", v " +
         to_string(v.shape, 4);
}

/// The shapes and strides of an attention call's views (check_sdpa()), written once for every
/// element type: q (B, H, T_q, d), k (B, H_kv, T_k, d), v (B, H_kv, T_k, d_v), out
/// (B, H, T_q, d_v), weights (B, H, T_q, T_k) or empty, every last axis of stride 1.
inline void check_sdpa_layout(const char* where, const ViewSpan& q, const ViewSpan& k,
                              const ViewSpan& v, const ViewSpan& out, const ViewSpan& weights) {
  const Index b = q.shape[0], h = q.shape[1], tq = q.shape[2], d = q.shape[3];
  const Index tk = k.shape[2], dv = v.shape[3];
  const auto shapes = [&] { return sdpa_shapes(q, k, v); };
  require(!span_empty(q) && !span_empty(k) && !span_empty(v), where,
          [&] { return "empty input: " + shapes() + " (every extent must be positive)"; });
  require(k.shape[0] == b && v.shape[0] == b, where,
          [&] { return "batch sizes differ: " + shapes(); });
  require(k.shape[1] == v.shape[1], where,
          [&] { return "key and value must have the same number of heads: " + shapes(); });
  require(h % k.shape[1] == 0, where, [&] {
    return "number of heads in key and value must divide the number of heads in query "
           "(grouped-query attention: query head h reads key/value head h / (H / H_kv)): " +
           shapes();
  });
  require(k.shape[3] == d, where, [&] { return "q and k head dimensions differ: " + shapes(); });
  require(v.shape[2] == tk, where, [&] { return "k and v sequence lengths differ: " + shapes(); });
  const auto has_shape = [](const ViewSpan& view, const Shape<4>& shape) {
    return std::equal(shape.begin(), shape.end(), view.shape);
  };
  const Shape<4> out_shape{b, h, tq, dv};
  require(has_shape(out, out_shape), where, [&] {
    return "out has shape " + to_string(out.shape, 4) + ", expected " + to_string(out_shape) +
           " for " + shapes();
  });
  const Shape<4> weights_shape{b, h, tq, tk};
  require(weights.data == nullptr || has_shape(weights, weights_shape), where, [&] {
    return "weights has shape " + to_string(weights.shape, 4) + ", expected " +
           to_string(weights_shape);
  });
  const auto unit = [](const ViewSpan& view) { return view.strides[3] == 1 || view.shape[3] == 1; };
  require(unit(q) && unit(k) && unit(v) && unit(out) && (weights.data == nullptr || unit(weights)),
          where, [&] {
            return "the last axis of q, k, v, out and weights must have stride 1 (got q " +
                   to_string(q.strides, 4) + ", k " + to_string(k.strides, 4) + ", v " +
                   to_string(v.strides, 4) + ", out " + to_string(out.strides, 4) +
                   "); pass contiguous() copies";
          });
}

template <class Scalar, class Operand = Scalar>
void check_sdpa(const char* where, TensorView<const identity_t<Operand>, 4> q,
                TensorView<const identity_t<Operand>, 4> k,
                TensorView<const identity_t<Operand>, 4> v, TensorView<identity_t<Operand>, 4> out,
                TensorView<Scalar, 4> weights, const AttentionMask<Scalar>& mask,
                const AttentionOptions& options) {
  const ViewSpan qs = view_span(q), ks = view_span(k), vs = view_span(v);
  check_sdpa_layout(where, qs, ks, vs, view_span(out), view_span(weights));
  const Index b = q.extent(0), h = q.extent(1), tq = q.extent(2), d = q.extent(3);
  const Index tk = k.extent(2), dv = v.extent(3);
  const auto shapes = [&] { return sdpa_shapes(qs, ks, vs); };
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
  check_sdpa_memory<Scalar, Operand>(where, q, k, v, out, weights, mask);
  check_variants<Scalar>(where, options, h);
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

/// Where a call's keys live when they are a KVCache's: each item's key count (its cache
/// length L_b, which a ring's may exceed its rows), the keys kept from (a ring's first
/// position per item), and the ring's rows (0: not a ring; logical key j is row j % ring).
struct CacheKeys {
  TensorView<const Index, 1> lengths;
  const Index* key_first = nullptr;
  Index ring = 0;
};

/// Checks a forward call and describes it: check_sdpa() (and check_logsumexp() with `lse`),
/// then the mask resolved with the module's own causal bound (`module`) and the cache's keys,
/// and the scale (options.scale, or 1/sqrt(d)). `weights` not empty, or
/// AttentionPath::kMaterialized, takes the materialised path. The one place where a call's
/// checks and scale are written.
/// Operand: the element type of q, k, v and out (Scalar, or a storage type: no weights, no
/// logsumexp).
/// @throws as scaled_dot_product_attention().
template <class Scalar, class Operand = Scalar>
AttentionCall<Scalar, Operand> make_call(
    const char* where, TensorView<const identity_t<Operand>, 4> q,
    TensorView<const identity_t<Operand>, 4> k, TensorView<const identity_t<Operand>, 4> v,
    TensorView<identity_t<Operand>, 4> out, TensorView<Scalar, 4> weights,
    TensorView<Scalar, 3> lse, const AttentionMask<Scalar>& mask, const AttentionOptions& options,
    const CausalBound& module = {}, const CacheKeys& cache = {}) {
  check_sdpa<Scalar, Operand>(where, q, k, v, out, weights, mask, options);
  if constexpr (std::is_same_v<Operand, Scalar>) {
    if (lse.data() != nullptr) check_logsumexp(where, q, k, v, lse, out, weights, mask);
  }
  AttentionCall<Scalar, Operand> call;
  call.args.q = q, call.args.k = k, call.args.v = v;
  call.args.out = out, call.args.weights = weights, call.args.lse = lse;
  call.args.scale = static_cast<Scalar>(
      options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(q.extent(3))));
  call.args.dropout = options.dropout;
  call.args.ring = cache.ring;
  call.args.softcap = static_cast<Scalar>(options.softcap);
  call.args.alibi = options.alibi_slopes.view<Scalar>().data();
  call.args.alibi_max_bias = options.alibi_max_bias;
  call.args.sinks = options.sinks.view<Scalar>().data();
  call.args.weights_stage = options.weights_stage;
  call.mask = mask.resolve(where, q.extent(2), k.extent(2), module);
  if (cache.lengths.data() != nullptr) call.mask.key_lengths = cache.lengths;
  call.mask.key_first = cache.key_first;
  call.dropout_seed = options.dropout_seed;
  call.dropout_call = options.dropout_call;
  call.materialize = weights.data() != nullptr || options.path == AttentionPath::kMaterialized;
  return call;
}

/// scaled_dot_product_attention() on storage-type operands (Operand bfloat16 or float16; the
/// mask and the options in float): check_sdpa(), then the streaming driver on an
/// AttentionCall<float, Operand> built as make_call() builds a float one; when `lse` is not
/// empty, each query's float logsumexp into it (B, H, T_q) (a module's training forward).
template <class Operand>
void attend_storage(const char* where, TensorView<const identity_t<Operand>, 4> q,
                    TensorView<const identity_t<Operand>, 4> k,
                    TensorView<const identity_t<Operand>, 4> v, TensorView<Operand, 4> out,
                    const AttentionMask<float>& mask, const AttentionOptions& options,
                    Workspace& workspace, const CausalBound& module = {},
                    TensorView<float, 3> lse = {}) {
  require_config(options.path != AttentionPath::kMaterialized, where, [] {
    return std::string(element_name<Operand>()) +
           " operands take the streaming path only; kMaterialized needs float or double";
  });
  run_attention(make_call<float, Operand>(where, q, k, v, out, {}, lse, mask, options, module),
                workspace);
}

/// make_call(), then the forward's driver.
template <class Scalar>
void attend(const char* where, TensorView<const Scalar, 4> q, TensorView<const Scalar, 4> k,
            TensorView<const Scalar, 4> v, TensorView<Scalar, 4> out,
            const AttentionMask<Scalar>& mask, const AttentionOptions& options,
            TensorView<Scalar, 4> weights, Workspace& workspace, const CausalBound& module = {},
            TensorView<Scalar, 3> lse = {}) {
  run_attention(make_call(where, q, k, v, out, weights, lse, mask, options, module), workspace);
}

/// The gradients a backward writes: each has its input's shape, unit inner stride and one
/// location per element; none shares memory with an input, the mask or another gradient,
/// except that two gradients may be the same view (self-attention's one x: the backward
/// then adds dQ, dK and dV into it; their tasks never write the same rows at once).
template <class Scalar>
void check_backward_memory(const char* where, const AttentionCall<Scalar>& call,
                           const AttentionGradients<Scalar>& g, const AttentionMask<Scalar>& mask) {
  const AttentionArgs<Scalar>& a = call.args;
  const std::pair<const char*, TensorView<Scalar, 4>> grads[3] = {
      {"grad_q", g.grad_q}, {"grad_k", g.grad_k}, {"grad_v", g.grad_v}};
  const TensorView<const Scalar, 4> inputs[5] = {a.q, a.k, a.v, a.out, g.grad_out};
  const char* input_names[5] = {"q", "k", "v", "out", "grad_out"};
  for (int i = 0; i < 3; ++i) {
    const auto& [name, grad] = grads[i];
    require_distinct_elements(where, name, grad);
    for (int j = 0; j < 5; ++j) require_disjoint(where, name, grad, input_names[j], inputs[j]);
    require_disjoint(where, name, grad, "logsumexp", a.lse);
    require_disjoint(where, name, grad, "the boolean mask", mask.bool_mask());
    require_disjoint(where, name, grad, "the additive mask", mask.additive_mask());
    require_disjoint(where, name, grad, "the key padding mask", mask.padding_mask());
    for (int o = 0; o < i; ++o) {
      if (!same_view(grad, grads[o].second)) {
        require_disjoint(where, name, grad, grads[o].first, grads[o].second);
      }
    }
  }
}

/// Checks a backward call and describes it: make_call() on the forward's q, k, v, out,
/// mask, options and module bound (the same call the forward made); then grad_out (out's
/// shape), the logsumexp ((B, H, T_q), needed by the streaming path), the gradients (their
/// inputs' shapes) and, unless `own_gradients` (a module's backward, whose head-major dQ,
/// dK, dV interleave per batch item in its own buffer without sharing an element), their
/// memory.
template <class Scalar>
AttentionCall<Scalar> backward_call(
    const char* where, TensorView<const Scalar, 4> q, TensorView<const Scalar, 4> k,
    TensorView<const Scalar, 4> v, TensorView<const Scalar, 4> out, TensorView<const Scalar, 3> lse,
    const AttentionGradients<Scalar>& grads, const AttentionMask<Scalar>& mask,
    const AttentionOptions& options, const CausalBound& module = {}, bool own_gradients = false) {
  // The backward reads out and lse; the call's views are mutable for the forward's sake.
  const auto writable = [](const auto& view) {
    using Element = std::remove_const_t<typename std::decay_t<decltype(view)>::element_type>;
    return TensorView<Element, std::decay_t<decltype(view)>::rank()>(
        const_cast<Element*>(view.data()), view.shape(), view.strides());
  };
  AttentionCall<Scalar> call =
      make_call(where, q, k, v, writable(out), {}, {}, mask, options, module);
  const auto shape_is = [&](const char* name, const auto& view, const auto& expected) {
    require(view.shape() == expected, where, [&] {
      return std::string(name) + " has shape " + to_string(view.shape()) + ", expected " +
             to_string(expected);
    });
    require(view.extent(view.rank() - 1) == 1 || view.stride(view.rank() - 1) == 1, where, [&] {
      return std::string(name) + " must have stride 1 on its last axis (got " +
             to_string(view.strides()) + ")";
    });
  };
  shape_is("grad_out", grads.grad_out, out.shape());
  shape_is("grad_q", grads.grad_q, q.shape());
  shape_is("grad_k", grads.grad_k, k.shape());
  shape_is("grad_v", grads.grad_v, v.shape());
  const Index tq = q.extent(2), tk = k.extent(2), d = q.extent(3), dv = v.extent(3);
  if (!call.materialize) {
    require(lse.data() != nullptr, where, [] {
      return std::string(
          "the streaming backward needs the forward's logsumexp (B, H, T_q); "
          "pass the one scaled_dot_product_attention(q, k, v, out, logsumexp, "
          "...) wrote, or use AttentionPath::kMaterialized");
    });
    shape_is("logsumexp", lse, Shape<3>{q.extent(0), q.extent(1), tq});
  } else {
    std::size_t count = 0, bytes = 0;
    const Index rows = (options.softcap != 0.0 ? 3 : 2) * tq;
    const std::size_t width = static_cast<std::size_t>(rows + std::max(d, dv) + 1);
    require(checked_mul(width, static_cast<std::size_t>(tk), count) &&
                checked_bytes(count + 64, sizeof(Scalar), bytes),
            where, [&] {
              return "the materialised backward would need (" +
                     std::string(options.softcap != 0.0 ? "3" : "2") +
                     " T_q + max(d, d_v) + 1) x T_k = (" +
                     std::to_string(rows + std::max(d, dv) + 1) + ") x " + std::to_string(tk) +
                     " elements per thread, more than fits in memory";
            });
  }
  if (grads.grad_sinks.data() != nullptr) {
    require(call.args.sinks != nullptr, where, [] {
      return std::string("grad_sinks is given but the call has no sinks (options.sinks)");
    });
    require(grads.grad_sinks.extent(0) == q.extent(1), where, [&] {
      return "grad_sinks has shape " + to_string(grads.grad_sinks.shape()) + ", expected (H) = (" +
             std::to_string(q.extent(1)) + ")";
    });
    require_distinct_elements(where, "grad_sinks", grads.grad_sinks);
    require_disjoint(where, "grad_sinks", grads.grad_sinks, "sinks", options.sinks.view<Scalar>());
  }
  call.args.lse = writable(lse);
  if (!own_gradients) check_backward_memory(where, call, grads, mask);
  return call;
}

/// backward_call(), then the backward's driver.
template <class Scalar>
void attend_backward(const char* where, TensorView<const Scalar, 4> q,
                     TensorView<const Scalar, 4> k, TensorView<const Scalar, 4> v,
                     TensorView<const Scalar, 4> out, TensorView<const Scalar, 3> lse,
                     const AttentionGradients<Scalar>& grads, const AttentionMask<Scalar>& mask,
                     const AttentionOptions& options, Workspace& ws, const CausalBound& module = {},
                     bool own_gradients = false) {
  run_attention_backward(
      backward_call(where, q, k, v, out, lse, grads, mask, options, module, own_gradients), grads,
      ws);
}

}  // namespace detail
ATTN_NAMESPACE_END
