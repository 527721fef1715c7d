"""Reference forward pass of a qwen2-architecture GGUF model, in float64 PyTorch.

Independent of duet's C++ code: the file is read by gguf_reader.py, and the math follows Hugging
Face transformers' `Qwen2ForCausalLM`, which is `LlamaForCausalLM` with three differences:

- q_proj, k_proj and v_proj have biases (GGUF `blk.N.attn_{q,k,v}.bias`, f32); o_proj has none.
- llama.cpp's converter writes qwen2's q/k rows unpermuted (the HF layout), so rope is HF's
  rotate_half on the rows as stored (llama.cpp calls this NEOX rope): no un-permutation here,
  unlike llama_reference.py.
- Sliding-window attention: when `use_sliding_window` is set, layers i >= max_window_layers let a
  query at position q see only keys at positions k with q - W < k <= q (W = sliding_window; HF
  masking_utils' sliding_window_overlay AND the causal mask); the other layers see all k <= q.
  GGUF keys: `qwen2.attention.sliding_window` (W; absent or 0: no window),
  `qwen2.attention.use_sliding_window` (bool, default true when W is present) and
  `qwen2.attention.max_window_layers` (default 0: every layer uses the window).

The shared pieces (RMSNorm, rope cos/sin and rotate_half, SwiGLU MLP, the config fields) come from
llama_reference.py, so a fix there applies to both.

CLI: qwen2_reference.py --model F.gguf --tokens "1 2 3" [--all-positions]
prints one JSON line per position, {"pos": i, "logits": [...]} (only the last by default).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_reader import GGUFError, GGUFFile  # noqa: E402
from llama_reference import (  # noqa: E402
    LlamaConfig, apply_rope, mlp, rms_norm, rope_cos_sin)

ARCH = "qwen2"


@dataclass
class Qwen2Config(LlamaConfig):
    sliding_window: int = 0      # W > 0: windowed layers see the last W positions (self included)
    max_window_layers: int = 0   # layers i >= this use the window

    def layer_window(self, i: int) -> int:
        return self.sliding_window if self.sliding_window > 0 and i >= self.max_window_layers else 0


def read_config(g: GGUFFile) -> Qwen2Config:
    arch = g.require("general.architecture")
    if arch != ARCH:
        raise GGUFError(f"{g.path}: general.architecture is {arch!r}, this reference handles "
                        f"'{ARCH}' only")

    def key(name: str):
        return g.require(f"{ARCH}.{name}")

    def get(name: str, default=None):
        return g.get(f"{ARCH}.{name}", default)

    n_embd = int(key("embedding_length"))
    n_head = int(key("attention.head_count"))
    n_head_kv = int(get("attention.head_count_kv", n_head))
    head_dim = int(get("attention.key_length", n_embd // n_head))
    if get("attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{g.path}: value_length differs from key_length {head_dim}")
    rope_dim = int(get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise GGUFError(f"{g.path}: {ARCH}.rope.dimension_count is {rope_dim}, head_dim is "
                        f"{head_dim}; HF Qwen2 rotates the whole head")
    scaling = get("rope.scaling.type")
    rope_scale = 1.0
    if scaling is not None and scaling != "none":
        if scaling != "linear":
            raise GGUFError(f"{g.path}: {ARCH}.rope.scaling.type is {scaling!r}; only 'linear' "
                            f"is supported by this reference")
        rope_scale = float(key("rope.scaling.factor"))
    window = int(get("attention.sliding_window", 0))
    if not get("attention.use_sliding_window", True):
        window = 0
    if f"{ARCH}.vocab_size" in g.metadata:
        vocab = int(get("vocab_size"))
    elif "token_embd.weight" in g.tensors:
        vocab = g.tensors["token_embd.weight"].dims[1]
    else:
        vocab = len(g.get("tokenizer.ggml.tokens", []))
    return Qwen2Config(
        n_embd=n_embd,
        n_layer=int(key("block_count")),
        n_ff=int(key("feed_forward_length")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_base=float(get("rope.freq_base", 10000.0)),
        rope_dim=rope_dim,
        rope_scale=rope_scale,
        vocab_size=vocab,
        sliding_window=window,
        max_window_layers=int(get("attention.max_window_layers", 0)),
    )


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # [n_head*head_dim, n_embd], HF layout as stored
    bq: torch.Tensor  # [n_head*head_dim]
    wk: torch.Tensor
    bk: torch.Tensor
    wv: torch.Tensor
    bv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


@dataclass
class Qwen2Weights:
    cfg: Qwen2Config
    tok_embd: torch.Tensor
    layers: list[LayerWeights]
    out_norm: torch.Tensor
    lm_head: torch.Tensor
    tied: bool


def load_model(path: str) -> Qwen2Weights:
    g = GGUFFile(path)
    cfg = read_config(g)
    problems: list[str] = []

    def t(name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        if name not in g.tensors:
            problems.append(f"tensor '{name}' is missing")
            return None
        got = g.tensors[name].shape
        if got != shape:
            problems.append(f"tensor '{name}' has shape {list(got)}, expected {list(shape)}")
            return None
        return torch.from_numpy(g.tensor(name).astype(np.float64))

    e, hd, V = cfg.n_embd, cfg.head_dim, cfg.vocab_size
    q, kv = cfg.n_head * hd, cfg.n_head_kv * hd
    tok = t("token_embd.weight", (V, e))
    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=t(p + "attn_norm.weight", (e,)),
            wq=t(p + "attn_q.weight", (q, e)), bq=t(p + "attn_q.bias", (q,)),
            wk=t(p + "attn_k.weight", (kv, e)), bk=t(p + "attn_k.bias", (kv,)),
            wv=t(p + "attn_v.weight", (kv, e)), bv=t(p + "attn_v.bias", (kv,)),
            wo=t(p + "attn_output.weight", (e, q)),
            ffn_norm=t(p + "ffn_norm.weight", (e,)),
            w_gate=t(p + "ffn_gate.weight", (cfg.n_ff, e)),
            w_up=t(p + "ffn_up.weight", (cfg.n_ff, e)),
            w_down=t(p + "ffn_down.weight", (e, cfg.n_ff)),
        ))
    out_norm = t("output_norm.weight", (e,))
    tied = "output.weight" not in g.tensors
    lm_head = tok if tied else t("output.weight", (V, e))
    if problems:
        raise GGUFError(f"{path}: " + "; ".join(problems))
    return Qwen2Weights(cfg, tok, layers, out_norm, lm_head, tied)


def attention_mask(T: int, window: int) -> torch.Tensor:
    """True where attention is blocked: k > q (causal) or, with a window, k <= q - window."""
    qi = torch.arange(T)[:, None]
    ki = torch.arange(T)[None, :]
    blocked = ki > qi
    if window > 0:
        blocked |= ki <= qi - window
    return blocked


def attention(x: torch.Tensor, lw: LayerWeights, cfg: Qwen2Config, window: int,
              cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    T = x.shape[0]
    hd = cfg.head_dim
    q = (x @ lw.wq.T + lw.bq).view(T, cfg.n_head, hd).transpose(0, 1)  # [H, T, hd]
    k = (x @ lw.wk.T + lw.bk).view(T, cfg.n_head_kv, hd).transpose(0, 1)
    v = (x @ lw.wv.T + lw.bv).view(T, cfg.n_head_kv, hd).transpose(0, 1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    n_rep = cfg.n_head // cfg.n_head_kv
    k = k.repeat_interleave(n_rep, dim=0)  # HF repeat_kv
    v = v.repeat_interleave(n_rep, dim=0)
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)
    scores = scores.masked_fill(attention_mask(T, window), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return (p @ v).transpose(0, 1).reshape(T, cfg.n_head * hd) @ lw.wo.T


def forward(m: Qwen2Weights, tokens: list[int]) -> torch.Tensor:
    """Logits [T, vocab] in float64 for the token ids at positions 0..T-1."""
    cfg = m.cfg
    bad = [t for t in tokens if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ValueError(f"token ids {bad} are outside the vocabulary [0, {cfg.vocab_size})")
    ids = torch.tensor(tokens, dtype=torch.long)
    cos, sin = rope_cos_sin(torch.arange(len(tokens)), cfg)
    h = m.tok_embd[ids]
    for i, lw in enumerate(m.layers):
        h = h + attention(rms_norm(h, lw.attn_norm, cfg.rms_eps), lw, cfg, cfg.layer_window(i),
                          cos, sin)
        h = h + mlp(rms_norm(h, lw.ffn_norm, cfg.rms_eps), lw)
    return rms_norm(h, m.out_norm, cfg.rms_eps) @ m.lm_head.T


def main() -> int:
    ap = argparse.ArgumentParser(description="float64 reference logits of a qwen2 GGUF model")
    ap.add_argument("--model", required=True, help="qwen2 GGUF file")
    ap.add_argument("--tokens", required=True, help='token ids, e.g. "1 2 3"')
    ap.add_argument("--all-positions", action="store_true",
                    help="print every position, not only the last")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.replace(",", " ").split()]
    if not tokens:
        ap.error("--tokens is empty")
    m = load_model(args.model)
    with torch.no_grad():
        logits = forward(m, tokens)
    positions = range(len(tokens)) if args.all_positions else [len(tokens) - 1]
    for p in positions:
        print(json.dumps({"pos": p, "logits": logits[p].tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
