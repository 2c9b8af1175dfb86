// SPDX-License-Identifier: MIT
// tools/attn_run/onnx.hpp: the ONNX `Attention` operator (domain ai.onnx, opsets 23 and 24,
// run as Attention-24) on safetensors inputs under the operator's own names, through
// attn's public API (the core of `attn_run --format onnx`; docs/onnx.md describes it).
// Glossary: B = batch, S_q = query positions, S_kv = new key/value positions, P = cached
// positions, T = P + S_kv, Hq / Hkv = query / key-value heads, d / dv = head sizes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention/scaled_dot_product.hpp"
#include "attn/config.hpp"
#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/mask.hpp"
#include "attn/ops/convert.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

namespace attn_run {

/// The operator's attributes (attn_run's flags for --format onnx); unset optionals are
/// attributes the model does not set.
struct OnnxOptions {
  attn::Index q_num_heads = 0, kv_num_heads = 0;  ///< 0: not given (4-D inputs)
  int is_causal = 0;
  std::optional<double> scale;  ///< default 1/sqrt(d)
  double softcap = 0.0;
  std::optional<long long> qk_matmul_output_mode;  ///< 0..3: write qk_matmul_output
  std::optional<long long> softmax_precision;      ///< ONNX type code: 1, 10, 11 or 16
  /// T1, the type the operator runs on (--dtype): BF16 or F16 round the inputs to it and
  /// write the outputs in it; F32 widens them. Unset: Q's dtype when it is BF16 or F16, else
  /// F32 (a double run: F64 always).
  std::optional<attn::io::DType> input_type;
  bool widen_output = false;  ///< BF16 / F16 outputs written widened exactly to F32
};

namespace onnx {

inline constexpr long long kFloat = 1, kFloat16 = 10, kDouble = 11, kBFloat16 = 16;

/// Refuses an input the operator refuses: std::invalid_argument naming the operator.
template <class Make>
void require(bool ok, Make&& message) {
  if (!ok) throw std::invalid_argument("ONNX Attention: " + message());
}

inline std::string dims(const std::vector<attn::Index>& shape) {
  return attn::io::detail::shape_text(shape);
}

/// x rounded to nearest (ties to even) in IEEE half precision, as a double (inf past 65504).
inline double round_half(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const int e = std::max(static_cast<int>(std::floor(std::log2(std::abs(x)))), -14);
  const double ulp = std::ldexp(1.0, e - 10);
  const double r = std::nearbyint(x / ulp) * ulp;
  return std::abs(r) > 65504.0 ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

/// x rounded to bfloat16 as ONNX's definition does it: to float32 first, then to nearest
/// (ties to even) in the upper 16 bits.
inline double round_bfloat16(double x) {
  const float f = static_cast<float>(x);
  if (!std::isfinite(f)) return f;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  float r = 0;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

inline double round_to(double x, long long precision) {
  if (precision == kFloat16) return round_half(x);
  if (precision == kBFloat16) return round_bfloat16(x);
  return x;
}

/// A float attribute as the model stores it: rounded to float32.
inline double as_float32(double value) { return static_cast<double>(static_cast<float>(value)); }

}  // namespace onnx

/// Runs the ONNX Attention operator (Attention-24, which computes every valid Attention-23
/// input as Attention-23 does but a mask of width 1, padded here) on `inputs`:
/// - `Q`, `K`, `V`: 3-D (B, S, heads * head size; needs q_num_heads and kv_num_heads) or 4-D
///   (B, heads, S, head size), all of one rank, float dtypes;
/// - optional `attn_mask`: BOOL (true = attend) or Q's dtype (added to the scores), rank 1 to
///   4, broadcast to (B, Hq, S_q, T) from the right; a last axis narrower than T is padded
///   with -inf;
/// - optional `past_key` (B, Hkv, P, d) and `past_value` (B, Hkv, P, dv), together;
/// - optional `nonpad_kv_seqlen`: I64 (B,), values in [0, S_kv], not with a past.
/// Returns a writer holding `Y` ((B, S_q, Hq*dv) or (B, Hq, S_q, dv) as the inputs were),
/// `present_key` and `present_value` with a past, and `qk_matmul_output` (B, Hq, S_q, T)
/// with a qk_matmul_output_mode, as Scalar. softmax_precision FLOAT16 / BFLOAT16 rounds the
/// scores the softmax reads and its probabilities to that type, as the definition does.
///
/// The operator's type T1 (o.input_type, else Q's dtype when it is BF16 or F16): BF16 or
/// F16 inputs are read as values of that type (inputs of another float dtype rounded to it,
/// to nearest even), computed in Scalar (float) with the roundings of the definition's
/// tensors of type T1: the scores the softmax reads (softmax_precision, unset, is T1 itself),
/// the probabilities P, and the outputs. Y, present_key, present_value and
/// qk_matmul_output are written as T1 (F32, widened exactly, with o.widen_output).
/// @throws std::invalid_argument for inputs or attributes the operator refuses, naming them;
///         attn::io::FormatError for a tensor of a dtype the file cannot give.
template <class Scalar>
attn::io::SafetensorsWriter run_onnx_attention(const attn::io::SafetensorsFile& inputs,
                                               const OnnxOptions& o) {
  using attn::Index;
  using onnx::dims;
  using onnx::require;
  const auto has = [&](const char* name) { return inputs.contains(name); };
  const auto shape = [&](const char* name) { return inputs.shape(name); };
  // ---- attributes ----
  require(o.is_causal == 0 || o.is_causal == 1,
          [&] { return "is_causal " + std::to_string(o.is_causal) + " is not 0 or 1"; });
  require(!o.scale || *o.scale >= 0.0, [&] {
    return "scale " + attn::detail::number(*o.scale) +
           " is negative (the definition multiplies Q and K by its square root)";
  });
  require(
      !o.qk_matmul_output_mode || (*o.qk_matmul_output_mode >= 0 && *o.qk_matmul_output_mode <= 3),
      [&] {
        return "qk_matmul_output_mode " + std::to_string(*o.qk_matmul_output_mode) +
               " is not 0 (scaled scores), 1 (after softcap), 2 (after the mask) or 3 "
               "(after softmax)";
      });
  const long long given = o.softmax_precision.value_or(onnx::kFloat);
  require(given == onnx::kFloat || given == onnx::kFloat16 || given == onnx::kDouble ||
              given == onnx::kBFloat16,
          [&] {
            return "softmax_precision " + std::to_string(given) +
                   " is not a floating-point type: 1 (FLOAT), 10 (FLOAT16), 11 (DOUBLE) or 16 "
                   "(BFLOAT16)";
          });
  // ---- Q, K, V ----
  for (const char* name : {"Q", "K", "V"}) {
    require(has(name), [&] { return "'" + inputs.source() + "' has no tensor '" + name + "'"; });
    require(attn::io::dtype_kind(inputs.dtype(name)) == attn::io::DTypeKind::kFloat, [&] {
      return std::string(name) + " has dtype " + attn::io::dtype_name(inputs.dtype(name)) +
             ", expected a float type (F32, BF16 or F16)";
    });
  }
  const std::size_t rank = inputs.rank("Q");
  require(rank == 3 || rank == 4,
          [&] { return "Q must be 3-D or 4-D, got " + std::to_string(rank) + "-D"; });
  require(inputs.rank("K") == rank && inputs.rank("V") == rank, [&] {
    return "Q, K and V must have the same rank, got " + std::to_string(rank) + ", " +
           std::to_string(inputs.rank("K")) + ", " + std::to_string(inputs.rank("V"));
  });
  const bool three_d = rank == 3;
  // T1: the operator's element type, and its code as a softmax_precision.
  const attn::io::DType t1 = [&] {
    if (!std::is_same_v<Scalar, float>) return attn::io::DType::kF64;
    const attn::io::DType q_type = inputs.dtype("Q");
    if (o.input_type) return *o.input_type;
    return q_type == attn::io::DType::kBF16 || q_type == attn::io::DType::kF16
               ? q_type
               : attn::io::DType::kF32;
  }();
  require(t1 == attn::io::DType::kF32 || t1 == attn::io::DType::kF64 ||
              t1 == attn::io::DType::kBF16 || t1 == attn::io::DType::kF16,
          [&] { return std::string("no operator type ") + attn::io::dtype_name(t1); });
  const long long t1_code = t1 == attn::io::DType::kBF16  ? onnx::kBFloat16
                            : t1 == attn::io::DType::kF16 ? onnx::kFloat16
                            : t1 == attn::io::DType::kF64 ? onnx::kDouble
                                                          : onnx::kFloat;
  const bool narrow = t1_code == onnx::kBFloat16 || t1_code == onnx::kFloat16;
  // Unset, the softmax runs in the precision of its input: T1.
  const long long precision = o.softmax_precision.value_or(t1_code);
  // A tensor read as T1's values (held as Scalars): rounded in place when T1 is narrow (a
  // BF16 or F16 tensor of that type reads exactly, and is unchanged).
  const auto as_t1 = [&](auto tensor) {
    if (narrow) {
      for (Index i = 0; i < tensor.size(); ++i) {
        tensor.data()[i] =
            static_cast<Scalar>(onnx::round_to(static_cast<double>(tensor.data()[i]), t1_code));
      }
    }
    return tensor;
  };
  if (three_d) {
    require(o.q_num_heads > 0 && o.kv_num_heads > 0, [] {
      return std::string("3-D inputs need q_num_heads and kv_num_heads (--q-num-heads, ") +
             "--kv-num-heads)";
    });
  } else {
    require(o.q_num_heads == 0 && o.kv_num_heads == 0, [] {
      return std::string("q_num_heads and kv_num_heads are for 3-D inputs; 4-D inputs carry ") +
             "their head counts";
    });
  }
  // Q, K, V as (B, heads, S, head size) views: 3-D inputs are split by strides, not copied.
  attn::Tensor<Scalar, 3> q3, k3, v3;
  attn::Tensor<Scalar, 4> q4, k4, v4;
  attn::TensorView<const Scalar, 4> q, k, v;
  if (three_d) {
    q3 = as_t1(inputs.get<Scalar, 3>("Q"));
    k3 = as_t1(inputs.get<Scalar, 3>("K"));
    v3 = as_t1(inputs.get<Scalar, 3>("V"));
    require(k3.extent(0) == q3.extent(0) && v3.extent(0) == q3.extent(0), [&] {
      return "batch sizes differ: Q " + std::to_string(q3.extent(0)) + ", K " +
             std::to_string(k3.extent(0)) + ", V " + std::to_string(v3.extent(0));
    });
    require(k3.extent(1) == v3.extent(1), [&] {
      return "K and V sequence lengths differ: " + std::to_string(k3.extent(1)) + " vs " +
             std::to_string(v3.extent(1));
    });
    const auto split = [&](const attn::Tensor<Scalar, 3>& x, Index heads, const char* name) {
      const Index hidden = x.extent(2);
      require(hidden % heads == 0, [&] {
        return std::string(name) + ": hidden size " + std::to_string(hidden) +
               " is not a multiple of " + std::to_string(heads) + " heads";
      });
      const Index s = x.extent(1), hd = hidden / heads;
      return attn::TensorView<const Scalar, 4>(x.data(), {x.extent(0), heads, s, hd},
                                               {s * hidden, hd, hidden, 1});
    };
    q = split(q3, o.q_num_heads, "Q");
    k = split(k3, o.kv_num_heads, "K");
    v = split(v3, o.kv_num_heads, "V");
  } else {
    q4 = as_t1(inputs.get<Scalar, 4>("Q"));
    k4 = as_t1(inputs.get<Scalar, 4>("K"));
    v4 = as_t1(inputs.get<Scalar, 4>("V"));
    q = q4.view(), k = k4.view(), v = v4.view();
  }
  const Index batch = q.extent(0), hq = q.extent(1), sq = q.extent(2), d = q.extent(3);
  const Index hkv = k.extent(1), skv = k.extent(2), dv = v.extent(3);
  require(k.extent(0) == batch && v.extent(0) == batch, [&] {
    return "batch sizes differ: Q " + std::to_string(batch) + ", K " + std::to_string(k.extent(0)) +
           ", V " + std::to_string(v.extent(0));
  });
  require(k.extent(3) == d, [&] {
    return "Q and K head sizes differ: " + std::to_string(d) + " vs " + std::to_string(k.extent(3));
  });
  require(v.extent(1) == hkv, [&] {
    return "K and V head counts differ: " + std::to_string(hkv) + " vs " +
           std::to_string(v.extent(1));
  });
  require(v.extent(2) == skv, [&] {
    return "K and V sequence lengths differ: " + std::to_string(skv) + " vs " +
           std::to_string(v.extent(2));
  });
  require(hkv > 0 && hq % hkv == 0, [&] {
    return "q_num_heads " + std::to_string(hq) + " is not a multiple of kv_num_heads " +
           std::to_string(hkv) + " (query head h reads key/value head h / (Hq / Hkv))";
  });

  // ---- past_key, past_value -> present_key, present_value ----
  require(has("past_key") == has("past_value"), [&] {
    return std::string("past_key and past_value go together; '") + inputs.source() + "' has only " +
           (has("past_key") ? "past_key" : "past_value");
  });
  const bool past = has("past_key");
  Index p_len = 0;
  attn::Tensor<Scalar, 4> present_key, present_value;
  attn::TensorView<const Scalar, 4> keys = k, values = v;
  if (past) {
    for (const char* name : {"past_key", "past_value"}) {
      require(inputs.rank(name) == 4,
              [&] { return std::string(name) + " must be 4-D, got shape " + dims(shape(name)); });
    }
    p_len = shape("past_key")[2];
    const std::vector<Index> want_k{batch, hkv, p_len, d}, want_v{batch, hkv, p_len, dv};
    require(shape("past_key") == want_k, [&] {
      return "past_key has shape " + dims(shape("past_key")) +
             ", expected (B, Hkv, P, d) = " + dims(want_k);
    });
    require(shape("past_value") == want_v, [&] {
      return "past_value has shape " + dims(shape("past_value")) +
             ", expected (B, Hkv, P, dv) = " + dims(want_v);
    });
    const auto concat = [&](const char* name, attn::TensorView<const Scalar, 4> now) {
      const attn::Tensor<Scalar, 4> before = as_t1(inputs.get<Scalar, 4>(name));
      attn::Tensor<Scalar, 4> all({batch, hkv, p_len + skv, now.extent(3)});
      attn::copy(before.view(), attn::slice(all.view(), 2, 0, p_len));
      attn::copy(now, attn::slice(all.view(), 2, p_len, p_len + skv));
      return all;
    };
    present_key = concat("past_key", k);
    present_value = concat("past_value", v);
    keys = present_key.view(), values = present_value.view();
  }
  const Index total = p_len + skv;

  // ---- nonpad_kv_seqlen: each item's valid new keys ----
  std::vector<Index> nonpad;
  if (has("nonpad_kv_seqlen")) {
    require(!past, [] {
      return std::string("nonpad_kv_seqlen cannot be combined with past_key / past_value");
    });
    const std::vector<Index> want{batch};
    require(inputs.dtype("nonpad_kv_seqlen") == attn::io::DType::kI64 &&
                shape("nonpad_kv_seqlen") == want,
            [&] {
              return std::string("nonpad_kv_seqlen must be I64 of shape (B,) = ") + dims(want) +
                     ", got " + attn::io::dtype_name(inputs.dtype("nonpad_kv_seqlen")) + " " +
                     dims(shape("nonpad_kv_seqlen"));
            });
    const unsigned char* raw = inputs.raw_data("nonpad_kv_seqlen");
    for (Index b = 0; b < batch; ++b) {
      std::int64_t n = 0;
      std::memcpy(&n, raw + 8 * b, sizeof n);  // little-endian, as safetensors stores it
      nonpad.push_back(static_cast<Index>(n));
    }
    require(std::all_of(nonpad.begin(), nonpad.end(), [&](Index n) { return n >= 0 && n <= skv; }),
            [&] {
              std::string list;
              for (const Index n : nonpad) list += (list.empty() ? "" : ", ") + std::to_string(n);
              return "nonpad_kv_seqlen values [" + list + "] are not in [0, S_kv] = [0, " +
                     std::to_string(skv) + "]";
            });
  }

  // ---- the mask: attn_mask (broadcast from the right, padded past its width), the causal
  // frontier, the padding ----
  attn::AttentionMask<Scalar> mask;
  attn::Tensor<bool, 4> allowed;
  attn::Tensor<Scalar, 4> additive;
  if (has("attn_mask")) {
    const attn::io::DType dtype = inputs.dtype("attn_mask");
    require(dtype == attn::io::DType::kBool || dtype == inputs.dtype("Q"), [&] {
      return std::string("attn_mask must be BOOL or Q's type (") +
             attn::io::dtype_name(inputs.dtype("Q")) + "), got " + attn::io::dtype_name(dtype);
    });
    const std::vector<Index>& m = shape("attn_mask");
    require(!m.empty() && m.size() <= 4, [&] {
      return "attn_mask must broadcast to 4-D (B, Hq, S_q, T), got " + std::to_string(m.size()) +
             "-D";
    });
    attn::Shape<4> m4{1, 1, 1, 1};
    std::copy(m.begin(), m.end(), m4.begin() + (4 - m.size()));
    const attn::Shape<4> full{batch, hq, sq, total};
    require(m4[3] <= total, [&] {
      return "attn_mask's last axis " + std::to_string(m4[3]) +
             " is longer than the total sequence length T = " + std::to_string(total);
    });
    bool fits = true;
    for (std::size_t r = 0; r < 3; ++r) fits = fits && (m4[r] == 1 || m4[r] == full[r]);
    require(fits, [&] {
      return "attn_mask shape " + dims(m) +
             " does not broadcast to (B, Hq, S_q, T) = " + dims({batch, hq, sq, total}) +
             " (numpy rules from the right; the last axis may be "
             "narrower than T)";
    });
    if (dtype == attn::io::DType::kBool) {
      allowed = attn::Tensor<bool, 4>(m4);
      const std::vector<bool> values_read = inputs.values<bool>("attn_mask");
      std::copy(values_read.begin(), values_read.end(), allowed.data());
      mask.allowed(allowed.view());
    } else {
      additive = attn::Tensor<Scalar, 4>(m4);
      const std::vector<Scalar> values_read = inputs.values<Scalar>("attn_mask");
      std::copy(values_read.begin(), values_read.end(), additive.data());
      additive = as_t1(std::move(additive));
      mask.additive(additive.view());
    }
    if (m4[3] < total) mask.pad_keys();
  }
  if (!nonpad.empty()) mask.key_lengths(nonpad);
  if (o.is_causal == 1) {
    // ONNX's frontier: query i sees j <= i + P with a past, j <= i + nonpad_b - S_q with
    // nonpad_kv_seqlen, else j <= i (top-left, whatever S_kv is).
    if (!nonpad.empty()) {
      mask.causal(attn::CausalAlignment::kBottomRightPerItem);
    } else {
      mask.causal(p_len);
    }
  }

  // ---- the call ----
  attn::AttentionOptions options;
  if (o.scale) options.scale = onnx::as_float32(*o.scale);
  options.softcap = onnx::as_float32(o.softcap);
  attn::Tensor<Scalar, 3> y3;
  attn::Tensor<Scalar, 4> y4;
  attn::TensorView<Scalar, 4> y;
  if (three_d) {
    y3 = attn::Tensor<Scalar, 3>({batch, sq, hq * dv});
    y = attn::TensorView<Scalar, 4>(y3.data(), {batch, hq, sq, dv}, {sq * hq * dv, dv, hq * dv, 1});
  } else {
    y4 = attn::Tensor<Scalar, 4>({batch, hq, sq, dv});
    y = y4.view();
  }
  attn::Workspace ws;
  const auto run = [&](attn::WeightsStage stage, attn::TensorView<Scalar, 4> weights) {
    attn::AttentionOptions with = options;
    with.weights_stage = stage;
    if (weights.data() != nullptr) {
      attn::scaled_dot_product_attention_with_weights<Scalar>(q, keys, values, y, weights, ws, mask,
                                                              with);
    } else {
      attn::scaled_dot_product_attention<Scalar>(q, keys, values, y, ws, mask, with);
    }
  };
  static constexpr attn::WeightsStage kStages[4] = {
      attn::WeightsStage::kScaled, attn::WeightsStage::kSoftcapped, attn::WeightsStage::kMasked,
      attn::WeightsStage::kProbabilities};
  attn::Tensor<Scalar, 4> qk;
  if (o.qk_matmul_output_mode) qk = attn::Tensor<Scalar, 4>({batch, hq, sq, total});
  const bool rounded = narrow || precision == onnx::kFloat16 || precision == onnx::kBFloat16;
  if (!rounded) {
    run(o.qk_matmul_output_mode ? kStages[*o.qk_matmul_output_mode] : attn::WeightsStage::kWeights,
        qk.view());
  } else {
    // The softmax in FLOAT16 / BFLOAT16: the scores it reads (mode 2's) rounded to that type,
    // the probabilities too; then Y = P V. Fully masked rows (every score -inf) give zeros.
    // A narrow T1 rounds the scores to T1 first (the definition's scores are T1), the
    // probabilities to T1 last (cast back to T1 before they multiply V), and Y.
    attn::Tensor<Scalar, 4> x({batch, hq, sq, total});
    run(attn::WeightsStage::kMasked, x.view());
    attn::Tensor<Scalar, 4> probs({batch, hq, sq, total});
    std::vector<double> e(static_cast<std::size_t>(total));
    for (Index b = 0; b < batch; ++b) {
      for (Index h = 0; h < hq; ++h) {
        const Index kvh = h / (hq / hkv);
        for (Index i = 0; i < sq; ++i) {
          double top = -std::numeric_limits<double>::infinity();
          for (Index j = 0; j < total; ++j) {
            e[j] = onnx::round_to(onnx::round_to(static_cast<double>(x(b, h, i, j)), t1_code),
                                  precision);
            top = std::max(top, e[j]);
          }
          double sum = 0;
          for (Index j = 0; j < total; ++j) {
            e[j] = top == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(e[j] - top);
            sum += e[j];
          }
          for (Index j = 0; j < total; ++j) {
            probs(b, h, i, j) = static_cast<Scalar>(
                sum > 0 ? onnx::round_to(onnx::round_to(e[j] / sum, precision), t1_code) : 0.0);
          }
          for (Index c = 0; c < dv; ++c) {
            double acc = 0;
            for (Index j = 0; j < total; ++j) {
              acc += static_cast<double>(probs(b, h, i, j)) *
                     static_cast<double>(values(b, kvh, j, c));
            }
            y(b, h, i, c) = static_cast<Scalar>(onnx::round_to(acc, t1_code));
          }
        }
      }
    }
    if (o.qk_matmul_output_mode) {
      const long long mode = *o.qk_matmul_output_mode;
      if (mode == 2) {
        qk = x;
      } else if (mode == 3) {
        qk = probs;
      } else {
        attn::Tensor<Scalar, 4> unused_y = attn::Tensor<Scalar, 4>(y.shape());
        attn::AttentionOptions with = options;
        with.weights_stage = kStages[mode];
        attn::scaled_dot_product_attention_with_weights<Scalar>(q, keys, values, unused_y.view(),
                                                                qk.view(), ws, mask, with);
      }
    }
  }

  // ---- outputs ----
  // As T1: rounded to it (Y and the probabilities already are), written in it (or widened).
  attn::io::SafetensorsWriter out;
  out.set_metadata("producer", "attn_run --format onnx");
  const auto put = [&](const char* name, const auto& tensor) {
    const auto values = as_t1(tensor);
    if (narrow && !o.widen_output && t1 == attn::io::DType::kBF16) {
      out.add(name, attn::convert<attn::bfloat16>(values));
    } else if (narrow && !o.widen_output) {
      out.add(name, attn::convert<attn::float16>(values));
    } else {
      out.add(name, values);
    }
  };
  if (three_d) {
    put("Y", y3);
  } else {
    put("Y", y4);
  }
  if (past) {
    put("present_key", present_key);
    put("present_value", present_value);
  }
  if (o.qk_matmul_output_mode) put("qk_matmul_output", qk);
  return out;
}

}  // namespace attn_run
