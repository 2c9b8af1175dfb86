#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/types_reference.py: PyTorch 1.13's float/double <-> bfloat16/float16 conversions on
# chosen values, written as tests/fixtures/pytorch/types_reference.hpp for
# tests/tensor/types_pytorch_test.cpp.
"""Generate tests/fixtures/pytorch/types_reference.hpp.

Run with Debian's interpreter (a pyenv python3 earlier on PATH does not see torch):

    /usr/bin/python3 scripts/types_reference.py [--out tests/fixtures/pytorch/types_reference.hpp]

The inputs are chosen, not random only: signed zeros, infinities, NaNs with payloads (quiet
and signalling, both signs), float subnormals, every kind of tie and near-tie of both formats
(a tie, one float ulp either side), the overflow boundaries (bfloat16's largest finite value
plus half a unit; float16's 65504, 65519.996, 65520), float16's subnormal range and its
boundary with the normals, plus log-uniform random floats. Doubles add values within a tiny
distance of bfloat16/float16 ties, where rounding through float (PyTorch) and rounding once
differ; their correctly rounded results are computed here in exact rational arithmetic.

PyTorch 1.13 writes different NaN bits for float -> bfloat16 depending on the CPU capability
it dispatches to: c10::BFloat16's scalar rule gives 0x7FC0, its AVX2/AVX-512 tensor.to()
gives 0xFFFF. The script runs the conversions under ATEN_CPU_CAPABILITY=default (the scalar
rule, which attn follows) and under the machine's own capability, checks that they agree on
everything but NaNs, and stores both.
"""

import argparse
import fractions
import json
import math
import os
import random
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "pytorch", "types_reference.hpp")


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bits32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits64(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def f64(bits):
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


# ---- the inputs ----

def float_inputs():
    vals = set()
    nan_bits = [0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFF800001, 0x7FBFFFFF,
                0x7FFFFFFF, 0xFFFFFFFF, 0x7FA12345, 0xFFD23456, 0x7F808000, 0xFFC0FFFF]
    vals.update(nan_bits)
    vals.update([0x00000000, 0x80000000, 0x7F800000, 0xFF800000])
    # float subnormals and the smallest normals (bfloat16 has the same exponent range)
    for b in [0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x00018000, 0x00017FFF,
              0x0000FFFF, 0x00010000, 0x007F7FFF, 0x007F8000, 0x007FFFFF, 0x00800000,
              0x00807FFF, 0x00808000, 0x00818000]:
        vals.update([b, b | 0x80000000])
    # bfloat16: ties (low half 0x8000) with even and odd kept parts, one float ulp either side
    rng = random.Random(20240601)
    for _ in range(80):
        hi = rng.randrange(0, 0x7F80)
        for low in (0x7FFF, 0x8000, 0x8001, 0x0000, 0xFFFF):
            b = (hi << 16) | low
            vals.update([b, b | 0x80000000])
    # bfloat16 overflow: the largest finite value, and plus half a unit (a tie, to infinity)
    for b in [0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF]:
        vals.update([b, b | 0x80000000])
    # float16 ties (13 dropped bits: 0x1000) and near ties over its normal range
    for _ in range(80):
        e = rng.randrange(113, 143)  # float exponents of float16's normal range
        m = rng.randrange(0, 1 << 10) << 13
        for low in (0x0FFF, 0x1000, 0x1001, 0x0000, 0x1FFF):
            b = (e << 23) | m | low
            vals.update([b, b | 0x80000000])
    # float16's overflow boundary and largest values
    for x in [65504.0, 65505.0, 65519.0, 65520.0, 65536.0, 65535.99, 1e5, 3.4e38]:
        b = bits32(x)
        vals.update([b - 1, b, b + 1, b | 0x80000000])
    # float16 subnormals (below 2^-14): ties at odd multiples of 2^-25, and the boundary with
    # the normals
    for k in list(range(0, 64)) + [2045, 2046, 2047, 2048, 2049]:
        x = k * 2.0 ** -25
        if x == 0:
            continue
        b = bits32(x)
        vals.update([b - 1, b, b + 1, (b + 1) | 0x80000000, b | 0x80000000])
    for x in [2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 2.0 ** -26, 3 * 2.0 ** -26]:
        b = bits32(x)
        vals.update([b - 1, b, b + 1])
    # log-uniform random floats, both signs
    while len(vals) < 2500:
        x = math.copysign(2.0 ** rng.uniform(-140, 127), rng.choice([-1, 1]))
        vals.add(bits32(x))
    return sorted(vals)


def bfloat16_value(b):
    return f32(b << 16)


def float16_value(b):
    return float(struct.unpack("<e", struct.pack("<H", b))[0])


def double_inputs(floats):
    vals = set()
    rng = random.Random(7)
    # every fourth finite float input, exactly
    for b in floats[::4]:
        x = f32(b)
        if math.isfinite(x):
            vals.add(bits64(x))
    # bfloat16 and float16 ties with a tiny offset that a rounding to float erases
    for _ in range(100):
        lo = rng.randrange(0x0080, 0x7F7F)  # a positive normal bfloat16
        mid = (fractions.Fraction(bfloat16_value(lo)) + fractions.Fraction(bfloat16_value(lo + 1))) / 2
        for off in (-2.0 ** -40, 2.0 ** -40, 0.0):
            x = float(mid * (1 + fractions.Fraction(off)))
            vals.update([bits64(x), bits64(-x)])
    for _ in range(100):
        lo = rng.randrange(0x0001, 0x7BFF)  # a positive float16 (subnormals included)
        mid = (fractions.Fraction(float16_value(lo)) + fractions.Fraction(float16_value(lo + 1))) / 2
        for off in (-2.0 ** -35, 2.0 ** -35, 0.0):
            x = float(mid * (1 + fractions.Fraction(off)))
            vals.update([bits64(x), bits64(-x)])
    for x in [float("inf"), float("-inf"), 0.0, -0.0, 1e300, -1e300, 5e-324, 1e-310, 65519.999999,
              65520.0, 3.3961e38, 3.4e38]:
        vals.add(bits64(x))
    for b in [0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF]:
        vals.add(b)
    return sorted(vals)


def bfloat16_patterns():
    rng = random.Random(11)
    pats = set()
    for lo, hi in [(0, 0x90), (0x7F70, 0x7F90), (0x7FB0, 0x8090), (0xFF70, 0xFF90), (0xFFB0, 0x10000)]:
        pats.update(range(lo, hi))
    while len(pats) < 1000:
        pats.add(rng.randrange(0, 0x10000))
    return sorted(pats)


def float16_patterns():
    rng = random.Random(13)
    pats = set()
    for lo, hi in [(0, 0x40), (0x3F0, 0x410), (0x7BF0, 0x7C10), (0x7DF0, 0x7E10), (0x7FF0, 0x8040),
                   (0x83F0, 0x8410), (0xFBF0, 0xFC10), (0xFDF0, 0xFE10), (0xFFF0, 0x10000)]:
        pats.update(range(lo, hi))
    while len(pats) < 1200:
        pats.add(rng.randrange(0, 0x10000))
    return sorted(pats)


# ---- exact rounding (the correctly rounded double conversions) ----

def round_exact(x, mant_bits, exp_bits, values_cache={}):
    """Bits of the nearest value (ties to even) of the IEEE-style format, from the double x."""
    bias = (1 << (exp_bits - 1)) - 1
    if math.isnan(x):
        return None
    sign = (1 << (exp_bits + mant_bits)) if math.copysign(1.0, x) < 0 else 0
    a = fractions.Fraction(abs(x)) if math.isfinite(x) else None
    inf_bits = ((1 << exp_bits) - 1) << mant_bits
    if a is None:
        return sign | inf_bits
    unit = fractions.Fraction(2) ** (1 - bias - mant_bits)  # subnormal unit
    e = 1 - bias
    while a >= fractions.Fraction(2) ** (e + 1) and e < bias:
        e += 1
    ulp = unit if a < fractions.Fraction(2) ** (1 - bias) else fractions.Fraction(2) ** (e - mant_bits)
    q, r = divmod(a, ulp)
    q = int(q)
    if r * 2 > ulp or (r * 2 == ulp and q % 2 == 1):
        q += 1
    value = q * ulp
    max_finite = (2 - fractions.Fraction(2) ** -mant_bits) * fractions.Fraction(2) ** bias
    if value > max_finite:
        return sign | inf_bits
    if value < fractions.Fraction(2) ** (1 - bias):
        return sign | int(value / unit)
    e = 1 - bias
    while value >= fractions.Fraction(2) ** (e + 1):
        e += 1
    m = int((value / fractions.Fraction(2) ** e - 1) * (1 << mant_bits))
    return sign | ((e + bias) << mant_bits) | m


# ---- the PyTorch runs ----

def torch_results(floats, doubles, bf_pats, h_pats):
    import numpy as np
    import torch

    f = torch.from_numpy(np.array(floats, dtype=np.uint32).view(np.float32).copy())
    d = torch.from_numpy(np.array(doubles, dtype=np.uint64).view(np.float64).copy())
    bf = torch.from_numpy(np.array(bf_pats, dtype=np.uint16).view(np.int16).copy()).view(torch.bfloat16)
    h = torch.from_numpy(np.array(h_pats, dtype=np.uint16).view(np.int16).copy()).view(torch.float16)

    def u16(t):
        return [int(v) for v in t.contiguous().view(torch.int16).numpy().view(np.uint16)]

    def u32(t):
        return [int(v) for v in t.contiguous().numpy().view(np.uint32)]

    return {
        "version": torch.__version__,
        "capability": torch.__config__.show().split("CPU capability usage:")[1].split("\n")[0].strip(),
        "bf16_from_float": u16(f.to(torch.bfloat16)),
        "f16_from_float": u16(f.to(torch.float16)),
        "bf16_from_double": u16(d.to(torch.bfloat16)),
        "f16_from_double": u16(d.to(torch.float16)),
        "float_from_bf16": u32(bf.to(torch.float32)),
        "float_from_f16": u32(h.to(torch.float32)),
    }


def run_child(capability, inputs):
    env = dict(os.environ)
    if capability is None:
        env.pop("ATEN_CPU_CAPABILITY", None)
    else:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(inputs),
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def is_nan32(b):
    return (b & 0x7FFFFFFF) > 0x7F800000


def is_nan64(b):
    return (b & 0x7FFFFFFFFFFFFFFF) > 0x7FF0000000000000


def c_array(ctype, name, values, width, per_line):
    lines = [f"inline constexpr {ctype} {name}[] = {{"]
    for i in range(0, len(values), per_line):
        chunk = ", ".join(f"0x{v:0{width}X}" for v in values[i:i + per_line])
        lines.append(f"    {chunk},")
    lines.append("};")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        inputs = json.loads(sys.stdin.read())
        print(json.dumps(torch_results(**inputs)))
        return

    floats = float_inputs()
    doubles = double_inputs(floats)
    inputs = {"floats": floats, "doubles": doubles, "bf_pats": bfloat16_patterns(),
              "h_pats": float16_patterns()}
    scalar = run_child("default", inputs)
    native = run_child(None, inputs)

    # The capabilities agree on everything but the NaN bits of float/double -> bfloat16.
    for key in scalar:
        if key in ("version", "capability"):
            continue
        for i, (a, b) in enumerate(zip(scalar[key], native[key])):
            if a == b:
                continue
            source = floats[i] if key.endswith("float") else doubles[i] if key.endswith("double") else None
            nan = source is not None and (is_nan32(source) if key.endswith("float") else is_nan64(source))
            assert key.startswith("bf16_from") and nan, (key, i, hex(a), hex(b))

    # Correctly rounded double conversions, in exact arithmetic.
    exact_bf16, exact_f16 = [], []
    for b in doubles:
        x = f64(b)
        exact_bf16.append(0x7FC0 if math.isnan(x) else round_exact(x, 7, 8))
        exact_f16.append((0xFE00 if b >> 63 else 0x7E00) if math.isnan(x) else round_exact(x, 10, 5))
    double_rounded = sum(a != b for a, b in zip(exact_bf16, scalar["bf16_from_double"]))
    double_rounded_f16 = sum(a != b for a, b in zip(exact_f16, scalar["f16_from_double"]))

    header = f"""// SPDX-License-Identifier: MIT
// tests/fixtures/pytorch/types_reference.hpp: PyTorch's float/double <-> bfloat16/float16
// conversions on chosen values, for tests/tensor/types_pytorch_test.cpp.
// Generated by scripts/types_reference.py; do not edit.
// PyTorch {scalar['version']}; *Scalar arrays under ATEN_CPU_CAPABILITY=default
// ({scalar['capability']}), *Native arrays under this machine's capability
// ({native['capability']}): they differ only in the NaN bits of float/double -> bfloat16.
// {double_rounded} of the {len(doubles)} doubles round differently to bfloat16 through float
// (PyTorch) than once (kBf16FromDoubleExact); {double_rounded_f16} to float16.
// clang-format off
#pragma once

#include <cstdint>

namespace attn::test::pytorch {{

/// Float inputs (bits) and torch.tensor(x).to(torch.bfloat16 / torch.float16) (bits).
{c_array("std::uint32_t", "kFloatInputs", floats, 8, 8)}
{c_array("std::uint16_t", "kBf16FromFloatScalar", scalar["bf16_from_float"], 4, 12)}
{c_array("std::uint16_t", "kBf16FromFloatNative", native["bf16_from_float"], 4, 12)}
{c_array("std::uint16_t", "kF16FromFloat", scalar["f16_from_float"], 4, 12)}

/// Double inputs (bits), torch's x.to(torch.bfloat16 / torch.float16) (through float), and the
/// correctly rounded results (exact rational arithmetic; NaN as attn writes it).
{c_array("std::uint64_t", "kDoubleInputs", doubles, 16, 4)}
{c_array("std::uint16_t", "kBf16FromDoubleScalar", scalar["bf16_from_double"], 4, 12)}
{c_array("std::uint16_t", "kF16FromDouble", scalar["f16_from_double"], 4, 12)}
{c_array("std::uint16_t", "kBf16FromDoubleExact", exact_bf16, 4, 12)}
{c_array("std::uint16_t", "kF16FromDoubleExact", exact_f16, 4, 12)}

/// bfloat16 and float16 bit patterns and torch's .to(torch.float32) (bits).
{c_array("std::uint16_t", "kBf16Patterns", inputs["bf_pats"], 4, 12)}
{c_array("std::uint32_t", "kFloatFromBf16", scalar["float_from_bf16"], 8, 8)}
{c_array("std::uint16_t", "kF16Patterns", inputs["h_pats"], 4, 12)}
{c_array("std::uint32_t", "kFloatFromF16", scalar["float_from_f16"], 8, 8)}

}}  // namespace attn::test::pytorch
"""
    with open(args.out, "w") as out:
        out.write(header)
    print(f"wrote {args.out}: {len(floats)} floats, {len(doubles)} doubles, "
          f"{double_rounded} + {double_rounded_f16} double-rounding differences; torch "
          f"{scalar['version']}, capabilities {scalar['capability']} / {native['capability']}")


if __name__ == "__main__":
    main()
