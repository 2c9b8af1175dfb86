// SPDX-License-Identifier: MIT
// attn/attention/module_backward.hpp: the one backward path of every attention module with
// weights (AttentionCore): out_proj -> attention kernel -> Q/K/V projections, adding into
// the input gradients and the parameter gradients (Gradients, found by address).
// Glossary: B = batch, T_q / T_k = query / key tokens, H = heads, hd = head dim, hd_v = value
// head dim, A = H * hd_v (the context's width), P = heads in one projection GEMM.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "attn/attention/detail/call.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/attention/scaled_dot_product_backward.hpp"
#include "attn/attention/varlen.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/linear.hpp"
#include "attn/ops/attention_backward.hpp"
#include "attn/ops/convert.hpp"
#include "attn/ops/gemm.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// A (B, T, features) gradient view as a GEMM output: rows b * T + t, unit inner stride.
/// An empty view gives an empty layout (nothing written).
template <class Scalar>
GemmOutput<Scalar> gradient_rows(const char* where, const char* name, TensorView<Scalar, 3> g) {
  GemmOutput<Scalar> out;
  if (g.data() == nullptr) return out;
  require(g.stride(2) == 1 || g.extent(2) == 1, where, [&] {
    return std::string(name) + " must have stride 1 on its last axis (got " +
           to_string(g.strides()) + ")";
  });
  out.data = g.data();
  out.ldc = g.stride(1);
  out.rows_per_batch = g.extent(1);
  out.batch_stride = g.stride(0);
  return out;
}

/// Throws ShapeError naming both configurations unless `saved` is the record of this very
/// core's training forward: filled, by this object (its address), with this identity (an
/// object assigned over it at the same address has another) and this configuration.
template <class Scalar>
void check_saved_owner(const char* where, const AttentionCore<Scalar>& core,
                       const SavedForward<Scalar>& saved) {
  const char* const rerun =
      "; run this module's training forward forward(inputs..., out, "
      "saved, ws, mask) first";
  require(saved.filled(), where, [&] { return "`saved` is empty" + std::string(rerun); });
  require(saved.owner_id != 0 && same_config(saved.owner_config, core.config()), where, [&] {
    if (saved.owner_id == 0) {
      return "`saved` was filled by the training forward of another kind of module; this "
             "module is " +
             describe_config(core.config()) + rerun;
    }
    return "`saved` was filled by the training forward of another module: it records " +
           describe_config(saved.owner_config) + ", and this module is " +
           describe_config(core.config()) + rerun;
  });
  require(saved.owner == &core && saved.owner_id == core.id(), where, [&] {
    return "`saved` was filled by the training forward of another module of the same "
           "configuration, " +
           describe_config(core.config()) + " (a copy, or the module this one was assigned over)" +
           rerun;
  });
}

/// The checks of a module backward: `saved` is a record of `core`'s training forward,
/// grad_out has the output's shape, each input gradient (or an empty view) its input's
/// shape, and no input gradient overlaps grad_out or another one (unless the same view).
template <class Scalar>
void check_module_backward(const char* where, const AttentionCore<Scalar>& core,
                           const SavedForward<Scalar>& saved, TensorView<const Scalar, 3> grad_out,
                           Index out_features, const TensorView<Scalar, 3> (&grad_in)[3],
                           const Index (&in_features)[3], const char* const (&names)[3]) {
  check_saved_owner(where, core, saved);
  const Shape<3> out_shape{saved.batch, saved.query_tokens, out_features};
  require(grad_out.shape() == out_shape, where, [&] {
    return "grad_out has shape " + to_string(grad_out.shape()) + ", expected " +
           to_string(out_shape) + " (the output's)";
  });
  for (int p = 0; p < 3; ++p) {
    const TensorView<Scalar, 3>& g = grad_in[p];
    if (g.data() == nullptr) continue;
    const Shape<3> expected{saved.batch, p == 0 ? saved.query_tokens : saved.key_tokens,
                            in_features[p]};
    require(g.shape() == expected, where, [&] {
      return std::string(names[p]) + " has shape " + to_string(g.shape()) + ", expected " +
             to_string(expected) + " (its input's)";
    });
    require_distinct_elements(where, names[p], g);
    require_disjoint(where, names[p], g, "grad_out", grad_out);
    for (int i = 0; i < 3; ++i) {  // the backward reads the inputs after writing their grads
      const RowsRef<const Scalar>& x = saved.inputs[i];
      require_disjoint(where, names[p], g, "the inputs",
                       TensorView<const Scalar, 2>(x.data, {x.rows, x.cols}, {x.ld, 1}));
    }
    for (int o = 0; o < p; ++o) {
      if (grad_in[o].data() != nullptr && !same_view(g, grad_in[o])) {
        require_disjoint(where, names[p], g, names[o], grad_in[o]);
      }
    }
  }
}

/// The projection groups of a backward: runs of parts (query, key, value) that read the
/// same input rows, have adjacent weights, the same input gradient and heads of one size
/// (self-attention's fused [W_q; W_k; W_v], key = value's [W_k; W_v]); group g is the parts
/// [start[g], end[g]).
struct ProjectionGroups {
  int count = 0;
  int start[3] = {0, 0, 0}, end[3] = {1, 2, 3};
};

template <class Scalar>
ProjectionGroups projection_groups(const QkvProjection<Scalar>& proj,
                                   const SavedForward<Scalar>& saved,
                                   const TensorView<Scalar, 3> (&grad_in)[3]) {
  ProjectionGroups groups;
  for (int p = 0; p < 3;) {
    int end = p + 1;
    while (end < 3) {
      const RowsRef<const Scalar>& a = saved.inputs[end - 1];
      const RowsRef<const Scalar>& b = saved.inputs[end];
      const auto wa = proj.weight(end - 1), wb = proj.weight(end);
      const bool same_rows = a.data == b.data && a.ld == b.ld && a.rows == b.rows;
      const bool adjacent = wa.data() + wa.size() == wb.data() && wa.extent(1) == wb.extent(1);
      const bool same_grad = same_view(grad_in[end - 1], grad_in[end]);
      const bool same_size = proj.head_dim(end - 1) == proj.head_dim(end);
      if (!(same_rows && adjacent && same_grad && same_size)) break;
      ++end;
    }
    groups.start[groups.count] = p;
    groups.end[groups.count++] = end;
    p = end;
  }
  return groups;
}

/// Elements of dQ, dK and dV together: B (T_q H hd + T_k (H_kv hd + H_kv hd_v)).
template <class Scalar>
Index projection_grad_size(const QkvProjection<Scalar>& proj, Index batch, Index tq, Index tk) {
  Index total = 0;
  for (int p = 0; p < 3; ++p) total += batch * (p == 0 ? tq : tk) * proj.width(p);
  return total;
}

/// dQ, dK, dV head-major in `buffer` (projection_grad_size() elements of G), laid out as the
/// projections wrote Q, K, V: group g's part is (B, P_g*H, T, hd) (hd_v for dV; one group's
/// heads are of one size). part_grad[p] is part p's (B, heads, T, hd) view, group_rows[g]
/// group g's rows as a GEMM operand.
template <class G, class Scalar>
void projection_grad_layout(const QkvProjection<Scalar>& proj, const ProjectionGroups& groups,
                            Index batch, Index tq, Index tk, G* buffer,
                            TensorView<G, 4> (&part_grad)[3],
                            GemmOutput<const G> (&group_rows)[3]) {
  G* cursor = buffer;
  for (int g = 0; g < groups.count; ++g) {
    const Index tokens = groups.start[g] == 0 ? tq : tk;
    Index columns = 0;
    for (int p = groups.start[g]; p < groups.end[g]; ++p) columns += proj.width(p);
    const Index hd = proj.head_dim(groups.start[g]);  // the group's heads' size
    Index offset = 0;                                 // first head of part p in the group
    for (int p = groups.start[g]; p < groups.end[g]; ++p) {
      const Index part_heads = proj.width(p) / hd;
      part_grad[p] =
          TensorView<G, 4>(cursor + offset * tokens * hd, {batch, part_heads, tokens, hd},
                           {tokens * columns, tokens * hd, hd, 1});
      offset += part_heads;
    }
    group_rows[g] = GemmOutput<const G>::head_major(cursor, tokens, columns, hd);
    cursor += batch * tokens * columns;
  }
}

/// A projection group's weights (first .. last - 1) as one (rows, in) block, and its weight
/// and bias gradients (the bias gradient null without bias).
template <class Scalar>
struct ProjectionBlock {
  TensorView<const Scalar, 2> weight;
  Scalar* grad_weight = nullptr;
  Scalar* grad_bias = nullptr;
};

template <class Scalar>
ProjectionBlock<Scalar> projection_block(const QkvProjection<Scalar>& proj,
                                         Gradients<Scalar>& grads, int first, int end) {
  const int last = end - 1;
  const TensorView<const Scalar, 2> w0 = proj.weight(first), wl = proj.weight(last);
  const Index rows_out = (wl.data() - w0.data()) / w0.extent(1) + wl.extent(0);
  ProjectionBlock<Scalar> b;
  b.weight = TensorView<const Scalar, 2>(w0.data(), {rows_out, w0.extent(1)});
  b.grad_weight = grads.of(b.weight).data();
  if (proj.has_bias()) {
    const TensorView<const Scalar, 1> b0 = proj.bias(first), bl = proj.bias(last);
    b.grad_bias =
        grads.of(TensorView<const Scalar, 1>(b0.data(), {bl.data() - b0.data() + bl.extent(0)}))
            .data();
  }
  return b;
}

/// The names of a core's three input gradients, as its messages quote them.
inline constexpr const char* kGradInputNames[3] = {"grad_query", "grad_key", "grad_value"};

/// The checks every core's backward starts with: grad_out against the core's output and the
/// saved forward, each input gradient against its input (d_in, kdim, vdim features).
template <class Scalar>
void check_core_backward(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> grad_out,
                         const SavedForward<Scalar>& saved,
                         const TensorView<Scalar, 3> (&grad_in)[3]) {
  const CoreConfig& c = core.config();
  const Index in_features[3] = {c.d_in, c.kdim, c.vdim};
  check_module_backward(c.name, core, saved, grad_out, core.d_out(), grad_in, in_features,
                        kGradInputNames);
}

/// The offsets a packed training forward kept in `saved` (views of its vectors), both empty
/// when the forward was not packed.
template <class Scalar>
PackedSequences saved_sequences(const SavedForward<Scalar>& saved) {
  const auto offsets = [](const std::vector<Index>& o) {
    return SequenceOffsets(TensorView<const Index, 1>(o.data(), {static_cast<Index>(o.size())}));
  };
  return PackedSequences(offsets(saved.query_offsets), offsets(saved.key_offsets));
}

/// The end of step 2 of both backwards: with rotary embeddings, the kernel's dQ and dK (of
/// the rotated heads, part_grad[0] and [1], of Scalar or its Compute type) rotated back by R^T
/// into the gradients of the projections' outputs, at the positions the forward rotated
/// (0..T-1, of each sequence of `packed` when not null).
template <class Scalar, class G>
void rotate_back(const AttentionCore<Scalar>& core, const TensorView<G, 4> (&part_grad)[3],
                 const PackedSequences* packed) {
  if (!core.has_rope()) return;
  core.rotate(part_grad[0], packed != nullptr ? &packed->query : nullptr, true);
  core.rotate(part_grad[1], packed != nullptr ? &packed->keys() : nullptr, true);
}

/// The backward of core.forward(query, key, value, out, ws, mask, {}, &saved): given
/// grad_out dY (B, T_q, d_out), ADDS dL/d query, key, value into grad_in[0..3) (empty views
/// are skipped; views may be the same view, which then receives the sum) and the parameter
/// gradients into `grads` (found by address: any naming of the module's parameters).
///   1. out_proj: dC = dY W_o (scratch), dW_o += dY^T C, db_o += column sums of dY; without
///      out_proj, dC = dY;
///   2. kernel: dQ, dK, dV from dC, Q, K, V, the context and logsumexp, written head-major
///      (B, P*H, T, hd) as the projections wrote Q, K, V (dV's heads hd_v wide; one group's
///      heads are of one size) (grouped-query attention: dK and dV
///      of the H_kv heads, each summed over its group of query heads); with rotary
///      embeddings, dQ and dK rotated back (R^T) to the projections' outputs; with learned
///      sinks, dL/dsinks added into their gradient;
///   3. projections: for each run of projections that read the same input rows, have
///      adjacent weights and the same input gradient (self-attention's fused [W_q; W_k; W_v],
///      key = value's [W_k; W_v]): dW += dQKV^T X and dX += dQKV W, one GEMM each, and
///      db += column sums of dQKV.
template <class Scalar>
void core_backward(const AttentionCore<Scalar>& core, TensorView<const Scalar, 3> grad_out,
                   const SavedForward<Scalar>& saved, const TensorView<Scalar, 3> (&grad_in)[3],
                   Gradients<Scalar>& grads, Workspace& ws) {
  const CoreConfig& c = core.config();
  const char* where = c.name;
  const QkvProjection<Scalar>& proj = core.projection();
  check_core_backward(core, grad_out, saved, grad_in);
  const Index batch = saved.batch, tq = saved.query_tokens, tk = saved.key_tokens;
  const Index heads = core.num_heads(), hd_v = core.value_head_dim(),
              width = core.attention_width();
  const Index q_rows = batch * tq;

  // 1. dC (B, T_q, A): through out_proj, or dY itself.
  const GemmOutput<const Scalar> dy_rows = gradient_rows<const Scalar>(where, "grad_out", grad_out);
  TensorView<const Scalar, 3> grad_context = grad_out;
  if (c.out_proj) {
    const Linear<Scalar>& o = core.out_proj();
    Scalar* dc = workspace_get<Scalar>(ws, WorkspaceSlot::kGradContext, q_rows * width);
    std::fill(dc, dc + q_rows * width, Scalar(0));
    linear_backward<Scalar>(q_rows, o.weight(), saved.context.data(), width, dy_rows,
                            GemmOutput<Scalar>::row_major(dc, width), grads.of(o.weight()).data(),
                            o.has_bias() ? grads.of(o.bias()).data() : nullptr, &ws);
    grad_context = TensorView<const Scalar, 3>(dc, {batch, tq, width});
  }

  // 2. The kernel's backward into head-major dQ, dK, dV (projection_grad_layout), zeroed
  //    (the backward adds).
  const ProjectionGroups groups = projection_groups(proj, saved, grad_in);
  const Index total = projection_grad_size(proj, batch, tq, tk);
  Scalar* dqkv = workspace_get<Scalar>(ws, WorkspaceSlot::kGradProjection, total);
  std::fill(dqkv, dqkv + total, Scalar(0));
  TensorView<Scalar, 4> part_grad[3];
  GemmOutput<const Scalar> group_rows[3];
  projection_grad_layout(proj, groups, batch, tq, tk, dqkv, part_grad, group_rows);
  const TensorView<const Scalar, 4> context(saved.context.data(), {batch, heads, tq, hd_v},
                                            {tq * width, hd_v, width, 1});
  const TensorView<const Scalar, 4> grad_context4(
      grad_context.data(), {batch, heads, tq, hd_v},
      {grad_context.stride(0), hd_v, grad_context.stride(1), 1});
  // With learned sinks, dL/dsinks is added into their gradient (the kernel sums it per head).
  const TensorView<Scalar, 1> grad_sinks =
      c.sinks ? grads.of(core.sinks()) : TensorView<Scalar, 1>();
  const AttentionGradients<Scalar> kernel_grads{grad_context4, part_grad[0], part_grad[1],
                                                part_grad[2], grad_sinks};
  const bool packed = !saved.query_offsets.empty();
  const PackedSequences seqs = saved_sequences(saved);
  if (packed) {
    attend_packed_backward(where, saved.query, saved.key, saved.value, context, saved.logsumexp,
                           kernel_grads, seqs, saved.mask, saved.options, ws, c.causal_bound(),
                           /*own_gradients=*/true);
  } else {
    attend_backward(where, saved.query, saved.key, saved.value, context, saved.logsumexp,
                    kernel_grads, saved.mask, saved.options, ws, c.causal_bound(),
                    /*own_gradients=*/true);
  }
  rotate_back(core, part_grad, packed ? &seqs : nullptr);

  // 3. The projections' backward, one GEMM per group for dW and one for dX.
  for (int g = 0; g < groups.count; ++g) {
    const ProjectionBlock<Scalar> b = projection_block(proj, grads, groups.start[g], groups.end[g]);
    const RowsRef<const Scalar>& x = saved.inputs[groups.start[g]];
    linear_backward<Scalar>(
        x.rows, b.weight, x.data, x.ld, group_rows[g],
        gradient_rows<Scalar>(where, kGradInputNames[groups.start[g]], grad_in[groups.start[g]]),
        b.grad_weight, b.grad_bias, &ws);
  }
}

/// core_backward() of a bfloat16 or float16 core (Narrow): the same three steps, with products
/// on Narrow operands and float sums, each gradient rounded once where it is stored
/// (docs/precision.md, "Training on bfloat16 and float16"). Below for bfloat16; a float16 core
/// differs in two places: its GEMMs widen (exact products, float sums), and its kernel reads
/// Q, K, V and the context widened exactly and takes the float products (P and dS stay float):
/// these CPUs have no float16 dot product to round them for.
///   1. out_proj: dC = dY W_o, dW_o += dY^T C (bfloat16 GEMMs), db_o += column sums of dY in
///      float; dC stays float (without out_proj: dY widened);
///   2. kernel: dC rounded once to bfloat16 (the attention's gradient input, as bfloat16
///      autograd holds it); the streaming backward on the forward's record (Q, K, V and the
///      context O, read in place by the bfloat16 products and D = rowsum(dO O), widened
///      exactly only for the float products, and its float logsumexp: nothing is recomputed
///      but the tiles' P), its five products on bfloat16 operands with float sums on the
///      bf16_path() (AMX or vdpbf16ps; P and dS rounded to bfloat16 before they multiply; widening:
///      the float products), the softmax, D and dS in float, into float dQ, dK, dV (and, with
///      learned sinks, a float dL/dsinks added into their bfloat16 gradient); with rotary
///      embeddings, the float dQ and dK rotated back (R^T, float tables) as core_backward()
///      rotates them;
///   3. projections: each group's dQKV rounded once to bfloat16, then dW += dQKV^T X and
///      dX += dQKV W (bfloat16 GEMMs), db += column sums of the float dQKV.
/// After a packed training forward, step 2 runs each sequence's own kernel calls (the split of
/// core_backward()), and the rotation is per sequence.
/// Every addition into a Narrow gradient (grads, grad_in) widens it, adds the float result
/// and rounds once.
template <class Narrow>
void core_backward_narrow(const AttentionCore<Narrow>& core, TensorView<const Narrow, 3> grad_out,
                          const SavedForward<Narrow>& saved,
                          const TensorView<Narrow, 3> (&grad_in)[3], Gradients<Narrow>& grads,
                          Workspace& ws) {
  static_assert(is_gemm_storage_v<Narrow>, "a bfloat16 or float16 core");
  const CoreConfig& c = core.config();
  const char* where = c.name;
  const QkvProjection<Narrow>& proj = core.projection();
  check_core_backward(core, grad_out, saved, grad_in);
  const Index batch = saved.batch, tq = saved.query_tokens, tk = saved.key_tokens;
  const Index heads = core.num_heads(), hd_v = core.value_head_dim(),
              width = core.attention_width();
  const Index q_rows = batch * tq;

  // 1. dC (B, T_q, A) in float: through out_proj, or dY widened.
  float* dc = workspace_get<float>(ws, WorkspaceSlot::kGradContext, q_rows * width);
  const GemmOutput<const Narrow> dy_rows = gradient_rows<const Narrow>(where, "grad_out", grad_out);
  if (c.out_proj) {
    const Linear<Narrow>& o = core.out_proj();
    linear_backward_narrow(q_rows, o.weight(), saved.context.data(), width, dy_rows, dc,
                           GemmOutput<Narrow>(), grads.of(o.weight()).data(),
                           o.has_bias() ? grads.of(o.bias()).data() : nullptr, ws);
  } else {
    convert(grad_out, TensorView<float, 3>(dc, {batch, tq, width}));
  }

  // 2. The kernel. Scratch (kWideBackward): room for Q, K, V and the context widened,
  //    contiguous, written only when the kernel reads them (bfloat16 products not taken:
  //    backward_reads_narrow(); float16: always); with sinks, dL/dsink_h (H). The forward's
  //    options hold its sinks widened (into the record's storage). dC rounded in place through
  //    a Narrow copy (kNarrowBackward, free until step 3).
  {
    Narrow* narrow = workspace_get<Narrow>(ws, WorkspaceSlot::kNarrowBackward, q_rows * width);
    const TensorView<float, 2> wide_dc(dc, {q_rows, width});
    const TensorView<Narrow, 2> narrow_dc(narrow, {q_rows, width});
    convert(TensorView<const float, 2>(wide_dc), narrow_dc);
    convert(TensorView<const Narrow, 2>(narrow_dc), wide_dc);
  }
  const auto padded = [](Index n) { return (n + 15) / 16 * 16; };  // whole 64-byte lines
  const Index nq = padded(saved.query.size()), nk = padded(saved.key.size()),
              nv = padded(saved.value.size()), no = padded(q_rows * width),
              ns = c.sinks ? heads : 0;
  float* wide = workspace_get<float>(ws, WorkspaceSlot::kWideBackward, ns + nq + nk + nv + no);
  const TensorView<float, 4> q(wide + ns, saved.query.shape()),
      k(wide + ns + nq, saved.key.shape()), v(wide + ns + nq + nk, saved.value.shape());
  const Shape<4> context_strides{tq * width, hd_v, width, 1};  // (B, T_q, H, hd_v) as (B, H, ...)
  float* o = wide + ns + nq + nk + nv;
  const TensorView<const float, 4> out(o, {batch, heads, tq, hd_v}, context_strides);
  const ProjectionGroups groups = projection_groups(proj, saved, grad_in);
  const Index total = projection_grad_size(proj, batch, tq, tk);
  float* dqkv = workspace_get<float>(ws, WorkspaceSlot::kGradProjection, total);
  std::fill(dqkv, dqkv + total, 0.0f);
  TensorView<float, 4> part_grad[3];
  GemmOutput<const float> group_rows[3];
  projection_grad_layout(proj, groups, batch, tq, tk, dqkv, part_grad, group_rows);
  const TensorView<float, 1> grad_sinks =
      c.sinks ? TensorView<float, 1>(wide, {heads}) : TensorView<float, 1>();
  if (c.sinks) std::fill_n(grad_sinks.data(), heads, 0.0f);
  const AttentionGradients<float> kernel_grads{
      TensorView<const float, 4>(dc, {batch, heads, tq, hd_v}, context_strides), part_grad[0],
      part_grad[1], part_grad[2], grad_sinks};
  // A packed forward's call is checked whole, then split per sequence (run_packed_backward():
  // the mask and the module's bound resolved per sequence), as attend_packed_backward() runs it.
  const bool packed = !saved.query_offsets.empty();
  const PackedSequences seqs = saved_sequences(saved);
  const AttentionMask<float> whole_call_mask;  // (bound, not copied: no allocation per call)
  AttentionCall<float> call = backward_call<float>(
      where, q, k, v, out, saved.logsumexp, kernel_grads, packed ? whole_call_mask : saved.mask,
      saved.options, packed ? CausalBound{} : c.causal_bound(), /*own_gradients=*/true);
  // bf16_path(), not the forward's attention_bf16_path(): the kernels would take its kWiden,
  // but its rule (widen below 16 query rows per task at d 128) was measured on the forward's
  // score pass over its plan's stacked heads (AttentionPlan), which the backward's key and
  // query tiles do not share; and a widened call keeps P and dS in float where vdpbf16ps
  // rounds them, so the gradients of few-row calls would change bits.
  // float16: widened (kWiden), so that no path rounds P and dS to bfloat16.
  call.args.path = std::is_same_v<Narrow, bfloat16> ? bf16_path() : Bf16Path::kWiden;
  BackwardNarrow narrow;  // bfloat16 operands for the bfloat16 products; float16: none
  if constexpr (std::is_same_v<Narrow, bfloat16>) {
    narrow = BackwardNarrow{saved.query, saved.key, saved.value,
                            TensorView<const bfloat16, 4>(
                                saved.context.data(), {batch, heads, tq, hd_v}, context_strides)};
  }
  const BackwardNarrow* reads = std::is_same_v<Narrow, bfloat16> ? &narrow : nullptr;
  if (reads == nullptr || !backward_reads_narrow(call, narrow)) {  // float products: widened
    convert(saved.query, q);
    convert(saved.key, k);
    convert(saved.value, v);
    convert(saved.context, TensorView<float, 3>(o, {batch, tq, width}));
  }
  if (packed) {
    run_packed_backward(where, call, kernel_grads, seqs, saved.mask, c.causal_bound(), ws, reads);
  } else {
    run_attention_backward(call, kernel_grads, ws, reads);
  }
  rotate_back(core, part_grad, packed ? &seqs : nullptr);  // in float, before dQ and dK round
  if (c.sinks) {                                           // widened, added, rounded once
    const TensorView<Narrow, 1> into = grads.of(core.sinks());
    for (Index h = 0; h < heads; ++h) into(h) = Narrow(static_cast<float>(into(h)) + grad_sinks(h));
  }

  // 3. The projections' backward, Narrow GEMMs per group.
  for (int g = 0; g < groups.count; ++g) {
    const ProjectionBlock<Narrow> b = projection_block(proj, grads, groups.start[g], groups.end[g]);
    const RowsRef<const Narrow>& x = saved.inputs[groups.start[g]];
    linear_backward_narrow(
        x.rows, b.weight, x.data, x.ld, group_rows[g], nullptr,
        gradient_rows<Narrow>(where, kGradInputNames[groups.start[g]], grad_in[groups.start[g]]),
        b.grad_weight, b.grad_bias, ws);
  }
}

}  // namespace detail
ATTN_NAMESPACE_END
