#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/onnx/reference.py: the ONNX `Attention` operator (domain ai.onnx, opsets 23 and 24)
# in numpy, computed in float64, written from the operator's definition in the ONNX
# repository (onnx/defs/nn/old.cc: the Attention-23 and Attention-24 schemas and their
# function bodies, onnx/defs/nn/utils.cc: AttentionAppendFunctionCausalMask). The function
# body is the normative definition; where the prose, the function body and ONNX's own
# Python reference (onnx/reference/ops/op_attention.py) differ, this file follows the
# function body and says so at the place (see also docs/onnx.md).
#
# Used by scripts/onnx/make_cases.py to compute the expected outputs of the fixtures in
# tests/fixtures/onnx. As a command it recomputes one fixture and compares:
#   /usr/bin/python3 scripts/onnx/reference.py tests/fixtures/onnx/case001
#
# The computation, for inputs already in the 4-D layout (B, H, S, head_size):
#   present_key   = concat(past_key, K) on the sequence axis     (B, Hkv, T, hd),  T = P + S_kv
#   present_value = concat(past_value, V)                       (B, Hkv, T, vhd)
#   bias          = mask_bias + causal_bias + padding_bias      broadcast to (B, Hq, S_q, T)
#     mask_bias     bool mask: 0 where True, -inf where False; float mask: its values.
#                   Opset 24: a mask whose last axis M is shorter than T is padded on the
#                   right with -inf to T (a last axis of 1 is padded too, not broadcast).
#                   Opset 23: no padding (the last axis must broadcast: M = T or M = 1).
#     causal_bias   is_causal = 1: -inf where j > i + offset, offset = P with a past,
#                   nonpad_kv_seqlen[b] - S_q per batch with nonpad_kv_seqlen and no past
#                   (opset 24), else 0 (top-left, also when S_kv != S_q).
#     padding_bias  nonpad_kv_seqlen (opset 24): -inf where j >= nonpad_kv_seqlen[b].
#   scores  = (Q * sqrt(scale)) @ (K' * sqrt(scale))^T          K' = K with each kv head
#             repeated Hq / Hkv times (head h of Q reads kv head h // (Hq / Hkv))
#   capped  = softcap * tanh(scores / softcap)                  when softcap != 0
#   x       = capped + bias
#   probs   = softmax(x) over the last axis, in softmax_precision (FLOAT16 / BFLOAT16:
#             x rounded to that type, the softmax rounded to it; FLOAT / DOUBLE: exact here)
#   probs   = 0 on a row whose bias is -inf everywhere (the fully-masked-row guard)
#   Y       = probs @ V'                                        (B, Hq, S_q, vhd), 3-D: (B, S_q, Hq*vhd)
#   qk_matmul_output: mode 0 scores, 1 capped (scores without softcap), 2 x, 3 probs.

import os
import sys

import numpy as np

FLOAT, FLOAT16, DOUBLE, BFLOAT16 = 1, 10, 11, 16
SOFTMAX_PRECISIONS = (FLOAT, FLOAT16, DOUBLE, BFLOAT16)
NEG_INF = -np.inf


class SpecError(ValueError):
    """Inputs or attributes the operator's definition does not accept."""


def _round_bf16(x):
    """float64 -> nearest bfloat16 (via float32, round to nearest even), back as float64."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    finite = np.isfinite(f)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = np.where(finite, rounded.view(np.float32), f)
    return out.astype(np.float64)


def _midpoint_margin(x, precision):
    """The smallest distance, in units in the last place of `precision`, between a finite
    nonzero value of x and a rounding midpoint of that type (0.5 ulp: x is far from any tie)."""
    v = np.abs(x[np.isfinite(x) & (x != 0)])
    if v.size == 0:
        return 0.5
    e = np.floor(np.log2(v))
    ulp = 2.0 ** (np.maximum(e, -14) - 10) if precision == FLOAT16 else 2.0 ** (np.maximum(e, -126) - 7)
    frac = v / ulp - np.floor(v / ulp)
    return float(np.min(np.abs(frac - 0.5)))


def _round_to(x, precision):
    if precision == FLOAT16:
        return x.astype(np.float16).astype(np.float64)
    if precision == BFLOAT16:
        return _round_bf16(x)
    return x


def _check(cond, msg):
    if not cond:
        raise SpecError(msg)


def _to_4d(x, heads, name):
    b, s, hidden = x.shape
    _check(hidden % heads == 0, f"{name}: hidden size {hidden} is not a multiple of {heads} heads")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _broadcast_ok(shape, target):
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target)):
        if s != 1 and s != t:
            return False
    return True


def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
              *, q_num_heads=None, kv_num_heads=None, is_causal=0, scale=None, softcap=0.0,
              qk_matmul_output_mode=None, softmax_precision=None, opset=24, stats=None):
    """Returns {output name: float64 ndarray} of the operator: Y always, present_key and
    present_value when a past is given, qk_matmul_output when qk_matmul_output_mode is not
    None. Attribute values are the ones stored in the model (scale and softcap are float32
    attributes: pass them already rounded to float32). Raises SpecError for inputs the
    definition does not accept. A dict passed as `stats` receives "fully_masked_rows", the
    number of (batch, head, query) rows the guard zeroes, and with a FLOAT16 / BFLOAT16
    softmax_precision "rounding_margin_ulps", how close (in units in the last place of that
    type) the closest value rounded to it lies to a rounding tie."""
    _check(opset in (23, 24), f"opset {opset}: only Attention-23 and Attention-24 are described here")
    rank = Q.ndim
    _check(rank in (3, 4), f"Q must be 3-D or 4-D, got {Q.ndim}-D")
    _check(K.ndim == rank and V.ndim == rank,
           f"Q, K and V must have the same rank, got {Q.ndim}, {K.ndim}, {V.ndim}")
    _check((past_key is None) == (past_value is None), "past_key and past_value go together")
    _check(nonpad_kv_seqlen is None or opset >= 24, "nonpad_kv_seqlen is an Attention-24 input")
    _check(nonpad_kv_seqlen is None or past_key is None,
           "nonpad_kv_seqlen cannot be combined with past_key / past_value")
    _check(softmax_precision is None or softmax_precision in SOFTMAX_PRECISIONS,
           f"softmax_precision {softmax_precision} is not FLOAT, FLOAT16, DOUBLE or BFLOAT16")
    _check(qk_matmul_output_mode is None or qk_matmul_output_mode in (0, 1, 2, 3),
           f"qk_matmul_output_mode {qk_matmul_output_mode} is not 0..3")
    _check(is_causal in (0, 1), f"is_causal {is_causal} is not 0 or 1")
    # The definition multiplies Q and K by sqrt(scale): NaN for a negative scale.
    _check(scale is None or scale >= 0, f"scale {scale} is negative (the definition takes its square root)")

    Q = np.asarray(Q, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    if rank == 3:
        # The function body treats the inputs as 3-D only when both head counts are given.
        _check(q_num_heads is not None and kv_num_heads is not None and q_num_heads > 0 and kv_num_heads > 0,
               "3-D inputs need q_num_heads and kv_num_heads")
        _check(Q.shape[0] == K.shape[0] == V.shape[0],
               f"batch sizes differ: Q {Q.shape[0]}, K {K.shape[0]}, V {V.shape[0]}")
        _check(K.shape[1] == V.shape[1], f"K and V sequence lengths differ: {K.shape[1]} vs {V.shape[1]}")
        q = _to_4d(Q, q_num_heads, "Q")
        k = _to_4d(K, kv_num_heads, "K")
        v = _to_4d(V, kv_num_heads, "V")
    else:
        # The head-count attributes "must be used with 3D inputs": with 4-D inputs the
        # function body would reshape the 4-D tensors as if they were 3-D.
        _check(q_num_heads is None and kv_num_heads is None,
               "q_num_heads / kv_num_heads are for 3-D inputs only")
        q, k, v = Q, K, V
    B, Hq, Sq, hd = q.shape
    _, Hkv, Skv, _ = k.shape
    vhd = v.shape[3]
    _check(k.shape[0] == B and v.shape[0] == B,
           f"batch sizes differ: Q {B}, K {k.shape[0]}, V {v.shape[0]}")
    _check(k.shape[3] == hd, f"Q and K head sizes differ: {hd} vs {k.shape[3]}")
    _check(v.shape[1] == Hkv, f"K and V head counts differ: {Hkv} vs {v.shape[1]}")
    _check(v.shape[2] == Skv, f"K and V sequence lengths differ: {Skv} vs {v.shape[2]}")
    # GQA: the function body repeats kv heads Hq / Hkv times when Hq % Hkv == 0 and reshapes
    # to Hq heads, which fails for any other pair.
    _check(Hq % Hkv == 0, f"q_num_heads {Hq} is not a multiple of kv_num_heads {Hkv}")

    P = 0
    if past_key is not None:
        pk = np.asarray(past_key, dtype=np.float64)
        pv = np.asarray(past_value, dtype=np.float64)
        _check(pk.ndim == 4 and pv.ndim == 4, "past_key and past_value must be 4-D")
        P = pk.shape[2]
        _check(pk.shape == (B, Hkv, P, hd),
               f"past_key shape {list(pk.shape)} is not (batch {B}, kv heads {Hkv}, P, head size {hd})")
        _check(pv.shape == (B, Hkv, P, vhd),
               f"past_value shape {list(pv.shape)} is not (batch {B}, kv heads {Hkv}, {P}, v head size {vhd})")
        present_key = np.concatenate([pk, k], axis=2)
        present_value = np.concatenate([pv, v], axis=2)
    else:
        present_key, present_value = k, v
    T = P + Skv
    full = (B, Hq, Sq, T)

    # Pass 1: the additive bias (mask, causal frontier, padding), broadcastable to `full`.
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        _check(m.dtype == np.bool_ or m.dtype == np.float32,
               f"attn_mask must be BOOL or the type of Q (F32), got {m.dtype}")
        _check(1 <= m.ndim <= 4, f"attn_mask must broadcast to 4-D (batch, heads, q, total), got {m.ndim}-D")
        bias = np.where(m, 0.0, NEG_INF) if m.dtype == np.bool_ else m.astype(np.float64)
        M = bias.shape[-1]
        if opset >= 24:
            _check(M <= T, f"attn_mask's last axis {M} is longer than the total sequence length {T}")
            if M < T:
                pad = [(0, 0)] * (bias.ndim - 1) + [(0, T - M)]
                bias = np.pad(bias, pad, mode="constant", constant_values=NEG_INF)
        _check(_broadcast_ok(bias.shape, full),
               f"attn_mask shape {list(m.shape)} does not broadcast to (batch {B}, q heads {Hq}, "
               f"q length {Sq}, total length {T})")
    else:
        bias = np.zeros((Sq, T))
    i = np.arange(Sq).reshape(Sq, 1)
    j = np.arange(T).reshape(1, T)
    if nonpad_kv_seqlen is not None:
        n = np.asarray(nonpad_kv_seqlen)
        _check(n.dtype == np.int64 and n.shape == (B,),
               f"nonpad_kv_seqlen must be I64 of shape (batch {B},), got {n.dtype} {list(n.shape)}")
        _check(bool(np.all((n >= 0) & (n <= Skv))),
               f"nonpad_kv_seqlen values {n.tolist()} are not in [0, {Skv}]")
    if is_causal:
        if nonpad_kv_seqlen is not None:
            offset = (np.asarray(nonpad_kv_seqlen, dtype=np.int64) - Sq).reshape(B, 1, 1, 1)
            causal = np.where(j.reshape(1, 1, 1, T) > i.reshape(1, 1, Sq, 1) + offset, NEG_INF, 0.0)
        else:
            causal = np.where(j > i + P, NEG_INF, 0.0)
        bias = bias + causal
    if nonpad_kv_seqlen is not None:
        valid = np.arange(Skv).reshape(1, Skv) < np.asarray(nonpad_kv_seqlen).reshape(B, 1)
        bias = bias + np.where(valid, 0.0, NEG_INF).reshape(B, 1, 1, Skv)
    bias = np.broadcast_to(bias, full)

    # Pass 2: scores, softcap, bias, softmax with the fully-masked-row guard, P @ V.
    if scale is None:
        scale = 1.0 / np.sqrt(hd)
    rep = Hq // Hkv
    kx = np.repeat(present_key, rep, axis=1)
    vx = np.repeat(present_value, rep, axis=1)
    scores = float(scale) * np.matmul(q, kx.transpose(0, 1, 3, 2))
    capped = scores
    if softcap:
        capped = float(softcap) * np.tanh(scores / float(softcap))
    x = capped + bias
    xs = _round_to(x, softmax_precision)
    margins = [_midpoint_margin(x, softmax_precision)] if softmax_precision in (FLOAT16, BFLOAT16) else []
    row_max = np.max(xs, axis=-1, keepdims=True)
    dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    e = np.exp(xs - np.where(np.isneginf(row_max), 0.0, row_max))
    s = np.sum(e, axis=-1, keepdims=True)
    probs = e / np.where(s == 0, 1.0, s)
    if margins:
        margins.append(_midpoint_margin(probs, softmax_precision))
    probs = _round_to(probs, softmax_precision)
    probs = np.where(dead, 0.0, probs)
    if stats is not None:
        stats["fully_masked_rows"] = int(np.sum(dead))
        if margins:
            stats["rounding_margin_ulps"] = min(margins)
    y = np.matmul(probs, vx)
    if rank == 3:
        y = y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * vhd)

    out = {"Y": y}
    if past_key is not None:
        out["present_key"] = present_key
        out["present_value"] = present_value
    if qk_matmul_output_mode is not None:
        out["qk_matmul_output"] = {0: scores, 1: capped, 2: x, 3: probs}[qk_matmul_output_mode]
    return out


def attributes_of(case):
    """The keyword attributes of a case.json's "attributes" (float attributes rounded to
    float32, as a model stores them)."""
    a = case["attributes"]
    kw = {"opset": case["opset"]}
    for name in ("q_num_heads", "kv_num_heads", "qk_matmul_output_mode", "softmax_precision"):
        if name in a:
            kw[name] = int(a[name])
    if "is_causal" in a:
        kw["is_causal"] = int(a["is_causal"])
    for name in ("scale", "softcap"):
        if name in a:
            kw[name] = float(np.float32(float(a[name])))
    return kw


INPUT_NAMES = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


def run_case(inputs, case, stats=None):
    """The reference outputs of one fixture's inputs ({name: ndarray}) and case.json."""
    args = [inputs.get(n) for n in INPUT_NAMES]
    return attention(*args, **attributes_of(case), stats=stats)


def main(argv):
    import json
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import safetensors_np as st
    if len(argv) != 2:
        print("usage: reference.py CASE_DIR", file=sys.stderr)
        return 2
    d = argv[1]
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    inputs, _ = st.read(os.path.join(d, "inputs.safetensors"))
    try:
        out = run_case(inputs, case)
    except SpecError as e:
        print(f"refused: {e}")
        return 0 if case.get("expect_error") else 1
    expected, _ = st.read(os.path.join(d, "expected.safetensors"))
    worst = 0.0
    for name, ref in out.items():
        got = expected[name].astype(np.float64)
        ref32 = ref.astype(np.float32).astype(np.float64)
        same = (got == ref32) | (np.isnan(got) & np.isnan(ref32))
        diff = np.where(same, 0.0, np.abs(got - ref32))
        worst = max(worst, float(np.max(diff, initial=0.0)))
        print(f"{name}: shape {list(ref.shape)} max |expected - recomputed| {float(np.max(diff, initial=0.0)):.3g}")
    return 0 if worst == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
