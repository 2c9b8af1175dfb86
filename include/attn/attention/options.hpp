// SPDX-License-Identifier: MIT
// attn/attention/options.hpp: the options of an attention call (scale, dropout, path), as
// scaled_dot_product_attention() and every module's kernel take them.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/config.hpp"
#include "attn/nn/dropout.hpp"

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

ATTN_NAMESPACE_END
