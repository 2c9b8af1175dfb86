// SPDX-License-Identifier: MIT
// attn/nn/dropout.hpp: inverted dropout with train()/eval() and a counter-based generator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/nn/random.hpp"
#include "attn/tensor/overlap.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// The default dropout seed (any fixed value; call seed() to choose another).
inline constexpr std::uint64_t kDefaultDropoutSeed = 0x2545f4914f6cdd1dULL;

namespace detail {

/// Checks p in [0, 1) and names the caller and the value otherwise.
inline void check_dropout(double p, const char* where) {
  require_config(p >= 0.0 && p < 1.0, where,
                 [&] { return "dropout=" + number(p) + " must be in [0, 1)"; });
}

/// Calls fn(row_key, offset_a, offset_b) for every row (last axis) of a view of `shape`, in
/// row-major order, with the dropout stream's key of that row (rows numbered 0, 1, ... over
/// the leading axes): the one walk behind Dropout's forward and backward, so that both see
/// the same keep decisions whatever the strides.
template <std::size_t Rank, class Fn>
void for_each_dropout_row(const DropoutStream& stream, const Shape<Rank>& shape,
                          const Shape<Rank>& strides_a, const Shape<Rank>& strides_b, Fn&& fn) {
  Shape<Rank> rows_shape = shape;
  rows_shape[Rank - 1] = 1;
  Index row = 0;
  for_each_offset(rows_shape, strides_a, strides_b,
                  [&](Index a, Index b) { fn(stream.row_key(row++), a, b); });
}

}  // namespace detail

/// What Dropout::backward() needs from one forward_() call: the probability, the seed and
/// the call number that keyed its keep decisions, and the input's size and row length
/// (checked). Inactive (eval mode, p = 0): the forward was the identity.
struct DropoutRecord {
  double p = 0.0;
  std::uint64_t seed = 0, call = 0;
  bool active = false;
  Index size = 0, columns = 0;
};

/// Inverted dropout (torch.nn.Dropout): in training mode each element is zeroed with
/// probability p and the survivors are scaled by 1/(1-p); in eval mode it is the
/// identity. Modules start in training mode, like PyTorch's.
///
/// The keep decisions come from a counter-based hash of (seed, call number, position),
/// not from a sequential generator, so a given seed and call sequence give the same
/// masks whatever the thread count or kernel path. The masks cannot match PyTorch's RNG.
/// forward() is const and thread-safe: the call counter is atomic.
///
/// @tparam Scalar float or double.
template <class Scalar = float>
class Dropout {
  static_assert(std::is_floating_point_v<Scalar>, "attn::Dropout: Scalar must be float or double");

 public:
  /// @throws ConfigError if p is outside [0, 1).
  explicit Dropout(double p = 0.5, std::uint64_t seed = kDefaultDropoutSeed) : p_(p), seed_(seed) {
    detail::check_dropout(p, "Dropout");
  }
  Dropout(const Dropout& other)
      : p_(other.p_), seed_(other.seed_), calls_(other.calls_.load()), training_(other.training_) {}
  Dropout& operator=(const Dropout& other) {
    p_ = other.p_;
    seed_ = other.seed_;
    calls_.store(other.calls_.load());
    training_ = other.training_;
    return *this;
  }

  double p() const noexcept { return p_; }
  void train(bool on = true) noexcept { training_ = on; }
  void eval() noexcept { train(false); }
  bool is_training() const noexcept { return training_; }
  /// True when forward() changes its input (training mode and p > 0).
  bool active() const noexcept { return training_ && p_ > 0.0; }

  /// Restarts the stream: the same seed gives the same sequence of masks.
  void seed(std::uint64_t value) noexcept {
    seed_ = value;
    calls_.store(0);
  }
  std::uint64_t seed_value() const noexcept { return seed_; }

  /// Claims the next call number (what attention kernels key their masks with).
  std::uint64_t next_call() const noexcept { return calls_.fetch_add(1); }

  /// Applies dropout in place; the identity in eval mode or when p = 0. Returns what
  /// backward() needs (the call number it claimed).
  template <std::size_t Rank>
  DropoutRecord forward_(TensorView<Scalar, Rank> x) const {
    detail::require_distinct_elements("Dropout::forward_", "x", x);  // written in place
    DropoutRecord record;
    record.size = x.size();
    record.columns = x.extent(Rank - 1);
    if (!active() || x.empty()) return record;
    record.active = true;
    record.p = p_;
    record.seed = seed_;
    record.call = next_call();
    const auto stream = detail::make_dropout_stream(p_, seed_, record.call, 0, 0);
    const Scalar scale = Scalar(1) / static_cast<Scalar>(1.0 - p_);
    Scalar* data = x.data();
    const Index n = x.extent(Rank - 1), stride = x.stride(Rank - 1);
    detail::for_each_dropout_row(
        stream, x.shape(), x.strides(), x.strides(), [&](std::uint64_t key, Index o, Index) {
          for (Index j = 0; j < n; ++j) {
            Scalar& value = data[o + j * stride];
            value =
                detail::DropoutStream::keep(key, j, stream.threshold) ? value * scale : Scalar(0);
          }
        });
    return record;
  }

  /// The backward of the forward_() call that returned `record`: adds grad_y scaled by
  /// 1/(1-p) where that call kept the element and nothing where it dropped it (the identity
  /// when it was inactive) into grad_x, with the same keep decisions, redrawn from the
  /// record's seed and call number (this layer's later calls, seed() or train()/eval() do not
  /// matter). Zero grad_x first for the gradient alone.
  ///
  /// Shapes: grad_y and grad_x have the forward's input shape; any strides.
  /// @throws ShapeError if they differ from each other or from the recorded size.
  template <std::size_t Rank>
  void backward(const DropoutRecord& record, TensorView<const Scalar, Rank> grad_y,
                TensorView<Scalar, Rank> grad_x) const {
    detail::require(grad_y.shape() == grad_x.shape() && grad_y.size() == record.size &&
                        (grad_y.empty() || grad_y.extent(Rank - 1) == record.columns),
                    "Dropout::backward", [&] {
                      return "grad_y " + detail::to_string(grad_y.shape()) + " and grad_x " +
                             detail::to_string(grad_x.shape()) + " must have the forward's " +
                             "shape (" + std::to_string(record.size) + " elements, rows of " +
                             std::to_string(record.columns) + ")";
                    });
    if (grad_y.empty()) return;
    const auto stream =
        detail::make_dropout_stream(record.active ? record.p : 0.0, record.seed, record.call, 0, 0);
    const Scalar scale =
        record.active ? Scalar(1) / static_cast<Scalar>(1.0 - record.p) : Scalar(1);
    const Scalar* dy = grad_y.data();
    Scalar* dx = grad_x.data();
    const Index n = grad_y.extent(Rank - 1), sy = grad_y.stride(Rank - 1),
                sx = grad_x.stride(Rank - 1);
    detail::for_each_dropout_row(
        stream, grad_y.shape(), grad_y.strides(), grad_x.strides(),
        [&](std::uint64_t key, Index a, Index b) {
          for (Index j = 0; j < n; ++j) {
            if (!stream.active || detail::DropoutStream::keep(key, j, stream.threshold)) {
              dx[b + j * sx] += dy[a + j * sy] * scale;
            }
          }
        });
  }

  /// Returns a copy with dropout applied.
  template <class XScalar, std::size_t Rank>
  Tensor<Scalar, Rank> forward(TensorView<XScalar, Rank> x) const {
    static_assert(std::is_same_v<std::remove_const_t<XScalar>, Scalar>,
                  "attn::Dropout::forward: x must hold the layer's Scalar");
    Tensor<Scalar, Rank> result(x);
    forward_(result.view());
    return result;
  }
  template <std::size_t Rank>
  Tensor<Scalar, Rank> forward(const Tensor<Scalar, Rank>& x) const {
    return forward(x.view());
  }

 private:
  double p_;
  std::uint64_t seed_;
  mutable std::atomic<std::uint64_t> calls_{0};
  bool training_ = true;
};

ATTN_NAMESPACE_END
