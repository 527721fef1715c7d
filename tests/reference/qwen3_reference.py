"""Reference forward pass of a qwen3-architecture GGUF model, in float64 PyTorch.

Independent of duet's C++ code: the file is read by gguf_reader.py, and the math follows Hugging
Face transformers' `Qwen3ForCausalLM` (Qwen3-0.6B ... 32B, DeepSeek-R1-0528-Qwen3-8B), which is
`LlamaForCausalLM` with these differences:

- The head size head_dim is its own hyper-parameter and may differ from n_embd / n_head
  (Qwen3-0.6B: hidden 1024, 16 heads of 128): q_proj has n_head * head_dim rows, k_proj and
  v_proj n_head_kv * head_dim, o_proj maps n_head * head_dim back to n_embd. No q/k/v biases.
- Per-head RMSNorm of q and k before rope (Qwen3Attention's q_norm and k_norm): with
  q = x @ Wq^T viewed [T, n_head, head_dim],
      q[t, h, :] <- q[t, h, :] * rsqrt(mean_j q[t, h, j]^2 + eps) * q_norm_weight   (head_dim values)
  and k likewise with k_norm_weight over [T, n_head_kv, head_dim]; eps is the model's RMS eps, the
  weights are shared by every head of a layer. v is not normalized. Then rope, on the normed q/k.
- llama.cpp's converter writes qwen3's q/k rows unpermuted (the HF layout), so rope is HF's
  rotate_half on the rows as stored (llama.cpp's NEOX rope), as for qwen2.
- Attention: grouped-query (kv head j serves query heads j*n_rep .. (j+1)*n_rep - 1), causal
  softmax of q.k / sqrt(head_dim), then o_proj; the SwiGLU MLP and the pre-norm decoder as llama.
  No sliding window (Qwen3's use_sliding_window is false in every released config; a GGUF that
  asks for one is refused).
- Rope scaling none, linear or YaRN (DeepSeek-R1-0528-Qwen3-8B: YaRN x4 over 32768 positions with
  yarn_attn_factor 1 / (0.1 ln 4 + 1), so its magnitude factor is 1): llama_reference.py's
  config_fields and rope_cos_sin, whose docstring states the formulas.

GGUF (llama.cpp's layout): general.architecture "qwen3"; `qwen3.embedding_length`,
`block_count`, `feed_forward_length`, `attention.head_count`, `attention.head_count_kv`,
`attention.layer_norm_rms_epsilon`, `rope.freq_base`, `rope.dimension_count` (= head_dim),
`context_length`, optional `vocab_size`, `attention.key_length` = `attention.value_length` =
head_dim (absent: n_embd / n_head), `rope.scaling.*`. Tensors per layer N: blk.N.attn_norm,
attn_q [n_head*head_dim, n_embd], attn_k and attn_v [n_head_kv*head_dim, n_embd], attn_output
[n_embd, n_head*head_dim], attn_q_norm and attn_k_norm [head_dim] (f32), ffn_norm, ffn_gate,
ffn_up, ffn_down; token_embd, output_norm, output (absent: tied to token_embd). Shapes here are
numpy's (GGUF dims reversed).

The shared pieces come from llama_reference.py (rope cos/sin, the config fields) and
reference_common.py (the decoder, RMSNorm, rotate_half, the SwiGLU MLP, loading, the command
line), so a fix there applies to llama, qwen2 and qwen3 alike.

CLI: qwen3_reference.py --model F.gguf --tokens "1 2 3" [--all-positions]
prints one JSON line per position, {"pos": i, "logits": [...]} (only the last by default).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    ArchKeys, GGUFError, GGUFFile, TensorLoader, Weights, decoder_forward, logits_arg_parser,
    print_logits, rms_norm, swiglu)
from llama_reference import LlamaConfig, apply_rope, config_fields, rope_cos_sin  # noqa: E402

import torch  # noqa: E402

ARCH = "qwen3"


def read_config(g: GGUFFile) -> LlamaConfig:
    k = ArchKeys(g, ARCH)
    if int(k.get("attention.sliding_window", 0) or 0) > 0 and \
            k.get("attention.use_sliding_window", True):
        raise GGUFError(f"{g.path}: {ARCH}.attention.sliding_window is set; Qwen3 with a sliding "
                        f"window is not supported by this reference")
    return LlamaConfig(**config_fields(k))


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor      # [n_head*head_dim, n_embd], HF layout as stored
    wk: torch.Tensor      # [n_head_kv*head_dim, n_embd]
    wv: torch.Tensor
    q_norm: torch.Tensor  # [head_dim]
    k_norm: torch.Tensor  # [head_dim]
    wo: torch.Tensor      # [n_embd, n_head*head_dim]
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
            wq=t(p + "attn_q.weight", (q, e)),
            wk=t(p + "attn_k.weight", (kv, e)),
            wv=t(p + "attn_v.weight", (kv, e)),
            q_norm=t(p + "attn_q_norm.weight", (hd,)),
            k_norm=t(p + "attn_k_norm.weight", (hd,)),
            wo=t(p + "attn_output.weight", (e, q)),
            ffn_norm=t(p + "ffn_norm.weight", (e,)),
            w_gate=t(p + "ffn_gate.weight", (cfg.n_ff, e)),
            w_up=t(p + "ffn_up.weight", (cfg.n_ff, e)),
            w_down=t(p + "ffn_down.weight", (e, cfg.n_ff)),
        ))
        for name in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):
            if p + name in g.tensors:  # Qwen3 has attention_bias false; a bias would be ignored
                t.problems.append(f"tensor '{p + name}' is present; qwen3 has no q/k/v biases")
    out_norm, lm_head, tied = t.head(tok, e, V)
    t.done()
    return Weights(cfg, tok, layers, out_norm, lm_head, tied)


def attention(x: torch.Tensor, lw: LayerWeights, cfg: LlamaConfig,
              cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    T = x.shape[0]
    hd = cfg.head_dim
    # q_norm / k_norm act on the last dimension of [T, heads, head_dim]: each head on its own.
    q = rms_norm((x @ lw.wq.T).view(T, cfg.n_head, hd), lw.q_norm, cfg.rms_eps).transpose(0, 1)
    k = rms_norm((x @ lw.wk.T).view(T, cfg.n_head_kv, hd), lw.k_norm, cfg.rms_eps).transpose(0, 1)
    v = (x @ lw.wv.T).view(T, cfg.n_head_kv, hd).transpose(0, 1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [H, T, hd], [Hkv, T, hd]
    n_rep = cfg.n_head // cfg.n_head_kv
    k = k.repeat_interleave(n_rep, dim=0)  # HF repeat_kv
    v = v.repeat_interleave(n_rep, dim=0)
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return (p @ v).transpose(0, 1).reshape(T, cfg.n_head * hd) @ lw.wo.T


def forward(m: Weights, tokens: list[int], trace: dict | None = None) -> torch.Tensor:
    """Logits [T, vocab] in float64 for the token ids at positions 0..T-1 (`trace`: see
    reference_common.decoder_forward)."""
    cfg = m.cfg
    cos, sin = rope_cos_sin(torch.arange(len(tokens)), cfg)
    return decoder_forward(
        m, tokens, lambda x, lw, i: attention(x, lw, cfg, cos, sin),
        lambda x, lw, i: swiglu(x, lw.w_gate, lw.w_up, lw.w_down), trace)


def main() -> int:
    ap = logits_arg_parser(ARCH)
    return print_logits(ap, ap.parse_args(), load_model, forward)


if __name__ == "__main__":
    sys.exit(main())
