// SPDX-License-Identifier: MIT
// attn/workspace.hpp: reusable scratch memory, so a steady-state forward never allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/memory.hpp"

ATTN_NAMESPACE_BEGIN

class Workspace;

namespace detail {

/// The workspace's slot plan: which buffer each step of a forward uses. Private to attn:
/// user code passes a Workspace around and never names a slot.
enum class WorkspaceSlot : std::size_t {
  kQueryStaging,    // contiguous copy of a query (or self-attention x) the GEMM cannot read
  kKeyStaging,      // the same for a separate key input
  kValueStaging,    // the same for a separate value input
  kProjection,      // the Q/K/V projections, head-major (B, P*H, T, hd)
  kContext,         // the merged attention output (B, T, H, hd) before out_proj
  kKernelKeyValue,  // head-major copy of long, strided K/V for the streaming kernel
  kThread,          // per-thread attention kernel scratch (one buffer per thread)
  kGemmPack,        // per-thread GEMM packing buffer (one per thread)
  kKernelPartials,  // the attention kernel's per-key-chunk partial softmax states (decoding)
  kLogsumexp,       // a training forward's logsumexp per query (B, H, T_q), in SavedForward
  kGradContext,     // the backward's gradient of the context (B, T_q, H, hd)
  kGradProjection,  // the backward's dQ, dK, dV, head-major like the projections
  kWideOutput,      // float results (and bias) of a GEMM on bfloat16 operands, before rounding
  kCacheRows,       // a step's keys and values read from a KV cache with sinks, rotated
  kWideBackward,    // a bfloat16 backward's float copies of Q, K, V and the context
  kNarrowBackward,  // a bfloat16 (float16) backward's 16-bit GEMM operands (rounded, transposed)
  kWideSinks,       // a bfloat16 (float16) module's learned sinks widened to float for a call
  kCallTable,       // a packed batch's kernel calls, one per sequence (and their gradients)
  kBlockTables,     // a paged packed prefill's block tables, gathered per sequence
  kRunTable,        // a driver's per-call plans when it runs several calls in one region
  kCount            // number of slots (not a slot)
};

template <class T>
T* workspace_get(Workspace& ws, WorkspaceSlot slot, Index count, int thread = 0);
template <class T>
T* workspace_peek(const Workspace& ws, WorkspaceSlot slot, int thread = 0) noexcept;
bool workspace_overlaps(const Workspace& ws, std::uintptr_t begin, std::uintptr_t end) noexcept;

}  // namespace detail

/// Scratch memory reused across calls: pass the same Workspace to every forward() and,
/// after the first call with the largest shape, no call allocates. Buffers are 64-byte
/// aligned and only grow. A Workspace is not thread-safe: give each calling thread its
/// own (the kernels' OpenMP threads share one safely; the calling thread hands them out).
class Workspace {
 public:
  Workspace() = default;

  /// Total bytes held.
  std::size_t bytes() const noexcept {
    std::size_t total = 0;
    for (const auto& s : slots_) total += s.capacity();
    return total;
  }

  /// Frees everything.
  void release() { slots_.clear(); }

 private:
  template <class T>
  friend T* detail::workspace_get(Workspace&, detail::WorkspaceSlot, Index, int);
  template <class T>
  friend T* detail::workspace_peek(const Workspace&, detail::WorkspaceSlot, int) noexcept;
  friend bool detail::workspace_overlaps(const Workspace&, std::uintptr_t, std::uintptr_t) noexcept;

  // Thread t's copy of every slot: index slot + t * kCount (threads > 0 use the per-thread
  // slots only; the others stay empty).
  static std::size_t index(detail::WorkspaceSlot slot, int thread) noexcept {
    return static_cast<std::size_t>(slot) +
           static_cast<std::size_t>(thread) *
               static_cast<std::size_t>(detail::WorkspaceSlot::kCount);
  }

  std::vector<detail::AlignedBuffer<std::byte>> slots_;
};

namespace detail {

/// A buffer of at least `count` T in `slot` (for a per-thread slot: that thread's), grown if
/// needed.
/// Contents are unspecified.
template <class T>
T* workspace_get(Workspace& ws, WorkspaceSlot slot, Index count, int thread) {
  const std::size_t i = Workspace::index(slot, thread);
  if (i >= ws.slots_.size()) ws.slots_.resize(i + 1);
  AlignedBuffer<std::byte>& buffer = ws.slots_[i];
  buffer.reserve(static_cast<std::size_t>(count) * sizeof(T));
  return reinterpret_cast<T*>(buffer.data());
}

/// Room in `slot` for `count` objects of each of Ts..., one table after another (each 64-byte
/// aligned), grown if needed: a table of calls that allocates nothing once the slot has held
/// one as large. Ts are trivially destructible: the caller constructs each object in place and
/// never destroys it.
template <class... Ts>
std::tuple<Ts*...> workspace_tables(Workspace& ws, WorkspaceSlot slot, Index count) {
  static_assert(((std::is_trivially_destructible_v<Ts> && alignof(Ts) <= 64) && ...),
                "a workspace table holds trivially destructible objects aligned to 64 bytes "
                "at most");
  const auto bytes = [count](std::size_t size) {
    return (static_cast<std::size_t>(count) * size + 63) / 64 * 64;
  };
  std::byte* const base =
      workspace_get<std::byte>(ws, slot, static_cast<Index>((bytes(sizeof(Ts)) + ... + 0)));
  std::size_t offset = 0;
  return std::tuple<Ts*...>{
      reinterpret_cast<Ts*>(base + std::exchange(offset, offset + bytes(sizeof(Ts))))...};
}

/// A workspace table (workspace_tables()) of `count` objects of T, each value-initialised in
/// place: a driver's per-call records that allocate nothing once the slot has held as many.
template <class T>
T* workspace_objects(Workspace& ws, WorkspaceSlot slot, Index count) {
  T* const objects = std::get<0>(workspace_tables<T>(ws, slot, count));
  for (Index i = 0; i < count; ++i) new (objects + i) T();
  return objects;
}

/// The buffer in `slot` without growing it (for threads after workspace_get() sized it).
template <class T>
T* workspace_peek(const Workspace& ws, WorkspaceSlot slot, int thread) noexcept {
  return reinterpret_cast<T*>(ws.slots_[Workspace::index(slot, thread)].data());
}

/// True when the bytes [begin, end) (addresses) intersect a buffer `ws` holds: a caller's
/// view that points into a record's own memory (a SavedForward's storage).
inline bool workspace_overlaps(const Workspace& ws, std::uintptr_t begin,
                               std::uintptr_t end) noexcept {
  for (const auto& buffer : ws.slots_) {
    if (buffer.capacity() == 0) continue;
    const auto first = reinterpret_cast<std::uintptr_t>(buffer.data());
    if (begin < first + buffer.capacity() && first < end) return true;
  }
  return false;
}

}  // namespace detail
ATTN_NAMESPACE_END
