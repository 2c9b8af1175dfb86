// SPDX-License-Identifier: MIT
// support/bodies_begin.hpp: included after a test file's own #includes, with
// support/bodies_end.hpp at its end: under GCC the file's test bodies and helpers are compiled
// without optimisation, while the attn code they instantiate keeps the build's level (a
// template is compiled with the options in force where it is defined, not where it is used).
// Most of a test unit's compile time went into optimising and expanding the test bodies
// themselves: the attention tests' unit took 208 CPU s at -O2 and 143 s like this, side by
// side. Files whose own loops do heavy work (exhaustive sweeps, the kernel tests) leave them
// optimised. -DATTN_TEST_OPTIMIZE_BODIES=ON compiles every body at the build's level.
// (No include guard: a unity unit includes it once per test file.)
#if ATTN_TEST_UNOPTIMIZED_BODIES && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O0")
#endif
