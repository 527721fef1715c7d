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

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import math
import os
import sys

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
                         norm=False, gating=1, bias_center=0.1, bias_width=0.1) -> None:
    kv = {
        "general.architecture": V(gr.T_STRING, "deepseek2"),
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
    write_gguf(path, kv, t.tensors)


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


def incremental_forward(path: str, tokens: list[int]) -> np.ndarray:
    g = gr.GGUFFile(path)
    c = ref.read_config(g)
    w = float64_tensors(g)
    H, nope, rope, vd, L = c.n_head, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, \
        c.kv_lora_rank
    log_mul = g.get(A + "rope.scaling.yarn_log_multiplier", 0.0)
    factor = c.yarn_factor
    kq_scale = (1.0 + log_mul * math.log(factor)) ** 2 / math.sqrt(nope + rope) if factor > 1 \
        else 1 / math.sqrt(nope + rope)

    def norm(x, weight):
        return np_rms_norm(x, weight, c.rms_eps)

    ffn = np_swiglu

    latent = [[] for _ in range(c.n_layer)]  # per position: normed c_kv [L]
    k_rope = [[] for _ in range(c.n_layer)]  # per position: roped k_pe [rope]
    logits = []
    for pos, tok in enumerate(tokens):
        cos, sin = ggml_rope_cache(pos, rope, c.rope_base, factor, c.yarn_original_context)
        x = w["token_embd.weight"][tok].copy()
        for layer in range(c.n_layer):
            p = f"blk.{layer}."
            h = norm(x, w[p + "attn_norm.weight"])
            if c.q_lora_rank:
                q = w[p + "attn_q_b.weight"] @ norm(w[p + "attn_q_a.weight"] @ h,
                                                   w[p + "attn_q_a_norm.weight"])
            else:
                q = w[p + "attn_q.weight"] @ h
            q = q.reshape(H, nope + rope)
            ckv = w[p + "attn_kv_a_mqa.weight"] @ h
            latent[layer].append(norm(ckv[:L], w[p + "attn_kv_a_norm.weight"]))
            k_rope[layer].append(rope_adjacent(ckv[L:], cos, sin))
            C = np.array(latent[layer])  # [S, L]
            R = np.array(k_rope[layer])  # [S, rope]
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
    return report(failures, "deepseek2 reference self-test")


if __name__ == "__main__":
    sys.exit(main())
