// SPDX-License-Identifier: MIT
// attn/attention/module_core.hpp: AttentionCore, the one forward path of every attention
// module with weights (checks -> Q/K/V projection -> kernel -> output projection), its
// modes, freezing and parameter names, and the learned sinks it owns. What configures it:
// core_config.hpp.
// Glossary: B = batch, T = tokens, H = heads, H_kv = key/value heads, hd = head dim (queries
// and keys), hd_v = value head dim (hd unless set), A = H * hd_v (the attention width, the
// context's features; d_out unless head_dim or value_head_dim is set).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attention/core_config.hpp"
#include "attn/attention/detail/call.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/attention/varlen.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/detail/identity.hpp"
#include "attn/error.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/random.hpp"
#include "attn/nn/rope.hpp"
#include "attn/ops/convert.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN

namespace detail {

/// The one forward path of the attention modules with weights, and their state:
///   1. checks: shapes, batch and lengths, out, context_length (messages name the module);
///   2. projections: QkvProjection writes Q, K, V head-major into the workspace;
///   3. kernel: attend() runs scaled_dot_product_attention over (B, H, T, hd) views (V
///      (B, H_kv, T_k, hd_v)), the context written into (B, T_q, H, hd_v) == (B, T_q, A),
///      the module's own causal bound, scale, dropout and variants (softcap, ALiBi, its
///      sinks) applied: kernel_options() is the one place they enter the call;
///   4. output projection: out_proj (d_out, A) from that buffer, or the context is the output.
/// Grouped-query attention (num_kv_heads < num_heads): K and V are projected with H_kv heads
/// and the kernel maps query head h to key/value head h / (H / H_kv), copying nothing.
/// Every notebook class is a thin header over one core (or, for the wrapper, several); a
/// feature added here reaches every module.
///
/// A bfloat16 (or float16: everything below with float16 in its place) core keeps
/// its weights and biases in bfloat16, as a PyTorch module
/// after .to(torch.bfloat16) does: the projections are GEMMs on bfloat16 operands with float
/// sums, each result rounded once to bfloat16 (Q, K, V, the output), and the kernel is the
/// bfloat16 scaled_dot_product_attention (float softmax); masks, ALiBi slopes and the dropout
/// state are float. Rotary embeddings rotate the rounded Q and K in float (float tables),
/// rounding each feature back once; the incremental forward through a KVCache<bfloat16> or a
/// PagedKVCache<bfloat16> keeps bfloat16 rows. A packed batch (PackedSequences, the packed
/// prefills) runs each sequence through the same bfloat16 kernel, the same bits as the
/// sequence alone. Learned sinks are a bfloat16 parameter too (as .to(torch.bfloat16) makes
/// them), widened exactly to float for the kernel on every call. Its training forward (packed
/// too) records the bfloat16 heads and context, and its backward is core_backward_narrow()
/// (module_backward.hpp). Attention weights need a float or double core. Built from a
/// configuration, it takes a float core's draws rounded; the converting constructor rounds
/// (or widens) any core.
///
/// forward() is const and safe to call from several threads at once, each with its own
/// Workspace (dropout's call counter is atomic). Non-const members (modes, seed, freeze,
/// unfreeze, the weight accessors, named_parameters()) need exclusive access: none may run
/// while another thread is in forward().
template <class Scalar>
class AttentionCore {
 public:
  using Heads = typename QkvProjection<Scalar>::Heads;
  /// What masks, ALiBi slopes and dropout are in: Scalar, or float for bfloat16 and float16.
  using Compute = compute_type_t<Scalar>;
  using Mask = AttentionMask<Compute>;
  static constexpr bool kStorage = !std::is_floating_point_v<Scalar>;

  AttentionCore() = default;

  /// The core of `other` with its weights converted to Scalar (each rounded once, to nearest
  /// even, when narrowing), its mode, dropout seed and scaling; not frozen.
  /// @throws ConfigError as the configuration constructor.
  template <class Other, class = std::enable_if_t<!std::is_same_v<Other, Scalar>>>
  explicit AttentionCore(const AttentionCore<Other>& other)
      : AttentionCore(uninitialised(other.config()), nullptr) {
    load(other);
    train(other.is_training());
    seed(other.dropout_seed());
    scaled_ = other.scaled();
  }

  /// Validates `c` and draws the weights from `gen`, or from the global generator when null.
  /// @throws ConfigError naming c.name and the values.
  AttentionCore(const CoreConfig& c, TorchGenerator* gen) : config_(checked_core_config(c)) {
    const Index kdim = c.kdim > 0 ? c.kdim : c.d_in, vdim = c.vdim > 0 ? c.vdim : c.d_in;
    config_.kdim = kdim;
    config_.vdim = vdim;
    config_.num_kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
    config_.head_dim = c.head_dim > 0 ? c.head_dim : c.d_out / c.num_heads;
    config_.value_head_dim = c.value_head_dim > 0 ? c.value_head_dim : config_.head_dim;
    const Index width = attention_width();
    proj_ = QkvProjection<Scalar>(c.d_in, kdim, vdim, c.num_heads, config_.head_dim, c.qkv_bias,
                                  config_.num_kv_heads, config_.value_head_dim);
    dropout_ = Dropout<Compute>(c.dropout);
    if (c.rope.head_dim > 0) rope_ = RotaryEmbedding<Compute>(c.rope);
    if (c.sinks) sinks_ = Tensor<Scalar, 1>(Shape<1>{c.num_heads});  // 0: see the option
    // The ALiBi slopes, given or of the standard series, rounded once to Compute as the
    // kernel would round them.
    if (!c.alibi_slopes.empty() || c.alibi_max_bias > 0.0) {
      alibi_ = Tensor<Compute, 1>(Shape<1>{c.num_heads});
      for (Index h = 0; h < c.num_heads; ++h) {
        alibi_(h) = static_cast<Compute>(c.alibi_slopes.empty()
                                             ? alibi_slope(h, c.num_heads, c.alibi_max_bias)
                                             : c.alibi_slopes[static_cast<std::size_t>(h)]);
      }
    }
    {  // the variants as this Scalar reads them (a softcap past float's range, ...)
      AttentionOptions variants;
      set_variants(variants);
      check_variants<Compute>(config_.name, variants, c.num_heads);
    }
    if (kStorage || c.init == InitScheme::kNone) {  // nothing drawn here
      TorchGenerator unused;
      if (c.out_proj) out_proj_ = Linear<Scalar>(width, c.d_out, c.out_bias, unused);
      // A bfloat16 core takes a float core's draws, rounded.
      if (kStorage && c.init != InitScheme::kNone) load(AttentionCore<Compute>(c, gen));
      return;
    }
    if constexpr (!kStorage) draw_weights(c, gen);
  }

  // ---- the forward path ----

  /// query (B, T_q, d_in), key (B, T_k, kdim), value (B, T_k, vdim) -> out (B, T_q, d_out);
  /// `weights`, when not empty, (B, H, T_q, T_k) receives the attention weights (the
  /// materialised kernel path). With `saved` (a training forward) the input rows, the
  /// projections and the context go into saved->storage instead of `ws` (which keeps only
  /// the kernel's scratch), and `saved` records what the backward needs. With `packed`, a
  /// packed batch (B = 1, its rows the sequences' back to back): the rotary positions and
  /// the attention are per sequence (attend_packed()), no weights.
  void forward(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
               TensorView<const Scalar, 3> value, TensorView<Scalar, 3> out, Workspace& ws,
               const Mask& mask, TensorView<Scalar, 4> weights,
               SavedForward<Scalar>* saved = nullptr,
               const PackedSequences* packed = nullptr) const {
    if constexpr (kStorage) {  // the module front ends refuse these at compile time
      ATTN_ASSERT(weights.data() == nullptr);
    }
    check(query, key, value, out, weights, mask, packed);
    Workspace& keep = saved != nullptr ? saved->storage : ws;
    const Heads heads = proj_.project(query, key, value, keep, &ws);
    if (has_rope()) {  // positions 0..T-1 of each sequence, in the projection's own buffer
      rotate(heads.query, packed != nullptr ? &packed->query : nullptr, false);
      rotate(heads.key, packed != nullptr ? &packed->keys() : nullptr, false);
    }
    const Index batch = query.extent(0), tq = query.extent(1), d = attention_width(),
                hd = value_head_dim();
    // The context (B, T_q, H, hd_v) == (B, T_q, A): out itself when no projection follows
    // (and no backward needs it kept).
    const bool direct = saved == nullptr && !config_.out_proj && out.stride(2) == 1;
    Scalar* ctx =
        direct ? out.data() : workspace_get<Scalar>(keep, WorkspaceSlot::kContext, batch * tq * d);
    const Shape<3> ctx_strides = direct ? out.strides() : Shape<3>{tq * d, d, 1};
    const AttentionOptions options = kernel_options(weights, keep);
    // A training forward keeps each query's logsumexp (in Compute: float for a bfloat16
    // core) for the streaming backward.
    const TensorView<Compute, 3> lse =
        saved == nullptr
            ? TensorView<Compute, 3>()
            : TensorView<Compute, 3>(
                  workspace_get<Compute>(keep, WorkspaceSlot::kLogsumexp, batch * num_heads() * tq),
                  {batch, num_heads(), tq});
    attend(heads,
           TensorView<Scalar, 4>(ctx, {batch, num_heads(), tq, hd},
                                 {ctx_strides[0], hd, ctx_strides[1], 1}),
           mask, options, weights, ws, lse, packed);
    if (direct) return;
    const TensorView<const Scalar, 3> context(ctx, {batch, tq, d});
    if (saved != nullptr) {
      record_forward(*saved, this, id(), config_, heads.rows,
                     same_view(query, key) && same_view(key, value), same_view(key, value),
                     heads.query, heads.key, heads.value, context, mask, options,
                     TensorView<const Compute, 3>(lse));
      const auto keep_offsets = [](std::vector<Index>& to, const SequenceOffsets* from) {
        to.clear();
        if (from == nullptr) return;
        const TensorView<const Index, 1> v = from->view();
        for (Index i = 0; i < v.extent(0); ++i) to.push_back(v(i));
      };
      keep_offsets(saved->query_offsets, packed != nullptr ? &packed->query : nullptr);
      keep_offsets(saved->key_offsets, packed != nullptr ? &packed->keys() : nullptr);
    }
    if (config_.out_proj) {
      out_proj_.forward(context, out, ws);
    } else {
      copy(context, out);
    }
  }

  /// Step 1: the shapes of a call, the sizes its buffers take, and the memory of its outputs
  /// (check_output_memory; inputs sharing memory with them were copied by
  /// stage_overlapping(), and are projected before anything is written anyway).
  /// @throws ShapeError; ConfigError past context_length.
  /// A packed batch (`packed`): B = 1, offsets that fit the query and key rows, each
  /// sequence within context_length.
  void check(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
             TensorView<const Scalar, 3> value, TensorView<Scalar, 3> out,
             TensorView<Scalar, 4> weights, const Mask& mask,
             const PackedSequences* packed = nullptr) const {
    const char* where = config_.forward_name;
    const char* name = config_.input_name != nullptr ? config_.input_name : "query";
    check_input(where, name, query, d_in(), "d_in");
    if (config_.input_name == nullptr) {
      check_input(where, "key", key, kdim(), "kdim");
      check_input(where, "value", value, vdim(), "vdim");
      require(key.extent(0) == query.extent(0) && value.extent(0) == query.extent(0), where, [&] {
        return "batch sizes differ: query " + to_string(query.shape()) + ", key " +
               to_string(key.shape()) + ", value " + to_string(value.shape());
      });
      require(value.extent(1) == key.extent(1), where, [&] {
        return "key and value lengths differ: key " + to_string(key.shape()) + ", value " +
               to_string(value.shape());
      });
    }
    check_output(where, out, {query.extent(0), query.extent(1), d_out()});
    if (packed != nullptr) {
      check_packed_mask(where, mask);
      check_packed_offsets(where, *packed, name, select(query, 0, 0).shape(), "key",
                           select(key, 0, 0).shape());
    }
    const Index longest_q = packed != nullptr ? packed->query.max_length() : query.extent(1);
    const Index longest_k = packed != nullptr ? packed->keys().max_length() : key.extent(1);
    check_context(where, name, longest_q, config_.context_length);
    if (config_.input_name == nullptr) {
      check_context(where, "key", longest_k, config_.context_length);
    }
    check_buffer_sizes(query, key, value);
    check_output_memory(where, out, weights, mask);
  }

  /// Every buffer a forward sizes from its call (staged inputs, the projections, the context)
  /// holds at most B (T_q + 2 T_k) max(d_in, kdim, vdim, d_out, H hd, A) elements: that bound
  /// is checked once here, so no size computed from it downstream overflows. Only views with
  /// zero strides (a few elements seen as 2^60) get near it. @throws ShapeError naming the
  /// inputs.
  void check_buffer_sizes(TensorView<const Scalar, 3> query, TensorView<const Scalar, 3> key,
                          TensorView<const Scalar, 3> value) const {
    const Index features =
        std::max({d_in(), kdim(), vdim(), d_out(), num_heads() * head_dim(), attention_width()});
    const auto fits = [&] {
      const auto tq = static_cast<std::size_t>(query.extent(1));
      const auto tk = static_cast<std::size_t>(key.extent(1));
      std::size_t rows = 0, count = 0, bytes = 0;  // rows: T_q + 2 T_k
      if (!checked_sum(rows, tq, tk, tk)) return false;
      const std::size_t extents[3] = {static_cast<std::size_t>(query.extent(0)), rows,
                                      static_cast<std::size_t>(features)};
      return checked_extent_product(extents, count) && checked_bytes(count, sizeof(Scalar), bytes);
    };
    require(fits(), config_.forward_name, [&] {
      return "query " + to_string(query.shape()) + ", key " + to_string(key.shape()) +
             " and value " + to_string(value.shape()) + " would need buffers of more than " +
             std::to_string(kMaxObjectBytes) + " bytes (B * (T_q + 2 T_k) * " +
             std::to_string(features) + " elements)";
    });
  }

  /// The kernel's options for one call: the module's scale (unset: 1/sqrt(head_dim)) and
  /// variants, in training mode with dropout its seed and a freshly claimed call number; the
  /// path the call takes. Every forward (whole-sequence, training, incremental) builds its
  /// call from these. A bfloat16 or float16 core's sinks are widened (exactly) into `ws`
  /// (WorkspaceSlot::kWideSinks): the options read them there, so `ws` must outlive the call
  /// (a training forward passes its record's storage, which its backward reads).
  AttentionOptions kernel_options(TensorView<Scalar, 4> weights, Workspace& ws) const {
    AttentionOptions options;
    if (!scaled_) options.scale = 1.0;  // else the call's default, 1/sqrt(head_dim)
    set_variants(options);
    if constexpr (kStorage) {
      if (config_.sinks) {
        const Index h = num_heads();
        const TensorView<Compute, 1> wide(workspace_get<Compute>(ws, WorkspaceSlot::kWideSinks, h),
                                          {h});
        convert(TensorView<const Scalar, 1>(sinks_.view()), wide);
        options.sinks = wide;
      }
    }
    if (dropout_.active()) {
      options.dropout = dropout_.p();
      options.dropout_seed = dropout_.seed_value();
      options.dropout_call = dropout_.next_call();
    }
    options.path =
        weights.data() != nullptr ? AttentionPath::kMaterialized : AttentionPath::kStreaming;
    return options;
  }

  /// Step 3: the kernel on projected heads, context into `ctx` (B, H, T_q, hd_v) (and, when
  /// not empty, each query's logsumexp into `lse` (B, H, T_q)); per sequence with `packed`.
  void attend(const Heads& heads, TensorView<Scalar, 4> ctx, const Mask& mask,
              const AttentionOptions& options, TensorView<Scalar, 4> weights, Workspace& ws,
              TensorView<Compute, 3> lse = {}, const PackedSequences* packed = nullptr) const {
    if (packed != nullptr) {
      attend_packed<Compute, Scalar>(config_.forward_name, heads.query, heads.key, heads.value, ctx,
                                     *packed, mask, options, ws, config_.causal_bound(), lse);
      return;
    }
    if constexpr (kStorage) {
      detail::attend_storage<Scalar>(config_.forward_name, heads.query, heads.key, heads.value, ctx,
                                     mask, options, ws, config_.causal_bound(), lse);
    } else {
      detail::attend(config_.forward_name, heads.query, heads.key, heads.value, ctx, mask, options,
                     weights, ws, config_.causal_bound(), lse);
    }
  }

  /// The rotary embedding on heads x (B, H, T, hd) in place, at positions 0..T-1, or, with
  /// `offsets` (B = 1), at positions 0..T(s)-1 of each sequence. Element is Scalar (the
  /// projected heads), or Compute (a storage core's float gradients); `transposed`: the
  /// backward's rotation R^T, on Compute elements.
  template <class Element>
  void rotate(TensorView<Element, 4> x, const SequenceOffsets* offsets, bool transposed) const {
    using Mutable = std::remove_const_t<Element>;
    const TensorView<Mutable, 4> rows(const_cast<Mutable*>(x.data()), x.shape(), x.strides());
    const auto apply = [&](TensorView<Mutable, 4> part) {
      if constexpr (std::is_same_v<Mutable, Compute>) {
        if (transposed) return rope_.apply_transposed(part);
      } else {
        ATTN_ASSERT(!transposed);
      }
      rope_.apply(part);
    };
    if (offsets == nullptr) return apply(rows);
    for (Index s = 0; s < offsets->sequences(); ++s) {
      if (offsets->length(s) == 0) continue;
      apply(slice(rows, 2, offsets->begin(s), offsets->begin(s) + offsets->length(s)));
    }
  }

  /// The variants of the configuration into `options`, as the call reads them: the softcap,
  /// and the per-head values this core holds, each empty when its variant is off: the ALiBi
  /// slopes in Computes (given, or the standard series of alibi_max_bias, drawn once by the
  /// constructor) and the sinks parameter in Scalars (a bfloat16 or float16 core's: widened by
  /// kernel_options()). Views of this core's tensors: a record or a backward reading them needs
  /// the module alive.
  void set_variants(AttentionOptions& options) const noexcept {
    options.softcap = config_.softcap;
    options.alibi_slopes = alibi_;
    if constexpr (!kStorage) options.sinks = sinks_;
  }

  // ---- modes ----

  void train(bool on) noexcept { dropout_.train(on); }
  bool is_training() const noexcept { return dropout_.is_training(); }
  void seed(std::uint64_t value) noexcept { dropout_.seed(value); }
  std::uint64_t dropout_seed() const noexcept { return dropout_.seed_value(); }
  void freeze() {
    proj_.freeze();
    if (config_.out_proj) out_proj_.freeze();
  }
  void unfreeze() noexcept {
    proj_.unfreeze();
    out_proj_.unfreeze();
  }
  bool is_frozen() const noexcept {
    return proj_.is_frozen() && (!config_.out_proj || out_proj_.is_frozen());
  }
  bool scaled() const noexcept { return scaled_; }
  void set_scaled(bool on) noexcept { scaled_ = on; }

  // ---- configuration and parts ----

  const CoreConfig& config() const noexcept { return config_; }
  /// This object's identity (see ObjectIdentity): what a SavedForward and a KVCache record,
  /// so that an object assigned over this one (the same address, another module) is told
  /// apart. Kept by moves, fresh for copies.
  std::uint64_t id() const noexcept { return identity_.id(); }
  Index d_in() const noexcept { return config_.d_in; }
  Index kdim() const noexcept { return config_.kdim; }
  Index vdim() const noexcept { return config_.vdim; }
  Index d_out() const noexcept { return config_.d_out; }
  Index num_heads() const noexcept { return config_.num_heads; }
  Index num_kv_heads() const noexcept { return config_.num_kv_heads; }
  Index head_dim() const noexcept { return config_.head_dim; }
  /// hd_v: the value heads' size (head_dim unless value_head_dim was set).
  Index value_head_dim() const noexcept { return config_.value_head_dim; }
  /// The sliding window (0: none).
  Index sliding_window() const noexcept { return config_.sliding_window; }
  bool has_rope() const noexcept { return rope_.head_dim() > 0; }
  /// The rotary embedding (head_dim 0: none).
  const RotaryEmbedding<Compute>& rope() const noexcept { return rope_; }
  /// A = num_heads * value_head_dim: the context's features, out_proj's input.
  Index attention_width() const noexcept { return config_.num_heads * config_.value_head_dim; }
  double dropout() const noexcept { return dropout_.p(); }
  QkvProjection<Scalar>& projection() noexcept { return proj_; }
  const QkvProjection<Scalar>& projection() const noexcept { return proj_; }
  Linear<Scalar>& out_proj() noexcept { return out_proj_; }
  const Linear<Scalar>& out_proj() const noexcept { return out_proj_; }
  /// The learned sinks (H) (empty without MultiHeadAttentionOptions::sinks); read live by
  /// every forward, never packed.
  TensorView<Scalar, 1> sinks() noexcept { return sinks_.view(); }
  TensorView<const Scalar, 1> sinks() const noexcept { return sinks_.view(); }
  static constexpr const char* kSinks = "sinks";

  // ---- parameters by name ----

  /// The notebooks' names of the three projections.
  static const char* notebook_name(int part) noexcept {
    constexpr const char* kNames[3] = {"W_query", "W_key", "W_value"};
    return kNames[part];
  }
  /// nn.MultiheadAttention's names of the three separate projection weights.
  static const char* separate_name(int part) noexcept {
    constexpr const char* kNames[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
    return kNames[part];
  }
  /// Hugging Face Llama's names of the three projections (".weight", ".bias" follow).
  static const char* llama_name(int part) noexcept {
    constexpr const char* kNames[3] = {"q_proj", "k_proj", "v_proj"};
    return kNames[part];
  }
  static constexpr const char* kLlamaOutProj = "o_proj.";
  static constexpr const char* kInProjWeight = "in_proj_weight";
  static constexpr const char* kInProjBias = "in_proj_bias";
  static constexpr const char* kOutProj = "out_proj.";
  static constexpr const char* kMaskBuffer = "mask";

  /// The parameters under `names` in state_dict order; the non-const form unfreezes.
  ParameterList<Scalar> named_parameters(ParameterNames names) {
    return parameters_of(*this, names);
  }
  ParameterList<const Scalar> named_parameters(ParameterNames names) const {
    return parameters_of(*this, names);
  }
  /// The notebooks' `mask` buffer (triu of ones, context_length square) of a causal module
  /// under notebook names; nothing otherwise.
  std::vector<NamedBuffer<Scalar>> named_buffers(ParameterNames names) const {
    const ParameterNames n = resolve(names);
    std::vector<NamedBuffer<Scalar>> buffers;
    if ((n == ParameterNames::kNotebook || n == ParameterNames::kNotebookRaw) && config_.causal &&
        config_.context_length > 0) {
      buffers.push_back({kMaskBuffer, causal_blocked_mask<Scalar>(config_.context_length)});
    }
    return buffers;
  }
  /// The names a file for this module may use, the default first.
  std::vector<ParameterNames> parameter_namings() const {
    std::vector<ParameterNames> all{config_.names, ParameterNames::kNotebook,
                                    ParameterNames::kNotebookRaw};
    if (config_.out_proj) {
      all.insert(all.begin() + 1, {ParameterNames::kMultiheadAttention,
                                   ParameterNames::kSeparateProjections, ParameterNames::kLlama});
    }
    std::vector<ParameterNames> unique;
    for (const ParameterNames n : all) {
      bool seen = false;
      for (const ParameterNames u : unique) seen = seen || u == n;
      if (!seen) unique.push_back(n);
    }
    return unique;
  }

 private:
  template <class>
  friend class AttentionCore;

  // The configuration's initialisation, from `gen` or the global generator (float, double).
  void draw_weights(const CoreConfig& c, TorchGenerator* gen) {
    const Index width = attention_width();
    const auto draw = [&](TorchGenerator& g) {
      if (c.init == InitScheme::kLinear) proj_.init_linear(g);
      if (c.init == InitScheme::kRand) proj_.init_rand(g);
      if (c.out_proj) out_proj_ = Linear<Scalar>(width, c.d_out, c.out_bias, g);
      if (c.init == InitScheme::kMultiheadAttention) {
        proj_.init_xavier(g);
        const TensorView<Scalar, 1> b = out_proj_.bias();
        for (Index i = 0; i < b.extent(0); ++i) b(i) = Scalar(0);
      }
    };
    if (gen != nullptr) {
      draw(*gen);
    } else {
      with_global_generator(draw);
    }
  }

  // `c` with nothing drawn (the converting constructor loads the weights).
  static CoreConfig uninitialised(CoreConfig c) {
    c.init = InitScheme::kNone;
    return c;
  }

  // Every parameter of `other` (a core of the same configuration) converted into this one's,
  // name by name in state_dict order.
  template <class Other>
  void load(const AttentionCore<Other>& other) {
    const ParameterList<const Other> from = other.named_parameters(ParameterNames::kDefault);
    const ParameterList<Scalar> to = named_parameters(ParameterNames::kDefault);
    ATTN_ASSERT(from.size() == to.size());
    for (std::size_t i = 0; i < to.size(); ++i) {
      ATTN_ASSERT(from[i].name() == to[i].name());
      if (to[i].rank() == 1) {
        convert(from[i].vector(), to[i].vector());
      } else {
        convert(from[i].matrix(), to[i].matrix());
      }
    }
  }

  ParameterNames resolve(ParameterNames names) const noexcept {
    return names == ParameterNames::kDefault ? config_.names : names;
  }

  // One body for the const and the mutable list (Self is AttentionCore or a const one).
  template <class Self>
  static auto parameters_of(Self& self, ParameterNames names) {
    using Element = std::conditional_t<std::is_const_v<Self>, const Scalar, Scalar>;
    auto& proj = self.proj_;
    ParameterList<Element> list;
    const ParameterNames n = self.resolve(names);
    const char* out_proj = kOutProj;
    if (n == ParameterNames::kLlama) {
      for (int p = 0; p < 3; ++p) {
        const std::string name = llama_name(p);
        list.add(name + ".weight", proj.weight(p));
        list.add(name + ".bias", proj.bias(p));
      }
      out_proj = kLlamaOutProj;
    } else if (n == ParameterNames::kNotebook || n == ParameterNames::kNotebookRaw) {
      const bool raw = n == ParameterNames::kNotebookRaw;
      for (int p = 0; p < 3; ++p) {
        const std::string name = notebook_name(p);
        const TensorView<Element, 2> w = proj.weight(p);
        list.add(raw ? name : name + ".weight", raw ? transpose(w) : w);
        list.add(name + ".bias", proj.bias(p));
      }
    } else {
      if (n == ParameterNames::kMultiheadAttention && proj.fused()) {
        list.add(kInProjWeight, proj.fused_weight(self.config_.name));
      } else {
        for (int p = 0; p < 3; ++p) list.add(separate_name(p), proj.weight(p));
        if (n == ParameterNames::kMultiheadAttention) {
          list.absent(kInProjWeight,
                      ": the module has kdim/vdim != embed_dim, so it expects q_proj_weight, "
                      "k_proj_weight and v_proj_weight");
        }
      }
      list.add(kInProjBias, proj.fused_bias());
      for (const char* name : {"bias_k", "bias_v"}) {
        list.absent(name, ": add_bias_kv=True is not supported by attn::MultiHeadAttention");
      }
    }
    if (self.config_.out_proj) list.append(out_proj, self.out_proj_.named_parameters());
    if (self.config_.sinks) list.add(kSinks, self.sinks_.view());  // gpt-oss's name, last
    list.watch(self.identity_.watch());  // expires with the projection weights
    return list;
  }

  CoreConfig config_;
  QkvProjection<Scalar> proj_;
  Linear<Scalar> out_proj_;  // 0 x 0 unless config_.out_proj
  Dropout<Compute> dropout_{0.0};
  RotaryEmbedding<Compute> rope_;  // head_dim 0 unless config_.rope.head_dim
  Tensor<Scalar, 1> sinks_;        // (H) with config_.sinks, else empty
  Tensor<Compute, 1> alibi_;       // (H): the ALiBi slopes as Computes, empty without ALiBi
  bool scaled_ = true;             // multiply Q K^T by 1/sqrt(hd); off for notebook 001's module
  ObjectIdentity identity_;        // what SavedForward, KVCache and optimizers record
};

}  // namespace detail
ATTN_NAMESPACE_END
