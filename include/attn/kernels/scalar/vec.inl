// SPDX-License-Identifier: MIT
// attn/kernels/scalar/vec.inl: the portable primitives, one element per "register", plain
// C++ (the compiler may still vectorise the loops around them). The only set on non-x86
// targets; on x86 ATTN_ISA=scalar selects it. Included by attn/kernels/scalar.hpp inside
// namespace attn::kernels::scalar; see attn/kernels/generic/all.inl for the members.

/// 4 x 4 scalars: few enough registers for any target.
inline constexpr int kMicroRows = 4;
inline constexpr int kMicroVecs = 4;

template <class S>
struct Vec {
  static_assert(std::is_floating_point_v<S>, "attn::kernels::scalar::Vec: float or double");
  using Scalar = S;
  using Reg = S;
  using Mask = bool;
  static constexpr int kWidth = 1;
  static Reg zero() noexcept { return Scalar(0); }
  static Reg set1(Scalar v) noexcept { return v; }
  static Reg load(const Scalar* p) noexcept { return *p; }
  static Reg load_partial(const Scalar* p, Index n) noexcept { return n > 0 ? *p : Scalar(0); }
  static void store(Scalar* p, Reg v) noexcept { *p = v; }
  static void store_partial(Scalar* p, Reg v, Index n) noexcept {
    if (n > 0) *p = v;
  }
  static Reg fmadd(Reg a, Reg b, Reg c) noexcept { return a * b + c; }
  static Reg fnmadd(Reg a, Reg b, Reg c) noexcept { return c - a * b; }
  static Reg add(Reg a, Reg b) noexcept { return a + b; }
  static Reg sub(Reg a, Reg b) noexcept { return a - b; }
  static Reg mul(Reg a, Reg b) noexcept { return a * b; }
  static Reg div(Reg a, Reg b) noexcept { return a / b; }
  // x86's rule for NaN, which the kernels rely on: the second operand when either is NaN.
  static Reg max(Reg a, Reg b) noexcept { return a > b ? a : b; }
  static Reg min(Reg a, Reg b) noexcept { return a < b ? a : b; }
  static Scalar reduce_add(Reg v) noexcept { return v; }
  static Scalar reduce_max(Reg v) noexcept { return v; }
  static Reg round(Reg x) noexcept { return std::nearbyint(x); }
  /// p * 2^n for integral n (|n| < 2^20): two exact multiplications by powers of two built
  /// in the exponent field, as the vector sets do. NaN n gives NaN.
  static Reg ldexp(Reg p, Reg n) noexcept {
    if (!(n == n)) return n;
    const auto ni = static_cast<std::int32_t>(n);
    const std::int32_t half = ni / 2 - (ni < 0 && ni % 2 != 0 ? 1 : 0);  // floor, like >> 1
    return p * pow2(half) * pow2(ni - half);
  }
  static Mask less(Reg a, Reg b) noexcept { return a < b; }
  /// Whether every lane of `m` is set.
  static bool all(Mask m) noexcept { return m; }
  static Mask greater(Reg a, Reg b) noexcept { return a > b; }
  static Reg select(Mask m, Reg a, Reg b) noexcept { return m ? a : b; }

 private:
  static Scalar pow2(std::int32_t e) noexcept {
    if constexpr (sizeof(Scalar) == 4) {
      const auto bits = static_cast<std::uint32_t>(e + 127) << 23;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    } else {
      const auto bits = static_cast<std::uint64_t>(e + 1023) << 52;
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
    }
  }
};

// ---- "transposes": one element (packing copies element by element) ----

template <class Scalar>
constexpr Index transpose_width() noexcept {
  return 1;
}
template <class Scalar>
constexpr Index transpose_width_wide() noexcept {
  return 1;
}
template <class Scalar>
inline void transpose_block(const Scalar* src, Index, Scalar* dst, Index) noexcept {
  *dst = *src;
}
template <class Scalar>
inline void transpose_block_wide(const Scalar* src, Index, Scalar* dst, Index) noexcept {
  *dst = *src;
}
