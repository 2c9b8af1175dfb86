// SPDX-License-Identifier: MIT
// attn/kernels/scalar.hpp: the scalar kernel set, attn::kernels::scalar: the set's primitives
// (scalar/vec.inl) and the generic kernels (generic/*.inl) compiled in its target region.
#pragma once

#include "attn/kernels/prelude.hpp"

ATTN_TARGET_SCALAR_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace scalar {
using namespace detail;  // the plain data the drivers pass (attn/kernels/*_args.hpp, head_mask.hpp)
inline constexpr Isa kSetIsa = Isa::kScalar;
#define ATTN_KERNEL_SET scalar
// The order matters: each part uses the ones before it.
// clang-format off
#include "attn/kernels/scalar/vec.inl"
#include "attn/kernels/generic/all.inl"
// clang-format on
#undef ATTN_KERNEL_SET
}  // namespace scalar
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_SCALAR_END
