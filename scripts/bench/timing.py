# SPDX-License-Identifier: MIT
# scripts/bench/timing.py: the measuring loop of the PyTorch benchmark scripts
# (pytorch_mha.py, pytorch_decode.py), written once.
import statistics
import sys
import time


def time_variants(torch, available, names, warmup, reps, max_seconds, output=lambda n, y: y,
                  atol=1e-4, rtol=1e-3):
    """Times the callables available[n] for n in names under torch.inference_mode().

    Each variant first runs `warmup` untimed calls (at least 1) and its result,
    output(n, result), is checked against the first variant's (a warning on stderr when they
    disagree by more than atol + rtol |reference|). Then the variants run interleaved, so machine noise hits them alike, up to
    `reps` rounds, stopping early once they spent max_seconds each (after 3 rounds).
    Returns {name: [milliseconds per call]}."""
    times = {n: [] for n in names}
    with torch.inference_mode():
        reference = None
        for n in names:
            for _ in range(max(1, warmup)):
                y = available[n]()
            y = output(n, y)
            if reference is None:
                reference = y
            elif not torch.allclose(y.float(), reference.float(), atol=atol, rtol=rtol):
                err = (y - reference).abs().max().item()
                print(f"warning: variant {n} differs from {names[0]} by {err:g}", file=sys.stderr)
        total = 0.0
        for _ in range(max(1, reps)):
            for n in names:
                t0 = time.perf_counter()
                available[n]()
                dt = time.perf_counter() - t0
                times[n].append(dt * 1e3)
                total += dt
            if total >= max_seconds * len(names) and len(times[names[0]]) >= 3:
                break
    return times


def medians(times):
    return {n: statistics.median(ts) for n, ts in times.items()}
