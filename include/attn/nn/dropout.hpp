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

}  // namespace detail

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
  static_assert(std::is_floating_point_v<Scalar>,
                "attn::Dropout: Scalar must be float or double");

 public:
  /// @throws ConfigError if p is outside [0, 1).
  explicit Dropout(double p = 0.5, std::uint64_t seed = kDefaultDropoutSeed)
      : p_(p), seed_(seed) {
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

  /// Applies dropout in place; the identity in eval mode or when p = 0.
  template <std::size_t Rank>
  void forward_(TensorView<Scalar, Rank> x) const {
    if (!active() || x.empty()) return;
    const auto stream = detail::make_dropout_stream(p_, seed_, next_call(), 0, 0);
    const Scalar scale = Scalar(1) / static_cast<Scalar>(1.0 - p_);
    Shape<Rank> rows_shape = x.shape();
    rows_shape[Rank - 1] = 1;
    Scalar* data = x.data();
    Index row = 0;
    const Index n = x.extent(Rank - 1), stride = x.stride(Rank - 1);
    detail::for_each_offset(rows_shape, x.strides(), x.strides(), [&](Index o, Index) {
      const std::uint64_t key = stream.row_key(row++);
      for (Index j = 0; j < n; ++j) {
        Scalar& value = data[o + j * stride];
        value = detail::DropoutStream::keep(key, j, stream.threshold) ? value * scale : Scalar(0);
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
