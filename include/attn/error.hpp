// SPDX-License-Identifier: MIT
// attn/error.hpp: attn::Error and its kinds (shape, configuration, index), and the lazy
// require() helpers behind every argument check.
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "attn/config.hpp"

ATTN_NAMESPACE_BEGIN

/// Base of every exception attn throws: `catch (const attn::Error& e)` catches anything
/// attn threw, and nothing else. Each kind also derives from the standard exception it is
/// (std::invalid_argument, std::out_of_range, std::runtime_error for io), so catch sites
/// written for those keep working; what() is that exception's message.
class Error {
 public:
  virtual ~Error() = default;
  /// The message: "attn::<function>: <what was wrong, with the shapes or values>".
  virtual const char* what() const noexcept = 0;

 protected:
  Error() = default;
  Error(const Error&) = default;
  Error& operator=(const Error&) = default;
};

/// An argument's shape does not fit the call. what() names the function and the shapes,
/// e.g. "attn::MultiHeadAttention::forward: query has shape (2, 6, 4), expected (B, T, 3)
/// with d_in=3".
class ShapeError : public Error, public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
  const char* what() const noexcept override { return std::invalid_argument::what(); }
};

/// A configuration value does not fit: d_out % num_heads != 0, dropout outside [0, 1), a
/// sequence longer than context_length, a negative size or key length, a non-finite scale,
/// or a weight the module's configuration does not have (in_proj_weight with kdim != d_in).
/// what() names the values.
class ConfigError : public Error, public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
  const char* what() const noexcept override { return std::invalid_argument::what(); }
};

/// A checked element access (at()) with an index outside its axis.
class IndexError : public Error, public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
  const char* what() const noexcept override { return std::out_of_range::what(); }
};

namespace detail {

/// "(2, 6, 4)" for `rank` extents (or strides); "()" for rank 0.
inline std::string to_string(const Index* extents, std::size_t rank) {
  std::string text = "(";
  for (std::size_t r = 0; r < rank; ++r) {
    if (r != 0) text += ", ";
    text += std::to_string(extents[r]);
  }
  return text + ")";
}

/// "(2, 6, 4)" for a shape; "()" for rank 0.
template <std::size_t Rank>
std::string to_string(const std::array<Index, Rank>& shape) {
  return to_string(shape.data(), Rank);
}

/// Throws Kind("attn::<where>: <message>"). One out-of-line copy per kind: the checks below
/// call it instead of each holding its own string concatenation and throw.
template <class Kind>
[[noreturn, gnu::noinline, gnu::cold]] void fail(const char* where, const std::string& message) {
  throw Kind(std::string("attn::") + where + ": " + message);
}

/// Throws Kind("attn::<where>: <message>") when `ok` is false. The message is built only
/// on failure, so a check costs one branch on the hot path.
template <class Kind, class MakeMessage>
void require_that(bool ok, const char* where, MakeMessage&& make_message) {
  if (!ok) fail<Kind>(where, make_message());
}

/// Throws ShapeError when `ok` is false (see require_that).
template <class MakeMessage>
void require(bool ok, const char* where, MakeMessage&& make_message) {
  require_that<ShapeError>(ok, where, std::forward<MakeMessage>(make_message));
}

/// Throws ConfigError when `ok` is false; for configuration values (num_heads, dropout,
/// context_length), not shapes.
template <class MakeMessage>
void require_config(bool ok, const char* where, MakeMessage&& make_message) {
  require_that<ConfigError>(ok, where, std::forward<MakeMessage>(make_message));
}

/// A floating-point value as the messages quote it ("%g" with 9 significant digits).
inline std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

}  // namespace detail
ATTN_NAMESPACE_END
