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

The shared pieces come from llama_reference.py (rope cos/sin, the config fields) and
reference_common.py (the decoder, RMSNorm, rotate_half, the SwiGLU MLP, loading, the command
line), so a fix there applies to both.

CLI: qwen2_reference.py --model F.gguf --tokens "1 2 3" [--all-positions]
prints one JSON line per position, {"pos": i, "logits": [...]} (only the last by default).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    ArchKeys, GGUFFile, TensorLoader, Weights, decoder_forward, logits_arg_parser,
    print_logits, swiglu)
from llama_reference import LlamaConfig, apply_rope, config_fields, rope_cos_sin  # noqa: E402

import torch  # noqa: E402

ARCH = "qwen2"


@dataclass
class Qwen2Config(LlamaConfig):
    sliding_window: int = 0      # W > 0: windowed layers see the last W positions (self included)
    max_window_layers: int = 0   # layers i >= this use the window

    def layer_window(self, i: int) -> int:
        return self.sliding_window if self.sliding_window > 0 and i >= self.max_window_layers else 0


def read_config(g: GGUFFile) -> Qwen2Config:
    k = ArchKeys(g, ARCH)
    window = int(k.get("attention.sliding_window", 0))
    if not k.get("attention.use_sliding_window", True):
        window = 0
    return Qwen2Config(**config_fields(k), sliding_window=window,
                       max_window_layers=int(k.get("attention.max_window_layers", 0)))


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


def load_model(path: str) -> Weights:
    g = GGUFFile(path)
    cfg = read_config(g)
    t = TensorLoader(g)
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
    out_norm, lm_head, tied = t.head(tok, e, V)
    t.done()
    return Weights(cfg, tok, layers, out_norm, lm_head, tied)


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


def forward(m: Weights, tokens: list[int], trace: dict | None = None) -> torch.Tensor:
    """Logits [T, vocab] in float64 for the token ids at positions 0..T-1 (`trace`: see
    reference_common.decoder_forward)."""
    cfg = m.cfg
    cos, sin = rope_cos_sin(torch.arange(len(tokens)), cfg)
    return decoder_forward(
        m, tokens, lambda x, lw, i: attention(x, lw, cfg, cfg.layer_window(i), cos, sin),
        lambda x, lw, i: swiglu(x, lw.w_gate, lw.w_up, lw.w_down), trace)


def main() -> int:
    ap = logits_arg_parser(ARCH)
    return print_logits(ap, ap.parse_args(), load_model, forward)


if __name__ == "__main__":
    sys.exit(main())
