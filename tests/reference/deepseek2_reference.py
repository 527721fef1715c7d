"""Reference forward pass of a deepseek2-architecture GGUF model (DeepSeek-V2, V2-Lite, V3, R1),
and of deepseek32 (DeepSeek-V3.2: V3 with DeepSeek Sparse Attention), in float64 PyTorch.

Independent of duet's C++ code: the file is read by gguf_reader.py, and the math follows Hugging
Face's `modeling_deepseek.py` (DeepseekV2ForCausalLM of deepseek-ai/DeepSeek-V2(-Lite) and
DeepseekV3ForCausalLM of deepseek-ai/DeepSeek-V3 / R1, the trust_remote_code files):

    h = embed_tokens[ids]
    for each layer i:
        h = h + o_proj(MLA(rmsnorm(h)))
        x = rmsnorm(h)
        h = h + (mlp(x)                             if i < first_k_dense_replace
                 else sum_k w_k expert_k(x) + shared_experts(x))
    logits = lm_head(rmsnorm(h))

MLA, exactly as HF computes it (K and V decompressed per head, no weight absorption; duet's C++
absorbs W_UK into the query and W_UV into the output, so the two formulations check each other):
    q        = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)))      [T, H, nope + rope]
    q_nope, q_pe = split(q)
    ckv, k_pe    = split(kv_a_proj_with_mqa(x), [kv_lora_rank, rope])   k_pe: one head, shared
    q_pe, k_pe   = apply_rotary_pos_emb(q_pe, k_pe)
    k_nope, v    = split(kv_b_proj(kv_a_layernorm(ckv)).view(T, H, nope + v_head_dim))
    scores       = [q_nope, q_pe] . [k_nope, k_pe] * softmax_scale, causal, softmax
    out          = o_proj(scores @ v)
- apply_rotary_pos_emb: each rope vector is first reshuffled with view(d/2, 2).transpose, so the
  checkpoint's adjacent pairs (2i, 2i+1) become (i, i + d/2), then HF's rotate_half rope. The
  GGUF file holds the checkpoint's layout (llama.cpp's converter does not permute deepseek2), so
  the reference applies HF's rope to the rows as stored; test_deepseek2_reference.py checks that
  this equals rotating adjacent pairs (llama.cpp's "normal" rope) on the GGUF layout.
- YaRN (DeepseekV2YarnRotaryEmbedding): low, high = yarn_find_correction_range(beta_fast=32,
  beta_slow=1, d, base, original_max_position_embeddings) (floor/ceil, clamped to [0, d-1]);
  inv_freq_mask = 1 - linear_ramp(low, high, d/2); inv_freq = inv_freq_extra * mask +
  inv_freq_extra / factor * (1 - mask); cos and sin times get_mscale(factor, mscale) /
  get_mscale(factor, mscale_all_dim), get_mscale(s, m) = 0.1 * m * ln(s) + 1 (1 when s <= 1).
- softmax_scale = q_head_dim^-0.5, times get_mscale(factor, mscale_all_dim)^2 when the YaRN
  config has a nonzero mscale_all_dim.
- RMSNorm: x * rsqrt(mean(x^2) + eps) * w. HF builds q_a_layernorm and kv_a_layernorm without
  passing rms_norm_eps, so they use the class default 1e-6 whatever the config says; so does this
  reference (duet's presets write eps 1e-6, where it makes no difference).

MoE (DeepseekV2MoE / DeepseekV3MoE): y = sum over the chosen experts of w_k * expert(x), plus the
shared experts (one SwiGLU MLP of width moe_intermediate_size * n_shared_experts). The router
(MoEGate) differs by version; see `route()` for the exact rules:
- V2 (scoring_func softmax): scores = softmax(router logits). topk_method "greedy": the top_k
  scores. "group_limited_greedy": group score = the group's max, keep the topk_group best groups,
  the others' scores masked to 0.0, then the top_k scores. Weights = the chosen scores; then
  if top_k > 1 and norm_topk_prob: w / (sum w + 1e-20)  -- and NO routed_scaling_factor --
  else: w * routed_scaling_factor.
- V3 (scoring_func sigmoid, topk_method "noaux_tc"): scores = sigmoid(router logits); the choice
  uses scores + e_score_correction_bias: group score = sum of the group's 2 best biased scores,
  keep the topk_group best groups, the others' biased scores masked to 0.0 (HF's value, see
  MASKED_FILL_V3), top_k of those; weights = the UNBIASED sigmoid scores of the chosen experts;
  if top_k > 1 and norm_topk_prob: w / (sum w + 1e-20); then ALWAYS w * routed_scaling_factor.
Where V2 and V3 differ: softmax vs sigmoid; group score max vs top-2 sum; no bias vs bias for
the choice only; V2 with norm_topk_prob skips routed_scaling_factor, V3 applies it after the
normalization. (llama.cpp's build_moe_ffn always normalizes when expert_weights_norm and then
always scales, and normalizes even for top_k = 1: it equals HF only where norm_topk_prob is false
or routed_scaling_factor is 1 (V2) and top_k > 1; every real checkpoint is such a case.)
MASKED_FILL_V3: the HF V3/R1 modeling_deepseek.py revisions we read fill the experts of dropped
groups with 0.0; DeepSeek's own inference code (later revisions), vLLM and SGLang use -inf. The
two agree unless a kept expert's biased score is <= 0 (possible only with negative
e_score_correction_bias); `route()` counts such tokens (`fill_sensitive`) and duet's synthetic
presets write positive biases, so duet's test files never depend on it.

DeepSeek Sparse Attention (deepseek32; Hugging Face's DeepseekV32Indexer and DeepseekV32Attention
of transformers' deepseek_v32, DeepSeek-V3.2-Exp's inference code for what it leaves out). Each
layer has a "lightning indexer" that picks, for every query t, the index_topk earlier positions
MLA attends to; the rest of the model is V3's, exactly as above. With x the layer's normed input
(what MLA's projections get) and qr = q_a_layernorm(q_a_proj(x)) (what q_b_proj gets):
    iq = wq_b(qr).view(T, Hi, D)                      Hi index heads of D dims
    ik = LayerNorm(wk(x)), eps 1e-6, weight and bias  one key per position, shared by the heads
    iq[..., :rope], ik[..., :rope] roped with the model's cos/sin (YaRN and its magnitude
        included; for DeepSeek's configs the magnitude is 1), but HALF-SPLIT: rotate_half on the
        dims as stored, pairs (i, i + rope/2), where MLA's rope reshuffles adjacent pairs first
        (DeepSeek's 2025-11 fix of their demo code: the indexer's rope is non-interleaved).
        The rope dims come FIRST in an index head (MLA's come last); D - rope dims stay as they are
    w[t]  = weights_proj(x[t]) * Hi^-0.5                            [T, Hi]
    I[t, s] = sum_h w[t, h] * relu(iq[t, h] . ik[s]) * D^-0.5       s <= t; -inf for s > t
    keep the min(index_topk, T) best s of each row I[t] (so min(index_topk, t + 1) real keys:
        a query with fewer keys keeps them all, the -inf ones being masked again by the causal
        mask); MLA's scores of the other keys get -inf before the softmax, every head alike.
So a sequence no longer than index_topk is plain V3 attention, and deepseek32 equals deepseek2
on the same weights. Left out as in HF unless index_fp8 (`--index-fp8`; duet's DUET_INDEXER=fp8):
DeepSeek's kernels (its inference code's Indexer, vLLM's, SGLang's) rotate iq and ik by a
Hadamard transform (orthogonal, so every iq . ik is unchanged) and round them to FP8:
    v <- (H v) * D^-0.5 for each head's iq and each ik, H Sylvester's [D, D] Hadamard matrix
    per block of 128 values (act_quant, scale_fmt "ue8m0"): amax = max(max|v|, 1e-4),
        s = 2^ceil(log2(amax / 448)), v <- s * e4m3(v / s), e4m3 the nearest of the format's
        values (1 + m/8) 2^(e-7) and m 2^-9 (ties to the even code), saturating at 448
and score with those values (their kernel multiplies the codes and applies the power-of-two
scales after the relu: the same products). The batched formulation here is HF's: the full [T, T]
index score matrix, the causal mask, the choice, an additive mask. One deliberate difference:
HF chooses with torch.topk, whose order among EQUAL scores is unspecified; this reference sorts
stably, so ties go to the LOWER position. Ties do occur: a key whose q.k every head's relu zeroes
scores exactly 0 (with 1-4 heads, as in the test models, often at the top-k boundary; with
DeepSeek's 64 heads hardly ever). `--index-stats` counts them; duet must break them alike.

With kv_fp8 (`--kv-fp8` of compare_logits.py; duet's `--kv-cache-dtype fp8`), the cache's rounding,
as DeepSeek-V3.2's inference code simulates its deployed FP8 cache: each token's latent row
[kv_a_layernorm(c), rope(k_pe)] and (deepseek32) each indexer key, after the rounding above when
index_fp8, become what the cache holds before any query reads them, the current token's included:
per whole block of 128 values act_quant's rounding above, the values after the last whole block
(the latent's rope part: bf16 in DeepSeek's cache, f16 in duet's) rounded to float16.

GGUF -> HF config (llama.cpp's convert_hf_to_gguf.py DeepseekV2Model, read backwards; prefix
`deepseek2.`, or `deepseek32.` for a deepseek32 file, every key alike):
    embedding_length -> hidden_size            block_count -> num_hidden_layers
    feed_forward_length -> intermediate_size   attention.head_count -> num_attention_heads
    attention.head_count_kv -> num_key_value_heads (must equal the head count; unused by MLA)
    attention.layer_norm_rms_epsilon -> rms_norm_eps
    attention.q_lora_rank -> q_lora_rank (absent or 0: None, a direct q_proj)
    attention.kv_lora_rank -> kv_lora_rank     rope.dimension_count -> qk_rope_head_dim
    attention.key_length - rope.dimension_count -> qk_nope_head_dim
    attention.value_length -> v_head_dim       rope.freq_base -> rope_theta
    rope.scaling.type "yarn" -> rope_scaling.type ("none" or absent: no rope_scaling)
    rope.scaling.factor -> rope_scaling.factor
    rope.scaling.original_context_length -> rope_scaling.original_max_position_embeddings
    rope.scaling.yarn_log_multiplier / 0.1 -> rope_scaling.mscale_all_dim; GGUF has no mscale:
        assumed equal to mscale_all_dim (true of V2, V2-Lite, V3 and R1), so cos/sin are not scaled
    (beta_fast 32 and beta_slow 1 are not in GGUF either: the values of every DeepSeek config and
        llama.cpp's defaults)
    leading_dense_block_count -> first_k_dense_replace; moe_layer_freq is taken as 1 (every
        layer from first_k_dense_replace on is MoE; not in GGUF, 1 in every DeepSeek config)
    expert_feed_forward_length -> moe_intermediate_size
    expert_count -> n_routed_experts           expert_shared_count -> n_shared_experts
    expert_used_count -> num_experts_per_tok   expert_weights_scale -> routed_scaling_factor
    expert_weights_norm -> norm_topk_prob (absent: false)
    expert_gating_func 1 -> scoring_func softmax, 2 -> sigmoid (absent: softmax, as llama.cpp)
    expert_group_count -> n_group, expert_group_used_count -> topk_group (absent: 1 and 1)
    topk_method: softmax -> "greedy" (n_group 1) or "group_limited_greedy"; sigmoid -> "noaux_tc"
    vocab_size -> vocab_size
    deepseek32 only: attention.indexer.head_count -> index_n_heads (Hi),
        attention.indexer.key_length -> index_head_dim (D), attention.indexer.top_k -> index_topk;
        attention.q_lora_rank must be > 0 (the indexer reads the low-rank query), D >= rope
Tensors (numpy shape = GGUF dims reversed = the HF weight's shape):
    token_embd [V, d] embed_tokens; output_norm [d] norm; output [V, d] lm_head (absent: tied)
    blk.N.attn_norm [d] input_layernorm;  ffn_norm [d] post_attention_layernorm
    attn_q [H*(nope+rope), d] q_proj | attn_q_a [q_lora, d] q_a_proj, attn_q_a_norm [q_lora]
        q_a_layernorm, attn_q_b [H*(nope+rope), q_lora] q_b_proj
    attn_kv_a_mqa [kv_lora+rope, d] kv_a_proj_with_mqa; attn_kv_a_norm [kv_lora] kv_a_layernorm
    attn_kv_b [H*(nope+v), kv_lora] kv_b_proj (per head: nope rows of K, then v rows of V)
    attn_k_b [H, kv_lora, nope] + attn_v_b [H, v, kv_lora]: the same, split (llama.cpp's converter
        since 2025; k_b transposed per head), with key/value_length_mla for the heads' sizes
    attn_output [d, H*v] o_proj
    dense: ffn_gate/ffn_up [ff, d], ffn_down [d, ff] (mlp.gate_proj/up_proj/down_proj)
    MoE: ffn_gate_inp [E, d] mlp.gate.weight; exp_probs_b.bias [E] e_score_correction_bias;
        ffn_gate_exps/ffn_up_exps [E, ff_exp, d], ffn_down_exps [E, d, ff_exp] (slab e = expert
        e's gate_proj/up_proj/down_proj); ffn_{gate,up,down}_shexp: mlp.shared_experts.*
    deepseek32, every layer (an MTP layer blk.<n_layer> too): self_attn.indexer.* as
        indexer.attn_q_b [Hi*D, q_lora] wq_b; indexer.attn_k [D, d] wk; indexer.k_norm.weight
        and .bias [D] k_norm; indexer.proj [Hi, d] weights_proj

Float64 throughout (HF computes inv_freq, the router and the attention softmax in float32).

CLI: deepseek2_reference.py --model F.gguf --tokens "1 2 3" [--all-positions]
prints one JSON line per position, {"pos": i, "logits": [...]} (only the last by default).
     deepseek2_reference.py --model F.gguf --routing-stats [--check]
prints the routing statistics over compare_logits.py's token lists (distinct expert sets, how
often the group limit and the correction bias change the choice, the smallest score margins at
the top-k and group boundaries); with --check, exits 1 when the routing is trivial.
     deepseek2_reference.py --model F.gguf --index-stats [--check]
deepseek32: per layer over the same lists, the queries that drop keys, the keys dropped, the
choices decided by a tie, the smallest gap between the top_k-th and the next index score; per
list, how far the choice moves the logits from attention over every causal key. --check exits 1
when no query drops keys, a gap (or a tied key's smallest |q.k|) is under 1e-5 (float32 noise in
the scores could choose another key), or the choice moves no list's logits by 1e-2 (100x
compare_logits.py's bound).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    DEFAULT_LENGTHS, DTYPE, ArchKeys, GGUFError, GGUFFile, TensorLoader, Weights,
    decoder_forward, logits_arg_parser, parse_lengths, print_logits, report, rms_norm,
    rotate_half, swiglu, token_lists)
from gguf_reader import dequantize  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ARCH = "deepseek2"
ARCH_V32 = "deepseek32"  # DeepSeek-V3.2: deepseek2 plus the lightning indexer (see the docstring)
GATING_SOFTMAX, GATING_SIGMOID = 1, 2
HF_LORA_NORM_EPS = 1e-6  # DeepseekV2RMSNorm's default, used by q_a_layernorm and kv_a_layernorm
MASKED_FILL_V3 = 0.0      # HF V3/R1 modeling_deepseek.py (see the module docstring)
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
INDEXER_NORM_EPS = 1e-6   # HF DeepseekV32Indexer: nn.LayerNorm(index_head_dim, eps=1e-6)


@dataclass
class Deepseek2Config:
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    vocab_size: int
    rms_eps: float
    q_lora_rank: int          # 0: direct q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_base: float
    yarn_factor: float        # 1.0: no rope scaling
    yarn_original_context: int
    mscale: float
    mscale_all_dim: float
    n_dense_lead: int
    n_ff_exp: int
    n_expert: int
    n_expert_shared: int
    n_expert_used: int
    expert_weights_scale: float
    expert_weights_norm: bool
    gating: int               # GATING_SOFTMAX (V2) or GATING_SIGMOID (V3)
    n_group: int
    topk_group: int
    masked_fill_v3: float = MASKED_FILL_V3
    arch: str = ARCH          # the file's general.architecture (and so its keys' prefix)
    # DeepSeek-V3.2's lightning indexer (deepseek32; 0 heads: none, deepseek2)
    index_n_head: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # False: the indexer chooses among ALL keys, future ones included, before the causal mask
    # (never read from a file: a planted defect of test_deepseek2_reference.py)
    index_choice_causal: bool = True
    # True: the indexer's q and k rotated and rounded to FP8 as DeepSeek's kernels do (the module
    # docstring; --index-fp8, never read from a file)
    index_fp8: bool = False
    # True: the latent rows and the indexer's keys rounded as duet's fp8 KV cache holds them (the
    # module docstring; --kv-fp8, never read from a file)
    kv_fp8: bool = False

    # names compare_logits.py prints for every architecture
    @property
    def n_head_kv(self) -> int:
        return self.n_head

    @property
    def rope_scale(self) -> float:
        return self.yarn_factor

    @property
    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def sparse(self) -> bool:
        """Whether attention runs over the indexer's choice (deepseek32) or every causal key."""
        return self.index_n_head > 0 and self.index_topk > 0

    @property
    def topk_method(self) -> str:
        if self.gating == GATING_SIGMOID:
            return "noaux_tc"
        return "greedy" if self.n_group == 1 else "group_limited_greedy"

    def is_moe_layer(self, i: int) -> bool:
        # (i may be an MTP layer's, after the last: MoE when the model has MoE layers.)
        return i >= self.n_dense_lead and self.n_dense_lead < self.n_layer  # moe_layer_freq 1


def read_config(g: GGUFFile) -> Deepseek2Config:
    k = ArchKeys(g, (ARCH, ARCH_V32))  # the keys under the file's own prefix
    key, get = k.key, k.get
    A = k.arch
    n_head = int(key("attention.head_count"))
    n_head_kv = int(get("attention.head_count_kv", n_head))
    # llama.cpp's converter since 2025 splits kv_b into attn_k_b / attn_v_b, writes the latent's
    # widths (kv_lora + rope, kv_lora) as key/value_length and one kv head, and the heads' sizes
    # as key/value_length_mla.
    split_mla = k.has("attention.key_length_mla")
    if split_mla and n_head_kv == 1:
        n_head_kv = n_head
    if n_head_kv != n_head:
        raise GGUFError(f"{g.path}: {A}.attention.head_count_kv is {n_head_kv}, expected the "
                        f"head count {n_head} (MLA decompresses K and V for every head)")
    rope = int(key("rope.dimension_count"))
    key_length = int(key("attention.key_length_mla" if split_mla else "attention.key_length"))
    if rope % 2 or rope <= 0 or key_length <= rope:
        raise GGUFError(f"{g.path}: rope.dimension_count {rope} must be even, positive and less "
                        f"than attention.key_length {key_length} (nope + rope)")
    scaling = get("rope.scaling.type")
    factor, orig, mscale_all_dim = 1.0, 0, 0.0
    if scaling is not None and scaling != "none":
        if scaling != "yarn":
            raise GGUFError(f"{g.path}: {A}.rope.scaling.type is {scaling!r}; DeepSeek-V2/V3 "
                            f"use 'yarn', the only scaling this reference supports")
        factor = float(key("rope.scaling.factor"))
        orig = int(key("rope.scaling.original_context_length"))
        mscale_all_dim = float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
    gating = int(get("expert_gating_func", GATING_SOFTMAX))
    if gating == 0:
        gating = GATING_SOFTMAX  # llama.cpp: older V2 files have no gating key
    if gating not in (GATING_SOFTMAX, GATING_SIGMOID):
        raise GGUFError(f"{g.path}: {A}.expert_gating_func is {gating}, expected 1 (softmax) "
                        f"or 2 (sigmoid)")
    cfg = Deepseek2Config(
        n_embd=int(key("embedding_length")),
        n_layer=int(key("block_count")),
        n_ff=int(key("feed_forward_length")),
        n_head=n_head,
        vocab_size=k.vocab_size(),
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        q_lora_rank=int(get("attention.q_lora_rank", 0) or 0),
        kv_lora_rank=int(key("attention.kv_lora_rank")),
        qk_nope_head_dim=key_length - rope,
        qk_rope_head_dim=rope,
        v_head_dim=int(key("attention.value_length_mla" if split_mla else "attention.value_length")),
        rope_base=float(get("rope.freq_base", 10000.0)),
        yarn_factor=factor,
        yarn_original_context=orig,
        mscale=mscale_all_dim,
        mscale_all_dim=mscale_all_dim,
        n_dense_lead=int(get("leading_dense_block_count", 0)),
        n_ff_exp=int(get("expert_feed_forward_length", 0)),
        n_expert=int(get("expert_count", 0)),
        n_expert_shared=int(get("expert_shared_count", 0)),
        n_expert_used=int(get("expert_used_count", 0)),
        expert_weights_scale=float(get("expert_weights_scale", 1.0)),
        expert_weights_norm=bool(get("expert_weights_norm", False)),
        gating=gating,
        n_group=int(get("expert_group_count", 1) or 1),
        topk_group=int(get("expert_group_used_count", 1) or 1),
        arch=A,
    )
    if A == ARCH_V32:
        cfg.index_n_head = int(key("attention.indexer.head_count"))
        cfg.index_head_dim = int(key("attention.indexer.key_length"))
        cfg.index_topk = int(key("attention.indexer.top_k"))
        if not cfg.q_lora_rank:
            raise GGUFError(f"{g.path}: {A}.attention.q_lora_rank is missing or 0; the indexer "
                            f"reads the low-rank query (q_a_layernorm(q_a_proj(x)))")
        if cfg.index_n_head <= 0 or cfg.index_topk <= 0 or cfg.index_head_dim < rope:
            raise GGUFError(f"{g.path}: the indexer needs head_count > 0, top_k > 0 and "
                            f"key_length >= rope.dimension_count {rope} (have "
                            f"{cfg.index_n_head}, {cfg.index_topk}, {cfg.index_head_dim})")
    if cfg.n_dense_lead < cfg.n_layer:
        E, k = cfg.n_expert, cfg.n_expert_used
        if E <= 0 or not 0 < k <= E or cfg.n_ff_exp <= 0:
            raise GGUFError(f"{g.path}: MoE layers need expert_count > 0, 0 < expert_used_count "
                            f"<= expert_count and expert_feed_forward_length > 0 (have {E}, {k}, "
                            f"{cfg.n_ff_exp})")
        if E % cfg.n_group or not 0 < cfg.topk_group <= cfg.n_group:
            raise GGUFError(f"{g.path}: {E} experts do not split into {cfg.n_group} groups of "
                            f"which {cfg.topk_group} are used")
        if k > cfg.topk_group * (E // cfg.n_group):
            raise GGUFError(f"{g.path}: top-{k} cannot come from {cfg.topk_group} groups of "
                            f"{E // cfg.n_group} experts")
        if gating == GATING_SIGMOID and E // cfg.n_group < 2:
            raise GGUFError(f"{g.path}: sigmoid (noaux_tc) routing scores a group by its 2 best "
                            f"experts; groups of {E // cfg.n_group} expert cannot")
    return cfg


# -- weights -----------------------------------------------------------------------------------

class ExpertTensor:
    """A 3-D expert tensor [E, rows, cols], dequantized one expert slab at a time (slabs are
    contiguous in GGUF: the outermost dimension is the expert)."""

    def __init__(self, g: GGUFFile, name: str):
        self.g, self.name = g, name
        self.info = g.tensors[name]
        self.shape = self.info.shape
        self._cache: dict[int, torch.Tensor] = {}

    def __getitem__(self, e: int) -> torch.Tensor:
        if e not in self._cache:
            n_expert, rows, cols = self.shape
            if not 0 <= e < n_expert:
                raise IndexError(f"expert {e} of {self.name} ({n_expert} experts)")
            raw = self.g.raw(self.name)
            slab = len(raw) // n_expert
            x = dequantize(raw[e * slab:(e + 1) * slab], self.info.type_id, rows * cols,
                           self.g.byte_order)
            self._cache[e] = torch.from_numpy(x.reshape(rows, cols).astype(np.float64))
        return self._cache[e]


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor | None        # [H*(nope+rope), d]  (no q_lora)
    wq_a: torch.Tensor | None      # [q_lora, d]
    q_a_norm: torch.Tensor | None  # [q_lora]
    wq_b: torch.Tensor | None      # [H*(nope+rope), q_lora]
    wkv_a: torch.Tensor            # [kv_lora + rope, d]
    kv_a_norm: torch.Tensor        # [kv_lora]
    wkv_b: torch.Tensor            # [H*(nope+v), kv_lora]
    wo: torch.Tensor               # [d, H*v]
    ffn_norm: torch.Tensor
    # dense layers
    w_gate: torch.Tensor | None = None
    w_up: torch.Tensor | None = None
    w_down: torch.Tensor | None = None
    # MoE layers
    router: torch.Tensor | None = None       # [E, d]
    router_bias: torch.Tensor | None = None  # [E] e_score_correction_bias
    exp_gate: ExpertTensor | None = None     # [E, ff_exp, d]
    exp_up: ExpertTensor | None = None
    exp_down: ExpertTensor | None = None     # [E, d, ff_exp]
    sh_gate: torch.Tensor | None = None      # [ff_exp*n_shared, d]
    sh_up: torch.Tensor | None = None
    sh_down: torch.Tensor | None = None      # [d, ff_exp*n_shared]
    # the lightning indexer (deepseek32)
    ix_wq_b: torch.Tensor | None = None      # [Hi*D, q_lora] indexer.wq_b
    ix_wk: torch.Tensor | None = None        # [D, d] indexer.wk
    ix_k_norm: torch.Tensor | None = None    # [D] indexer.k_norm.weight
    ix_k_norm_b: torch.Tensor | None = None  # [D] indexer.k_norm.bias
    ix_proj: torch.Tensor | None = None      # [Hi, d] indexer.weights_proj


def load_model(path: str | GGUFFile) -> Weights:
    """The model of a GGUF file, or of an open GGUFFile (test_lora.py passes one whose tensor()
    returns LoRA-merged values)."""
    g = path if isinstance(path, GGUFFile) else GGUFFile(path)
    cfg = read_config(g)
    t = TensorLoader(g)
    c = cfg
    d, V = c.n_embd, c.vocab_size
    tok = t("token_embd.weight", (V, d))
    layers = [load_layer(g, t, c, i) for i in range(c.n_layer)]
    out_norm, lm_head, tied = t.head(tok, d, V)
    t.done()
    return Weights(cfg, tok, layers, out_norm, lm_head, tied)


def load_layer(g: GGUFFile, t: TensorLoader, c: Deepseek2Config, i: int) -> LayerWeights:
    """The weights of decoder block i (blk.i.*); problems go to t.problems."""
    d, H = c.n_embd, c.n_head
    qhd, rope, nope, vd = c.q_head_dim, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim

    def experts(name: str, shape: tuple[int, ...]) -> ExpertTensor | None:
        return ExpertTensor(g, name) if t.check(name, shape) else None

    def kv_b(p: str) -> torch.Tensor | None:
        if p + "attn_kv_b.weight" in g.tensors or p + "attn_k_b.weight" not in g.tensors:
            return t(p + "attn_kv_b.weight", (H * (nope + vd), c.kv_lora_rank))
        # The split layout: k_b [H, kv_lora, nope] is W_UK transposed per head, v_b [H, v, kv_lora]
        # is W_UV; kv_b_proj is per head W_UK's nope rows, then W_UV's v rows.
        k_b = t(p + "attn_k_b.weight", (H, c.kv_lora_rank, nope))
        v_b = t(p + "attn_v_b.weight", (H, vd, c.kv_lora_rank))
        if k_b is None or v_b is None:
            return None
        return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(H * (nope + vd), c.kv_lora_rank)
    p = f"blk.{i}."
    lw = LayerWeights(
        attn_norm=t(p + "attn_norm.weight", (d,)),
        wq=None if c.q_lora_rank else t(p + "attn_q.weight", (H * qhd, d)),
        wq_a=t(p + "attn_q_a.weight", (c.q_lora_rank, d)) if c.q_lora_rank else None,
        q_a_norm=t(p + "attn_q_a_norm.weight", (c.q_lora_rank,)) if c.q_lora_rank else None,
        wq_b=t(p + "attn_q_b.weight", (H * qhd, c.q_lora_rank)) if c.q_lora_rank else None,
        wkv_a=t(p + "attn_kv_a_mqa.weight", (c.kv_lora_rank + rope, d)),
        kv_a_norm=t(p + "attn_kv_a_norm.weight", (c.kv_lora_rank,)),
        wkv_b=kv_b(p),
        wo=t(p + "attn_output.weight", (d, H * vd)),
        ffn_norm=t(p + "ffn_norm.weight", (d,)),
    )
    if c.index_n_head:
        Hi, D = c.index_n_head, c.index_head_dim
        lw.ix_wq_b = t(p + "indexer.attn_q_b.weight", (Hi * D, c.q_lora_rank))
        lw.ix_wk = t(p + "indexer.attn_k.weight", (D, d))
        lw.ix_k_norm = t(p + "indexer.k_norm.weight", (D,))
        lw.ix_k_norm_b = t(p + "indexer.k_norm.bias", (D,))
        lw.ix_proj = t(p + "indexer.proj.weight", (Hi, d))
    if not c.is_moe_layer(i):
        lw.w_gate = t(p + "ffn_gate.weight", (c.n_ff, d))
        lw.w_up = t(p + "ffn_up.weight", (c.n_ff, d))
        lw.w_down = t(p + "ffn_down.weight", (d, c.n_ff))
    else:
        E, fe, sh = c.n_expert, c.n_ff_exp, c.n_ff_exp * c.n_expert_shared
        lw.router = t(p + "ffn_gate_inp.weight", (E, d))
        lw.router_bias = t(p + "exp_probs_b.bias", (E,), optional=True)
        if lw.router_bias is not None and c.gating != GATING_SIGMOID:
            t.problems.append(f"tensor '{p}exp_probs_b.bias' is present, but the gating is "
                            f"softmax (V2 has no correction bias)")
        lw.exp_gate = experts(p + "ffn_gate_exps.weight", (E, fe, d))
        lw.exp_up = experts(p + "ffn_up_exps.weight", (E, fe, d))
        lw.exp_down = experts(p + "ffn_down_exps.weight", (E, d, fe))
        if c.n_expert_shared:
            lw.sh_gate = t(p + "ffn_gate_shexp.weight", (sh, d))
            lw.sh_up = t(p + "ffn_up_shexp.weight", (sh, d))
            lw.sh_down = t(p + "ffn_down_shexp.weight", (d, sh))
    return lw


def describe(m: Weights) -> str:
    c = m.cfg
    q = f"q_lora {c.q_lora_rank}" if c.q_lora_rank else "direct q"
    rope = (f"YaRN x{c.yarn_factor:g} over {c.yarn_original_context}, mscale_all_dim "
            f"{c.mscale_all_dim:.4g}" if c.yarn_factor > 1 else "no rope scaling")
    ix = (f"; indexer {c.index_n_head} heads of {c.index_head_dim}, top-{c.index_topk}"
          f"{', q and k rounded to FP8' if c.index_fp8 else ''}" if c.index_n_head else "")
    ix += "; fp8 KV cache" if c.kv_fp8 else ""
    return (f"{c.arch}: n_embd {c.n_embd}, layers {c.n_layer} ({c.n_dense_lead} dense), "
            f"{c.n_head} heads, {q}, kv_lora {c.kv_lora_rank}, nope/rope/v "
            f"{c.qk_nope_head_dim}/{c.qk_rope_head_dim}/{c.v_head_dim}, {rope}; "
            f"{c.n_expert} experts (+{c.n_expert_shared} shared) top-{c.n_expert_used}, "
            f"{'sigmoid' if c.gating == GATING_SIGMOID else 'softmax'} {c.topk_method}"
            f"{f' {c.topk_group}/{c.n_group} groups' if c.n_group > 1 else ''}, "
            f"norm {c.expert_weights_norm}, scale {c.expert_weights_scale:g}; n_ff {c.n_ff}, "
            f"n_ff_exp {c.n_ff_exp}, vocab {c.vocab_size}, "
            f"{'tied' if m.tied else 'separate'} lm_head{ix}")


# -- rope (HF DeepseekV2RotaryEmbedding / DeepseekV2YarnRotaryEmbedding) --------------------

def yarn_find_correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_find_correction_range(low_rot: float, high_rot: float, dim: int, base: float,
                               max_pos: int) -> tuple[int, int]:
    low = math.floor(yarn_find_correction_dim(low_rot, dim, base, max_pos))
    high = math.ceil(yarn_find_correction_dim(high_rot, dim, base, max_pos))
    return max(low, 0), min(high, dim - 1)


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_linear_ramp_mask(lo: float, hi: float, dim: int) -> torch.Tensor:
    if lo == hi:
        hi += 0.001  # as HF: prevent a division by zero
    return torch.clamp((torch.arange(dim, dtype=DTYPE) - lo) / (hi - lo), 0, 1)


def inv_freq(cfg: Deepseek2Config) -> torch.Tensor:
    d = cfg.qk_rope_head_dim
    extra = 1.0 / (cfg.rope_base ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
    if cfg.yarn_factor <= 1:
        return extra
    inter = extra / cfg.yarn_factor
    low, high = yarn_find_correction_range(YARN_BETA_FAST, YARN_BETA_SLOW, d, cfg.rope_base,
                                           cfg.yarn_original_context)
    mask = 1.0 - yarn_linear_ramp_mask(low, high, d // 2)
    return inter * (1 - mask) + extra * mask


def rope_cos_sin(positions: torch.Tensor, cfg: Deepseek2Config
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.outer(positions.to(DTYPE), inv_freq(cfg))
    emb = torch.cat([freqs, freqs], dim=-1)
    m = 1.0
    if cfg.yarn_factor > 1:
        m = yarn_get_mscale(cfg.yarn_factor, cfg.mscale) / \
            yarn_get_mscale(cfg.yarn_factor, cfg.mscale_all_dim)
    return emb.cos() * m, emb.sin() * m


def softmax_scale(cfg: Deepseek2Config) -> float:
    s = cfg.q_head_dim ** -0.5
    if cfg.yarn_factor > 1 and cfg.mscale_all_dim:
        m = yarn_get_mscale(cfg.yarn_factor, cfg.mscale_all_dim)
        s = s * m * m
    return s


def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF deepseek's apply_rotary_pos_emb for one tensor x [..., T, d]: the view(d/2, 2)
    .transpose reshuffle (checkpoint pairs (2i, 2i+1) -> (i, i + d/2)), then rotate_half rope.
    The result stays in the reshuffled order, as in HF (q and k alike, so q.k is unchanged)."""
    *lead, d = x.shape
    x = x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)
    return x * cos + rotate_half(x) * sin


# -- the forward pass --------------------------------------------------------------------------

def attention(x: torch.Tensor, lw: LayerWeights, cfg: Deepseek2Config, cos: torch.Tensor,
              sin: torch.Tensor, trace: dict | None = None, il: int = 0) -> torch.Tensor:
    T, H = x.shape[0], cfg.n_head
    nope, rope, vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    qr = None
    if cfg.q_lora_rank:
        qr = rms_norm(x @ lw.wq_a.T, lw.q_a_norm, HF_LORA_NORM_EPS)  # the indexer reads it too
        q = qr @ lw.wq_b.T
    else:
        q = x @ lw.wq.T
    q = q.view(T, H, nope + rope).transpose(0, 1)  # [H, T, qhd]
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    ckv = x @ lw.wkv_a.T  # [T, kv_lora + rope]
    c_kv, k_pe = ckv[:, :cfg.kv_lora_rank], ckv[:, cfg.kv_lora_rank:]
    q_pe = apply_rotary_pos_emb(q_pe, cos, sin)
    k_pe = apply_rotary_pos_emb(k_pe[None], cos, sin)  # [1, T, rope]: one head, shared
    c_kv = rms_norm(c_kv, lw.kv_a_norm, HF_LORA_NORM_EPS)
    if cfg.kv_fp8:  # the cache row [c_kv, k_pe] as the cache holds it, for every query
        row = kv_cache_round(torch.cat([c_kv, k_pe[0]], dim=-1))
        c_kv, k_pe = row[:, :cfg.kv_lora_rank], row[None, :, cfg.kv_lora_rank:]
    kv = (c_kv @ lw.wkv_b.T).view(T, H, nope + vd).transpose(0, 1)  # [H, T, nope + v]
    k_nope, v = kv[..., :nope], kv[..., nope:]
    query = torch.cat([q_nope, q_pe], dim=-1)
    key = torch.cat([k_nope, k_pe.expand(H, T, rope)], dim=-1)
    scores = query @ key.transpose(1, 2) * softmax_scale(cfg)  # [H, T, T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    if cfg.sparse:  # DSA: -inf on the keys the indexer did not choose (the same for every head)
        parts: dict = {}
        index = indexer_scores(x, qr, lw, cfg, cos, sin, parts)
        chosen = index_mask(index, cfg.index_topk)
        scores = scores + chosen
        if trace is not None:
            trace[f"indexer_score-{il}"] = index
            trace[f"indexer_mask-{il}"] = chosen
            trace[f"indexer_stats-{il}"] = index_stats(index, cfg.index_topk, parts["kink"])
    p = torch.softmax(scores, dim=-1)
    out = (p @ v).transpose(0, 1).reshape(T, H * vd)
    if trace is not None:
        trace[f"q-{il}"] = q
        trace[f"kv_compressed-{il}"] = c_kv
        trace[f"k_pe-{il}"] = k_pe[0]
        trace[f"kqv_out-{il}"] = out
    return out @ lw.wo.T


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """torch.nn.LayerNorm over the last dim: mean-centred, biased variance, weight and bias."""
    xc = x - x.mean(-1, keepdim=True)
    return xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * w + b


def e4m3_values() -> torch.Tensor:
    """The 127 finite non-negative values of FP8 e4m3 (OCP's E4M3: bias 7, no infinities, code
    0x7F NaN), in code order, which is increasing: m 2^-9 for exponent field 0, else
    (1 + m/8) 2^(e-7)."""
    vals = [(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
            for e in range(16) for m in range(8)]
    return torch.tensor(vals[:127], dtype=DTYPE)


E4M3 = e4m3_values()


def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """Each value's nearest e4m3 value (ties to the even code), saturating at +-448."""
    a = v.abs().clamp(max=448.0)
    hi = torch.searchsorted(E4M3, a, right=True).clamp(max=126)  # first value above a
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - E4M3[lo], E4M3[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo % 2 == 1))
    return torch.where(up, E4M3[hi], E4M3[lo]) * torch.sign(v)


def sylvester_hadamard(n: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix [n, n] (n a power of two), natural order."""
    h = torch.ones(1, 1, dtype=DTYPE)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    if h.shape[0] != n:
        raise ValueError(f"a Hadamard matrix of order {n}: not a power of two")
    return h


def act_quant_round(blk: torch.Tensor) -> torch.Tensor:
    """Rows [..., <= 128] as act_quant with scale_fmt "ue8m0" rounds them, read back."""
    amax = blk.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    s = torch.pow(2.0, torch.ceil(torch.log2(amax / 448.0)))
    return e4m3_round(blk / s) * s


def fp8_indexer_round(v: torch.Tensor) -> torch.Tensor:
    """DeepSeek's rounding of the indexer's q and k rows [..., D] (the module docstring)."""
    D = v.shape[-1]
    v = v @ sylvester_hadamard(D).T * D ** -0.5
    out = torch.empty_like(v)
    for b0 in range(0, D, 128):
        out[..., b0:b0 + 128] = act_quant_round(v[..., b0:b0 + 128])
    return out


# When a list: kv_cache_round appends, per call, each row's (token's) smallest distance of a
# value to a midpoint of e4m3's grid at its block's scale, relative to the midpoint
# (compare_logits.py --kv-fp8: where float64 and float32 could round a value apart).
KV_MIDPOINT_DISTANCES: list | None = None


def kv_cache_round(v: torch.Tensor) -> torch.Tensor:
    """Cache rows [T, n] as duet's fp8 KV cache holds them (the module docstring): each whole
    128 values through act_quant_round, the rest rounded to float16."""
    n = v.shape[-1]
    whole = n // 128 * 128
    out = v.clone()
    nearest = torch.full(v.shape[:-1], float("inf"), dtype=v.dtype)
    for b0 in range(0, whole, 128):
        blk = v[..., b0:b0 + 128]
        out[..., b0:b0 + 128] = act_quant_round(blk)
        amax = blk.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
        a = (blk / torch.pow(2.0, torch.ceil(torch.log2(amax / 448.0)))).abs().clamp(max=448.0)
        hi = torch.searchsorted(E4M3, a, right=True).clamp(max=126)
        mid = (E4M3[hi - 1] + E4M3[hi]) / 2
        nearest = torch.minimum(nearest, ((a - mid).abs() / mid).amin(dim=-1))
    out[..., whole:] = v[..., whole:].to(torch.float16).to(v.dtype)
    if KV_MIDPOINT_DISTANCES is not None:
        KV_MIDPOINT_DISTANCES.append(nearest)
    return out


def indexer_scores(x: torch.Tensor, qr: torch.Tensor, lw: LayerWeights, cfg: Deepseek2Config,
                   cos: torch.Tensor, sin: torch.Tensor, parts: dict | None = None
                   ) -> torch.Tensor:
    """The lightning indexer's scores [T (query), T (key)] of one layer, future keys -inf (HF's
    DeepseekV32Indexer.forward in float64; see the module docstring). x: the normed layer input
    [T, d]; qr: the normed low-rank query [T, q_lora]; cos, sin: the model's rope [T, rope].
    With `parts`, parts["kink"] [T, T] is each pair's smallest |q_h . k| * D^-0.5 over the heads:
    how far the pair is from a relu switching on or off."""
    T, Hi, D, rope = x.shape[0], cfg.index_n_head, cfg.index_head_dim, cfg.qk_rope_head_dim

    def rope_first(v: torch.Tensor) -> torch.Tensor:
        # rotate_half rope on the first `rope` dims AS STORED (no reshuffle: pairs (i, i + rope/2)),
        # the other D - rope dims as they are
        r = v[..., :rope]
        return torch.cat([r * cos + rotate_half(r) * sin, v[..., rope:]], dim=-1)

    iq = rope_first((qr @ lw.ix_wq_b.T).view(T, Hi, D).transpose(0, 1))  # [Hi, T, D]
    ik = rope_first(layer_norm(x @ lw.ix_wk.T, lw.ix_k_norm, lw.ix_k_norm_b, INDEXER_NORM_EPS))
    if cfg.index_fp8:
        iq, ik = fp8_indexer_round(iq), fp8_indexer_round(ik)
    if cfg.kv_fp8:  # the keys as the cache holds them
        ik = kv_cache_round(ik)
    raw = iq @ ik.T * D ** -0.5  # [Hi, T, T]
    dots = torch.relu(raw)
    if parts is not None:
        parts["kink"] = raw.abs().min(dim=0).values
    w = (x @ lw.ix_proj.T) * Hi ** -0.5  # [T, Hi]
    index = torch.einsum("th,hts->ts", w, dots)
    if cfg.index_choice_causal:
        index = index.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return index


def index_mask(index: torch.Tensor, top_k: int) -> torch.Tensor:
    """The additive mask [T, T] of the indexer's choice: 0.0 at each query's min(top_k, T) best
    keys, -inf elsewhere. Ties go to the lower position: a stable descending sort, where HF calls
    torch.topk (whose order among equal scores is unspecified). Ties are real here: a key that
    every head's relu zeroes scores exactly 0. For a query t with t + 1 < top_k the choice takes
    future (-inf) keys as well, which the causal mask removes again, as in HF and DeepSeek's code:
    the query attends to all of its t + 1 keys."""
    T = index.shape[0]
    best = torch.sort(index, dim=-1, descending=True, stable=True).indices[:, :min(top_k, T)]
    return torch.full((T, T), float("-inf"), dtype=DTYPE).scatter(1, best, 0.0)


def index_stats(index: torch.Tensor, top_k: int, kink: torch.Tensor | None = None) -> dict:
    """Over one layer's queries that have more than top_k keys (t + 1 > top_k): how many there
    are ("sparse"), how many keys they drop in all, how many choices hang on an exact tie between
    the top_k-th and the next score ("ties", decided by position), and the smallest non-zero gap
    there ("margin"), with the largest |score| ("scale") to judge it by. A tie is a score of
    exactly 0 (every head's relu off; random scores do not tie otherwise), which float32 keeps
    unless a head's q.k is near 0: with `kink` (indexer_scores' parts), "tie_margin" is the
    smallest such |q_h . k| * D^-0.5 among the keys tied at the boundary."""
    T = index.shape[0]
    st = index.sort(dim=-1, descending=True).values
    rows = torch.arange(T) + 1 > top_k
    finite = index[torch.isfinite(index)]
    out = {"queries": T, "sparse": int(rows.sum()), "dropped": 0, "ties": 0, "margin": math.inf,
           "tie_margin": math.inf,
           "scale": float(finite.abs().max()) if finite.numel() else 0.0}
    if out["sparse"]:
        gap = st[rows, top_k - 1] - st[rows, top_k]
        out["dropped"] = int((torch.arange(T)[rows] + 1 - top_k).sum())
        out["ties"] = int((gap == 0).sum())
        if (gap > 0).any():
            out["margin"] = float(gap[gap > 0].min())
        if kink is not None:
            for t in torch.nonzero(rows).flatten().tolist():
                if st[t, top_k - 1] == st[t, top_k]:
                    tied = index[t] == st[t, top_k - 1]
                    out["tie_margin"] = min(out["tie_margin"], float(kink[t][tied].min()))
    return out


@dataclass
class Routing:
    idx: torch.Tensor      # [T, top_k] the chosen experts (in torch.topk's order)
    weight: torch.Tensor   # [T, top_k]
    stats: dict = field(default_factory=dict)


@dataclass
class Choice:
    idx: torch.Tensor                  # [T, top_k] the chosen experts
    ranked: torch.Tensor               # [T, E] the scores top_k ranked (dropped groups filled)
    choice: torch.Tensor               # [T, E] the choice scores before the group mask
    group_scores: torch.Tensor | None  # [T, G]
    kept: torch.Tensor | None          # [T, E] bool: the expert's group was kept


def choose(scores: torch.Tensor, bias: torch.Tensor | None, cfg: Deepseek2Config) -> Choice:
    """The experts HF's MoEGate picks from the gate scores [T, E] (softmax or sigmoid)."""
    T, E, k = scores.shape[0], cfg.n_expert, cfg.n_expert_used
    G, TG = cfg.n_group, cfg.topk_group
    if cfg.gating == GATING_SOFTMAX:
        choice = scores
        if cfg.topk_method == "greedy":  # V2: torch.topk(scores, k)
            return Choice(torch.topk(choice, k=k, dim=-1).indices, choice, choice, None, None)
        group_scores = choice.view(T, G, -1).max(dim=-1).values  # V2: the group's best
        fill = 0.0
    else:  # V3 noaux_tc: the biased scores choose, groups scored by their 2 best
        choice = scores if bias is None else scores + bias[None, :]
        group_scores = choice.view(T, G, -1).topk(2, dim=-1).values.sum(dim=-1)
        fill = cfg.masked_fill_v3
    group_idx = torch.topk(group_scores, k=TG, dim=-1).indices
    group_mask = torch.zeros(T, G, dtype=torch.bool).scatter_(1, group_idx, True)
    score_mask = group_mask[:, :, None].expand(T, G, E // G).reshape(T, E)
    tmp = choice.masked_fill(~score_mask, fill)
    return Choice(torch.topk(tmp, k=k, dim=-1).indices, tmp, choice, group_scores, score_mask)


def route(x: torch.Tensor, lw: LayerWeights, cfg: Deepseek2Config) -> Routing:
    """MoEGate.forward of HF DeepSeek-V2 (softmax) or V3 (sigmoid) for the normed input x [T, d],
    with statistics of how close and how constrained the choice was."""
    E, k, TG = cfg.n_expert, cfg.n_expert_used, cfg.topk_group
    logits = x @ lw.router.T  # [T, E]
    sigmoid = cfg.gating == GATING_SIGMOID
    scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    ch = choose(scores, lw.router_bias if sigmoid else None, cfg)
    idx = ch.idx
    weight = scores.gather(1, idx)  # V3: the unbiased scores
    if not sigmoid:  # DeepSeek-V2's MoEGate: normalize OR scale
        if k > 1 and cfg.expert_weights_norm:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            weight = weight * cfg.expert_weights_scale
    else:  # DeepSeek-V3's MoEGate: normalize, then always scale
        if k > 1 and cfg.expert_weights_norm:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        weight = weight * cfg.expert_weights_scale

    def as_sets(i: torch.Tensor) -> torch.Tensor:
        return i.sort(dim=-1).values

    stats: dict = {"sets": {tuple(r) for r in as_sets(idx).tolist()},
                   "used": set(idx.flatten().tolist())}
    if k < E:
        st = ch.ranked.sort(dim=-1, descending=True).values
        stats["topk_margin"] = float((st[:, k - 1] - st[:, k]).min())
    if ch.group_scores is not None and TG < cfg.n_group:
        gs = ch.group_scores.sort(dim=-1, descending=True).values
        stats["group_margin"] = float((gs[:, TG - 1] - gs[:, TG]).min())
        free = torch.topk(ch.choice, k=k, dim=-1).indices  # the same choice without groups
        stats["group_bites"] = int((as_sets(free) != as_sets(idx)).any(dim=-1).sum())
        if sigmoid:  # a kept expert with biased score <= 0: filling 0.0 or -inf may differ
            low = ch.choice.masked_fill(~ch.kept, float("inf")) <= 0
            stats["fill_sensitive"] = int(low.any(dim=-1).sum())
    if sigmoid and lw.router_bias is not None:
        plain = choose(scores, None, cfg).idx
        stats["bias_bites"] = int((as_sets(plain) != as_sets(idx)).any(dim=-1).sum())
    return Routing(idx, weight, stats)


def moe(x: torch.Tensor, lw: LayerWeights, cfg: Deepseek2Config, trace: dict | None = None,
        il: int = 0) -> torch.Tensor:
    r = route(x, lw, cfg)
    y = torch.zeros_like(x)
    for e in sorted(set(r.idx.flatten().tolist())):
        rows, slot = torch.where(r.idx == e)
        out = swiglu(x[rows], lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])
        y.index_add_(0, rows, out * r.weight[rows, slot][:, None])
    if trace is not None:
        trace[f"ffn_moe_topk-{il}"] = r.idx
        trace[f"ffn_moe_weights-{il}"] = r.weight
        trace[f"ffn_moe_stats-{il}"] = r.stats
        trace[f"ffn_moe_out-{il}"] = y.clone()
    if cfg.n_expert_shared:
        sh = swiglu(x, lw.sh_gate, lw.sh_up, lw.sh_down)
        if trace is not None:
            trace[f"ffn_shexp-{il}"] = sh
        y = y + sh
    return y


def forward(m: Weights, tokens: list[int], trace: dict | None = None) -> torch.Tensor:
    """Logits [T, vocab] in float64 for the token ids at positions 0..T-1. With `trace` (a dict),
    intermediates are stored under llama.cpp-style names ('attn_out-0', 'ffn_moe_topk-1', ...)."""
    cfg = m.cfg
    cos, sin = rope_cos_sin(torch.arange(len(tokens)), cfg)

    def ffn(x: torch.Tensor, lw: LayerWeights, i: int) -> torch.Tensor:
        if cfg.is_moe_layer(i):
            return moe(x, lw, cfg, trace, i)
        return swiglu(x, lw.w_gate, lw.w_up, lw.w_down)

    return decoder_forward(m, tokens, lambda x, lw, i: attention(x, lw, cfg, cos, sin, trace, i),
                           ffn, trace)


# -- routing statistics ------------------------------------------------------------------------

def routing_stats(m: Weights, token_lists: list[list[int]]) -> dict:
    """Per MoE layer, over all positions of all lists: tokens, distinct expert sets, experts
    used, how many tokens the group limit / the correction bias changed, the smallest margins."""
    per_layer: dict[int, dict] = {}
    for tokens in token_lists:
        trace: dict = {}
        with torch.no_grad():
            forward(m, tokens, trace)
        for i in range(m.cfg.n_layer):
            s = trace.get(f"ffn_moe_stats-{i}")
            if s is None:
                continue
            acc = per_layer.setdefault(i, {"tokens": 0, "sets": set(), "used": set(),
                                           "group_bites": 0, "bias_bites": 0,
                                           "fill_sensitive": 0, "topk_margin": math.inf,
                                           "group_margin": math.inf})
            acc["tokens"] += len(tokens)
            acc["sets"] |= s["sets"]
            acc["used"] |= s["used"]
            for name in ("group_bites", "bias_bites", "fill_sensitive"):
                acc[name] += s.get(name, 0)
            for name in ("topk_margin", "group_margin"):
                acc[name] = min(acc[name], s.get(name, math.inf))
    return per_layer


def check_routing(m: Weights, per_layer: dict) -> list[str]:
    """Failures when the routing of a test model is too trivial to test anything."""
    c = m.cfg
    failures = []
    for i, s in per_layer.items():
        if len(s["sets"]) < min(8, s["tokens"] // 4):
            failures.append(f"layer {i}: only {len(s['sets'])} distinct expert sets over "
                            f"{s['tokens']} tokens")
        if len(s["used"]) < c.n_expert:
            failures.append(f"layer {i}: experts {sorted(set(range(c.n_expert)) - s['used'])} "
                            f"are never chosen")
        if c.topk_method != "greedy" and c.topk_group < c.n_group and s["group_bites"] == 0:
            failures.append(f"layer {i}: the group limit ({c.topk_group} of {c.n_group}) never "
                            f"changes the choice")
        if c.gating == GATING_SIGMOID and s["bias_bites"] == 0:
            failures.append(f"layer {i}: e_score_correction_bias never changes the choice")
        if s["fill_sensitive"]:
            failures.append(f"layer {i}: {s['fill_sensitive']} tokens have a kept expert with "
                            f"biased score <= 0, where HF's masked_fill 0.0 and -inf differ")
    return failures


# -- the indexer's statistics (deepseek32) -----------------------------------------------------

# The smallest gap at the top-k boundary (and |q.k| of a key tied there) --check accepts: duet's
# float32 activations differ from these by about 1e-6 relative (compare_logits.py's measurements
# of the logits), so its index scores of size ~5 by some 1e-6 (an estimate, not measured).
MIN_INDEX_GAP = 1e-5
MIN_SELECTION_MOVE = 1e-2  # the choice must move the logits by 100x compare_logits.py's bound


def dense_twin(m: Weights) -> Weights:
    """The same weights with the indexer switched off: attention over every causal key."""
    return dataclasses.replace(m, cfg=dataclasses.replace(m.cfg, index_topk=0))


def relative_change(got: torch.Tensor, want: torch.Tensor) -> float:
    """compare_logits.py's metric: max over positions of max|got - want| / (1 + max|want|)."""
    return float(((got - want).abs().max(dim=-1).values /
                  (1 + want.abs().max(dim=-1).values)).max())


def f32_twin(m: Weights) -> Weights:
    """The same weights with the indexer's q and k as they are (no FP8 rounding)."""
    return dataclasses.replace(m, cfg=dataclasses.replace(m.cfg, index_fp8=False))


def indexer_stats(m: Weights, token_lists: list[list[int]], rounded: list[float]
                  ) -> tuple[dict, list[float]]:
    """Per layer, over all positions of all lists: queries, those with more than top_k keys, the
    keys they drop, the choices decided by a tie, the smallest gap at the top-k boundary, the
    largest |score|; and per list, how far the choice moves the logits from attention over every
    causal key (and, with index_fp8, into `rounded`, how far FP8's rounding moves them from the
    indexer without it)."""
    per_layer: dict[int, dict] = {}
    moved = []
    for tokens in token_lists:
        trace: dict = {}
        with torch.no_grad():
            sparse = forward(m, tokens, trace)
            moved.append(relative_change(sparse, forward(dense_twin(m), tokens)))
            if m.cfg.index_fp8:
                rounded.append(relative_change(sparse, forward(f32_twin(m), tokens)))
        for i in range(m.cfg.n_layer):
            s = trace[f"indexer_stats-{i}"]
            acc = per_layer.setdefault(i, {"queries": 0, "sparse": 0, "dropped": 0, "ties": 0,
                                           "margin": math.inf, "tie_margin": math.inf,
                                           "scale": 0.0})
            for name in ("queries", "sparse", "dropped", "ties"):
                acc[name] += s[name]
            for name in ("margin", "tie_margin"):
                acc[name] = min(acc[name], s[name])
            acc["scale"] = max(acc["scale"], s["scale"])
    return per_layer, moved


def check_indexer(m: Weights, per_layer: dict, moved: list[float], rounded: list[float]
                  ) -> list[str]:
    """Failures when a test model's sparse attention is trivial or its choice is fragile (or,
    with index_fp8, when FP8's rounding changes no choice that moves the logits)."""
    failures = []
    if m.cfg.index_fp8 and max(rounded, default=0.0) < MIN_SELECTION_MOVE:
        failures.append(f"FP8's rounding moves the logits by at most {max(rounded, default=0.0):.3g} "
                        f"(relative, against the indexer without it), under {MIN_SELECTION_MOVE:g}")
    for i, s in per_layer.items():
        if s["sparse"] == 0:
            failures.append(f"layer {i}: no query has more than top-{m.cfg.index_topk} keys: the "
                            f"indexer's choice is never exercised")
        elif s["margin"] < MIN_INDEX_GAP:
            failures.append(f"layer {i}: a gap of {s['margin']:.3g} between the top-k-th and the "
                            f"next index score, under {MIN_INDEX_GAP:g}: float32 may choose "
                            f"otherwise")
        if s["tie_margin"] < MIN_INDEX_GAP:
            failures.append(f"layer {i}: a key tied at score 0 at the top-k boundary has a head's "
                            f"q.k of {s['tie_margin']:.3g}, under {MIN_INDEX_GAP:g}: float32 may "
                            f"turn its relu on and break the tie otherwise")
    if max(moved, default=0.0) < MIN_SELECTION_MOVE:
        failures.append(f"the choice moves the logits by at most {max(moved, default=0.0):.3g} "
                        f"(relative), under {MIN_SELECTION_MOVE:g}")
    return failures


def main() -> int:
    ap = logits_arg_parser(ARCH, tokens_required=False)
    ap.add_argument("--routing-stats", action="store_true",
                    help="print routing statistics over compare_logits.py's token lists")
    ap.add_argument("--index-stats", action="store_true",
                    help="deepseek32: print the indexer's statistics over compare_logits.py's "
                         "token lists")
    ap.add_argument("--index-fp8", action="store_true",
                    help="deepseek32: the indexer's q and k rotated and rounded to FP8 as "
                         "DeepSeek's kernels do (duet's DUET_INDEXER=fp8)")
    ap.add_argument("--check", action="store_true",
                    help="with --routing-stats: exit 1 when the routing is trivial; with "
                         "--index-stats: when no query drops keys, a choice is within float32 "
                         "noise of a tie, or the choice does not move the logits")
    args = ap.parse_args()
    if args.index_stats:
        m = load_model(args.model)
        if not m.cfg.sparse:
            print(f"{args.model}: {m.cfg.arch} has no indexer")
            return 1
        m.cfg.index_fp8 = args.index_fp8
        lists = token_lists(m.cfg.vocab_size, parse_lengths(DEFAULT_LENGTHS), 1234)
        print(describe(m))
        rounded: list[float] = []
        per_layer, moved = indexer_stats(m, lists, rounded)
        for i, s in per_layer.items():
            print(f"layer {i}: {s['queries']} queries, {s['sparse']} with more than "
                  f"top-{m.cfg.index_topk} keys ({s['dropped']} keys dropped), {s['ties']} "
                  f"choices decided by a tie (lower position first; smallest |q.k| of a tied "
                  f"key {s['tie_margin']:.3g}), smallest gap {s['margin']:.3g} (largest |score| "
                  f"{s['scale']:.3g})")
        for tokens, r in zip(lists, moved):
            print(f"list of {len(tokens)} tokens: the choice moves the logits by {r:.3g} "
                  f"(relative, against every causal key)")
        for tokens, r in zip(lists, rounded):
            print(f"list of {len(tokens)} tokens: FP8's rounding moves the logits by {r:.3g} "
                  f"(relative, against the indexer without it)")
        return (report(check_indexer(m, per_layer, moved, rounded), "indexer check") if args.check
                else 0)
    if args.routing_stats:
        m = load_model(args.model)
        lists = token_lists(m.cfg.vocab_size, parse_lengths(DEFAULT_LENGTHS), 1234)
        print(describe(m))
        per_layer = routing_stats(m, lists)
        for i, s in per_layer.items():
            print(f"layer {i}: {s['tokens']} tokens, {len(s['sets'])} distinct expert sets, "
                  f"{len(s['used'])}/{m.cfg.n_expert} experts used, group limit changed "
                  f"{s['group_bites']}, bias changed {s['bias_bites']}, fill-sensitive "
                  f"{s['fill_sensitive']}, min top-k margin {s['topk_margin']:.3g}, min group "
                  f"margin {s['group_margin']:.3g}")
        return report(check_routing(m, per_layer), "routing check") if args.check else 0
    if args.tokens is None:
        ap.error("--tokens is required (or --routing-stats)")
    def load(path: str) -> Weights:
        m = load_model(path)
        m.cfg.index_fp8 = args.index_fp8
        return m

    return print_logits(ap, args, load, forward)


if __name__ == "__main__":
    sys.exit(main())
