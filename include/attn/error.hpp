// SPDX-License-Identifier: MIT
// attn/error.hpp: ShapeError and the lazy require() helpers behind every argument check.
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "attn/config.hpp"

namespace attn {

/// Thrown when an argument's shape does not fit the call. what() names the function
/// and the shapes, e.g. "attn::MultiHeadAttention::forward: query has shape (2, 6, 4),
/// expected (B, T, 3) with d_in=3".
class ShapeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

/// "(2, 6, 4)" for a shape; "()" for rank 0.
template <std::size_t Rank>
std::string to_string(const std::array<Index, Rank>& shape) {
  std::string text = "(";
  for (std::size_t r = 0; r < Rank; ++r) {
    if (r != 0) text += ", ";
    text += std::to_string(shape[r]);
  }
  return text + ")";
}

/// Throws ShapeError("attn::<where>: <message>") when `ok` is false. The message is
/// built only on failure, so a check costs one branch on the hot path.
template <class MakeMessage>
void require(bool ok, const char* where, MakeMessage&& make_message) {
  if (!ok) throw ShapeError(std::string("attn::") + where + ": " + make_message());
}

/// Throws std::invalid_argument("attn::<where>: <message>") when `ok` is false; for bad
/// configuration values (num_heads, dropout, context_length), not shapes.
template <class MakeMessage>
void require_arg(bool ok, const char* where, MakeMessage&& make_message) {
  if (!ok) throw std::invalid_argument(std::string("attn::") + where + ": " + make_message());
}

/// A floating-point value as the messages quote it ("%g" with 9 significant digits).
inline std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

}  // namespace detail
}  // namespace attn
