// SPDX-License-Identifier: MIT
// attn/detail/identity.hpp: ObjectIdentity, what tells one module object from another to the
// records that outlive a call (SavedForward, KVCache, optimizers, Gradients): a number no
// other object had, and a token that expires with the memory the object owned (std only).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The identity of one object that owns parameters or is recorded by a longer-lived object.
///
/// - id(): a number no other ObjectIdentity of this program had (a 64-bit counter; 0 only
///   for a moved-from one). A record that keeps the id knows whether it is looking at the
///   object it was made by, even when another object now lives at the same address
///   (`module = Module(...)` reuses the address, not the identity).
/// - watch(): a token that expires when the object is destroyed or assigned over, i.e. when
///   the heap memory it owned at the time (its parameters) is freed. A record that keeps
///   views of that memory checks the token before using them.
///
/// Constructing or copying an object gives it a fresh identity; copy assignment too (the
/// target's old memory may be gone). A move hands the identity over with the heap memory it
/// describes: the moved-to object is the same object as far as every record is concerned,
/// and the moved-from one has none (id 0, an expired token).
class ObjectIdentity {
 public:
  ObjectIdentity() : token_(std::make_shared<const std::uint64_t>(next())) {}
  ObjectIdentity(const ObjectIdentity&) : ObjectIdentity() {}
  ObjectIdentity& operator=(const ObjectIdentity& other) {
    if (this != &other) token_ = std::make_shared<const std::uint64_t>(next());
    return *this;
  }
  ObjectIdentity(ObjectIdentity&& other) noexcept : token_(std::move(other.token_)) {}
  ObjectIdentity& operator=(ObjectIdentity&& other) noexcept {
    token_ = std::move(other.token_);
    return *this;
  }
  ~ObjectIdentity() = default;

  /// The object's number (0 after it was moved from).
  std::uint64_t id() const noexcept { return token_ ? *token_ : 0; }
  /// A token that expires when this identity ends (destroyed, assigned over, moved from).
  std::weak_ptr<const void> watch() const noexcept { return token_; }

 private:
  static std::uint64_t next() noexcept {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  std::shared_ptr<const std::uint64_t> token_;
};

}  // namespace detail
ATTN_NAMESPACE_END
