// SPDX-License-Identifier: MIT
// tests/dispatch/dispatch_tu_baseline.cpp: the workload built for baseline x86-64 (-march=x86-64).
#define ATTN_DISPATCH_TU run_baseline_unit
#include "dispatch_workload.hpp"
