// SPDX-License-Identifier: MIT
// attn/nn/random.hpp: a PyTorch-compatible CPU generator (manual_seed, rand, Linear init)
// (the counter-based hash behind dropout is attn/detail/dropout_hash.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"

ATTN_NAMESPACE_BEGIN

/// The random stream of PyTorch's CPU generator, bit for bit: a 32-bit Mersenne Twister
/// seeded like `torch.manual_seed(seed)`, with `uniform` drawing exactly as
/// `Tensor.uniform_` does (24 random bits per float, 53 per double) in PyTorch builds whose
/// CPU kernels use FMA (AVX2 or AVX-512 capability, i.e. any x86-64 machine of the last
/// decade; see uniform()). So
/// `attn::manual_seed(123)` followed by the notebook's constructors gives the notebook's
/// weights. Not thread-safe; the global generator behind manual_seed() is locked.
class TorchGenerator {
 public:
  explicit TorchGenerator(std::uint64_t seed = 67280421310721ULL) { manual_seed(seed); }

  /// Re-seeds like torch.manual_seed (the low 32 bits seed the Mersenne Twister).
  void manual_seed(std::uint64_t seed) {
    engine_.seed(static_cast<std::uint32_t>(seed & 0xffffffffULL));
  }

  std::uint32_t random() { return static_cast<std::uint32_t>(engine_()); }
  std::uint64_t random64() {
    const std::uint64_t hi = random();
    const std::uint64_t lo = random();
    return (hi << 32) | lo;
  }

  /// One draw of `uniform_(from, to)` for Scalar (float uses 24 bits, double 53), with
  /// PyTorch's arithmetic: the bounds are cast to Scalar, the value is formed in double.
  template <class Scalar>
  Scalar uniform(double from, double to) {
    static_assert(std::is_floating_point_v<Scalar>, "attn::TorchGenerator: float or double");
    const double lo = static_cast<Scalar>(from), hi = static_cast<Scalar>(to);
    double unit;
    if constexpr (std::is_same_v<Scalar, double>) {
      unit =
          static_cast<double>(random64() & ((std::uint64_t{1} << 53) - 1)) * std::ldexp(1.0, -53);
    } else {
      unit = static_cast<double>(random() & ((std::uint32_t{1} << 24) - 1)) * std::ldexp(1.0, -24);
    }
    // PyTorch's CPU kernels are compiled per instruction set; on AVX2/AVX-512 machines the
    // compiler fuses `unit * (hi - lo) + lo` into one FMA, so std::fma reproduces those
    // draws bit for bit whatever flags attn itself is compiled with.
    return static_cast<Scalar>(std::fma(unit, hi - lo, lo));
  }

  /// Fills a view in row-major index order, like `tensor.uniform_(from, to)`.
  template <class Scalar, std::size_t Rank>
  void fill_uniform(TensorView<Scalar, Rank> v, double from, double to) {
    if (v.empty()) return;
    Scalar* data = v.data();
    detail::for_each_offset(v.shape(), v.strides(), v.strides(),
                            [&](Index o, Index) { data[o] = uniform<Scalar>(from, to); });
  }

 private:
  std::mt19937 engine_;
};

namespace detail {

struct GlobalGenerator {
  std::mutex mutex;
  TorchGenerator generator;
};

inline GlobalGenerator& global_generator() {
  static GlobalGenerator instance;
  return instance;
}

}  // namespace detail

/// Seeds the global generator that modules draw their initial weights from, like
/// `torch.manual_seed(seed)`.
inline void manual_seed(std::uint64_t seed) {
  auto& global = detail::global_generator();
  std::lock_guard<std::mutex> lock(global.mutex);
  global.generator.manual_seed(seed);
}

/// Runs `fn(TorchGenerator&)` with the global generator locked.
template <class Fn>
decltype(auto) with_global_generator(Fn&& fn) {
  auto& global = detail::global_generator();
  std::lock_guard<std::mutex> lock(global.mutex);
  return fn(global.generator);
}

/// `torch.rand(shape)` from the global generator: uniform in [0, 1).
template <class Scalar = float, std::size_t Rank>
Tensor<Scalar, Rank> rand(const Shape<Rank>& shape) {
  Tensor<Scalar, Rank> result(shape);
  with_global_generator([&](TorchGenerator& gen) { gen.fill_uniform(result.view(), 0.0, 1.0); });
  return result;
}

/// `torch.rand(shape, generator=gen)`.
template <class Scalar = float, std::size_t Rank>
Tensor<Scalar, Rank> rand(const Shape<Rank>& shape, TorchGenerator& gen) {
  Tensor<Scalar, Rank> result(shape);
  gen.fill_uniform(result.view(), 0.0, 1.0);
  return result;
}

ATTN_NAMESPACE_END
