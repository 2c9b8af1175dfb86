#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/llama_reference.py: Hugging Face's LlamaAttention forward (Llama, Mistral, Qwen2)
# written out by hand in PyTorch 1.13, the reference of `attn_run --format llama`.
"""Hugging Face LlamaAttention with a causal mask, by hand in PyTorch 1.13.

    /usr/bin/python3 scripts/llama_reference.py --weights W.safetensors --input X.safetensors \\
        --output Y.safetensors --num-heads H [--num-kv-heads HKV] [--head-dim HD] \\
        [--rope-theta THETA] [--rotary-dim R] [--rope-interleaved] [--sliding-window W] \\
        [--prefix P] [--double]

W holds q_proj.weight (H hd, D), k_proj.weight and v_proj.weight (H_kv hd, D), o_proj.weight
(D, H hd) and optionally q_proj.bias, k_proj.bias, v_proj.bias, o_proj.bias (each name after
the prefix); X holds `query` (B, T, D) hidden states. Y gets `output` (B, T, D):

    q, k, v = x W_q^T + b_q, x W_k^T + b_k, x W_v^T + b_v, split into heads (B, heads, T, hd)
    q, k    = RoPE at positions 0..T-1 (the first rotary_dim features of each head)
    k, v    = repeat_kv(k, H / H_kv), repeat_kv(v, H / H_kv)     (grouped-query attention)
    p       = softmax(q k^T / sqrt(hd) + mask), mask: query i sees keys j <= i, and with a
              sliding window W only j > i - W (Mistral: the keys in (i - W, i])
    output  = (p v merged over heads) W_o^T + b_o

RoPE comes in the two conventions of the upstream code: half-split (`rotate_half`, Hugging
Face Llama/Mistral/Qwen2; GPT-NeoX and Phi with rotary_dim < head_dim) and interleaved pairs
(Meta's Llama `view_as_complex`; GPT-J's `rotate_every_two` when rotary_dim < head_dim).

Precision. float32 computes as Hugging Face does in float32 (RoPE tables in float32 steps,
softmax in float32), with one change attn makes too (attn/nn/rope.hpp): theta ** exponent is
correctly rounded (computed in float64, then rounded) instead of torch's float32 pow, which
is Sleef's and differs by an ulp in about 1.4 % of the entries on this build. --torch-pow
uses torch's own pow instead, to measure what that costs. float64 (--double) computes every
step in float64: Hugging Face would take float32 RoPE tables and a float32 softmax even for a
float64 model, which a float64 reference has no use for.

Also a module: inverse_frequencies(), rope(), repeat_kv(), llama_attention() are what
tests/fixtures/pytorch/generate_rope_fixtures.py and scripts/parity_vs_pytorch.py use.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_vs_pytorch import load_file, save_file  # noqa: E402  (the safetensors I/O)


# ---- rotary embeddings ----

def inverse_frequencies(theta, rotary_dim, dtype, torch_pow=False):
    """f_i = 1 / theta ** (2i / R), i < R/2, as attn's RotaryEmbedding computes it.

    float32: Hugging Face's 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)) with the
    power correctly rounded (torch_pow=True: torch's float32 pow, exactly Hugging Face's).
    float64: every step in float64."""
    if dtype == torch.float64:
        return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    base = float(np.float32(theta))
    if torch_pow:
        return 1.0 / (base ** exponent)
    power = torch.tensor([math.pow(base, e) for e in exponent.tolist()], dtype=torch.float64)
    return 1.0 / power.float()


def rope_angles(positions, inv_freq):
    """(B, T) positions -> (B, T, R/2) angles, one product in inv_freq's dtype (Hugging
    Face's einsum / matmul, Meta's torch.outer)."""
    return positions.to(inv_freq.dtype)[..., None] * inv_freq[None, None, :]


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rope(x, angles, interleaved):
    """x (B, heads, T, hd) rotated by angles (B, T, R/2) on its first R features.

    half-split: Hugging Face's q * cos + rotate_half(q) * sin with cos/sin = cat(freqs, freqs)
    (GPT-NeoX / Phi split off the first R features first). interleaved: Meta's view_as_complex
    product for R == hd, GPT-J's rotate_every_two with duplicate_interleave'd tables else."""
    r = 2 * angles.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    if not interleaved:
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        rotated = x_rot * cos + _rotate_half(x_rot) * sin
    elif r == x.shape[-1]:
        freqs_cis = torch.polar(torch.ones_like(angles), angles)[:, None]
        xc = torch.view_as_complex(x_rot.reshape(*x_rot.shape[:-1], -1, 2).contiguous())
        rotated = torch.view_as_real(xc * freqs_cis).flatten(3)
    else:
        cos = angles.cos()[:, None].repeat_interleave(2, dim=-1)
        sin = angles.sin()[:, None].repeat_interleave(2, dim=-1)
        rotated = x_rot * cos + _rotate_every_two(x_rot) * sin
    return torch.cat((rotated, x_pass), dim=-1)


# ---- the attention layer ----

def repeat_kv(x, n_rep):
    """Hugging Face's repeat_kv: (B, H_kv, T, hd) -> (B, H_kv * n_rep, T, hd), head h of the
    result is key/value head h // n_rep."""
    b, h_kv, t, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h_kv, n_rep, t, hd).reshape(b, h_kv * n_rep, t, hd)


def allowed_mask(tq, tk, window=0):
    """(T_q, T_k) boolean, true = may attend: query i (at position i + T_k - T_q) sees keys
    j <= its position, and with a window W only j > position - W."""
    i = torch.arange(tq)[:, None] + (tk - tq)
    j = torch.arange(tk)[None, :]
    allowed = j <= i
    if window > 0:
        allowed &= j > i - window
    return allowed


def llama_attention(weights, x, num_heads, num_kv_heads, head_dim=None, theta=10000.0,
                    rotary_dim=None, interleaved=False, window=0, prefix="", torch_pow=False):
    """Hugging Face LlamaAttention.forward(x, causal mask, position_ids = 0..T-1) on x
    (B, T, D) with the state_dict `weights` ({name: tensor}); returns (B, T, D)."""
    dtype = x.dtype
    b, t, d = x.shape
    hd = head_dim or d // num_heads
    r = rotary_dim or hd
    w = {k[len(prefix):]: v.to(dtype) for k, v in weights.items() if k.startswith(prefix)}

    def proj(name, heads):
        y = torch.nn.functional.linear(x, w[name + ".weight"], w.get(name + ".bias"))
        return y.view(b, t, heads, hd).transpose(1, 2)

    q, k, v = proj("q_proj", num_heads), proj("k_proj", num_kv_heads), proj("v_proj", num_kv_heads)
    positions = torch.arange(t)[None, :].expand(b, t)
    angles = rope_angles(positions, inverse_frequencies(theta, r, dtype, torch_pow))
    q, k = rope(q, angles, interleaved), rope(k, angles, interleaved)
    n_rep = num_heads // num_kv_heads
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
    scores = scores.masked_fill(~allowed_mask(t, t, window), float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=dtype)
    ctx = torch.matmul(p, v).transpose(1, 2).reshape(b, t, num_heads * hd)
    return torch.nn.functional.linear(ctx, w["o_proj.weight"], w.get("o_proj.bias"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--num-heads", type=int, required=True)
    ap.add_argument("--num-kv-heads", type=int, default=0, help="default: --num-heads")
    ap.add_argument("--head-dim", type=int, default=0, help="default: D / num_heads")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rotary-dim", type=int, default=0, help="default: head_dim")
    ap.add_argument("--rope-interleaved", action="store_true")
    ap.add_argument("--sliding-window", type=int, default=0)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--double", action="store_true")
    ap.add_argument("--torch-pow", action="store_true",
                    help="float32 RoPE frequencies with torch's pow (exactly Hugging Face's)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dtype = torch.float64 if a.double else torch.float32
    weights = {k: torch.from_numpy(np.array(v)) for k, v in load_file(a.weights).items()}
    x = torch.from_numpy(np.array(load_file(a.input)["query"])).to(dtype)
    with torch.no_grad():
        y = llama_attention(weights, x, a.num_heads, a.num_kv_heads or a.num_heads, a.head_dim or None,
                            a.rope_theta, a.rotary_dim or None, a.rope_interleaved,
                            a.sliding_window, a.prefix, a.torch_pow)
    save_file({"output": y.numpy()}, a.output, metadata={"producer": "llama_reference.py"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
