// SPDX-License-Identifier: MIT
// attn/kernels/sse2.hpp: the sse2 kernel set, attn::kernels::sse2: the set's primitives
// (sse2/vec.inl, sse2/convert.inl) and the generic kernels (generic/*.inl) compiled in its
// target region.
#pragma once

#include "attn/kernels/prelude.hpp"

#if ATTN_KERNELS_X86
ATTN_TARGET_SSE2_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace sse2 {
using namespace detail;  // the plain data the drivers pass (attn/kernels/*_args.hpp, head_mask.hpp)
inline constexpr Isa kSetIsa = Isa::kSse2;
#define ATTN_KERNEL_SET sse2
// The order matters: each part uses the ones before it.
// clang-format off
#include "attn/kernels/sse2/vec.inl"
#include "attn/kernels/sse2/convert.inl"
#include "attn/kernels/generic/all.inl"
// clang-format on
#undef ATTN_KERNEL_SET
}  // namespace sse2
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END
#endif  // ATTN_KERNELS_X86
