// SPDX-License-Identifier: MIT
// attn/attention/options.hpp: the options of an attention call (scale, dropout, path and the
// variants: softcap, ALiBi, sinks, the stage a weights output holds), as
// scaled_dot_product_attention() and every module's kernel take them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "attn/config.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// One value per head (H,) for an attention call (learned sinks, ALiBi slopes): a view of
/// the caller's float or double memory, read in the call's own scalar type (a float call
/// takes float values). The memory must outlive the call, and a backward that reads it.
class HeadValues {
 public:
  HeadValues() = default;
  HeadValues(TensorView<const float, 1> v) noexcept : float_(v) {}        // NOLINT: implicit
  HeadValues(TensorView<const double, 1> v) noexcept : double_(v) {}      // NOLINT: implicit
  HeadValues(TensorView<float, 1> v) noexcept : float_(v) {}              // NOLINT: implicit
  HeadValues(TensorView<double, 1> v) noexcept : double_(v) {}            // NOLINT: implicit
  HeadValues(const Tensor<float, 1>& t) noexcept : float_(t.view()) {}    // NOLINT: implicit
  HeadValues(const Tensor<double, 1>& t) noexcept : double_(t.view()) {}  // NOLINT: implicit
  HeadValues(Tensor<float, 1>&&) = delete;  // a temporary would dangle
  HeadValues(Tensor<double, 1>&&) = delete;

  bool empty() const noexcept { return float_.data() == nullptr && double_.data() == nullptr; }
  /// The number of values (0 when empty).
  Index size() const noexcept {
    return float_.data() != nullptr ? float_.extent(0) : double_.extent(0);
  }
  /// Whether the values are Scalars (float or double).
  template <class Scalar>
  bool holds() const noexcept {
    return std::is_same_v<Scalar, float> ? float_.data() != nullptr : double_.data() != nullptr;
  }
  /// The values as Scalars; an empty view unless holds<Scalar>().
  template <class Scalar>
  TensorView<const Scalar, 1> view() const noexcept {
    if constexpr (std::is_same_v<Scalar, float>) {
      return float_;
    } else {
      return double_;
    }
  }

 private:
  TensorView<const float, 1> float_{};
  TensorView<const double, 1> double_{};
};

/// Which algorithm computes the attention. Both give the same result within rounding
/// (see docs/accuracy.md#tolerances); kAuto picks streaming unless weights are requested.
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
  /// Softcapping (Gemma 2, Grok; ONNX's softcap): the scaled scores s become
  /// softcap * tanh(s / softcap) before ALiBi and the mask are added. 0: off.
  double softcap = 0.0;
  /// ALiBi (BLOOM, MPT; ggml's max_bias): -m_h |p_i - j| added to the scores of head h, p_i
  /// query i's key position (its causal diagonal, i + T_k - T_q without a causal bound).
  /// The slopes m_h: `alibi_slopes` (H values) when given, else the standard geometric series
  /// of `alibi_max_bias` (8 gives BLOOM's; alibi_slopes() lists them). Both unset: off.
  double alibi_max_bias = 0.0;
  HeadValues alibi_slopes;
  /// Learned attention sinks (gpt-oss): one logit per head (H values), added to every row's
  /// softmax denominator as exp(sink_h) and to no numerator. Empty: off.
  HeadValues sinks;
  /// What a weights output receives (materialised path): the attention weights, or the
  /// scores at an earlier stage (ONNX's qk_matmul_output modes). Ignored without weights.
  WeightsStage weights_stage = WeightsStage::kWeights;
};

/// The ALiBi slopes of `heads` heads for `max_bias` (8: BLOOM's and ggml's default): with n
/// the largest power of two <= heads, 2^(-max_bias (h + 1) / n) for the first n heads, then
/// 2^(-max_bias (2 (h - n) + 1) / (2 n)).
inline std::vector<double> alibi_slopes(Index heads, double max_bias = 8.0) {
  std::vector<double> slopes(static_cast<std::size_t>(heads > 0 ? heads : 0));
  for (Index h = 0; h < heads; ++h) {
    slopes[static_cast<std::size_t>(h)] = detail::alibi_slope(h, heads, max_bias);
  }
  return slopes;
}

ATTN_NAMESPACE_END
