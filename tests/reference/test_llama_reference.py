"""Checks of the reference itself (llama_reference.py); needs numpy and torch, not duet.

1. llama_reference.self_check(): un-permuting the q/k rows inverts llama.cpp's converter
   permutation, and adjacent-pair rope on the GGUF layout equals HF rope on the HF layout.
2. The whole forward pass against a second implementation written the other way round: the
   llama.cpp way, straight on the GGUF layout (no un-permutation, adjacent-pair rope), one token at
   a time with a growing KV cache and explicit loops over heads, in numpy float64. Tiny models are
   written here (GQA, MHA and MQA; linear rope scaling or none; tied or separate lm_head; every
   weight type), so a change to the reference that breaks the rope convention, the kv head
   mapping, the causal mask or the tying shows up without duet.

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    TinyTensors, check_close, float64_tensors, np_attention, np_rms_norm, np_swiglu,
    reference_logits, report, tiny_models)
import gguf_reader as gr  # noqa: E402
import llama_reference as ref  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402

import numpy as np  # noqa: E402


def write_tiny_llama(path: str, type_name: str, seed: int, n_embd=64, n_layer=2, n_head=4,
                     n_head_kv=2, n_ff=96, vocab=96, rope_scale=4.0, tied=False) -> None:
    kv = {
        "general.architecture": V(gr.T_STRING, "llama"),
        "llama.embedding_length": V(gr.T_UINT32, n_embd),
        "llama.block_count": V(gr.T_UINT32, n_layer),
        "llama.feed_forward_length": V(gr.T_UINT32, n_ff),
        "llama.attention.head_count": V(gr.T_UINT32, n_head),
        "llama.attention.head_count_kv": V(gr.T_UINT32, n_head_kv),
        "llama.attention.layer_norm_rms_epsilon": V(gr.T_FLOAT32, 1e-5),
        "llama.rope.freq_base": V(gr.T_FLOAT32, 10000.0),
        # no llama.vocab_size: the reference takes the length of the token list
        "tokenizer.ggml.tokens": V(gr.T_ARRAY, [V(gr.T_STRING, f"t{i}") for i in range(vocab)],
                                   elem=gr.T_STRING),
    }
    if rope_scale != 1.0:
        kv["llama.rope.scaling.type"] = V(gr.T_STRING, "linear")
        kv["llama.rope.scaling.factor"] = V(gr.T_FLOAT32, rope_scale)
    t = TinyTensors(type_name, seed)
    add_llama_tensors(t, n_embd, n_layer, n_head, n_head_kv, n_ff, vocab, tied)
    write_gguf(path, kv, t.tensors)


def add_llama_tensors(t: TinyTensors, n_embd: int, n_layer: int, n_head: int, n_head_kv: int,
                      n_ff: int, vocab: int, tied: bool, biases: bool = False) -> None:
    """A llama-shaped model's random tensors (norms near 1); with `biases`, qwen2's q/k/v biases
    after each of those weights."""
    hd = n_embd // n_head
    add = t.add
    add("token_embd.weight", (vocab, n_embd), 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (n_embd,), 0.2, 1.0)
        for name, rows, std in (("attn_q", n_head * hd, 2 * n_embd ** -0.5),
                                ("attn_k", n_head_kv * hd, 2 * n_embd ** -0.5),
                                ("attn_v", n_head_kv * hd, n_embd ** -0.5)):
            add(p + name + ".weight", (rows, n_embd), std)
            if biases:
                add(p + name + ".bias", (rows,), 0.5)
        add(p + "attn_output.weight", (n_embd, n_head * hd), n_embd ** -0.5)
        add(p + "ffn_norm.weight", (n_embd,), 0.2, 1.0)
        add(p + "ffn_gate.weight", (n_ff, n_embd), n_embd ** -0.5)
        add(p + "ffn_up.weight", (n_ff, n_embd), n_embd ** -0.5)
        add(p + "ffn_down.weight", (n_embd, n_ff), n_ff ** -0.5)
    add("output_norm.weight", (n_embd,), 0.2, 1.0)
    if not tied:
        add("output.weight", (vocab, n_embd), n_embd ** -0.5)


def incremental_forward(path: str, tokens: list[int]) -> np.ndarray:
    """The llama.cpp formulation on the GGUF layout, one token at a time, numpy float64."""
    g = gr.GGUFFile(path)
    c = ref.read_config(g)
    w = float64_tensors(g)
    hd = c.head_dim
    group = c.n_head // c.n_head_kv
    lm_head = w.get("output.weight", w["token_embd.weight"])

    def norm(x, weight):
        return np_rms_norm(x, weight, c.rms_eps)

    def rope_pairs(v, pos):  # v: [heads, hd]; rotate (2i, 2i+1) by pos' * base^(-2i/hd)
        out = v.copy()
        for i in range(hd // 2):
            theta = pos / c.rope_scale * c.rope_base ** (-2.0 * i / hd)
            cs, sn = np.cos(theta), np.sin(theta)
            out[:, 2 * i] = v[:, 2 * i] * cs - v[:, 2 * i + 1] * sn
            out[:, 2 * i + 1] = v[:, 2 * i] * sn + v[:, 2 * i + 1] * cs
        return out

    k_cache = [[] for _ in range(c.n_layer)]
    v_cache = [[] for _ in range(c.n_layer)]
    logits = []
    for pos, tok in enumerate(tokens):
        x = w["token_embd.weight"][tok].copy()
        for layer in range(c.n_layer):
            p = f"blk.{layer}."
            h = norm(x, w[p + "attn_norm.weight"])
            q = rope_pairs((w[p + "attn_q.weight"] @ h).reshape(c.n_head, hd), pos)
            k_cache[layer].append(rope_pairs((w[p + "attn_k.weight"] @ h)
                                             .reshape(c.n_head_kv, hd), pos))
            v_cache[layer].append((w[p + "attn_v.weight"] @ h).reshape(c.n_head_kv, hd))
            att = np_attention(q, k_cache[layer], v_cache[layer], group)
            x = x + w[p + "attn_output.weight"] @ att.reshape(-1)
            h = norm(x, w[p + "ffn_norm.weight"])
            x = x + np_swiglu(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"],
                              w[p + "ffn_down.weight"])
        logits.append(lm_head @ norm(x, w["output_norm.weight"]))
    return np.array(logits)


CASES = [
    # (type, seed, overrides)
    ("f32", 1, {}),
    ("f16", 2, {"n_head_kv": 4, "rope_scale": 1.0, "tied": True}),
    ("bf16", 3, {"n_head": 8, "n_head_kv": 1}),
    ("q8_0", 4, {}),
    ("q4_0", 5, {"n_layer": 1, "tied": True}),
]


def main() -> int:
    failures = ref.self_check()
    for tag, path, over, tokens in tiny_models(CASES, write_tiny_llama, 11, 19):
        m, got = reference_logits(ref, path, tokens)
        check_close(failures, tag, got, incremental_forward(path, tokens),
                    "batched HF-layout reference and incremental GGUF-layout forward")
        if m.tied != over.get("tied", False):
            failures.append(f"{tag}: tied is {m.tied}")
    return report(failures, "reference self-test")


if __name__ == "__main__":
    sys.exit(main())
