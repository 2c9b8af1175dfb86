// SPDX-License-Identifier: MIT
// attn/nn/rope.hpp: RotaryEmbedding, rotary position embeddings (RoPE; Su et al., "RoFormer",
// 2021) in both pair conventions, with partial rotary and cos/sin tables computed once.
// Glossary: B = batch, H = heads, T = tokens, hd = head dim, R = rotary dim (<= hd).
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN

/// Which features of a head a rotation pairs up (both rotate pair i by angle p * f_i).
enum class RopeStyle {
  /// (x[i], x[i + R/2]): Hugging Face's `rotate_half` (Llama, Mistral, Qwen2, GPT-NeoX, Phi).
  kHalfSplit,
  /// (x[2i], x[2i + 1]): GPT-J's `rotate_every_two` and Meta's original Llama code
  /// (`view_as_complex` on consecutive pairs).
  kInterleaved,
};

/// Configuration of a RotaryEmbedding.
struct RotaryOptions {
  Index head_dim = 0;      ///< features per head
  Index rotary_dim = 0;    ///< features that rotate (the first R); 0 means head_dim
  double theta = 10000.0;  ///< the base of the frequencies (Llama 3: 500000)
  RopeStyle style = RopeStyle::kHalfSplit;
  Index max_positions = 4096;  ///< the tables cover positions [0, max_positions)
};

/// Rotary position embeddings: the pair (a, b) of features of a token at absolute position p
/// becomes (a cos(p f_i) - b sin(p f_i), b cos(p f_i) + a sin(p f_i)) with the frequencies
/// f_i = theta^(-2i / R), i < R/2; features R..hd-1 pass through unchanged (partial rotary,
/// as GPT-NeoX and Phi; GPT-J's rotary_dim).
///
/// The cos/sin tables are computed once, in the constructor, for positions [0,
/// max_positions). A position outside them is a ConfigError naming it, never a silent
/// regrowth: apply() is const, so several threads may rotate with one table, and a decode
/// step never allocates. reserve_positions() grows the tables explicitly.
///
/// Table arithmetic. Hugging Face (LlamaRotaryEmbedding, GPTNeoX, GPT-J) and Meta's Llama
/// compute in float32 whatever the model's dtype: the exponent 2i / R as a float32 division,
/// inv_freq = 1 / theta ** exponent in float32, the angle p * inv_freq as one float32
/// product (einsum/outer/matmul with one term), then cos and sin of that float32 angle. The
/// float32 angle is what those models were trained with, and it is up to 2.4e-4 rad away
/// from the exact angle at p = 5000 (half an ulp of 5000), so computing it exactly would
/// move attn's output away from theirs by that much. For Scalar = float attn therefore
/// follows the same steps, each rounded to float32 as theirs is: the exponent, theta^exponent
/// (correctly rounded: computed in double, then rounded), 1 / that, the product p * inv_freq,
/// and cos/sin of that float32 angle (computed in double, then rounded). PyTorch's float32
/// pow (Sleef, 1 ulp) differs from the correctly rounded power in 1.4 % of the entries (692
/// of 49536 over theta in {1e4, 5e5, 1e6, 3.3e4, 2.5e4} and every even R up to 256, torch
/// 1.13 AVX2); where it does, inv_freq differs by one ulp, so the angle p * inv_freq moves by
/// up to 2^-24 of itself. No fixed rule reproduces Sleef's rounding on every build, so attn
/// takes the correctly rounded value. For Scalar = double
/// every step is in double (the exact definition, to double rounding): Hugging Face's
/// float32 tables cast to float64 would throw away the precision a double model is for.
///
/// @tparam Scalar float or double.
template <class Scalar = float>
class RotaryEmbedding {
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::RotaryEmbedding: Scalar must be float or double");
  // The elements apply() rotates: Scalar, or a storage type whose compute type is Scalar.
  template <class Element>
  static constexpr bool kRotates = std::is_same_v<Element, Scalar> ||
                                   (is_storage_type_v<Element> &&
                                    std::is_same_v<compute_type_t<Element>, Scalar>);

 public:
  /// An empty embedding (head_dim 0); assign a real one before use.
  RotaryEmbedding() = default;

  /// @throws ConfigError naming the values: head_dim not positive, rotary_dim negative, odd
  ///         or above head_dim, theta not finite and positive as a double and as Scalar (1e-50
  ///         is 0 as a float, 1e39 infinite), tables that would not be finite in Scalar (an
  ///         inverse frequency, or the angle of the last position, overflowing), or
  ///         max_positions negative.
  explicit RotaryEmbedding(const RotaryOptions& options) : options_(checked(options)) {
    if (options_.rotary_dim == 0) options_.rotary_dim = options_.head_dim;
    half_ = options_.rotary_dim / 2;
    inv_freq_ = Tensor<Scalar, 1>({half_});
    for (Index i = 0; i < half_; ++i) {
      inv_freq_(i) = inverse_frequency(i);
      detail::require_config(
          std::isfinite(inv_freq_(i)) && inv_freq_(i) > 0, "RotaryEmbedding", [&] {
            return describe() + ": the inverse frequency theta^(-" + std::to_string(2 * i) + "/" +
                   std::to_string(options_.rotary_dim) + ") is " +
                   detail::number(static_cast<double>(inv_freq_(i))) + " in " + scalar_name() +
                   ", not finite and positive";
          });
    }
    const Index positions = options_.max_positions;
    options_.max_positions = 0;
    reserve_positions(positions);
  }

  /// RotaryEmbedding({head_dim, rotary_dim, theta, style, max_positions}).
  RotaryEmbedding(Index head_dim, Index max_positions, double theta = 10000.0,
                  RopeStyle style = RopeStyle::kHalfSplit, Index rotary_dim = 0)
      : RotaryEmbedding(RotaryOptions{head_dim, rotary_dim, theta, style, max_positions}) {}

  Index head_dim() const noexcept { return options_.head_dim; }
  Index rotary_dim() const noexcept { return options_.rotary_dim; }
  double theta() const noexcept { return options_.theta; }
  RopeStyle style() const noexcept { return options_.style; }
  Index max_positions() const noexcept { return options_.max_positions; }
  /// f_i = theta^(-2i / R), (R/2), in the table arithmetic described above.
  TensorView<const Scalar, 1> inverse_frequencies() const noexcept { return inv_freq_.view(); }
  /// cos(p f_i) and sin(p f_i) of position p, R/2 values each (for a fused epilogue).
  /// @throws ConfigError naming the position if it is outside [0, max_positions).
  const Scalar* cos_row(Index position) const {
    check_position(position);
    return cos_.data() + position * half_;
  }
  const Scalar* sin_row(Index position) const {
    check_position(position);
    return sin_.data() + position * half_;
  }

  /// Extends the tables to positions [0, max_positions) (never shrinks them). Not safe while
  /// another thread calls apply().
  /// @throws ConfigError (the tables unchanged) if max_positions is negative, or the angle
  ///         of position max_positions - 1 is not finite in Scalar (a tiny theta: the angles
  ///         p theta^(-2i/R) grow with p).
  void reserve_positions(Index max_positions) {
    detail::require_config(max_positions >= 0, "RotaryEmbedding::reserve_positions", [&] {
      return "max_positions=" + std::to_string(max_positions) + " must be non-negative";
    });
    if (max_positions <= options_.max_positions) return;
    // The angles grow with the position: the last one bounds them all.
    for (Index i = 0; i < half_; ++i) {
      detail::require_config(std::isfinite(angle_of(max_positions - 1, i)), "RotaryEmbedding", [&] {
        return describe() + " and max_positions=" + std::to_string(max_positions) +
               ": the angle of position " + std::to_string(max_positions - 1) + " overflows in " +
               scalar_name() +
               " (theta too small for that many positions); lower max_positions or raise theta";
      });
    }
    Tensor<Scalar, 2> cos({max_positions, half_}), sin({max_positions, half_});
    for (Index p = 0; p < max_positions; ++p) {
      for (Index i = 0; i < half_; ++i) {
        const double angle = angle_of(p, i);
        cos(p, i) = static_cast<Scalar>(std::cos(angle));
        sin(p, i) = static_cast<Scalar>(std::sin(angle));
      }
    }
    cos_ = std::move(cos);
    sin_ = std::move(sin);
    options_.max_positions = max_positions;
  }

  // ---- the low-level form: rows in memory (what the projection calls per head block) ----
  // Element is Scalar, or a storage type computed in Scalar (a bfloat16 module's heads, with
  // RotaryEmbedding<float>): then each pair is widened exactly, rotated in Scalar with the
  // same products, and rounded once to the storage type (nearest even).

  /// Rotates `rows` vectors of head_dim features in place, row r at data + r * row_stride
  /// (in elements), token r at position first_position + r. Allocation-free.
  /// @throws ConfigError naming the positions if they leave [0, max_positions).
  template <class Element, class = std::enable_if_t<kRotates<Element>>>
  void apply(Element* data, Index rows, Index row_stride, Index first_position) const {
    check_range(first_position, rows);
    for (Index r = 0; r < rows; ++r) rotate(data + r * row_stride, first_position + r);
  }
  /// The same with one position per row (positions[r] for row r).
  template <class Element, class = std::enable_if_t<kRotates<Element>>>
  void apply(Element* data, Index rows, Index row_stride, const Index* positions) const {
    for (Index r = 0; r < rows; ++r) {
      check_position(positions[r]);
      rotate(data + r * row_stride, positions[r]);
    }
  }

  // ---- views (B, H, T, hd); any strides but a unit last one; Element as above ----

  /// Token t of every batch item at position first_position + t. A (B, T, H, hd) tensor is
  /// permute(x, {0, 2, 1, 3}) away (a stride change).
  /// @throws ShapeError on a shape mismatch; ConfigError for positions outside the tables.
  template <class Element, class = std::enable_if_t<kRotates<Element>>>
  void apply(TensorView<Element, 4> x, Index first_position = 0) const {
    check_view(x, "RotaryEmbedding::apply");
    for_each_head(
        x, [&](Element* head, Index) { apply(head, x.extent(2), x.stride(2), first_position); });
  }
  /// The transposed rotation R(p)^T = R(-p) at positions first_position + t: the backward of
  /// apply(x, first_position), dL/dx = R^T dL/dy (a training step's dQ and dK).
  void apply_transposed(TensorView<Scalar, 4> x, Index first_position = 0) const {
    check_view(x, "RotaryEmbedding::apply_transposed");
    check_range(first_position, x.extent(2));
    for_each_head(x, [&](Scalar* head, Index) {
      for (Index t = 0; t < x.extent(2); ++t) {
        rotate<true>(head + t * x.stride(2), first_position + t);
      }
    });
  }
  /// Token t of item b at position first_positions(b) + t (ragged caches), (B).
  void apply(TensorView<Scalar, 4> x, TensorView<const Index, 1> first_positions) const {
    check_view(x, "RotaryEmbedding::apply");
    detail::require(first_positions.extent(0) == x.extent(0), "RotaryEmbedding::apply", [&] {
      return "first_positions has shape " + detail::to_string(first_positions.shape()) +
             ", expected (B) = (" + std::to_string(x.extent(0)) + ") for x " +
             detail::to_string(x.shape());
    });
    for_each_head(x, [&](Scalar* head, Index b) {
      apply(head, x.extent(2), x.stride(2), first_positions(b));
    });
  }
  /// Token t of item b at position positions(b, t) (Hugging Face's position_ids), (B, T).
  void apply(TensorView<Scalar, 4> x, TensorView<const Index, 2> positions) const {
    check_view(x, "RotaryEmbedding::apply");
    const Shape<2> expected{x.extent(0), x.extent(2)};
    detail::require(positions.shape() == expected, "RotaryEmbedding::apply", [&] {
      return "positions has shape " + detail::to_string(positions.shape()) +
             ", expected (B, T) = " + detail::to_string(expected) + " for x " +
             detail::to_string(x.shape());
    });
    for_each_head(x, [&](Scalar* head, Index b) {
      for (Index t = 0; t < x.extent(2); ++t) {
        check_position(positions(b, t));
        rotate(head + t * x.stride(2), positions(b, t));
      }
    });
  }

 private:
  static RotaryOptions checked(const RotaryOptions& o) {
    const char* where = "RotaryEmbedding";
    const auto values = [&] {
      return "head_dim=" + std::to_string(o.head_dim) +
             ", rotary_dim=" + std::to_string(o.rotary_dim) + ", theta=" + detail::number(o.theta) +
             ", max_positions=" + std::to_string(o.max_positions);
    };
    detail::require_config(o.head_dim > 0, where,
                           [&] { return values() + ": head_dim must be positive"; });
    const Index rotary = o.rotary_dim == 0 ? o.head_dim : o.rotary_dim;
    detail::require_config(rotary > 0 && rotary <= o.head_dim && rotary % 2 == 0, where, [&] {
      return values() + ": rotary_dim (0 = head_dim) must be even and in (0, head_dim]";
    });
    // As a double and as Scalar: the float tables start from static_cast<float>(theta).
    const auto theta = static_cast<Scalar>(o.theta);
    detail::require_config(
        std::isfinite(o.theta) && o.theta > 0.0 && std::isfinite(theta) && theta > 0, where, [&] {
          return values() + ": theta must be finite and positive, in double and in " +
                 scalar_name() + " (where it is " + detail::number(static_cast<double>(theta)) +
                 ")";
        });
    detail::require_config(o.max_positions >= 0, where,
                           [&] { return values() + ": max_positions must be non-negative"; });
    return o;
  }

  static const char* scalar_name() noexcept {
    return std::is_same_v<Scalar, float> ? "float" : "double";
  }
  std::string describe() const {
    return "theta=" + detail::number(options_.theta) +
           ", rotary_dim=" + std::to_string(options_.rotary_dim);
  }

  // f_i in the table arithmetic (see the class comment).
  Scalar inverse_frequency(Index i) const {
    const Index r = options_.rotary_dim;
    if constexpr (std::is_same_v<Scalar, float>) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(r);
      const double base = static_cast<float>(options_.theta);
      const float power = static_cast<float>(std::pow(base, static_cast<double>(exponent)));
      return 1.0f / power;
    } else {
      const double exponent = static_cast<double>(2 * i) / static_cast<double>(r);
      return 1.0 / std::pow(options_.theta, exponent);
    }
  }
  // p f_i rounded as Scalar (float: one float32 product, as Hugging Face's), in double.
  double angle_of(Index p, Index i) const {
    return static_cast<double>(static_cast<Scalar>(p) * inv_freq_(i));
  }

  void check_range(Index first_position, Index rows) const {
    detail::require_config(
        rows >= 0 && first_position >= 0 && first_position <= options_.max_positions - rows,
        "RotaryEmbedding::apply", [&] {
          return "positions [" + std::to_string(first_position) + ", " +
                 std::to_string(first_position + rows) + ") leave the table [0, " +
                 std::to_string(options_.max_positions) +
                 ") (build with a larger max_positions or call reserve_positions())";
        });
  }
  void check_position(Index position) const {
    detail::require_config(
        position >= 0 && position < options_.max_positions, "RotaryEmbedding::apply", [&] {
          return "position " + std::to_string(position) + " is outside the table [0, " +
                 std::to_string(options_.max_positions) +
                 ") (build with a larger max_positions or call "
                 "reserve_positions())";
        });
  }

  template <class Element>
  void check_view(const TensorView<Element, 4>& x, const char* where) const {
    detail::require(
        x.extent(3) == options_.head_dim && (x.stride(3) == 1 || x.empty()), where, [&] {
          return "x has shape " + detail::to_string(x.shape()) + " and strides " +
                 detail::to_string(x.strides()) + ", expected (B, H, T, " +
                 std::to_string(options_.head_dim) +
                 ") with a unit last stride (head_dim=" + std::to_string(options_.head_dim) + ")";
        });
  }

  template <class Element, class Fn>
  static void for_each_head(const TensorView<Element, 4>& x, Fn&& fn) {
    if (x.empty()) return;
    for (Index b = 0; b < x.extent(0); ++b) {
      for (Index h = 0; h < x.extent(1); ++h) fn(x.data() + b * x.stride(0) + h * x.stride(1), b);
    }
  }

  // One token's features at `position` (checked by the caller); Transposed: by R^T, the
  // angle negated (sin's sign flips, the same products otherwise). Element: Scalar, or a
  // storage type widened to Scalar and rounded back once per feature.
  template <bool Transposed = false, class Element = Scalar>
  void rotate(Element* x, Index position) const noexcept {
    const Scalar* c = cos_.data() + position * half_;
    const Scalar* s = sin_.data() + position * half_;
    const Index half = half_;
    // Element i of the pair (a, b) and its partner's step: contiguous halves or neighbours.
    Element* first = x;
    Element* second = options_.style == RopeStyle::kHalfSplit ? x + half : x + 1;
    const Index step = options_.style == RopeStyle::kHalfSplit ? 1 : 2;
    for (Index i = 0; i < half; ++i) {
      const Scalar a = static_cast<Scalar>(first[i * step]);
      const Scalar b = static_cast<Scalar>(second[i * step]);
      if constexpr (Transposed) {  // R^T: the angle negated
        first[i * step] = Element(a * c[i] + b * s[i]);
        second[i * step] = Element(b * c[i] - a * s[i]);
      } else {
        first[i * step] = Element(a * c[i] - b * s[i]);
        second[i * step] = Element(b * c[i] + a * s[i]);
      }
    }
  }

  RotaryOptions options_{};
  Index half_ = 0;
  Tensor<Scalar, 1> inv_freq_;
  Tensor<Scalar, 2> cos_, sin_;  // (max_positions, R/2)
};

ATTN_NAMESPACE_END
