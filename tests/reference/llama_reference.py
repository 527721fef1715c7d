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
  cat(-x2, x1), x' = x * cos + rotate_half(x) * sin, with angle(pos, i) = pos' * inv_freq[i] for
  i < d/2, repeated for both halves, inv_freq[i] = base^(-2i/d); linear rope scaling uses
  pos' = pos / factor. YaRN (see `yarn_inv_freq`) keeps pos' = pos, blends each frequency between
  base^(-2i/d) and base^(-2i/d) / factor, and multiplies cos and sin by a magnitude factor.
- Grouped-query attention: kv head j serves query heads j*n_rep .. (j+1)*n_rep - 1 (HF repeat_kv),
  causal softmax of q.k / sqrt(head_dim).
- lm_head is `output.weight`, or the token embedding when that tensor is absent (tied).

The one GGUF-specific step: llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)
stores attn_q and attn_k rows permuted so that rope can rotate adjacent pairs (2i, 2i+1) instead
of HF's (i, i + d/2). Within each head, the HF row r = j*(d/2) + i (half j, index i) is stored at
GGUF row 2*i + j. `unpermute_rows` undoes that (head count n_head for q, n_head_kv for k) so the
HF formulas apply unchanged; `self_check()` proves it inverts the converter's permutation and that
adjacent-pair rope on the GGUF layout equals HF rope on the HF layout.

Rope scaling, read by `config_fields` and applied by `rope_cos_sin` for llama, qwen2 and qwen3
alike (`<arch>.rope.scaling.type`):
- absent or "none": inv_freq[i] = base^(-2i/d), cos and sin as they are.
- "linear" with `rope.scaling.factor` s (or the older `rope.scale_linear`): positions / s.
- "yarn" with `rope.scaling.factor` s >= 1, `rope.scaling.original_context_length` L and the
  optional `rope.scaling.yarn_beta_fast` (32), `yarn_beta_slow` (1) and `yarn_attn_factor` a (1):
  Hugging Face's _compute_yarn_parameters, d = rope dims, b = base:
      inv_extra[i] = b^(-2i/d),  inv_inter[i] = inv_extra[i] / s
      corr(beta) = d * ln(L / (2 pi beta)) / (2 ln b)   (the pair index that turns beta times
                                                          over L positions)
      low = max(floor(corr(beta_fast)), 0),  high = min(ceil(corr(beta_slow)), d - 1)
      ramp[i] = clamp((i - low) / (high - low, or 0.001 when equal), 0, 1)
      inv_freq[i] = inv_inter[i] * ramp[i] + inv_extra[i] * (1 - ramp[i])
  so the fast pairs below `low` keep their frequency, the slow ones above `high` are
  interpolated by s. cos and sin are multiplied by mscale = a * (0.1 ln s + 1) (a alone when
  s == 1): ggml's rope_yarn, where attn_factor multiplies YaRN's own magnitude factor (vLLM's
  `attn_factor` too; Hugging Face's `attention_factor` would replace it instead). The scores q.k
  thus grow by mscale^2. A correction range with low > high (corr(beta_fast) beyond d - 1, or
  corr(beta_slow) <= -1, which needs L < 2 pi beta_slow) is refused: there HF's formula and
  ggml's ramp (which divides by max(0.001, high - low)) disagree.

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
    rope_scale: float  # linear scaling factor; 1.0 when there is none (also with YaRN)
    vocab_size: int
    # YaRN (rope.scaling.type "yarn"); yarn_factor 0.0: no YaRN
    yarn_factor: float = 0.0
    yarn_original_context: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_attn_factor: float = 1.0


def read_config(g: GGUFFile) -> LlamaConfig:
    return LlamaConfig(**config_fields(ArchKeys(g, "llama")))


def config_fields(k: ArchKeys) -> dict:
    """LlamaConfig's fields from the `<arch>.` keys, which llama.cpp writes alike for llama, qwen2
    and qwen3."""
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
    rope_base = float(k.get("rope.freq_base", 10000.0))
    scaling = k.get("rope.scaling.type")
    rope_scale = 1.0
    yarn: dict = {}
    if scaling == "yarn":
        factor = float(k.key("rope.scaling.factor"))
        if not factor >= 1.0:
            raise GGUFError(f"{g.path}: {k.arch}.rope.scaling.factor is {factor:g}; YaRN needs a "
                            f"factor >= 1")
        yarn = dict(yarn_factor=factor,
                    yarn_original_context=int(k.key("rope.scaling.original_context_length")),
                    yarn_beta_fast=float(k.get("rope.scaling.yarn_beta_fast", 32.0)),
                    yarn_beta_slow=float(k.get("rope.scaling.yarn_beta_slow", 1.0)),
                    yarn_attn_factor=float(k.get("rope.scaling.yarn_attn_factor", 1.0)))
        low, high = yarn_correction_range(rope_dim, rope_base, yarn["yarn_original_context"],
                                          yarn["yarn_beta_fast"], yarn["yarn_beta_slow"])
        if low > high and factor > 1:
            raise GGUFError(f"{g.path}: YaRN's correction range is empty (low {low} > high "
                            f"{high} for {k.arch}.rope.scaling.original_context_length "
                            f"{yarn['yarn_original_context']}, base {rope_base:g}, {rope_dim} rope "
                            f"dims); Hugging Face and ggml disagree there, not supported")
    elif scaling is not None and scaling != "none":
        if scaling != "linear":
            raise GGUFError(f"{g.path}: {k.arch}.rope.scaling.type is {scaling!r}; only 'linear' "
                            f"and 'yarn' are supported")
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
        rope_base=rope_base,
        rope_dim=rope_dim,
        rope_scale=rope_scale,
        vocab_size=k.vocab_size(),
        **yarn,
    )


def describe_rope(cfg: LlamaConfig) -> str:
    """The rope of a config in words, for compare_logits.py."""
    text = f"rope base {cfg.rope_base:g}"
    if cfg.yarn_factor:
        low, high = yarn_correction_range(cfg.rope_dim, cfg.rope_base, cfg.yarn_original_context,
                                          cfg.yarn_beta_fast, cfg.yarn_beta_slow)
        return (f"{text} YaRN x{cfg.yarn_factor:g} over {cfg.yarn_original_context} (beta "
                f"{cfg.yarn_beta_fast:g}/{cfg.yarn_beta_slow:g}, pairs {low}..{high} blended, "
                f"mscale {yarn_mscale(cfg):.6g})")
    return f"{text} scale {cfg.rope_scale:g}"


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

def yarn_correction_range(d: int, base: float, original_context: int, beta_fast: float,
                          beta_slow: float) -> tuple[int, int]:
    """(low, high): the pair indices where YaRN's ramp starts and ends. corr(beta) solves
    L * base^(-2i/d) = 2 pi beta for i: pair i turns beta times over the original L positions."""
    def corr(beta: float) -> float:
        return d * math.log(original_context / (beta * 2 * math.pi)) / (2 * math.log(base))
    return max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), d - 1)


def yarn_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """YaRN's inv_freq [d/2] (HF _compute_yarn_parameters): inv_inter * ramp + inv_extra *
    (1 - ramp), ramp rising linearly from 0 at pair `low` to 1 at pair `high`."""
    d = cfg.rope_dim
    inv_extra = 1.0 / (cfg.rope_base ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
    inv_inter = inv_extra / cfg.yarn_factor
    low, high = yarn_correction_range(d, cfg.rope_base, cfg.yarn_original_context,
                                      cfg.yarn_beta_fast, cfg.yarn_beta_slow)
    span = high - low if high != low else 0.001
    ramp = ((torch.arange(d // 2, dtype=DTYPE) - low) / span).clamp(0, 1)
    return inv_inter * ramp + inv_extra * (1 - ramp)


def yarn_mscale(cfg: LlamaConfig) -> float:
    """What YaRN multiplies cos and sin by: attn_factor * (0.1 ln s + 1), attn_factor alone when
    s == 1; 1 without YaRN."""
    if not cfg.yarn_factor:
        return 1.0
    own = 0.1 * math.log(cfg.yarn_factor) + 1.0 if cfg.yarn_factor > 1 else 1.0
    return cfg.yarn_attn_factor * own


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    if cfg.yarn_factor:
        return yarn_inv_freq(cfg)
    d = cfg.rope_dim
    return 1.0 / (cfg.rope_base ** (torch.arange(0, d, 2, dtype=DTYPE) / d))


def rope_cos_sin(positions: torch.Tensor, cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, d] of HF rope at `positions`, with the config's linear or YaRN scaling."""
    t = positions.to(DTYPE) / cfg.rope_scale
    freqs = torch.outer(t, rope_inv_freq(cfg))  # [T, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, d]
    m = yarn_mscale(cfg)
    return emb.cos() * m, emb.sin() * m


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
    pair (x[2i], x[2i+1]) is rotated by angle pos' * inv_freq[i] (base^(-2i/d), or YaRN's blend,
    whose magnitude factor scales the result). x: [heads, T, d]. Here for the layout; the YaRN
    frequencies themselves are checked against ggml's formulas by test_llama_reference.py."""
    theta = (positions.to(DTYPE) / cfg.rope_scale)[:, None] * rope_inv_freq(cfg)
    m = yarn_mscale(cfg)
    c, s = theta.cos() * m, theta.sin() * m
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
    # HF-rope of the HF-layout vector. Also with linear scaling, YaRN and GQA-sized k.
    for n_head, hd, scale, base, yarn in [(4, 32, 1.0, 10000.0, 0.0), (2, 16, 4.0, 500000.0, 0.0),
                                          (2, 64, 1.0, 10000.0, 8.0)]:
        cfg = LlamaConfig(n_embd=n_head * hd, n_layer=0, n_ff=0, n_head=n_head,
                          n_head_kv=n_head, head_dim=hd, rms_eps=1e-5, rope_base=base,
                          rope_dim=hd, rope_scale=scale, vocab_size=0, yarn_factor=yarn,
                          yarn_original_context=512, yarn_attn_factor=0.9)
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
                            f"scale={scale}, yarn={yarn})")
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
