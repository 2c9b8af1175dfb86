#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/onnx/make_cases.py: makes the ONNX `Attention` fixtures in tests/fixtures/onnx,
# the cases `attn_run --format onnx` is checked against. Run by scripts/onnx/regenerate.sh
# in two steps around scripts/onnx/run_ort.js:
#
#   /usr/bin/python3 scripts/onnx/make_cases.py make   --out tests/fixtures/onnx --work DIR
#   node scripts/onnx/run_ort.js --ort ORT_DIR --cases tests/fixtures/onnx --work DIR
#   /usr/bin/python3 scripts/onnx/make_cases.py finish --out tests/fixtures/onnx --work DIR
#
# make    draws the cases (fixed seed: the same files every run), and writes per case
#         OUT/caseNNN/inputs.safetensors   the operator's inputs under its own names and layouts
#                                          (Q, K, V, attn_mask, past_key, past_value,
#                                          nonpad_kv_seqlen; F32, BOOL, I64)
#         OUT/caseNNN/case.json            the attributes, the attn_run flags, the features
#         DIR/caseNNN/model.onnx           a one-node graph: Attention, domain ai.onnx, opset
#                                          23 or 24 (not committed: made again from case.json)
# run_ort runs every model in ONNX Runtime 1.30 (CPU) and writes OUT/caseNNN/ort.safetensors,
#         or the error it raised to DIR/caseNNN/ort_status.json.
# finish  computes the operator's definition in float64 (scripts/onnx/reference.py), writes
#         OUT/caseNNN/expected.safetensors (float32), records in case.json how far ONNX Runtime
#         is from it, writes OUT/index.json and prints the summary.
#
# Needs Debian's python3-numpy and python3-onnx (1.12, which predates Attention-23: the
# model is put together with onnx.helper and never passed to the checker).

import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
import safetensors_np as st  # noqa: E402

SEED = 20240623
N_RANDOM = 150
RANDOM_CASE_BYTES = 14000  # bound on one random case's inputs + outputs (fixtures stay small)
IR_VERSION = 11  # the IR version that came with opset 23

SCALES = ["0.05", "0.1", "0.125", "0.25", "0.3", "0.5", "1", "2"]
SOFTCAPS = ["1", "2.5", "5", "10", "30"]
PRECISION_NAMES = {1: "FLOAT", 10: "FLOAT16", 11: "DOUBLE", 16: "BFLOAT16"}
# How close ONNX Runtime's float32 result must be to the float64 definition to count as
# agreeing: |ort - spec| <= ATOL + RTOL |spec| elementwise, and the same infinities.
ATOL = 1e-4
RTOL = 1e-4


# ---------------------------------------------------------------------------------------
# Case description. A case is a dict:
#   opset 23|24, layout "3d"|"4d", B, Sq, Skv, P (None: no past), Hq, Hkv, hd, vhd,
#   mask None | {"dtype": "bool"|"float", "shape": [...], "dead_rows": int, "neg_inf": float},
#   nonpad None | [ints], attrs {is_causal, scale (str), softcap (str),
#   qk_matmul_output_mode, softmax_precision} (absent = attribute not set),
#   error: None | "why the operator refuses it", override {input name: shape} (a shape the
#   other fields would not give, for the refusals).
# ---------------------------------------------------------------------------------------


def write_json(path, obj):
    """JSON with one key per line and short lists of numbers or strings kept on one line."""
    text = json.dumps(obj, indent=1)
    text = re.sub(r'\[\s+([^\[\]{}]*?)\s+\]',
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",\n")) + "]", text)
    assert json.loads(text) == obj
    with open(path, "w") as f:
        f.write(text + "\n")


def base(**kw):
    c = {"opset": 23, "layout": "4d", "B": 1, "Sq": 4, "Skv": 4, "P": None, "Hq": 2, "Hkv": 2,
         "hd": 8, "vhd": 8, "mask": None, "nonpad": None, "attrs": {}, "error": None,
         "override": {}, "note": ""}
    c.update(kw)
    return c


def total(c):
    return (c["P"] or 0) + c["Skv"]


def mask_shape(rng, c, rank, last):
    """A random mask shape of the rank: batch and head axes 1 or full, the query axis
    mostly full (ONNX Runtime refuses a mask that broadcasts over the queries)."""
    full = [c["B"], c["Hq"], c["Sq"], last]
    shape = full[4 - rank:]
    out = [s if rng.random() < 0.6 else 1 for s in shape[:-2]]
    out.append(shape[-2] if rng.random() < 0.9 else 1)
    out.append(shape[-1])
    return out


def case_bytes(c):
    """About how many bytes a case's three safetensors files hold."""
    B, Sq, Skv, Hq, Hkv, hd, vhd = (c[k] for k in ("B", "Sq", "Skv", "Hq", "Hkv", "hd", "vhd"))
    T = total(c)
    n_in = B * (Sq * Hq * hd + Skv * Hkv * (hd + vhd) + ((c["P"] or 0) * Hkv * (hd + vhd)))
    n_out = B * Sq * Hq * vhd + (B * Hkv * T * (hd + vhd) if c["P"] is not None else 0)
    if "qk_matmul_output_mode" in c["attrs"]:
        n_out += B * Hq * Sq * T
    mask = int(np.prod(c["mask"]["shape"])) * (1 if c["mask"]["dtype"] == "bool" else 4) if c["mask"] else 0
    return 4 * n_in + mask + 2 * 4 * n_out


def draw_random(rng):
    """One random case over the whole feature space, drawn again while it is bigger than
    RANDOM_CASE_BYTES."""
    while True:
        c = draw_one(rng)
        if case_bytes(c) <= RANDOM_CASE_BYTES:
            return c


def draw_one(rng):
    c = base()
    c["opset"] = 24 if rng.random() < 0.4 else 23
    c["layout"] = "3d" if rng.random() < 0.5 else "4d"
    kind = rng.choice(["mha", "gqa", "mqa"])
    if kind == "mha":
        c["Hkv"] = int(rng.integers(1, 5))
        c["Hq"] = c["Hkv"]
    elif kind == "mqa":
        c["Hkv"] = 1
        c["Hq"] = int(rng.integers(2, 9))
    else:
        c["Hkv"] = int(rng.choice([2, 3, 4]))
        c["Hq"] = c["Hkv"] * int(rng.choice([2, 3, 4] if c["Hkv"] == 2 else [2]))
    c["hd"] = int(rng.choice([2, 4, 5, 8, 8, 12, 16, 24]))
    c["vhd"] = c["hd"] if rng.random() < 0.6 else int(rng.choice([3, 4, 6, 8, 10, 16]))
    c["B"] = int(rng.integers(1, 4))
    c["Sq"] = int(rng.choice([1, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20]))
    c["Skv"] = c["Sq"] if rng.random() < 0.4 else int(rng.integers(1, 13))
    if rng.random() < 0.4:
        c["P"] = int(rng.integers(0, 11)) if rng.random() < 0.1 else int(rng.integers(1, 11))
    if c["opset"] == 24 and c["P"] is None and rng.random() < 0.6:
        c["nonpad"] = [int(rng.integers(0, c["Skv"] + 1)) if rng.random() < 0.15
                       else int(rng.integers(max(1, c["Skv"] // 2), c["Skv"] + 1)) for _ in range(c["B"])]
    a = c["attrs"]
    r = rng.random()
    if r < 0.4:
        a["is_causal"] = 1
    elif r < 0.55:
        a["is_causal"] = 0
    if rng.random() < 0.4:
        a["scale"] = str(rng.choice(SCALES))
    if rng.random() < 0.35:
        a["softcap"] = str(rng.choice(SOFTCAPS))
    if rng.random() < 0.6:
        a["qk_matmul_output_mode"] = int(rng.integers(0, 4))
    # FLOAT16 / BFLOAT16 softmax precisions are covered by the targeted cases.
    r = rng.random()
    if r < 0.2:
        a["softmax_precision"] = 1
    elif r < 0.32:
        a["softmax_precision"] = 11
    r = rng.random()
    if r < 0.65:
        T = total(c)
        last = T
        if c["opset"] == 24 and rng.random() < 0.3 and T > 1:
            lo = max(c["nonpad"]) if c["nonpad"] else 1
            last = int(rng.integers(max(lo, 1), T + 1))
        rank = int(rng.choice([2, 3, 4]))
        c["mask"] = {"dtype": "bool" if r < 0.35 else "float", "shape": mask_shape(rng, c, rank, last),
                     "dead_rows": 1 if rng.random() < 0.15 else 0,
                     "neg_inf": 0.0 if r < 0.35 else float(rng.choice([0.0, 0.1, 0.2]))}
    return c


def targeted():
    """Cases chosen by hand so that every feature and corner is present at least once."""
    cs = []
    add = cs.append
    # Every mask rank, both dtypes, full and broadcast shapes (3-D mask = (heads, q, total)).
    for dtype in ("bool", "float"):
        for shape_of in (lambda c: [c["Sq"], total(c)], lambda c: [1, total(c)],
                         lambda c: [c["Hq"], c["Sq"], total(c)], lambda c: [1, c["Sq"], total(c)],
                         lambda c: [c["Hq"], 1, total(c)],
                         lambda c: [c["B"], c["Hq"], c["Sq"], total(c)], lambda c: [c["B"], 1, 1, total(c)],
                         lambda c: [1, c["Hq"], c["Sq"], total(c)], lambda c: [c["B"], 1, c["Sq"], total(c)],
                         lambda c: [1, 1, 1, total(c)]):
            for layout in ("3d", "4d"):
                c = base(layout=layout, B=2, Sq=5, Skv=7, Hq=4, Hkv=2, hd=6, vhd=6)
                probe = shape_of(c)
                if probe[-2] == 1 and len(probe) >= 2 and layout == ("4d" if dtype == "bool" else "3d"):
                    continue  # query-broadcast masks: one layout per dtype is enough
                c["mask"] = {"dtype": dtype, "shape": shape_of(c), "dead_rows": 0, "neg_inf": 0.1}
                c["note"] = f"{dtype} mask {c['mask']['shape']}"
                add(c)
    # A 1-D mask (total,) broadcasts to 4-D as well.
    for dtype in ("bool", "float"):
        c = base(opset=23, layout="4d", B=2, Sq=3, Skv=5, Hq=2, Hkv=2, hd=4, vhd=4)
        c["mask"] = {"dtype": dtype, "shape": [5], "dead_rows": 0, "neg_inf": 0.0}
        c["note"] = "1-D mask"
        add(c)
    # Masks narrower than the total length (Attention-24 pads them with -inf).
    for dtype, layout, past, causal, width in (("bool", "4d", None, None, 4), ("float", "3d", None, 1, 5),
                                               ("bool", "3d", 3, 1, 6), ("float", "4d", 4, None, 2),
                                               ("float", "4d", None, 0, 1), ("bool", "3d", 2, 1, 1)):
        c = base(opset=24, layout=layout, B=2, Sq=3, Skv=6, P=past, Hq=4, Hkv=2, hd=8, vhd=4)
        if causal is not None:
            c["attrs"]["is_causal"] = causal
        c["attrs"]["qk_matmul_output_mode"] = 2
        c["mask"] = {"dtype": dtype, "shape": [c["B"], 1, c["Sq"], width], "dead_rows": 0, "neg_inf": 0.0}
        c["note"] = f"narrow {dtype} mask, width {width} of {total(c)}"
        add(c)
    # Causal alignment: with a past (offset P), without one and S_kv != S_q (top-left),
    # decode (S_q = 1) and chunked prefill.
    for layout, Sq, Skv, P, Hq, Hkv in (("4d", 4, 4, 6, 2, 2), ("3d", 1, 1, 9, 8, 2), ("4d", 3, 3, 5, 6, 3),
                                        ("3d", 4, 9, None, 4, 4), ("4d", 7, 3, None, 2, 1),
                                        ("4d", 5, 5, None, 3, 3), ("3d", 2, 2, 0, 2, 1), ("4d", 6, 2, 3, 4, 2),
                                        ("4d", 1, 5, None, 2, 2), ("3d", 2, 5, None, 2, 1), ("3d", 1, 3, 7, 4, 4),
                                        ("4d", 2, 4, 4, 2, 2), ("4d", 1, 1, 3, 2, 1)):
        c = base(opset=23, layout=layout, B=2, Sq=Sq, Skv=Skv, P=P, Hq=Hq, Hkv=Hkv, hd=8, vhd=8)
        c["attrs"].update(is_causal=1, qk_matmul_output_mode=2)
        c["note"] = f"causal, S_q {Sq}, S_kv {Skv}, past {P}"
        add(c)
    # Causal with a bool or float mask and a past; float mask adds to the causal bias.
    for dtype in ("bool", "float"):
        c = base(opset=23, layout="4d", B=2, Sq=3, Skv=3, P=4, Hq=4, Hkv=1, hd=8, vhd=12)
        c["attrs"].update(is_causal=1, qk_matmul_output_mode=3)
        c["mask"] = {"dtype": dtype, "shape": [c["B"], c["Hq"], c["Sq"], total(c)], "dead_rows": 1, "neg_inf": 0.1}
        c["note"] = f"causal + {dtype} mask + past, one fully masked row"
        add(c)
    # nonpad_kv_seqlen (Attention-24): plain, causal (offset nonpad - S_q, negative included),
    # zero length, with a mask.
    for layout, Sq, Skv, nonpad, causal, mask in (("4d", 4, 8, [8, 5], None, None), ("3d", 4, 8, [6, 8], 1, None),
                                                  ("4d", 4, 8, [2, 4], 1, None), ("4d", 1, 6, [3, 6], 1, None),
                                                  ("3d", 3, 5, [0, 5], None, None), ("4d", 3, 5, [4, 1], 1, "bool"),
                                                  ("4d", 2, 6, [3, 5], 0, "float"), ("3d", 5, 5, [5, 5, 2], 1, None)):
        c = base(opset=24, layout=layout, B=len(nonpad), Sq=Sq, Skv=Skv, Hq=4, Hkv=2, hd=4, vhd=6, nonpad=nonpad)
        if causal is not None:
            c["attrs"]["is_causal"] = causal
        c["attrs"]["qk_matmul_output_mode"] = 3
        if mask:
            width = Skv if mask == "bool" else max(nonpad)
            c["mask"] = {"dtype": mask, "shape": [c["B"], 1, c["Sq"], width], "dead_rows": 0, "neg_inf": 0.0}
        c["note"] = f"nonpad_kv_seqlen {nonpad}, causal {causal}"
        add(c)
    # Fully masked rows: all-False bool row, all -inf float row, causal + mask, every mode.
    for mode in (0, 1, 2, 3):
        for dtype in ("bool", "float"):
            c = base(opset=23, layout="3d" if mode % 2 else "4d", B=2, Sq=4, Skv=5, Hq=2, Hkv=2, hd=4, vhd=4)
            c["attrs"].update(qk_matmul_output_mode=mode, softcap="5")
            c["mask"] = {"dtype": dtype, "shape": [c["B"], 1, c["Sq"], 5], "dead_rows": 2, "neg_inf": 0.2}
            c["note"] = f"fully masked rows ({dtype}), mode {mode}"
            add(c)
    # Softcap with every output mode, with a mask, 3-D and 4-D.
    for mode in (0, 1, 2, 3):
        c = base(opset=23, layout="3d" if mode < 2 else "4d", B=2, Sq=5, Skv=6, Hq=4, Hkv=2, hd=16, vhd=8)
        c["attrs"].update(qk_matmul_output_mode=mode, softcap="2.5", scale="0.5")
        c["mask"] = {"dtype": "float", "shape": [c["Sq"], 6], "dead_rows": 0, "neg_inf": 0.2}
        c["note"] = f"softcap 2.5, scale 0.5, mode {mode}"
        add(c)
    # softmax_precision: every accepted type code.
    for p in (1, 10, 11, 16):
        for layout in ("3d", "4d"):
            c = base(opset=23, layout=layout, B=2, Sq=4, Skv=6, Hq=2, Hkv=1, hd=8, vhd=8)
            c["attrs"].update(softmax_precision=p, qk_matmul_output_mode=3)
            c["note"] = f"softmax_precision {p} ({PRECISION_NAMES[p]})"
            add(c)
    for p in (10, 16):
        c = base(opset=24, layout="4d", B=2, Sq=4, Skv=5, P=2, Hq=4, Hkv=2, hd=8, vhd=4)
        c["attrs"].update(softmax_precision=p, is_causal=1, softcap="5")
        c["mask"] = {"dtype": "bool", "shape": [c["B"], c["Hq"], c["Sq"], total(c)], "dead_rows": 1, "neg_inf": 0.0}
        c["note"] = f"softmax_precision {p} ({PRECISION_NAMES[p]}), causal, past, a fully masked row"
        add(c)
    # V head size different from the Q/K head size, with a past (DeepSeek-like 24/16).
    for layout in ("3d", "4d"):
        c = base(opset=24, layout=layout, B=2, Sq=3, Skv=3, P=5, Hq=4, Hkv=4, hd=24, vhd=16)
        c["attrs"].update(is_causal=1)
        c["note"] = "v head size 16, qk head size 24, past 5"
        add(c)
    # The largest shape allowed here.
    c = base(opset=23, layout="3d", B=3, Sq=20, Skv=20, Hq=8, Hkv=2, hd=24, vhd=24)
    c["attrs"].update(is_causal=1)
    c["note"] = "largest shape"
    add(c)
    return cs


def refusals():
    """Inputs the operator refuses: (case, what is wrong)."""
    cs = []

    def add(why, **kw):
        c = base(**kw)
        c["error"] = why
        c["note"] = why
        cs.append(c)

    add("q_num_heads 3 is not a multiple of kv_num_heads 2", layout="3d", Hq=3, Hkv=2, hd=4, vhd=4)
    add("fewer query heads (2) than kv heads (4)", layout="4d", Hq=2, Hkv=4, hd=4, vhd=4)
    add("3-D Q hidden size 10 is not a multiple of q_num_heads 4", layout="3d", Hq=4, Hkv=2, hd=4, vhd=4,
        override={"Q": [1, 4, 10]})
    add("Q head size 8, K head size 6", layout="4d", hd=8, vhd=8, override={"K": [1, 2, 4, 6]})
    add("K has 4 positions, V has 5", layout="4d", override={"V": [1, 2, 5, 8]})
    add("Q batch 2, K and V batch 1", layout="4d", B=2, override={"K": [1, 2, 4, 8], "V": [1, 2, 4, 8]})
    add("Q is 3-D, K and V are 4-D", layout="3d", Hq=2, Hkv=2, override={"K": [1, 2, 4, 8], "V": [1, 2, 4, 8]})
    add("attn_mask's query axis is 5, Q has 4 positions", layout="4d",
        mask={"dtype": "bool", "shape": [1, 2, 5, 4], "dead_rows": 0, "neg_inf": 0.0})
    add("attn_mask's last axis 6 is longer than the total length 4", layout="4d", opset=24,
        mask={"dtype": "float", "shape": [4, 6], "dead_rows": 0, "neg_inf": 0.0})
    add("3-D attn_mask's head axis is 3, neither 1 nor q_num_heads 2", layout="4d",
        mask={"dtype": "bool", "shape": [3, 4, 4], "dead_rows": 0, "neg_inf": 0.0})
    add("4-D attn_mask's batch axis is 3, neither 1 nor batch 2", layout="4d", B=2,
        mask={"dtype": "float", "shape": [3, 2, 4, 4], "dead_rows": 0, "neg_inf": 0.0})
    add("5-D attn_mask", layout="4d", mask={"dtype": "bool", "shape": [1, 1, 2, 4, 4], "dead_rows": 0, "neg_inf": 0.0})
    add("past_key has 1 head, K has 2", layout="4d", P=3, override={"past_key": [1, 1, 3, 8]})
    add("past_value's head size 6, V's 8", layout="4d", P=3, override={"past_value": [1, 2, 3, 6]})
    add("nonpad_kv_seqlen together with past_key / past_value", layout="4d", opset=24, P=2, nonpad=[3])
    add("nonpad_kv_seqlen 5 is more than the 4 key positions", layout="4d", opset=24, nonpad=[5])
    add("negative scale -0.5", layout="4d", attrs={"scale": "-0.5"})
    add("qk_matmul_output_mode 4", layout="4d", attrs={"qk_matmul_output_mode": 4})
    add("softmax_precision 7 (INT64) is not a floating-point type", layout="3d", attrs={"softmax_precision": 7})
    return cs


# ---------------------------------------------------------------------------------------
# Inputs, model and case.json of one case.
# ---------------------------------------------------------------------------------------


def input_shapes(c):
    B, Sq, Skv, Hq, Hkv, hd, vhd = (c[k] for k in ("B", "Sq", "Skv", "Hq", "Hkv", "hd", "vhd"))
    if c["layout"] == "3d":
        shapes = {"Q": [B, Sq, Hq * hd], "K": [B, Skv, Hkv * hd], "V": [B, Skv, Hkv * vhd]}
    else:
        shapes = {"Q": [B, Hq, Sq, hd], "K": [B, Hkv, Skv, hd], "V": [B, Hkv, Skv, vhd]}
    if c["mask"] is not None:
        shapes["attn_mask"] = list(c["mask"]["shape"])
    if c["P"] is not None:
        shapes["past_key"] = [B, Hkv, c["P"], hd]
        shapes["past_value"] = [B, Hkv, c["P"], vhd]
    if c["nonpad"] is not None:
        shapes["nonpad_kv_seqlen"] = [len(c["nonpad"])]
    shapes.update(c["override"])
    return shapes


def make_inputs(rng, c):
    shapes = input_shapes(c)
    x = {}
    for name in reference.INPUT_NAMES:
        if name not in shapes:
            continue
        shape = shapes[name]
        if name == "attn_mask":
            m = c["mask"]
            if m["dtype"] == "bool":
                a = rng.random(shape) < 0.75
            else:
                a = (rng.standard_normal(shape) * 1.5).astype(np.float32)
                if m["neg_inf"] > 0:
                    a[rng.random(shape) < m["neg_inf"]] = -np.inf
            if m["dead_rows"] and len(shape) >= 2:
                # Fully mask `dead_rows` query rows of the first batch/head slice.
                flat = a.reshape(-1, shape[-2], shape[-1])
                rows = rng.choice(shape[-2], size=min(m["dead_rows"], shape[-2]), replace=False)
                flat[0, rows, :] = False if m["dtype"] == "bool" else -np.inf
            x[name] = a
        elif name == "nonpad_kv_seqlen":
            x[name] = np.array(c["nonpad"], dtype=np.int64)
        else:
            x[name] = rng.standard_normal(shape).astype(np.float32)
    return x


def attr_values(c):
    """Attributes as the model stores them ({name: python value})."""
    a = dict(c["attrs"])
    out = {}
    if c["layout"] == "3d":
        out["q_num_heads"] = c["Hq"]
        out["kv_num_heads"] = c["Hkv"]
    for k in ("is_causal", "qk_matmul_output_mode", "softmax_precision"):
        if k in a:
            out[k] = int(a[k])
    for k in ("scale", "softcap"):
        if k in a:
            out[k] = a[k]  # decimal string; float32 in the model
    return out


def output_names(c):
    outs = ["Y"]
    if c["P"] is not None:
        outs += ["present_key", "present_value"]
    if "qk_matmul_output_mode" in c["attrs"]:
        outs += ["qk_matmul_output"]
    return outs


def write_model(path, c, inputs):
    import onnx
    from onnx import TensorProto, helper
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(bool): TensorProto.BOOL,
            np.dtype(np.int64): TensorProto.INT64}
    node_inputs = [n if n in inputs else "" for n in reference.INPUT_NAMES]
    while node_inputs[-1] == "":
        node_inputs.pop()
    outs = output_names(c)
    node_outputs = [n if n in outs else "" for n in ("Y", "present_key", "present_value", "qk_matmul_output")]
    while node_outputs[-1] == "":
        node_outputs.pop()
    attrs = {}
    for k, v in attr_values(c).items():
        attrs[k] = float(np.float32(float(v))) if k in ("scale", "softcap") else v
    node = helper.make_node("Attention", node_inputs, node_outputs, name="attention", domain="", **attrs)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, elem[inputs[n].dtype], list(inputs[n].shape))
         for n in reference.INPUT_NAMES if n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c["opset"])],
                              producer_name="attn scripts/onnx/make_cases.py")
    model.ir_version = IR_VERSION
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def features(c):
    f = [f"opset{c['opset']}", c["layout"]]
    f.append("mha" if c["Hq"] == c["Hkv"] else ("mqa" if c["Hkv"] == 1 else "gqa"))
    if c["vhd"] != c["hd"]:
        f.append("v_head_size")
    if c["mask"] is not None:
        m = c["mask"]
        f.append(f"{m['dtype']}_mask_{len(m['shape'])}d")
        if m["shape"][-1] < total(c) and m["shape"][-1] >= 1 and len(m["shape"]) <= 4:
            f.append("narrow_mask")
        full = [c["B"], c["Hq"], c["Sq"], total(c)][4 - len(m["shape"]):] if len(m["shape"]) <= 4 else []
        if full and any(s == 1 and t != 1 for s, t in zip(m["shape"][:-1], full[:-1])):
            f.append("mask_broadcast")
    if c["P"] is not None:
        f.append("past")
    a = c["attrs"]
    if a.get("is_causal") == 1:
        f.append("causal_past" if c["P"] else ("causal_nonpad" if c["nonpad"] else "causal"))
    for k in ("scale", "softcap"):
        if k in a:
            f.append(k)
    if "qk_matmul_output_mode" in a:
        f.append(f"qk_mode{a['qk_matmul_output_mode']}")
    if "softmax_precision" in a:
        f.append(f"softmax_precision{a['softmax_precision']}")
    if c["nonpad"] is not None:
        f.append("nonpad_kv_seqlen")
    return f


def attn_run_args(c):
    args = ["--format", "onnx", "--input", "inputs.safetensors", "--output", "out.safetensors"]
    v = attr_values(c)
    flag = {"q_num_heads": "--q-num-heads", "kv_num_heads": "--kv-num-heads", "is_causal": "--is-causal",
            "scale": "--scale", "softcap": "--softcap", "qk_matmul_output_mode": "--qk-matmul-output-mode",
            "softmax_precision": "--softmax-precision"}
    for k in ("q_num_heads", "kv_num_heads", "is_causal", "scale", "softcap", "qk_matmul_output_mode",
              "softmax_precision"):
        if k in v:
            args += [flag[k], str(v[k])]
    return args


def equivalent_mask(c, mask):
    """For a valid case whose mask ONNX Runtime 1.30 does not take (rank 1, a query axis of 1
    with several queries, a last axis shorter than the total length), the mask that means the
    same under Attention-24 in the shape ONNX Runtime takes, and what was done; else None."""
    if c["error"] or mask is None:
        return None
    m, done = mask, []
    T, Sq = total(c), c["Sq"]
    if m.ndim == 1:
        m = m.reshape(1, -1)
        done.append("1-D mask read as (1, total)")
    if m.shape[-1] < T:
        pad = [(0, 0)] * (m.ndim - 1) + [(0, T - m.shape[-1])]
        m = np.pad(m, pad, constant_values=(False if m.dtype == bool else -np.inf))
        done.append(f"last axis padded from {mask.shape[-1]} to {T} with " + ("False" if m.dtype == bool else "-inf"))
    if m.shape[-2] == 1 and Sq > 1:
        m = np.repeat(m, Sq, axis=-2)
        done.append(f"query axis repeated to {Sq}")
    return (np.ascontiguousarray(m), "; ".join(done)) if done else None


def cmd_make(args):
    rng = np.random.default_rng(SEED)
    cases = targeted()
    cases += [draw_random(rng) for _ in range(N_RANDOM)]
    cases += refusals()
    if os.path.isdir(args.out):
        for d in os.listdir(args.out):
            if d.startswith("case"):
                shutil.rmtree(os.path.join(args.out, d))
    os.makedirs(args.out, exist_ok=True)
    if os.path.isdir(args.work):
        shutil.rmtree(args.work)
    os.makedirs(args.work)
    names = []
    for n, c in enumerate(cases, start=1):
        name = f"case{n:03d}"
        names.append(name)
        d, w = os.path.join(args.out, name), os.path.join(args.work, name)
        os.makedirs(d)
        os.makedirs(w)
        inputs = make_inputs(np.random.default_rng([SEED, n]), c)
        st.write(os.path.join(d, "inputs.safetensors"), inputs)
        write_model(os.path.join(w, "model.onnx"), c, inputs)
        eq = equivalent_mask(c, inputs.get("attn_mask"))
        if eq is not None:
            eq_inputs = dict(inputs, attn_mask=eq[0])
            st.write(os.path.join(w, "equivalent_inputs.safetensors"), eq_inputs)
            write_model(os.path.join(w, "equivalent_model.onnx"), c, eq_inputs)
            with open(os.path.join(w, "equivalent_rewrite.txt"), "w") as f:
                f.write(eq[1] + "\n")
        case = {
            "name": name,
            "opset": c["opset"],
            "layout": c["layout"],
            "note": c["note"],
            "features": features(c) if not c["error"] else ["refusal"],
            "shapes": {"B": c["B"], "S_q": c["Sq"], "S_kv": c["Skv"], "past": c["P"] or 0,
                       "total": total(c), "q_num_heads": c["Hq"], "kv_num_heads": c["Hkv"],
                       "head_size": c["hd"], "v_head_size": c["vhd"]},
            "inputs": {k: {"dtype": st.dtype_name(v), "shape": list(v.shape)} for k, v in inputs.items()},
            "attributes": attr_values(c),
            "outputs": output_names(c),
            "attn_run_args": attn_run_args(c),
            "attn_run": "attn_run " + " ".join(attn_run_args(c)),
            "expect_error": bool(c["error"]),
        }
        if c["error"]:
            case["error_reason"] = c["error"]
        write_json(os.path.join(d, "case.json"), case)
    with open(os.path.join(args.work, "cases.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    print(f"make_cases: {len(cases)} cases in {args.out} ({sum(1 for c in cases if c['error'])} refusals), "
          f"models in {args.work}")
    return 0


# ---------------------------------------------------------------------------------------
# finish: expected outputs, comparison with ONNX Runtime, index and summary.
# ---------------------------------------------------------------------------------------


def compare(ort, ref):
    """How ONNX Runtime's output compares with the definition's: max |ort - ref| and max
    relative difference over elements finite in both, the count of elements out of
    tolerance (|ort - ref| > ATOL + RTOL |ref|), the count whose infinities / NaNs differ,
    and whether every such element is -inf in the definition and float32's lowest value in
    ONNX Runtime."""
    ort = ort.astype(np.float64)
    both_finite = np.isfinite(ort) & np.isfinite(ref)
    same_special = (~np.isfinite(ort)) & (~np.isfinite(ref)) & ((ort == ref) | (np.isnan(ort) & np.isnan(ref)))
    special = ~both_finite & ~same_special
    ort_f = np.where(both_finite, ort, 0.0)
    ref_f = np.where(both_finite, ref, 0.0)
    d = np.abs(ort_f - ref_f)
    rel = d / np.maximum(np.abs(ref_f), 1e-30)
    bad = int(np.sum(d > ATOL + RTOL * np.abs(ref_f)))
    lowest = bool(np.all(np.isneginf(ref[special]) & (ort[special] == float(np.finfo(np.float32).min))))
    return {"max_abs": float(np.max(d, initial=0.0)), "max_rel": float(np.max(np.where(d > 0, rel, 0.0), initial=0.0)),
            "out_of_tolerance": bad, "inf_nan_differ": int(np.sum(special)), "lowest_for_neg_inf": lowest}


# Why ONNX Runtime 1.30 and the definition differ, by case (see docs/onnx.md).
REASONS = {
    "masked_score_lowest": "qk_matmul_output mode 2 holds float32's lowest value (-3.4028235e38) where the "
                           "definition has -inf (positions masked by a bool mask, is_causal or nonpad_kv_seqlen)",
    "softmax_precision": "softmax_precision FLOAT16 / BFLOAT16: ONNX Runtime computes the softmax in float32, the "
                         "definition casts the scores to that type and the softmax result back",
    "causal_single_query_offset": "is_causal with a past and one query but several new keys: ONNX Runtime lets the "
                                  "query see every key, the definition only keys j <= past_sequence_length",
    "unexplained": "no known reason",
}


def reason_of(case, out_name, cmp):
    a, sh = case["attributes"], case["shapes"]
    if (out_name == "qk_matmul_output" and a.get("qk_matmul_output_mode") == 2 and cmp["out_of_tolerance"] == 0
            and cmp["lowest_for_neg_inf"]):
        return "masked_score_lowest"
    if a.get("softmax_precision") in (10, 16):
        return "softmax_precision"
    if a.get("is_causal") == 1 and sh["past"] > 0 and sh["S_q"] == 1 and sh["S_kv"] > 1:
        return "causal_single_query_offset"
    return "unexplained"


def tolerance_of(case, stats):
    """The tolerance a float32 implementation of the definition is held to on this case."""
    p = case["attributes"].get("softmax_precision")
    if p in (10, 16):
        name, ulp = ("float16", "1e-3") if p == 10 else ("bfloat16", "8e-3")
        return {"rtol": float(ulp), "atol": float(ulp),
                "why": f"the scores and the softmax are rounded to {name}: one unit in its last place",
                "rounding_margin_ulps": stats["rounding_margin_ulps"]}
    return {"rtol": 1e-5, "atol": 1e-6, "why": "float32 arithmetic against a float64 definition"}


def compare_all(label, case, ref, ort_path, agreeing_max, disagreements):
    """Compares every output of one ONNX Runtime run with the definition's."""
    ort_out, _ = st.read(ort_path)
    cmps = {}
    agrees = True
    for k, r in ref.items():
        if k not in ort_out or list(ort_out[k].shape) != list(r.shape):
            got = list(ort_out[k].shape) if k in ort_out else None
            cmps[k] = {"shape": got, "agrees": False, "reason": "unexplained"}
            disagreements.append((label, k, "unexplained", f"shape {got} vs {list(r.shape)}"))
            agrees = False
            continue
        c = compare(ort_out[k], r)
        c["agrees"] = c["out_of_tolerance"] == 0 and c["inf_nan_differ"] == 0
        if c["agrees"]:
            agreeing_max[k] = max(agreeing_max.get(k, 0.0), c["max_abs"])
        else:
            c["reason"] = reason_of(case, k, c)
            agrees = False
            disagreements.append((label, k, c["reason"],
                                  f"max |ort - spec| {c['max_abs']:.3g} on finite values, "
                                  f"{c['out_of_tolerance']} out of tolerance, "
                                  f"{c['inf_nan_differ']} with other infinities"))
        del c["lowest_for_neg_inf"]
        cmps[k] = c
    return agrees, cmps


def cmd_finish(args):
    with open(os.path.join(args.work, "cases.txt")) as f:
        names = f.read().split()
    index = []
    agreeing_max = {}
    disagreements = []  # (case, output, reason, detail)
    ort_refused_valid = []
    ort_accepts_refused = []
    equivalent_runs = []
    unexpected = []
    for name in names:
        d, w = os.path.join(args.out, name), os.path.join(args.work, name)
        with open(os.path.join(d, "case.json")) as f:
            case = json.load(f)
        for k in ("ort", "ort_vs_spec", "spec_error", "tolerance", "ort_equivalent"):
            case.pop(k, None)
        inputs, _ = st.read(os.path.join(d, "inputs.safetensors"))
        with open(os.path.join(w, "ort_status.json")) as f:
            status = json.load(f)
        stats = {}
        try:
            ref, spec_error = reference.run_case(inputs, case, stats), None
        except reference.SpecError as e:
            ref, spec_error = None, str(e)
        case["features"] = [f for f in case["features"] if f != "fully_masked_rows"]
        if stats.get("fully_masked_rows"):
            case["features"].append("fully_masked_rows")
        case["ort"] = {"version": status.get("version"), "ok": status["ok"]}
        if not status["ok"]:
            case["ort"]["error"] = status["error"].strip()
            case["ort"]["message"] = status["error"].split(" was false. ")[-1].strip()
        expected_path = os.path.join(d, "expected.safetensors")
        if os.path.exists(expected_path):
            os.remove(expected_path)
        agrees = None
        if case["expect_error"]:
            case["spec_error"] = spec_error
            if spec_error is None:
                unexpected.append(f"{name}: the reference accepts a case meant to be refused")
            if status["ok"]:
                ort_accepts_refused.append(name)
                case["ort"]["accepts_invalid_input"] = True
        elif spec_error is not None:
            unexpected.append(f"{name}: the reference refuses it: {spec_error}")
        else:
            st.write(expected_path, {k: v.astype(np.float32) for k, v in ref.items()})
            case["tolerance"] = tolerance_of(case, stats)
            if not status["ok"]:
                ort_refused_valid.append((name, status["error"]))
                case["ort"]["refuses_valid_input"] = True
            else:
                agrees, case["ort_vs_spec"] = compare_all(name, case, ref, os.path.join(d, "ort.safetensors"),
                                                          agreeing_max, disagreements)
            eq_status_path = os.path.join(w, "ort_equivalent_status.json")
            if os.path.exists(eq_status_path):
                with open(eq_status_path) as f:
                    eq_status = json.load(f)
                with open(os.path.join(w, "equivalent_rewrite.txt")) as f:
                    eq = {"rewrite": f.read().strip(), "ok": eq_status["ok"]}
                if eq_status["ok"]:
                    eq_agrees, eq["vs_spec"] = compare_all(name + " (equivalent mask)", case, ref,
                                                           os.path.join(d, "ort_equivalent.safetensors"),
                                                           agreeing_max, disagreements)
                    equivalent_runs.append((name, eq_agrees))
                else:
                    eq["error"] = eq_status["error"].strip()
                    unexpected.append(f"{name}: ONNX Runtime refuses the equivalent mask too")
                case["ort_equivalent"] = eq
        write_json(os.path.join(d, "case.json"), case)
        index.append({"name": name, "note": case["note"], "features": case["features"], "expect_error": case["expect_error"],
                      "ort_ran": status["ok"], "ort_agrees": agrees})
    write_json(os.path.join(args.out, "index.json"),
               {"generator": "scripts/onnx/make_cases.py", "seed": SEED, "reasons": REASONS, "cases": index})

    # Summary.
    counts = {}
    for e in index:
        for t in e["features"]:
            counts[t] = counts.get(t, 0) + 1
    n_valid = sum(1 for e in index if not e["expect_error"])
    n_ran = sum(1 for e in index if not e["expect_error"] and e["ort_ran"])
    n_agree = sum(1 for e in index if e["ort_agrees"])
    print(f"cases: {len(index)}: {n_valid} the operator computes ({N_RANDOM} random, {n_valid - N_RANDOM} chosen), "
          f"{len(index) - n_valid} it refuses")
    print("features: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"ONNX Runtime ran {n_ran} of the {n_valid}; agrees with the definition on every output of {n_agree}")
    for k in ("Y", "present_key", "present_value", "qk_matmul_output"):
        if k in agreeing_max:
            print(f"  max |ORT - spec| on {k} where they agree: {agreeing_max[k]:.3g}")
    for tag in ("fully_masked_rows", "narrow_mask", "causal_nonpad", "causal_past", "qk_mode2"):
        ran = [e for e in index if tag in e["features"] and e["ort_ran"]]
        print(f"  {tag}: ONNX Runtime ran {len(ran)} of {counts.get(tag, 0)}, agrees on {sum(1 for e in ran if e['ort_agrees'])}")
    by_reason = {}
    for n, k, r, msg in disagreements:
        by_reason.setdefault(r, []).append((n, k, msg))
    plain = {n for n, _, _, _ in disagreements if " " not in n}
    rewritten = {n.split()[0] for n, _, _, _ in disagreements if " " in n}
    print(f"ONNX Runtime disagrees with the definition on {len(plain)} cases as given and on {len(rewritten)} "
          f"with an equivalent mask:")
    for r, items in sorted(by_reason.items()):
        print(f"  {r} ({len({n for n, _, _ in items})} cases): {REASONS[r]}")
        for n, k, msg in items:
            print(f"    {n} {k}: {msg}")
    refused = {}
    for n, err in ort_refused_valid:
        refused.setdefault(err.split(" was false. ")[-1].strip(), []).append(n)
    print(f"ONNX Runtime refuses {len(ort_refused_valid)} cases the definition accepts:")
    for msg, ns in sorted(refused.items()):
        print(f"  {len(ns)} x {msg}: {' '.join(ns)}")
    print(f"  with the mask rewritten to an equivalent one it takes, ONNX Runtime ran {len(equivalent_runs)} of them "
          f"and agrees on {sum(1 for _, a in equivalent_runs if a)}")
    print(f"ONNX Runtime runs {len(ort_accepts_refused)} of the refusal cases the definition refuses: "
          + " ".join(f"{n} ({next(e['note'] for e in index if e['name'] == n)})" for n in ort_accepts_refused))
    for u in unexpected:
        print(f"UNEXPECTED {u}")
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(args.out) for f in fs)
    print(f"fixture files: {size / 1e6:.2f} MB")
    if by_reason.get("unexplained"):
        print("UNEXPECTED disagreements with no known reason")
        return 1
    return 1 if unexpected else 0


def main():
    p = argparse.ArgumentParser(description="makes the ONNX Attention fixtures")
    p.add_argument("step", choices=["make", "finish"])
    p.add_argument("--out", required=True, help="fixture directory (tests/fixtures/onnx)")
    p.add_argument("--work", required=True, help="scratch directory for models and ORT status")
    args = p.parse_args()
    return cmd_make(args) if args.step == "make" else cmd_finish(args)


if __name__ == "__main__":
    sys.exit(main())
