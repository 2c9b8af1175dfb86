#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/profile_summary.py: where the time of one MHA forward goes, from the two
# profilers scripts/bench/profile_vs_ort.sh runs. Standard library only.
#
#   profile_summary.py ort PROFILE.json [--skip N]
#       ONNX Runtime's profiler output (ort_mha.js --profile): per graph node, the mean time
#       per run and its share of the run (model_run), skipping the first N runs (default 2,
#       the warm-up runs); MatMul / Gemm nodes also get their GFLOP/s from their shapes, at
#       the mean and at the fastest run (on a busy machine the fastest is the better estimate
#       of what the kernel can do). Last, the run split like attn's: projections (MatMul,
#       Gemm), attention core (the attention ops, the score products, Softmax, mask Add),
#       layout (Transpose, Reshape, Split); com.microsoft.Attention does its Q/K/V
#       projection inside the op, so it gets a group of its own.
#   profile_summary.py perf PERF.data [--ms MEDIAN]
#       `perf record -e cpu-clock` of bench/mha_timer: the samples of attn's functions
#       grouped into projections (the packed GEMM and its packing), attention core (the
#       streaming / materialised kernels, their transposes, softmax) and the rest (module
#       set-up, page faults, the timer), by symbol name; the hottest symbols follow. With
#       --ms (mha_timer's median_ms) also milliseconds per call: the call's time split in
#       the ratio of the projection and core samples.
#   profile_summary.py gemm GEMM_BENCH.json
#       bench/gemm_bench's --benchmark_format=json output: attn's GEMM per shape, GFLOP/s at
#       the median and at the fastest repetition.
# Both print plain text for bench/README.md's "vs ONNX Runtime" section.

import argparse
import collections
import json
import statistics
import subprocess
import sys


def matmul_flops(a, y):
    """2*M*N*K of a MatMul / Gemm from its first input A (..., M, K) and its output Y (..., M, N)
    (the profiler lists no shapes for initializers, so the weight's are not known)."""
    try:
        m = 1
        for d in a[:-1]:
            m *= d
        return 2.0 * m * a[-1] * y[-1]
    except (IndexError, TypeError):
        return None


def summarize_ort(path, skip):
    with open(path) as f:
        events = json.load(f)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    timed = runs[skip:]
    if not timed:
        sys.exit(f"{path}: {len(runs)} model_run events, none left after skipping {skip}")
    per_node = collections.OrderedDict()
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        # the run this node event belongs to
        if not any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in timed):
            continue
        args = e.get("args", {})
        name = e["name"][: -len("_kernel_time")]
        node = per_node.setdefault(name, {"op": args.get("op_name", "?"), "durs": [],
                                          "shapes": args.get("input_type_shape", []),
                                          "out": args.get("output_type_shape", [])})
        node["durs"].append(e["dur"] / 1000.0)
    run_ms = statistics.mean(r["dur"] / 1000.0 for r in timed)
    node_total = sum(statistics.mean(n["durs"]) for n in per_node.values())
    print(f"{path}: {len(timed)} runs after {skip} skipped, mean model_run {run_ms:.3f} ms "
          f"(nodes {node_total:.3f} ms, the rest is ORT's executor)")
    by_op = collections.Counter()
    for name, n in per_node.items():
        ms = statistics.mean(n["durs"])
        fastest = min(n["durs"])
        by_op[n["op"]] += ms
        shapes = [list(s.values())[0] for s in n["shapes"]]
        extra = ""
        if n["op"] in ("MatMul", "Gemm") and shapes and n["out"]:
            flops = matmul_flops(shapes[0], list(n["out"][0].values())[0])
            if flops:
                extra = (f"  {flops / (ms * 1e-3) * 1e-9:6.1f} GFLOP/s"
                         f" (fastest run {flops / (fastest * 1e-3) * 1e-9:.1f})")
        print(f"  {n['op']:<22} {name:<40} {ms:9.3f} ms {100 * ms / run_ms:5.1f}%{extra}  "
              f"inputs {' '.join('x'.join(map(str, s)) for s in shapes)}")
    print("  by op type: " + ", ".join(f"{op} {100 * ms / run_ms:.1f}%" for op, ms in by_op.most_common()))
    groups = collections.Counter()
    for op, ms in by_op.items():
        groups[next((g for g, ops in ORT_GROUPS if op in ops), "other")] += ms
    print("  split: " + ", ".join(f"{g} {ms:.3f} ms ({100 * ms / run_ms:.1f}%)"
                                  for g, ms in groups.most_common()))


# ONNX Runtime's op types by what they do in these graphs.
ORT_GROUPS = (
    ("projections", ("MatMul", "Gemm")),
    ("attention core", ("MultiHeadAttention", "GroupQueryAttention", "FusedMatMul", "Softmax",
                        "Add", "Where", "Mul", "Div")),
    ("projection + core (com.microsoft.Attention)", ("Attention",)),
    ("layout", ("Transpose", "Reshape", "Split", "Slice", "Concat")),
)

# attn's functions by what they do (substring of the demangled symbol; first match wins).
PERF_GROUPS = (
    ("attention core", ("streaming_tile", "materialized", "materialised", "softmax", "exp_",
                        "run_attention", "scaled_dot_product", "attention_scores",
                        "causal_", "flash")),
    ("projections", ("gemm", "Gemm", "pack_", "PackedGemmB", "linear_forward", "micro_kernel")),
)


def summarize_perf(path, call_ms):
    out = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "symbol",
                          "--stdio", "-g", "none", "--percent-limit", "0"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "%" not in line.split()[0]:
            continue
        pct = float(line.split()[0].rstrip("%"))
        sym = line.split("] ", 1)[1] if "] " in line else line
        rows.append((pct, sym.strip()))
    groups = collections.Counter()
    for pct, sym in rows:
        group = "other (set-up, kernel, timer)"
        for g, keys in PERF_GROUPS:
            if any(k in sym for k in keys):
                group = g
                break
        # transposes inside the kernel belong to the core; those of the weight packing to
        # the projections (perf cannot tell them apart without call graphs: counted as core)
        if "transpose_block" in sym:
            group = "attention core"
        groups[group] += pct
    print(f"{path}: " + ", ".join(f"{g} {p:.1f}%" for g, p in groups.most_common()))
    work = groups["projections"] + groups["attention core"]
    if call_ms and work > 0:
        print("  split of a call: " + ", ".join(
            f"{g} {call_ms * groups[g] / work:.3f} ms" for g in ("projections", "attention core")))
    for pct, sym in rows[:6]:
        print(f"  {pct:5.1f}%  {sym[:110]}")


def summarize_gemm(path):
    with open(path) as f:
        runs = [b for b in json.load(f)["benchmarks"] if b.get("run_type") == "iteration"]
    shapes = collections.OrderedDict()
    for b in runs:
        shapes.setdefault(b["run_name"], []).append(b["FLOPS"] * 1e-9)
    for name, rates in shapes.items():
        print(f"  {name:<40} {statistics.median(rates):6.1f} GFLOP/s median, "
              f"{max(rates):6.1f} fastest of {len(rates)}")


def main():
    p = argparse.ArgumentParser(description="summaries of ORT / perf profiles of one MHA shape")
    sub = p.add_subparsers(dest="kind", required=True)
    o = sub.add_parser("ort")
    o.add_argument("profile")
    o.add_argument("--skip", type=int, default=2)
    q = sub.add_parser("perf")
    q.add_argument("data")
    q.add_argument("--ms", type=float, default=None)
    g = sub.add_parser("gemm")
    g.add_argument("json")
    a = p.parse_args()
    if a.kind == "ort":
        summarize_ort(a.profile, a.skip)
    elif a.kind == "perf":
        summarize_perf(a.data, a.ms)
    else:
        summarize_gemm(a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
