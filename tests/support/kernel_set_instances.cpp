// SPDX-License-Identifier: MIT
// tests/support/kernel_set_instances.cpp: compiles one of attn's kernel sets
// (ATTN_KERNEL_SET_HEADER, the set's header) for the project's own programs: the tests, and
// with ATTN_SHARE_KERNELS the examples, benchmarks, tools and fuzz targets, all built with
// ATTN_KERNELS_EXTERN (see attn/kernels/instantiate.hpp). One set per unit, so the four
// compile in parallel.
#define ATTN_KERNELS_INSTANTIATE
#include ATTN_KERNEL_SET_HEADER
