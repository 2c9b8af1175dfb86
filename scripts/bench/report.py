#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/report.py: turns the raw lines of scripts/bench_vs_pytorch.sh (one per
# mha_timer / pytorch_mha.py process) into the comparison table, the summary line, the CSV
# and the GFLOP/s-vs-T plot. Standard library only; the plot uses gnuplot (gnuplot-nox) or,
# without it, matplotlib.
#
# Usage: report.py --raw RAW --peak PEAK --csv OUT.csv --plot OUT.png [--title-extra TEXT]
#   RAW:  lines "kind=main|sweep round=N impl=attn|pytorch B=.. Tq=.. ... median_ms=.. ..."
#   PEAK: bench/fma_peak's output (peak_t<N>_gflops=..., peak_isa=...)
# Per (kind, shape, threads, impl): the median over rounds of each process's median time
# ("median of medians"); peak RSS is the largest over rounds. speedup = PyTorch ms / attn
# ms; % of peak = attn GFLOP/s / the measured FMA peak at the same thread count.

import argparse
import collections
import csv
import os
import shutil
import statistics
import subprocess
import sys

KEY_FIELDS = ("B", "Tq", "Tk", "D", "H", "causal", "cross")


def parse_line(line):
    fields = {}
    for token in line.split():
        if "=" in token:
            k, v = token.split("=", 1)
            fields[k] = v
    return fields


def shape_label(s):
    b, tq, tk, d, h, causal, cross = s
    if cross:
        label = f"cross B{b} Tq{tq} Tk{tk} D{d} H{h}"
    else:
        label = f"B{b} T{tq} D{d} H{h}"
    return label + (" causal" if causal else "")


def read_peaks(path):
    peaks, isa = {}, "?"
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("peak_isa="):
                isa = line.split("=", 1)[1]
            elif line.startswith("peak_t") and "_gflops=" in line:
                k, v = line.split("=", 1)
                t = int(k[len("peak_t"):-len("_gflops")])
                peaks[t] = max(peaks.get(t, 0.0), float(v))  # best of the runs in the file
    return peaks, isa


def peak_for(peaks, threads):
    if threads in peaks:
        return peaks[threads]
    if 1 in peaks:
        return peaks[1] * threads  # not measured: assume linear scaling
    return float("nan")


def aggregate(raw_path):
    groups = collections.OrderedDict()
    with open(raw_path) as f:
        for line in f:
            r = parse_line(line)
            if "impl" not in r or "median_ms" not in r:
                continue
            shape = tuple(int(r[k]) for k in KEY_FIELDS)
            key = (r["kind"], shape, int(r["threads"]), r["impl"])
            groups.setdefault(key, []).append(r)
    result = {}
    for key, runs in groups.items():
        medians = [float(r["median_ms"]) for r in runs]
        variants = collections.Counter(r.get("variant", "") for r in runs)
        result[key] = {
            "rounds": len(runs),
            "median_ms": statistics.median(medians),
            "round_min_ms": min(medians),
            "round_max_ms": max(medians),
            "max_rss_mib": max(float(r["max_rss_mib"]) for r in runs),
            "base_rss_mib": statistics.median(float(r["base_rss_mib"]) for r in runs),
            "variant": variants.most_common(1)[0][0],
        }
    return result


def mha_flops(shape):
    """bench/bench_support.hpp's formula (useful FLOPs, matrix products only)."""
    b, tq, tk, d, h, causal, cross = shape
    if not causal:
        pairs = tq * tk
    elif tq <= tk:
        pairs = tq * (tq + 1) / 2
    else:
        pairs = tk * (tk + 1) / 2 + (tq - tk) * tk
    proj = 2.0 * b * tq * d * 3 * d if not cross else 2.0 * b * tq * d * d + 2.0 * b * tk * d * 2 * d
    return proj + 2.0 * b * tq * d * d + 4.0 * b * h * pairs * (d // h)


def fmt(x, spec):
    return "n/a" if x is None or x != x else format(x, spec)


def print_table(rows):
    headers = ["shape", "threads", "PyTorch ms", "attn ms", "speedup", "attn GFLOP/s",
               "% of FMA peak", "PyTorch peak RSS MiB", "attn peak RSS MiB", "PyTorch variant"]
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = [False] + [True] * 8 + [False]

    def line(r):
        return "| " + " | ".join(c.rjust(w) if rj else c.ljust(w)
                                 for c, w, rj in zip(r, widths, right)) + " |"
    print(line(headers))
    print("|" + "|".join(("-" * (w + 1) + ":") if rj else ("-" * (w + 2))
                         for w, rj in zip(widths, right)) + "|")
    for r in cells[1:]:
        print(line(r))


def plot(points, peak1, out_png, title_extra):
    """points: {impl: [(T, gflops)]} at 1 thread."""
    out_dir = os.path.dirname(os.path.abspath(out_png))
    dat = os.path.splitext(out_png)[0] + ".dat"
    ts = sorted({t for series in points.values() for t, _ in series})
    with open(dat, "w") as f:
        f.write("# T attn_gflops pytorch_gflops peak_gflops\n")
        for t in ts:
            a = dict(points.get("attn", [])).get(t, float("nan"))
            p = dict(points.get("pytorch", [])).get(t, float("nan"))
            f.write(f"{t} {a:.3f} {p:.3f} {peak1:.3f}\n")
    title = "attn vs PyTorch nn.MultiheadAttention: B1 D512 H8 float32, 1 thread"
    top = max([peak1] + [g for series in points.values() for _, g in series if g == g]) * 1.12
    if shutil.which("gnuplot"):
        script = f"""
set terminal pngcairo size 900,560 font ",11" noenhanced
set output "{out_png}"
set title "{title}\\n{title_extra}"
set xlabel "sequence length T (self-attention, not causal)"
set ylabel "useful GFLOP/s"
set logscale x 2
set xrange [{ts[0] / 1.4}:{ts[-1] * 1.4}]
set yrange [0:{top}]
set xtics ({", ".join(f'"{t}" {t}' for t in ts)})
set grid
set key bottom right
set datafile missing "nan"
plot {peak1} with lines dt 2 lw 2 lc rgb "#444444" title sprintf("measured FMA peak (%.0f GFLOP/s)", {peak1}), \\
     "{dat}" using 1:2 with linespoints pt 7 lw 2 lc rgb "#d62728" title "attn", \\
     "{dat}" using 1:3 with linespoints pt 5 lw 2 lc rgb "#1f77b4" title "PyTorch (best variant)"
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True, cwd=out_dir)
        return True
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: neither gnuplot nor matplotlib found; no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(9, 5.6))
    ax.axhline(peak1, ls="--", color="#444444", label=f"measured FMA peak ({peak1:.0f} GFLOP/s)")
    for impl, name, color, marker in (("attn", "attn", "#d62728", "o"),
                                      ("pytorch", "PyTorch (best variant)", "#1f77b4", "s")):
        series = sorted(points.get(impl, []))
        if series:
            ax.plot([t for t, _ in series], [g for _, g in series], marker=marker, color=color,
                    label=name)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, top)
    ax.set_xlabel("sequence length T (self-attention, not causal)")
    ax.set_ylabel("useful GFLOP/s")
    ax.set_title(f"{title}\n{title_extra}", fontsize=10)
    ax.grid(True)
    ax.legend(loc="lower right")
    fig.savefig(out_png, dpi=100)
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raw", required=True)
    p.add_argument("--peak", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--plot", required=True)
    p.add_argument("--title-extra", default="")
    a = p.parse_args()

    peaks, isa = read_peaks(a.peak)
    agg = aggregate(a.raw)

    # ---- the table: every (shape, threads) of kind=main, in run order ----
    rows, speedups, fractions, csv_rows = [], [], [], []
    seen = []
    for (kind, shape, threads, _impl) in agg:
        if (kind, shape, threads) not in seen:
            seen.append((kind, shape, threads))
    for kind, shape, threads in seen:
        at = agg.get((kind, shape, threads, "attn"))
        pt = agg.get((kind, shape, threads, "pytorch"))
        flops = mha_flops(shape)
        peak = peak_for(peaks, threads)
        for impl, r in (("attn", at), ("pytorch", pt)):
            if r is None:
                continue
            gflops = flops / (r["median_ms"] * 1e-3) * 1e-9
            csv_rows.append({
                "kind": kind, "shape": shape_label(shape),
                **dict(zip(KEY_FIELDS, shape)), "threads": threads, "impl": impl,
                "rounds": r["rounds"], "median_ms": f"{r['median_ms']:.4f}",
                "round_min_ms": f"{r['round_min_ms']:.4f}",
                "round_max_ms": f"{r['round_max_ms']:.4f}", "gflop": f"{flops * 1e-9:.4f}",
                "gflops": f"{gflops:.2f}", "peak_gflops": f"{peak:.1f}",
                "peak_fraction": f"{gflops / peak:.4f}",
                "max_rss_mib": f"{r['max_rss_mib']:.1f}",
                "base_rss_mib": f"{r['base_rss_mib']:.1f}", "variant": r["variant"]})
        if kind != "main" or at is None:
            continue
        a_gflops = flops / (at["median_ms"] * 1e-3) * 1e-9
        frac = a_gflops / peak
        fractions.append(frac)
        speedup = pt["median_ms"] / at["median_ms"] if pt else float("nan")
        if pt:
            speedups.append(speedup)
        rows.append([shape_label(shape), threads, fmt(pt and pt["median_ms"], ".2f"),
                     fmt(at["median_ms"], ".2f"), fmt(speedup, ".2f") + "x", fmt(a_gflops, ".1f"),
                     fmt(100 * frac, ".1f") + "%", fmt(pt and pt["max_rss_mib"], ".0f"),
                     fmt(at["max_rss_mib"], ".0f"), pt["variant"] if pt else "n/a"])

    with open(a.csv, "w", newline="") as f:
        fields = ["kind", "shape", *KEY_FIELDS, "threads", "impl", "rounds", "median_ms",
                  "round_min_ms", "round_max_ms", "gflop", "gflops", "peak_gflops",
                  "peak_fraction", "max_rss_mib", "base_rss_mib", "variant"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(csv_rows)

    peak_text = ", ".join(f"{t} thread{'s' if t > 1 else ''}: {g:.1f}" for t, g in sorted(peaks.items()))
    print(f"measured FMA peak ({isa}, GFLOP/s): {peak_text}")
    print()
    print_table(rows)
    print()
    print("PyTorch ms / attn ms: median over rounds of each process's median call time; "
          "GFLOP/s counts useful FLOPs (bench/bench_support.hpp); peak RSS is ru_maxrss of the "
          "whole process (PyTorch's includes the interpreter and libtorch, about "
          + fmt(statistics.median([r["base_rss_mib"] for k, r in agg.items() if k[3] == "pytorch"])
                if any(k[3] == "pytorch" for k in agg) else None, ".0f")
          + " MiB before any tensor exists).")

    # ---- the plot: GFLOP/s vs T at 1 thread (kind=sweep, plus matching kind=main shapes) ----
    points = collections.defaultdict(dict)
    for (kind, shape, threads, impl), r in agg.items():
        b, tq, tk, d, h, causal, cross = shape
        if threads == 1 and b == 1 and d == 512 and h == 8 and not causal and not cross:
            points[impl][tq] = mha_flops(shape) / (r["median_ms"] * 1e-3) * 1e-9
    plotted = bool(points) and plot({k: sorted(v.items()) for k, v in points.items()},
                                    peak_for(peaks, 1), a.plot, a.title_extra)
    print()
    # Paths relative to the repository, so the saved printout is true in any clone.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rel = lambda path: os.path.relpath(os.path.abspath(path), root)
    print(f"raw results: {rel(a.csv)}" + (f"; plot: {rel(a.plot)}" if plotted else "; no plot"))

    over = [f"{r['impl']} {r['shape']} threads={r['threads']}" for r in csv_rows
            if float(r["peak_fraction"]) > 1.0]
    if over:
        print()
        print("warning: above the measured FMA peak (the machine was busy while the peak was "
              "measured, or the peak probe is wrong): " + ", ".join(over))
    if speedups:
        print()
        print(f"summary: speedup_min={min(speedups):.2f} "
              f"speedup_median={statistics.median(speedups):.2f} "
              f"peak_fraction_best={max(fractions):.2f}")
    else:
        print("summary: no complete attn/PyTorch pair was measured", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
