// SPDX-License-Identifier: MIT
// fuzz/kernel_instances.cpp: compiles one of attn's kernel sets (ATTN_FUZZ_KERNEL_SET, the
// set's header) for the fuzz targets, instrumented as they are; they are built with
// ATTN_KERNELS_EXTERN (see attn/kernels/instantiate.hpp). One set per unit: the four compile
// in parallel.
#define ATTN_KERNELS_INSTANTIATE
#include ATTN_FUZZ_KERNEL_SET
