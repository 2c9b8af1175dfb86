// SPDX-License-Identifier: MIT
// attn/attention/module.hpp: the API every attention module shares, written once: the
// forward overload set (ModuleForwards) and the modes, freezing and parameters of a module
// built on one AttentionCore (CoreModule).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attention/cached_forward.hpp"
#include "attn/attention/detail/module_support.hpp"
#include "attn/attention/kv_cache.hpp"
#include "attn/attention/module_backward.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/packed_prefill.hpp"
#include "attn/attention/paged_forward.hpp"
#include "attn/attention/paged_kv_cache.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/attention/varlen.hpp"
#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/random.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Query, key and value of one call, batched (B, T, features).
template <class Scalar>
struct ModuleInputs {
  TensorView<const Scalar, 3> query, key, value;
};

// The tensor arguments a module's forward takes, one tag each: (x) for self-attention,
// (x_q, x_kv) for CrossAttention, (query, key, value) for MultiHeadAttention.
struct InputX {};
struct InputQuery {};
struct InputKeyValue {};
struct InputKey {};
struct InputValue {};
template <class Tag, class View>
struct InputView {
  using type = View;
};

/// The gradients of one backward call's inputs, one per projection input (query, key,
/// value); an input given twice has one view given twice.
template <class Scalar>
struct ModuleGrads {
  TensorView<Scalar, 3> views[3];
};
template <class Scalar>
ModuleGrads<Scalar> gather_grads(TensorView<Scalar, 3> x) {
  return {{x, x, x}};
}
template <class Scalar>
ModuleGrads<Scalar> gather_grads(TensorView<Scalar, 3> query, TensorView<Scalar, 3> key_value) {
  return {{query, key_value, key_value}};
}
template <class Scalar>
ModuleGrads<Scalar> gather_grads(TensorView<Scalar, 3> query, TensorView<Scalar, 3> key,
                                 TensorView<Scalar, 3> value) {
  return {{query, key, value}};
}

template <class Scalar>
ModuleInputs<Scalar> gather_inputs(TensorView<const Scalar, 3> x) {
  return {x, x, x};
}
template <class Scalar>
ModuleInputs<Scalar> gather_inputs(TensorView<const Scalar, 3> query,
                                   TensorView<const Scalar, 3> key_value) {
  return {query, key_value, key_value};
}
template <class Scalar>
ModuleInputs<Scalar> gather_inputs(TensorView<const Scalar, 3> query,
                                   TensorView<const Scalar, 3> key,
                                   TensorView<const Scalar, 3> value) {
  return {query, key, value};
}

/// `x` with every input that shares memory with an output (`out`, `weights`) replaced by a
/// contiguous copy in the workspace, so that every module is correct in place
/// (forward(x, x, ws)): some write an output before they have read all of their inputs
/// (MultiHeadAttentionWrapper's later heads read x after the first wrote its slice of out;
/// SimpleSelfAttention's kernel reads K and V while it writes). The copies go to the
/// projection's staging slots; being contiguous, they are read where they are and never
/// staged again. An input given twice (x as key and value) is copied once, so the projection
/// still sees one tensor. An input too large to copy is left as it is: the module's shape
/// checks reject it (see AttentionCore::check).
/// `written`, when not empty, is one more region the call writes (the incremental forward:
/// the cache's storage).
template <class Scalar>
ModuleInputs<Scalar> stage_overlapping(const ModuleInputs<Scalar>& x,
                                       TensorView<const Scalar, 3> out,
                                       TensorView<const Scalar, 4> weights, Workspace& ws,
                                       TensorView<const Scalar, 1> written = {}) {
  const auto stage = [&](TensorView<const Scalar, 3> in, WorkspaceSlot slot) {
    std::size_t bytes = 0;
    if ((!overlaps(in, out) && !overlaps(in, weights) && !overlaps(in, written)) ||
        !checked_bytes(static_cast<std::size_t>(in.size()), sizeof(Scalar), bytes)) {
      return in;
    }
    const TensorView<Scalar, 3> staged(workspace_get<Scalar>(ws, slot, in.size()), in.shape());
    copy(in, staged);
    return TensorView<const Scalar, 3>(staged);
  };
  ModuleInputs<Scalar> staged;
  staged.query = stage(x.query, WorkspaceSlot::kQueryStaging);
  staged.key = same_view(x.key, x.query) ? staged.query : stage(x.key, WorkspaceSlot::kKeyStaging);
  staged.value = same_view(x.value, x.key)     ? staged.key
                 : same_view(x.value, x.query) ? staged.query
                                               : stage(x.value, WorkspaceSlot::kValueStaging);
  return staged;
}

/// The checks of a training forward's memory, before anything is written: no input and not
/// `out` may share memory with the buffers `saved` already owns (views of an earlier record,
/// such as saved.context): the forward overwrites those buffers, and the record must keep
/// the inputs it is given. @throws ShapeError naming the view.
template <class Scalar>
void check_training_memory(const char* where, const ModuleInputs<Scalar>& x,
                           TensorView<const Scalar, 3> out, const SavedForward<Scalar>& saved) {
  const auto check = [&](const char* name, TensorView<const Scalar, 3> v) {
    const ByteRange r = byte_range(v);
    require(r.begin == r.end || !workspace_overlaps(saved.storage, r.begin, r.end), where, [&] {
      return std::string(name) + " " + to_string(v.shape()) +
             " shares memory with the buffers of `saved` (a view of an earlier record); the "
             "training forward overwrites them: copy it first, or record into another "
             "SavedForward";
    });
  };
  check("query", x.query);
  check("key", x.key);
  check("value", x.value);
  check("out", out);
  for (const SavedForward<Scalar>& part : saved.parts) check_training_memory(where, x, out, part);
}

/// Marks `saved` (and its parts) empty, keeping its buffers: a backward refuses it until a
/// training forward fills it again.
template <class Scalar>
void forget(SavedForward<Scalar>& saved) noexcept {
  saved.owner = nullptr;
  saved.owner_id = 0;
  for (SavedForward<Scalar>& part : saved.parts) forget(part);
}

/// The whole storage of `cache` as one view (what an incremental forward writes).
template <class Scalar>
TensorView<const Scalar, 1> cache_memory(const KVCache<Scalar>& cache) noexcept {
  return cache.memory();
}

/// For modules without one core (SimpleSelfAttention, MultiHeadAttentionWrapper): the
/// incremental forward is refused, naming the module and what to use instead.
[[noreturn]] inline void refuse_cached(const char* where, const char* why) {
  throw ConfigError(std::string("attn::") + where +
                    ": the incremental forward (a KVCache) is not available: " + why);
}

/// The same for the packed forwards (a packed batch, PackedSequences).
[[noreturn]] inline void refuse_packed(const char* where) {
  throw ConfigError(std::string("attn::") + where +
                    ": the packed forwards (PackedSequences) are those of the modules built on "
                    "one core (MultiHeadAttention, SelfAttention, CausalAttention, "
                    "CrossAttention); run each sequence on its own");
}

/// The forward overloads of an attention module whose tensor arguments are `Inputs` (one
/// tag each), written once for every module. Arguments always come in the order
/// (inputs..., outputs, workspace, mask), as in scaled_dot_product_attention:
///   forward(in..., mask = {})                 -> (B, T_q, d_out), allocating
///   forward(in..., out, mask = {})            into out (a temporary workspace)
///   forward(in..., out, ws, mask = {})        into out, reusing ws: no allocation once warm
///   forward(in..., out, saved, ws, mask = {}) the same, recording in `saved` what the
///                                             backward needs (training)
///   backward(grad_out, saved, grad_in..., grads, ws)  adds the input and parameter
///                                             gradients (module_backward.hpp)
///   forward_with_weights(in..., mask = {})    -> {output, weights} (materialised path)
///   forward_with_weights(in..., out, weights, ws, mask = {})
///   forward(in..., seqs, out, ws, mask = {})  a packed batch: (total, features) rows of
///                                             many sequences, PackedSequences their offsets
///   forward(in..., seqs, out, saved, ws, mask = {})  the same, training
///   forward(in..., seqs, out, ws, cache)      prefill: sequence s into the cache's item s
/// and the same for unbatched (T, features) inputs. Weights are (B, H, T_q, T_k) when
/// WeightsRank is 4, (B, T_q, T_k) for single-head modules (WeightsRank 3).
///
/// In place is fine, in every overload: inputs that share memory with what the call writes
/// (`out`, `weights`, the cache's storage) are copied first (stage_overlapping), into `ws`,
/// or into `saved` for a training forward, whose record must keep them until the backward.
/// The outputs must not share memory with each other, the mask, the cache's storage or
/// `saved`'s own buffers, and each needs one location per element (ShapeError otherwise).
/// Backward: the input gradients must not share memory with grad_out, the recorded inputs
/// or each other (the same view given twice is fine: it receives the sum).
///
/// Threads: every forward is const, and safe to call on one module from several threads at
/// once, each thread with its own Workspace. A module's non-const members (train, eval, seed,
/// freeze, unfreeze, weight accessors, named_parameters(), loading) need exclusive access.
///
/// Derived provides run(ModuleInputs, out (B, T_q, d_out), ws, mask, weights (B, H, T_q,
/// T_k) or empty, SavedForward* (null unless training)) const, run_backward(grad_out,
/// saved, the input gradients [query, key, value], grads, ws) const, output_features(
/// ModuleInputs), weight_heads() and forward_where() (the name errors give, a literal).
template <class Derived, class Scalar, std::size_t WeightsRank, class... Inputs>
class ModuleForwards {
  static_assert(WeightsRank == 3 || WeightsRank == 4,
                "attn::ModuleForwards: weights are (B, T_q, T_k) or (B, H, T_q, T_k)");
  template <class Tag, std::size_t Rank>
  using In = typename InputView<Tag, TensorView<const Scalar, Rank>>::type;
  template <class Tag, std::size_t Rank>
  using Grad = typename InputView<Tag, TensorView<Scalar, Rank>>::type;
  // Masks are in the compute type: float for a bfloat16 or float16 module.
  using Mask = AttentionMask<compute_type_t<Scalar>>;
  // A bfloat16 or float16 module runs whole-sequence and packed forwards, inference and
  // training (with backward), the incremental forward through a KVCache or a PagedKVCache of
  // its type, and the packed prefills; attention weights need float or double.
  static constexpr bool kTraining = std::is_floating_point_v<Scalar>;
  static constexpr bool kWholeTraining = kTraining || detail::is_gemm_storage_v<Scalar>;

 public:
  Tensor<Scalar, 3> forward(In<Inputs, 3>... in, const Mask& mask = {}) const {
    Tensor<Scalar, 3> out(output_shape(gather_inputs<Scalar>(in...)));
    forward(in..., out.view(), mask);
    return out;
  }
  /// Into `out`: (B, T_q, d_out), or (T_q, d_out) for unbatched inputs.
  template <std::size_t Rank>
  void forward(In<Inputs, Rank>... in, TensorView<Scalar, Rank> out, const Mask& mask = {}) const {
    Workspace ws;
    forward(in..., out, ws, mask);
  }
  template <std::size_t Rank>
  void forward(In<Inputs, Rank>... in, TensorView<Scalar, Rank> out, Workspace& ws,
               const Mask& mask = {}) const {
    static_assert(Rank == 2 || Rank == 3,
                  "attn: a module's inputs are (B, T, features) or unbatched (T, features)");
    if constexpr (Rank == 3) {
      const ModuleInputs<Scalar> x =
          stage_overlapping<Scalar>(gather_inputs<Scalar>(in...), out, {}, ws);
      derived().run(x, out, ws, mask, {});
    } else {
      forward(unsqueeze(in, 0)..., unsqueeze(out, 0), ws, mask);
    }
  }
  /// Training forward: as forward(in..., out, ws, mask), and records in `saved` what the
  /// backward needs (see SavedForward). Reuse `saved` across steps: no allocation once warm.
  /// In place (out over an input) is exact: such an input is copied into `saved` before
  /// anything is written, and the backward reads the copy.
  /// @throws as forward(); ShapeError when an input or out shares memory with `saved`'s own
  ///         buffers. `saved` is left empty when it throws past its checks.
  template <std::size_t Rank>
  void forward(In<Inputs, Rank>... in, TensorView<Scalar, Rank> out, SavedForward<Scalar>& saved,
               Workspace& ws, const Mask& mask = {}) const {
    static_assert(Rank == 2 || Rank == 3,
                  "attn: a module's inputs are (B, T, features) or unbatched (T, features)");
    static_assert(kWholeTraining,
                  "attn: a training forward (SavedForward) needs a float, double, bfloat16 or "
                  "float16 module");
    if constexpr (Rank == 3) {
      train_forward(gather_inputs<Scalar>(in...), out, saved, ws, mask, nullptr);
    } else {
      forward(unsqueeze(in, 0)..., unsqueeze(out, 0), saved, ws, mask);
    }
  }
  /// Incremental (generation) forward: the inputs hold each item's next T tokens (B, T,
  /// features; for (query, key, value) modules all three the same tensor: self-attention);
  /// their keys and values are appended to `cache` (one per layer, KVCache) and every token
  /// attends causally to its item's cached keys (and the module's sliding window), with the
  /// module's rotary embeddings at the cached positions. Any split of a sequence (a prefill,
  /// chunks, single tokens; ragged items) gives the whole-sequence forward's rows to float
  /// rounding. `mask` must be empty (the cache is the mask). The module must be causal (the
  /// cache holds only the keys up to each token), and a cache holds one module's keys: a
  /// cache that holds another module's (or this module's before it was assigned over) is
  /// refused until reset(). Inputs inside the cache's storage are copied first; `out` must
  /// not be there. Allocation-free with a warm workspace.
  /// @throws as forward(); ConfigError when the module is not causal, the cache has no room
  ///         or holds another module's keys; ShapeError when out shares memory with the cache.
  void forward(In<Inputs, 3>... in, TensorView<Scalar, 3> out, Workspace& ws,
               KVCache<Scalar>& cache, const Mask& mask = {}) const {
    const ModuleInputs<Scalar> x =
        stage_overlapping<Scalar>(gather_inputs<Scalar>(in...), out, {}, ws, cache_memory(cache));
    derived().run_cached(x, out, ws, cache, mask);
  }
  /// Incremental forward over sequences of a paged cache (PagedKVCache, one per layer): the
  /// inputs (B, T, features) hold the next T tokens of sequences seqs[0 .. B-1] (distinct),
  /// each at its own length (a ragged batch: one token each to decode). As the forward
  /// through a KVCache: the same rows, bit for bit, for the same tokens; a call that throws
  /// (the pool short of blocks included, naming them) leaves the cache as it was.
  /// @throws as the forward through a KVCache; IndexError for an id that is not a sequence.
  void forward(In<Inputs, 3>... in, TensorView<Scalar, 3> out, Workspace& ws,
               PagedKVCache<Scalar>& cache, const std::vector<Index>& seqs) const {
    const ModuleInputs<Scalar> x =
        stage_overlapping<Scalar>(gather_inputs<Scalar>(in...), out, {}, ws, cache.memory());
    derived().run_paged(x, out, ws, cache, seqs);
  }
  /// Backward of a training forward: given grad_out = dL/d out ((B, T_q, d_out), or
  /// (T_q, d_out) unbatched) and the `saved` record of that forward, ADDS dL/d input into
  /// grad_in (one view per input, as the forward took them; an empty view skips one; for
  /// self-attention the one x gets the whole gradient, as autograd gives it for m(x, x, x))
  /// and the parameter gradients into `grads` (made from named_parameters(), any naming).
  /// Zero them first (PyTorch's .grad). With a warm `ws`, no allocation.
  /// @throws ShapeError on shapes that do not match the forward's, gradients sharing memory
  ///         with grad_out, the inputs or each other, or a `saved` of another module;
  ///         ConfigError when `grads` does not hold this module's parameters.
  /// Packed forward: the inputs hold the rows of N sequences back to back, (total_q,
  /// features) (cross-attention: keys and values (total_k, features)), with their offsets
  /// in `seqs` (PackedSequences: N + 1 cumulative offsets, FlashAttention's cu_seqlens; the
  /// keys' too for cross-attention), no padding; out (total_q, d_out). Each sequence attends
  /// to its own keys only, with the module's causal bound, window and rotary positions
  /// (0..T(s)-1) per sequence; `mask` may add a causal bound or window (no element-wise
  /// parts). The projections run as one GEMM over all rows, the attention of every
  /// sequence in one parallel region. Each sequence's rows are bit-identical to the forward
  /// on that sequence alone (a batch of one, the same mask), for any thread count.
  /// @throws as forward(); ShapeError for offsets that do not fit the rows (naming them) or
  ///         a mask with element-wise parts; ConfigError for a sequence past context_length.
  void forward(In<Inputs, 2>... in, const PackedSequences& seqs, TensorView<Scalar, 2> out,
               Workspace& ws, const Mask& mask = {}) const {
    const TensorView<Scalar, 3> out3 = unsqueeze(out, 0);
    const ModuleInputs<Scalar> x =
        stage_overlapping<Scalar>(gather_inputs<Scalar>(unsqueeze(in, 0)...), out3, {}, ws);
    derived().run_packed(x, seqs, out3, ws, mask, nullptr);
  }
  /// Packed training forward: as above, recording in `saved` what backward() (with the
  /// (total, features) gradients) needs, the offsets included.
  void forward(In<Inputs, 2>... in, const PackedSequences& seqs, TensorView<Scalar, 2> out,
               SavedForward<Scalar>& saved, Workspace& ws, const Mask& mask = {}) const {
    static_assert(kWholeTraining,
                  "attn: a packed training forward (SavedForward) needs a float, double, "
                  "bfloat16 or float16 module");
    train_forward(gather_inputs<Scalar>(unsqueeze(in, 0)...), unsqueeze(out, 0), saved, ws, mask,
                  &seqs);
  }
  /// Packed prefill: x (total, features) holds N sequences' next tokens (offsets `seqs`);
  /// sequence s is appended to item s of `cache` (which needs at least N items; items past
  /// N are left as they are) and attends to that item's cached keys, as the incremental
  /// forward does (forward(x, out, ws, cache)). Each sequence's rows, and its item's keys
  /// and values, are bit-identical to that forward on the sequence alone with a cache of one
  /// item in the same state.
  /// @throws as the incremental forward; ShapeError for offsets that do not fit; ConfigError
  ///         for a cache of fewer than N items.
  void forward(In<Inputs, 2>... in, const PackedSequences& seqs, TensorView<Scalar, 2> out,
               Workspace& ws, KVCache<Scalar>& cache) const {
    const TensorView<Scalar, 3> out3 = unsqueeze(out, 0);
    const ModuleInputs<Scalar> x = stage_overlapping<Scalar>(
        gather_inputs<Scalar>(unsqueeze(in, 0)...), out3, {}, ws, cache_memory(cache));
    derived().run_prefill(x, seqs, out3, ws, cache);
  }
  /// Packed prefill into a paged cache: x (total, features) holds the next tokens of
  /// sequences ids[0 .. N-1] of `cache` (distinct; offsets `seqs`, a prompt of its own length
  /// each), each appended to its sequence and attending to its cached keys as the paged
  /// incremental forward does. Each sequence's rows, and its keys and values, are
  /// bit-identical to that forward on the sequence alone (forward(x, out, ws, cache, {id})).
  /// @throws as the paged incremental forward (the pool short of blocks for all of them
  ///         included: nothing is changed then); ShapeError for offsets that do not fit or
  ///         ids of another count than the sequences.
  void forward(In<Inputs, 2>... in, const PackedSequences& seqs, TensorView<Scalar, 2> out,
               Workspace& ws, PagedKVCache<Scalar>& cache, const std::vector<Index>& ids) const {
    const TensorView<Scalar, 3> out3 = unsqueeze(out, 0);
    const ModuleInputs<Scalar> x = stage_overlapping<Scalar>(
        gather_inputs<Scalar>(unsqueeze(in, 0)...), out3, {}, ws, cache.memory());
    derived().run_paged_prefill(x, seqs, out3, ws, cache, ids);
  }

  void backward(In<InputX, 3> grad_out, const SavedForward<Scalar>& saved,
                Grad<Inputs, 3>... grad_in, Gradients<Scalar>& grads, Workspace& ws) const {
    static_assert(kWholeTraining,
                  "attn: backward needs a float, double, bfloat16 or float16 module");
    derived().run_backward(grad_out, saved, gather_grads<Scalar>(grad_in...).views, grads, ws);
  }
  void backward(In<InputX, 2> grad_out, const SavedForward<Scalar>& saved,
                Grad<Inputs, 2>... grad_in, Gradients<Scalar>& grads, Workspace& ws) const {
    backward(unsqueeze(grad_out, 0), saved, unsqueeze(grad_in, 0)..., grads, ws);
  }

  AttentionResult<Scalar, 3, WeightsRank> forward_with_weights(In<Inputs, 3>... in,
                                                               const Mask& mask = {}) const {
    const ModuleInputs<Scalar> x = gather_inputs<Scalar>(in...);
    const Index batch = x.query.extent(0), tq = x.query.extent(1), tk = x.key.extent(1);
    AttentionResult<Scalar, 3, WeightsRank> result;
    result.output = Tensor<Scalar, 3>(output_shape(x));
    if constexpr (WeightsRank == 4) {
      result.weights = Tensor<Scalar, 4>({batch, derived().weight_heads(), tq, tk});
    } else {
      result.weights = Tensor<Scalar, 3>({batch, tq, tk});
    }
    Workspace ws;
    forward_with_weights(in..., result.output.view(), result.weights.view(), ws, mask);
    return result;
  }
  /// Into `out` and `weights` ((B, H, T_q, T_k), or (B, T_q, T_k) for WeightsRank 3).
  void forward_with_weights(In<Inputs, 3>... in, TensorView<Scalar, 3> out,
                            TensorView<Scalar, WeightsRank> weights, Workspace& ws,
                            const Mask& mask = {}) const {
    static_assert(kTraining,
                  "attn: a bfloat16 or float16 module takes the streaming kernel, which returns no "
                  "attention weights; forward_with_weights needs a float or double module");
    TensorView<Scalar, 4> heads_weights;
    if constexpr (WeightsRank == 4) {
      heads_weights = weights;
    } else {
      heads_weights = unsqueeze(weights, 1);
    }
    const ModuleInputs<Scalar> x =
        stage_overlapping<Scalar>(gather_inputs<Scalar>(in...), out, heads_weights, ws);
    derived().run(x, out, ws, mask, heads_weights);
  }

  // ---- unbatched: (T, features) -> (T, d_out), as a batch of one ----

  Tensor<Scalar, 2> forward(In<Inputs, 2>... in, const Mask& mask = {}) const {
    const Shape<3> shape = output_shape(gather_inputs<Scalar>(unsqueeze(in, 0)...));
    Tensor<Scalar, 2> out({shape[1], shape[2]});
    forward(in..., out.view(), mask);
    return out;
  }
  AttentionResult<Scalar, 2, WeightsRank - 1> forward_with_weights(In<Inputs, 2>... in,
                                                                   const Mask& mask = {}) const {
    const auto batched = forward_with_weights(unsqueeze(in, 0)..., mask);
    AttentionResult<Scalar, 2, WeightsRank - 1> result;
    result.output = Tensor<Scalar, 2>(select(batched.output.view(), 0, 0));
    result.weights = Tensor<Scalar, WeightsRank - 1>(select(batched.weights.view(), 0, 0));
    return result;
  }

 private:
  const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }
  /// The training forward (packed with `seqs`).
  void train_forward(const ModuleInputs<Scalar>& given, TensorView<Scalar, 3> out,
                     SavedForward<Scalar>& saved, Workspace& ws, const Mask& mask,
                     const PackedSequences* seqs) const {
    check_training_memory<Scalar>(derived().forward_where(), given, out, saved);
    forget(saved);  // a forward that throws from here on leaves no stale record behind
    // `saved` keeps the rows the projections read: an input the output overwrites is
    // copied into the record's own storage, where it stays until the backward.
    const ModuleInputs<Scalar> x = stage_overlapping<Scalar>(given, out, {}, saved.storage);
    if (seqs != nullptr) {
      derived().run_packed(x, *seqs, out, ws, mask, &saved);
    } else {
      derived().run(x, out, ws, mask, {}, &saved);
    }
  }
  Shape<3> output_shape(const ModuleInputs<Scalar>& x) const {
    return {x.query.extent(0), x.query.extent(1), derived().output_features(x)};
  }
};

/// A module that is one AttentionCore: its modes, freezing and parameters, written once.
/// (The forward overloads come from ModuleForwards.) The const members may run from several
/// threads at once; the non-const ones (modes, seed, freeze/unfreeze, the non-const weight
/// accessors and named_parameters()) need exclusive access: none may run while another
/// thread is in forward().
template <class Scalar>
class CoreModule {
 public:
  /// Training mode enables dropout on the attention weights. Modules start in training
  /// mode, like PyTorch's.
  void train(bool on = true) noexcept { core_.train(on); }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return core_.is_training(); }
  /// Restarts the dropout stream with a seed (the same seed gives the same masks).
  void seed(std::uint64_t value) noexcept { core_.seed(value); }

  /// Packs the projection weights into the GEMM's layout once, so that forward() stops
  /// repacking them on every call: about 9 % of a forward over 128 tokens, most of one over
  /// a few tokens (decoding). Results are bit for bit those of the unfrozen module; the
  /// packs take as much memory as the weights. The packs are a snapshot: every non-const
  /// weight accessor (and the non-const named_parameters()) unfreezes the part it hands
  /// out, so loading or editing weights through them is safe, but a view taken before
  /// freeze() must not be written after it (freeze() again after changing weights that
  /// way). Biases are always read live.
  void freeze() { core_.freeze(); }
  /// Drops the packs (forward() packs per call again).
  void unfreeze() noexcept { core_.unfreeze(); }
  /// True when every weight is packed.
  bool is_frozen() const noexcept { return core_.is_frozen(); }

  /// The parameters as (name, view) in state_dict order, under the module's own names or
  /// those of `names` (see ParameterNames). Loading, saving and gradients go through this
  /// list. The non-const form unfreezes the module (its views may be written).
  ParameterList<Scalar> named_parameters(ParameterNames names = ParameterNames::kDefault) {
    return core_.named_parameters(names);
  }
  ParameterList<const Scalar> named_parameters(
      ParameterNames names = ParameterNames::kDefault) const {
    return core_.named_parameters(names);
  }
  /// Buffers of the state_dict that are not parameters (the notebooks' causal `mask`).
  std::vector<NamedBuffer<Scalar>> named_buffers(
      ParameterNames names = ParameterNames::kDefault) const {
    return core_.named_buffers(names);
  }
  /// The names a state_dict of this module may use, its default first.
  std::vector<ParameterNames> parameter_namings() const { return core_.parameter_namings(); }

  // ---- configuration ----

  Index d_in() const noexcept { return core_.d_in(); }
  /// Output features: num_heads * head_dim, unless head_dim (or value_head_dim) was set and
  /// out_proj maps num_heads * value_head_dim features to d_out.
  Index d_out() const noexcept { return core_.d_out(); }
  Index num_heads() const noexcept { return core_.num_heads(); }
  /// Heads of the keys and values (grouped-query attention when below num_heads).
  Index num_kv_heads() const noexcept { return core_.num_kv_heads(); }
  Index head_dim() const noexcept { return core_.head_dim(); }
  /// The value heads' size (head_dim unless MultiHeadAttentionOptions::value_head_dim is set).
  Index value_head_dim() const noexcept { return core_.value_head_dim(); }
  /// Longest accepted sequence (0: unlimited).
  Index context_length() const noexcept { return core_.config().context_length; }
  /// Dropout probability on the attention weights (training mode only).
  double dropout() const noexcept { return core_.dropout(); }
  /// The learned sinks (num_heads), one logit per head in every softmax denominator, the
  /// parameter `sinks`; empty unless built with MultiHeadAttentionOptions::sinks. Writes go
  /// straight in (sinks are never packed: freezing leaves them live).
  TensorView<Scalar, 1> sinks() noexcept { return core_.sinks(); }
  TensorView<const Scalar, 1> sinks() const noexcept { return core_.sinks(); }
  /// Scaling of q k^T by 1/sqrt(head_dim): on (default) or off (notebook 001's
  /// SingleHeadAttention).
  bool scaled() const noexcept { return core_.scaled(); }
  void set_scaled(bool on) noexcept { core_.set_scaled(on); }

  // ---- the projections, by the notebooks' names ----

  /// W_query / W_key / W_value as (weight (d_out, in_features), bias) views into the module,
  /// in nn.Linear's layout; writes go straight in. The non-const forms unfreeze.
  LinearView<Scalar> w_query() noexcept { return projection_view(0); }
  LinearView<Scalar> w_key() noexcept { return projection_view(1); }
  LinearView<Scalar> w_value() noexcept { return projection_view(2); }
  LinearView<const Scalar> w_query() const noexcept { return projection_view(0); }
  LinearView<const Scalar> w_key() const noexcept { return projection_view(1); }
  LinearView<const Scalar> w_value() const noexcept { return projection_view(2); }

 protected:
  CoreModule(const CoreConfig& config, TorchGenerator* gen) : core_(config, gen) {}
  /// `other`'s core converted to Scalar (see AttentionCore's converting constructor).
  template <class Other>
  explicit CoreModule(const CoreModule<Other>& other) : core_(other.core_) {}

  template <class>
  friend class CoreModule;

  template <class, class, std::size_t, class...>
  friend class ModuleForwards;
  void run(const ModuleInputs<Scalar>& x, TensorView<Scalar, 3> out, Workspace& ws,
           const AttentionMask<compute_type_t<Scalar>>& mask, TensorView<Scalar, 4> weights,
           SavedForward<Scalar>* saved = nullptr) const {
    core_.forward(x.query, x.key, x.value, out, ws, mask, weights, saved);
  }
  void run_cached(const ModuleInputs<Scalar>& x, TensorView<Scalar, 3> out, Workspace& ws,
                  KVCache<Scalar>& cache, const AttentionMask<compute_type_t<Scalar>>& mask) const {
    require_config(same_view(x.query, x.key) && same_view(x.key, x.value),
                   core_.config().forward_name, [] {
                     return std::string(
                         "the incremental forward is self-attention: pass one tensor as "
                         "query, key and value");
                   });
    forward_cached(core_, x.query, out, ws, cache, mask);
  }

  void run_paged(const ModuleInputs<Scalar>& x, TensorView<Scalar, 3> out, Workspace& ws,
                 PagedKVCache<Scalar>& cache, const std::vector<Index>& seqs) const {
    require_config(same_view(x.query, x.key) && same_view(x.key, x.value),
                   core_.config().forward_name, [] {
                     return std::string(
                         "the incremental forward is self-attention: pass one tensor as "
                         "query, key and value");
                   });
    forward_paged(core_, x.query, out, ws, cache, seqs);
  }

  void run_packed(const ModuleInputs<Scalar>& x, const PackedSequences& seqs,
                  TensorView<Scalar, 3> out, Workspace& ws,
                  const AttentionMask<compute_type_t<Scalar>>& mask,
                  SavedForward<Scalar>* saved) const {
    core_.forward(x.query, x.key, x.value, out, ws, mask, {}, saved, &seqs);
  }
  void run_prefill(const ModuleInputs<Scalar>& x, const PackedSequences& seqs,
                   TensorView<Scalar, 3> out, Workspace& ws, KVCache<Scalar>& cache) const {
    require_config(same_view(x.query, x.key) && same_view(x.key, x.value),
                   core_.config().forward_name, [] {
                     return std::string(
                         "the packed prefill is self-attention: pass one tensor as query, key "
                         "and value");
                   });
    forward_packed_prefill(core_, x.query, seqs, out, ws, cache);
  }
  void run_paged_prefill(const ModuleInputs<Scalar>& x, const PackedSequences& seqs,
                         TensorView<Scalar, 3> out, Workspace& ws, PagedKVCache<Scalar>& cache,
                         const std::vector<Index>& ids) const {
    require_config(same_view(x.query, x.key) && same_view(x.key, x.value),
                   core_.config().forward_name, [] {
                     return std::string(
                         "the packed prefill is self-attention: pass one tensor as query, key "
                         "and value");
                   });
    forward_paged_prefill(core_, x.query, seqs, out, ws, cache, ids);
  }

  void run_backward(TensorView<const Scalar, 3> grad_out, const SavedForward<Scalar>& saved,
                    const TensorView<Scalar, 3> (&grad_in)[3], Gradients<Scalar>& grads,
                    Workspace& ws) const {
    if constexpr (detail::is_gemm_storage_v<Scalar>) {
      core_backward_narrow(core_, grad_out, saved, grad_in, grads, ws);
    } else {
      core_backward(core_, grad_out, saved, grad_in, grads, ws);
    }
  }
  Index output_features(const ModuleInputs<Scalar>&) const noexcept { return core_.d_out(); }
  Index weight_heads() const noexcept { return core_.num_heads(); }
  const char* forward_where() const noexcept { return core_.config().forward_name; }

  LinearView<Scalar> projection_view(int part) noexcept {
    return {core_.projection().weight(part), core_.projection().bias(part)};
  }
  LinearView<const Scalar> projection_view(int part) const noexcept {
    return {core_.projection().weight(part), core_.projection().bias(part)};
  }

  AttentionCore<Scalar> core_;
};

}  // namespace detail
ATTN_NAMESPACE_END
