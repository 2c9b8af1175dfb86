#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/parity_vs_pytorch.py: end-to-end parity of tools/attn_run with PyTorch's
# nn.MultiheadAttention (Debian's python3-torch 1.13), and of `attn_run --format llama` with
# Hugging Face's LlamaAttention written out in scripts/llama_reference.py, through
# safetensors files.
#
#   /usr/bin/python3 scripts/parity_vs_pytorch.py --attn-run build/io/tools/attn_run \
#       [--report docs/parity.md] [--fixtures tests/fixtures/io] [--seed 20240607]
#       [--only bf16]
#
# For each case: a random nn.MultiheadAttention (random biases too), random inputs and
# masks; the state_dict and the inputs are written as safetensors, attn_run runs them, and
# its output (and averaged weights) are compared with the module's. A case passes when
#   max |attn - torch| / max |torch|  <= 1e-5 (float32)  or  1e-12 (float64)
# for the output, and max |attn - torch| <= the same bound for the weights.
# PyTorch returns NaN for fully masked rows where attn returns zeros (by design): the
# cases that have such rows compare the other rows and report how many were skipped.
#
# Llama cases (after the nn.MultiheadAttention ones, so those keep their random draws):
# random q/k/v/o_proj weights (biases on or off, some under a model.layers.N.self_attn.
# prefix), both RoPE conventions, partial rotary, theta 1e4 / 5e5 / 1e6, GQA and MQA,
# sliding windows and prefill/chunk splits, same tolerance.
#
# bfloat16 cases (their own draws: `--only bf16` regenerates them alone): `attn_run --dtype
# bf16` against PyTorch's own bfloat16 nn.MultiheadAttention (`.to(torch.bfloat16).eval()`,
# self and cross, key padding, boolean and causal masks), on BF16 weights and inputs. Both
# round at different points, so the output is also compared with a float64 evaluation of the
# same bfloat16 weights and inputs, for PyTorch and for attn; all three are written to
# tests/fixtures/io/bf16/ (tests/io/pytorch_fixtures_test.cpp).
#
# Backward cases (after the Llama ones): `attn_run --backward` against PyTorch autograd on random
# nn.MultiheadAttention configurations (self and cross, kdim/vdim, bias on and off, bool and
# float masks, key padding, causal): `y.backward(grad_output)` with a random grad_output, and
# every gradient compared, max |attn - torch| / max |torch| <= 1e-5 (float32) or 1e-10
# (float64), per tensor: output, grad_query (the whole gradient of x for self-attention,
# m(x, x, x)), grad_key, grad_value and grad.<name> for every parameter.
#
# Also usable as a module: save_torch_state_dict(module, path) writes module.state_dict()
# as safetensors (with the `safetensors` package if importable, else the writer below).
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

try:  # not packaged in Debian 12; used when present
    from safetensors.numpy import load_file as _st_load, save_file as _st_save
except ImportError:  # pragma: no cover
    _st_load = _st_save = None

# ---- minimal safetensors (de)serialiser (the format: u64 LE header length, JSON, data) ----

_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BOOL": np.bool_,
           "U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class BF16:
    """A bfloat16 tensor for save_file: its bits as a uint16 numpy array (numpy has no bfloat16)."""

    def __init__(self, bits):
        self.bits = np.ascontiguousarray(bits, dtype=np.uint16)


def save_file(tensors, path, metadata=None):
    """Writes {name: numpy array or BF16} as a safetensors file."""
    if _st_save is not None and not any(isinstance(v, BF16) for v in tensors.values()):
        _st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata)
        return
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        if isinstance(tensors[name], BF16):
            a, dtype = tensors[name].bits, "BF16"
        else:
            a = np.ascontiguousarray(tensors[name])
            dtype = _NAMES[a.dtype]
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def load_file(path):
    """Reads a safetensors file as {name: numpy array} (BF16 widened to float32)."""
    if _st_load is not None:
        try:
            return _st_load(path)
        except Exception:  # BF16, which safetensors.numpy does not read
            pass
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(raw[base + b:base + end], dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(e["shape"])
            continue
        dt = np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<")
        out[name] = np.frombuffer(raw[base + b:base + end], dtype=dt).reshape(e["shape"])
    return out


def save_torch_state_dict(module, path):
    """module.state_dict() -> safetensors (what docs/io.md's recipe calls)."""
    save_file({k: v.detach().cpu().contiguous().numpy() for k, v in module.state_dict().items()},
              path)


# ---- cases ----

def make_cases(rng):
    """At least 50 configurations covering self/cross, bias, kdim/vdim, masks, dtypes."""
    cases = []
    masks = ["none", "bool2d", "bool3d", "float2d", "float3d", "padding", "causal",
             "bool2d+padding", "causal+padding", "float2d+padding", "causal+bool3d"]
    for dtype in ("float32", "float64"):
        for i, mask in enumerate(masks):
            for cross in (False, True):
                e, h = [(8, 2), (16, 4), (32, 4), (64, 8), (24, 3)][(i + cross) % 5]
                cases.append(dict(
                    dtype=dtype, embed=e, heads=h, bias=bool((i + cross) % 2 == 0),
                    cross=cross, kdim=(e + 4 if cross and i % 3 == 1 else e),
                    vdim=(e // 2 if cross and i % 3 == 2 else e),
                    batch=1 + (i % 3), tq=3 + (i % 5), tk=(2 + ((i * 3) % 7)) if cross else None,
                    mask=mask, need_weights=(i % 2 == 1), unbatched=False, nan_rows=False))
    # extras: unbatched, fully masked rows, longer sequences, no-bias self with weights
    for dtype in ("float32", "float64"):
        cases.append(dict(dtype=dtype, embed=16, heads=2, bias=True, cross=False, kdim=16,
                          vdim=16, batch=1, tq=5, tk=None, mask="bool2d", need_weights=True,
                          unbatched=True, nan_rows=False))
        cases.append(dict(dtype=dtype, embed=16, heads=4, bias=True, cross=True, kdim=12,
                          vdim=20, batch=2, tq=4, tk=6, mask="bool3d", need_weights=True,
                          unbatched=False, nan_rows=True))
        cases.append(dict(dtype=dtype, embed=32, heads=4, bias=False, cross=False, kdim=32,
                          vdim=32, batch=2, tq=40, tk=None, mask="causal+padding",
                          need_weights=False, unbatched=False, nan_rows=False))
        cases.append(dict(dtype=dtype, embed=64, heads=8, bias=True, cross=True, kdim=64,
                          vdim=64, batch=2, tq=33, tk=70, mask="float3d", need_weights=True,
                          unbatched=False, nan_rows=False))
    # mask dtypes (appended, so the cases above keep their random draws): U8 attn_mask (a
    # boolean "blocked" mask, any nonzero byte), float key_padding_mask (added to the scores)
    for dtype in ("float32", "float64"):
        for i, (mask, cross, weights) in enumerate([
                ("u8-2d", False, True), ("u8-3d", True, False), ("float-padding", False, True),
                ("float-padding", True, False), ("u8-2d+padding", True, True)]):
            e, h = [(8, 2), (16, 4), (24, 3), (32, 4), (16, 2)][i]
            cases.append(dict(dtype=dtype, embed=e, heads=h, bias=i % 2 == 0, cross=cross,
                              kdim=e + 4 if cross else e, vdim=e, batch=2, tq=3 + i,
                              tk=(4 + i) if cross else None, mask=mask, need_weights=weights,
                              unbatched=False, nan_rows=False))
    return cases


def build_case(torch, case, rng):
    """Returns (module, inputs dict of numpy arrays, run flags, torch kwargs)."""
    tdtype = getattr(torch, case["dtype"])
    e, h = case["embed"], case["heads"]
    kdim, vdim = case["kdim"], case["vdim"]
    mha = torch.nn.MultiheadAttention(e, h, dropout=0.0, bias=case["bias"], kdim=kdim,
                                      vdim=vdim, batch_first=True).to(tdtype)
    # torch 1.13's eval fast path raises a TypeError with bias=False; train() with dropout=0.0
    # runs the regular path, which computes the same maths.
    mha.train()
    with torch.no_grad():
        for name, p in mha.named_parameters():
            if "bias" in name:  # default init zeroes them: make them matter
                p.copy_(torch.from_numpy(rng.normal(0, 0.2, p.shape)).to(tdtype))
    b, tq = case["batch"], case["tq"]
    tk = case["tk"] if case["cross"] else tq
    nd = np.float32 if case["dtype"] == "float32" else np.float64
    q = rng.normal(0, 1, (b, tq, e)).astype(nd)
    inputs = {"query": q}
    if case["cross"]:
        inputs["key"] = rng.normal(0, 1, (b, tk, kdim)).astype(nd)
        inputs["value"] = rng.normal(0, 1, (b, tk, vdim)).astype(nd)
    flags, mask = [], case["mask"].split("+")
    attn_mask = None  # numpy, PyTorch's form
    # column 0 stays visible in every random mask and key 0 is never padding, so no row is
    # fully masked unless the case asks for it (nan_rows).
    if "bool2d" in mask:
        attn_mask = rng.random((tq, tk)) < 0.35
        attn_mask[:, 0] = False
    if "bool3d" in mask:
        attn_mask = rng.random((b * h, tq, tk)) < 0.35
        attn_mask[:, :, 0] = False
        if case["nan_rows"]:
            attn_mask[1, 2, :] = True   # batch 0, head 1, query 2 -> NaN rows in torch
            attn_mask[h, 0, :] = True   # batch 1, head 0, query 0
    if "float2d" in mask or "float3d" in mask:
        shape = (tq, tk) if "float2d" in mask else (b * h, tq, tk)
        attn_mask = rng.normal(0, 1, shape).astype(nd)
        blocked = rng.random(shape) < 0.2
        blocked[..., 0] = False
        attn_mask[blocked] = -np.inf
    if "u8-2d" in mask or "u8-3d" in mask:  # torch converts U8 with .to(torch.bool)
        shape = (tq, tk) if "u8-2d" in mask else (b * h, tq, tk)
        attn_mask = ((rng.random(shape) < 0.35) * rng.integers(1, 4, shape)).astype(np.uint8)
        attn_mask[..., 0] = 0
    padding = None
    if "padding" in mask:
        padding = rng.random((b, tk)) < 0.3
        padding[:, 0] = False
        inputs["key_padding_mask"] = padding
    if "float-padding" in mask:  # added to the scores of every query (torch's regular path)
        padding = rng.normal(0, 1, (b, tk)).astype(nd)
        blocked = rng.random((b, tk)) < 0.3
        blocked[:, 0] = False
        padding[blocked] = -np.inf
        inputs["key_padding_mask"] = padding
    if "causal" in mask:
        flags.append("--causal")
        causal = np.triu(np.ones((tq, tk), dtype=bool), 1)
        if attn_mask is None:
            torch_mask = causal
        else:
            torch_mask = attn_mask | causal  # (B*H, T_q, T_k) | (T_q, T_k)
    else:
        torch_mask = attn_mask
    if attn_mask is not None:
        inputs["attn_mask"] = attn_mask
    if case["need_weights"]:
        flags.append("--need-weights")
    if case["dtype"] == "float64":
        flags.append("--double")
    if case["unbatched"]:
        for name in ("query", "key", "value", "key_padding_mask"):  # batch of 1 -> none
            if name in inputs:
                inputs[name] = inputs[name][0]
    kwargs = {}
    if torch_mask is not None:
        kwargs["attn_mask"] = torch.from_numpy(np.ascontiguousarray(torch_mask))
    if "key_padding_mask" in inputs:
        kwargs["key_padding_mask"] = torch.from_numpy(inputs["key_padding_mask"])
    return mha, inputs, flags, kwargs


def describe(case):
    parts = ["cross" if case["cross"] else "self"]
    if case["cross"] and (case["kdim"] != case["embed"] or case["vdim"] != case["embed"]):
        parts.append(f"kdim={case['kdim']},vdim={case['vdim']}")
    parts.append("bias" if case["bias"] else "no-bias")
    parts.append(case["mask"])
    if case["need_weights"]:
        parts.append("weights")
    if case["unbatched"]:
        parts.append("unbatched")
    if case["nan_rows"]:
        parts.append("fully-masked-rows")
    return " ".join(parts)


def run_case(torch, attn_run, case, rng, workdir, index, fixtures_dir=None):
    mha, inputs, flags, kwargs = build_case(torch, case, rng)
    tdtype = getattr(torch, case["dtype"])
    q = torch.from_numpy(inputs["query"])
    k = torch.from_numpy(inputs["key"]) if "key" in inputs else q
    v = torch.from_numpy(inputs["value"]) if "value" in inputs else q
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Byte tensor for attn_mask")  # U8: deprecated
        y, w = mha(q, k, v, need_weights=case["need_weights"], **kwargs)
    y = y.to(tdtype).numpy()
    stem = os.path.join(workdir, f"case{index:03d}")
    save_torch_state_dict(mha, stem + ".weights.safetensors")
    save_file(inputs, stem + ".input.safetensors")
    cmd = [attn_run, "--weights", stem + ".weights.safetensors", "--input",
           stem + ".input.safetensors", "--output", stem + ".output.safetensors",
           "--num-heads", str(case["heads"])] + flags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return dict(ok=False, error=proc.stderr.strip(), out_abs=float("nan"),
                    out_rel=float("nan"), w_abs=float("nan"), nan_rows=0)
    got = load_file(stem + ".output.safetensors")
    finite_rows = ~np.isnan(y).any(axis=-1)
    nan_rows = int((~finite_rows).sum())
    scale = float(np.abs(y[finite_rows]).max()) if finite_rows.any() else 1.0
    out_abs = float(np.abs(got["output"][finite_rows] - y[finite_rows]).max())
    out_rel = out_abs / max(scale, 1e-30)
    w_abs = 0.0
    if case["need_weights"]:
        w = w.numpy()
        wrows = ~np.isnan(w).any(axis=-1)
        w_abs = float(np.abs(got["weights"][wrows] - w[wrows]).max())
    tol = 1e-5 if case["dtype"] == "float32" else 1e-12
    ok = out_rel <= tol and w_abs <= tol and bool(np.isfinite(got["output"]).all())
    if fixtures_dir is not None:
        name = f"case{index:03d}"
        save_torch_state_dict(mha, os.path.join(fixtures_dir, name + ".weights.safetensors"))
        save_file(inputs, os.path.join(fixtures_dir, name + ".input.safetensors"))
        expected = {"output": np.nan_to_num(y, nan=0.0), "finite_rows": finite_rows}
        if case["need_weights"]:
            expected["weights"] = np.nan_to_num(w, nan=0.0)
        save_file(expected, os.path.join(fixtures_dir, name + ".expected.safetensors"),
                  metadata={"flags": " ".join(flags), "num_heads": str(case["heads"]),
                            "case": describe(case), "torch": torch.__version__})
    return dict(ok=ok, error="", out_abs=out_abs, out_rel=out_rel, w_abs=w_abs,
                nan_rows=nan_rows)


# Small cases (a few KB each) committed as tests/fixtures/io/ for the C++ suite.
FIXTURE_CASES = {0, 3, 7, 10, 12, 17, 20, 22, 25, 44, 45, 52, 53, 54, 55, 56, 59}

# ---- Llama cases (attn_run --format llama vs scripts/llama_reference.py) ----

def make_llama_cases():
    """GQA/MQA, both RoPE conventions, partial rotary, windows, splits, bias on and off."""
    cases = []
    # (dim, heads, kv_heads, head_dim, rotary_dim, interleaved, theta, window, prefill,
    #  chunk, qkv_bias, o_bias, batch, tokens, prefix)
    table = [
        (32, 4, 4, None, None, False, 1e4, 0, None, 1, False, False, 2, 9, ""),
        (32, 4, 4, None, None, True, 1e4, 0, None, 1, True, False, 1, 12, "model.layers.0.self_attn."),
        (48, 3, 3, 16, 8, False, 1e4, 0, None, 1, True, True, 2, 7, ""),     # NeoX partial
        (40, 2, 2, 16, 8, True, 1e4, 0, None, 1, False, False, 1, 10, ""),    # GPT-J partial
        (64, 4, 4, None, None, False, 5e5, 0, None, 1, True, False, 2, 33, ""),
        (24, 2, 2, 16, None, False, 1e6, 0, None, 1, False, True, 1, 5, ""),  # head_dim * H != D
        (64, 8, 2, None, None, False, 1e4, 0, None, 1, False, False, 2, 12, ""),  # GQA
        (32, 4, 1, None, None, True, 5e5, 0, None, 1, True, False, 1, 9, ""),     # MQA
        (32, 4, 2, None, None, False, 1e4, 4, None, 1, False, False, 2, 15, ""),  # window
        (32, 4, 4, None, None, False, 1e4, 0, 5, 1, False, False, 2, 11, ""),     # decode
        (32, 4, 2, None, None, True, 1e4, 0, 3, 4, True, False, 1, 14, "model.layers.3.self_attn."),
        (48, 6, 3, None, 4, False, 1e6, 5, 6, 3, True, True, 2, 17, ""),  # all of it
        # Past one 512-key chunk of the decode kernel: a ring that wraps, then MQA decoding.
        (64, 8, 2, None, None, False, 1e4, 100, 600, 7, True, False, 1, 620, ""),
        (32, 4, 1, None, None, True, 5e5, 0, 530, 2, False, True, 2, 540, ""),
    ]
    for dtype in ("float32", "float64"):
        for (d, h, hkv, hd, r, inter, theta, window, prefill, chunk, qb, ob, b, t,
             prefix) in table:
            cases.append(dict(dtype=dtype, dim=d, heads=h, kv_heads=hkv, head_dim=hd,
                              rotary_dim=r, interleaved=inter, theta=theta, window=window,
                              prefill=prefill, chunk=chunk, qkv_bias=qb, o_bias=ob, batch=b,
                              tokens=t, prefix=prefix))
    return cases


def describe_llama(c):
    hd = c["head_dim"] or c["dim"] // c["heads"]
    parts = [f"H={c['heads']}/{c['kv_heads']}", f"hd={hd}",
             "interleaved" if c["interleaved"] else "rotate_half"]
    if c["rotary_dim"]:
        parts.append(f"rotary={c['rotary_dim']}")
    parts.append(f"theta={c['theta']:g}")
    if c["window"]:
        parts.append(f"window={c['window']}")
    if c["prefill"]:
        parts.append(f"prefill={c['prefill']},chunk={c['chunk']}")
    parts.append(("qkv-bias" if c["qkv_bias"] else "no-bias") + ("+o-bias" if c["o_bias"] else ""))
    if c["prefix"]:
        parts.append("prefix")
    return " ".join(parts)


def run_llama_case(torch, attn_run, c, rng, workdir, index, fixtures_dir=None):
    from llama_reference import llama_attention  # noqa: E402  (same directory)
    nd = np.float32 if c["dtype"] == "float32" else np.float64
    d, h, hkv = c["dim"], c["heads"], c["kv_heads"]
    hd = c["head_dim"] or d // h
    shapes = {"q_proj": (h * hd, d), "k_proj": (hkv * hd, d), "v_proj": (hkv * hd, d),
              "o_proj": (d, h * hd)}
    weights = {}
    for name, shape in shapes.items():
        weights[c["prefix"] + name + ".weight"] = rng.normal(0, shape[1] ** -0.5, shape).astype(nd)
        if (c["qkv_bias"] and name != "o_proj") or (c["o_bias"] and name == "o_proj"):
            weights[c["prefix"] + name + ".bias"] = rng.normal(0, 0.2, shape[0]).astype(nd)
    if c["prefix"]:  # an older Hugging Face checkpoint's buffer, which attn_run ignores
        r = c["rotary_dim"] or hd
        weights[c["prefix"] + "rotary_emb.inv_freq"] = (
            1.0 / (c["theta"] ** (np.arange(0, r, 2) / r))).astype(np.float32)
    x = rng.normal(0, 1, (c["batch"], c["tokens"], d)).astype(nd)
    tw = {k: torch.from_numpy(v) for k, v in weights.items()}
    with torch.no_grad():
        y = llama_attention(tw, torch.from_numpy(x), h, hkv, c["head_dim"], c["theta"],
                            c["rotary_dim"], c["interleaved"], c["window"], c["prefix"]).numpy()
    flags = ["--format", "llama", "--num-heads", str(h), "--num-kv-heads", str(hkv),
             "--rope-theta", repr(c["theta"])]
    if c["head_dim"]:
        flags += ["--head-dim", str(c["head_dim"])]
    if c["rotary_dim"]:
        flags += ["--rotary-dim", str(c["rotary_dim"])]
    if c["interleaved"]:
        flags.append("--rope-interleaved")
    if c["window"]:
        flags += ["--sliding-window", str(c["window"])]
    if c["prefill"]:
        flags += ["--prefill", str(c["prefill"]), "--chunk", str(c["chunk"])]
    if c["prefix"]:
        flags += ["--prefix", c["prefix"]]
    if c["dtype"] == "float64":
        flags.append("--double")
    stem = os.path.join(workdir, f"llama{index:03d}")
    save_file(weights, stem + ".weights.safetensors")
    save_file({"query": x}, stem + ".input.safetensors")
    cmd = [attn_run, "--weights", stem + ".weights.safetensors", "--input",
           stem + ".input.safetensors", "--output", stem + ".output.safetensors"] + flags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return dict(ok=False, error=proc.stderr.strip(), out_abs=float("nan"),
                    out_rel=float("nan"))
    got = load_file(stem + ".output.safetensors")["output"]
    out_abs = float(np.abs(got - y).max())
    out_rel = out_abs / max(float(np.abs(y).max()), 1e-30)
    tol = 1e-5 if c["dtype"] == "float32" else 1e-12
    if fixtures_dir is not None:
        os.makedirs(fixtures_dir, exist_ok=True)
        name = os.path.join(fixtures_dir, f"llama{index:03d}")
        save_file(weights, name + ".weights.safetensors")
        save_file({"query": x}, name + ".input.safetensors")
        save_file({"output": y}, name + ".expected.safetensors",
                  metadata={"flags": " ".join(flags), "case": describe_llama(c),
                            "torch": torch.__version__})
    return dict(ok=out_rel <= tol and bool(np.isfinite(got).all()), error="",
                out_abs=out_abs, out_rel=out_rel)


# Llama cases committed as tests/fixtures/io/llama/ (the small ones: every float32 feature,
# and double with a prefix, partial rotary, GQA, a window and every split).
FIXTURE_LLAMA_CASES = {0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 15, 17, 20, 22, 25}


# ---- backward cases (attn_run --backward vs PyTorch autograd) ----

def make_backward_cases():
    """Self and cross, kdim/vdim, bias on and off, bool and float masks, padding, causal."""
    cases = []
    masks = ["none", "bool2d", "bool3d", "float2d", "float3d", "padding", "causal",
             "causal+padding", "bool2d+padding", "float2d+padding"]
    for dtype in ("float32", "float64"):
        for i, mask in enumerate(masks):
            for cross in (False, True):
                e, h = [(8, 2), (16, 4), (24, 3), (32, 4), (12, 2)][(i + cross) % 5]
                cases.append(dict(
                    dtype=dtype, embed=e, heads=h, bias=bool((i + cross) % 2 == 0),
                    cross=cross, kdim=(e + 4 if cross and i % 3 == 1 else e),
                    vdim=(e // 2 if cross and i % 3 == 2 else e),
                    batch=1 + (i % 3), tq=3 + (i % 5), tk=(2 + ((i * 3) % 7)) if cross else None,
                    mask=mask, need_weights=False, unbatched=False, nan_rows=False))
        cases.append(dict(dtype=dtype, embed=32, heads=4, bias=True, cross=False, kdim=32,
                          vdim=32, batch=2, tq=70, tk=None, mask="causal+padding",
                          need_weights=False, unbatched=False, nan_rows=False))
        cases.append(dict(dtype=dtype, embed=16, heads=2, bias=False, cross=True, kdim=16,
                          vdim=16, batch=1, tq=5, tk=None, mask="bool2d", need_weights=False,
                          unbatched=True, nan_rows=False))
    for c in cases:
        if c["unbatched"]:
            c["tk"] = 7
    return cases


def relative(got, want):
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)


def run_backward_case(torch, attn_run, case, rng, workdir, index, fixtures_dir=None):
    mha, inputs, flags, kwargs = build_case(torch, case, rng)
    tdtype = getattr(torch, case["dtype"])
    nd = np.float32 if case["dtype"] == "float32" else np.float64
    y_shape = inputs["query"].shape
    inputs["grad_output"] = rng.normal(0, 1, y_shape).astype(nd)
    q = torch.from_numpy(inputs["query"]).requires_grad_()
    if "key" in inputs:
        k = torch.from_numpy(inputs["key"]).requires_grad_()
        v = torch.from_numpy(inputs["value"]).requires_grad_()
    else:
        k = v = q  # m(x, x, x): q.grad is the whole gradient of x
    mha.zero_grad()
    y, _ = mha(q, k, v, need_weights=False, **kwargs)
    y.backward(torch.from_numpy(inputs["grad_output"]))
    want = {"output": y.detach().to(tdtype).numpy(), "grad_query": q.grad.numpy()}
    if "key" in inputs:
        want["grad_key"] = k.grad.numpy()
        want["grad_value"] = v.grad.numpy()
    for name, p in mha.named_parameters():
        want["grad." + name] = p.grad.numpy()
    stem = os.path.join(workdir, f"backward{index:03d}")
    save_torch_state_dict(mha, stem + ".weights.safetensors")
    save_file(inputs, stem + ".input.safetensors")
    flags = flags + ["--backward"]
    cmd = [attn_run, "--weights", stem + ".weights.safetensors", "--input",
           stem + ".input.safetensors", "--output", stem + ".output.safetensors",
           "--num-heads", str(case["heads"])] + flags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return dict(ok=False, error=proc.stderr.strip(), worst=float("nan"), worst_name="")
    got = load_file(stem + ".output.safetensors")
    worst, worst_name, missing = 0.0, "", [n for n in want if n not in got]
    for name, w in want.items():
        if name in got:
            r = relative(got[name], w)
            if not r <= worst:  # NaN too
                worst, worst_name = r, name
    tol = 1e-5 if case["dtype"] == "float32" else 1e-10
    if fixtures_dir is not None:
        os.makedirs(fixtures_dir, exist_ok=True)
        name = os.path.join(fixtures_dir, f"backward{index:03d}")
        save_torch_state_dict(mha, name + ".weights.safetensors")
        save_file(inputs, name + ".input.safetensors")
        save_file(want, name + ".expected.safetensors",
                  metadata={"flags": " ".join(flags), "num_heads": str(case["heads"]),
                            "case": describe(case), "torch": torch.__version__})
    return dict(ok=not missing and worst <= tol, error=("missing " + ", ".join(missing))
                if missing else "", worst=worst, worst_name=worst_name)


# Backward cases committed as tests/fixtures/io/backward/ for tests/io/attn_run_backward_test.
FIXTURE_BACKWARD_CASES = {0, 3, 7, 12, 15, 21, 22, 23, 28, 36, 43}


# ---- bfloat16 cases (attn_run --dtype bf16 vs PyTorch's bfloat16 nn.MultiheadAttention) ----

def make_bf16_cases():
    def case(embed, heads, batch, tq, mask, tk=None, kdim=None, vdim=None):
        return dict(dtype="bfloat16", embed=embed, heads=heads, bias=True, cross=tk is not None,
                    kdim=kdim or embed, vdim=vdim or embed, batch=batch, tq=tq, tk=tk,
                    mask=mask, need_weights=False, unbatched=False, nan_rows=False)
    return [case(32, 4, 2, 9, "none"),
            case(64, 8, 2, 13, "padding"),
            case(32, 2, 2, 17, "causal+padding"),
            case(32, 4, 2, 7, "padding", tk=11, kdim=24, vdim=40),
            case(48, 6, 1, 5, "bool2d", tk=19),
            case(64, 4, 2, 33, "padding")]


# Every bfloat16 case is committed as tests/fixtures/io/bf16/.
BF16_TOLERANCE = 1.5e-2  # max |attn - torch| / max |reference|, as tests/io/pytorch_fixtures_test.cpp


def bf16_bits(t):
    """A torch bfloat16 tensor's bits as uint16."""
    import torch
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def run_bf16_case(torch, attn_run, case, rng, workdir, index, fixtures_dir=None):
    e, h, b, tq = case["embed"], case["heads"], case["batch"], case["tq"]
    tk = case["tk"] if case["cross"] else tq
    mha = torch.nn.MultiheadAttention(e, h, dropout=0.0, bias=True, kdim=case["kdim"],
                                      vdim=case["vdim"], batch_first=True)
    with torch.no_grad():
        for name, p in mha.named_parameters():
            if "bias" in name:  # default init zeroes them: make them matter
                p.copy_(torch.from_numpy(rng.normal(0, 0.2, p.shape)).float())
    mha = mha.to(torch.bfloat16).eval()

    def draw(shape):
        return torch.from_numpy(rng.normal(0, 1, shape).astype(np.float32)).to(torch.bfloat16)
    q = draw((b, tq, e))
    k, v = (draw((b, tk, case["kdim"])), draw((b, tk, case["vdim"]))) if case["cross"] else (q, q)
    inputs = {"query": BF16(bf16_bits(q))}
    if case["cross"]:
        inputs["key"], inputs["value"] = BF16(bf16_bits(k)), BF16(bf16_bits(v))
    flags, kwargs, torch_mask = ["--dtype", "bf16"], {}, None
    if "bool2d" in case["mask"]:
        attn_mask = rng.random((tq, tk)) < 0.35
        attn_mask[:, 0] = False
        inputs["attn_mask"] = attn_mask
        torch_mask = attn_mask
    if "padding" in case["mask"]:
        padding = rng.random((b, tk)) < 0.3
        padding[:, 0] = False
        inputs["key_padding_mask"] = padding
        kwargs["key_padding_mask"] = torch.from_numpy(padding)
    if "causal" in case["mask"]:
        flags.append("--causal")
        causal = np.triu(np.ones((tq, tk), dtype=bool), 1)
        torch_mask = causal if torch_mask is None else torch_mask | causal
    if torch_mask is not None:
        kwargs["attn_mask"] = torch.from_numpy(np.ascontiguousarray(torch_mask))
    with torch.no_grad():
        # What a user runs: eval (PyTorch's fused fast path for self-attention without an
        # attn_mask), and the regular path (train() with dropout 0) for comparison.
        y = mha(q, k, v, need_weights=False, **kwargs)[0]
        mha.train()
        y_regular = mha(q, k, v, need_weights=False, **kwargs)[0]
        mha.eval()
        # The same bfloat16 weights and inputs evaluated in float64.
        wide = torch.nn.MultiheadAttention(e, h, dropout=0.0, bias=True, kdim=case["kdim"],
                                           vdim=case["vdim"], batch_first=True).double()
        wide.load_state_dict({n: t.double() for n, t in mha.state_dict().items()})
        wide.train()
        qd = q.double()
        kd, vd = (k.double(), v.double()) if case["cross"] else (qd, qd)
        reference = wide(qd, kd, vd, need_weights=False, **kwargs)[0].numpy()
    y_np, regular_np = y.float().numpy(), y_regular.float().numpy()
    stem = os.path.join(workdir, f"bf16{index:03d}")
    weights = {n: BF16(bf16_bits(t)) for n, t in mha.state_dict().items()}
    save_file(weights, stem + ".weights.safetensors")
    save_file(inputs, stem + ".input.safetensors")
    cmd = [attn_run, "--weights", stem + ".weights.safetensors", "--input",
           stem + ".input.safetensors", "--output", stem + ".output.safetensors",
           "--num-heads", str(h)] + flags
    scale = float(np.abs(reference).max())

    def rel(a, want):
        return float(np.abs(a - want).max()) / scale
    r = dict(ok=False, error="", attn_torch=float("nan"), attn_ref=float("nan"),
             torch_ref=rel(y_np, reference), regular_ref=rel(regular_np, reference),
             torch_regular=rel(y_np, regular_np))
    if attn_run is not None:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            r["error"] = proc.stderr.strip()
            return r
        got = load_file(stem + ".output.safetensors")["output"].astype(np.float64)
        r["attn_torch"], r["attn_ref"] = rel(got, y_np), rel(got, reference)
        r["ok"] = r["attn_torch"] <= BF16_TOLERANCE and bool(np.isfinite(got).all())
    if fixtures_dir is not None:
        os.makedirs(fixtures_dir, exist_ok=True)
        name = os.path.join(fixtures_dir, f"bf16{index:03d}")
        save_file(weights, name + ".weights.safetensors")
        save_file(inputs, name + ".input.safetensors")
        save_file({"output": BF16(bf16_bits(y)), "output_regular": BF16(bf16_bits(y_regular)),
                   "reference": reference.astype(np.float32),
                   "finite_rows": np.ones(reference.shape[:-1], dtype=bool)},
                  name + ".expected.safetensors",
                  metadata={"flags": " ".join(flags), "num_heads": str(h),
                            "case": describe(case), "torch": torch.__version__})
    return r


def run_bf16_cases(torch, attn_run, seed, workdir, fixtures_dir):
    """Every bfloat16 case from its own draws (torch's and numpy's), so `--only bf16` and the
    full run write the same fixtures."""
    torch.manual_seed(seed + 16)
    rng = np.random.default_rng([seed, 16])
    rows = []
    for i, case in enumerate(make_bf16_cases()):
        r = run_bf16_case(torch, attn_run, case, rng, workdir, i, fixtures_dir)
        rows.append((i, case, r))
        print(f"H{i:2d} bf16    {describe(case):55s} attn-torch {r['attn_torch']:.2e}  "
              f"attn-ref {r['attn_ref']:.2e}  torch-ref {r['torch_ref']:.2e}  "
              f"torch regular path-ref {r['regular_ref']:.2e}  "
              f"{'ok' if r['ok'] else 'FAIL'}" + (f"  {r['error']}" if r["error"] else ""),
              flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--attn-run", required=True, help="path of the attn_run executable")
    ap.add_argument("--report", help="write the markdown table and summary here")
    ap.add_argument("--fixtures", help="also write the small fixture cases to this directory")
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--only", choices=["bf16"],
                    help="run (and write the fixtures of) this group only; no report")
    args = ap.parse_args()

    import torch  # Debian: python3-torch (1.13)
    if args.only == "bf16":
        with tempfile.TemporaryDirectory(prefix="attn_parity_") as work:
            rows = run_bf16_cases(torch, args.attn_run, args.seed, work,
                                  os.path.join(args.fixtures, "bf16") if args.fixtures else None)
        return 0 if all(r["ok"] for _, _, r in rows) else 1
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    cases = make_cases(rng)
    if args.fixtures:
        os.makedirs(args.fixtures, exist_ok=True)
    rows, start = [], time.time()
    with tempfile.TemporaryDirectory(prefix="attn_parity_") as work:
        for i, case in enumerate(cases):
            fixtures = args.fixtures if (args.fixtures and i in FIXTURE_CASES) else None
            r = run_case(torch, args.attn_run, case, rng, work, i, fixtures)
            rows.append((i, case, r))
            status = "ok" if r["ok"] else "FAIL"
            print(f"{i:3d} {case['dtype']:7s} {describe(case):55s} out rel {r['out_rel']:.2e}"
                  f"  weights abs {r['w_abs']:.2e}  nan rows {r['nan_rows']}  {status}"
                  + (f"  {r['error']}" if r["error"] else ""), flush=True)
        llama_rows = []
        for i, case in enumerate(make_llama_cases()):
            fixtures = (os.path.join(args.fixtures, "llama")
                        if (args.fixtures and i in FIXTURE_LLAMA_CASES) else None)
            r = run_llama_case(torch, args.attn_run, case, rng, work, i, fixtures)
            llama_rows.append((i, case, r))
            print(f"L{i:2d} {case['dtype']:7s} {describe_llama(case):55s} out rel "
                  f"{r['out_rel']:.2e}  {'ok' if r['ok'] else 'FAIL'}"
                  + (f"  {r['error']}" if r["error"] else ""), flush=True)
        backward_rows = []
        for i, case in enumerate(make_backward_cases()):
            fixtures = (os.path.join(args.fixtures, "backward")
                        if (args.fixtures and i in FIXTURE_BACKWARD_CASES) else None)
            r = run_backward_case(torch, args.attn_run, case, rng, work, i, fixtures)
            backward_rows.append((i, case, r))
            print(f"B{i:2d} {case['dtype']:7s} {describe(case):55s} worst rel {r['worst']:.2e}"
                  f" ({r['worst_name']})  {'ok' if r['ok'] else 'FAIL'}"
                  + (f"  {r['error']}" if r["error"] else ""), flush=True)
        bf16_rows = run_bf16_cases(torch, args.attn_run, args.seed, work,
                                   os.path.join(args.fixtures, "bf16") if args.fixtures else None)
    elapsed = time.time() - start

    failed = [i for i, _, r in rows if not r["ok"]]
    llama_failed = [i for i, _, r in llama_rows if not r["ok"]]

    def llama_worst(dtype, key):
        vals = [r[key] for _, c, r in llama_rows if c["dtype"] == dtype and r["ok"]]
        return max(vals) if vals else float("nan")
    backward_failed = [i for i, _, r in backward_rows if not r["ok"]]
    bf16_failed = [i for i, _, r in bf16_rows if not r["ok"]]

    def bf16_worst(key):
        return max(r[key] for _, _, r in bf16_rows)

    def backward_worst(dtype):
        vals = [r["worst"] for _, c, r in backward_rows if c["dtype"] == dtype and not r["error"]]
        return max(vals) if vals else float("nan")
    def worst(dtype, key):
        vals = [r[key] for _, c, r in rows if c["dtype"] == dtype and r["error"] == ""]
        return max(vals) if vals else float("nan")

    def failures(indices):
        return f"failed: {len(indices)}" + (f" {indices}" if indices else "")
    summary = [
        f"cases: {len(rows)} ({sum(c['dtype'] == 'float32' for _, c, _ in rows)} float32, "
        f"{sum(c['dtype'] == 'float64' for _, c, _ in rows)} float64); "
        f"passed: {len(rows) - len(failed)}; {failures(failed)}",
        f"float32: max output error {worst('float32', 'out_rel'):.2e} relative "
        f"(max abs {worst('float32', 'out_abs'):.2e}), max weights error "
        f"{worst('float32', 'w_abs'):.2e}; tolerance 1e-5",
        f"float64: max output error {worst('float64', 'out_rel'):.2e} relative "
        f"(max abs {worst('float64', 'out_abs'):.2e}), max weights error "
        f"{worst('float64', 'w_abs'):.2e}; tolerance 1e-12",
        f"fully masked rows skipped (NaN in PyTorch, zeros in attn): "
        f"{sum(r['nan_rows'] for _, _, r in rows)} rows in "
        f"{sum(1 for _, _, r in rows if r['nan_rows'])} cases",
        f"Llama cases (`attn_run --format llama` vs scripts/llama_reference.py): "
        f"{len(llama_rows)}; passed: {len(llama_rows) - len(llama_failed)}; "
        f"{failures(llama_failed)}; max output error "
        f"{llama_worst('float32', 'out_rel'):.2e} (float32), "
        f"{llama_worst('float64', 'out_rel'):.2e} (float64) relative",
        f"backward cases (`attn_run --backward` vs PyTorch autograd): {len(backward_rows)}; "
        f"passed: {len(backward_rows) - len(backward_failed)}; {failures(backward_failed)}; "
        f"max gradient error "
        f"{backward_worst('float32'):.2e} (float32, tolerance 1e-5), "
        f"{backward_worst('float64'):.2e} (float64, tolerance 1e-10) relative",
        f"bfloat16 cases (`attn_run --dtype bf16` vs PyTorch's bfloat16 module, eval): "
        f"{len(bf16_rows)}; passed: {len(bf16_rows) - len(bf16_failed)}; "
        f"{failures(bf16_failed)}; max |attn - torch| {bf16_worst('attn_torch'):.2e} "
        f"(tolerance {BF16_TOLERANCE:g}); against a float64 evaluation of the same bfloat16 "
        f"weights and inputs: attn {bf16_worst('attn_ref'):.2e}, PyTorch "
        f"{bf16_worst('torch_ref'):.2e} (its regular path {bf16_worst('regular_ref'):.2e}); "
        f"relative to max |reference|",
        f"torch {torch.__version__}, numpy {np.__version__}, safetensors writer: "
        f"{'safetensors package' if _st_save else 'built-in'}; {elapsed:.1f} s",
    ]
    print("\n".join(summary))
    if args.report:
        with open(args.report, "w") as f:
            f.write("# Parity of attn_run with PyTorch\n\n")
            f.write("Generated by `scripts/parity_vs_pytorch.sh` (runs "
                    "`scripts/parity_vs_pytorch.py`); do not edit by hand.\n\n")
            f.write("Each case builds a random `torch.nn.MultiheadAttention(batch_first=True, "
                    "dropout=0.0)` (random biases), random inputs and masks, saves the "
                    "state_dict and inputs as safetensors, runs `attn_run`, and compares. "
                    "Output error is `max|attn - torch| / max|torch|`; weights error is "
                    "`max|attn - torch|` of the head-averaged weights. Masks: `bool` = "
                    "PyTorch's boolean attn_mask (true = blocked), 2d = (T_q, T_k), 3d = "
                    "(B*H, T_q, T_k); `float` = additive (with some -inf); `padding` = "
                    "key_padding_mask (bool); `u8` = a U8 attn_mask (any nonzero byte blocks; "
                    "PyTorch converts it to bool); `float-padding` = a float key_padding_mask "
                    "(added to the scores); `causal` = `--causal` vs `triu(ones, 1)` in torch. "
                    "Fully masked rows are NaN in PyTorch and zeros in attn; those rows are "
                    "skipped and counted.\n\n")
            f.write("## Summary\n\n")
            for line in summary:
                f.write(f"- {line}\n")
            f.write("\n## Cases\n\n")
            f.write("| # | dtype | case | B | T_q | T_k | E | H | output rel. error "
                    "| output abs. error | weights abs. error | NaN rows skipped | result |\n")
            f.write("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
            for i, c, r in rows:
                tk = c["tk"] if c["cross"] else c["tq"]
                w = f"{r['w_abs']:.2e}" if c["need_weights"] else "-"
                f.write(f"| {i} | {c['dtype']} | {describe(c)} | "
                        f"{'-' if c['unbatched'] else c['batch']} | {c['tq']} | {tk} | "
                        f"{c['embed']} | {c['heads']} | {r['out_rel']:.2e} | {r['out_abs']:.2e} "
                        f"| {w} | {r['nan_rows']} | {'pass' if r['ok'] else 'FAIL'} |\n")
            f.write("\n## Llama cases\n\n")
            f.write("`attn_run --format llama` against Hugging Face's `LlamaAttention` forward "
                    "(causal, RoPE at positions 0..T-1) written out in "
                    "`scripts/llama_reference.py`, on random weights and hidden states. "
                    "`H=a/b`: query/key-value heads; `prefill=N,chunk=C`: the first N tokens "
                    "in one step through a KV cache, then C at a time (otherwise all T in one "
                    "step).\n\n")
            f.write("| # | dtype | case | B | T | D | output rel. error | output abs. error "
                    "| result |\n")
            f.write("|---:|---|---|---:|---:|---:|---:|---:|---|\n")
            for i, c, r in llama_rows:
                result = "pass" if r["ok"] else "FAIL"
                f.write(f"| L{i} | {c['dtype']} | {describe_llama(c)} | {c['batch']} | "
                        f"{c['tokens']} | {c['dim']} | {r['out_rel']:.2e} | {r['out_abs']:.2e} "
                        f"| {result} |\n")
            f.write("\n## Backward cases\n\n")
            f.write("`attn_run --backward` against PyTorch autograd: `y.backward(grad_output)` "
                    "with a random `grad_output`; the worst of the output's and every "
                    "gradient's `max|attn - torch| / max|torch|` (grad_query, grad_key, "
                    "grad_value, grad.<parameter>), and which tensor it was.\n\n")
            f.write("| # | dtype | case | B | T_q | T_k | E | H | worst rel. error | in | "
                    "result |\n")
            f.write("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|\n")
            for i, c, r in backward_rows:
                tk = c["tk"] if c["cross"] else c["tq"]
                f.write(f"| B{i} | {c['dtype']} | {describe(c)} | "
                        f"{'-' if c['unbatched'] else c['batch']} | {c['tq']} | {tk} | "
                        f"{c['embed']} | {c['heads']} | {r['worst']:.2e} | {r['worst_name']} "
                        f"| {'pass' if r['ok'] else 'FAIL'} |\n")
            f.write("\n## bfloat16 cases\n\n")
            f.write("`attn_run --dtype bf16` against PyTorch's `nn.MultiheadAttention` after "
                    "`.to(torch.bfloat16).eval()`, on BF16 weights and inputs; each error is "
                    "`max|a - b| / max|reference|`, the reference being the same bfloat16 "
                    "weights and inputs evaluated in float64 (docs/precision.md).\n\n")
            f.write("| # | case | B | T_q | T_k | E | H | attn - torch | attn - reference | "
                    "torch - reference | torch regular path - reference | result |\n")
            f.write("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
            for i, c, r in bf16_rows:
                tk = c["tk"] if c["cross"] else c["tq"]
                f.write(f"| H{i} | {describe(c)} | {c['batch']} | {c['tq']} | {tk} | "
                        f"{c['embed']} | {c['heads']} | {r['attn_torch']:.2e} | "
                        f"{r['attn_ref']:.2e} | {r['torch_ref']:.2e} | {r['regular_ref']:.2e} "
                        f"| {'pass' if r['ok'] else 'FAIL'} |\n")
    return 1 if failed or llama_failed or backward_failed or bf16_failed else 0


if __name__ == "__main__":
    sys.exit(main())
