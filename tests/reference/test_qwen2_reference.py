"""Checks of the qwen2 reference itself (qwen2_reference.py); needs numpy and torch, not duet.

The whole forward pass against a second implementation written the other way round: the
llama.cpp way, one token at a time with a growing KV cache, explicit loops over heads, NEOX rope
written as explicit (i, i + d/2) pair rotations with ggml's rope_yarn angles and magnitudes
(reference_common.GgmlRope), the biases added by hand and the sliding window as "keep the last W
cached positions", in numpy float64. Tiny models are written here (GQA, MHA and MQA; linear rope
scaling, YaRN or none; tied or separate lm_head; every weight type; a sliding window on some
layers, on all layers, and one switched off by use_sliding_window = false), so a change to the
reference that breaks the rope layout, the YaRN frequencies or magnitude, the biases, the kv head
mapping, the mask or the window shows up without duet.

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    GgmlRope, TinyTensors, check_close, float64_tensors, np_attention, np_rms_norm, np_swiglu,
    reference_logits, report, tiny_models)
import gguf_reader as gr  # noqa: E402
import qwen2_reference as ref  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402
from test_llama_reference import add_llama_tensors, add_rope_scaling, yarn_matters  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def write_tiny_qwen2(path: str, type_name: str, seed: int, n_embd=64, n_layer=3, n_head=4,
                     n_head_kv=2, n_ff=96, vocab=96, rope_scale=1.0, tied=False, window=0,
                     max_window_layers=None, use_window=None, yarn=0.0, yarn_orig=1024,
                     beta_fast=None, beta_slow=None, attn_factor=None) -> None:
    a = "qwen2."
    kv = {
        "general.architecture": V(gr.T_STRING, "qwen2"),
        a + "embedding_length": V(gr.T_UINT32, n_embd),
        a + "block_count": V(gr.T_UINT32, n_layer),
        a + "feed_forward_length": V(gr.T_UINT32, n_ff),
        a + "attention.head_count": V(gr.T_UINT32, n_head),
        a + "attention.head_count_kv": V(gr.T_UINT32, n_head_kv),
        a + "attention.layer_norm_rms_epsilon": V(gr.T_FLOAT32, 1e-6),
        a + "rope.freq_base": V(gr.T_FLOAT32, 10000.0),
        # no qwen2.vocab_size: the reference takes the embedding's row count
    }
    add_rope_scaling(kv, a, rope_scale, yarn, yarn_orig, beta_fast, beta_slow, attn_factor)
    if window:
        kv[a + "attention.sliding_window"] = V(gr.T_UINT32, window)
    if max_window_layers is not None:
        kv[a + "attention.max_window_layers"] = V(gr.T_UINT32, max_window_layers)
    if use_window is not None:
        kv[a + "attention.use_sliding_window"] = V(gr.T_BOOL, use_window)
    t = TinyTensors(type_name, seed)  # norms and biases in f32
    add_llama_tensors(t, n_embd, n_layer, n_head, n_head_kv, n_ff, vocab, tied, biases=True)
    write_gguf(path, kv, t.tensors)


def incremental_forward(path: str, tokens: list[int]) -> np.ndarray:
    """The llama.cpp formulation, one token at a time, numpy float64."""
    g = gr.GGUFFile(path)
    c = ref.read_config(g)
    w = float64_tensors(g)
    hd = c.head_dim
    half = hd // 2
    group = c.n_head // c.n_head_kv
    lm_head = w.get("output.weight", w["token_embd.weight"])

    def norm(x, weight):
        return np_rms_norm(x, weight, c.rms_eps)

    rope = GgmlRope(g, "qwen2", hd)

    def rope_neox(v, pos):  # v: [heads, hd]; rotate (i, i + hd/2) by ggml's angle i (and scale)
        out = v.copy()
        cos, sin = rope.cos_sin(pos)
        for i in range(half):
            cs, sn = cos[i], sin[i]
            out[:, i] = v[:, i] * cs - v[:, i + half] * sn
            out[:, i + half] = v[:, i] * sn + v[:, i + half] * cs
        return out

    k_cache = [[] for _ in range(c.n_layer)]
    v_cache = [[] for _ in range(c.n_layer)]
    logits = []
    for pos, tok in enumerate(tokens):
        x = w["token_embd.weight"][tok].copy()
        for layer in range(c.n_layer):
            p = f"blk.{layer}."
            h = norm(x, w[p + "attn_norm.weight"])
            q = rope_neox((w[p + "attn_q.weight"] @ h + w[p + "attn_q.bias"])
                          .reshape(c.n_head, hd), pos)
            k_cache[layer].append(rope_neox((w[p + "attn_k.weight"] @ h + w[p + "attn_k.bias"])
                                            .reshape(c.n_head_kv, hd), pos))
            v_cache[layer].append((w[p + "attn_v.weight"] @ h + w[p + "attn_v.bias"])
                                  .reshape(c.n_head_kv, hd))
            # The window: only the last W cached positions (this one included).
            first = 0
            if c.sliding_window > 0 and layer >= c.max_window_layers:
                first = max(0, pos + 1 - c.sliding_window)
            att = np_attention(q, k_cache[layer][first:], v_cache[layer][first:], group)
            x = x + w[p + "attn_output.weight"] @ att.reshape(-1)
            h = norm(x, w[p + "ffn_norm.weight"])
            x = x + np_swiglu(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"],
                              w[p + "ffn_down.weight"])
        logits.append(lm_head @ norm(x, w["output_norm.weight"]))
    return np.array(logits)


CASES = [
    # (type, seed, overrides)
    ("f32", 1, {}),
    ("f16", 2, {"n_head_kv": 4, "tied": True}),
    ("bf16", 3, {"n_head": 8, "n_head_kv": 1, "rope_scale": 4.0}),
    ("q8_0", 4, {"window": 5, "max_window_layers": 1}),
    ("q4_0", 5, {"n_layer": 2, "tied": True, "window": 3}),
    ("f32", 6, {"window": 4, "use_window": False}),
    # YaRN x4 over 1024 positions (head_dim 16: pairs 1..5 blended) with attn_factor
    # 1 / (0.1 ln 4 + 1), so that the magnitudes cancel as in DeepSeek-R1-0528-Qwen3-8B
    ("bf16", 7, {"yarn": 4.0, "attn_factor": 1 / (0.1 * np.log(4.0) + 1), "tied": True}),
]


def main() -> int:
    failures = []
    # The mask itself: window 3 over 5 positions, HF's sliding_window_overlay AND causal.
    want = np.array([[0, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [1, 0, 0, 0, 1],
                     [1, 1, 0, 0, 0]], dtype=bool)
    if not np.array_equal(ref.attention_mask(5, 3).numpy(), want):
        failures.append(f"window mask is\n{ref.attention_mask(5, 3).numpy().astype(int)}")
    for tag, path, over, tokens in tiny_models(CASES, write_tiny_qwen2, 12, 19):
        m, got = reference_logits(ref, path, tokens)
        check_close(failures, tag, got, incremental_forward(path, tokens),
                    "batched reference and incremental forward")
        if m.tied != over.get("tied", False):
            failures.append(f"{tag}: tied is {m.tied}")
        if over.get("window") and over.get("use_window", True):
            # The window must matter on these models: without it the logits move.
            m.cfg.sliding_window = 0
            with torch.no_grad():
                full = ref.forward(m, tokens).numpy()
            moved = float(np.abs(full - got).max())
            print(f"  the same model without its window moves the logits by {moved:.3g}")
            if moved < 1e-3:
                failures.append(f"{tag}: the window changes nothing ({moved:.3e})")
        yarn_matters(failures, tag, ref, m, tokens, got)
    return report(failures, "qwen2 reference self-test")


if __name__ == "__main__":
    sys.exit(main())
