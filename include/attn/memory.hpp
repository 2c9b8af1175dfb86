// SPDX-License-Identifier: MIT
// attn/memory.hpp: 64-byte aligned storage, the one allocation primitive below the tensors,
// the GEMM and the workspace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// Alignment of every buffer attn allocates: one cache line, which is also a full
/// AVX-512 register.
inline constexpr std::size_t kAlignment = 64;

struct AlignedDelete {
  void operator()(void* p) const noexcept { ::operator delete[](p, std::align_val_t{kAlignment}); }
};

/// Uninitialised, 64-byte aligned storage for `count` trivially copyable T.
template <class T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "attn::AlignedBuffer: T must be trivial");

 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) { reserve(count); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      AlignedDelete{}(ptr_);
      ptr_ = std::exchange(other.ptr_, nullptr);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }
  ~AlignedBuffer() { AlignedDelete{}(ptr_); }

  /// Ensures room for `count` elements. Grows geometrically; the old contents are
  /// not kept (callers use it as scratch or fill it right after).
  void reserve(std::size_t count) {
    if (count <= capacity_) return;
    const std::size_t grown = std::max(count, capacity_ + capacity_ / 2);
    T* grown_ptr =
        static_cast<T*>(::operator new[](grown * sizeof(T), std::align_val_t{kAlignment}));
    AlignedDelete{}(ptr_);
    ptr_ = grown_ptr;
    capacity_ = grown;
  }
  T* data() const noexcept { return ptr_; }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  // A plain owning pointer rather than a std::unique_ptr: data() is on every element access of
  // a Tensor, and at -O0 unique_ptr::get() is five nested calls.
  T* ptr_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace detail
ATTN_NAMESPACE_END
