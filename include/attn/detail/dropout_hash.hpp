// SPDX-License-Identifier: MIT
// attn/detail/dropout_hash.hpp: the counter-based hash behind dropout's keep decisions,
// shared by nn::Dropout and the attention kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// SplitMix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/// Counter-based dropout: the keep decision for element (row, column) of a stream is a
/// pure function of (seed, stream, row, column), so it does not depend on the thread
/// count, the order of evaluation or the kernel path.
struct DropoutStream {
  std::uint64_t key = 0;        // mixes the seed, the call counter and (batch, head)
  std::uint32_t threshold = 0;  // drop when the hash's top 32 bits are below it
  bool active = false;          // false: keep everything, no scaling

  /// The key of one row; combine with a column in keep().
  std::uint64_t row_key(Index row) const noexcept {
    return mix64(key ^ (static_cast<std::uint64_t>(row) * 0x9e3779b97f4a7c15ULL));
  }
  static bool keep(std::uint64_t row_key, Index column, std::uint32_t threshold) noexcept {
    const std::uint64_t h =
        mix64(row_key + (static_cast<std::uint64_t>(column) + 1) * 0xd1b54a32d192ed03ULL);
    return static_cast<std::uint32_t>(h >> 32) >= threshold;
  }
};

/// The stream for one (batch, head) of one call.
inline DropoutStream make_dropout_stream(double p, std::uint64_t seed, std::uint64_t call,
                                         Index batch, Index head) noexcept {
  DropoutStream s;
  if (!(p > 0.0)) return s;
  s.active = true;
  s.threshold = static_cast<std::uint32_t>(std::min(p * 4294967296.0, 4294967295.0));
  s.key = mix64(mix64(mix64(seed ^ 0x5851f42d4c957f2dULL) + call) +
                (static_cast<std::uint64_t>(batch) << 32 | static_cast<std::uint64_t>(head)));
  return s;
}

}  // namespace detail
ATTN_NAMESPACE_END
