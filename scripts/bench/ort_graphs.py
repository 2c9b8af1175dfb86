#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bench/ort_graphs.py: writes the ONNX graphs that scripts/bench/ort_mha.js times
# with ONNX Runtime, one directory per shape, together with the input and the output of
# PyTorch's nn.MultiheadAttention on it (the reference every graph is checked against
# before it is timed). Used by scripts/bench_vs_pytorch.sh; graphs go to the build tree.
#
# Usage: /usr/bin/python3 scripts/bench/ort_graphs.py --out DIR --shape "B Tq Tk D H causal cross"
#            [--shape ...] [--force]
# Needs Debian's python3-torch and python3-onnx (1.12). Each shape lands in
# DIR/<tag>/ (tag like b8_tq512_tk512_d512_h8_c0_x0) with
#   x.bin (self) or xq.bin + xkv.bin (cross)  the input, float32, (B, T, D) row-major
#   ref.bin                                    nn.MultiheadAttention's output (B, Tq, D)
#   <form>.onnx                                one graph per form that applies
#   manifest.json                              shape, files, what each graph computes, the
#                                              forms that do not apply and why
# A directory whose manifest was written by this same script (its SHA-256 is recorded) is
# reused unless --force.
#
# The module and input are made exactly as scripts/bench/pytorch_mha.py makes them
# (torch.manual_seed(1234), nn.MultiheadAttention(D, H, bias=True, batch_first=True).eval(),
# input rand * 2 - 1), so all three benchmarks see the same weights. Notation below: x is
# the input (B, T, D) (cross: xq (B, Tq, D), xkv (B, Tk, D)); W_in (3D, D) and b_in (3D) are
# in_proj_weight / in_proj_bias, rows [Wq; Wk; Wv]; W_o, b_o are out_proj's. Every graph does
# the work of nn.MultiheadAttention, y = out_proj(attention(x W_q^T + b_q, x W_k^T + b_k,
# x W_v^T + b_v)), with nothing precomputed beyond transposing the weights:
#   mha        com.microsoft.MultiHeadAttention. Q = MatMul(x, Wq^T), K = MatMul(x, Wk^T),
#              V = MatMul(x, Wv^T) (three ONNX MatMul), MultiHeadAttention(Q, K, V,
#              bias = b_in) adds the biases, splits heads, attends (unidirectional = causal;
#              its CPU flash path runs when not causal), y = MatMul(ctx, W_o^T) + b_o.
#              Self and cross.
#   gqa        com.microsoft.GroupQueryAttention (num_heads = kv_num_heads = H): QKV =
#              MatMul(x, W_in^T) + b_in packed (B, T, 3D), seqlens_k = T - 1, total length T,
#              no past, no rotary; y = MatMul(ctx, W_o^T) + b_o. GQA is always causal, so
#              causal self-attention only. Its present_key / present_value outputs (the
#              K / V cache, (B, H, T, hd)) are written as the op requires.
#   attention  com.microsoft.Attention: Attention(x, W_in^T (D, 3D), b_in) does the QKV
#              projection inside the op (unidirectional = causal); y = MatMul(ctx, W_o^T) +
#              b_o. Self-attention only.
#   torch      what torch.onnx.export (opset 14) writes for the module itself, called as
#              mha(x, x, x, need_weights=False[, attn_mask=triu bool mask]) (cross: mha(xq,
#              xkv, xkv)): MatMul/Add projections, Reshape/Transpose head split, MatMul,
#              Softmax, MatMul, out projection.
# The reference for a shape with more than 256 Mi score entries is computed in query blocks
# of 1024 rows through the same module call (cross form: the block as query, the whole
# input as key and value, the mask rows of the block), which bounds PyTorch's memory; every
# query row attends to all keys in either form, so the result is the same function.

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # ONNX domain of the hand-written graphs; com.microsoft ops are version 1
EXPORT_OPSET = 14  # torch 1.13's default for torch.onnx.export
FORMS = ("mha", "gqa", "attention", "torch")


def shape_tag(s):
    b, tq, tk, d, h, causal, cross = s
    return f"b{b}_tq{tq}_tk{tk}_d{d}_h{h}_c{causal}_x{cross}"


def script_digest():
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make_module(b, tq, tk, d, h, cross):
    """The module and input of scripts/bench/pytorch_mha.py (same seed, same order)."""
    torch.manual_seed(1234)
    mha = torch.nn.MultiheadAttention(d, h, bias=True, batch_first=True).eval()
    xq = torch.rand(b, tq, d) * 2 - 1
    xkv = torch.rand(b, tk, d) * 2 - 1 if cross else xq
    return mha, xq, xkv


def reference(mha, xq, xkv, causal):
    b, tq, _ = xq.shape
    tk = xkv.shape[1]
    mask = torch.triu(torch.ones(tq, tk, dtype=torch.bool), diagonal=1) if causal else None
    with torch.inference_mode():
        if b * mha.num_heads * tq * tk <= (256 << 20):
            return mha(xq, xkv, xkv, need_weights=False, attn_mask=mask)[0]
        blocks = []
        for i in range(0, tq, 1024):
            m = mask[i:i + 1024] if mask is not None else None
            blocks.append(mha(xq[:, i:i + 1024], xkv, xkv, need_weights=False, attn_mask=m)[0])
        return torch.cat(blocks, dim=1)


class Skip(Exception):
    """A form that does not apply to a shape; the message says why."""


def init(name, array):
    return numpy_helper.from_array(np.ascontiguousarray(array), name)


def weights(mha):
    d = mha.embed_dim
    w_in = mha.in_proj_weight.detach().numpy()
    b_in = mha.in_proj_bias.detach().numpy()
    return {
        "w_q_t": w_in[:d].T, "w_k_t": w_in[d:2 * d].T, "w_v_t": w_in[2 * d:].T,
        "w_in_t": w_in.T, "b_in": b_in,
        "w_o_t": mha.out_proj.weight.detach().numpy().T, "b_o": mha.out_proj.bias.detach().numpy(),
    }


def io_values(s):
    b, tq, tk, d, h, causal, cross = s
    f = TensorProto.FLOAT
    inputs = ([helper.make_tensor_value_info("xq", f, [b, tq, d]),
               helper.make_tensor_value_info("xkv", f, [b, tk, d])] if cross else
              [helper.make_tensor_value_info("x", f, [b, tq, d])])
    return inputs, [helper.make_tensor_value_info("y", f, [b, tq, d])]


def out_proj_nodes(ctx):
    return [helper.make_node("MatMul", [ctx, "w_o_t"], ["ctx_o"]),
            helper.make_node("Add", ["ctx_o", "b_o"], ["y"])]


def model(s, name, nodes, inits):
    inputs, outputs = io_values(s)
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    return helper.make_model(graph, producer_name="attn scripts/bench/ort_graphs.py",
                             opset_imports=[helper.make_opsetid("", OPSET),
                                            helper.make_opsetid("com.microsoft", 1)])


def form_mha(s, w):
    b, tq, tk, d, h, causal, cross = s
    xq, xkv = ("xq", "xkv") if cross else ("x", "x")
    nodes = [helper.make_node("MatMul", [xq, "w_q_t"], ["q"]),
             helper.make_node("MatMul", [xkv, "w_k_t"], ["k"]),
             helper.make_node("MatMul", [xkv, "w_v_t"], ["v"]),
             helper.make_node("MultiHeadAttention", ["q", "k", "v", "b_in"], ["ctx"],
                              domain="com.microsoft", num_heads=h, unidirectional=causal)]
    inits = [init(n, w[n]) for n in ("w_q_t", "w_k_t", "w_v_t", "b_in", "w_o_t", "b_o")]
    return model(s, "mha", nodes + out_proj_nodes("ctx"), inits)


def form_gqa(s, w):
    b, tq, tk, d, h, causal, cross = s
    if cross:
        raise Skip("GroupQueryAttention is self-attention only (one sequence length)")
    if not causal:
        raise Skip("GroupQueryAttention is always causal")
    nodes = [helper.make_node("MatMul", ["x", "w_in_t"], ["qkv_nb"]),
             helper.make_node("Add", ["qkv_nb", "b_in"], ["qkv"]),
             helper.make_node("GroupQueryAttention",
                              ["qkv", "", "", "", "", "seqlens_k", "total_sequence_length"],
                              ["ctx", "present_key", "present_value"], domain="com.microsoft",
                              num_heads=h, kv_num_heads=h)]
    inits = [init(n, w[n]) for n in ("w_in_t", "b_in", "w_o_t", "b_o")]
    inits += [init("seqlens_k", np.full([b], tq - 1, dtype=np.int32)),
              init("total_sequence_length", np.array(tq, dtype=np.int32))]
    return model(s, "gqa", nodes + out_proj_nodes("ctx"), inits)


def form_attention(s, w):
    b, tq, tk, d, h, causal, cross = s
    if cross:
        raise Skip("com.microsoft.Attention is self-attention only (one input)")
    nodes = [helper.make_node("Attention", ["x", "w_in_t", "b_in"], ["ctx"],
                              domain="com.microsoft", num_heads=h, unidirectional=causal)]
    inits = [init(n, w[n]) for n in ("w_in_t", "b_in", "w_o_t", "b_o")]
    return model(s, "attention", nodes + out_proj_nodes("ctx"), inits)


class Exported(torch.nn.Module):
    """The module call pytorch_mha.py times, as one forward for torch.onnx.export."""

    def __init__(self, mha, mask, cross):
        super().__init__()
        self.mha, self.mask, self.cross = mha, mask, cross

    def forward(self, xq, xkv=None):
        kv = xkv if self.cross else xq
        return self.mha(xq, kv, kv, need_weights=False, attn_mask=self.mask)[0]


def form_torch(s, mha, xq, xkv, path):
    b, tq, tk, d, h, causal, cross = s
    mask = torch.triu(torch.ones(tq, tk, dtype=torch.bool), diagonal=1) if causal else None
    module = Exported(mha, mask, cross).eval()
    args = (xq, xkv) if cross else (xq,)
    names = ["xq", "xkv"] if cross else ["x"]
    # Gradients on: PyTorch 1.13 takes its fused fast path (aten::_native_multi_head_attention,
    # which has no ONNX export) only when they are off; the regular path is the same maths.
    with torch.enable_grad():
        torch.onnx.export(module, args, path, opset_version=EXPORT_OPSET, input_names=names,
                          output_names=["y"], do_constant_folding=True)


def write_shape(s, out_dir, digest, force):
    tag = shape_tag(s)
    d = os.path.join(out_dir, tag)
    manifest_path = os.path.join(d, "manifest.json")
    if not force and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            old = json.load(f)
        if old.get("generator_sha256") == digest and all(
                os.path.exists(os.path.join(d, fm["file"])) for fm in old["forms"]):
            print(f"{tag}: up to date ({len(old['forms'])} graphs)")
            return
    os.makedirs(d, exist_ok=True)
    b, tq, tk, dim, h, causal, cross = s
    mha, xq, xkv = make_module(b, tq, tk, dim, h, cross)
    ref = reference(mha, xq, xkv, causal)
    files = {"xq": "xq.bin", "xkv": "xkv.bin"} if cross else {"x": "x.bin"}
    xq.numpy().astype("<f4").tofile(os.path.join(d, files["xq" if cross else "x"]))
    if cross:
        xkv.numpy().astype("<f4").tofile(os.path.join(d, files["xkv"]))
    ref.numpy().astype("<f4").tofile(os.path.join(d, "ref.bin"))

    w = weights(mha)
    builders = {"mha": lambda: form_mha(s, w), "gqa": lambda: form_gqa(s, w),
                "attention": lambda: form_attention(s, w)}
    forms, skipped = [], []
    for name in FORMS:
        path = os.path.join(d, f"{name}.onnx")
        try:
            if name == "torch":
                form_torch(s, mha, xq, xkv, path)
            else:
                onnx.save(builders[name](), path)
            forms.append({"name": name, "file": f"{name}.onnx"})
        except Skip as e:
            skipped.append({"name": name, "reason": str(e)})
        except Exception as e:  # an export that fails is reported, not fatal
            skipped.append({"name": name, "reason": f"could not be written: {type(e).__name__}: {e}"})
    manifest = {
        "generator": "scripts/bench/ort_graphs.py", "generator_sha256": digest,
        "onnx": onnx.__version__, "torch": torch.__version__,
        "shape": dict(zip(("B", "Tq", "Tk", "D", "H", "causal", "cross"), s)),
        "inputs": files, "output": "y", "reference": "ref.bin",
        "forms": forms, "skipped": skipped,
    }
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{tag}: {', '.join(fm['name'] for fm in forms) or 'no graphs'}"
          + "".join(f"; {sk['name']} skipped: {sk['reason']}" for sk in skipped))


def main():
    p = argparse.ArgumentParser(description="ONNX graphs of nn.MultiheadAttention for ORT")
    p.add_argument("--out", required=True)
    p.add_argument("--shape", action="append", required=True,
                   help='"B Tq Tk D H causal cross", repeatable')
    p.add_argument("--force", action="store_true")
    a = p.parse_args()
    shapes = []
    for text in a.shape:
        s = tuple(int(v) for v in text.split())
        if len(s) != 7 or s[3] % s[4] or (not s[6] and s[1] != s[2]):
            p.error(f"bad shape '{text}' (B Tq Tk D H causal cross; self needs Tq == Tk)")
        shapes.append(s)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    digest = script_digest()
    for s in shapes:
        write_shape(s, a.out, digest, a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
