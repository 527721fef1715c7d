"""Checks of the qwen3 reference itself (qwen3_reference.py) and of the YaRN rope that
llama_reference.py gives llama, qwen2 and qwen3; needs numpy and torch, not duet.

1. The whole forward pass against a second implementation written the other way round, the way
   llama.cpp computes qwen3: numpy float64, one token at a time with a growing KV cache, explicit
   loops over heads, the per-head q/k RMSNorm as an explicit loop over each head's head_dim values
   (sum of squares, then the shared [head_dim] weight), rope as explicit (i, i + d/2) pair
   rotations on the rows as stored, with the angles and magnitudes of ggml's rope_yarn
   (reference_common.GgmlRope: theta_extrap = pos * base^(-2i/d), theta_interp = theta_extrap / s,
   ramp_mix = 1 - clamp((i - lo) / max(0.001, hi - lo)), theta = theta_interp * (1 - ramp_mix) +
   theta_extrap * ramp_mix, times attn_factor * (1 + 0.1 ln s)). That is the same function as HF's
   inv_inter * ramp + inv_extra * (1 - ramp) with ramp = 1 - ramp_mix, written the other way. The
   hyper-parameters (head_dim from attention.key_length, heads, eps) and the rope keys are read
   from the file here, not through the reference's config. Tiny models are written here: GQA, MHA
   and MQA; head_dim different from n_embd / n_head (24 and 48 with n_embd 64) and equal (with
   key_length absent); tied and separate lm_head; every weight type of the other self-checks (f32,
   f16, bf16, q8_0, q4_0); no rope scaling, linear x4, YaRN x4 with the default magnitude, YaRN x4
   with R1-0528's yarn_attn_factor (magnitude 1), YaRN x8 with both beta keys and another
   attn_factor, YaRN x2 over 6 positions (low == high == 0: the 0.001 divisor) and YaRN x1
   (attn_factor alone). So a change to the reference that drops or misplaces the q/k norm
   (before rope, per head, shared weights), mistakes head_dim, the rope layout, the YaRN
   frequencies or magnitude, the kv head mapping or the tying shows up without duet. On each YaRN
   model the same weights with plain rope must move the logits (YaRN is seen).
2. YaRN by hand on DeepSeek-R1-0528-Qwen3-8B's real config (head_dim 128, base 1e6, factor 4 over
   32768 positions, attn_factor 0.8782488562869419): the correction range is pairs 23..40
   (corr(32) = 128 ln(32768 / 64 pi) / (2 ln 1e6) = 23.6, corr(1) = 39.65, worked out by hand),
   the magnitude attn_factor * (0.1 ln 4 + 1) is 1 within 1e-6, inv_freq equals base^(-2i/d) up
   to pair 23 and base^(-2i/d) / 4 from pair 40 on, lies strictly between them in between (pair
   30 as the linear blend by hand) and falls monotonically; and the reference's cos/sin equal
   GgmlRope's at positions up to 131071.
3. The config refusals: a YaRN file without original_context_length, a factor below 1, an empty
   correction range (low > high, where HF's ramp and ggml's disagree) above and below, a qwen3
   file with q/k/v biases or a sliding window.
4. gguf_to_hf.py's qwen3 config.json (Qwen3ForCausalLM, head_dim, no bias or window, YaRN's
   rope_scaling with attn_factor and the beta keys) and its q_norm/k_norm tensor names.

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    GgmlRope, GGUFError, TinyTensors, check_close, float64_tensors, np_attention, np_rms_norm,
    np_swiglu, reference_logits, report, tiny_models)
import gguf_reader as gr  # noqa: E402
import llama_reference  # noqa: E402
import qwen3_reference as ref  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402
from test_llama_reference import add_llama_tensors, add_rope_scaling, yarn_matters  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

A = "qwen3."
R1_ATTN_FACTOR = 0.8782488562869419  # DeepSeek-R1-0528-Qwen3-8B: 1 / (0.1 ln 4 + 1)


def write_tiny_qwen3(path: str, type_name: str, seed: int, n_embd=64, n_layer=2, n_head=4,
                     n_head_kv=2, head_dim=24, n_ff=96, vocab=96, rope_scale=1.0, tied=False,
                     yarn=0.0, yarn_orig=1024, beta_fast=None, beta_slow=None, attn_factor=None,
                     key_length=True, rope_dims=False, rope_base=10000.0, biases=False, window=0,
                     drop_keys=()) -> None:
    """A tiny qwen3 GGUF. key_length False leaves attention.key_length/value_length out (then
    head_dim must be n_embd / n_head); rope_dims writes rope.dimension_count too; biases, window
    and drop_keys make files the reference must refuse."""
    kv = {
        "general.architecture": V(gr.T_STRING, "qwen3"),
        A + "context_length": V(gr.T_UINT32, 4096),
        A + "embedding_length": V(gr.T_UINT32, n_embd),
        A + "block_count": V(gr.T_UINT32, n_layer),
        A + "feed_forward_length": V(gr.T_UINT32, n_ff),
        A + "attention.head_count": V(gr.T_UINT32, n_head),
        A + "attention.head_count_kv": V(gr.T_UINT32, n_head_kv),
        A + "attention.layer_norm_rms_epsilon": V(gr.T_FLOAT32, 1e-6),
        A + "rope.freq_base": V(gr.T_FLOAT32, rope_base),
        # no qwen3.vocab_size: the reference takes the embedding's row count
    }
    if key_length:
        kv[A + "attention.key_length"] = V(gr.T_UINT32, head_dim)
        kv[A + "attention.value_length"] = V(gr.T_UINT32, head_dim)
    elif head_dim != n_embd // n_head:
        raise ValueError("without key_length the head size is n_embd / n_head")
    if rope_dims:
        kv[A + "rope.dimension_count"] = V(gr.T_UINT32, head_dim)
    if window:
        kv[A + "attention.sliding_window"] = V(gr.T_UINT32, window)
    add_rope_scaling(kv, A, rope_scale, yarn, yarn_orig, beta_fast, beta_slow, attn_factor)
    for key in drop_keys:
        del kv[key]
    t = TinyTensors(type_name, seed)  # norms (q/k norms too) in f32
    add_llama_tensors(t, n_embd, n_layer, n_head, n_head_kv, n_ff, vocab, tied, biases=biases,
                      head_dim=head_dim, qk_norm=True)
    write_gguf(path, kv, t.tensors)


def incremental_forward(path: str, tokens: list[int]) -> np.ndarray:
    """The llama.cpp formulation, one token at a time, numpy float64; the hyper-parameters read
    from the file here."""
    g = gr.GGUFFile(path)
    n_embd = g.require(A + "embedding_length")
    n_layer = g.require(A + "block_count")
    n_head = g.require(A + "attention.head_count")
    n_head_kv = g.get(A + "attention.head_count_kv", n_head)
    hd = g.get(A + "attention.key_length", n_embd // n_head)
    eps = g.require(A + "attention.layer_norm_rms_epsilon")
    w = float64_tensors(g)
    half = hd // 2
    group = n_head // n_head_kv
    lm_head = w.get("output.weight", w["token_embd.weight"])
    rope = GgmlRope(g, "qwen3", hd)

    def norm(x, weight):
        return np_rms_norm(x, weight, eps)

    def head_norm(v, weight):  # v: [heads, hd]; each head over its own hd values
        out = np.empty_like(v)
        for head in range(v.shape[0]):
            ss = 0.0
            for j in range(hd):
                ss += v[head, j] * v[head, j]
            r = 1.0 / math.sqrt(ss / hd + eps)
            for j in range(hd):
                out[head, j] = v[head, j] * r * weight[j]
        return out

    def rope_neox(v, pos):  # v: [heads, hd]; rotate (i, i + hd/2) by ggml's angle i (and scale)
        out = v.copy()
        cos, sin = rope.cos_sin(pos)
        for head in range(v.shape[0]):
            for i in range(half):
                a, b = v[head, i], v[head, i + half]
                out[head, i] = a * cos[i] - b * sin[i]
                out[head, i + half] = a * sin[i] + b * cos[i]
        return out

    k_cache = [[] for _ in range(n_layer)]
    v_cache = [[] for _ in range(n_layer)]
    logits = []
    for pos, tok in enumerate(tokens):
        x = w["token_embd.weight"][tok].copy()
        for layer in range(n_layer):
            p = f"blk.{layer}."
            h = norm(x, w[p + "attn_norm.weight"])
            q = (w[p + "attn_q.weight"] @ h).reshape(n_head, hd)
            k = (w[p + "attn_k.weight"] @ h).reshape(n_head_kv, hd)
            q = rope_neox(head_norm(q, w[p + "attn_q_norm.weight"]), pos)
            k_cache[layer].append(rope_neox(head_norm(k, w[p + "attn_k_norm.weight"]), pos))
            v_cache[layer].append((w[p + "attn_v.weight"] @ h).reshape(n_head_kv, hd))
            att = np_attention(q, k_cache[layer], v_cache[layer], group)  # / sqrt(hd)
            x = x + w[p + "attn_output.weight"] @ att.reshape(-1)
            h = norm(x, w[p + "ffn_norm.weight"])
            x = x + np_swiglu(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"],
                              w[p + "ffn_down.weight"])
        logits.append(lm_head @ norm(x, w["output_norm.weight"]))
    return np.array(logits)


CASES = [
    # (type, seed, overrides)
    # GQA 4/2, head_dim 24 (not 64 / 4), no rope scaling, separate lm_head
    ("f32", 1, {}),
    # MHA, head_dim 16 = n_embd / n_head with key_length absent, tied, linear rope x4
    ("f16", 2, {"n_head_kv": 4, "head_dim": 16, "key_length": False, "tied": True,
                "rope_scale": 4.0}),
    # MQA 8/1, YaRN x4 over 1024 positions (head_dim 24: pairs 2..7 blended), magnitude
    # 0.1 ln 4 + 1, rope.dimension_count written
    ("bf16", 3, {"n_head": 8, "n_head_kv": 1, "yarn": 4.0, "rope_dims": True}),
    # DeepSeek-R1-0528-Qwen3-8B's rope kind: YaRN x4 with attn_factor 1 / (0.1 ln 4 + 1), tied
    ("q8_0", 4, {"yarn": 4.0, "attn_factor": R1_ATTN_FACTOR, "tied": True, "n_layer": 3}),
    # head_dim 32 (q rows 128 > n_embd), YaRN x8 over 256 with beta_fast 16 / beta_slow 2
    # (pairs 1..5) and attn_factor 0.8
    ("q4_0", 5, {"head_dim": 32, "yarn": 8.0, "yarn_orig": 256, "beta_fast": 16.0,
                 "beta_slow": 2.0, "attn_factor": 0.8}),
    # 2 heads of 48 sharing one kv head; YaRN x2 over 6 positions: corr(32) = -8.3 and
    # corr(1) = -0.12, so low == high == 0 and the ramp divides by 0.001 (pair 0 kept, the
    # rest / 2)
    ("f32", 6, {"n_head": 2, "n_head_kv": 1, "head_dim": 48, "yarn": 2.0, "yarn_orig": 6}),
    # YaRN x1: plain frequencies, cos and sin times attn_factor 1.25 alone
    ("bf16", 7, {"yarn": 1.0, "attn_factor": 1.25, "n_head_kv": 4}),
]


def check_r1_yarn(failures: list[str]) -> None:
    """YaRN on DeepSeek-R1-0528-Qwen3-8B's config, against the numbers worked out by hand."""
    d, base, s, L, a = 128, 1e6, 4.0, 32768, R1_ATTN_FACTOR
    cfg = llama_reference.LlamaConfig(
        n_embd=4096, n_layer=0, n_ff=0, n_head=32, n_head_kv=8, head_dim=d, rms_eps=1e-6,
        rope_base=base, rope_dim=d, rope_scale=1.0, vocab_size=0, yarn_factor=s,
        yarn_original_context=L, yarn_attn_factor=a)
    low, high = llama_reference.yarn_correction_range(d, base, L, 32.0, 1.0)
    print(f"DeepSeek-R1-0528-Qwen3-8B YaRN: low {low}, high {high} (pairs of {d // 2}), "
          f"mscale {llama_reference.yarn_mscale(cfg):.9f}")
    if (low, high) != (23, 40):
        failures.append(f"R1-0528-Qwen3 YaRN correction range is ({low}, {high}), by hand (23, 40)")
    total = llama_reference.yarn_mscale(cfg)
    if abs(total - 1.0) > 1e-6 or abs(a * (0.1 * math.log(s) + 1) - 1.0) > 1e-6:
        failures.append(f"R1-0528-Qwen3 YaRN magnitude is {total!r}, expected 1 within 1e-6")
    inv = llama_reference.yarn_inv_freq(cfg).numpy()
    extra = base ** (-np.arange(0, d, 2) / d)
    inter = extra / s
    i = np.arange(d // 2)
    if not np.allclose(inv[i <= low], extra[i <= low], rtol=1e-15, atol=0):
        failures.append("R1-0528-Qwen3 YaRN: inv_freq differs from base^(-2i/d) at or below low")
    if not np.allclose(inv[i >= high], inter[i >= high], rtol=1e-15, atol=0):
        failures.append("R1-0528-Qwen3 YaRN: inv_freq differs from base^(-2i/d) / s from high on")
    mid = (i > low) & (i < high)
    if not (np.all(inv[mid] < extra[mid]) and np.all(inv[mid] > inter[mid])):
        failures.append("R1-0528-Qwen3 YaRN: inv_freq is not strictly blended inside (low, high)")
    want_mid = inter[30] * (30 - low) / (high - low) + extra[30] * (high - 30) / (high - low)
    if abs(inv[30] - want_mid) > 1e-15 * extra[30]:
        failures.append(f"R1-0528-Qwen3 YaRN: pair 30 has {inv[30]!r}, by hand {want_mid!r}")
    if not np.all(np.diff(inv) < 0):
        failures.append("R1-0528-Qwen3 YaRN: inv_freq does not fall monotonically")
    # The reference's cos/sin against ggml's rope_yarn on the same keys (a dict serves as the file).
    keys = {"qwen3.rope.freq_base": base, "qwen3.rope.scaling.type": "yarn",
            "qwen3.rope.scaling.factor": s, "qwen3.rope.scaling.original_context_length": L,
            "qwen3.rope.scaling.yarn_attn_factor": a}
    rope = GgmlRope(keys, "qwen3", d)
    pos = [0, 1, 7, 1000, 32767, 32768, 131071]
    cos, sin = llama_reference.rope_cos_sin(torch.tensor(pos), cfg)
    worst = 0.0
    for row, p in enumerate(pos):
        c, sn = rope.cos_sin(p)
        want = np.concatenate([c, c]), np.concatenate([sn, sn])
        worst = max(worst, float(np.abs(cos[row].numpy() - want[0]).max()),
                    float(np.abs(sin[row].numpy() - want[1]).max()))
    print(f"  reference cos/sin against ggml's rope_yarn at positions up to 131071: {worst:.2e}")
    if worst > 1e-9:  # angles up to 1.3e5 rad, computed two ways in float64
        failures.append(f"R1-0528-Qwen3 YaRN: reference cos/sin differ from ggml's by {worst:.3g}")


def check_refusals(failures: list[str]) -> None:
    """Files the reference must refuse with a clear error."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bad.gguf")
        cases = [
            ("a q/k/v bias", dict(biases=True), "no q/k/v biases"),
            ("a sliding window", dict(window=8), "sliding window"),
            ("a YaRN factor below 1", dict(yarn=0.5), "factor >= 1"),
            # base 100, 1e8 positions: corr(32) = 24 ln(1e8 / 64 pi) / (2 ln 100) = 34 > d - 1
            ("an empty YaRN correction range", dict(yarn=4.0, yarn_orig=10 ** 8, rope_base=100.0),
             "correction range is empty"),
            # 4 positions: corr(1) = 48 ln(4 / 2 pi) / (2 ln 1e4) = -1.18, high = -1 < low = 0
            ("a YaRN range below zero", dict(yarn=4.0, yarn_orig=4, n_head=2, head_dim=48),
             "correction range is empty"),
        ]
        for what, over, needle in cases:
            write_tiny_qwen3(path, "f32", 1, **over)
            try:
                ref.load_model(path)
                failures.append(f"{what}: the reference loaded the file")
            except GGUFError as e:
                if needle not in str(e):
                    failures.append(f"{what}: refused with {e}, expected '{needle}'")
        # YaRN without its original context length
        write_tiny_qwen3(path, "f32", 1, yarn=4.0,
                         drop_keys=(A + "rope.scaling.original_context_length",))
        try:
            ref.load_model(path)
            failures.append("YaRN without original_context_length: the reference loaded the file")
        except GGUFError as e:
            if "original_context_length" not in str(e):
                failures.append(f"YaRN without original_context_length: refused with {e}")


def check_hf_config(failures: list[str]) -> None:
    """gguf_to_hf.py on a qwen3 YaRN file: Qwen3ForCausalLM's config (head_dim, no bias, no
    window, the rope_scaling with vLLM's attn_factor and the beta keys) and the q/k norm names,
    each [head_dim], with no biases among the tensors."""
    import gguf_to_hf
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "q3.gguf")
        write_tiny_qwen3(path, "f32", 1, yarn=4.0, attn_factor=R1_ATTN_FACTOR, beta_fast=16.0,
                         beta_slow=2.0)
        g = gr.GGUFFile(path)
        c = gguf_to_hf.config_json(g)
        tensors = gguf_to_hf.hf_tensors(g, c)
    want = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 24,
            "attention_bias": False, "use_sliding_window": False,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 1024, "beta_fast": 16.0,
                             "beta_slow": 2.0, "attn_factor": float(np.float32(R1_ATTN_FACTOR))}}
    for key, value in want.items():
        if c.get(key) != value:
            failures.append(f"gguf_to_hf qwen3 config: {key} is {c.get(key)!r}, expected {value!r}")
    for layer in range(2):
        for name in ("q_norm", "k_norm"):
            full = f"model.layers.{layer}.self_attn.{name}.weight"
            if full not in tensors or tensors[full][1] != [24]:
                failures.append(f"gguf_to_hf qwen3: {full} missing or not [24]")
    if any(k.endswith(".bias") for k in tensors):
        failures.append("gguf_to_hf qwen3: a bias among the tensors")


def main() -> int:
    failures: list[str] = []
    check_r1_yarn(failures)
    check_refusals(failures)
    check_hf_config(failures)
    for tag, path, over, tokens in tiny_models(CASES, write_tiny_qwen3, 13, 19):
        m, got = reference_logits(ref, path, tokens)
        check_close(failures, tag, got, incremental_forward(path, tokens),
                    "batched reference and incremental forward")
        if m.tied != over.get("tied", False):
            failures.append(f"{tag}: tied is {m.tied}")
        if m.cfg.head_dim != over.get("head_dim", 24):
            failures.append(f"{tag}: head_dim is {m.cfg.head_dim}")
        yarn_matters(failures, tag, ref, m, tokens, got)
    return report(failures, "qwen3 reference self-test")


if __name__ == "__main__":
    sys.exit(main())
