#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# fuzz/make_corpus.py: writes the committed seed corpora fuzz/corpus/<target>/ (deterministic;
# needs numpy only). Re-run after changing a target's input format.
import hashlib
import os
import random
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from parity_vs_pytorch import load_file  # noqa: E402
import parity_vs_pytorch as pv  # noqa: E402


def to_bytes(tensors, metadata=None):
    path = os.path.join(HERE, ".tmp.safetensors")
    pv._st_save = None  # always the built-in writer: stable bytes
    pv.save_file(tensors, path, metadata)
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    return data


def raw(header, data=b""):
    h = header.encode()
    return struct.pack("<Q", len(h)) + h + data


def write(target, blobs):
    out = os.path.join(HERE, "corpus", target)
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        os.remove(os.path.join(out, old))
    for blob in blobs:
        with open(os.path.join(out, hashlib.sha1(blob).hexdigest()[:16]), "wb") as f:
            f.write(blob)
    print(f"{target}: {len(blobs)} seeds")


def safetensors_seeds():
    rng = np.random.default_rng(1)
    fixtures = os.path.join(HERE, "..", "tests", "fixtures", "io")
    seeds = []
    for name in ("case000.weights", "case000.input", "case010.input", "case044.input"):
        with open(os.path.join(fixtures, name + ".safetensors"), "rb") as f:
            seeds.append(f.read())
    # weights under "w." plus inputs in one file: the target runs the whole runner on it
    e, h = 4, 2
    w = {"w.in_proj_weight": rng.normal(0, 0.5, (3 * e, e)).astype(np.float32),
         "w.in_proj_bias": rng.normal(0, 0.1, (3 * e,)).astype(np.float32),
         "w.out_proj.weight": rng.normal(0, 0.5, (e, e)).astype(np.float32),
         "w.out_proj.bias": rng.normal(0, 0.1, (e,)).astype(np.float32)}
    q = rng.normal(0, 1, (2, 3, e)).astype(np.float32)
    seeds.append(to_bytes({**w, "query": q}))
    seeds.append(to_bytes({**w, "query": q, "attn_mask": np.triu(np.ones((3, 3), bool), 1),
                           "key_padding_mask": np.array([[0, 0, 1], [0, 0, 0]], bool)}))
    seeds.append(to_bytes({**w, "query": q, "key": q[:, :2], "value": q[:, :2],
                           "attn_mask": rng.normal(0, 1, (2 * h, 3, 2)).astype(np.float32)}))
    seeds.append(to_bytes({"w.q_proj_weight": np.ones((4, 4), np.float32),
                           "w.k_proj_weight": np.ones((4, 2), np.float32),
                           "w.v_proj_weight": np.ones((4, 3), np.float32),
                           "w.out_proj.weight": np.eye(4, dtype=np.float64),
                           "query": q, "key": np.ones((2, 5, 2), np.float16),
                           "value": np.ones((2, 5, 3), np.float32)}, {"format": "pt"}))
    seeds.append(to_bytes({"W_query.weight": np.ones((4, 3), np.float32),
                           "W_key.weight": np.ones((4, 3), np.float32),
                           "W_value.weight": np.ones((4, 3), np.float32),
                           "out_proj.weight": np.ones((4, 4), np.float32),
                           "mask": np.triu(np.ones((6, 6), np.float32), 1)}))
    seeds.append(to_bytes({"b": np.array([True, False]), "i": np.arange(6, dtype=np.int64),
                           "h": np.arange(4, dtype=np.float16).reshape(2, 2),
                           "s": np.array(3.0, dtype=np.float32)}))
    # malformed
    seeds.append(raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                     '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12)))
    seeds.append(raw('{"a":{"dtype":"BF16","shape":[0,4294967296],"data_offsets":[0,0]}}'))
    seeds.append(raw('{"__metadata__":{"k":"v"},"a":{"dtype":"F8_E5M2","shape":[1],'
                     '"data_offsets":[0,1]}}', b"\x01"))
    seeds.append(raw('[1,2,{"a":null}]'))
    seeds.append(struct.pack("<Q", 1 << 62) + b"{}")
    seeds += hardening_seeds(w, q)
    return seeds


def deep(n):
    return "[" * n + "]" * n


# Hardening inputs: each class of bad input has a seed. The 100000-deep headers are the crash
# corpus: a reader that dumps them recursively into an error message overflows the stack.
def hardening_seeds(w, q):
    seeds = []
    d = deep(100000)
    seeds.append(raw('{"x":' + d + '}'))
    seeds.append(raw('{"w":{"dtype":' + d + ',"shape":[1],"data_offsets":[0,4]}}', bytes(4)))
    seeds.append(raw('{"w":{"dtype":"F32","shape":' + d + ',"data_offsets":[0,4]}}', bytes(4)))
    seeds.append(raw('{"__metadata__":{"k":' + d + '}}'))
    seeds.append(raw('{"x":' + deep(8) + '}'))  # one level past the limit
    seeds.append(raw('{"__metadata__":{"k":"[[[[[[[[[[\\"[[[[["}}'))  # brackets in a string
    seeds.append(raw('{"w":{"dtype":"F32","shape":[' + "-1," * 5000 + '1],"data_offsets":[0,4]}}',
                     bytes(4)))  # a long excerpt
    # duplicate names and keys
    seeds.append(raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                     '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)))
    seeds.append(raw('{"a":{"dtype":"F64","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)))
    seeds.append(raw('{"__metadata__":{"k":"1","k":"2"}}'))
    # sizes: element and byte counts that overflow (the first 24 bytes also feed add_raw)
    seeds.append(raw('{"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}'))
    seeds.append(struct.pack("<QQQ", 1 << 62, 4, 1 << 40) + b'{}')
    # masks: U8 and I64 attn_mask, U8, I64 and float key_padding_mask, float padding + attn_mask
    triu = np.triu(np.ones((3, 3), np.uint8), 1)
    pad = np.array([[0, 0, 1], [0, 1, 0]], np.uint8)
    seeds.append(to_bytes({**w, "query": q, "attn_mask": triu}))
    seeds.append(to_bytes({**w, "query": q, "attn_mask": triu.astype(np.int64)}))
    seeds.append(to_bytes({**w, "query": q, "key_padding_mask": pad}))
    seeds.append(to_bytes({**w, "query": q, "key_padding_mask": pad.astype(np.int64)}))
    fpad = np.where(pad == 1, -np.inf, 0.5).astype(np.float32)
    seeds.append(to_bytes({**w, "query": q, "key_padding_mask": fpad}))
    seeds.append(to_bytes({**w, "query": q, "key_padding_mask": fpad, "attn_mask": triu == 1}))
    return seeds


def attn_run_seeds():
    rng = np.random.default_rng(3)
    e, h = 8, 2
    q = rng.normal(0, 1, (2, 3, e)).astype(np.float32)
    kv = rng.normal(0, 1, (2, 4, e)).astype(np.float32)
    triu = np.triu(np.ones((3, 3), np.uint8), 1)
    pad = np.array([[0, 0, 1, 0], [0, 1, 0, 0]], np.uint8)
    base = "--weights w --input x --output y --num-heads 2"
    cases = [
        (base, {"query": q, "attn_mask": triu}),
        (base + " --causal --need-weights", {"query": q, "key_padding_mask": pad[:, :3] == 1}),
        (base + " --per-head-weights --double",
         {"query": q, "key": kv, "value": kv,
          "attn_mask": rng.random((2 * h, 3, 4)) < 0.3}),
        (base, {"query": q, "key": kv, "value": kv, "key_padding_mask": pad}),
        (base, {"query": q, "key": kv, "value": kv, "key_padding_mask": pad.astype(np.int64)}),
        (base + " --need-weights", {"query": q, "key": kv, "value": kv,
                                    "key_padding_mask": np.where(pad == 1, -np.inf, 0.25)
                                    .astype(np.float32)}),
        (base, {"query": q, "attn_mask": rng.normal(0, 1, (3, 3)).astype(np.float16),
                "key_padding_mask": pad[:, :3].astype(np.float32)}),
        (base, {"query": q[0], "key_padding_mask": pad[0, :3] == 1}),  # unbatched
        (base, {"query": q, "attn_mask": triu.astype(np.int32)}),
        ("--weights w --input x --output y --num-heads 1 --prefix w.",
         {"query": q[:, :, :4], "w.in_proj_weight": rng.normal(0, 0.5, (12, 4)).astype(np.float32),
          "w.out_proj.weight": rng.normal(0, 0.5, (4, 4)).astype(np.float32)}),
        ("--num-heads x", {"query": q}),
        ("--bogus --help", {"query": q}),
        (base + " --num-heads 3", {"query": q}),
    ]
    seeds = [(args + "\n").encode() + to_bytes(t) for args, t in cases]
    seeds.append((base + "\n").encode() + raw('{"query":' + deep(9) + '}'))
    return seeds


def mask_api_seeds():
    rnd = random.Random(7)
    seeds = []
    for mode in range(5):  # mode 4: sizes near and past 2^63
        for n in (8, 40, 200, 800):
            seeds.append(bytes([mode]) + bytes(rnd.randrange(256) for _ in range(n)))
    return seeds


# ---- call sequences: byte encoders mirroring the decoders of kv_cache_fuzz.cpp and
#      training_fuzz.cpp (one byte per choice; values are (byte - 128) / 64) ----


def idx(*values):
    """Index bytes: 0-251 are taken modulo the extent; 255 (negative), 253 (far past the end)
    and 252 (near INT64_MAX) read one more byte, 254 is the extent itself."""
    out = []
    for v in values:
        out += [v, 0] if v in (252, 253, 255) else [v]
    return out


def kv_cache_seed(rnd, batch, kv_heads, group, head_dim, d, bias, rope, interleaved, window,
                  max_chunk, capacity, ops):
    """A KVCache session: the setup (batch 1-3, key/value heads 1-2, query heads per group
    1-2, head_dim 2 or 4, d_in 2-8, window 0 or 1-6, max_chunk 1-4, capacity 2-41) and ops."""
    out = [batch - 1, kv_heads - 1, group - 1, head_dim // 2 - 1, d - 2, bias, rope, interleaved]
    out += [0, window - 1] if window else [1]
    out += [max_chunk - 1, capacity - 2, rnd.randrange(256)]
    for op in ops:
        kind = op[0]
        if kind == "forward":  # (t tokens per item, in place)
            _, t, in_place = op
            out += [0, t - 1] + [rnd.randrange(256) for _ in range(batch * t * d)]
            out += [0 if in_place else 1]
        elif kind == "truncate":  # (item, tokens kept)
            out += [4] + idx(op[1], op[2])
        elif kind == "reorder":  # (sources,)
            out += [5, 1] + idx(*op[1])
        elif kind == "advance":  # (t, first item, items + 1)
            out += [6] + idx(op[1], op[2], op[3])
        elif kind == "append":  # (first item, items - 1, t < 4)
            first, items, t = op[1], op[2], op[3]
            out += [7] + idx(first) + [items] + idx(t)
            out += [rnd.randrange(256) for _ in range(2 * (items + 1) * kv_heads * t * head_dim)]
        elif kind == "next_rows":  # (t,): t < 3 rows are written, a hostile t is refused
            t = op[1]
            out += [8] + idx(t)
            if t < 3:
                out += [rnd.randrange(256) for _ in range(2 * batch * kv_heads * t * head_dim)]
        elif kind == "access":  # (item, head, position)
            out += [9] + idx(op[1], op[2], op[3])
        elif kind == "other":  # another module on the cache
            out += [10]
        elif kind == "reset":
            out += [11]
    return bytes(b % 256 for b in out)


def kv_cache_seeds():
    rnd = random.Random(11)
    seeds = []
    decode = [("forward", 1, False)] * 6
    # plain caches: prefill then decode; ragged truncation; beam reorder; in place
    seeds.append(kv_cache_seed(rnd, 1, 1, 1, 2, 4, 0, 0, 0, 0, 1, 30, [("forward", 5, False)] + decode))
    seeds.append(kv_cache_seed(rnd, 2, 2, 2, 4, 8, 1, 1, 0, 0, 1, 40,
                               [("forward", 3, False), ("truncate", 1, 1)] + decode))
    seeds.append(kv_cache_seed(rnd, 3, 1, 2, 2, 6, 1, 1, 1, 0, 1, 24,
                               [("forward", 4, True), ("reorder", [2, 0, 0]), ("forward", 2, False),
                                ("reorder", [1, 2, 0])] + decode[:3]))
    # rings that wrap: windows 1-6, chunks up to 4, rope in both conventions
    for window, chunk in ((1, 1), (2, 3), (3, 2), (5, 4), (6, 1)):
        seeds.append(kv_cache_seed(rnd, 2, 1, 2, 4, 5, 1, 1, window % 2, window, chunk, 2,
                                   [("forward", 6, False)] + decode + [("truncate", 0, 9)] + decode))
    # hand-written rows, next_rows, advance, accessors, another module, reset
    seeds.append(kv_cache_seed(rnd, 2, 2, 1, 2, 3, 0, 0, 0, 0, 1, 16,
                               [("append", 0, 1, 3), ("next_rows", 2), ("access", 1, 1, 4),
                                ("forward", 2, False), ("other",), ("reset",), ("other",)]))
    seeds.append(kv_cache_seed(rnd, 2, 1, 1, 4, 4, 1, 0, 0, 3, 2, 2,
                               [("append", 1, 0, 2), ("advance", 1, 0, 2), ("forward", 2, False),
                                ("access", 0, 0, 7), ("other",)] + decode))
    # hostile: items, heads, positions and counts out of range (255: negative, 254: n,
    # 253: far past n, 252: near INT64_MAX)
    seeds.append(kv_cache_seed(rnd, 2, 2, 2, 2, 4, 0, 1, 1, 0, 1, 8,
                               [("advance", 255, 0, 1), ("advance", 1, 255, 1), ("advance", 1, 0, 252),
                                ("advance", 252, 1, 0), ("truncate", 254, 0), ("truncate", 0, 255),
                                ("reorder", [1, 253]), ("access", 252, 254, 255), ("append", 253, 1, 1),
                                ("next_rows", 255), ("forward", 6, False), ("forward", 6, False)]))
    seeds.append(kv_cache_seed(rnd, 1, 1, 1, 2, 2, 1, 1, 0, 2, 1, 2,
                               [("advance", 2, 0, 0), ("advance", 252, 0, 0), ("truncate", 0, 253),
                                ("access", 0, 0, 253)] + decode))
    for _ in range(12):  # random sessions
        seeds.append(bytes(rnd.randrange(256) for _ in range(rnd.choice((40, 120, 400)))))
    return seeds


def training_seed(rnd, kind, extra, ops, d=4, d2=4, hd=2, kv_heads=1, group=2, bias=1,
                  dropout=False):
    """A training session: the module (kind 0 simple, 1 SelfAttention, 2 CausalAttention,
    3 wrapper, 4 MultiHeadAttention, 7 CrossAttention; `extra` its own choice bytes) and ops
    (forward and backward bytes are random; a backward last may consume the rest)."""
    out = [rnd.randrange(256), 0 if dropout else 1, bias, hd - 1, kv_heads - 1, group - 1,
           d - 1, d2 - 1, kind] + list(extra)
    for op in ops:
        if op == "forward":
            out += [0] + [rnd.randrange(256) for _ in range(rnd.choice((20, 60, 140)))]
        elif op == "backward":
            out += [3] + [rnd.randrange(256) for _ in range(rnd.choice((40, 200, 600)))]
        else:
            out += {"zero": [5], "sgd": [6, 1], "adamw": [6, 0], "freeze": [7], "eval": [8, 0],
                    "train": [8, 1], "hostile0": [9, 0], "hostile1": [9, 1],
                    "hostile2": [9, 2], "replace": [10]}[op]
    return bytes(b % 256 for b in out)


def training_seeds():
    rnd = random.Random(13)
    seeds = []
    step = ["forward", "backward", "sgd", "forward", "backward"]
    kinds = [  # (kind, the kind's own choice bytes)
        (0, [0]), (0, [1]),  # SimpleSelfAttention, scaled or not
        (1, [0]), (1, [1]),  # SelfAttention: nn.Linear form, raw (d_in, d_out) form
        (2, []), (3, []),  # CausalAttention, the wrapper
        # MultiHeadAttention: d_out 4, out_bias, causal, window 2, rope half-split, on x
        (4, [3, 1, 1, 1, 1, 1, 0, 0]),
        # on query/key/value with kdim 3, vdim 5, not causal, no rope
        (5, [5, 0, 0, 0, 1, 0, 2, 0, 4]),
        # grouped-query, causal without window, interleaved rope, key = value width
        (6, [7, 1, 1, 0, 1, 1, 1, 1, 1]),
        (7, []),  # CrossAttention
    ]
    for kind, extra in kinds:
        for dropout in (False, True):
            seeds.append(training_seed(rnd, kind, extra, step, dropout=dropout))
        seeds.append(training_seed(rnd, kind, extra,
                                   ["forward", "zero", "backward", "adamw", "freeze", "forward",
                                    "eval", "forward", "backward"], bias=0, d=3, d2=5, hd=3,
                                   kv_heads=2, group=1))
        seeds.append(training_seed(rnd, kind, extra,
                                   ["forward", "hostile0", "hostile1", "hostile2", "replace",
                                    "sgd", "forward", "backward"]))
    for _ in range(8):  # random sessions
        seeds.append(bytes(rnd.randrange(256) for _ in range(rnd.choice((60, 300, 1200)))))
    return seeds


TARGETS = {
    "safetensors_fuzz": lambda: safetensors_seeds(),
    "mask_api_fuzz": lambda: mask_api_seeds(),
    "attn_run_fuzz": lambda: attn_run_seeds(),
    "kv_cache_fuzz": lambda: kv_cache_seeds(),
    "training_fuzz": lambda: training_seeds(),
}

if __name__ == "__main__":
    # Every target's seeds, or only those named: make_corpus.py kv_cache_fuzz training_fuzz
    for target in sys.argv[1:] or list(TARGETS):
        write(target, TARGETS[target]())
