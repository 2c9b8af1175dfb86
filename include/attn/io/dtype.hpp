// SPDX-License-Identifier: MIT
// attn/io/dtype.hpp: the element types of the safetensors format, in one table (name, size,
// kind), and what attn writes for float, double, bfloat16, float16 and bool.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/types/bfloat16.hpp"
#include "attn/types/float16.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {

/// Element types of the safetensors format (its "dtype" strings).
enum class DType {
  kBool,    ///< "BOOL", one byte, 0 or 1
  kU8,      ///< "U8"
  kI8,      ///< "I8"
  kF8E4M3,  ///< "F8_E4M3" (recognised; not convertible)
  kF8E5M2,  ///< "F8_E5M2" (recognised; not convertible)
  kI16,     ///< "I16"
  kU16,     ///< "U16"
  kF16,     ///< "F16", IEEE half (attn::float16); widened to float/double on load
  kBF16,    ///< "BF16", bfloat16 (attn::bfloat16); widened to float/double on load
  kI32,     ///< "I32"
  kU32,     ///< "U32"
  kF32,     ///< "F32"
  kI64,     ///< "I64"
  kU64,     ///< "U64"
  kF64,     ///< "F64"
};

/// What a dtype's elements are.
enum class DTypeKind {
  kBool,     ///< BOOL
  kInteger,  ///< U8, I8, ..., U64
  kFloat,    ///< F16, BF16, F32, F64 (convertible to float and double)
  kFloat8,   ///< F8_E4M3, F8_E5M2 (recognised, not convertible)
};

namespace detail {

struct DTypeInfo {
  DType dtype;
  const char* name;  ///< the format's string
  std::size_t size;  ///< bytes per element
  DTypeKind kind;
};

/// The one table of dtypes: every name, size and kind below is read from it.
inline constexpr DTypeInfo kDTypes[] = {
    {DType::kBool, "BOOL", 1, DTypeKind::kBool},
    {DType::kU8, "U8", 1, DTypeKind::kInteger},
    {DType::kI8, "I8", 1, DTypeKind::kInteger},
    {DType::kF8E4M3, "F8_E4M3", 1, DTypeKind::kFloat8},
    {DType::kF8E5M2, "F8_E5M2", 1, DTypeKind::kFloat8},
    {DType::kI16, "I16", 2, DTypeKind::kInteger},
    {DType::kU16, "U16", 2, DTypeKind::kInteger},
    {DType::kF16, "F16", 2, DTypeKind::kFloat},
    {DType::kBF16, "BF16", 2, DTypeKind::kFloat},
    {DType::kI32, "I32", 4, DTypeKind::kInteger},
    {DType::kU32, "U32", 4, DTypeKind::kInteger},
    {DType::kF32, "F32", 4, DTypeKind::kFloat},
    {DType::kI64, "I64", 8, DTypeKind::kInteger},
    {DType::kU64, "U64", 8, DTypeKind::kInteger},
    {DType::kF64, "F64", 8, DTypeKind::kFloat},
};

constexpr const DTypeInfo& dtype_info(DType dtype) noexcept {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable for a valid enumerator
}

/// The dtype named `text` ("F32"); false if the format has no such name.
inline bool parse_dtype(const std::string& text, DType& out) noexcept {
  for (const DTypeInfo& info : kDTypes) {
    if (text == info.name) {
      out = info.dtype;
      return true;
    }
  }
  return false;
}

/// "BOOL, U8, ... or F64": every name, for messages.
inline std::string dtype_names() {
  std::string text;
  const std::size_t n = sizeof kDTypes / sizeof kDTypes[0];
  for (std::size_t i = 0; i < n; ++i) {
    text += i == 0 ? "" : i + 1 == n ? " or " : ", ";
    text += kDTypes[i].name;
  }
  return text;
}

}  // namespace detail

/// The format's name of a dtype ("F32").
constexpr const char* dtype_name(DType dtype) noexcept { return detail::dtype_info(dtype).name; }

/// Bytes per element.
constexpr std::size_t dtype_size(DType dtype) noexcept { return detail::dtype_info(dtype).size; }

/// Bool, integer, float (F16, BF16, F32, F64) or 8-bit float.
constexpr DTypeKind dtype_kind(DType dtype) noexcept { return detail::dtype_info(dtype).kind; }

/// The dtype attn writes for a C++ element type: float -> F32, double -> F64, bfloat16 ->
/// BF16, float16 -> F16, bool -> BOOL.
template <class Scalar>
constexpr DType dtype_of() noexcept {
  using S = std::remove_const_t<Scalar>;
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double> ||
                    std::is_same_v<S, bfloat16> || std::is_same_v<S, float16> ||
                    std::is_same_v<S, bool>,
                "attn::io: tensors are written as float (F32), double (F64), bfloat16 (BF16), "
                "float16 (F16) or bool (BOOL)");
  if constexpr (std::is_same_v<S, float>) {
    return DType::kF32;
  } else if constexpr (std::is_same_v<S, double>) {
    return DType::kF64;
  } else if constexpr (std::is_same_v<S, bfloat16>) {
    return DType::kBF16;
  } else if constexpr (std::is_same_v<S, float16>) {
    return DType::kF16;
  } else {
    return DType::kBool;
  }
}

}  // namespace io
ATTN_NAMESPACE_END
