"""Reference forward pass of a llama-architecture GGUF model, in float64 PyTorch.

Independent of duet's C++ code: the file is read by gguf_reader.py (written from the GGUF spec),
and the math follows Hugging Face transformers' `LlamaForCausalLM`:

    h = embed_tokens[ids]
    for each layer:
        h = h + o_proj(attention(rope(q_proj(rmsnorm(h))), rope(k_proj(...)), v_proj(...)))
        h = h + down_proj(silu(gate_proj(x)) * up_proj(x)),  x = rmsnorm(h)
    logits = lm_head(rmsnorm(h))

- RMSNorm: x * rsqrt(mean(x^2) + eps) * w.
- RoPE on the Hugging Face layout: each head's vector is split in halves, rotate_half(x) =
  cat(-x2, x1), x' = x * cos + rotate_half(x) * sin, with angle(pos, i) = pos' * base^(-2i/d) for
  i < d/2, repeated for both halves; linear rope scaling uses pos' = pos / factor.
- Grouped-query attention: kv head j serves query heads j*n_rep .. (j+1)*n_rep - 1 (HF repeat_kv),
  causal softmax of q.k / sqrt(head_dim).
- lm_head is `output.weight`, or the token embedding when that tensor is absent (tied).

The one GGUF-specific step: llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)
stores attn_q and attn_k rows permuted so that rope can rotate adjacent pairs (2i, 2i+1) instead
of HF's (i, i + d/2). Within each head, the HF row r = j*(d/2) + i (half j, index i) is stored at
GGUF row 2*i + j. `unpermute_rows` undoes that (head count n_head for q, n_head_kv for k) so the
HF formulas apply unchanged; `self_check()` proves it inverts the converter's permutation and that
adjacent-pair rope on the GGUF layout equals HF rope on the HF layout.

CLI: llama_reference.py --model F.gguf --tokens "1 2 3" [--all-positions]
prints one JSON line per position, {"pos": i, "logits": [...]} (only the last by default).
     llama_reference.py --self-check    runs the permutation/rope self-check (exit 0 or 1).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    DTYPE, ArchKeys, GGUFError, GGUFFile, TensorLoader, Weights, decoder_forward,
    logits_arg_parser, print_logits, report, rotate_half, swiglu)

import numpy as np  # noqa: E402
import torch  # noqa: E402


@dataclass
class LlamaConfig:
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_scale: float  # linear scaling factor; 1.0 when there is none
    vocab_size: int


def read_config(g: GGUFFile) -> LlamaConfig:
    return LlamaConfig(**config_fields(ArchKeys(g, "llama")))


def config_fields(k: ArchKeys) -> dict:
    """LlamaConfig's fields from the `<arch>.` keys, which llama.cpp writes alike for llama and
    qwen2."""
    g = k.g
    n_embd = int(k.key("embedding_length"))
    n_head = int(k.key("attention.head_count"))
    n_head_kv = int(k.get("attention.head_count_kv", n_head))
    head_dim = int(k.get("attention.key_length", n_embd // n_head))
    if k.get("attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{g.path}: value_length {k.get('attention.value_length')} differs "
                        f"from key_length {head_dim}; not supported")
    rope_dim = int(k.get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        # HF LlamaForCausalLM rotates the whole head; partial rope is a different model.
        raise GGUFError(f"{g.path}: {k.arch}.rope.dimension_count is {rope_dim}, head_dim is "
                        f"{head_dim}; partial rope is not supported by this reference")
    scaling = k.get("rope.scaling.type")
    rope_scale = 1.0
    if scaling is not None and scaling != "none":
        if scaling != "linear":
            raise GGUFError(f"{g.path}: {k.arch}.rope.scaling.type is {scaling!r}; only 'linear' "
                            f"is supported")
        rope_scale = float(k.key("rope.scaling.factor"))
    elif scaling is None and k.has("rope.scale_linear"):
        rope_scale = float(k.get("rope.scale_linear"))  # older key for the same thing
    return dict(
        n_embd=n_embd,
        n_layer=int(k.key("block_count")),
        n_ff=int(k.key("feed_forward_length")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        rms_eps=float(k.key("attention.layer_norm_rms_epsilon")),
        rope_base=float(k.get("rope.freq_base", 10000.0)),
        rope_dim=rope_dim,
        rope_scale=rope_scale,
        vocab_size=k.vocab_size(),
    )


# -- the GGUF q/k row permutation ------------------------------------------------------------

def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF layout -> GGUF layout, as llama.cpp's converter does (LlamaModel.permute): per head,
    rows viewed as (2, d/2) are transposed to (d/2, 2). Here only to check the inverse."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF layout -> HF layout: per head, rows viewed as (d/2, 2) are transposed to (2, d/2),
    so GGUF row 2*i + j becomes HF row j*(d/2) + i."""
    rows = w.shape[0]
    if rows % (2 * n_head) != 0:
        raise ValueError(f"cannot unpermute {rows} rows over {n_head} heads of even size")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


# -- weights -----------------------------------------------------------------------------------

@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # [n_head*head_dim, n_embd], HF layout
    wk: torch.Tensor  # [n_head_kv*head_dim, n_embd], HF layout
    wv: torch.Tensor
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
    tok = t("token_embd.weight", (V, e))
    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        wq = t(p + "attn_q.weight", (cfg.n_head * hd, e))
        wk = t(p + "attn_k.weight", (cfg.n_head_kv * hd, e))
        layers.append(LayerWeights(
            attn_norm=t(p + "attn_norm.weight", (e,)),
            wq=None if wq is None else torch.from_numpy(unpermute_rows(wq.numpy(), cfg.n_head)),
            wk=None if wk is None else torch.from_numpy(unpermute_rows(wk.numpy(),
                                                                       cfg.n_head_kv)),
            wv=t(p + "attn_v.weight", (cfg.n_head_kv * hd, e)),
            wo=t(p + "attn_output.weight", (e, cfg.n_head * hd)),
            ffn_norm=t(p + "ffn_norm.weight", (e,)),
            w_gate=t(p + "ffn_gate.weight", (cfg.n_ff, e)),
            w_up=t(p + "ffn_up.weight", (cfg.n_ff, e)),
            w_down=t(p + "ffn_down.weight", (e, cfg.n_ff)),
        ))
    out_norm, lm_head, tied = t.head(tok, e, V)
    t.done()
    return Weights(cfg, tok, layers, out_norm, lm_head, tied)


# -- the forward pass (HF LlamaForCausalLM semantics) ------------------------------------------

def rope_cos_sin(positions: torch.Tensor, cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    d = cfg.rope_dim
    inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
    t = positions.to(DTYPE) / cfg.rope_scale
    freqs = torch.outer(t, inv_freq)  # [T, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, d]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, T, d]; cos, sin: [T, d]."""
    return x * cos + rotate_half(x) * sin


def attention(x: torch.Tensor, lw: LayerWeights, cfg: LlamaConfig,
              cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    T = x.shape[0]
    hd = cfg.head_dim
    q = (x @ lw.wq.T).view(T, cfg.n_head, hd).transpose(0, 1)  # [H, T, hd]
    k = (x @ lw.wk.T).view(T, cfg.n_head_kv, hd).transpose(0, 1)  # [Hkv, T, hd]
    v = (x @ lw.wv.T).view(T, cfg.n_head_kv, hd).transpose(0, 1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    n_rep = cfg.n_head // cfg.n_head_kv
    k = k.repeat_interleave(n_rep, dim=0)  # HF repeat_kv: kv head j -> query heads j*n_rep..
    v = v.repeat_interleave(n_rep, dim=0)
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)  # [H, T, T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = (p @ v).transpose(0, 1).reshape(T, cfg.n_head * hd)
    return out @ lw.wo.T


def forward(m: Weights, tokens: list[int], trace: dict | None = None) -> torch.Tensor:
    """Logits [T, vocab] in float64 for the token ids at positions 0..T-1. With `trace` (a dict),
    every intermediate is stored under a llama.cpp-style name (e.g. 'attn_out-0') for debugging."""
    cos, sin = rope_cos_sin(torch.arange(len(tokens)), m.cfg)
    return decoder_forward(m, tokens, lambda x, lw, i: attention(x, lw, m.cfg, cos, sin),
                           lambda x, lw, i: swiglu(x, lw.w_gate, lw.w_up, lw.w_down), trace)


# -- self-check of the permutation and the two rope conventions --------------------------------

def rope_adjacent_pairs(x: torch.Tensor, positions: torch.Tensor, cfg: LlamaConfig) -> torch.Tensor:
    """llama.cpp's 'normal' rope on the GGUF layout, written independently of the HF path:
    pair (x[2i], x[2i+1]) is rotated by angle pos' * base^(-2i/d). x: [heads, T, d]."""
    d = cfg.rope_dim
    i = torch.arange(d // 2, dtype=DTYPE)
    theta = (positions.to(DTYPE) / cfg.rope_scale)[:, None] * cfg.rope_base ** (-2 * i / d)
    c, s = theta.cos(), theta.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def self_check() -> list[str]:
    failures = []
    rng = np.random.default_rng(0)
    for n_head, hd, cols in [(4, 32, 8), (2, 8, 3), (8, 64, 1), (1, 2, 5)]:
        w = rng.standard_normal((n_head * hd, cols))
        if not np.array_equal(unpermute_rows(permute_rows(w, n_head), n_head), w):
            failures.append(f"unpermute(permute(w)) != w for n_head={n_head} head_dim={hd}")
        if not np.array_equal(permute_rows(unpermute_rows(w, n_head), n_head), w):
            failures.append(f"permute(unpermute(w)) != w for n_head={n_head} head_dim={hd}")
        # the explicit index map: GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i
        idx = np.arange(n_head * hd, dtype=np.float64)[:, None]
        g = permute_rows(idx, n_head)[:, 0]
        for h in range(n_head):
            for i in range(hd // 2):
                for j in range(2):
                    if g[h * hd + 2 * i + j] != h * hd + j * hd // 2 + i:
                        failures.append(f"permute index map wrong at head {h} i {i} j {j}")
    # Rope equivalence: rotating a GGUF-layout vector by adjacent pairs equals permuting the
    # HF-rope of the HF-layout vector. Also with linear scaling and GQA-sized k.
    for n_head, hd, scale, base in [(4, 32, 1.0, 10000.0), (2, 16, 4.0, 500000.0)]:
        cfg = LlamaConfig(n_embd=n_head * hd, n_layer=0, n_ff=0, n_head=n_head,
                          n_head_kv=n_head, head_dim=hd, rms_eps=1e-5, rope_base=base,
                          rope_dim=hd, rope_scale=scale, vocab_size=0)
        T = 37
        x_hf = torch.from_numpy(rng.standard_normal((T, n_head * hd)))  # rows = q of each pos
        x_gguf = torch.from_numpy(permute_rows(x_hf.numpy().T, n_head).T.copy())
        pos = torch.arange(T) * 3 + 1
        cos, sin = rope_cos_sin(pos, cfg)
        hf = apply_rope(x_hf.view(T, n_head, hd).transpose(0, 1), cos, sin)
        ad = rope_adjacent_pairs(x_gguf.view(T, n_head, hd).transpose(0, 1), pos, cfg)
        ad_as_hf = unpermute_rows(ad.transpose(0, 1).reshape(T, -1).numpy().T, n_head).T
        err = np.abs(ad_as_hf - hf.transpose(0, 1).reshape(T, -1).numpy()).max()
        if err > 1e-12:
            failures.append(f"adjacent-pair rope on the GGUF layout differs from HF rope on the "
                            f"HF layout by {err:.3g} (n_head={n_head}, head_dim={hd}, "
                            f"scale={scale})")
        # q.k after rope depends only on the position difference (a property of both ropes)
        q = torch.from_numpy(rng.standard_normal(hd))
        k = torch.from_numpy(rng.standard_normal(hd))
        c1, s1 = rope_cos_sin(torch.tensor([5, 2]), cfg)
        c2, s2 = rope_cos_sin(torch.tensor([45, 42]), cfg)
        d1 = apply_rope(q, c1[0], s1[0]) @ apply_rope(k, c1[1], s1[1])
        d2 = apply_rope(q, c2[0], s2[0]) @ apply_rope(k, c2[1], s2[1])
        if abs(float(d1 - d2)) > 1e-9:
            failures.append(f"HF rope is not relative: {float(d1)} vs {float(d2)}")
    return failures


def main() -> int:
    ap = logits_arg_parser("llama", model_required=False, tokens_required=False)
    ap.add_argument("--self-check", action="store_true",
                    help="check the q/k un-permutation and rope conventions, then exit")
    args = ap.parse_args()
    if args.self_check:
        return report(self_check(), "self-check")
    if not args.model or args.tokens is None:
        ap.error("--model and --tokens are required")
    return print_logits(ap, args, load_model, forward)


if __name__ == "__main__":
    sys.exit(main())
