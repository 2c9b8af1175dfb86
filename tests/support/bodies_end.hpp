// SPDX-License-Identifier: MIT
// support/bodies_end.hpp: closes support/bodies_begin.hpp at the end of a test file, so the
// next file of a unity unit starts at the build's optimisation level again.
// (No include guard: a unity unit includes it once per test file.)
#if ATTN_TEST_UNOPTIMIZED_BODIES && defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
