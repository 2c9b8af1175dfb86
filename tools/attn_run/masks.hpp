// SPDX-License-Identifier: MIT
// tools/attn_run/masks.hpp: attn_run's `attn_mask` and `key_padding_mask` inputs, read with
// nn.MultiheadAttention's dtype rules (PyTorch 1.13) into an attn::AttentionMask.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "attn/detail/checked.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/mask.hpp"
#include "attn/tensor/tensor.hpp"

namespace attn_run {

/// The mask tensors of one run (the AttentionMask holds views of them) and the extents they
/// are checked against: batch B (1 when unbatched), heads H, T_q, T_k.
template <class Scalar>
class Masks {
 public:
  Masks(attn::Index batch, attn::Index heads, attn::Index tq, attn::Index tk, bool batched)
      : batch_(batch), heads_(heads), tq_(tq), tk_(tk), batched_(batched) {}

  /// Reads `attn_mask` and `key_padding_mask` from `inputs` (each optional) into `mask`:
  /// - BOOL, and U8 (nonzero = true) as PyTorch converts it: true = blocked;
  /// - F16, BF16, F32, F64: added to the scaled scores (attn_mask), or to the scores of
  ///   every query for that key (key_padding_mask, only without an attn_mask: next to one,
  ///   PyTorch 1.13 ignores a float padding mask (float attn_mask) or reads it as boolean
  ///   (bool attn_mask), against its documentation);
  /// - any other dtype is an error, as in PyTorch (I64 and I32 masks included).
  /// attn_mask is (T_q, T_k) or (B * H, T_q, T_k) ((H, T_q, T_k) unbatched);
  /// key_padding_mask is (B, T_k) ((T_k) unbatched).
  /// @throws attn::io::FormatError naming the file, the mask, its dtype and shape.
  void read(const attn::io::SafetensorsFile& inputs, attn::AttentionMask<Scalar>& mask) {
    const bool has_attn_mask = inputs.contains("attn_mask");
    if (has_attn_mask) read_attn_mask(inputs, mask);
    if (inputs.contains("key_padding_mask")) read_key_padding(inputs, mask, has_attn_mask);
  }

 private:
  using Index = attn::Index;

  static bool is_boolean(attn::io::DType d) {
    return d == attn::io::DType::kBool || d == attn::io::DType::kU8;
  }
  static bool is_float(attn::io::DType d) {
    return attn::io::dtype_kind(d) == attn::io::DTypeKind::kFloat;
  }
  [[noreturn]] static void fail(const attn::io::SafetensorsFile& inputs, const std::string& text) {
    throw attn::io::FormatError("attn::io::run_multi_head_attention: '" + inputs.source() +
                                "': " + text);
  }
  static std::string dims(const std::vector<Index>& shape) {
    return attn::io::detail::shape_text(shape);
  }
  static void require_dtype(const attn::io::SafetensorsFile& inputs, const std::string& name) {
    const attn::io::DType d = inputs.dtype(name);
    if (!is_boolean(d) && !is_float(d)) {
      fail(inputs, name + " has dtype " + attn::io::dtype_name(d) +
                       "; expected BOOL or U8 (true or nonzero = blocked) or F16, BF16, F32, "
                       "F64 (added to the scores), as PyTorch 1.13 accepts");
    }
  }

  void read_attn_mask(const attn::io::SafetensorsFile& inputs, attn::AttentionMask<Scalar>& mask) {
    require_dtype(inputs, "attn_mask");
    const std::vector<Index>& s = inputs.shape("attn_mask");
    Index stacked = 0;  // B * H, or H unbatched
    const bool fits = attn::detail::checked_mul(batched_ ? batch_ : Index(1), heads_, stacked);
    attn::Shape<4> shape4{};
    if (s.size() == 2) {
      shape4 = {1, 1, s[0], s[1]};
    } else if (s.size() == 3 && fits && s[0] == stacked) {
      shape4 = {batch_, heads_, s[1], s[2]};
    } else {
      fail(inputs, "attn_mask has shape " + dims(s) +
                       ", expected (T_q, T_k) = " + dims({tq_, tk_}) + " or " +
                       (batched_ ? "(B * num_heads, T_q, T_k) = " : "(num_heads, T_q, T_k) = ") +
                       (fits ? dims({stacked, tq_, tk_}) : std::string("(too large)")));
    }
    if (is_boolean(inputs.dtype("attn_mask"))) {
      blocked_ = attn::Tensor<bool, 4>(shape4);
      copy_values(inputs.values<bool>("attn_mask"), blocked_.data());
      mask.blocked(blocked_);
    } else {
      additive_ = attn::Tensor<Scalar, 4>(shape4);
      copy_values(inputs.values<Scalar>("attn_mask"), additive_.data());
      mask.additive(additive_);
    }
  }

  void read_key_padding(const attn::io::SafetensorsFile& inputs, attn::AttentionMask<Scalar>& mask,
                        bool has_attn_mask) {
    require_dtype(inputs, "key_padding_mask");
    const std::vector<Index>& s = inputs.shape("key_padding_mask");
    const std::vector<Index> expected =
        batched_ ? std::vector<Index>{batch_, tk_} : std::vector<Index>{tk_};
    if (s != expected) {
      fail(inputs, std::string("key_padding_mask has shape ") + dims(s) + ", expected " +
                       (batched_ ? "(B, T_k) = " : "(T_k) = ") + dims(expected));
    }
    if (is_boolean(inputs.dtype("key_padding_mask"))) {
      padding_ = attn::Tensor<bool, 2>({batch_, tk_});
      copy_values(inputs.values<bool>("key_padding_mask"), padding_.data());
      mask.key_padding(padding_);
      return;
    }
    if (has_attn_mask) {
      fail(inputs, std::string("key_padding_mask is ") +
                       attn::io::dtype_name(inputs.dtype("key_padding_mask")) +
                       " (added to the scores) and an attn_mask is given too: PyTorch 1.13 "
                       "ignores a float key_padding_mask next to a float attn_mask and reads "
                       "it as boolean next to a boolean one; give a BOOL key_padding_mask, or "
                       "add the padding to a float attn_mask of shape (B * num_heads, T_q, T_k)");
    }
    // Float padding: one additive row per batch item, seen by every query through a zero
    // stride ((B, 1, T_q, T_k) over (B, T_k) values: no T_q x T_k copy).
    const std::vector<Scalar> row = inputs.values<Scalar>("key_padding_mask");
    padding_rows_ = attn::Tensor<Scalar, 2>({batch_, tk_});
    std::copy(row.begin(), row.end(), padding_rows_.data());
    mask.additive(attn::TensorView<const Scalar, 4>(padding_rows_.data(), {batch_, 1, tq_, tk_},
                                                    {tk_, 0, 0, 1}));
  }

  template <class Values, class Out>
  static void copy_values(const Values& values, Out* out) {
    std::copy(values.begin(), values.end(), out);
  }

  Index batch_, heads_, tq_, tk_;
  bool batched_;
  attn::Tensor<bool, 4> blocked_;
  attn::Tensor<Scalar, 4> additive_;
  attn::Tensor<Scalar, 2> padding_rows_;
  attn::Tensor<bool, 2> padding_;
};

}  // namespace attn_run
