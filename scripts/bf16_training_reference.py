#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/bf16_training_reference.py: PyTorch 1.13's training of a bfloat16
# nn.MultiheadAttention, written as the fixtures tests/io/bf16_training_test.cpp checks attn
# against (no Python at test time):
#
#   /usr/bin/python3 scripts/bf16_training_reference.py [--fixtures tests/fixtures/io]
#       [--seed 20240607]
#
# bf16_backward/: forward and backward of the module after .to(torch.bfloat16) (train mode,
# dropout 0: PyTorch's regular path; self and cross with kdim/vdim, key padding, a boolean and a
# causal mask), as `attn_run --dtype bf16 --backward` reads and writes them: the BF16 weights,
# the BF16 inputs and grad_output, and expected.safetensors with PyTorch's BF16 output and
# gradients (`output`, `grad_query`, `grad_key`, `grad_value`, `grad.<name>`) and the same
# names under `reference.`: a float64 autograd run on the same BF16 weights and inputs.
#
# bf16_adamw/: three steps of mixed-precision AdamW, written by hand as PyTorch users do: the
# bfloat16 module, float32 master copies of its parameters, torch.optim.AdamW
# (foreach=False) over the masters; per step the module's BF16 gradients (`step<i>.grad.<name>`),
# then master.grad = param.grad.float(), opt.step(), param.copy_(master), and the masters
# (`step<i>.master.<name>`, F32) and the module's weights (`step<i>.weight.<name>`, BF16)
# after it. The initial weights are `weight.<name>`.
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_vs_pytorch import BF16, bf16_bits, relative, save_file  # noqa: E402


def bf16(t):
    """A BF16 copy of a bfloat16 tensor's bits (bf16_bits() shares the tensor's memory, which
    later steps overwrite)."""
    return BF16(bf16_bits(t).copy())


def cases():
    def case(embed, heads, batch, tq, mask, tk=None, kdim=None, vdim=None):
        return dict(embed=embed, heads=heads, batch=batch, tq=tq, tk=tk, kdim=kdim or embed,
                    vdim=vdim or embed, mask=mask)
    return [case(32, 4, 2, 9, "none"),
            case(32, 2, 2, 13, "causal+padding"),
            case(32, 4, 2, 7, "padding", tk=11, kdim=24, vdim=40),
            case(48, 6, 1, 5, "bool2d", tk=19)]


def describe(c):
    parts = ["cross" if c["tk"] else "self", f"E={c['embed']}", f"H={c['heads']}"]
    if c["tk"]:
        parts.append(f"tk={c['tk']},kdim={c['kdim']},vdim={c['vdim']}")
    parts.append(c["mask"])
    return " ".join(parts)


def build(c, rng):
    """The bfloat16 module (random biases), its BF16 inputs, the masks as attn_run reads them
    and as PyTorch takes them, and the attn_run flags."""
    e, b, tq = c["embed"], c["batch"], c["tq"]
    tk = c["tk"] or tq
    mha = torch.nn.MultiheadAttention(e, c["heads"], dropout=0.0, bias=True, kdim=c["kdim"],
                                      vdim=c["vdim"], batch_first=True)
    with torch.no_grad():
        for name, p in mha.named_parameters():
            if "bias" in name:  # default init zeroes them: make them matter
                p.copy_(torch.from_numpy(rng.normal(0, 0.2, p.shape)).float())
    mha = mha.to(torch.bfloat16).train()

    def draw(shape):
        return torch.from_numpy(rng.normal(0, 1, shape).astype(np.float32)).to(torch.bfloat16)
    x = {"query": draw((b, tq, e))}
    if c["tk"]:
        x["key"], x["value"] = draw((b, tk, c["kdim"])), draw((b, tk, c["vdim"]))
    inputs, kwargs, torch_mask, flags = {}, {}, None, ["--dtype", "bf16", "--backward"]
    if "bool2d" in c["mask"]:
        attn_mask = rng.random((tq, tk)) < 0.35
        attn_mask[:, 0] = False
        inputs["attn_mask"] = attn_mask
        torch_mask = attn_mask
    if "padding" in c["mask"]:
        padding = rng.random((b, tk)) < 0.3
        padding[:, 0] = False
        inputs["key_padding_mask"] = padding
        kwargs["key_padding_mask"] = torch.from_numpy(padding)
    if "causal" in c["mask"]:
        flags.append("--causal")
        causal = np.triu(np.ones((tq, tk), dtype=bool), 1)
        torch_mask = causal if torch_mask is None else torch_mask | causal
    if torch_mask is not None:
        kwargs["attn_mask"] = torch.from_numpy(np.ascontiguousarray(torch_mask))
    return mha, x, inputs, kwargs, flags


def forward_backward(mha, x, kwargs, grad_output):
    """y = mha(q, k, v), y.backward(grad_output): the output and every gradient by attn_run's
    names. Self-attention runs as m(x, x, x): grad_query is the whole gradient of x."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
    q = leaves["query"]
    k, v = (leaves["key"], leaves["value"]) if "key" in leaves else (q, q)
    mha.zero_grad()
    y = mha(q, k, v, need_weights=False, **kwargs)[0]
    y.backward(grad_output)
    out = {"output": y.detach()}
    for n, t in leaves.items():
        out["grad_" + n] = t.grad
    for n, p in mha.named_parameters():
        out["grad." + n] = p.grad.detach().clone()
    return out


def write_backward(fixtures, c, rng, index):
    mha, x, inputs, kwargs, flags = build(c, rng)
    grad_output = torch.from_numpy(
        rng.normal(0, 1, x["query"].shape).astype(np.float32)).to(torch.bfloat16)
    got = forward_backward(mha, x, kwargs, grad_output)
    # The same BF16 weights, inputs and grad_output in float64.
    wide = torch.nn.MultiheadAttention(c["embed"], c["heads"], dropout=0.0, bias=True,
                                       kdim=c["kdim"], vdim=c["vdim"], batch_first=True).double()
    wide.load_state_dict({n: t.double() for n, t in mha.state_dict().items()})
    ref = forward_backward(wide, {n: t.double() for n, t in x.items()}, kwargs,
                           grad_output.double())
    for n, t in x.items():
        inputs[n] = bf16(t)
    inputs["grad_output"] = bf16(grad_output)
    expected = {n: bf16(t) for n, t in got.items()}
    expected.update({"reference." + n: t.detach().numpy() for n, t in ref.items()})
    stem = os.path.join(fixtures, "bf16_backward", f"bf16_backward{index:03d}")
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    save_file({n: bf16(t) for n, t in mha.state_dict().items()},
              stem + ".weights.safetensors")
    save_file(inputs, stem + ".input.safetensors")
    save_file(expected, stem + ".expected.safetensors",
              metadata={"flags": " ".join(flags), "num_heads": str(c["heads"]),
                        "case": describe(c), "torch": torch.__version__})
    worst = max(relative(got[n].double().numpy(), ref[n].detach().numpy()) for n in got)
    print(f"bf16_backward{index:03d} {describe(c):45s} PyTorch bf16 vs float64: "
          f"worst {worst:.2e} (max |a - x| / max |x| per tensor)")


def write_adamw(fixtures, rng, steps=3):
    c = cases()[0]
    mha, x, _, kwargs, _ = build(c, rng)
    names = [n for n, _ in mha.named_parameters()]
    params = [p for _, p in mha.named_parameters()]
    out = {"weight." + n: bf16(p) for n, p in zip(names, params)}
    masters = [p.detach().float().clone().requires_grad_() for p in params]
    # lr 1e-3 (each step moves a weight by about lr, a fraction of its bfloat16 ulp for most
    # weights here: the masters keep what the rounded weights lose), weight decay on.
    opt = torch.optim.AdamW(masters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            foreach=False)
    for step in range(steps):
        grad_output = torch.from_numpy(
            rng.normal(0, 1, x["query"].shape).astype(np.float32)).to(torch.bfloat16)
        mha.zero_grad()
        y = mha(x["query"], x["query"], x["query"], need_weights=False, **kwargs)[0]
        y.backward(grad_output)
        for n, p, m in zip(names, params, masters):
            out[f"step{step}.grad.{n}"] = bf16(p.grad)
            m.grad = p.grad.float()
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
        for n, p, m in zip(names, params, masters):
            out[f"step{step}.master.{n}"] = m.detach().numpy().copy()
            out[f"step{step}.weight.{n}"] = bf16(p)
    path = os.path.join(fixtures, "bf16_adamw", "adamw.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(out, path, metadata={"case": describe(c), "num_heads": str(c["heads"]),
                                   "steps": str(steps), "lr": "1e-3", "weight_decay": "0.01",
                                   "torch": torch.__version__})
    moved = sum(int((out[f"step{steps - 1}.weight.{n}"].bits != out["weight." + n].bits).sum())
                for n in names)
    total = sum(p.numel() for p in params)
    print(f"bf16_adamw: {steps} steps; {moved} of {total} bfloat16 weights changed")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--fixtures", default=os.path.join(here, "..", "tests", "fixtures", "io"))
    ap.add_argument("--seed", type=int, default=20240607)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng([args.seed, 17])
    for i, c in enumerate(cases()):
        write_backward(args.fixtures, c, rng, i)
    write_adamw(args.fixtures, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
