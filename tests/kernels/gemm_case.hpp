// SPDX-License-Identifier: MIT
// tests/kernels/gemm_case.hpp: one GEMM shape of the kernel tests (gemm_test.cpp,
// bf16_gemm_test.cpp) and how a failure names it.
#pragma once

#include <string>

#include "attn/config.hpp"

namespace attn::test {

struct GemmCase {
  Index m, n, k;
  Index rows_per_batch;  // 0: plain row-major output
  Index segment;         // 0: one segment
};

inline std::string describe(const GemmCase& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " rows_per_batch=" + std::to_string(c.rows_per_batch) +
         " segment=" + std::to_string(c.segment);
}

}  // namespace attn::test
