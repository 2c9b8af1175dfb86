#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/report.py: turns the raw lines of scripts/bench_vs_pytorch.sh (one per
# mha_timer / ort_mha.js / pytorch_mha.py process) into the comparison table, the summary
# line, the CSV and the GFLOP/s-vs-T plot. Standard library only; the plot uses gnuplot
# (gnuplot-nox) or, without it, matplotlib.
#
# Usage: report.py --raw RAW --peak PEAK --csv OUT.csv --plot OUT.png [--title-extra TEXT]
#                  [--ort-note WHY] [--bf16-note WHY]
#   RAW:  lines "kind=main|sweep round=N impl=attn|attn_native|ort|pytorch B=.. Tq=.. ...
#         median_ms=.. ..." (attn: the default-flags build, attn_native: -march=native;
#         attn_bf16 and pytorch_bf16: the bfloat16 modules, some rounds at 1 thread), and
#         "kind=select ..." lines of the ONNX Runtime process that chose the graph per shape
#         and thread count (variant= per graph that passed, skipped= per graph that did not)
#   PEAK: bench/fma_peak's output (peak_t<N>_gflops=..., peak_isa=..., and where the CPU
#         has them amx_bf16_t<N>_gflops= and avx512bf16_t<N>_gflops=)
#   --ort-note: why there are no ONNX Runtime rows (printed instead of its figures)
#   --bf16-note: why there are no bfloat16 rows
# Per (kind, shape, threads, impl): the median over rounds of each process's median time
# ("median of medians"); peak RSS is the largest over rounds. Ratios are times divided by
# attn's (default-flags build): vs PyTorch = PyTorch ms / attn ms, vs ORT = ORT ms / attn ms;
# default/native = native ms / default ms (1.00: the default build is as fast as native).
# % of peak = attn (default-flags) GFLOP/s / the measured FMA peak at the same thread count.
# The bfloat16 table: per shape at 1 thread, attn's bfloat16 module against its float one and
# PyTorch's bfloat16 module timed in the same rounds (ratios: the median over those rounds of
# the same round's time ratio), and ONNX Runtime's float32 time of the float table (all its
# rounds) as the reference; % of bf16 peak = attn bfloat16 GFLOP/s / the tdpbf16ps peak (AMX)
# where fma_peak measured one, else the vdpbf16ps peak, else n/a.
# Fields on a result line that the report does not know (e.g. mha_timer's isa=) are kept
# in the CSV where a column exists for them and ignored otherwise.

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
    """The FMA peak per thread count, its ISA, and the bfloat16 units' peaks per thread count,
    {"amx_bf16": {t: gflops}, "avx512bf16": {t: gflops}} (the best of the runs in the file)."""
    peaks, isa, bf16 = {}, "?", {"amx_bf16": {}, "avx512bf16": {}}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("peak_isa="):
                isa = line.split("=", 1)[1]
            elif "_t" in line and line.split("_t", 1)[0] in ("peak", *bf16) and "_gflops=" in line:
                k, v = line.split("=", 1)
                unit, t = k[:-len("_gflops")].rsplit("_t", 1)
                table = peaks if unit == "peak" else bf16[unit]
                table[int(t)] = max(table.get(int(t), 0.0), float(v))
    return peaks, isa, bf16


# The bfloat16 units, in the order the bf16 peak fraction prefers them: (fma_peak's name, text).
BF16_UNITS = (("amx_bf16", "AMX tdpbf16ps"), ("avx512bf16", "AVX512-BF16 vdpbf16ps"))


def bf16_peak(bf16_peaks, threads):
    """(GFLOP/s, unit text) of the first bfloat16 unit fma_peak measured at `threads`, or
    (nan, None)."""
    for unit, text in BF16_UNITS:
        if threads in bf16_peaks[unit]:
            return bf16_peaks[unit][threads], text
    return float("nan"), None


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
            if "impl" not in r or "median_ms" not in r or r.get("kind") == "select":
                continue
            shape = tuple(int(r[k]) for k in KEY_FIELDS)
            key = (r["kind"], shape, int(r["threads"]), r["impl"])
            groups.setdefault(key, []).append(r)
    result = {}
    for key, runs in groups.items():
        medians = [float(r["median_ms"]) for r in runs]
        variants = collections.Counter(r.get("variant", "") for r in runs)
        result[key] = {
            "by_round": {r.get("round"): float(r["median_ms"]) for r in runs},
            "bf16_path": collections.Counter(r.get("bf16_path", "") for r in runs).most_common(1)[0][0],
            "rounds": len(runs),
            "median_ms": statistics.median(medians),
            "round_min_ms": min(medians),
            "round_max_ms": max(medians),
            "max_rss_mib": max(float(r["max_rss_mib"]) for r in runs),
            "base_rss_mib": statistics.median(float(r["base_rss_mib"]) for r in runs),
            "variant": variants.most_common(1)[0][0],
            "isa": collections.Counter(r.get("isa", "") for r in runs).most_common(1)[0][0],
        }
    return result


def ort_selection(raw_path):
    """{(shape, threads): {"times": {graph: ms}, "skipped": {graph: reason}, "best": graph}}
    from the kind=select lines (one ONNX Runtime process per shape and thread count)."""
    sel = collections.OrderedDict()
    with open(raw_path) as f:
        for line in f:
            if not line.startswith("kind=select "):
                continue
            r = parse_line(line)
            try:
                key = (tuple(int(r[k]) for k in KEY_FIELDS), int(r["threads"]))
            except (KeyError, ValueError):
                continue
            entry = sel.setdefault(key, {"times": {}, "skipped": {}, "best": None})
            if "skipped" in r:
                reason = line.split('reason="', 1)[1].rsplit('"', 1)[0] if 'reason="' in line else "?"
                entry["skipped"][r["skipped"]] = reason
            elif "impl" in r:
                entry["best"] = r.get("variant")
            elif "variant" in r and "median_ms" in r:
                entry["times"][r["variant"]] = float(r["median_ms"])
    return sel


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


def fmt(x, spec, suffix=""):
    return "n/a" if x is None or x != x else format(x, spec) + suffix


# The implementations, in table and plot order: (impl key, name in the table and plot).
IMPLS = (("pytorch", "PyTorch"), ("ort", "ORT"), ("attn", "attn"), ("attn_native", "attn native"))
BF16_IMPLS = (("pytorch_bf16", "PyTorch bf16"), ("attn_bf16", "attn bf16"))
PLOT_STYLE = {  # gnuplot / matplotlib: colour, gnuplot point type, matplotlib marker, label
    "attn": ("#d62728", 7, "o", "attn (default flags)"),
    "attn_native": ("#ff9896", 9, "^", "attn (-march=native)"),
    "ort": ("#2ca02c", 13, "D", "ONNX Runtime 1.30 (best graph)"),
    "pytorch": ("#1f77b4", 5, "s", "PyTorch (best variant)"),
}


def print_table(headers, rows, left_columns):
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = [i not in left_columns for i in range(len(headers))]

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
    impls = [i for i, _ in IMPLS if points.get(i)]
    with open(dat, "w") as f:
        f.write("# T " + " ".join(f"{i}_gflops" for i in impls) + " peak_gflops\n")
        for t in ts:
            vals = [dict(points[i]).get(t, float("nan")) for i in impls]
            f.write(f"{t} " + " ".join(f"{v:.3f}" for v in vals) + f" {peak1:.3f}\n")
    title = "MHA forward, B1 D512 H8 float32, 1 thread: attn vs ONNX Runtime vs PyTorch"
    top = max([peak1] + [g for series in points.values() for _, g in series if g == g]) * 1.12
    if shutil.which("gnuplot"):
        series = ", \\\n     ".join(
            f'"{dat}" using 1:{col + 2} with linespoints pt {PLOT_STYLE[i][1]} lw 2 '
            f'lc rgb "{PLOT_STYLE[i][0]}" title "{PLOT_STYLE[i][3]}"'
            for col, i in enumerate(impls))
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
     {series}
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
    for impl in impls:
        color, _, marker, name = PLOT_STYLE[impl]
        series = sorted(points[impl])
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


def ratio(num, den):
    """num's median time / den's (how many times faster den is); NaN when either is missing."""
    return num["median_ms"] / den["median_ms"] if num and den else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raw", required=True)
    p.add_argument("--peak", required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--plot", required=True)
    p.add_argument("--title-extra", default="")
    p.add_argument("--ort-note", default="")
    p.add_argument("--bf16-note", default="")
    a = p.parse_args()

    peaks, isa, bf16_peaks = read_peaks(a.peak)
    agg = aggregate(a.raw)
    selection = ort_selection(a.raw)

    # ---- the table: every (shape, threads) of kind=main, in run order ----
    rows, csv_rows = [], []
    speedups, fractions, ort_speedups, native_ratios, native_ort = [], [], [], [], []
    seen = []
    for (kind, shape, threads, _impl) in agg:
        if (kind, shape, threads) not in seen:
            seen.append((kind, shape, threads))
    for kind, shape, threads in seen:
        r = {impl: agg.get((kind, shape, threads, impl)) for impl, _ in IMPLS}
        flops = mha_flops(shape)
        for impl, _ in IMPLS + BF16_IMPLS:
            m = agg.get((kind, shape, threads, impl))
            if m is None:
                continue
            # bfloat16 rows against the bfloat16 unit's peak, the others against the FMA's
            peak, peak_unit = ((bf16_peak(bf16_peaks, threads)) if impl.endswith("_bf16")
                               else (peak_for(peaks, threads), "FMA"))
            gflops = flops / (m["median_ms"] * 1e-3) * 1e-9
            csv_rows.append({
                "kind": kind, "shape": shape_label(shape),
                **dict(zip(KEY_FIELDS, shape)), "threads": threads, "impl": impl,
                "rounds": m["rounds"], "median_ms": f"{m['median_ms']:.4f}",
                "round_min_ms": f"{m['round_min_ms']:.4f}",
                "round_max_ms": f"{m['round_max_ms']:.4f}", "gflop": f"{flops * 1e-9:.4f}",
                "gflops": f"{gflops:.2f}", "peak_gflops": f"{peak:.1f}",
                "peak_fraction": f"{gflops / peak:.4f}",
                "max_rss_mib": f"{m['max_rss_mib']:.1f}",
                "base_rss_mib": f"{m['base_rss_mib']:.1f}", "variant": m["variant"],
                "isa": m["isa"], "peak_unit": peak_unit or "", "bf16_path": m["bf16_path"]})
        peak = peak_for(peaks, threads)
        at = r["attn"]
        if kind != "main" or at is None:
            continue
        a_gflops = flops / (at["median_ms"] * 1e-3) * 1e-9
        frac = a_gflops / peak
        fractions.append(frac)
        vs_pt, vs_ort = ratio(r["pytorch"], at), ratio(r["ort"], at)
        vs_native = ratio(r["attn_native"], at)
        for value, bucket in ((vs_pt, speedups), (vs_ort, ort_speedups), (vs_native, native_ratios),
                              (ratio(r["ort"], r["attn_native"]), native_ort)):
            if value == value:
                bucket.append(value)
        ms = lambda impl: fmt(r[impl] and r[impl]["median_ms"], ".2f")
        rss = lambda impl: fmt(r[impl] and r[impl]["max_rss_mib"], ".0f")
        rows.append([shape_label(shape), threads, ms("pytorch"), ms("ort"), ms("attn"),
                     ms("attn_native"), fmt(vs_pt, ".2f", "x"), fmt(vs_ort, ".2f", "x"),
                     fmt(vs_native, ".2f"), fmt(a_gflops, ".1f"), fmt(100 * frac, ".1f", "%"),
                     rss("pytorch"), rss("ort"), rss("attn"),
                     r["pytorch"]["variant"] if r["pytorch"] else "n/a",
                     r["ort"]["variant"] if r["ort"] else "n/a"])

    with open(a.csv, "w", newline="") as f:
        fields = ["kind", "shape", *KEY_FIELDS, "threads", "impl", "rounds", "median_ms",
                  "round_min_ms", "round_max_ms", "gflop", "gflops", "peak_gflops",
                  "peak_fraction", "max_rss_mib", "base_rss_mib", "variant", "isa",
                  "peak_unit", "bf16_path"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(csv_rows)

    peak_text = ", ".join(f"{t} thread{'s' if t > 1 else ''}: {g:.1f}" for t, g in sorted(peaks.items()))
    print(f"measured FMA peak ({isa}, GFLOP/s): {peak_text}")
    print()
    print_table(["shape", "threads", "PyTorch ms", "ORT ms", "attn ms", "attn native ms",
                 "vs PyTorch", "vs ORT", "default/native", "attn GFLOP/s", "% of FMA peak",
                 "PyTorch peak RSS MiB", "ORT peak RSS MiB", "attn peak RSS MiB",
                 "PyTorch variant", "ORT graph"], rows, left_columns={0, 14, 15})
    print()
    base = lambda impl: fmt(statistics.median([m["base_rss_mib"] for k, m in agg.items() if k[3] == impl])
                            if any(k[3] == impl for k in agg) else None, ".0f")
    print("attn = the default-flags build (-DATTN_NATIVE=OFF), attn native = -march=native. "
          "ms: median over rounds of each process's median call time. vs PyTorch = PyTorch ms / "
          "attn ms, vs ORT = ORT ms / attn ms, default/native = attn native ms / attn ms. "
          "GFLOP/s counts useful FLOPs (bench/bench_support.hpp), attn's from the default-flags "
          "build. Peak RSS is ru_maxrss of the whole process (PyTorch's includes the interpreter "
          f"and libtorch, about {base('pytorch')} MiB before any tensor exists"
          + (f"; ORT's node and the ONNX Runtime library, about {base('ort')} MiB"
             if any(k[3] == "ort" for k in agg) else "") + ").")

    isas = {impl: sorted({m["isa"] for k, m in agg.items() if k[3] == impl and m["isa"]})
            for impl in ("attn", "attn_native")}
    if any(isas.values()):
        print("attn's kernels (mha_timer's isa=): default-flags build "
              f"{', '.join(isas['attn']) or '?'}, native build {', '.join(isas['attn_native']) or '?'}.")

    # ---- ONNX Runtime: which graphs ran, and how fast, per shape and thread count ----
    print()
    if a.ort_note:
        print(f"ONNX Runtime: no figures ({a.ort_note}).")
    elif selection:
        print("ONNX Runtime graphs (one process per row checks each against nn.MultiheadAttention "
              "and times those that pass, one after the other; the fastest is the one timed in the "
              "rounds above):")
        for (shape, threads), e in selection.items():
            timed = ", ".join(f"{g} {ms:.2f} ms" + (" (best)" if g == e["best"] else "")
                              for g, ms in e["times"].items()) or "none ran"
            skipped = "; ".join(f"{g}: {why}" for g, why in e["skipped"].items())
            print(f"  {shape_label(shape)}, {threads} thread{'s' if threads > 1 else ''}: {timed}"
                  + (f"; skipped {skipped}" if skipped else ""))

    # ---- bfloat16: attn's and PyTorch's bfloat16 modules, ONNX Runtime float32 as reference ----
    bf16_rows, bf16_vs_fp32, bf16_vs_torch, bf16_fractions = [], [], [], []
    for kind, shape, threads in seen:
        r = {impl: agg.get((kind, shape, threads, impl))
             for impl in ("attn", "ort", "attn_bf16", "pytorch_bf16")}
        b16 = r["attn_bf16"]
        if kind != "main" or b16 is None:
            continue

        def paired(num):
            """The median over the rounds that timed both of num's time / attn bf16's."""
            if num is None:
                return float("nan")
            ratios = [num["by_round"][k] / ms for k, ms in b16["by_round"].items()
                      if k in num["by_round"]]
            return statistics.median(ratios) if ratios else float("nan")
        vs_fp32, vs_torch = paired(r["attn"]), paired(r["pytorch_bf16"])
        vs_ort = ratio(r["ort"], b16)
        peak16, _ = bf16_peak(bf16_peaks, threads)
        g16 = mha_flops(shape) / (b16["median_ms"] * 1e-3) * 1e-9
        for value, bucket in ((vs_fp32, bf16_vs_fp32), (vs_torch, bf16_vs_torch),
                              (g16 / peak16, bf16_fractions)):
            if value == value:
                bucket.append(value)
        ms = lambda impl: fmt(r[impl] and r[impl]["median_ms"], ".2f")
        rss = lambda impl: fmt(r[impl] and r[impl]["max_rss_mib"], ".0f")
        bf16_rows.append([shape_label(shape), threads, b16["rounds"], ms("pytorch_bf16"),
                          ms("ort"), ms("attn"), ms("attn_bf16"), fmt(vs_fp32, ".2f", "x"),
                          fmt(vs_torch, ".2f", "x"), fmt(vs_ort, ".2f", "x"), fmt(g16, ".1f"),
                          fmt(100 * g16 / peak16, ".1f", "%"), rss("pytorch_bf16"),
                          rss("attn_bf16"), b16["bf16_path"] or "?",
                          r["pytorch_bf16"]["variant"] if r["pytorch_bf16"] else "n/a"])
    print()
    # Why a bfloat16 summary field is nan (none when it is not).
    bf16_why = {}
    if not bf16_rows:
        why = a.bf16_note or ("none measured (they run at 1 thread: is 1 in --threads?)")
        print(f"bfloat16: no rows: {why}.")
        for field in ("bf16_vs_fp32_min", "bf16_vs_torch_bf16_min", "bf16_peak_fraction_best"):
            bf16_why[field] = why
    else:
        peak16, unit16 = bf16_peak(bf16_peaks, 1)
        unit_text = (f"{unit16}, 1 thread: {peak16:.1f} GFLOP/s" if unit16 else
                     "none: fma_peak found neither AMX-BF16 nor AVX512-BF16")
        print(f"bfloat16 modules, 1 thread (attn: MultiHeadAttention<bfloat16>, frozen; PyTorch: "
              f"nn.MultiheadAttention after .to(torch.bfloat16)); bfloat16 peak ({unit_text}):")
        print()
        print_table(["shape", "threads", "rounds", "PyTorch bf16 ms", "ORT fp32 ms", "attn fp32 ms",
                     "attn bf16 ms", "bf16 vs fp32", "vs PyTorch bf16", "vs ORT fp32",
                     "attn bf16 GFLOP/s", "% of bf16 peak", "PyTorch bf16 peak RSS MiB",
                     "attn bf16 peak RSS MiB", "attn bf16 path", "PyTorch bf16 variant"],
                    bf16_rows, left_columns={0, 14, 15})
        print()
        print("bf16 vs fp32 = attn fp32 ms / attn bf16 ms and vs PyTorch bf16 = PyTorch bf16 ms / "
              "attn bf16 ms, each the median over the rounds that timed both of the same round's "
              "ratio; vs ORT fp32 = ONNX Runtime's float32 ms (the float table's) / attn bf16 ms; "
              "% of bf16 peak = attn bf16 GFLOP/s (useful FLOPs) / the bfloat16 peak above. "
              "attn bf16 path: how attn's bfloat16 GEMMs and attention multiply on this CPU "
              "(amx: tdpbf16ps tiles, dot: vdpbf16ps, widen: float FMAs on widened operands).")
        if not bf16_vs_fp32:
            bf16_why["bf16_vs_fp32_min"] = "no round timed both of attn's modules"
        if not bf16_vs_torch:
            bf16_why["bf16_vs_torch_bf16_min"] = "PyTorch's bfloat16 module gave no time (see the raw file)"
        if not bf16_fractions:
            bf16_why["bf16_peak_fraction_best"] = (
                "fma_peak measured no bfloat16 unit (no AMX-BF16, no AVX512-BF16): attn's "
                "bfloat16 ran on the " + (bf16_rows[0][14] if bf16_rows else "?") + " path")

    # ---- the plot: GFLOP/s vs T at 1 thread (kind=sweep, plus matching kind=main shapes) ----
    points = collections.defaultdict(dict)
    for (kind, shape, threads, impl), m in agg.items():
        b, tq, tk, d, h, causal, cross = shape
        if impl in PLOT_STYLE and threads == 1 and b == 1 and d == 512 and h == 8 and not causal and not cross:
            points[impl][tq] = mha_flops(shape) / (m["median_ms"] * 1e-3) * 1e-9
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
    if not speedups:
        print("summary: no complete attn/PyTorch pair was measured", file=sys.stderr)
        return 1
    mn = lambda xs: fmt(min(xs) if xs else None, ".2f")
    print()
    print("summary fields, all from the default-flags attn build (what a consumer gets) unless "
          "named: speedup_min / speedup_median = PyTorch ms / attn ms over the rows; "
          "peak_fraction_best = attn GFLOP/s / FMA peak, best row; ort_speedup_min = ORT ms / "
          "attn ms, worst row; default_vs_native_min = attn native ms / attn ms, worst row "
          f"(native build vs ORT, worst row: {mn(native_ort)})."
          + ("" if ort_speedups else f" No ONNX Runtime rows: {a.ort_note or 'none measured'}."))
    print("bfloat16 summary fields (1 thread): bf16_vs_fp32_min = attn fp32 ms / attn bf16 ms, "
          "worst row; bf16_vs_torch_bf16_min = PyTorch bf16 ms / attn bf16 ms, worst row; "
          "bf16_peak_fraction_best = attn bf16 GFLOP/s / the bfloat16 peak, best row."
          + "".join(f" {k}=nan: {why}." for k, why in bf16_why.items()))
    # (the bfloat16 fields: nan when missing, as the sections' fields are)
    lo = lambda xs: f"{min(xs):.2f}" if xs else "nan"
    hi = lambda xs: f"{max(xs):.2f}" if xs else "nan"
    print(f"summary: speedup_min={min(speedups):.2f} "
          f"speedup_median={statistics.median(speedups):.2f} "
          f"peak_fraction_best={max(fractions):.2f} "
          f"ort_speedup_min={mn(ort_speedups)} default_vs_native_min={mn(native_ratios)} "
          f"bf16_vs_fp32_min={lo(bf16_vs_fp32)} bf16_vs_torch_bf16_min={lo(bf16_vs_torch)} "
          f"bf16_peak_fraction_best={hi(bf16_fractions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
