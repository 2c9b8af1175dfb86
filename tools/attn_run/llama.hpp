// SPDX-License-Identifier: MIT
// tools/attn_run/llama.hpp: `attn_run --format llama`: a Hugging Face Llama / Mistral / Qwen2
// attention layer (safetensors state_dict) run on hidden states, causal, with RoPE.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention/kv_cache.hpp"
#include "attn/attention/multi_head_attention.hpp"
#include "attn/attention/paged_kv_cache.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/io/state_dict.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/rope.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/view_ops.hpp"
#include "attn/workspace.hpp"
#include "attn_run/run.hpp"

namespace attn_run {

/// Options of run_llama() (the flags of `attn_run --format llama`).
struct LlamaOptions {
  attn::Index num_heads = 0;     ///< required
  attn::Index num_kv_heads = 0;  ///< 0: what k_proj.weight holds (checked when given)
  attn::Index head_dim = 0;      ///< 0: q_proj.weight's rows / num_heads (checked when given)
  /// 0: v_proj.weight's rows / num_kv_heads (checked when given)
  attn::Index value_head_dim = 0;
  double rope_theta = 10000.0;
  attn::Index rotary_dim = 0;  ///< 0: head_dim
  bool rope_interleaved = false;
  attn::Index sliding_window = 0;  ///< 0: none
  /// With sliding_window: attention sinks kept beside it (KVCacheOptions::sink_tokens).
  attn::Index sink_tokens = 0;
  attn::Index prefill = 0;  ///< tokens of the first, whole step; 0: all of them
  attn::Index chunk = 1;    ///< tokens per later step
  std::string prefix;       ///< prefix of the weights' names
  /// What the KV cache stores (--kv-dtype); not kScalar: the run is repeated with a Scalar
  /// cache and the output's relative error against it reported.
  attn::KVElement kv_element = attn::KVElement::kScalar;
  /// Tokens per block of a paged KV cache (--paged; 0: a contiguous KVCache). Not 0: the
  /// run is repeated with a contiguous Scalar cache and the output's relative error against
  /// it reported, as for kv_element.
  attn::Index paged_block = 0;
  /// With Scalar bfloat16 or float16: write the output widened exactly to F32 (--output-dtype
  /// f32).
  bool widen_output = false;
};

namespace detail {

/// ||y - exact|| / ||exact|| (||y - exact|| when exact is 0), in double.
template <class Scalar, class Exact>
double relative_error(const attn::Tensor<Scalar, 3>& y, const attn::Tensor<Exact, 3>& exact) {
  double num = 0, den = 0;
  for (attn::Index i = 0; i < y.size(); ++i) {
    const double e = static_cast<double>(static_cast<Exact>(exact.data()[i]));
    const double d = static_cast<double>(static_cast<Exact>(y.data()[i])) - e;
    num += d * d;
    den += e * e;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// run_llama()'s output (B, T, D) (a batch of one for a (T, D) query; `rank` receives the
/// query's rank) and, into `exact` when the options ask for a quantised or paged cache, the
/// same steps through a contiguous Scalar cache.
template <class Scalar>
attn::Tensor<Scalar, 3> llama_output(const attn::io::SafetensorsFile& weights,
                                     const attn::io::SafetensorsFile& inputs,
                                     const LlamaOptions& options, std::size_t& rank,
                                     attn::Tensor<Scalar, 3>& exact) {
  using attn::Index;
  using attn::io::detail::io_require;
  const char* where = "run_llama";
  const std::string& prefix = options.prefix;
  io_require<std::invalid_argument>(options.num_heads > 0, where, [&] {
    return "num_heads=" + std::to_string(options.num_heads) + " must be positive";
  });
  io_require<std::invalid_argument>(
      options.sink_tokens >= 0 && (options.sink_tokens == 0 || options.sliding_window > 0), where,
      [&] {
        return "--sink-tokens " + std::to_string(options.sink_tokens) +
               " goes with a --sliding-window (got " + std::to_string(options.sliding_window) + ")";
      });
  io_require<std::invalid_argument>(
      options.sliding_window >= 0 && options.prefill >= 0 && options.chunk > 0, where, [&] {
        return "--sliding-window " + std::to_string(options.sliding_window) +
               " (0: none), --prefill " + std::to_string(options.prefill) +
               " (0: all) and --chunk " + std::to_string(options.chunk) +
               " must not be negative, and --chunk positive";
      });
  io_require<std::invalid_argument>(options.paged_block >= 0, where, [&] {
    return "--paged " + std::to_string(options.paged_block) + " must be positive";
  });
  if constexpr (attn::is_storage_type_v<Scalar>) {
    io_require<std::invalid_argument>(
        options.kv_element == attn::KVElement::kScalar ||
            options.kv_element == attn::kv_element_of<Scalar>(),
        where, [&] {
          return std::string("a ") + attn::element_name<Scalar>() + " run keeps its KV cache in " +
                 attn::element_name<Scalar>() + " rows: --kv-dtype " +
                 attn::kv_element_name(options.kv_element) + " needs --dtype f32 or f64";
        });
  }
  io_require<attn::io::FormatError>(weights.contains(prefix + "q_proj.weight"), where, [&] {
    return "'" + weights.source() + "' has no '" + prefix +
           "q_proj.weight': --format llama reads Hugging Face's q_proj/k_proj/v_proj/o_proj "
           "names (is the prefix right?)";
  });
  attn::MultiHeadAttentionOptions config =
      attn::io::options_from_state_dict(weights, options.num_heads, prefix);
  const auto agree = [&](const char* flag, Index given, Index found, const char* source) {
    io_require<std::invalid_argument>(given == 0 || given == found, where, [&] {
      return std::string(flag) + " " + std::to_string(given) + " does not fit '" +
             weights.source() + "': " + source + " gives " + std::to_string(found);
    });
  };
  agree("--head-dim", options.head_dim, config.head_dim, "q_proj.weight / num_heads");
  agree("--num-kv-heads", options.num_kv_heads, config.num_kv_heads, "k_proj.weight / head_dim");
  agree("--value-head-dim", options.value_head_dim,
        config.value_head_dim > 0 ? config.value_head_dim : config.head_dim,
        "v_proj.weight / num_kv_heads");

  // ---- the input, checked against the weights from the file's header before anything is
  //      sized from it: the rotary tables by T, the cache by min(window, T) ----
  io_require<attn::io::FormatError>(inputs.contains("query"), where, [&] {
    return "'" + inputs.source() + "' has no tensor 'query'";
  });
  rank = inputs.rank("query");
  io_require<attn::io::FormatError>(rank == 2 || rank == 3, where, [&] {
    return "'" + inputs.source() + "': query has shape " + detail::shape_of(inputs.shape("query")) +
           ", expected (B, T, D) or (T, D)";
  });
  detail::check_input_shape(inputs, "query", rank, config.d_in, where,
                            rank == 3 ? "(B, T, D)" : "(T, D)");
  const Index tokens = inputs.shape("query")[rank - 2];
  const Index prefill = options.prefill > 0 ? options.prefill : tokens;
  io_require<std::invalid_argument>(prefill <= tokens, where, [&] {
    return "--prefill " + std::to_string(prefill) + " and --chunk " +
           std::to_string(options.chunk) + " do not fit T=" + std::to_string(tokens);
  });

  // ---- the module: causal, RoPE tables for positions [0, T), the optional window ----
  config.causal = true;
  // With sinks the window is the cache's, not the module's.
  config.sliding_window = options.sink_tokens > 0 ? 0 : options.sliding_window;
  const Index hd = config.head_dim > 0 ? config.head_dim : config.d_out / config.num_heads;
  config.rope = attn::RotaryOptions{
      hd, options.rotary_dim, options.rope_theta,
      options.rope_interleaved ? attn::RopeStyle::kInterleaved : attn::RopeStyle::kHalfSplit,
      tokens};
  attn::MultiHeadAttention<Scalar> mha(config);
  mha.eval();
  const attn::io::LoadResult loaded =
      attn::io::load_state_dict(mha, weights, prefix, attn::io::Strict::kNo);
  for (const std::string& name : loaded.unexpected) {
    io_require<attn::io::StateDictError>(name == prefix + "rotary_emb.inv_freq", where, [&] {
      return "'" + weights.source() + "' has unexpected tensor '" + name + "'";
    });
  }
  io_require<attn::io::StateDictError>(loaded.missing.empty(), where, [&] {
    return "'" + weights.source() + "' has no tensor '" + loaded.missing.front() + "'";
  });
  mha.freeze();

  const attn::Tensor<Scalar, 3> x =
      rank == 3 ? detail::read_float<Scalar, 3>(inputs, "query", where)
                : attn::Tensor<Scalar, 3>(attn::unsqueeze(
                      detail::read_float<Scalar, 2>(inputs, "query", where).view(), 0));
  const Index batch = x.extent(0);

  // ---- the steps: a prefill, then chunks, through one KV cache ----
  // A step never takes more than the T tokens there are, and a window no narrower than T
  // (with sinks: S + W) never bites: the cache is then a plain one of T positions, else a
  // ring of [S +] window + max_chunk - 1 < 2 T positions. Nothing is sized by a flag alone.
  const Index max_chunk = std::max(prefill, std::min(options.chunk, tokens));
  const Index sinks = options.sink_tokens;
  const bool sink_ring = sinks > 0 && sinks < tokens && options.sliding_window < tokens - sinks;
  const bool ring =
      sink_ring || (sinks == 0 && options.sliding_window > 0 && options.sliding_window < tokens);
  attn::Workspace ws;
  const auto generate = [&](attn::KVElement element, Index paged_block) {
    attn::Tensor<Scalar, 3> y({batch, tokens, mha.d_out()});
    const auto steps = [&](auto&& forward) {
      for (Index t0 = 0, step = prefill; t0 < tokens; t0 += step, step = options.chunk) {
        const Index t1 = t0 + std::min(step, tokens - t0);
        forward(attn::slice(attn::TensorView<const Scalar, 3>(x.view()), 1, t0, t1),
                attn::slice(y.view(), 1, t0, t1));
      }
    };
    if (paged_block > 0) {
      // A pool of exactly the blocks the batch's T tokens take, or with a window W what a
      // step of at most max_chunk tokens holds (the blocks behind the window are released).
      const Index window = config.sliding_window;
      Index per_sequence = (tokens + paged_block - 1) / paged_block;
      if (window > 0) {
        per_sequence =
            std::min(per_sequence, (window + max_chunk - 1 + paged_block - 1) / paged_block + 1);
      }
      attn::PagedKVCacheOptions c;
      c.block_size = paged_block;
      c.num_blocks = batch * per_sequence;
      c.num_kv_heads = mha.num_kv_heads(), c.head_dim = hd, c.element = element;
      c.value_head_dim = mha.value_head_dim();
      attn::PagedKVCache<Scalar> cache(c);
      std::vector<Index> seqs;
      for (Index b = 0; b < batch; ++b) seqs.push_back(cache.add_sequence());
      steps([&](auto in, auto y_out) { mha.forward(in, y_out, ws, cache, seqs); });
      return y;
    }
    attn::KVCacheOptions c;
    c.batch = batch, c.num_kv_heads = mha.num_kv_heads(), c.head_dim = hd;
    c.value_head_dim = mha.value_head_dim();
    c.capacity = ring ? 0 : tokens;
    c.window = ring ? options.sliding_window : 0;
    c.max_chunk = ring ? max_chunk : 1;
    c.sink_tokens = sink_ring ? sinks : 0;
    c.element = element;
    attn::KVCache<Scalar> cache(c);
    steps([&](auto in, auto y_out) { mha.forward(in, y_out, ws, cache); });
    return y;
  };
  const attn::Tensor<Scalar, 3> y = generate(options.kv_element, options.paged_block);
  // (A storage type's cache holds that type: a bfloat16 run is compared with a float run.)
  const bool stored = options.kv_element != attn::KVElement::kScalar || options.paged_block > 0;
  if (!attn::is_storage_type_v<Scalar> && stored) exact = generate(attn::KVElement::kScalar, 0);
  return y;
}

}  // namespace detail

/// Hugging Face's LlamaAttention forward with a causal mask, on `inputs`' `query` (B, T, D)
/// (or (T, D)) and the state_dict in `weights` (q_proj.weight, k_proj.weight, v_proj.weight,
/// o_proj.weight, optional biases; an old checkpoint's rotary_emb.inv_freq buffer is
/// accepted and ignored): Q, K, V projections, RoPE at positions 0..T-1, causal softmax
/// attention over grouped key/value heads (repeat_kv) within the optional sliding window,
/// o_proj. Returns a writer holding `output` (B, T, D) (or (T, D)) as Scalar. With
/// sink_tokens S (and the window W): StreamingLLM's cache instead, each token seeing the
/// first S tokens and its window at positions within the cache (KVCacheOptions::sink_tokens).
///
/// It runs as generation does: the first `prefill` tokens (default T) as one step through a
/// KVCache (a ring with a window), then the rest in steps of `chunk` tokens (default 1, token
/// by token), each through MultiHeadAttention's incremental forward. With a quantised
/// cache (options.kv_element), the run is repeated with a Scalar cache: `error`, when
/// not null, receives ||output - output_scalar|| / ||output_scalar||, which the output's
/// metadata records too (kv_dtype, kv_relative_error). With options.paged_block the steps
/// run through a PagedKVCache (one sequence per batch item, blocks of that many tokens, the
/// window a mask rather than a ring) and are compared the same way (kv_paged_block).
///
/// Scalar bfloat16 runs MultiHeadAttention<bfloat16>: the weights and the query load as
/// bfloat16 (BF16 bit for bit, F32 rounded to nearest even), the rotary embedding rotates
/// the rounded Q and K in float, and the KV cache holds bfloat16 rows (a KVCache<bfloat16>;
/// kv_element kScalar or kBFloat16; a PagedKVCache<bfloat16> with paged_block, the same bits
/// as the contiguous cache without a window). The run is repeated in float on the same files:
/// `error` receives ||output - output_float|| / ||output_float|| (metadata dtype,
/// f32_relative_error). `output` is BF16, or F32 (widened exactly) with options.widen_output.
/// Scalar float16 the same with float16 (F16, a KVCache<float16>, kv_element kScalar or kFloat16).
///
/// Every input and flag is checked against the weights (the query's rank, width and
/// extents from the file's header, --prefill against T) before anything is sized from them:
/// the rotary tables cover the T positions there are, a cache min(window, T) + chunk - 1.
///
/// @throws StateDictError / FormatError naming the file and tensor for a bad file;
///         attn::ShapeError for a query that does not fit the weights (naming its shape);
///         std::invalid_argument for options that do not fit it (naming both values);
///         attn::ConfigError from the library (RoPE sizes and theta, shapes, a quantised
///         cache for bfloat16 or float16).
template <class Scalar>
attn::io::SafetensorsWriter run_llama(const attn::io::SafetensorsFile& weights,
                                      const attn::io::SafetensorsFile& inputs,
                                      const LlamaOptions& options, double* error = nullptr) {
  std::size_t rank = 3;
  attn::Tensor<Scalar, 3> exact;
  const attn::Tensor<Scalar, 3> y =
      detail::llama_output<Scalar>(weights, inputs, options, rank, exact);
  attn::io::SafetensorsWriter out;
  out.set_metadata("producer", "attn_run --format llama");
  const auto record = [&](double e, const char* key) {
    if (error != nullptr) *error = e;
    char text[32];
    std::snprintf(text, sizeof text, "%.3e", e);
    out.set_metadata(key, text);
  };
  if constexpr (attn::is_storage_type_v<Scalar>) {
    LlamaOptions wide = options;
    wide.kv_element = attn::KVElement::kScalar;
    std::size_t unused_rank = 0;
    attn::Tensor<float, 3> unused;
    const attn::Tensor<float, 3> y_float =
        detail::llama_output<float>(weights, inputs, wide, unused_rank, unused);
    out.set_metadata("dtype", attn::element_name<Scalar>());
    record(detail::relative_error(y, y_float), "f32_relative_error");
    if (options.paged_block > 0) {
      out.set_metadata("kv_paged_block", std::to_string(options.paged_block));
    }
  } else if (!exact.empty()) {
    record(detail::relative_error(y, exact), "kv_relative_error");
    out.set_metadata("kv_dtype", attn::kv_element_name(options.kv_element));
    if (options.paged_block > 0) {
      out.set_metadata("kv_paged_block", std::to_string(options.paged_block));
    }
  }
  const auto add = [&](const auto& t) {
    if (rank == 3) {
      out.add("output", t);
    } else {
      out.add("output", attn::select(t.view(), 0, 0));
    }
  };
  if constexpr (attn::is_storage_type_v<Scalar>) {
    if (options.widen_output) return add(attn::convert<float>(y)), out;
  }
  add(y);
  return out;
}

}  // namespace attn_run
