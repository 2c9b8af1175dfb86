// SPDX-License-Identifier: MIT
// attn/workspace.hpp: reusable scratch memory, so a steady-state forward never allocates.
#pragma once

#include <cstddef>
#include <vector>

#include "attn/config.hpp"
#include "attn/tensor/tensor.hpp"

namespace attn {

/// Scratch memory reused across calls: pass the same Workspace to every forward() and,
/// after the first call with the largest shape, no call allocates. Buffers are 64-byte
/// aligned and only grow. A Workspace is not thread-safe: give each calling thread its
/// own (the kernels' OpenMP threads share one safely; the calling thread hands them out).
class Workspace {
 public:
  /// Slots the library uses; user code may use kUser and above.
  enum Slot : std::size_t {
    kProjection = 0,  // fused Q/K/V projection output
    kKeyValue = 1,    // K/V projection of a separate key/value input
    kContext = 2,     // merged attention output before out_proj
    kStaging = 3,     // copies of non-contiguous inputs
    kWeights = 4,     // per-head weights before averaging
    kKernelKeyValue = 5,  // head-major copy of long, strided K/V for the streaming kernel
    kUser = 8,
    kThreadBase = 16,  // per-thread kernel scratch: kThreadBase + thread number
  };

  Workspace() = default;

  /// A buffer of at least `count` T in `slot`, grown if needed. Contents are unspecified.
  template <class T>
  T* get(std::size_t slot, Index count) {
    if (slot >= slots_.size()) slots_.resize(slot + 1);
    detail::AlignedBuffer<std::byte>& buffer = slots_[slot];
    buffer.reserve(static_cast<std::size_t>(count) * sizeof(T));
    return reinterpret_cast<T*>(buffer.data());
  }

  /// The buffer in `slot` without growing it (for threads after get() reserved it).
  template <class T>
  T* peek(std::size_t slot) const noexcept {
    return reinterpret_cast<T*>(slots_[slot].data());
  }

  /// Total bytes held.
  std::size_t bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& s : slots_) total += s.capacity();
    return total;
  }

  /// Frees everything.
  void release() { slots_.clear(); }

 private:
  std::vector<detail::AlignedBuffer<std::byte>> slots_;
};

}  // namespace attn
