// SPDX-License-Identifier: MIT
// fuzz/kernel_instances.cpp: the one unit that compiles attn's kernel sets for the fuzz
// targets, instrumented as they are (they are built with ATTN_KERNELS_EXTERN; see
// attn/kernels/instantiate.hpp).
#include "attn/kernels/instantiate.hpp"
