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


if __name__ == "__main__":
    write("safetensors_fuzz", safetensors_seeds())
    write("mask_api_fuzz", mask_api_seeds())
    write("attn_run_fuzz", attn_run_seeds())
