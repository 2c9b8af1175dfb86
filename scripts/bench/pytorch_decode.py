#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/pytorch_decode.py: times PyTorch 1.13 on one generation step of a
# Llama-3-8B-shaped attention layer with a KV cache: a decode step (T_new = 1) or a chunk of a
# chunked prefill (T_new = 128), after `L` cached tokens. The PyTorch side of the decode
# benchmarks (scripts/bench/decode.sh); one fresh process per measurement, like
# scripts/bench/pytorch_mha.py.
#
# Usage: /usr/bin/python3 scripts/bench/pytorch_decode.py OP B L threads reps
#            [--max-seconds S] [--warmup N] [--variants auto|name,...] [shape options]
#        /usr/bin/python3 scripts/bench/pytorch_decode.py --sweep [--ops decode,prefill]
#            [--batches 1,4] [--lengths 512,1024,2048,4096,8192] [--threads 1,2] [--reps N]
# OP is `decode` (T_new = 1) or `prefill` (T_new = 128, --chunk to change). The caller sets
# OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / OPENBLAS_CORETYPE and the glibc MALLOC_*
# variables before Python starts (they are read at library load time); this script also
# calls torch.set_num_threads(threads). --sweep runs every configuration that way itself,
# one child process each, with scripts/bench/env.sh's settings (printed first, one
# `settings:` line), and prints every child's lines.
#
# The layer (shape options: --dim 4096 --heads 32 --kv-heads 8 --head-dim 128, float32):
# Hugging Face's LlamaAttention in eval mode under torch.inference_mode(), frozen random
# weights, no biases: x W^T for Q, K, V (one fused [W_q; W_k; W_v] GEMM: the weights are read
# once), RoPE (rotate_half, tables precomputed for every position) on the new Q and K, the new
# K/V written to the cache, softmax(q k^T / sqrt(hd) + bottom-right causal mask) v over the
# whole cache, W_o. What one step does and reads: the weights (4 (H + 2 H_kv) hd D + 4 D H hd
# bytes) and the cache (4 * 2 B H_kv (L + T_new) hd bytes).
#
# Variants (--variants auto runs all and reports the fastest; each is printed):
#   index_copy_grouped  preallocated cache (B, H_kv, capacity, hd) written with index_copy_,
#                       attention over a view of its first L + T_new rows; the query heads of
#                       a group attend as one (B, H_kv, n_rep T, hd) batch (no K/V copy)
#   cat_grouped         the cache grows by torch.cat([past, new], dim=2) every step
#   index_copy_repeat   as Hugging Face writes it: repeat_kv copies K and V to H heads
#   cat_repeat          torch.cat and repeat_kv (Hugging Face's DynamicCache path)
# Output: one "variant=..." line per variant, then the result line:
#   impl=pytorch op=decode B=1 L=512 T_new=1 D=4096 H=32 H_kv=8 hd=128 threads=1 reps=20
#   median_ms=.. min_ms=.. bytes=.. gbps=.. max_rss_mib=.. base_rss_mib=.. variant=.. torch=..
# bytes: what the step must read (weights + cache, above); gbps = bytes / median time.

import argparse
import os
import resource
import shutil
import subprocess
import sys

from timing import medians as median_times, time_variants

OPS = {"decode": 1, "prefill": 128}
VARIANTS = ["index_copy_grouped", "cat_grouped", "index_copy_repeat", "cat_repeat"]


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def step_bytes(b, length, t_new, d, h, h_kv, hd):
    weights = 4 * ((h + 2 * h_kv) * hd * d + d * h * hd)
    cache = 4 * 2 * b * h_kv * (length + t_new) * hd
    return weights + cache


def measure(a):
    import torch
    import torch.nn.functional as F

    base_rss = max_rss_mib()
    torch.set_num_threads(max(1, a.threads))
    torch.manual_seed(1234)
    b, length, t_new = a.B, a.L, a.chunk if a.op == "prefill" else OPS[a.op]
    d, h, h_kv, hd = a.dim, a.heads, a.kv_heads, a.head_dim
    n_rep = h // h_kv
    total = length + t_new
    scale = 1.0 / (hd ** 0.5)

    def weight(rows, cols):  # nn.Linear's default init bound, frozen
        return (torch.rand(rows, cols) * 2 - 1) / (cols ** 0.5)

    w_qkv = weight((h + 2 * h_kv) * hd, d)
    w_o = weight(d, h * hd)
    # RoPE tables as Hugging Face precomputes them (float32), for every position used.
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    emb = torch.arange(total).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((emb, emb), dim=-1)
    cos, sin = emb.cos()[length:total], emb.sin()[length:total]  # the new tokens' rows
    # Bottom-right causal mask of the new queries over all keys (additive), built once.
    i = torch.arange(t_new)[:, None] + length
    j = torch.arange(total)[None, :]
    mask = torch.zeros(t_new, total).masked_fill_(j > i, float("-inf"))
    x = torch.rand(b, t_new, d) * 2 - 1
    past_k = torch.rand(b, h_kv, length, hd) * 2 - 1
    past_v = torch.rand(b, h_kv, length, hd) * 2 - 1
    cache_k = torch.zeros(b, h_kv, total, hd)
    cache_v = torch.zeros(b, h_kv, total, hd)
    cache_k[:, :, :length] = past_k
    cache_v[:, :, :length] = past_v
    positions = torch.arange(length, total)

    def rotate_half(t):
        return torch.cat((-t[..., hd // 2:], t[..., : hd // 2]), dim=-1)

    def step(cache, grouped):
        qkv = F.linear(x, w_qkv)  # (B, T, (H + 2 H_kv) hd)
        q, k, v = qkv.split([h * hd, h_kv * hd, h_kv * hd], dim=-1)
        q = q.view(b, t_new, h, hd).transpose(1, 2)
        k = k.view(b, t_new, h_kv, hd).transpose(1, 2)
        v = v.view(b, t_new, h_kv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache == "index_copy":
            cache_k.index_copy_(2, positions, k)
            cache_v.index_copy_(2, positions, v)
            keys, values = cache_k[:, :, :total], cache_v[:, :, :total]
        else:
            keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        if grouped:  # (B, H_kv, n_rep T, hd) against (B, H_kv, L + T, hd): no K/V copy
            qg = q.reshape(b, h_kv, n_rep * t_new, hd)
            s = torch.matmul(qg, keys.transpose(2, 3)).mul_(scale)
            s = s.view(b, h_kv, n_rep, t_new, total).add_(mask)
            p = torch.softmax(s, dim=-1).view(b, h_kv, n_rep * t_new, total)
            ctx = torch.matmul(p, values).view(b, h, t_new, hd)
        else:  # Hugging Face: repeat_kv, then per query head
            keys = keys[:, :, None].expand(b, h_kv, n_rep, total, hd).reshape(b, h, total, hd)
            values = values[:, :, None].expand(b, h_kv, n_rep, total, hd).reshape(b, h, total, hd)
            s = torch.matmul(q, keys.transpose(2, 3)).mul_(scale).add_(mask)
            ctx = torch.matmul(torch.softmax(s, dim=-1), values)
        return F.linear(ctx.transpose(1, 2).reshape(b, t_new, h * hd), w_o)

    available = {f"{c}_{'grouped' if g else 'repeat'}": (lambda c=c, g=g: step(c, g))
                 for c in ("index_copy", "cat") for g in (True, False)}
    names = VARIANTS if a.variants == "auto" else a.variants.split(",")
    unknown = [n for n in names if n not in available]
    if unknown:
        sys.exit(f"variants {unknown} are not known; available: {VARIANTS}")
    times = time_variants(torch, available, names, a.warmup, a.reps, a.max_seconds)
    rss = max_rss_mib()
    nbytes = step_bytes(b, length, t_new, d, h, h_kv, hd)
    medians = median_times(times)
    for n in names:
        print(f"variant={n} median_ms={medians[n]:.4f} min_ms={min(times[n]):.4f} "
              f"gbps={nbytes / (medians[n] * 1e-3) * 1e-9:.2f}")
    best = min(names, key=lambda n: medians[n])
    print(f"impl=pytorch op={a.op} B={b} L={length} T_new={t_new} D={d} H={h} H_kv={h_kv} "
          f"hd={hd} threads={a.threads} reps={len(times[best])} median_ms={medians[best]:.4f} "
          f"min_ms={min(times[best]):.4f} bytes={nbytes} "
          f"gbps={nbytes / (medians[best] * 1e-3) * 1e-9:.2f} max_rss_mib={rss:.1f} "
          f"base_rss_mib={base_rss:.1f} variant={best} torch={torch.__version__}", flush=True)


def sweep(a):
    """Every configuration in its own process, with scripts/bench/env.sh's environment."""
    here = os.path.dirname(os.path.abspath(__file__))
    env_sh = os.path.join(here, "env.sh")
    root = os.path.dirname(os.path.dirname(here))
    bash = shutil.which("bash")
    for threads in [int(t) for t in a.threads_list.split(",")]:
        # bench_env from env.sh: thread counts, glibc malloc settings, OpenBLAS core type.
        script = (f'ATTN_ROOT="{root}"; log() {{ :; }}; source "{env_sh}"; '
                  f'bench_env {threads} ""')
        lines = subprocess.run([bash, "-c", script], capture_output=True, text=True,
                               check=True).stdout.split()
        env = {k: v for k, v in os.environ.items()
               if k not in ("OMP_WAIT_POLICY", "OPENBLAS_CORETYPE", "GOMP_SPINCOUNT")}
        env.update(line.split("=", 1) for line in lines)
        print("settings: threads=%d %s" % (threads, " ".join(lines)), flush=True)
        for op in a.ops.split(","):
            for batch in [int(v) for v in a.batches.split(",")]:
                for length in [int(v) for v in a.lengths.split(",")]:
                    cmd = [sys.executable, os.path.abspath(__file__), op, str(batch), str(length),
                           str(threads), str(a.reps), "--max-seconds", str(a.max_seconds),
                           "--warmup", str(a.warmup), "--variants", a.variants]
                    subprocess.run(cmd, env=env, check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sweep", action="store_true", help="run every configuration (see --ops...)")
    p.add_argument("op", nargs="?", choices=sorted(OPS))
    p.add_argument("B", nargs="?", type=int)
    p.add_argument("L", nargs="?", type=int)
    p.add_argument("threads", nargs="?", type=int)
    p.add_argument("reps", nargs="?", type=int, default=20)
    p.add_argument("--reps", dest="reps_option", type=int, help="reps (for --sweep)")
    p.add_argument("--max-seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--variants", default="auto")
    p.add_argument("--chunk", type=int, default=OPS["prefill"], help="T_new of op=prefill")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ops", default="decode,prefill")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--threads-list", "--threads", dest="threads_list", default="1,2")
    a = p.parse_args()
    if a.reps_option is not None:
        a.reps = a.reps_option
    if a.sweep:
        if a.op is not None:
            p.error("--sweep takes no positional OP B L threads")
        sweep(a)
        return 0
    if a.op is None or a.B is None or a.L is None or a.threads is None:
        p.error("give OP B L threads [reps], or --sweep")
    if a.heads % a.kv_heads != 0:
        p.error("--heads must be a multiple of --kv-heads")
    measure(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
