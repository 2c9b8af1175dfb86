// SPDX-License-Identifier: MIT
// attn/attention/core_config.hpp: what configures an attention module's core (CoreConfig:
// sizes, heads, masks, rotary embeddings, window, the attention variants, names), how its
// weights are first drawn (InitScheme), and the one validation of a configuration, with
// messages naming the values.
// Glossary: H = heads, H_kv = key/value heads, hd = head dim (queries and keys), hd_v = value
// head dim.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/detail/checked.hpp"
#include "attn/error.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/rope.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// How initial weights are drawn (from a TorchGenerator, bit-compatible with PyTorch).
enum class InitScheme {
  /// As the notebooks' modules: nn.Linear init for W_query, W_key, W_value, then out_proj.
  kLinear,
  /// As torch.nn.MultiheadAttention: out_proj drawn as nn.Linear, then xavier_uniform_ on
  /// in_proj_weight (or q/k/v_proj_weight), then every bias set to zero.
  kMultiheadAttention,
  /// As notebook 003's SelfAttention_v1: torch.rand(d_in, d_out) for W_query, W_key,
  /// W_value (then out_proj, if any, as nn.Linear).
  kRand,
  /// Zero weights, nothing drawn (the caller sets them).
  kNone,
};

/// The attention variants of a module, the same for every module with weights:
/// MultiHeadAttentionOptions holds them, and SelfAttention, CausalAttention, CrossAttention
/// and MultiHeadAttentionWrapper take them as their constructor's last argument. All off by
/// default. Formulas, where each applies and the models they come from: docs/variants.md.
struct AttentionVariants {
  /// Softcapping (Gemma 2, Grok): the scaled scores s become softcap * tanh(s / softcap)
  /// before ALiBi and the masks are added. 0: off; else positive and finite.
  double softcap = 0.0;
  /// ALiBi (BLOOM, MPT): -m_h |p_i - j| added to head h's scores, p_i query i's position
  /// (in the incremental forward, the cache's absolute positions). The slopes m_h: the
  /// standard geometric series of alibi_max_bias (8: BLOOM's; attn::alibi_slopes() lists
  /// them), or `alibi_slopes` (num_heads finite values) when given. Set one or the other;
  /// both 0 / empty: off.
  double alibi_max_bias = 0.0;
  std::vector<double> alibi_slopes;
  /// Learned attention sinks (gpt-oss): the module owns a trainable parameter `sinks`
  /// (num_heads,), one logit per head that joins every row's softmax denominator as
  /// exp(sinks[h]) and no numerator, so a row may give less than its whole weight to the
  /// keys. Listed by named_parameters() last, under every naming (state_dict, Gradients,
  /// optimizers). Initial value 0 (exp(0) = 1 in each denominator): gpt-oss allocates it
  /// uninitialised for a checkpoint to fill, Hugging Face draws it from N(0, 0.02); 0 is
  /// that draw's mean, and leaves the weights' random draw as it is without sinks.
  bool sinks = false;
};

/// Configuration of a MultiHeadAttention beyond the notebooks' constructor (its variants:
/// AttentionVariants, the base).
struct MultiHeadAttentionOptions : AttentionVariants {
  Index d_in = 0;   ///< query features (nn.MultiheadAttention's embed_dim)
  Index d_out = 0;  ///< model width = output features; 0 means d_in
  Index num_heads = 1;
  /// Key/value heads H_kv (grouped-query attention; 1: multi-query); 0 means num_heads.
  /// H_kv must divide num_heads. K and V are projected to H_kv * head_dim features.
  Index num_kv_heads = 0;
  /// Features per head; 0 means d_out / num_heads. When set, Q is projected to num_heads *
  /// head_dim features and out_proj maps those to d_out (Gemma-like shapes).
  Index head_dim = 0;
  /// Features per value head hd_v; 0 means head_dim. When set, V is projected to
  /// num_kv_heads * value_head_dim features, the context is num_heads * value_head_dim wide
  /// and out_proj maps it to d_out (DeepSeek's decompressed MLA heads: queries and keys of
  /// 192, values of 128). A KVCache for the incremental forward needs the same
  /// KVCacheOptions::value_head_dim.
  Index value_head_dim = 0;
  Index kdim = 0;            ///< key features; 0 means d_in
  Index vdim = 0;            ///< value features; 0 means d_in
  Index context_length = 0;  ///< longest accepted sequence; 0 means unlimited
  double dropout = 0.0;      ///< on the attention weights, training mode only
  bool qkv_bias = false;     ///< bias of the Q/K/V projections
  bool out_bias = true;      ///< bias of out_proj
  bool causal = false;       ///< always apply a causal bound (self-attention decoders)
  CausalAlignment causal_alignment = CausalAlignment::kSquare;
  /// Rotary position embeddings on Q and K (rope.head_dim 0: none; else head_dim), as Llama,
  /// Mistral and Qwen2: at positions 0..T-1 in forward(), the cache's positions in the
  /// incremental forward.
  RotaryOptions rope{};
  /// Sliding window W (Mistral; 0: none; needs causal): position p sees keys in (p - W, p].
  Index sliding_window = 0;
  InitScheme init = InitScheme::kLinear;  ///< kLinear, kMultiheadAttention or kRand

  /// The configuration of `torch.nn.MultiheadAttention(embed_dim, num_heads, dropout,
  /// bias, kdim=kdim, vdim=vdim, batch_first=True)`.
  static MultiHeadAttentionOptions pytorch(Index embed_dim, Index num_heads, bool bias = true,
                                           Index kdim = 0, Index vdim = 0, double dropout = 0.0) {
    MultiHeadAttentionOptions o;
    o.d_in = embed_dim;
    o.d_out = embed_dim;
    o.num_heads = num_heads;
    o.kdim = kdim;
    o.vdim = vdim;
    o.dropout = dropout;
    o.qkv_bias = bias;
    o.out_bias = bias;
    o.init = InitScheme::kMultiheadAttention;
    return o;
  }
};

namespace detail {

/// What tells one attention module from another: the options every module with a core has
/// (MultiHeadAttentionOptions: sizes, heads, masks, rotary embeddings, window, variants,
/// init), and who the module is (its names in messages and files, its output projection). A
/// module's header fills one from its constructor's arguments; MultiHeadAttention takes the
/// user's options as they are.
struct CoreConfig : MultiHeadAttentionOptions {
  CoreConfig() { out_bias = false; }
  explicit CoreConfig(const MultiHeadAttentionOptions& options)
      : MultiHeadAttentionOptions(options) {}

  const char* name = "";             ///< class name in messages, a string literal
  const char* forward_name = "";     ///< "<name>::forward", a string literal
  const char* input_name = nullptr;  ///< "x" for single-input modules; else query/key/value
  bool out_proj = false;             ///< an output projection (d_out, A), with out_bias
  ParameterNames names = ParameterNames::kNotebook;  ///< what ParameterNames::kDefault means

  /// The module's own causal bound and window, folded into every call's mask.
  CausalBound causal_bound() const noexcept { return {causal, causal_alignment, sliding_window}; }
};

/// The variants that are on, as messages quote them: ", softcap=30, sinks=true" ("" when
/// none is).
inline std::string describe_variants(const AttentionVariants& v) {
  std::string text;
  if (v.softcap != 0.0) text += ", softcap=" + number(v.softcap);
  if (v.alibi_max_bias != 0.0) text += ", alibi_max_bias=" + number(v.alibi_max_bias);
  if (!v.alibi_slopes.empty()) {
    text += ", alibi_slopes=[";
    for (std::size_t h = 0; h < v.alibi_slopes.size(); ++h) {
      text += (h == 0 ? "" : ", ") + number(v.alibi_slopes[h]);
    }
    text += "]";
  }
  if (v.sinks) text += ", sinks=true";
  return text;
}

/// True when `a` and `b` switch on the same variants with the same values.
inline bool same_variants(const AttentionVariants& a, const AttentionVariants& b) noexcept {
  return a.softcap == b.softcap && a.alibi_max_bias == b.alibi_max_bias &&
         a.alibi_slopes == b.alibi_slopes && a.sinks == b.sinks;
}

/// The configuration of `c` as messages quote it: "MultiHeadAttention(d_in=6, kdim=6,
/// vdim=6, d_out=6, num_heads=2, num_kv_heads=2, head_dim=3, qkv_bias=true, ...)".
inline std::string describe_config(const CoreConfig& c) {
  const auto flag = [](bool on) { return on ? std::string("true") : std::string("false"); };
  std::string text = std::string(c.name) + "(d_in=" + std::to_string(c.d_in) +
                     ", kdim=" + std::to_string(c.kdim) + ", vdim=" + std::to_string(c.vdim) +
                     ", d_out=" + std::to_string(c.d_out) +
                     ", num_heads=" + std::to_string(c.num_heads) +
                     ", num_kv_heads=" + std::to_string(c.num_kv_heads) +
                     ", head_dim=" + std::to_string(c.head_dim);
  if (c.value_head_dim != 0 && c.value_head_dim != c.head_dim) {
    text += ", value_head_dim=" + std::to_string(c.value_head_dim);
  }
  text += ", qkv_bias=" + flag(c.qkv_bias) + ", out_proj=" + flag(c.out_proj) +
          ", out_bias=" + flag(c.out_bias) + ", causal=" + flag(c.causal);
  if (c.causal) text += ", alignment=" + std::to_string(static_cast<int>(c.causal_alignment));
  text += ", sliding_window=" + std::to_string(c.sliding_window) +
          ", context_length=" + std::to_string(c.context_length) + ", dropout=" + number(c.dropout);
  if (c.rope.head_dim > 0) {
    text += ", rope(rotary_dim=" + std::to_string(c.rope.rotary_dim) +
            ", theta=" + number(c.rope.theta) +
            (c.rope.style == RopeStyle::kInterleaved ? ", interleaved)" : ", half-split)");
  } else {
    text += ", rope=none";
  }
  return text + describe_variants(c) + ")";
}

/// True when `a` and `b` describe the same computation on parameters of the same shapes:
/// every size, head count, bias, mask bound, window, rotary embedding, variant (softcap,
/// ALiBi, sinks) and dropout rate (names and the initial draw aside). What a backward compares
/// between the module that recorded a SavedForward and itself.
inline bool same_config(const CoreConfig& a, const CoreConfig& b) noexcept {
  const auto same_rope = [](const RotaryOptions& x, const RotaryOptions& y) {
    return x.head_dim == y.head_dim &&
           (x.head_dim == 0 ||
            (x.rotary_dim == y.rotary_dim && x.theta == y.theta && x.style == y.style));
  };
  return std::strcmp(a.name, b.name) == 0 && a.d_in == b.d_in && a.kdim == b.kdim &&
         a.vdim == b.vdim && a.d_out == b.d_out && a.num_heads == b.num_heads &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
         a.context_length == b.context_length && a.dropout == b.dropout &&
         a.qkv_bias == b.qkv_bias && a.out_proj == b.out_proj && a.out_bias == b.out_bias &&
         a.causal == b.causal && (!a.causal || a.causal_alignment == b.causal_alignment) &&
         same_rope(a.rope, b.rope) && a.sliding_window == b.sliding_window && same_variants(a, b) &&
         a.value_head_dim == b.value_head_dim;
}

/// `c` when it describes a module that can exist; else a ConfigError naming the values (the
/// sizes, head counts, head dim, rotary head dim, window, variants and dropout).
inline CoreConfig checked_core_config(const CoreConfig& c) {
  require_config(c.d_in > 0 && c.d_out > 0 && c.num_heads > 0 && c.kdim >= 0 && c.vdim >= 0 &&
                     c.context_length >= 0 && c.num_kv_heads >= 0 && c.head_dim >= 0,
                 c.name, [&] {
                   std::string sizes =
                       "d_in=" + std::to_string(c.d_in) + ", d_out=" + std::to_string(c.d_out);
                   if (c.num_heads != 1) sizes += ", num_heads=" + std::to_string(c.num_heads);
                   if (c.num_kv_heads != 0) {
                     sizes += ", num_kv_heads=" + std::to_string(c.num_kv_heads);
                   }
                   if (c.head_dim != 0) sizes += ", head_dim=" + std::to_string(c.head_dim);
                   if (c.kdim != 0) sizes += ", kdim=" + std::to_string(c.kdim);
                   if (c.vdim != 0) sizes += ", vdim=" + std::to_string(c.vdim);
                   return sizes + ", context_length=" + std::to_string(c.context_length) +
                          ": sizes must be positive (kdim, vdim, num_kv_heads, head_dim, "
                          "context_length: 0 = default)";
                 });
  require_config(c.value_head_dim >= 0, c.name, [&] {
    return "value_head_dim=" + std::to_string(c.value_head_dim) +
           " must be 0 (head_dim) or positive";
  });
  require_config(c.head_dim > 0 || c.d_out % c.num_heads == 0, c.name, [&] {
    return "d_out=" + std::to_string(c.d_out) +
           " is not divisible by num_heads=" + std::to_string(c.num_heads) +
           " (d_out % num_heads = " + std::to_string(c.d_out % c.num_heads) + "; or set head_dim)";
  });
  const Index kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  require_config(c.num_heads % kv_heads == 0, c.name, [&] {
    return "num_heads=" + std::to_string(c.num_heads) +
           " is not divisible by num_kv_heads=" + std::to_string(kv_heads) +
           ": the number of heads in key and value must divide the number of heads in query";
  });
  // The projections' widths, H hd, H hd_v (the context) and (H + H_kv) hd + H_kv hd_v, are
  // the sizes every buffer of a forward is built from: they must fit an Index.
  const Index hd = c.head_dim > 0 ? c.head_dim : c.d_out / c.num_heads;
  const Index hd_v = c.value_head_dim > 0 ? c.value_head_dim : hd;
  Index width = 0, value_width = 0, qk_heads = 0, qk_rows = 0, v_rows = 0, rows = 0;
  require_config(
      checked_product(width, c.num_heads, hd) && checked_product(value_width, c.num_heads, hd_v) &&
          checked_sum(qk_heads, c.num_heads, kv_heads) && checked_product(qk_rows, qk_heads, hd) &&
          checked_product(v_rows, kv_heads, hd_v) && checked_sum(rows, qk_rows, v_rows),
      c.name, [&] {
        return "num_heads=" + std::to_string(c.num_heads) +
               ", num_kv_heads=" + std::to_string(kv_heads) + ", head_dim=" + std::to_string(hd) +
               " and value_head_dim=" + std::to_string(hd_v) + ": the projections' widths overflow";
      });
  require_config(c.out_proj || value_width == c.d_out, c.name, [&] {
    return "num_heads=" + std::to_string(c.num_heads) + " x " +
           (c.value_head_dim > 0 ? "value_head_dim=" + std::to_string(hd_v)
                                 : "head_dim=" + std::to_string(hd)) +
           " != d_out=" + std::to_string(c.d_out) +
           ": without an output projection the context is the output";
  });
  require_config(c.rope.head_dim == 0 || c.rope.head_dim == hd, c.name, [&] {
    return "rope.head_dim=" + std::to_string(c.rope.head_dim) +
           " must be 0 (no rotary embedding) or the head dim " + std::to_string(hd);
  });
  require_config(c.sliding_window >= 0 && (c.sliding_window == 0 || c.causal), c.name, [&] {
    return "sliding_window=" + std::to_string(c.sliding_window) +
           " must be 0 or positive, and a window needs causal=true";
  });
  require_config(std::isfinite(c.softcap) && c.softcap >= 0.0, c.name, [&] {
    return "softcap=" + number(c.softcap) + " must be 0 (off) or positive and finite";
  });
  require_config(std::isfinite(c.alibi_max_bias) && c.alibi_max_bias >= 0.0, c.name, [&] {
    return "alibi_max_bias=" + number(c.alibi_max_bias) + " must be 0 (off) or positive and finite";
  });
  require_config(
      c.alibi_slopes.empty() || static_cast<Index>(c.alibi_slopes.size()) == c.num_heads, c.name,
      [&] {
        return "alibi_slopes has " + std::to_string(c.alibi_slopes.size()) +
               " values, expected one per head: num_heads=" + std::to_string(c.num_heads);
      });
  for (std::size_t h = 0; h < c.alibi_slopes.size(); ++h) {
    require_config(std::isfinite(c.alibi_slopes[h]), c.name, [&] {
      return "alibi_slopes[" + std::to_string(h) + "]=" + number(c.alibi_slopes[h]) +
             " must be finite";
    });
  }
  require_config(c.alibi_slopes.empty() || c.alibi_max_bias == 0.0, c.name, [&] {
    return "alibi_max_bias=" + number(c.alibi_max_bias) + " and " +
           std::to_string(c.alibi_slopes.size()) +
           " alibi_slopes are both set: give the slopes, or the max bias of the standard "
           "series, not both";
  });
  check_dropout(c.dropout, c.name);
  return c;
}

}  // namespace detail
ATTN_NAMESPACE_END
