// SPDX-License-Identifier: MIT
// attn/kernels/avx512.hpp: the avx512 kernel set, attn::kernels::avx512: the set's primitives
// (avx512/vec.inl, avx512/convert.inl, avx512/backward_pairs.inl), the scores of few query rows
// and a decode step's 16-bit values (avx512/decode_rows.inl), its bfloat16 dot-product
// kernel and the streaming attention's passes on its scores (avx512/attention_pairs.inl,
// avx512/bf16_dot.inl), int8 dot-product and AMX kernels (avx512/int8_dot.inl,
// avx512/amx_bf16.inl) and the generic kernels (generic/*.inl), in that order, each compiled
// in its target region.
#pragma once

#include "attn/kernels/prelude.hpp"

#if ATTN_KERNELS_X86
ATTN_TARGET_AVX512_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx512 {
using namespace detail;  // the plain data the drivers pass (attn/kernels/*_args.hpp, head_mask.hpp)
inline constexpr Isa kSetIsa = Isa::kAvx512;
// The order matters: each part uses the ones before it.
// clang-format off
#include "attn/kernels/avx512/vec.inl"
#include "attn/kernels/avx512/convert.inl"
#include "attn/kernels/avx512/backward_pairs.inl"
#include "attn/kernels/avx512/decode_rows.inl"
// clang-format on
}  // namespace avx512
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END

// The bfloat16 dot-product kernel and the softmax passes of the attention's k-pair paths, in a
// region that adds AVX512-BF16: called only on CPUs that have it.
ATTN_TARGET_AVX512BF16_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx512 {
#include "attn/kernels/avx512/attention_pairs.inl"
#include "attn/kernels/avx512/bf16_dot.inl"
#include "attn/kernels/avx512/bf16_rows.inl"
}  // namespace avx512
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END

// The integer kernels of a decode step over int8 and int4 keys and values, in a region that
// adds AVX512-VNNI: their VNNI forms called only on CPUs that have it.
ATTN_TARGET_AVX512VNNI_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx512 {
#include "attn/kernels/avx512/int8_dot.inl"
}  // namespace avx512
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END

// The bfloat16 AMX kernel, in a region that adds AMX-TILE and AMX-BF16: called only once the
// operating system has granted this process the tile state (detail::amx_support()).
ATTN_TARGET_AVX512AMX_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx512 {
#include "attn/kernels/avx512/amx_bf16.inl"
}  // namespace avx512
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END

ATTN_TARGET_AVX512_BEGIN
ATTN_NAMESPACE_BEGIN
namespace kernels {
namespace avx512 {
#define ATTN_KERNEL_SET avx512
#include "attn/kernels/generic/all.inl"
#undef ATTN_KERNEL_SET
}  // namespace avx512
}  // namespace kernels
ATTN_NAMESPACE_END
ATTN_TARGET_END
#endif  // ATTN_KERNELS_X86
