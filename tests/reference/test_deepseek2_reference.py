"""Checks of the deepseek2 reference itself (deepseek2_reference.py); needs numpy and torch, not
duet.

The whole forward pass against a second implementation written the other way round, the way
llama.cpp and duet's C++ compute it: numpy float64, one token at a time with a cache of the
compressed latent (kv_lora_rank normed values + the roped k_pe per position, as duet's MLA KV
cache), W_UK absorbed into the query and W_UV applied after the attention (no per-head K or V is
ever formed), rope as adjacent-pair rotations (2i, 2i+1) on the GGUF layout with ggml's YaRN
formulas (rope_yarn_corr_dims, rope_yarn_ramp, kq_scale = (1 + yarn_log_multiplier *
ln(factor))^2 / sqrt(key_length)), and the router written as explicit per-token loops over
sorted lists. Tiny models are written here with their own random weights: V2-style (softmax;
greedy and group-limited; norm_topk_prob with and without the scale), V3-style (sigmoid + bias,
groups, q_lora), top-1, no YaRN, all-MoE and all-dense, no shared experts, other head sizes,
every weight type. (Not negative correction biases in a whole model: there HF's masked_fill(0.0)
ties the dropped experts at 0.0 and torch.topk's tie order decides; a hand-made case checks that
the reference counts such tokens.)

Also: the HF rope reshuffle against adjacent pairs on one vector, YaRN correction ranges of the
real configs, the softmax scale against llama.cpp's formula, and hand-made routing cases.

DeepSeek-V3.2 (deepseek32, the lightning indexer; CASES_V32, written by write_tiny_deepseek32:
V3-style models plus the indexer with top_k 3, 5 and 8 on 40 tokens, 1, 2 or 4 index heads of 8,
16 or 32 dims, key_length == rope among them, with and without YaRN, every weight type, the
indexer's proj in f32 once). The second formulation keeps, besides the latents, a cache of the
indexer's keys (LayerNorm as explicit sums, rope as explicit (i, i + rope/2) pair rotations with
ggml's angles on the first rope dims), scores each cached position by explicit loops over heads,
chooses by sorting (equal scores: the lower position first), gathers the chosen latents and
attends over them; the indexer's keys (head_count, key_length, top_k) are read from the file
anew. Checked besides: that the counts of queries dropping keys and of boundary ties agree; that
every case's choice moves the logits by over 1e-2 from attention over every causal key; that
top_k >= T gives exactly the logits of the deepseek2 file with the same weights and no indexer;
index_mask and index_stats on hand-made scores (ties, short rows); the refusals (no q_lora, no
indexer keys or tensors, key_length < rope). Planted defects (INDEXER_DEFECTS, switches of the
second formulation, and the reference choosing before the causal mask) must each move the logits
by over 1e-2 wherever they change the math; weights left unscaled must change nothing (a positive
factor keeps the scores' order, so no logits comparison can see it).

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    TinyTensors, check_close, float64_tensors, np_rms_norm, np_swiglu, reference_logits, report,
    tiny_models)
import deepseek2_reference as ref  # noqa: E402
import gguf_reader as gr  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

A = "deepseek2."


def write_tiny_deepseek2(path: str, type_name: str, seed: int, n_embd=64, n_layer=3, n_head=4,
                         n_ff=96, vocab=96, q_lora=0, kv_lora=32, nope=16, rope=8, v_dim=16,
                         yarn=4.0, yarn_orig=256, mscale_all_dim=0.707, dense=1, n_ff_exp=32,
                         n_expert=8, n_shared=2, n_used=3, n_group=1, topk_group=1, scale=2.0,
                         norm=False, gating=1, bias_center=0.1, bias_width=0.1,
                         arch="deepseek2", index_heads=0, index_dim=0, index_topk=0,
                         proj_type=None, indexer_tensors=True) -> None:
    """A tiny random deepseek2 model; with arch "deepseek32" (and index_heads, index_dim,
    index_topk) a DeepSeek-V3.2 one: the same keys under "deepseek32.", the indexer's keys, and
    each layer's indexer tensors, drawn from a second generator (seed + 1000) after everything
    else, so that every other weight equals the deepseek2 file's of the same seed (without
    `indexer_tensors` the keys only: a file for a refusal)."""
    A = arch + "."
    kv = {
        "general.architecture": V(gr.T_STRING, arch),
        A + "embedding_length": V(gr.T_UINT32, n_embd),
        A + "block_count": V(gr.T_UINT32, n_layer),
        A + "feed_forward_length": V(gr.T_UINT32, n_ff),
        A + "attention.head_count": V(gr.T_UINT32, n_head),
        A + "attention.head_count_kv": V(gr.T_UINT32, n_head),
        A + "attention.layer_norm_rms_epsilon": V(gr.T_FLOAT32, 1e-6),
        A + "attention.kv_lora_rank": V(gr.T_UINT32, kv_lora),
        A + "attention.key_length": V(gr.T_UINT32, nope + rope),
        A + "attention.value_length": V(gr.T_UINT32, v_dim),
        A + "rope.dimension_count": V(gr.T_UINT32, rope),
        A + "rope.freq_base": V(gr.T_FLOAT32, 10000.0),
        A + "leading_dense_block_count": V(gr.T_UINT32, dense),
        A + "expert_feed_forward_length": V(gr.T_UINT32, n_ff_exp),
        A + "expert_count": V(gr.T_UINT32, n_expert),
        A + "expert_shared_count": V(gr.T_UINT32, n_shared),
        A + "expert_used_count": V(gr.T_UINT32, n_used),
        A + "expert_weights_scale": V(gr.T_FLOAT32, scale),
        A + "expert_weights_norm": V(gr.T_BOOL, norm),
        A + "expert_gating_func": V(gr.T_UINT32, gating),
        A + "expert_group_count": V(gr.T_UINT32, n_group),
        A + "expert_group_used_count": V(gr.T_UINT32, topk_group),
        # no deepseek2.vocab_size: the reference takes the embedding's row count
    }
    if q_lora:
        kv[A + "attention.q_lora_rank"] = V(gr.T_UINT32, q_lora)
    if index_heads:
        kv[A + "attention.indexer.head_count"] = V(gr.T_UINT32, index_heads)
        kv[A + "attention.indexer.key_length"] = V(gr.T_UINT32, index_dim)
        kv[A + "attention.indexer.top_k"] = V(gr.T_UINT32, index_topk)
    if yarn > 1:
        kv[A + "rope.scaling.type"] = V(gr.T_STRING, "yarn")
        kv[A + "rope.scaling.factor"] = V(gr.T_FLOAT32, yarn)
        kv[A + "rope.scaling.original_context_length"] = V(gr.T_UINT32, yarn_orig)
        kv[A + "rope.scaling.yarn_log_multiplier"] = V(gr.T_FLOAT32, 0.1 * mscale_all_dim)
    t = TinyTensors(type_name, seed)
    add = t.add
    H, qhd = n_head, nope + rope
    add("token_embd.weight", (vocab, n_embd), 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (n_embd,), 0.2, 1.0)
        if q_lora:
            add(p + "attn_q_a.weight", (q_lora, n_embd), n_embd ** -0.5)
            add(p + "attn_q_a_norm.weight", (q_lora,), 0.2, 1.0)
            add(p + "attn_q_b.weight", (H * qhd, q_lora), q_lora ** -0.5)
        else:
            add(p + "attn_q.weight", (H * qhd, n_embd), n_embd ** -0.5)
        add(p + "attn_kv_a_mqa.weight", (kv_lora + rope, n_embd), n_embd ** -0.5)
        add(p + "attn_kv_a_norm.weight", (kv_lora,), 0.2, 1.0)
        add(p + "attn_kv_b.weight", (H * (nope + v_dim), kv_lora), kv_lora ** -0.5)
        add(p + "attn_output.weight", (n_embd, H * v_dim), (H * v_dim) ** -0.5)
        add(p + "ffn_norm.weight", (n_embd,), 0.2, 1.0)
        if i < dense:
            add(p + "ffn_gate.weight", (n_ff, n_embd), n_embd ** -0.5)
            add(p + "ffn_up.weight", (n_ff, n_embd), n_embd ** -0.5)
            add(p + "ffn_down.weight", (n_embd, n_ff), n_ff ** -0.5)
            continue
        add(p + "ffn_gate_inp.weight", (n_expert, n_embd), n_embd ** -0.5, type_name="f32")
        if gating == 2:
            add(p + "exp_probs_b.bias", (n_expert,), bias_width, bias_center)
        add(p + "ffn_gate_exps.weight", (n_expert, n_ff_exp, n_embd), n_embd ** -0.5)
        add(p + "ffn_up_exps.weight", (n_expert, n_ff_exp, n_embd), n_embd ** -0.5)
        add(p + "ffn_down_exps.weight", (n_expert, n_embd, n_ff_exp), n_ff_exp ** -0.5)
        if n_shared:
            sh = n_ff_exp * n_shared
            add(p + "ffn_gate_shexp.weight", (sh, n_embd), n_embd ** -0.5)
            add(p + "ffn_up_shexp.weight", (sh, n_embd), n_embd ** -0.5)
            add(p + "ffn_down_shexp.weight", (n_embd, sh), sh ** -0.5)
    add("output_norm.weight", (n_embd,), 0.2, 1.0)
    add("output.weight", (vocab, n_embd), n_embd ** -0.5)
    if index_heads and indexer_tensors:
        ti = TinyTensors(type_name, seed + 1000)
        for i in range(n_layer):
            p = f"blk.{i}.indexer."
            ti.add(p + "attn_q_b.weight", (index_heads * index_dim, q_lora), q_lora ** -0.5)
            ti.add(p + "attn_k.weight", (index_dim, n_embd), n_embd ** -0.5)
            ti.add(p + "k_norm.weight", (index_dim,), 0.2, 1.0)
            ti.add(p + "k_norm.bias", (index_dim,), 0.3)
            ti.add(p + "proj.weight", (index_heads, n_embd), n_embd ** -0.5, type_name=proj_type)
        t.tensors += ti.tensors
    write_gguf(path, kv, t.tensors)


# V3's features (q_lora, sigmoid + bias, top-3 within 2 of 4 groups, norm, scale 2.5, one shared
# expert, mscale_all_dim 1), which DeepSeek-V3.2 keeps
V3_LIKE = dict(gating=2, q_lora=32, n_group=4, topk_group=2, norm=True, scale=2.5, n_shared=1,
               mscale_all_dim=1.0)


def write_tiny_deepseek32(path: str, type_name: str, seed: int, index_heads=4, index_dim=32,
                          index_topk=8, **kw) -> None:
    """A tiny DeepSeek-V3.2 (deepseek32): V3_LIKE plus the indexer; `kw` as for deepseek2."""
    base = dict(V3_LIKE)
    base.update(kw)
    write_tiny_deepseek2(path, type_name, seed, arch="deepseek32", index_heads=index_heads,
                         index_dim=index_dim, index_topk=index_topk, **base)


# -- the second formulation ------------------------------------------------------------------

def ggml_rope_cache(pos: int, n_dims: int, base: float, factor: float, n_ctx_orig: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the n_dims/2 pair angles at `pos`, as ggml's rope_yarn (ext_factor 1 when
    YaRN is on, attn_factor chosen so that the magnitude scaling cancels, as llama.cpp's
    deepseek2 graph does with attn_factor_scaled)."""
    theta_scale = base ** (-2.0 / n_dims)
    i = np.arange(n_dims // 2, dtype=np.float64)
    theta_extrap = pos * theta_scale ** i
    if factor <= 1:
        return np.cos(theta_extrap), np.sin(theta_extrap)
    freq_scale = 1.0 / factor

    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0.0, math.floor(corr_dim(32.0)))
    hi = min(n_dims - 1.0, math.ceil(corr_dim(1.0)))
    y = (i - lo) / max(0.001, hi - lo)
    ramp_mix = 1 - np.minimum(1, np.maximum(0, y))  # rope_yarn_ramp * ext_factor
    theta = freq_scale * theta_extrap * (1 - ramp_mix) + theta_extrap * ramp_mix
    mscale = 1.0 + 0.1 * math.log(1.0 / freq_scale)  # what ggml multiplies in ...
    mscale *= 1.0 / (1.0 + 0.1 * math.log(factor))   # ... and llama.cpp's attn_factor undoes
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def rope_adjacent(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [..., d]: rotate the pairs (x[2i], x[2i+1]) by angle i (llama.cpp's 'normal' rope)."""
    out = np.empty_like(x)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def route_loops(xn: np.ndarray, w: dict, p: str, c) -> list[tuple[int, float]]:
    """One token's (expert, weight) pairs, written out with sorted lists."""
    logits = w[p + "ffn_gate_inp.weight"] @ xn
    E, k, G, TG = c.n_expert, c.n_expert_used, c.n_group, c.topk_group
    per = E // G
    if c.gating == ref.GATING_SOFTMAX:
        e = np.exp(logits - logits.max())
        scores = e / e.sum()
        value = list(scores)
        group_score = [max(value[g * per:(g + 1) * per]) for g in range(G)]
        fill = 0.0
    else:
        scores = 1 / (1 + np.exp(-logits))
        bias = w.get(p + "exp_probs_b.bias", np.zeros(E))
        value = list(scores + bias)
        group_score = [sum(sorted(value[g * per:(g + 1) * per], reverse=True)[:2])
                       for g in range(G)]
        fill = ref.MASKED_FILL_V3
    if G > 1 or c.gating == ref.GATING_SIGMOID:
        kept = sorted(range(G), key=lambda g: -group_score[g])[:TG]
        value = [value[j] if j // per in kept else fill for j in range(E)]
    chosen = sorted(range(E), key=lambda j: -value[j])[:k]
    weights = [float(scores[j]) for j in chosen]
    total = sum(weights)
    if c.gating == ref.GATING_SOFTMAX:
        if k > 1 and c.expert_weights_norm:
            weights = [x / (total + 1e-20) for x in weights]
        else:
            weights = [x * c.expert_weights_scale for x in weights]
    else:
        if k > 1 and c.expert_weights_norm:
            weights = [x / (total + 1e-20) for x in weights]
        weights = [x * c.expert_weights_scale for x in weights]
    return list(zip(chosen, weights))


def rope_halves(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [d]: rotate the pairs (x[i], x[i + d/2]) by angle i (NEOX's split-half rope), written
    out pair by pair."""
    n = len(x) // 2
    out = np.empty_like(x)
    for i in range(n):
        out[i] = x[i] * cos[i] - x[i + n] * sin[i]
        out[i + n] = x[i] * sin[i] + x[i + n] * cos[i]
    return out


def layer_norm_loops(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm of one vector with explicit sums: mean, biased variance, weight, bias."""
    n = len(x)
    mean = sum(float(v) for v in x) / n
    var = sum((float(v) - mean) ** 2 for v in x) / n
    return np.array([(float(x[i]) - mean) / math.sqrt(var + eps) * w[i] + b[i] for i in range(n)])


# Planted defects of the indexer, for the second formulation (see check_planted_defects): each is
# a plausible way to get DeepSeek-V3.2 wrong.
INDEXER_DEFECTS = {
    "interleaved": "the indexer's rope on adjacent pairs (2i, 2i+1), as MLA's, not halves",
    "rope_last": "the indexer's rope on the last rope dims of each head, not the first",
    "no_rope": "no rope in the indexer",
    "plain_freqs": "the indexer's rope with plain frequencies (no YaRN)",
    "no_relu": "no relu on the heads' q.k",
    "rms_norm": "RMSNorm (weight only) instead of LayerNorm on the indexer's key",
    "no_bias": "the key's LayerNorm without its bias",
    "raw_q": "the indexer's query from q_a_proj(x), before q_a_layernorm",
    "residual": "the indexer's key and weights from the residual stream, not attn_norm's output",
    "k_plus_1": "top_k + 1 keys",
    "k_minus_1": "top_k - 1 keys",
    "ties_high": "ties at the top-k boundary to the higher position",
    "unscaled": "the heads' weights not scaled by index_heads^-0.5 (nor q.k by index_dim^-0.5)",
}


def incremental_forward(path: str, tokens: list[int], defect: str | None = None,
                        stats: dict | None = None) -> np.ndarray:
    """The logits [T, vocab] one token at a time (see the module docstring). With `defect` (a key
    of INDEXER_DEFECTS) the indexer is computed that wrong way; `stats` (a dict) gets the number
    of sparse queries and of choices decided by a tie."""
    g = gr.GGUFFile(path)
    c = ref.read_config(g)
    w = float64_tensors(g)
    H, nope, rope, vd, L = c.n_head, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, \
        c.kv_lora_rank
    arch = g.get("general.architecture")
    log_mul = g.get(arch + ".rope.scaling.yarn_log_multiplier", 0.0)
    factor = c.yarn_factor
    kq_scale = (1.0 + log_mul * math.log(factor)) ** 2 / math.sqrt(nope + rope) if factor > 1 \
        else 1 / math.sqrt(nope + rope)
    # the indexer's hyper-parameters, read here from the keys (0 heads: deepseek2, no indexer)
    n_ix = int(g.get(arch + ".attention.indexer.head_count", 0))
    d_ix = int(g.get(arch + ".attention.indexer.key_length", 0))
    top_k = int(g.get(arch + ".attention.indexer.top_k", 0))
    if defect == "k_plus_1":
        top_k += 1
    elif defect == "k_minus_1":
        top_k -= 1

    def norm(x, weight):
        return np_rms_norm(x, weight, c.rms_eps)

    ffn = np_swiglu

    def ix_rope(v: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: int) -> np.ndarray:
        """The indexer's rope of one head [d_ix]: halves on the first `rope` dims."""
        v = v.copy()
        part = slice(d_ix - rope, d_ix) if defect == "rope_last" else slice(0, rope)
        if defect == "no_rope":
            return v
        if defect == "plain_freqs":
            cos, sin = ggml_rope_cache(pos, rope, c.rope_base, 1.0, 0)
        rotate = rope_adjacent if defect == "interleaved" else rope_halves
        v[part] = rotate(v[part], cos, sin)
        return v

    latent = [[] for _ in range(c.n_layer)]  # per position: normed c_kv [L]
    k_rope = [[] for _ in range(c.n_layer)]  # per position: roped k_pe [rope]
    ix_key = [[] for _ in range(c.n_layer)]  # per position: the indexer's roped key [d_ix]
    logits = []
    for pos, tok in enumerate(tokens):
        cos, sin = ggml_rope_cache(pos, rope, c.rope_base, factor, c.yarn_original_context)
        x = w["token_embd.weight"][tok].copy()
        for layer in range(c.n_layer):
            p = f"blk.{layer}."
            h = norm(x, w[p + "attn_norm.weight"])
            if c.q_lora_rank:
                qa = w[p + "attn_q_a.weight"] @ h
                qr = norm(qa, w[p + "attn_q_a_norm.weight"])
                q = w[p + "attn_q_b.weight"] @ qr
            else:
                q = w[p + "attn_q.weight"] @ h
            q = q.reshape(H, nope + rope)
            ckv = w[p + "attn_kv_a_mqa.weight"] @ h
            latent[layer].append(norm(ckv[:L], w[p + "attn_kv_a_norm.weight"]))
            k_rope[layer].append(rope_adjacent(ckv[L:], cos, sin))
            chosen = list(range(pos + 1))  # the cached positions this query attends to
            if n_ix:
                ix_in = x if defect == "residual" else h
                kraw = w[p + "indexer.attn_k.weight"] @ ix_in
                if defect == "rms_norm":
                    knorm = norm(kraw, w[p + "indexer.k_norm.weight"])
                else:
                    bias = w[p + "indexer.k_norm.bias"]
                    knorm = layer_norm_loops(kraw, w[p + "indexer.k_norm.weight"],
                                             np.zeros_like(bias) if defect == "no_bias" else bias,
                                             1e-6)
                ix_key[layer].append(ix_rope(knorm, cos, sin, pos))
                iq = (w[p + "indexer.attn_q_b.weight"] @ (qa if defect == "raw_q" else qr)
                      ).reshape(n_ix, d_ix)
                iq = [ix_rope(iq[head], cos, sin, pos) for head in range(n_ix)]
                wt = w[p + "indexer.proj.weight"] @ ix_in
                if defect != "unscaled":
                    wt = wt / math.sqrt(n_ix)
                score = []
                for s in range(pos + 1):
                    total = 0.0
                    for head in range(n_ix):
                        dot = float(iq[head] @ ix_key[layer][s])
                        if defect != "unscaled":
                            dot /= math.sqrt(d_ix)
                        total += wt[head] * (dot if defect == "no_relu" else max(dot, 0.0))
                    score.append(total)
                # the best top_k by sorting; among equal scores the lower position first
                tie = (lambda s: -s) if defect == "ties_high" else (lambda s: s)
                ranked = sorted(range(pos + 1), key=lambda s: (-score[s], tie(s)))
                chosen = sorted(ranked[:top_k])
                if stats is not None and pos + 1 > top_k:
                    stats["sparse"] = stats.get("sparse", 0) + 1
                    if score[ranked[top_k - 1]] == score[ranked[top_k]]:
                        stats["ties"] = stats.get("ties", 0) + 1
            C = np.array(latent[layer])[chosen]  # [S, L]: the chosen positions' latents ...
            R = np.array(k_rope[layer])[chosen]  # [S, rope]: ... and roped k_pe
            wkv_b = w[p + "attn_kv_b.weight"].reshape(H, nope + vd, L)
            out = np.zeros((H, vd))
            for head in range(H):
                w_uk, w_uv = wkv_b[head, :nope], wkv_b[head, nope:]  # [nope, L], [v, L]
                q_abs = w_uk.T @ q[head, :nope]  # absorbed: the query in latent space [L]
                q_pe = rope_adjacent(q[head, nope:], cos, sin)
                s = (C @ q_abs + R @ q_pe) * kq_scale
                e = np.exp(s - s.max())
                e /= e.sum()
                out[head] = w_uv @ (e @ C)  # attend over the latent, then decompress V
            x = x + w[p + "attn_output.weight"] @ out.reshape(-1)
            h = norm(x, w[p + "ffn_norm.weight"])
            if layer < c.n_dense_lead:
                x = x + ffn(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"],
                            w[p + "ffn_down.weight"])
                continue
            y = np.zeros_like(x)
            for expert, weight in route_loops(h, w, p, c):
                y += weight * ffn(h, w[p + "ffn_gate_exps.weight"][expert],
                                  w[p + "ffn_up_exps.weight"][expert],
                                  w[p + "ffn_down_exps.weight"][expert])
            if c.n_expert_shared:
                y += ffn(h, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                         w[p + "ffn_down_shexp.weight"])
            x = x + y
        logits.append(w["output.weight"] @ norm(x, w["output_norm.weight"]))
    return np.array(logits)


CASES = [
    # (type, seed, overrides)
    ("f32", 1, {}),  # V2-Lite-like: direct q, softmax greedy, YaRN, 2 shared
    ("f16", 2, dict(gating=2, q_lora=32, n_group=4, topk_group=2, norm=True, scale=2.5,
                    n_shared=1, mscale_all_dim=1.0)),  # V3-like
    ("bf16", 3, dict(n_group=4, topk_group=2, norm=True, scale=3.0, n_head=2,
                     n_embd=96)),  # V2 group_limited_greedy; norm: the scale is NOT applied
    ("q8_0", 4, dict(gating=2, n_group=1, n_used=1, norm=True, yarn=1.0, dense=0,
                     n_shared=0)),  # top-1 (no normalization), no YaRN, all MoE, no shared
    ("q4_0", 5, dict(gating=2, q_lora=64, n_group=4, topk_group=1, n_used=2,
                     norm=False)),  # one group of 2 kept: the group decides everything
    ("f32", 6, dict(dense=3, yarn=40.0, yarn_orig=4096, n_ff=64)),  # all dense, V2-Lite's YaRN
    ("q8_0", 7, dict(rope=16, nope=8, v_dim=24, kv_lora=64, yarn=8.0, yarn_orig=128,
                     mscale_all_dim=0.5)),  # other head sizes, a wide YaRN ramp
]


def check_pieces(failures: list[str]) -> None:
    rng = np.random.default_rng(3)
    # HF's reshuffle + rotate_half on the stored layout == adjacent pairs on the stored layout,
    # up to the reshuffle of the result (q and k alike, so every q.k is equal).
    for d, factor, orig in [(8, 4.0, 1024), (64, 40.0, 4096), (16, 1.0, 0)]:
        cfg = ref.Deepseek2Config(
            n_embd=0, n_layer=0, n_ff=0, n_head=1, vocab_size=0, rms_eps=1e-6, q_lora_rank=0,
            kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=d, v_head_dim=0,
            rope_base=10000.0, yarn_factor=factor, yarn_original_context=orig, mscale=1.0,
            mscale_all_dim=1.0, n_dense_lead=0, n_ff_exp=0, n_expert=0, n_expert_shared=0,
            n_expert_used=0, expert_weights_scale=1.0, expert_weights_norm=False, gating=1,
            n_group=1, topk_group=1)
        T = 50
        x = rng.standard_normal((T, d))
        pos = torch.arange(T) * 7
        cos, sin = ref.rope_cos_sin(pos, cfg)
        hf = ref.apply_rotary_pos_emb(torch.from_numpy(x), cos, sin).numpy()
        ad = np.stack([rope_adjacent(x[t], *ggml_rope_cache(int(pos[t]), d, 10000.0, factor, orig))
                       for t in range(T)])
        shuffled = ad.reshape(T, d // 2, 2).transpose(0, 2, 1).reshape(T, d)
        err = np.abs(hf - shuffled).max()
        if err > 1e-12:
            failures.append(f"rope d={d} factor={factor}: HF reshuffle+rotate_half differs from "
                            f"adjacent pairs by {err:.3g}")
        if factor > 1:
            f = ref.inv_freq(cfg).numpy()
            extra = 10000.0 ** (-np.arange(0, d, 2) / d)
            blended = np.sum((f < extra * (1 - 1e-9)) & (f > extra / factor * (1 + 1e-9)))
            print(f"  rope d={d} YaRN x{factor:g} over {orig}: correction range "
                  f"{ref.yarn_find_correction_range(32, 1, d, 10000.0, orig)}, "
                  f"{blended} of {d // 2} frequencies blended")
    # The correction ranges of the real configs (rope dims 64, base 10000, 4096 positions).
    got = ref.yarn_find_correction_range(32, 1, 64, 10000.0, 4096)
    if got != (10, 23):
        failures.append(f"YaRN correction range for DeepSeek-V2/V3 is {got}, expected (10, 23)")
    # softmax scale == llama.cpp's kq_scale; for V3: 192^-0.5 * (1 + 0.1 ln 40)^2
    for mad, factor in [(1.0, 40.0), (0.707, 40.0), (0.0, 40.0), (1.0, 1.0)]:
        cfg.qk_nope_head_dim, cfg.qk_rope_head_dim = 128, 64
        cfg.yarn_factor, cfg.mscale, cfg.mscale_all_dim = factor, mad, mad
        want = (1 + 0.1 * mad * math.log(factor)) ** 2 / math.sqrt(192)
        if abs(ref.softmax_scale(cfg) - want) > 1e-15:
            failures.append(f"softmax scale {ref.softmax_scale(cfg)} != {want} (mscale_all_dim "
                            f"{mad}, factor {factor})")


def check_routing_rules(failures: list[str]) -> None:
    """Hand-made router logits with known answers (the router is the identity on 8 dims)."""
    def lw_for(bias=None):
        return ref.LayerWeights(attn_norm=None, wq=None, wq_a=None, q_a_norm=None, wq_b=None,
                                wkv_a=None, kv_a_norm=None, wkv_b=None, wo=None, ffn_norm=None,
                                router=torch.eye(8, dtype=torch.float64),
                                router_bias=None if bias is None else torch.tensor(bias))

    def cfg(**kw):
        base = dict(n_embd=8, n_layer=1, n_ff=0, n_head=1, vocab_size=0, rms_eps=1e-6,
                    q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=2,
                    v_head_dim=0, rope_base=1e4, yarn_factor=1.0, yarn_original_context=0,
                    mscale=0.0, mscale_all_dim=0.0, n_dense_lead=0, n_ff_exp=1, n_expert=8,
                    n_expert_shared=0, n_expert_used=2, expert_weights_scale=2.0,
                    expert_weights_norm=False, gating=1, n_group=1, topk_group=1)
        base.update(kw)
        return ref.Deepseek2Config(**base)

    x = torch.tensor([[0.5, 3.0, 2.9, 0.0, 0.0, 0.0, 2.0, 1.0]], dtype=torch.float64)
    sm = torch.softmax(x[0], 0)
    sg = torch.sigmoid(x[0])
    cases = [
        ("V2 greedy", cfg(), None, [1, 2], [sm[1] * 2, sm[2] * 2]),
        ("V2 greedy + norm (no scale)", cfg(expert_weights_norm=True), None, [1, 2],
         [sm[1] / (sm[1] + sm[2]), sm[2] / (sm[1] + sm[2])]),
        # groups {0,1} {2,3} {4,5} {6,7}: maxima 3, 2.9, 0, 2; keep 2 groups -> {0,1,2,3}
        # (without the limit: 1, 2, 6)
        ("V2 group-limited", cfg(n_group=4, topk_group=2, n_expert_used=3), None, [1, 2, 0],
         [sm[1] * 2, sm[2] * 2, sm[0] * 2]),
        # V3: biased sigmoid 0.622, 0.953, 0.948, 0.5, 0.5, 0.5, 0.881, 0.731 + 0.5; group sums
        # of the 2 best: 1.575, 1.448, 1.0, 2.112 -> keep {6,7} and {0,1}; top-2 of 0.622,
        # 0.953, 0.881, 1.231 -> 7 and 1 (without the bias: 1 and 2). Weights: the UNBIASED sigmoid
        # scores, normalized, times 2.5.
        ("V3 group-limited + bias", cfg(gating=2, n_group=4, topk_group=2, n_expert_used=2,
                                        expert_weights_norm=True, expert_weights_scale=2.5),
         [0, 0, 0, 0, 0, 0, 0, 0.5], [7, 1],
         [sg[7] / (sg[7] + sg[1]) * 2.5, sg[1] / (sg[7] + sg[1]) * 2.5]),
        # V3 without normalization: the unbiased scores times the scale
        ("V3 no norm", cfg(gating=2, n_group=4, topk_group=2, n_expert_used=2,
                           expert_weights_scale=2.5), [0, 0, 0, 0, 0, 0, 0, 0.5], [7, 1],
         [sg[7] * 2.5, sg[1] * 2.5]),
        ("V3 top-1 (no norm)", cfg(gating=2, n_expert_used=1, expert_weights_norm=True,
                                   expert_weights_scale=2.5), [0.0] * 8, [1], [sg[1] * 2.5]),
    ]
    for name, c, bias, want_idx, want_w in cases:
        r = ref.route(x, lw_for(bias), c)
        got_idx = r.idx[0].tolist()
        if sorted(got_idx) != sorted(want_idx):
            failures.append(f"{name}: chose {got_idx}, expected {want_idx}")
            continue
        order = [got_idx.index(j) for j in want_idx]
        got_w = [float(r.weight[0][o]) for o in order]
        if not np.allclose(got_w, [float(v) for v in want_w], rtol=0, atol=1e-15):
            failures.append(f"{name}: weights {got_w}, expected {[float(v) for v in want_w]}")
    # A kept expert whose biased score is <= 0 is where HF's 0.0 fill and -inf differ: counted.
    c = cfg(gating=2, n_group=4, topk_group=1, n_expert_used=2)
    r = ref.route(x, lw_for([-1.0] * 8), c)
    if r.stats.get("fill_sensitive") != 1:
        failures.append(f"negative biases: fill_sensitive is {r.stats.get('fill_sensitive')}, "
                        f"expected 1")


# -- DeepSeek-V3.2 (deepseek32): the indexer --------------------------------------------------

# (type, seed, overrides of write_tiny_deepseek32), each run on V32_TOKENS + 2 tokens, so that
# every query past the top_k-th drops keys.
CASES_V32 = [
    ("f32", 21, dict(index_topk=3)),  # V3-like + indexer 4 heads of 32, YaRN x4 over 256
    ("f16", 22, dict(index_topk=5, index_heads=2, index_dim=16, n_group=1, topk_group=1)),
    ("bf16", 23, dict(index_topk=8, index_dim=8)),  # key_length == rope: every dim rotated
    ("q8_0", 24, dict(index_topk=5, index_heads=1, yarn=1.0, dense=0)),  # one head, no YaRN
    ("q4_0", 25, dict(index_topk=8, q_lora=64, rope=16, nope=8, v_dim=24,
                      proj_type="f32")),  # other head sizes, indexer.proj in f32
]
V32_TOKENS = 38
# A planted defect must move the logits by at least this (relative, compare_logits.py's metric)
# on every case where it changes the math: 100x compare_logits.py's bound for duet (1e-4), so
# that a comparison with duet would catch it too, not only this self-test (bound 1e-10).
# Measured: 0.35 (ties to the higher position) to 0.98 (adjacent-pair rope).
DEFECT_MIN = 1e-2
SELECTION_MIN = 1e-2  # the choice must move the logits as much (measured 0.94 to 1.16)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    """compare_logits.py's metric: max over positions of max|got - want| / (1 + max|want|);
    NaN when `got` has a NaN."""
    return float(np.max(np.abs(got - want).max(axis=1) / (1 + np.abs(want).max(axis=1))))


def check_index_choice(failures: list[str]) -> None:
    """index_mask and index_stats on hand-made scores: ties to the lower position, a query with
    fewer keys than top_k attends to all of them, the boundary ties counted."""
    inf = float("-inf")
    score = torch.tensor([[1.0, inf, inf, inf],
                          [0.0, 2.0, inf, inf],
                          [0.0, 0.0, 0.0, inf],
                          [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    keep = torch.isfinite(ref.index_mask(score, 2) + score).tolist()
    want = [[True, False, False, False], [True, True, False, False],
            [True, True, False, False], [True, True, False, False]]
    if keep != want:
        failures.append(f"index_mask on hand-made scores kept {keep}, expected {want}")
    st = ref.index_stats(score, 2)
    if (st["sparse"], st["dropped"], st["ties"]) != (2, 3, 2):
        failures.append(f"index_stats on hand-made scores: {st}, expected 2 sparse queries, 3 "
                        f"keys dropped, 2 ties")
    # top_k >= T: nothing dropped
    if not torch.equal(ref.index_mask(score, 9) + score.masked_fill(torch.isfinite(score), 0.0),
                       score.masked_fill(torch.isfinite(score), 0.0)):
        failures.append("index_mask with top_k >= T drops a causal key")


def check_fp8_rounding(failures: list[str]) -> None:
    """The FP8 indexer's pieces on hand-made values: e4m3's values, nearest with ties to the even
    code and saturation, Sylvester's matrix, a rotated row at its power-of-two scale."""
    v = ref.E4M3
    want = {0: 0.0, 1: 2.0 ** -9, 7: 7 * 2.0 ** -9, 8: 2.0 ** -6, 0x38: 1.0, 0x39: 1.125, 126: 448.0}
    got = {c: float(v[c]) for c in want}
    if got != want or not bool((v[1:] > v[:-1]).all()):
        failures.append(f"e4m3 values {got}, expected {want}, increasing")
    x = torch.tensor([1.0625, 1.1875, 1.07, 1e6, -3.3, 2.0 ** -10, 3 * 2.0 ** -10, -0.0], dtype=torch.float64)
    want_r = [1.0, 1.25, 1.125, 448.0, -3.25, 0.0, 2 * 2.0 ** -9, 0.0]
    if ref.e4m3_round(x).tolist() != want_r:
        failures.append(f"e4m3_round({x.tolist()}) = {ref.e4m3_round(x).tolist()}, expected {want_r}")
    h = ref.sylvester_hadamard(128)
    if not torch.equal(h @ h.T, 128 * torch.eye(128, dtype=torch.float64)) or \
            (ref.sylvester_hadamard(4) @ torch.tensor([1.0, 2, 3, 4], dtype=torch.float64)).tolist() != [10, -2, -4, 0]:
        failures.append("Sylvester's Hadamard matrix: H H^T != n I or H (1, 2, 3, 4) != (10, -2, -4, 0)")
    # (1, 2, 3, 4) rotates to (5, -1, -2, 0) (times 4^-1/2): amax 5, scale 2^-6, all on the grid;
    # (1, 2, 3, 4.75) to (5.375, -1.375, -2.375, 0.375), at the same scale 344, -88, -152 and 24:
    # 344 rounds to 352, and -152, a tie between 144 and 160, to the even code's 160.
    for row, want_row in (([1.0, 2, 3, 4], [5.0, -1, -2, 0]), ([1.0, 2, 3, 4.75], [5.5, -1.375, -2.5, 0.375])):
        out = ref.fp8_indexer_round(torch.tensor([row], dtype=torch.float64))[0].tolist()
        if out != want_row:
            failures.append(f"fp8_indexer_round({row}) = {out}, expected {want_row}")


def check_kv_cache_round(failures: list[str]) -> None:
    """duet's fp8 cache rows: a whole block of 128 at its power-of-two scale, the rest in float16;
    each row's distance to a rounding midpoint recorded when asked for."""
    blk = [5.0, 300.0 / 64, 304.0 / 64, -1.0 / 64] + [0.0] * 124  # amax 5: scale 2^-6 (see above)
    tail = [1.0 + 2.0 ** -12, 1.0 / 3]
    row = torch.tensor([blk + tail], dtype=torch.float64)
    ref.KV_MIDPOINT_DISTANCES = []
    try:
        out = ref.kv_cache_round(row)[0].tolist()
        nearest = [float(d) for d in ref.KV_MIDPOINT_DISTANCES[0]]
    finally:
        ref.KV_MIDPOINT_DISTANCES = None
    want = [5.0, 288.0 / 64, 320.0 / 64, -1.0 / 64] + [0.0] * 124 + \
        [1.0, float(torch.tensor(1.0 / 3).half())]
    if out != want:
        failures.append(f"kv_cache_round: {out[:4]} ... {out[128:]}, expected {want[:4]} ... {want[128:]}")
    # 304 is the midpoint of 288 and 320: distance 0.
    if nearest != [0.0]:
        failures.append(f"kv_cache_round's midpoint distances {nearest}, expected [0.0]")
    short = torch.tensor([[0.1, -2.0 ** -20]], dtype=torch.float64)  # no whole block: halves only
    if ref.kv_cache_round(short)[0].tolist() != short.half().double()[0].tolist():
        failures.append("kv_cache_round of a row shorter than a block is not its float16 rounding")


def check_v32_refusals(failures: list[str], tmp: str) -> None:
    """deepseek32 files the reference must refuse, each with a message naming the problem."""
    cases = [
        ("no q_lora", dict(q_lora=0, indexer_tensors=False), "q_lora_rank"),
        ("no indexer keys", dict(index_heads=0), "indexer.head_count"),
        ("no indexer tensors", dict(indexer_tensors=False), "blk.0.indexer.attn_q_b.weight"),
        ("key_length < rope", dict(index_dim=4, indexer_tensors=False), "key_length"),
    ]
    for name, over, needle in cases:
        path = os.path.join(tmp, "v32_refused.gguf")
        write_tiny_deepseek32(path, "f32", 1, **over)
        try:
            ref.load_model(path)
            failures.append(f"deepseek32 {name}: the reference accepted the file")
        except gr.GGUFError as e:
            if needle not in str(e):
                failures.append(f"deepseek32 {name}: the message does not name {needle!r}: {e}")


def check_v32_dense_limit(failures: list[str], tmp: str) -> None:
    """top_k >= T: the deepseek32 file equals the deepseek2 file of the same weights (written
    without the indexer), bit for bit in the reference (the mask adds 0.0), and the second
    formulation agrees."""
    tokens = np.random.default_rng(5).integers(0, 96, size=30).tolist()
    v32, v2 = os.path.join(tmp, "v32_k64.gguf"), os.path.join(tmp, "v2_same.gguf")
    write_tiny_deepseek32(v32, "q8_0", 31, index_topk=64)
    write_tiny_deepseek2(v2, "q8_0", 31, **V3_LIKE)
    _, got = reference_logits(ref, v32, tokens)
    _, want = reference_logits(ref, v2, tokens)
    err = float(np.abs(got - want).max())
    print(f"deepseek32 top_k 64 >= {len(tokens)} tokens: max |deepseek32 - deepseek2| = {err:.2e}"
          f" (the same weights)")
    if err != 0.0:
        failures.append(f"deepseek32 with top_k >= T differs from deepseek2 by {err:.3e}")
    check_close(failures, "q8_0 deepseek32 top_k 64", got, incremental_forward(v32, tokens),
                "the reference and the incremental forward with the indexer")


def check_v32(failures: list[str]) -> None:
    """Every CASES_V32 model: the reference against the incremental forward (indexer keys cached,
    the choice by explicit scores and sorting); how often the choice drops keys and hangs on a
    tie; that the choice moves the logits (vs every causal key); that each planted defect is
    caught, in the second formulation (INDEXER_DEFECTS) or in the reference (the choice made
    before the causal mask)."""
    worst: dict[str, list[float]] = {d: [] for d in INDEXER_DEFECTS}
    worst["no_causal_choice"] = []
    any_ties = False
    for tag, path, over, tokens in tiny_models(CASES_V32, write_tiny_deepseek32, 32, V32_TOKENS):
        trace: dict = {}
        m, got = reference_logits(ref, path, tokens, trace)
        c = m.cfg
        st = [trace[f"indexer_stats-{i}"] for i in range(c.n_layer)]
        inc_stats: dict = {}
        want = incremental_forward(path, tokens, stats=inc_stats)
        sparse, dropped, ties = (sum(s[k] for s in st) for k in ("sparse", "dropped", "ties"))
        margin = min(s["margin"] for s in st)
        with torch.no_grad():
            dense = ref.forward(ref.dense_twin(m), tokens).numpy()
        moved = relative(got, dense)
        check_close(failures, f"deepseek32 {tag}", got, want,
                    "the reference and the incremental forward with the indexer",
                    f"; {sparse} sparse queries dropping {dropped} keys, {ties} ties, smallest "
                    f"gap {margin:.2g}; the choice moves the logits by {moved:.3g}")
        if sparse != (len(tokens) - c.index_topk) * c.n_layer or \
                inc_stats.get("sparse", 0) != sparse or inc_stats.get("ties", 0) != ties:
            failures.append(f"deepseek32 {tag}: sparse queries / ties {sparse} / {ties} in the "
                            f"reference, {inc_stats} in the incremental forward")
        if moved < SELECTION_MIN:
            failures.append(f"deepseek32 {tag}: the indexer's choice moves the logits by only "
                            f"{moved:.3g} (< {SELECTION_MIN:g})")
        any_ties |= ties > 0
        for defect in INDEXER_DEFECTS:
            err = relative(incremental_forward(path, tokens, defect), got)
            invisible = (defect == "unscaled"  # a positive factor on every score: same order
                         or (defect == "rope_last" and c.index_head_dim == c.qk_rope_head_dim)
                         or (defect == "plain_freqs" and c.yarn_factor <= 1)
                         or (defect == "ties_high" and ties == 0))
            if invisible:
                if defect == "unscaled" and err > 1e-10:
                    failures.append(f"deepseek32 {tag}: the variant with unscaled weights "
                                    f"differs from the reference by {err:.3e}, though a positive "
                                    f"factor on every score keeps their order")
                continue
            worst[defect].append(err)
            if err < DEFECT_MIN:
                failures.append(f"deepseek32 {tag}: the planted defect '{defect}' "
                                f"({INDEXER_DEFECTS[defect]}) moves the logits by only {err:.3e}")
        mm = dataclasses.replace(m, cfg=dataclasses.replace(c, index_choice_causal=False))
        with torch.no_grad():
            err = relative(ref.forward(mm, tokens).numpy(), want)
        worst["no_causal_choice"].append(err)
        if err < DEFECT_MIN:  # (NaN is caught: a query whose choice was all future keys)
            failures.append(f"deepseek32 {tag}: the reference choosing before the causal mask "
                            f"differs from the incremental forward by only {err:.3e}")
    if not any_ties:
        failures.append("deepseek32: no case has a tie at the top-k boundary: the tie rule "
                        "(and the 'ties_high' defect) went untested")
    print("deepseek32 planted defects, smallest relative change of the logits over the cases "
          "where each changes the math (compare_logits.py's metric):")
    for defect, errs in worst.items():
        what = INDEXER_DEFECTS.get(defect, "the choice made before the causal mask (reference)")
        shown = "no change, as it must be: a positive factor on every score keeps their order"
        if errs and all(math.isnan(e) for e in errs):
            shown = f"NaN in all {len(errs)} cases (queries left with no key)"
        elif errs:
            shown = f"{np.nanmin(errs):.3g} (over {len(errs)} cases)"
        print(f"  {defect}: {shown}: {what}")


def main() -> int:
    failures: list[str] = []
    check_pieces(failures)
    check_routing_rules(failures)
    for tag, path, over, tokens in tiny_models(CASES, write_tiny_deepseek2, 12, 21):
        trace: dict = {}
        m, got = reference_logits(ref, path, tokens, trace)
        stats = [trace[k] for k in trace if k.startswith("ffn_moe_stats")]
        sets = len(set().union(*(s["sets"] for s in stats))) if stats else 0
        extra = ", ".join(f"{name} {sum(s.get(name, 0) for s in stats)}"
                          for name in ("group_bites", "bias_bites", "fill_sensitive")
                          if any(name in s for s in stats))
        check_close(failures, tag, got, incremental_forward(path, tokens),
                    "the reference and the absorbed incremental forward",
                    f"; {sets} expert sets{', ' + extra if extra else ''}")
        if any(s.get("fill_sensitive") for s in stats):
            failures.append(f"{tag}: fill-sensitive tokens (ties among masked experts)")
        if over.get("topk_group", 1) < over.get("n_group", 1) and \
                not any(s.get("group_bites") for s in stats):
            failures.append(f"{tag}: the group limit never changed the choice")
    check_index_choice(failures)
    check_fp8_rounding(failures)
    check_kv_cache_round(failures)
    check_v32(failures)
    with tempfile.TemporaryDirectory() as tmp:
        check_v32_dense_limit(failures, tmp)
        check_v32_refusals(failures, tmp)
    return report(failures, "deepseek2 reference self-test")


if __name__ == "__main__":
    sys.exit(main())
