// SPDX-License-Identifier: MIT
// attn/kernels/instantiate.hpp: compile attn's kernels once per program instead of once per
// translation unit (optional; a build-time saving only).
//
// Every translation unit that uses attn compiles the four kernel sets it calls (scalar, SSE2,
// AVX2, AVX-512; attn/kernels/). A program with many such units can instead
//  - define ATTN_KERNELS_EXTERN for all of them (e.g. target_compile_definitions), which turns
//    the kernels' definitions into extern template declarations, and
//  - include this header in exactly one source file, which instantiates them:
//
//      // attn_kernels.cpp
//      #include "attn/kernels/instantiate.hpp"
//
// To spread the work over several units (they compile in parallel), instantiate one set in
// each instead: define ATTN_KERNELS_INSTANTIATE and include that set's header,
// attn/kernels/scalar.hpp, sse2.hpp, avx2.hpp or avx512.hpp.
//
// All units must be built with the same instruction-set flags (the same ABI tag, see
// attn/config.hpp). The test suite builds this way, one set per unit
// (tests/support/kernel_set_instances.cpp): it roughly halves each test's compile time.
#pragma once

#ifndef ATTN_KERNELS_INSTANTIATE
#define ATTN_KERNELS_INSTANTIATE
#endif
#include "attn/kernels/dispatch.hpp"
