// SPDX-License-Identifier: MIT
// attn/io/error.hpp: the exceptions of attn's file input/output (IoError and its kinds).
#pragma once

#include <stdexcept>
#include <string>

#include "attn/error.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {

/// Base of every error attn::io throws: a file that cannot be opened, read or written, or
/// whose contents do not fit the call. what() names the file (or buffer) and the values.
/// An attn::Error, and a std::runtime_error for catch sites written for that.
class IoError : public attn::Error, public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// A malformed file: bad header length, header not a JSON object, unknown dtype, offsets
/// out of range or overlapping, shape and byte count disagreeing, truncated data, or a
/// tensor read with the wrong rank or an unconvertible dtype.
class FormatError : public IoError {
 public:
  using IoError::IoError;
};

/// A state_dict that does not fit a module: a missing tensor, an unexpected one (strict
/// mode), or one whose shape differs from the module's parameter.
class StateDictError : public IoError {
 public:
  using IoError::IoError;
};

namespace detail {

/// Throws ErrorType("attn::io::<where>: <message>") when `ok` is false; the message is built
/// only on failure.
template <class ErrorType, class MakeMessage>
void io_require(bool ok, const char* where, MakeMessage&& make_message) {
  if (!ok) throw ErrorType(std::string("attn::io::") + where + ": " + make_message());
}

}  // namespace detail
}  // namespace io
ATTN_NAMESPACE_END
