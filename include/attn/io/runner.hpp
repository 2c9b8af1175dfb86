// SPDX-License-Identifier: MIT
// attn/io/runner.hpp: run a PyTorch nn.MultiheadAttention state_dict on safetensors inputs
// (the core of tools/attn_run, shared with its tests).
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention/multi_head_attention.hpp"
#include "attn/config.hpp"
#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/io/state_dict.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

namespace attn::io {

/// Options of run_multi_head_attention() (the flags of attn_run).
struct RunOptions {
  Index num_heads = 0;         ///< required: a state_dict does not record it
  bool causal = false;         ///< add a causal bound, top-left aligned: triu(ones(T_q, T_k), 1)
  bool need_weights = false;   ///< also write "weights"
  bool average_weights = true; ///< average the weights over heads, like PyTorch's default
  std::string prefix;          ///< prefix of the weights' names
};

namespace detail {

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> read_float(const SafetensorsFile& file, const std::string& name) {
  const DType dtype = file.dtype(name);
  io_require<FormatError>(dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF32 ||
                              dtype == DType::kF64,
                          "run_multi_head_attention", [&] {
                            return "'" + file.source() + "': '" + name + "' has dtype " +
                                   dtype_name(dtype) + ", expected F16, BF16, F32 or F64";
                          });
  return file.get<Scalar, Rank>(name);
}

inline std::string dims(std::vector<Index> values) { return shape_text(values); }

}  // namespace detail

/// Runs torch.nn.MultiheadAttention(batch_first=True) in eval mode from safetensors files:
/// `weights` holds its state_dict (names as in load_state_dict(MultiHeadAttention&)),
/// `inputs` holds
/// - `query` (B, T_q, E) or unbatched (T_q, E);
/// - optionally `key` (B, T_k, kdim) and `value` (B, T_k, vdim), both or neither (self-
///   attention without them);
/// - optionally `attn_mask`: BOOL = blocked where true (PyTorch's boolean attn_mask), or a
///   float type = added to the scaled scores; shape (T_q, T_k) or (B * num_heads, T_q, T_k)
///   ((num_heads, T_q, T_k) unbatched), as PyTorch;
/// - optionally `key_padding_mask`: BOOL (B, T_k) ((T_k) unbatched), true = padding.
/// Returns a writer holding `output` (B, T_q, E) (or (T_q, E)) and, with need_weights,
/// `weights` (B, T_q, T_k) averaged over heads (or (B, H, T_q, T_k) per head), as Scalar.
/// Rows with no visible key give zeros (PyTorch gives NaN there).
///
/// @throws StateDictError / FormatError naming the file and tensor for a bad file; ShapeError
///         for inputs whose shapes do not fit; std::invalid_argument for bad options.
template <class Scalar>
SafetensorsWriter run_multi_head_attention(const SafetensorsFile& weights,
                                           const SafetensorsFile& inputs,
                                           const RunOptions& options) {
  const char* where = "run_multi_head_attention";
  detail::io_require<std::invalid_argument>(options.num_heads > 0, where, [&] {
    return "num_heads=" + std::to_string(options.num_heads) + " must be positive";
  });
  MultiHeadAttentionOptions config = options_from_state_dict(weights, options.num_heads,
                                                             options.prefix);
  MultiHeadAttention<Scalar> mha(config);
  mha.eval();
  load_state_dict(mha, weights, options.prefix, Strict::kYes);

  // ---- inputs: batch-first; unbatched inputs get a batch axis of 1 ----
  detail::io_require<FormatError>(inputs.contains("query"), where, [&] {
    return "'" + inputs.source() + "' has no tensor 'query'";
  });
  const std::size_t rank = inputs.rank("query");
  detail::io_require<FormatError>(rank == 2 || rank == 3, where, [&] {
    return "'" + inputs.source() + "': query has shape " + detail::dims(inputs.shape("query")) +
           ", expected (B, T_q, E) or (T_q, E)";
  });
  const bool batched = rank == 3;
  const auto read3 = [&](const std::string& name) {
    detail::io_require<FormatError>(inputs.rank(name) == rank, where, [&] {
      return "'" + inputs.source() + "': " + name + " has shape " +
             detail::dims(inputs.shape(name)) + " but query has rank " + std::to_string(rank);
    });
    if (batched) return detail::read_float<Scalar, 3>(inputs, name);
    const Tensor<Scalar, 2> t = detail::read_float<Scalar, 2>(inputs, name);
    return Tensor<Scalar, 3>(unsqueeze(t.view(), 0));
  };
  const bool has_key = inputs.contains("key"), has_value = inputs.contains("value");
  detail::io_require<FormatError>(has_key == has_value, where, [&] {
    return "'" + inputs.source() + "' has '" + (has_key ? "key" : "value") + "' but no '" +
           (has_key ? "value" : "key") + "': give both or neither";
  });
  const Tensor<Scalar, 3> query = read3("query");
  const Tensor<Scalar, 3> key = has_key ? read3("key") : Tensor<Scalar, 3>();
  const Tensor<Scalar, 3> value = has_key ? read3("value") : Tensor<Scalar, 3>();
  const Index batch = query.extent(0), tq = query.extent(1),
              tk = has_key ? key.extent(1) : tq, heads = options.num_heads;

  // ---- masks ----
  AttentionMask<Scalar> mask;
  if (options.causal) mask.causal(CausalAlignment::kTopLeft);
  Tensor<bool, 4> blocked;
  Tensor<Scalar, 4> additive;
  if (inputs.contains("attn_mask")) {
    const std::vector<Index>& s = inputs.shape("attn_mask");
    Shape<4> shape4{};
    if (s.size() == 2) {
      shape4 = {1, 1, s[0], s[1]};
    } else if (s.size() == 3 && s[0] == (batched ? batch * heads : heads)) {
      shape4 = {batched ? batch : 1, heads, s[1], s[2]};
    } else {
      detail::io_require<FormatError>(false, where, [&] {
        return "'" + inputs.source() + "': attn_mask has shape " + detail::dims(s) +
               ", expected (T_q, T_k) = " + detail::dims({tq, tk}) + " or " +
               (batched ? "(B * num_heads, T_q, T_k) = " +
                              detail::dims({batch * heads, tq, tk})
                        : "(num_heads, T_q, T_k) = " + detail::dims({heads, tq, tk}));
      });
    }
    if (inputs.dtype("attn_mask") == DType::kBool) {
      blocked = Tensor<bool, 4>(shape4);
      const std::vector<bool> v = inputs.values<bool>("attn_mask");
      for (std::size_t i = 0; i < v.size(); ++i) blocked.data()[i] = v[i];
      mask.blocked(blocked);
    } else {
      additive = Tensor<Scalar, 4>(shape4);
      const std::vector<Scalar> v = inputs.values<Scalar>("attn_mask");
      std::copy(v.begin(), v.end(), additive.data());
      mask.additive(additive);
    }
  }
  Tensor<bool, 2> padding;
  if (inputs.contains("key_padding_mask")) {
    const std::vector<Index>& s = inputs.shape("key_padding_mask");
    detail::io_require<FormatError>(inputs.dtype("key_padding_mask") == DType::kBool &&
                                        s.size() == (batched ? 2u : 1u),
                                    where, [&] {
      return "'" + inputs.source() + "': key_padding_mask is " +
             dtype_name(inputs.dtype("key_padding_mask")) + " " + detail::dims(s) +
             ", expected BOOL " + (batched ? "(B, T_k)" : "(T_k)");
    });
    padding = Tensor<bool, 2>({batched ? s[0] : 1, s.back()});
    const std::vector<bool> v = inputs.values<bool>("key_padding_mask");
    for (std::size_t i = 0; i < v.size(); ++i) padding.data()[i] = v[i];
    mask.key_padding(padding);
  }

  // ---- run ----
  const TensorView<const Scalar, 3> q = query.view();
  const TensorView<const Scalar, 3> k = has_key ? key.view() : q;
  const TensorView<const Scalar, 3> v = has_key ? value.view() : q;
  SafetensorsWriter out;
  out.set_metadata("producer", "attn::io::run_multi_head_attention");
  const auto add_output = [&](const Tensor<Scalar, 3>& y) {
    if (batched) {
      out.add("output", y);
    } else {
      out.add("output", select(y.view(), 0, 0));
    }
  };
  if (!options.need_weights) {
    add_output(mha.forward(q, k, v, mask));
    return out;
  }
  const MultiHeadAttentionOutput<Scalar> r = mha.forward_with_weights(q, k, v, mask);
  add_output(r.output);
  if (options.average_weights) {
    const Tensor<Scalar, 3> mean = average_heads(r.weights.view());
    if (batched) {
      out.add("weights", mean);
    } else {
      out.add("weights", select(mean.view(), 0, 0));
    }
  } else if (batched) {
    out.add("weights", r.weights);
  } else {
    out.add("weights", select(r.weights.view(), 0, 0));
  }
  return out;
}

}  // namespace attn::io
