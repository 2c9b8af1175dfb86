#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/variants_reference.py: PyTorch references for two attention variants, written from
# the models' own code, and the fixtures tests/io/variants_fixtures_test.cpp checks attn
# against (forward and backward, float64):
#
#   learned sinks   gpt-oss (openai/gpt-oss, gpt_oss/torch/model.py: sdpa()): one logit per
#                   head concatenated to each row of scores before the softmax, its column
#                   dropped after; causal, with and without a sliding window, grouped-query
#                   heads (q_mult query heads per key/value head);
#   ALiBi           BLOOM (Hugging Face transformers, models/bloom/modeling_bloom.py:
#                   build_alibi_tensor() and BloomAttention's baddbmm): slope_h * key position
#                   added to the scaled scores, causal; 6 heads, so the slopes past the largest
#                   power of two come from the second series.
#
# Run with Debian's PyTorch (python3-torch 1.13):
#   /usr/bin/python3 scripts/variants_reference.py tests/fixtures/variants
# Each fixture is one safetensors file: the inputs (q, k, v, grad_out; sinks), the output, the
# gradients (grad_q, grad_k, grad_v; grad_sinks) of sum(grad_out * out), and metadata naming
# the layout and the call's settings. The C++ suite reads them without Python.

import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx"))
import safetensors_np as st  # noqa: E402

torch.set_default_dtype(torch.float64)


# ---- gpt-oss: sdpa() as in gpt_oss/torch/model.py ----
def gpt_oss_sdpa(Q, K, V, S, sm_scale, sliding_window=0):
    # Q: (n_tokens, n_heads, q_mult, d_head), K and V: (n_tokens, n_heads, d_head), S: (n_heads * q_mult)
    n_tokens, n_heads, q_mult, d_head = Q.shape
    assert K.shape == (n_tokens, n_heads, d_head)
    assert V.shape == (n_tokens, n_heads, d_head)
    K = K[:, :, None, :].expand(-1, -1, q_mult, -1)
    V = V[:, :, None, :].expand(-1, -1, q_mult, -1)
    S = S.reshape(n_heads, q_mult, 1, 1).expand(-1, -1, n_tokens, -1)
    mask = torch.triu(Q.new_full((n_tokens, n_tokens), -float("inf")), diagonal=1)
    if sliding_window > 0:
        mask += torch.tril(mask.new_full((n_tokens, n_tokens), -float("inf")), diagonal=-sliding_window)
    QK = torch.einsum("qhmd,khmd->hmqk", Q, K)
    QK *= sm_scale
    QK += mask[None, None, :, :]
    QK = torch.cat([QK, S], dim=-1)
    W = torch.softmax(QK, dim=-1)
    W = W[..., :-1]
    attn = torch.einsum("hmqk,khmd->qhmd", W, V)
    return attn.reshape(n_tokens, -1)


def gpt_oss_case(path, n_tokens, n_heads, q_mult, d_head, sliding_window, seed):
    g = torch.Generator().manual_seed(seed)
    Q = (torch.rand(n_tokens, n_heads, q_mult, d_head, generator=g) * 2 - 1).requires_grad_()
    K = (torch.rand(n_tokens, n_heads, d_head, generator=g) * 2 - 1).requires_grad_()
    V = (torch.rand(n_tokens, n_heads, d_head, generator=g) * 2 - 1).requires_grad_()
    S = (torch.rand(n_heads * q_mult, generator=g) * 3 - 1).requires_grad_()
    sm_scale = 1.0 / math.sqrt(d_head)
    out = gpt_oss_sdpa(Q, K, V, S, sm_scale, sliding_window)
    grad_out = torch.rand(out.shape, generator=g) * 2 - 1
    (out * grad_out).sum().backward()
    st.write(path, {
        "q": Q.detach().numpy(), "k": K.detach().numpy(), "v": V.detach().numpy(),
        "sinks": S.detach().numpy(), "out": out.detach().numpy(),
        "grad_out": grad_out.numpy(), "grad_q": Q.grad.numpy(), "grad_k": K.grad.numpy(),
        "grad_v": V.grad.numpy(), "grad_sinks": S.grad.numpy(),
    }, metadata={
        "producer": "scripts/variants_reference.py (gpt-oss sdpa)",
        "layout": "q (T, H_kv, q_mult, d), k and v (T, H_kv, d), out (T, H_kv * q_mult * d)",
        "scale": repr(sm_scale), "sliding_window": str(sliding_window), "causal": "1",
    })


# ---- BLOOM: build_alibi_tensor() and the attention of BloomAttention.forward ----
def build_alibi_tensor(attention_mask, num_heads, dtype):
    batch_size, seq_length = attention_mask.shape
    closest_power_of_2 = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest_power_of_2) - 3))), device=attention_mask.device,
                        dtype=torch.float32)
    powers = torch.arange(1, 1 + closest_power_of_2, device=attention_mask.device, dtype=torch.int32)
    slopes = torch.pow(base, powers)
    if closest_power_of_2 != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest_power_of_2) - 3))),
                                  device=attention_mask.device, dtype=torch.float32)
        num_remaining_heads = min(closest_power_of_2, num_heads - closest_power_of_2)
        extra_powers = torch.arange(1, 1 + 2 * num_remaining_heads, 2, device=attention_mask.device,
                                    dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra_powers)], dim=0)
    arange_tensor = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    alibi = slopes[..., None] * arange_tensor
    return alibi.reshape(batch_size * num_heads, 1, seq_length).to(dtype)


def bloom_attention(q, k, v, alibi):
    # q, k, v: (B, H, T, d); alibi: (B * H, 1, T). BloomAttention: baddbmm with beta 1 and
    # alpha 1/sqrt(d), the causal mask filled with the dtype's lowest value, softmax, bmm.
    B, H, T, d = q.shape
    inv_norm_factor = 1.0 / math.sqrt(d)
    matmul_result = alibi.baddbmm(batch1=q.reshape(B * H, T, d),
                                  batch2=k.reshape(B * H, T, d).transpose(-1, -2),
                                  beta=1.0, alpha=inv_norm_factor)
    scores = matmul_result.view(B, H, T, T)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(causal, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs.view(B * H, T, T), v.reshape(B * H, T, d)).view(B, H, T, d)


def bloom_case(path, B, H, T, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(B, H, T, d, generator=g) * 2 - 1).requires_grad_()
    k = (torch.rand(B, H, T, d, generator=g) * 2 - 1).requires_grad_()
    v = (torch.rand(B, H, T, d, generator=g) * 2 - 1).requires_grad_()
    alibi = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), H, torch.float64)
    out = bloom_attention(q, k, v, alibi)
    grad_out = torch.rand(out.shape, generator=g) * 2 - 1
    (out * grad_out).sum().backward()
    slopes = alibi.view(B, H, T)[0, :, 1].detach()  # the slopes: alibi at key position 1
    st.write(path, {
        "q": q.detach().numpy(), "k": k.detach().numpy(), "v": v.detach().numpy(),
        "slopes": slopes.numpy(), "out": out.detach().numpy(), "grad_out": grad_out.numpy(),
        "grad_q": q.grad.numpy(), "grad_k": k.grad.numpy(), "grad_v": v.grad.numpy(),
    }, metadata={
        "producer": "scripts/variants_reference.py (BLOOM build_alibi_tensor, BloomAttention)",
        "layout": "q, k, v, out (B, H, T, d)", "scale": repr(1.0 / math.sqrt(d)), "causal": "1",
    })


def main(argv):
    if len(argv) != 2:
        print("usage: variants_reference.py OUT_DIR", file=sys.stderr)
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    gpt_oss_case(os.path.join(out, "gpt_oss_sinks.safetensors"), 11, 2, 3, 8, 0, 1)
    gpt_oss_case(os.path.join(out, "gpt_oss_sinks_window.safetensors"), 13, 2, 2, 8, 4, 2)
    bloom_case(os.path.join(out, "bloom_alibi.safetensors"), 2, 6, 9, 8, 3)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
