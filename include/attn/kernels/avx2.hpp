// SPDX-License-Identifier: MIT
// attn/kernels/avx2.hpp: the avx2 kernel set, attn::kernels::avx2: the set's primitives
// (avx2/vec.inl, avx2/convert.inl), its few-row decode scores and 16-bit values
// (avx2/decode_rows.inl), its AVX-VNNI integer kernels (avx2/int8_vnni.inl) and
// the generic kernels (generic/*.inl), each compiled in its target region.
#pragma once

#include "attn/kernels/prelude.hpp"

#if ATTN_KERNELS_X86
ATTN_TARGET_AVX2_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx2 {
using namespace detail;  // the plain data the drivers pass (attn/kernels/*_args.hpp, head_mask.hpp)
inline constexpr Isa kSetIsa = Isa::kAvx2;
// The order matters: each part uses the ones before it.
// clang-format off
#include "attn/kernels/avx2/vec.inl"
#include "attn/kernels/avx2/convert.inl"
#include "attn/kernels/avx2/decode_rows.inl"
// clang-format on
}  // namespace avx2
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END

// The integer kernels of a decode step on AVX-VNNI (int8 key scores, P V over int8 and int4
// values), in a region that adds it: called only on CPUs that have it.
ATTN_TARGET_AVX2VNNI_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx2 {
#include "attn/kernels/avx2/int8_vnni.inl"
}  // namespace avx2
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END

ATTN_TARGET_AVX2_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx2 {
#define ATTN_KERNEL_SET avx2
// clang-format off
#include "attn/kernels/avx2/int8_dispatch.inl"
#include "attn/kernels/generic/all.inl"
// clang-format on
#undef ATTN_KERNEL_SET
}  // namespace avx2
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END
#endif  // ATTN_KERNELS_X86
