// SPDX-License-Identifier: MIT
// tests/dispatch/dispatch_tu_native.cpp: the workload built with -march=native.
#define ATTN_DISPATCH_TU run_native_unit
#include "dispatch_workload.hpp"
