#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# scripts/variants_reference.py: PyTorch references for attention variants, written from the
# models' own code, and the fixtures tests/io/variants_fixtures_test.cpp checks attn against
# (forward and backward, float64), for the attention call and for whole modules:
#
#   learned sinks   gpt-oss (openai/gpt-oss, gpt_oss/torch/model.py: sdpa()): one logit per
#                   head concatenated to each row of scores before the softmax, its column
#                   dropped after; causal, with and without a sliding window, grouped-query
#                   heads (q_mult query heads per key/value head);
#   ALiBi           BLOOM (Hugging Face transformers, models/bloom/modeling_bloom.py:
#                   build_alibi_tensor() and BloomAttention's baddbmm): slope_h * key position
#                   added to the scaled scores, causal; 6 heads, so the slopes past the largest
#                   power of two come from the second series;
#   softcap         Gemma 2 (transformers, models/gemma2/modeling_gemma2.py): the scaled
#                   scores capped with tanh before the causal mask (module fixture only);
#   value heads     DeepSeek-V3 (transformers, models/deepseek_v3/modeling_deepseek_v3.py) with
#                   its decompressed heads: queries and keys of one head size, values of
#                   another (v_head_dim), 1/sqrt(q head size), causal (module fixture only);
#   modules         q_proj, k_proj, v_proj, one of the attentions above, o_proj, with
#                   gradients of every parameter (sinks included) and of the input.
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


# ---- modules: projections, one of the attentions above (or Gemma 2's softcap), o_proj ----
# Each module fixture holds the module's state_dict under "module." in Hugging Face's names
# (q_proj, k_proj, v_proj, o_proj, and gpt-oss's sinks), the input x (B, T, D), the output,
# grad_out, and the gradients of sum(grad_out * out) with respect to x ("grad.x") and every
# parameter ("grad.<name>").
def gemma2_attention(q, k, v, scaling, softcap):
    # Gemma 2 (transformers, models/gemma2/modeling_gemma2.py: eager_attention_forward): the
    # scaled scores capped as softcap * tanh(s / softcap), then the causal mask, softmax in
    # float32 (here float64), the weights times V. q (B, H, T, d), k and v (B, H, T, d)
    # already repeated for grouped-query heads (repeat_kv).
    T = q.shape[2]
    attn_weights = torch.matmul(q, k.transpose(2, 3)) * scaling
    attn_weights = attn_weights / softcap
    attn_weights = torch.tanh(attn_weights)
    attn_weights = attn_weights * softcap
    causal = torch.triu(torch.full((T, T), -float("inf")), diagonal=1)
    attn_weights = attn_weights + causal
    attn_weights = torch.softmax(attn_weights, dim=-1)
    return torch.matmul(attn_weights, v)


def repeat_kv(x, n_rep):
    # Hugging Face's repeat_kv: (B, H_kv, T, d) -> (B, H_kv * n_rep, T, d), kv head g serving
    # query heads g * n_rep .. g * n_rep + n_rep - 1.
    B, H_kv, T, d = x.shape
    return x[:, :, None, :, :].expand(B, H_kv, n_rep, T, d).reshape(B, H_kv * n_rep, T, d)


def causal_attention(q, k, v, scaling):
    # The eager attention of DeepSeek-V3 (and Llama) with its causal mask: softmax(q k^T
    # scaling + causal) v; q and k (B, H, T, d), v (B, H, T, d_v), already repeated.
    T = q.shape[2]
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    scores = scores + torch.triu(torch.full((T, T), -float("inf")), diagonal=1)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def module_case(path, kind, B, T, D, H, H_kv, d, seed, sliding_window=0, softcap=0.0,
                bias=True, dv=None):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv  # the value heads' size

    def param(*shape, lo=-0.5, hi=0.5):
        return (torch.rand(*shape, generator=g) * (hi - lo) + lo).requires_grad_()

    params = {"q_proj.weight": param(H * d, D), "k_proj.weight": param(H_kv * d, D),
              "v_proj.weight": param(H_kv * dv, D)}
    if bias:
        params.update({"q_proj.bias": param(H * d), "k_proj.bias": param(H_kv * d),
                       "v_proj.bias": param(H_kv * dv)})
    params["o_proj.weight"] = param(D, H * dv)
    if bias:
        params["o_proj.bias"] = param(D)
    if kind == "gpt_oss":
        params["sinks"] = param(H, lo=-1.0, hi=2.0)
    x = (torch.rand(B, T, D, generator=g) * 2 - 1).requires_grad_()

    def linear(inp, name):
        y = inp @ params[name + ".weight"].T
        return y + params[name + ".bias"] if bias else y

    q, k, v = linear(x, "q_proj"), linear(x, "k_proj"), linear(x, "v_proj")
    scale = 1.0 / math.sqrt(d)
    if kind == "gpt_oss":  # gpt-oss's own sdpa(), one sequence at a time
        ctx = torch.stack([gpt_oss_sdpa(q[b].view(T, H_kv, H // H_kv, d), k[b].view(T, H_kv, d),
                                        v[b].view(T, H_kv, d), params["sinks"], scale,
                                        sliding_window) for b in range(B)])
    else:
        qh = q.view(B, T, H, d).transpose(1, 2)
        kh = repeat_kv(k.view(B, T, H_kv, d).transpose(1, 2), H // H_kv)
        vh = repeat_kv(v.view(B, T, H_kv, dv).transpose(1, 2), H // H_kv)
        if kind == "gemma2":
            ctx = gemma2_attention(qh, kh, vh, scale, softcap)
        elif kind == "deepseek":
            ctx = causal_attention(qh, kh, vh, scale)
        else:  # BLOOM's ALiBi attention
            alibi = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), H, torch.float64)
            ctx = bloom_attention(qh, kh, vh, alibi)
        ctx = ctx.transpose(1, 2).reshape(B, T, H * dv)
    out = linear(ctx, "o_proj")
    grad_out = torch.rand(out.shape, generator=g) * 2 - 1
    (out * grad_out).sum().backward()
    tensors = {"module." + n: p.detach().numpy() for n, p in params.items()}
    tensors.update({"grad." + n: p.grad.numpy() for n, p in params.items()})
    tensors.update({"x": x.detach().numpy(), "out": out.detach().numpy(),
                    "grad_out": grad_out.numpy(), "grad.x": x.grad.numpy()})
    st.write(path, tensors, metadata={
        "producer": "scripts/variants_reference.py (module: " + kind + ")",
        "layout": "module.* Hugging Face names, x and out (B, T, D)", "num_heads": str(H),
        "sliding_window": str(sliding_window), "softcap": repr(softcap),
        "alibi_max_bias": "8.0" if kind == "bloom" else "0.0", "causal": "1",
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
    # Modules: gpt-oss (sinks, grouped-query heads, a window of 4), Gemma 2 (softcap 2.5,
    # grouped-query heads, head_dim 3 with D 8: H * d != D), BLOOM (ALiBi, 6 heads, no bias),
    # DeepSeek-V3's shapes scaled down (queries and keys of 6, values of 4; grouped-query heads
    # too, which DeepSeek's decompressed heads are not, to cover the mapping).
    module_case(os.path.join(out, "gpt_oss_module.safetensors"), "gpt_oss", 2, 10, 12, 4, 2, 4,
                4, sliding_window=4)
    module_case(os.path.join(out, "gemma2_softcap_module.safetensors"), "gemma2", 2, 9, 8, 4, 2,
                3, 5, softcap=2.5, bias=False)
    module_case(os.path.join(out, "bloom_alibi_module.safetensors"), "bloom", 2, 8, 12, 6, 6, 2,
                6, bias=False)
    module_case(os.path.join(out, "deepseek_value_heads_module.safetensors"), "deepseek", 2, 9,
                10, 4, 2, 6, 7, dv=4)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
