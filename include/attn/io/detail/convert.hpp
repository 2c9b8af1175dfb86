// SPDX-License-Identifier: MIT
// attn/io/detail/convert.hpp: little-endian loads and stores, half and bfloat16 to float, and
// the conversion of a tensor's raw bytes to float, double, bfloat16, float16 or bool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/io/dtype.hpp"
#include "attn/types/element.hpp"

ATTN_NAMESPACE_BEGIN
namespace io {
namespace detail {

inline constexpr bool host_is_little_endian() noexcept {
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__)
  return __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__;
#else
  return true;
#endif
}

/// A little-endian value of type T at `p` (any alignment).
template <class T>
T load_le(const unsigned char* p) noexcept {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, p, sizeof(T));
  if constexpr (!host_is_little_endian()) std::reverse(bytes, bytes + sizeof(T));
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

/// Stores `value` little-endian at `p`.
template <class T>
void store_le(T value, unsigned char* p) noexcept {
  std::memcpy(p, &value, sizeof(T));
  if constexpr (!host_is_little_endian()) std::reverse(p, p + sizeof(T));
}

/// IEEE binary16 -> float (exact, including subnormals, infinities and NaN).
inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits = 0;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// bfloat16 -> float (exact).
inline float bfloat16_to_float(std::uint16_t b) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Converts `n` elements of `dtype` at `src` (little-endian, any alignment) to a 16-bit
/// storage type S (bfloat16, float16) at `out`. S's own dtype (BF16 for bfloat16, F16 for
/// float16) is copied bit for bit, never widened and narrowed back (a NaN keeps its payload,
/// signalling or not); the other floating dtypes round once, to nearest even, from their exact
/// value (F16, BF16 and F32 through float, which holds them exactly; F64 directly), as
/// attn::convert rounds. Integers, BOOL and the 8-bit floats are refused. Returns nullptr, or
/// why the conversion does not exist (then nothing is written).
template <class S>
const char* convert_to_storage(DType dtype, const unsigned char* src, std::size_t n, S* out) {
  const std::size_t step = dtype_size(dtype);
  const auto each = [&](auto load) {
    for (std::size_t i = 0; i < n; ++i) out[i] = load(src + i * step);
  };
  if (dtype == dtype_of<S>()) {
    if constexpr (host_is_little_endian()) {
      if (n > 0) std::memcpy(static_cast<void*>(out), src, n * sizeof(S));
    } else {
      each([](const unsigned char* p) { return S::from_bits(load_le<std::uint16_t>(p)); });
    }
    return nullptr;
  }
  switch (dtype) {
    case DType::kF16:
      each([](const unsigned char* p) {
        return attn::detail::convert_element<S>(half_to_float(load_le<std::uint16_t>(p)));
      });
      return nullptr;
    case DType::kBF16:
      each([](const unsigned char* p) {
        return attn::detail::convert_element<S>(bfloat16_to_float(load_le<std::uint16_t>(p)));
      });
      return nullptr;
    case DType::kF32:
      each([](const unsigned char* p) {
        return attn::detail::convert_element<S>(load_le<float>(p));
      });
      return nullptr;
    case DType::kF64:
      each([](const unsigned char* p) {
        return attn::detail::convert_element<S>(load_le<double>(p));
      });
      return nullptr;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return " (8-bit float formats are not supported)";
    case DType::kBool:
      return " (a boolean mask; read it as bool)";
    default:
      return " (an integer tensor; read it as float or double)";
  }
}

/// convert_elements() to float, double or bool.
template <class Scalar>
const char* convert_to_wide(DType dtype, const unsigned char* src, std::size_t n, Scalar* out) {
  constexpr bool kToBool = std::is_same_v<Scalar, bool>;
  const std::size_t step = dtype_size(dtype);
  const auto each = [&](auto load) {
    for (std::size_t i = 0; i < n; ++i) out[i] = load(src + i * step);
  };
  const auto integer = [&](auto tag) {
    using I = decltype(tag);
    if constexpr (kToBool) {
      each([](const unsigned char* p) { return load_le<I>(p) != 0; });
    } else {
      each([](const unsigned char* p) { return static_cast<Scalar>(load_le<I>(p)); });
    }
    return nullptr;
  };
  // Same type on a little-endian host: the bytes are the values.
  const auto same = [&](auto tag) {
    using F = decltype(tag);
    if constexpr (std::is_same_v<Scalar, F> && host_is_little_endian()) {
      if (n > 0) std::memcpy(out, src, n * sizeof(F));
    } else {
      each([](const unsigned char* p) { return static_cast<Scalar>(load_le<F>(p)); });
    }
  };
  switch (dtype) {
    case DType::kU8:
      return integer(std::uint8_t{});
    case DType::kI8:
      return integer(std::int8_t{});
    case DType::kI16:
      return integer(std::int16_t{});
    case DType::kU16:
      return integer(std::uint16_t{});
    case DType::kI32:
      return integer(std::int32_t{});
    case DType::kU32:
      return integer(std::uint32_t{});
    case DType::kI64:
      return integer(std::int64_t{});
    case DType::kU64:
      return integer(std::uint64_t{});
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return " (8-bit float formats are not supported)";
    case DType::kBool:
      if constexpr (!kToBool) {
        return " (a boolean mask; read it as bool)";
      } else {
        each([](const unsigned char* p) { return *p != 0; });
        return nullptr;
      }
    default:
      break;
  }
  if constexpr (kToBool) {
    return " (a floating-point tensor; read it as float or double)";
  } else {
    switch (dtype) {
      case DType::kF16:
        each([](const unsigned char* p) {
          return static_cast<Scalar>(half_to_float(load_le<std::uint16_t>(p)));
        });
        break;
      case DType::kBF16:
        each([](const unsigned char* p) {
          return static_cast<Scalar>(bfloat16_to_float(load_le<std::uint16_t>(p)));
        });
        break;
      case DType::kF32:
        same(float{});
        break;
      case DType::kF64:
        same(double{});
        break;
      default:
        break;
    }
    return nullptr;
  }
}

/// Converts `n` elements of `dtype` at `src` (little-endian, any alignment) to Scalar at
/// `out`: floats and integers to float/double, BOOL and integers to bool (nonzero = true),
/// floats to bfloat16 and float16 as convert_to_storage() says. Returns nullptr, or why the
/// conversion does not exist (then nothing is written).
template <class Scalar>
const char* convert_elements(DType dtype, const unsigned char* src, std::size_t n, Scalar* out) {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double> ||
                    std::is_same_v<Scalar, bfloat16> || std::is_same_v<Scalar, float16> ||
                    std::is_same_v<Scalar, bool>,
                "attn::io: read tensors as float, double, bfloat16, float16 or bool");
  if constexpr (std::is_same_v<Scalar, bfloat16> || std::is_same_v<Scalar, float16>) {
    return convert_to_storage(dtype, src, n, out);
  } else {
    return convert_to_wide(dtype, src, n, out);
  }
}

}  // namespace detail
}  // namespace io
ATTN_NAMESPACE_END
