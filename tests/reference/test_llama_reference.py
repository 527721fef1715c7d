"""Checks of the reference itself (llama_reference.py); needs numpy and torch, not duet.

1. llama_reference.self_check(): un-permuting the q/k rows inverts llama.cpp's converter
   permutation, and adjacent-pair rope on the GGUF layout equals HF rope on the HF layout.
2. The whole forward pass against a second implementation written the other way round: the
   llama.cpp way, straight on the GGUF layout (no un-permutation, adjacent-pair rope), one token at
   a time with a growing KV cache and explicit loops over heads, in numpy float64, with the rope
   angles and magnitudes of ggml's rope_yarn (reference_common.GgmlRope, which reads the rope keys
   from the file itself). Tiny models are written here (GQA, MHA and MQA; linear rope scaling,
   YaRN with and without yarn_attn_factor and beta keys, or none; tied or separate lm_head; every
   weight type), so a change to the reference that breaks the rope convention, the YaRN
   frequencies or magnitude, the kv head mapping, the causal mask or the tying shows up without
   duet. On the YaRN models, YaRN must matter: the same weights with plain rope move the logits.

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
import llama_reference as ref  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def write_tiny_llama(path: str, type_name: str, seed: int, n_embd=64, n_layer=2, n_head=4,
                     n_head_kv=2, n_ff=96, vocab=96, rope_scale=4.0, tied=False, yarn=0.0,
                     yarn_orig=1024, beta_fast=None, beta_slow=None, attn_factor=None) -> None:
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
    add_rope_scaling(kv, "llama.", rope_scale, yarn, yarn_orig, beta_fast, beta_slow, attn_factor)
    t = TinyTensors(type_name, seed)
    add_llama_tensors(t, n_embd, n_layer, n_head, n_head_kv, n_ff, vocab, tied)
    write_gguf(path, kv, t.tensors)


def add_rope_scaling(kv: dict, a: str, rope_scale: float, yarn: float, yarn_orig: int,
                     beta_fast: float | None, beta_slow: float | None,
                     attn_factor: float | None) -> None:
    """The rope scaling keys under prefix `a`: YaRN when `yarn` is set (factor, original context,
    and the optional keys that are not None), else linear when rope_scale != 1, else none."""
    if yarn:
        kv[a + "rope.scaling.type"] = V(gr.T_STRING, "yarn")
        kv[a + "rope.scaling.factor"] = V(gr.T_FLOAT32, yarn)
        kv[a + "rope.scaling.original_context_length"] = V(gr.T_UINT32, yarn_orig)
        for key, value in (("yarn_beta_fast", beta_fast), ("yarn_beta_slow", beta_slow),
                           ("yarn_attn_factor", attn_factor)):
            if value is not None:
                kv[a + "rope.scaling." + key] = V(gr.T_FLOAT32, value)
    elif rope_scale != 1.0:
        kv[a + "rope.scaling.type"] = V(gr.T_STRING, "linear")
        kv[a + "rope.scaling.factor"] = V(gr.T_FLOAT32, rope_scale)


def add_llama_tensors(t: TinyTensors, n_embd: int, n_layer: int, n_head: int, n_head_kv: int,
                      n_ff: int, vocab: int, tied: bool, biases: bool = False,
                      head_dim: int | None = None, qk_norm: bool = False) -> None:
    """A llama-shaped model's random tensors (norms near 1); with `biases`, qwen2's q/k/v biases
    after each of those weights; `head_dim` when it is not n_embd / n_head; with `qk_norm`,
    qwen3's per-head q and k norm weights [head_dim] (f32) after the attention output."""
    hd = head_dim or n_embd // n_head
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
        add(p + "attn_output.weight", (n_embd, n_head * hd), (n_head * hd) ** -0.5)
        if qk_norm:
            add(p + "attn_q_norm.weight", (hd,), 0.3, 1.0)
            add(p + "attn_k_norm.weight", (hd,), 0.3, 1.0)
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

    rope = GgmlRope(g, "llama", hd)

    def rope_pairs(v, pos):  # v: [heads, hd]; rotate (2i, 2i+1) by ggml's angle i (and scale)
        out = v.copy()
        cos, sin = rope.cos_sin(pos)
        for i in range(hd // 2):
            cs, sn = cos[i], sin[i]
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
    # YaRN x4 over 1024 positions (head_dim 16: pairs 1..5 blended), the default magnitude
    ("f32", 6, {"yarn": 4.0}),
    # YaRN x8 with attn_factor and both beta keys (pairs 0..3), MQA
    ("q8_0", 7, {"yarn": 8.0, "yarn_orig": 256, "beta_fast": 16.0, "beta_slow": 2.0,
                 "attn_factor": 0.8, "n_head_kv": 1}),
]


def yarn_matters(failures: list[str], tag: str, reference, m, tokens: list[int],
                 got: np.ndarray) -> None:
    """On a YaRN model: the same weights with plain rope (no YaRN frequencies, no magnitude) must
    move the logits, or the check could not have seen YaRN."""
    if not m.cfg.yarn_factor:
        return
    m.cfg.yarn_factor = 0.0
    with torch.no_grad():
        plain = reference.forward(m, tokens).numpy()
    moved = float(np.abs(plain - got).max())
    print(f"  the same model with plain rope moves the logits by {moved:.3g}")
    if moved < 1e-3:
        failures.append(f"{tag}: YaRN changes nothing ({moved:.3e})")


def main() -> int:
    failures = ref.self_check()
    for tag, path, over, tokens in tiny_models(CASES, write_tiny_llama, 11, 19):
        m, got = reference_logits(ref, path, tokens)
        check_close(failures, tag, got, incremental_forward(path, tokens),
                    "batched HF-layout reference and incremental GGUF-layout forward")
        if m.tied != over.get("tied", False):
            failures.append(f"{tag}: tied is {m.tied}")
        yarn_matters(failures, tag, ref, m, tokens, got)
    return report(failures, "reference self-test")


if __name__ == "__main__":
    sys.exit(main())
