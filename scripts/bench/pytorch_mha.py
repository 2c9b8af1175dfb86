#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/pytorch_mha.py: times PyTorch's multi-head attention on one shape and prints
# the same machine-readable line as bench/mha_timer (the attn side). Used by
# scripts/bench_vs_pytorch.sh, one fresh process per measurement so RSS is per shape.
#
# Usage: /usr/bin/python3 scripts/bench/pytorch_mha.py B Tq Tk D H causal cross threads reps
#            [--max-seconds S] [--warmup N] [--variants auto|name,name,...] [--dtype f32|bf16]
# The caller sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / OPENBLAS_CORETYPE and the glibc
# MALLOC_* variables before Python starts (they are read at library load time); this
# script also calls torch.set_num_threads(threads).
#
# What is timed: torch.nn.MultiheadAttention(D, H, batch_first=True).eval() called with
# need_weights=False under torch.inference_mode(), float32; self-attention passes the same
# tensor as query, key and value (PyTorch 1.13's fast path), cross-attention passes key is
# value. Causal: attn_mask = triu(ones(Tq, Tk), diagonal=1) (query i sees keys j <= i), plus
# is_causal=True where nn.MultiheadAttention.forward accepts it (PyTorch >= 2.0).
# --dtype bf16: the same module after .to(torch.bfloat16) (every weight rounded once) on the
# same input rounded to bfloat16, the float mask in bfloat16 too; the result line then says
# impl=pytorch_bf16 (float32: impl=pytorch) and dtype=bf16. PyTorch 1.13 runs it through
# oneDNN's bfloat16 GEMMs and its composite attention (no fused bfloat16 kernel on the CPU).
#
# Variants (--variants auto runs every one that applies and reports the fastest, so the
# comparison is against the best PyTorch configuration; each is also printed):
#   mha            the module call above (bool attn_mask when causal)
#   mha_floatmask  causal only: the module with an additive float mask (-inf above the
#                  diagonal) instead of a bool one
#   functional     F.multi_head_attention_forward with the module's weights (the module's
#                  regular path, skipping its fast-path checks)
#   sdpa           PyTorch >= 2.0 only: F.linear in_proj, F.scaled_dot_product_attention
#                  (is_causal for causal), F.linear out_proj
# Output: one "variant=..." line per variant, then the result line:
#   impl=pytorch B=.. Tq=.. Tk=.. D=.. H=.. causal=0 cross=0 threads=1 reps=20
#   median_ms=.. min_ms=.. gflops=.. max_rss_mib=.. base_rss_mib=.. variant=mha torch=1.13.1
#   dtype=f32
# max_rss_mib: getrusage ru_maxrss of this process (all variants); base_rss_mib: the same
# right after `import torch`, before the module and inputs exist.

import argparse
import inspect
import resource

from timing import medians as median_times, time_variants


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def mha_flops(b, tq, tk, d, h, causal, cross):
    """The FLOP formula of bench/bench_support.hpp (useful FLOPs, matrix products only)."""
    if not causal:
        pairs = tq * tk
    elif tq <= tk:
        pairs = tq * (tq + 1) / 2
    else:
        pairs = tk * (tk + 1) / 2 + (tq - tk) * tk
    proj = 2.0 * b * tq * d * 3 * d if not cross else 2.0 * b * tq * d * d + 2.0 * b * tk * d * 2 * d
    return proj + 2.0 * b * tq * d * d + 4.0 * b * h * pairs * (d // h)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    for name in ["B", "Tq", "Tk", "D", "H", "causal", "cross", "threads", "reps"]:
        p.add_argument(name, type=int)
    p.add_argument("--max-seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--variants", default="auto")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    a = p.parse_args()
    if not a.cross and a.Tk != a.Tq:
        p.error("self-attention (cross=0) needs Tk == Tq")
    if a.D % a.H != 0:
        p.error("D must be divisible by H")
    causal, cross = bool(a.causal), bool(a.cross)

    import torch
    import torch.nn.functional as F

    base_rss = max_rss_mib()
    torch.set_num_threads(max(1, a.threads))
    torch.manual_seed(1234)

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    mha = torch.nn.MultiheadAttention(a.D, a.H, bias=True, batch_first=True).eval().to(dtype)
    xq = (torch.rand(a.B, a.Tq, a.D) * 2 - 1).to(dtype)
    xkv = (torch.rand(a.B, a.Tk, a.D) * 2 - 1).to(dtype) if cross else xq
    bool_mask = float_mask = None
    if causal:
        bool_mask = torch.triu(torch.ones(a.Tq, a.Tk, dtype=torch.bool), diagonal=1)
        float_mask = torch.zeros(a.Tq, a.Tk, dtype=dtype).masked_fill_(bool_mask, float("-inf"))
    has_is_causal = "is_causal" in inspect.signature(mha.forward).parameters
    has_sdpa = hasattr(F, "scaled_dot_product_attention")

    def module_call(mask):
        kwargs = {"need_weights": False}
        if mask is not None:
            kwargs["attn_mask"] = mask
            if has_is_causal:
                kwargs["is_causal"] = True
        return lambda: mha(xq, xkv, xkv, **kwargs)[0]

    def functional_call():
        # The module's regular path, as nn.MultiheadAttention.forward calls it (batch_first:
        # the functional form takes (T, B, D)).
        # (Self-attention passes one tensor three times, so in_proj is one GEMM.)
        q = xq.transpose(0, 1)
        kv = xkv.transpose(0, 1) if cross else q
        return lambda: F.multi_head_attention_forward(
            q, kv, kv, a.D, a.H, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
            mha.out_proj.weight, mha.out_proj.bias, training=False, need_weights=False,
            attn_mask=bool_mask)[0]

    def sdpa_call():
        hd = a.D // a.H
        w, bias = mha.in_proj_weight, mha.in_proj_bias

        def run():
            if cross:
                q = F.linear(xq, w[: a.D], bias[: a.D])
                k, v = F.linear(xkv, w[a.D:], bias[a.D:]).chunk(2, dim=-1)
            else:
                q, k, v = F.linear(xq, w, bias).chunk(3, dim=-1)
            q = q.view(a.B, a.Tq, a.H, hd).transpose(1, 2)
            k = k.reshape(a.B, a.Tk, a.H, hd).transpose(1, 2)
            v = v.reshape(a.B, a.Tk, a.H, hd).transpose(1, 2)
            # is_causal is top-left aligned, like the triu mask.
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ctx = ctx.transpose(1, 2).reshape(a.B, a.Tq, a.D)
            return F.linear(ctx, mha.out_proj.weight, mha.out_proj.bias)
        return run

    available = {"mha": module_call(bool_mask), "functional": functional_call()}
    if causal:
        available["mha_floatmask"] = module_call(float_mask)
    if has_sdpa:
        available["sdpa"] = sdpa_call()
    names = list(available) if a.variants == "auto" else a.variants.split(",")
    unknown = [n for n in names if n not in available]
    if unknown:
        p.error(f"variants {unknown} do not apply here; available: {sorted(available)}")

    flops = mha_flops(a.B, a.Tq, a.Tk, a.D, a.H, causal, cross)
    # bfloat16 variants round at different points: compared within a few bfloat16 ulps.
    tol = {"atol": 3e-2, "rtol": 3e-2} if a.dtype == "bf16" else {}
    times = time_variants(torch, available, names, a.warmup, a.reps, a.max_seconds,
                          lambda n, y: y.transpose(0, 1) if n == "functional" else y, **tol)

    rss = max_rss_mib()
    medians = median_times(times)
    for n in names:
        print(f"variant={n} median_ms={medians[n]:.4f} min_ms={min(times[n]):.4f} "
              f"gflops={flops / (medians[n] * 1e-3) * 1e-9:.2f}")
    best = min(names, key=lambda n: medians[n])
    impl = "pytorch_bf16" if a.dtype == "bf16" else "pytorch"
    print(f"impl={impl} B={a.B} Tq={a.Tq} Tk={a.Tk} D={a.D} H={a.H} causal={a.causal} "
          f"cross={a.cross} threads={a.threads} reps={len(times[best])} "
          f"median_ms={medians[best]:.4f} min_ms={min(times[best]):.4f} "
          f"gflops={flops / (medians[best] * 1e-3) * 1e-9:.2f} max_rss_mib={rss:.1f} "
          f"base_rss_mib={base_rss:.1f} variant={best} torch={torch.__version__} dtype={a.dtype}")


if __name__ == "__main__":
    main()
