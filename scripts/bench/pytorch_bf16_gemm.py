#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/pytorch_bf16_gemm.py: times PyTorch 1.13's bfloat16 matmul, y = x W^T with x
# (M, K) and W (N, K) bfloat16 (torch.nn.functional.linear, no bias; the result is bfloat16,
# where attn's bfloat16 GEMM writes float), on bench/gemm_bench.cpp's BM_GemmBf16 shapes, one
# thread (torch.set_num_threads(1); run it with OMP_NUM_THREADS=1). Prints one line per shape:
# the median of `reps` timed calls after 3 untimed ones, in ms and GFLOP/s (2 M N K flops).
#
# Usage: OMP_NUM_THREADS=1 /usr/bin/python3 scripts/bench/pytorch_bf16_gemm.py [reps]
import statistics
import sys
import time

import torch

SHAPES = [(4096, 1536, 512), (4096, 512, 512), (128, 1536, 512), (2048, 2304, 768),
          (8192, 1536, 512)]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch={torch.__version__} threads={torch.get_num_threads()} "
          f"mkldnn_bf16={torch.backends.mkldnn.is_available()}")
    with torch.inference_mode():
        for m, n, k in SHAPES:
            x = torch.randn(m, k).to(torch.bfloat16)
            w = torch.randn(n, k).to(torch.bfloat16)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            print(f"M={m} N={n} K={k} torch_bf16_linear_ms={median * 1e3:.3f} "
                  f"gflops={2.0 * m * n * k / median * 1e-9:.1f}")


if __name__ == "__main__":
    main()
