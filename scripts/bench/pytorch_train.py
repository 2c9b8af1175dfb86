#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/pytorch_train.py: times one training step of PyTorch's nn.MultiheadAttention
# (self-attention) on one shape, forward plus autograd's backward, and prints the same
# machine-readable line as bench/train_timer (the attn side). Used by scripts/bench/train.sh,
# one fresh process per measurement so RSS is per shape.
#
# Usage: /usr/bin/python3 scripts/bench/pytorch_train.py B T D H causal threads reps
#            [--max-seconds S] [--warmup N]
# The caller sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / OPENBLAS_CORETYPE and the glibc
# MALLOC_* variables before Python starts (scripts/bench/env.sh); this script also calls
# torch.set_num_threads(threads).
#
# One step, as a training loop runs it (the optimizer's step is not timed, as on attn's
# side): zero the gradients (set_to_none=False, like attn's Gradients::zero()), y = m(x, x, x,
# need_weights=False[, attn_mask]) on torch.nn.MultiheadAttention(D, H, batch_first=True) in
# train() mode with dropout 0.0, float32, x requiring grad; then y.backward(grad_out) (the
# gradient of sum(grad_out * y): loss.backward() for that loss). Causal: a bool attn_mask
# triu(ones(T, T), diagonal=1). FLOPs as bench/train_timer counts them.
# Output: impl=pytorch B=.. T=.. D=.. H=.. causal=.. threads=.. reps=.. median_ms=..
#   min_ms=.. gflops=.. max_rss_mib=.. base_rss_mib=.. torch=1.13.1
import argparse
import resource
import statistics
import time


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def train_flops(b, t, d, h, causal):
    """3.5x the forward's attention plus 3x its projections (bench/train_timer.cpp)."""
    pairs = t * (t + 1) / 2 if causal else t * t
    attention = 4.0 * b * h * pairs * (d // h)
    projections = 2.0 * b * t * d * 3 * d + 2.0 * b * t * d * d
    return 3.5 * attention + 3.0 * projections


def main():
    p = argparse.ArgumentParser(description=__doc__)
    for name in ["B", "T", "D", "H", "causal", "threads", "reps"]:
        p.add_argument(name, type=int)
    p.add_argument("--max-seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args()
    import torch  # after argparse: --help works without torch
    base_rss = max_rss_mib()
    torch.set_num_threads(max(1, a.threads))
    torch.manual_seed(1234)
    mha = torch.nn.MultiheadAttention(a.D, a.H, dropout=0.0, batch_first=True).train()
    g = torch.Generator().manual_seed(42)
    x = torch.rand(a.B, a.T, a.D, generator=g).mul_(2).sub_(1).requires_grad_()
    grad_out = torch.rand(a.B, a.T, a.D, generator=g).mul_(2).sub_(1)
    mask = torch.triu(torch.ones(a.T, a.T, dtype=torch.bool), 1) if a.causal else None

    def step():
        mha.zero_grad(set_to_none=False)
        if x.grad is not None:
            x.grad.zero_()
        y, _ = mha(x, x, x, need_weights=False, attn_mask=mask)
        y.backward(grad_out)

    for _ in range(max(1, a.warmup)):
        step()
    times, total = [], 0.0
    for _ in range(max(1, a.reps)):
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        times.append(dt * 1e3)
        total += dt
        if total >= a.max_seconds and len(times) >= 3:
            break
    median = statistics.median(times)
    flops = train_flops(a.B, a.T, a.D, a.H, a.causal)
    print(f"impl=pytorch B={a.B} T={a.T} D={a.D} H={a.H} causal={a.causal} threads={a.threads} "
          f"reps={len(times)} median_ms={median:.4f} min_ms={min(times):.4f} "
          f"gflops={flops / (median * 1e-3) * 1e-9:.2f} max_rss_mib={max_rss_mib():.1f} "
          f"base_rss_mib={base_rss:.1f} torch={torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
