// SPDX-License-Identifier: MIT
// attn/kernels/generic/all.inl: every generic kernel, in dependency order. Included once per
// kernel set (attn/kernels/<set>.hpp), inside the set's namespace and target region, after
// the set's vec.inl; so this file and the ones it includes have no include guard and include
// no headers (attn/kernels/prelude.hpp includes what they use, before any region opens).
//
// What a set's vec.inl provides, and the generic code relies on:
//  - kMicroRows, kMicroVecs: the micro-kernel's tile, rows x registers;
//  - Vec<float>, Vec<double>: Scalar, Reg, Mask, kWidth; zero, set1, load, store,
//    load_partial / store_partial (the first n lanes; n <= 0 touches no memory), fmadd
//    (a * b + c, fused where the set has FMA), fnmadd (c - a * b), add, sub, mul, min / max
//    (the second operand when either is NaN, as x86 does), div, reduce_add, reduce_max, round
//    (to nearest even), ldexp (p * 2^n, n integral, exact), less / greater (ordered) and
//    select (mask ? a : b);
//  - transpose_block / transpose_block_wide and their widths, for packing;
//  - optionally (<set>/convert.inl; <set>/decode_rows.inl on avx512 and avx2),
//    convert_vector_part() overloads for the element-type conversions the set vectorises
//    (see generic/convert.inl), and widen_int8_part() /
//    widen_int4_block() for a quantised KVCache's rows, int8_key_scores_part(),
//    int8_values_part(), int4_key_scores_part() and int4_values_part() for a decode step
//    over int8 and int4 rows, decode_key_scores_part() for the scores of few query rows over
//    float, bfloat16 and float16 keys and half_values_part() for a decode step's 16-bit values
//    (see generic/kv_load.inl);
//  - the avx512 set only (avx512/bf16_dot.inl, avx512/attention_pairs.inl,
//    avx512/amx_bf16.inl): the bfloat16 dot-product kernel bf16_dot_tile_rows(), its packing
//    pack_pairs(), the streaming attention's softmax passes on k-pair scores
//    (pairs_scale_bound_max(), pairs_exp_probabilities()), and the AMX kernel
//    amx_configure(), amx_pack_a(), amx_block(), amx_panel(), amx_store(), amx_fence(),
//    amx_release() (see generic/gemm.inl), amx_tiles() and amx_tile_queue() (its products
//    issued a block at a time) for the attention's products (the backward's too, with
//    bf16_dot_tile_rows(), pack_pairs(), pack_row_pairs() and pack_probabilities(); and
//    avx512/backward_pairs.inl's store_rounded()); and
//    (avx512/int8_dot.inl) the AVX512-VNNI int8_key_scores_part(),
//    int4_key_scores_part(), int8_values_part() and int4_values_part(); the avx2 set's AVX-VNNI
//    form (avx2/int8_vnni.inl) and its choice (avx2/int8_dispatch.inl).
// The order matters: each part uses the ones before it.
// clang-format off
#include "attn/kernels/generic/convert.inl"
#include "attn/kernels/generic/exp.inl"
#include "attn/kernels/generic/microkernel.inl"
#include "attn/kernels/generic/gemm.inl"
#include "attn/kernels/generic/softmax.inl"
#include "attn/kernels/generic/variants.inl"
#include "attn/kernels/generic/kv_load.inl"
#include "attn/kernels/generic/attention.inl"
#include "attn/kernels/generic/key_chunks.inl"
#include "attn/kernels/generic/attention_backward_pairs.inl"
#include "attn/kernels/generic/attention_backward.inl"
#include "attn/kernels/generic/kernel_set.inl"
// clang-format on
