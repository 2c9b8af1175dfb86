// SPDX-License-Identifier: MIT
// tools/attn_run/run.hpp: run a PyTorch nn.MultiheadAttention state_dict on safetensors
// inputs (the core of attn_run, shared with its tests and fuzz target; not installed).
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attention/multi_head_attention.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/config.hpp"
#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/io/state_dict.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/types/element.hpp"
#include "attn_run/masks.hpp"

namespace attn_run {

/// Options of run_multi_head_attention() (the flags of attn_run).
struct RunOptions {
  attn::Index num_heads = 0;  ///< required: a state_dict does not record it
  /// The head sizes when the weights' shapes leave them open (a fused in_proj_weight that
  /// several grouped-query layouts fit); 0: read from the shapes. Checked against them.
  attn::Index num_kv_heads = 0, head_dim = 0, value_head_dim = 0;
  bool causal = false;          ///< add a causal bound, top-left aligned: triu(ones(T_q, T_k), 1)
  bool need_weights = false;    ///< also write "weights"
  bool average_weights = true;  ///< average the weights over heads, like PyTorch's default
  bool backward = false;        ///< also the gradients (--backward)
  std::string prefix;           ///< prefix of the weights' names
  /// A bfloat16 (float16) run's output written as F32 (exactly widened) instead of BF16 (F16).
  bool widen_output = false;
};

namespace detail {

/// Throws FormatError (naming `where`, the file and the tensor) unless `name` has a floating
/// dtype.
inline void require_float(const attn::io::SafetensorsFile& file, const std::string& name,
                          const char* where) {
  const attn::io::DType dtype = file.dtype(name);
  attn::io::detail::io_require<attn::io::FormatError>(
      attn::io::dtype_kind(dtype) == attn::io::DTypeKind::kFloat, where, [&] {
        return "'" + file.source() + "': '" + name + "' has dtype " + attn::io::dtype_name(dtype) +
               ", expected F16, BF16, F32 or F64";
      });
}

template <class Scalar, std::size_t Rank>
attn::Tensor<Scalar, Rank> read_float(const attn::io::SafetensorsFile& file,
                                      const std::string& name, const char* where) {
  require_float(file, name, where);
  return file.get<Scalar, Rank>(name);
}

/// "(2, 6, 4)" for a shape as the file declares it.
inline std::string shape_of(const std::vector<attn::Index>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  }
  return text + ")";
}

/// The checks of an input tensor, from the file's header, before anything is read or sized
/// from it: `name` is there (FormatError), has rank `rank` (FormatError), every extent
/// positive and `features` in its last extent (ShapeError, as the module would say), and a
/// floating dtype (FormatError). `expected` names the shape ("(B, T_q, E)").
/// @throws naming `where`, the file, the tensor, its shape and what was expected.
inline void check_input_shape(const attn::io::SafetensorsFile& file, const std::string& name,
                              std::size_t rank, attn::Index features, const char* where,
                              const std::string& expected) {
  using attn::io::detail::io_require;
  io_require<attn::io::FormatError>(file.contains(name), where, [&] {
    return "'" + file.source() + "' has no tensor '" + name + "'";
  });
  const std::vector<attn::Index>& shape = file.shape(name);
  io_require<attn::io::FormatError>(shape.size() == rank, where, [&] {
    return "'" + file.source() + "': " + name + " has shape " + shape_of(shape) + ", expected " +
           expected;
  });
  const bool positive =
      std::all_of(shape.begin(), shape.end(), [](attn::Index e) { return e > 0; });
  attn::detail::require(positive && shape.back() == features, where, [&] {
    return "'" + file.source() + "': " + name + " has shape " + shape_of(shape) + ", expected " +
           expected + " with no empty axis and " + std::to_string(features) +
           " features (what the weights take)";
  });
  require_float(file, name, where);
}

}  // namespace detail

/// Runs torch.nn.MultiheadAttention(batch_first=True) in eval mode from safetensors files:
/// `weights` holds its state_dict (names as in attn::io::load_state_dict(MultiHeadAttention&)),
/// `inputs` holds
/// - `query` (B, T_q, E) or unbatched (T_q, E);
/// - optionally `key` (B, T_k, kdim) and `value` (B, T_k, vdim), both or neither (self-
///   attention without them);
/// - optionally `attn_mask` and `key_padding_mask`, read as Masks::read() says.
/// Returns a writer holding `output` (B, T_q, E) (or (T_q, E)) and, with need_weights,
/// `weights` (B, T_q, T_k) averaged over heads (or (B, H, T_q, T_k) per head), as Scalar.
/// With `backward`: also `grad_query` (and `grad_key`, `grad_value` when key and value were
/// given) and `grad.<name>` for every parameter (nn.MultiheadAttention's names), the
/// gradients of sum(grad_output * output) (`grad_output` from the inputs, else ones).
/// Rows with no visible key give zeros (PyTorch gives NaN there).
///
/// Scalar bfloat16 runs MultiHeadAttention<bfloat16>: the weights load as bfloat16 (BF16 bit
/// for bit, F32 rounded once to nearest even), so do query, key, value and grad_output, float
/// masks stay float (the module's Compute type), and `output` is written as BF16 (F32,
/// widened exactly, with widen_output); the gradients as BF16 (as PyTorch's .grad of a
/// bfloat16 module). It has no attention weights. Scalar float16 runs MultiHeadAttention<float16>
/// the same way, F16 in place of BF16 (its gradients as F16, unscaled: a float16 training loop
/// scales its loss, optim::MixedPrecision).
///
/// Every input is checked against the weights (its rank, its features, no empty axis, a
/// floating dtype) from the file's header before anything is read or sized from it.
///
/// @throws StateDictError / FormatError naming the file and tensor for a bad file or inputs
///         whose shapes do not fit; std::invalid_argument for bad options (need_weights
///         with bfloat16).
template <class Scalar>
attn::io::SafetensorsWriter run_multi_head_attention(const attn::io::SafetensorsFile& weights,
                                                     const attn::io::SafetensorsFile& inputs,
                                                     const RunOptions& options) {
  using attn::io::FormatError;
  using attn::io::detail::io_require;
  using attn::io::detail::shape_text;
  const char* where = "run_multi_head_attention";
  // What masks are in: Scalar, or float for bfloat16.
  using Compute = attn::compute_type_t<Scalar>;
  constexpr bool kStorage = attn::is_storage_type_v<Scalar>;
  io_require<std::invalid_argument>(options.num_heads > 0, where, [&] {
    return "num_heads=" + std::to_string(options.num_heads) + " must be positive";
  });
  io_require<std::invalid_argument>(!kStorage || !options.need_weights, where, [&] {
    return std::string("a ") + attn::element_name<Scalar>() +
           " run has no attention weights yet; run it in float or double";
  });
  attn::MultiHeadAttentionOptions known;
  known.num_heads = options.num_heads;
  known.num_kv_heads = options.num_kv_heads;
  known.head_dim = options.head_dim;
  known.value_head_dim = options.value_head_dim;
  const attn::MultiHeadAttentionOptions config =
      attn::io::options_from_state_dict(weights, known, options.prefix);
  attn::MultiHeadAttention<Scalar> mha(config);
  mha.eval();
  attn::io::load_state_dict(mha, weights, options.prefix, attn::io::Strict::kYes);

  // ---- inputs: batch-first; unbatched inputs get a batch axis of 1. Each shape is checked
  //      against the weights from the file's header before anything is read, or sized from
  //      it (the masks, grad_output) ----
  io_require<FormatError>(inputs.contains("query"), where,
                          [&] { return "'" + inputs.source() + "' has no tensor 'query'"; });
  const std::size_t rank = inputs.rank("query");
  io_require<FormatError>(rank == 2 || rank == 3, where, [&] {
    return "'" + inputs.source() + "': query has shape " + shape_text(inputs.shape("query")) +
           ", expected (B, T_q, E) or (T_q, E)";
  });
  const bool batched = rank == 3;
  const bool has_key = inputs.contains("key"), has_value = inputs.contains("value");
  io_require<FormatError>(has_key == has_value, where, [&] {
    return "'" + inputs.source() + "' has '" + (has_key ? "key" : "value") + "' but no '" +
           (has_key ? "value" : "key") + "': give both or neither";
  });
  detail::check_input_shape(inputs, "query", rank, mha.d_in(), where,
                            batched ? "(B, T_q, E)" : "(T_q, E)");
  if (has_key) {
    detail::check_input_shape(inputs, "key", rank, mha.kdim(), where,
                              batched ? "(B, T_k, kdim)" : "(T_k, kdim)");
    detail::check_input_shape(inputs, "value", rank, mha.vdim(), where,
                              batched ? "(B, T_k, vdim)" : "(T_k, vdim)");
    const std::vector<attn::Index>&q_shape = inputs.shape("query"), &k_shape = inputs.shape("key"),
          &v_shape = inputs.shape("value");
    io_require<FormatError>(
        k_shape[rank - 2] == v_shape[rank - 2] &&
            (!batched || (k_shape[0] == q_shape[0] && v_shape[0] == q_shape[0])),
        where, [&] {
          return "'" + inputs.source() + "': query " + shape_text(q_shape) + ", key " +
                 shape_text(k_shape) + " and value " + shape_text(v_shape) +
                 " differ in batch size or key length";
        });
  }
  const auto read3 = [&](const std::string& name) {
    io_require<FormatError>(inputs.rank(name) == rank, where, [&] {
      return "'" + inputs.source() + "': " + name + " has shape " + shape_text(inputs.shape(name)) +
             " but query has rank " + std::to_string(rank);
    });
    if (batched) return detail::read_float<Scalar, 3>(inputs, name, where);
    const attn::Tensor<Scalar, 2> t = detail::read_float<Scalar, 2>(inputs, name, where);
    return attn::Tensor<Scalar, 3>(attn::unsqueeze(t.view(), 0));
  };
  const attn::Tensor<Scalar, 3> query = read3("query");
  const attn::Tensor<Scalar, 3> key = has_key ? read3("key") : attn::Tensor<Scalar, 3>();
  const attn::Tensor<Scalar, 3> value = has_key ? read3("value") : attn::Tensor<Scalar, 3>();
  const attn::Index batch = query.extent(0), tq = query.extent(1),
                    tk = has_key ? key.extent(1) : tq;

  // ---- masks ----
  attn::AttentionMask<Compute> mask;
  if (options.causal) mask.causal(attn::CausalAlignment::kTopLeft);
  Masks<Compute> masks(batch, options.num_heads, tq, tk, batched);
  masks.read(inputs, mask);

  // ---- backward: grad_output (optional: the gradient of sum(output), ones) ----
  attn::Tensor<Scalar, 3> grad_output;
  if (options.backward) {
    const attn::Index e = mha.embed_dim();
    if (inputs.contains("grad_output")) {
      grad_output = read3("grad_output");
      io_require<FormatError>(grad_output.shape() == attn::Shape<3>{batch, tq, e}, where, [&] {
        const std::vector<attn::Index> want =
            batched ? std::vector<attn::Index>{batch, tq, e} : std::vector<attn::Index>{tq, e};
        return "'" + inputs.source() + "': grad_output has shape " +
               shape_text(inputs.shape("grad_output")) + ", expected the output's shape " +
               shape_text(want);
      });
    } else {
      grad_output = attn::Tensor<Scalar, 3>({batch, tq, e});
      grad_output.fill(Scalar(1));
    }
  }

  // ---- run ----
  const attn::TensorView<const Scalar, 3> q = query.view();
  const attn::TensorView<const Scalar, 3> k = has_key ? key.view() : q;
  const attn::TensorView<const Scalar, 3> v = has_key ? value.view() : q;
  attn::io::SafetensorsWriter out;
  out.set_metadata("producer", "attn_run");
  const auto add = [&](const char* name, const auto& y) {  // drops the batch axis if unbatched
    if (batched) {
      out.add(name, y);
    } else {
      out.add(name, attn::select(y.view(), 0, 0));
    }
  };
  const auto add_output = [&](const attn::Tensor<Scalar, 3>& y) {
    if constexpr (kStorage) {
      if (options.widen_output) return add("output", attn::convert<float>(y));
    }
    add("output", y);
  };
  if (options.backward) {
    // The training forward (eval mode: no dropout) and the backward, into zeroed gradients
    // named as nn.MultiheadAttention names its parameters. Self-attention runs as m(x, x, x):
    // grad_query is the whole gradient of the one input.
    attn::Workspace ws;
    attn::SavedForward<Scalar> saved;
    attn::Tensor<Scalar, 3> output({batch, tq, mha.embed_dim()});
    attn::Gradients<Scalar> grads(mha.named_parameters(attn::ParameterNames::kMultiheadAttention));
    attn::Tensor<Scalar, 3> grad_query(query.shape());
    if (has_key) {
      attn::Tensor<Scalar, 3> grad_key(key.shape()), grad_value(value.shape());
      mha.forward(q, k, v, output.view(), saved, ws, mask);
      mha.backward(grad_output.view(), saved, grad_query.view(), grad_key.view(), grad_value.view(),
                   grads, ws);
      add("grad_key", grad_key);
      add("grad_value", grad_value);
    } else {
      mha.forward(q, output.view(), saved, ws, mask);
      mha.backward(grad_output.view(), saved, grad_query.view(), grads, ws);
    }
    add_output(output);
    add("grad_query", grad_query);
    for (const auto& g : grads) {
      const std::string name = "grad." + g.name();
      if (g.rank() == 1) {
        out.add(name, attn::Tensor<Scalar, 1>(g.vector()));
      } else {
        out.add(name, attn::Tensor<Scalar, 2>(g.matrix()));
      }
    }
  }
  if (!options.need_weights) {
    if (!options.backward) add_output(mha.forward(q, k, v, mask));
    return out;
  }
  if constexpr (!kStorage) {  // a bfloat16 run has no attention weights (refused above)
    const attn::MultiHeadAttentionOutput<Scalar> r = mha.forward_with_weights(q, k, v, mask);
    if (!options.backward) add("output", r.output);
    if (options.average_weights) {
      add("weights", attn::average_heads(r.weights.view()));
    } else {
      add("weights", r.weights);
    }
  }
  return out;
}

}  // namespace attn_run
