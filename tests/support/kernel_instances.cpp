// SPDX-License-Identifier: MIT
// tests/support/kernel_instances.cpp: the one unit that compiles attn's kernel sets for the
// test executables (they are built with ATTN_KERNELS_EXTERN; see attn/kernels/instantiate.hpp).
#include "attn/kernels/instantiate.hpp"
