#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/pytorch_bf16_attention.py: times PyTorch 1.13's bfloat16 attention on
# bench/bf16_attention_bench.cpp's shapes, one thread (torch.set_num_threads(1); run it with
# OMP_NUM_THREADS=1). torch 1.13 has no F.scaled_dot_product_attention, so this is the
# composite softmax(Q K^T * scale + causal mask) V in bfloat16: two torch.matmul calls and
# torch.softmax, which materialise the (T, T) scores per head. Prints one line per shape: the
# median of `reps` timed calls after 2 untimed ones (process CPU time, as the attn benchmark
# counts), in ms and GFLOP/s (4 B H T^2 d flops, halved for causal as the attn rows count).
#
# Usage: OMP_NUM_THREADS=1 /usr/bin/python3 scripts/bench/pytorch_bf16_attention.py [reps]
import math
import statistics
import sys
import time

import torch

SHAPES = [(8, 8, 512, 64), (1, 16, 1024, 128), (1, 8, 2048, 64), (1, 8, 4096, 128)]


def attention(q, k, v, causal):
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        t = q.shape[-2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch={torch.__version__} threads={torch.get_num_threads()}")
    with torch.inference_mode():
        for causal in (False, True):
            for b, h, t, d in SHAPES:
                q, k, v = (torch.rand(b, h, t, d).mul(2).sub(1).to(torch.bfloat16)
                           for _ in range(3))
                for _ in range(2):
                    attention(q, k, v, causal)
                times = []
                for _ in range(reps):
                    start = time.process_time()
                    attention(q, k, v, causal)
                    times.append(time.process_time() - start)
                median = statistics.median(times)
                flops = 4.0 * b * h * t * t * d * (0.5 if causal else 1.0)
                print(f"B={b} H={h} T={t} d={d} causal={int(causal)} "
                      f"torch_bf16_ms={median * 1e3:.1f} gflops={flops / median * 1e-9:.1f}")


if __name__ == "__main__":
    main()
