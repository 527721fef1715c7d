"""Write a Hugging Face model folder from a GGUF file: the inverse of llama.cpp's converter, for
testing that duet reads both to the same model.

    gguf_to_hf.py --model F.gguf --out DIR [--shards N] [--mtp]

Written: config.json (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, DeepseekV2ForCausalLM
or DeepseekV3ForCausalLM, from the GGUF hyper-parameters), generation_config.json, the weights as
safetensors (one model.safetensors, or N shards with model.safetensors.index.json), tokenizer.json
(the GGUF vocabulary and merges with the published pre-tokenizer of tokenizer.ggml.pre, from
tests/tokenizer/hf_pre_tokenizers.json) and tokenizer_config.json (BOS/EOS, add_bos_token, the
chat template).

What the converter does, undone:
- names: blk.N.attn_q.weight -> model.layers.N.self_attn.q_proj.weight, ... (table below);
- shapes: GGUF lists the innermost dimension first, safetensors (PyTorch) last;
- llama's attn_q/attn_k rows are permuted back to Hugging Face's layout (llama_reference.py's
  unpermute_rows; qwen2, qwen3 and deepseek2 are stored unpermuted);
- qwen3: head_dim from attention.key_length, attention_bias false, no sliding window
  (use_sliding_window false, sliding_window null, as the released configs), and the per-head
  norms blk.N.attn_{q,k}_norm.weight -> model.layers.N.self_attn.{q,k}_norm.weight;
- rope scaling for llama, qwen2 and qwen3: linear -> {"type": "linear", "factor"}; yarn ->
  {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L} plus "beta_fast" and
  "beta_slow" when the GGUF has yarn_beta_fast/slow, and "attn_factor": a when it has
  yarn_attn_factor. `attn_factor` is vLLM's key (and DeepSeek-R1-0528-Qwen3-8B's): it multiplies
  YaRN's own magnitude 0.1 ln s + 1, as ggml's yarn_attn_factor does; Hugging Face's
  `attention_factor` would replace that magnitude, so it is not what is written. Recent
  transformers versions take the factor from max_position_embeddings /
  original_max_position_embeddings when the latter is given; max_position_embeddings is the
  GGUF's context_length, so a folder matches the GGUF there only when context_length = s * L (as
  in the released configs: 131072 = 4 * 32768);
- deepseek2's stacked experts blk.N.ffn_{gate,up,down}_exps.weight become one tensor per expert,
  model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight.
Tensor bytes are copied as they are (F32, F16 and BF16 have the same bits in both formats), so
the folder holds exactly the GGUF's weights. With --mtp (deepseek2) the folder also gets one
multi-token-prediction layer after the last one (random tensors under V3's MTP names, and
num_nextn_predict_layers 1), which a reader must skip.

safetensors layout (from its specification): an 8-byte little-endian header size, a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded with
spaces to a multiple of 8 bytes, then the data; tensors are laid out largest element size first
so that each starts aligned to its element size.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np

from gguf_reader import GGML_BF16, GGML_F16, GGML_F32, GGUFFile
from llama_reference import unpermute_rows

HERE = os.path.dirname(os.path.abspath(__file__))
PRE_TOKENIZERS = os.path.join(HERE, "..", "tokenizer", "hf_pre_tokenizers.json")

ST_DTYPE = {GGML_F32: ("F32", 4), GGML_F16: ("F16", 2), GGML_BF16: ("BF16", 2)}
TORCH_DTYPE = {0: "float32", 1: "float16", 32: "bfloat16"}

LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
EXPERT_NAMES = {
    "ffn_gate_exps.weight": "gate_proj.weight",
    "ffn_up_exps.weight": "up_proj.weight",
    "ffn_down_exps.weight": "down_proj.weight",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# GGUF token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def f32(x) -> float:
    """A GGUF float32 as the double that reads back as the same float32."""
    return float(np.float32(x))


def config_json(g: GGUFFile) -> dict:
    arch = g.require("general.architecture")
    a = arch + "."
    ft = g.get("general.file_type", 0)
    c: dict = {
        "hidden_size": g.require(a + "embedding_length"),
        "intermediate_size": g.require(a + "feed_forward_length"),
        "num_hidden_layers": g.require(a + "block_count"),
        "num_attention_heads": g.require(a + "attention.head_count"),
        "num_key_value_heads": g.get(a + "attention.head_count_kv", g.require(a + "attention.head_count")),
        "max_position_embeddings": g.require(a + "context_length"),
        "rms_norm_eps": f32(g.require(a + "attention.layer_norm_rms_epsilon")),
        "rope_theta": f32(g.get(a + "rope.freq_base", 10000.0)),
        "vocab_size": g.get(a + "vocab_size", g.tensors["token_embd.weight"].dims[1]),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "torch_dtype": TORCH_DTYPE.get(ft, "float32"),
    }
    for key, gkey in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if gkey in g.metadata:
            c[key] = g.metadata[gkey]
    if arch in ("llama", "qwen2", "qwen3"):
        c["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                               "qwen3": "Qwen3ForCausalLM"}[arch]]
        c["model_type"] = arch
        scaling = g.get(a + "rope.scaling.type", "none")
        if scaling == "linear":
            c["rope_scaling"] = {"type": "linear", "factor": f32(g.require(a + "rope.scaling.factor"))}
        elif scaling == "yarn":
            rs = {"rope_type": "yarn", "factor": f32(g.require(a + "rope.scaling.factor")),
                  "original_max_position_embeddings": g.require(a + "rope.scaling.original_context_length")}
            for key, gkey in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
                              ("attn_factor", "yarn_attn_factor")):
                if a + "rope.scaling." + gkey in g.metadata:
                    rs[key] = f32(g.metadata[a + "rope.scaling." + gkey])
            c["rope_scaling"] = rs
        else:
            c["rope_scaling"] = None
        if arch == "qwen2":
            window = g.get(a + "attention.sliding_window", 0)
            c["use_sliding_window"] = window > 0
            c["sliding_window"] = window if window > 0 else 4096
            c["max_window_layers"] = g.get(a + "attention.max_window_layers", 0)
        if arch == "qwen3":
            c["head_dim"] = g.get(a + "attention.key_length", c["hidden_size"] // c["num_attention_heads"])
            c["attention_bias"] = False
            c["use_sliding_window"] = False
            c["sliding_window"] = None
            c["max_window_layers"] = c["num_hidden_layers"]
        return c
    if arch != "deepseek2":
        raise SystemExit(f"gguf_to_hf.py: architecture {arch} is not handled")
    v3 = g.get(a + "expert_gating_func", 1) == 2
    rope = g.require(a + "rope.dimension_count")
    groups = g.get(a + "expert_group_count", 1)
    c.update({
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "q_lora_rank": g.get(a + "attention.q_lora_rank"),
        "kv_lora_rank": g.require(a + "attention.kv_lora_rank"),
        "qk_nope_head_dim": g.require(a + "attention.key_length") - rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": g.require(a + "attention.value_length"),
        "first_k_dense_replace": g.get(a + "leading_dense_block_count", 0),
        "moe_layer_freq": 1,
        "n_routed_experts": g.get(a + "expert_count"),
        "n_shared_experts": g.get(a + "expert_shared_count", 0),
        "num_experts_per_tok": g.get(a + "expert_used_count"),
        "moe_intermediate_size": g.get(a + "expert_feed_forward_length"),
        "routed_scaling_factor": f32(g.get(a + "expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(g.get(a + "expert_weights_norm", False)),
        "scoring_func": "sigmoid" if v3 else "softmax",
        "topk_method": "noaux_tc" if v3 else ("group_limited_greedy" if groups > 1 else "greedy"),
        "n_group": groups,
        "topk_group": g.get(a + "expert_group_used_count", groups),
        "attention_bias": False,
        "num_nextn_predict_layers": 0,
    })
    if g.get(a + "rope.scaling.type", "none") == "yarn":
        mscale = f32(g.get(a + "rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        c["rope_scaling"] = {
            "type": "yarn", "factor": f32(g.require(a + "rope.scaling.factor")),
            "original_max_position_embeddings": g.require(a + "rope.scaling.original_context_length"),
            "beta_fast": 32, "beta_slow": 1, "mscale": mscale, "mscale_all_dim": mscale,
        }
    else:
        c["rope_scaling"] = None
    return c


def hf_tensors(g: GGUFFile, config: dict) -> dict[str, tuple[str, list[int], np.ndarray]]:
    """HF name -> (safetensors dtype, shape, raw bytes as a uint8 array)."""
    arch = g.require("general.architecture")
    out = {}
    for name, info in g.tensors.items():
        if info.type_id not in ST_DTYPE:
            raise SystemExit(f"gguf_to_hf.py: tensor {name} is {info.type_name}; only F32/F16/BF16 have a "
                             f"safetensors form")
        dtype, size = ST_DTYPE[info.type_id]
        shape = list(info.shape)  # numpy order: GGUF dims reversed
        raw = g.raw(name).reshape(shape[:-1] + [shape[-1] * size]) if len(shape) > 1 else g.raw(name)
        if name in TOP_NAMES:
            out[TOP_NAMES[name]] = (dtype, shape, raw)
            continue
        _, layer, rest = name.split(".", 2)
        prefix = f"model.layers.{layer}."
        if rest in EXPERT_NAMES:
            for e in range(shape[0]):
                out[f"{prefix}mlp.experts.{e}.{EXPERT_NAMES[rest]}"] = (dtype, shape[1:], raw[e])
            continue
        if arch == "llama" and rest in ("attn_q.weight", "attn_k.weight"):
            heads = config["num_attention_heads"] if rest == "attn_q.weight" else config["num_key_value_heads"]
            raw = unpermute_rows(raw, heads)
        out[prefix + LAYER_NAMES[rest]] = (dtype, shape, raw)
    return out


def add_mtp_layer(tensors: dict, config: dict, rng: np.random.Generator) -> None:
    """One DeepSeek-V3 multi-token-prediction layer after the last (names as V3 has them)."""
    n = config["num_hidden_layers"]
    d = config["hidden_size"]
    dtype = tensors["model.embed_tokens.weight"][0]
    size = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    for suffix, shape in (("embed_tokens.weight", [config["vocab_size"], d]), ("enorm.weight", [d]),
                          ("hnorm.weight", [d]), ("eh_proj.weight", [d, 2 * d]),
                          ("shared_head.norm.weight", [d]), ("shared_head.head.weight", [config["vocab_size"], d]),
                          ("input_layernorm.weight", [d]), ("self_attn.kv_a_layernorm.weight", [config["kv_lora_rank"]])):
        count = int(np.prod(shape)) * size
        tensors[f"model.layers.{n}.{suffix}"] = (dtype, shape, rng.integers(0, 256, count, dtype=np.uint8))
    config["num_nextn_predict_layers"] = 1


# Quantized checkpoints (--quant), written from f32 weights. Only the projections inside the layers
# are quantized, as DeepSeek's FP8 and AutoAWQ releases do (embeddings, norms, the router and the
# head stay as they are). Each also has a "dequantized" twin: the same folder with those weights
# as the f32 values the quantized form stands for, which duet must read to (nearly) the same
# logits.
QUANTIZED_SUFFIXES = ("_proj.weight",)
ELEM = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I32": 4}


def e4m3_table() -> np.ndarray:
    """The value of each e4m3 ("fn") code 0..126: the non-negative finite ones, increasing."""
    vals = []
    for code in range(127):
        e, m = code >> 3, code & 7
        vals.append((m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


def to_fp8_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """e4m3 codes, per-block scales (the weight is value * scale) and the dequantized weight."""
    table = e4m3_table()
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    scale = np.zeros((br, bc), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    deq = np.zeros(w.shape, dtype=np.float32)
    for i in range(br):
        for j in range(bc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block].astype(np.float64)
            s = max(float(np.max(np.abs(blk))) / 448.0, 1e-12)
            scale[i, j] = s
            a = np.abs(blk) / float(np.float32(s))
            idx = np.clip(np.searchsorted(table, a), 1, 126)
            nearer_low = (a - table[idx - 1]) <= (table[idx] - a)
            code = np.where(nearer_low, idx - 1, idx)
            code = np.where(a >= table[126], 126, code)
            sign = (blk < 0).astype(np.uint8) << 7
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = code.astype(np.uint8) | sign
            val = table[code] * np.where(blk < 0, -1.0, 1.0)
            deq[i * block:(i + 1) * block, j * block:(j + 1) * block] = (val * float(np.float32(s))).astype(np.float32)
    return codes, scale, deq


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def to_awq(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """AutoAWQ's GEMM layout for a [out, in] weight: qweight [in, out/8], qzeros [in/group, out/8]
    (int32, eight nibbles in AWQ's order), scales fp16 [in/group, out], and the dequantized weight."""
    out, inp = w.shape
    wt = w.T.astype(np.float64).reshape(inp // group, group, out)
    lo, hi = wt.min(axis=1), wt.max(axis=1)
    scale = np.maximum((hi - lo) / 15.0, 1e-8).astype(np.float16)
    s = scale.astype(np.float64)
    zero = np.clip(np.round(-lo / s), 0, 15).astype(np.int64)
    q = np.clip(np.round(wt / s[:, None, :]) + zero[:, None, :], 0, 15).astype(np.int64).reshape(inp, out)
    deq = ((q.reshape(inp // group, group, out) - zero[:, None, :]) * s[:, None, :]).reshape(inp, out).T

    def pack(m: np.ndarray) -> np.ndarray:
        packed = np.zeros((m.shape[0], m.shape[1] // 8), dtype=np.uint32)
        for i, col in enumerate(AWQ_ORDER):
            packed |= (m[:, col::8].astype(np.uint32) << np.uint32(4 * i))
        return packed.view(np.int32)

    return pack(q), pack(zero), scale, deq.astype(np.float32)


def quantize_tensors(tensors: dict, config: dict, quant: str, dequantized: bool) -> None:
    """Replaces the f32 projections of `tensors` by their FP8 / AWQ form (or, with dequantized,
    by the f32 values those stand for) and records quantization_config in `config`."""
    for name in list(tensors):
        dtype, shape, raw = tensors[name]
        if not name.startswith("model.layers.") or not name.endswith(QUANTIZED_SUFFIXES) or len(shape) != 2:
            continue
        if dtype != "F32":
            raise SystemExit("gguf_to_hf.py: --quant needs an f32 model")
        w = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.float32).reshape(shape)
        if quant == "fp8":
            codes, scale, deq = to_fp8_blocks(w, 128)
            if dequantized:
                tensors[name] = ("F32", shape, np.ascontiguousarray(deq).view(np.uint8).reshape(-1))
            else:
                tensors[name] = ("F8_E4M3", shape, np.ascontiguousarray(codes).reshape(-1))
                tensors[name + "_scale_inv"] = ("F32", list(scale.shape), np.ascontiguousarray(scale).view(np.uint8).reshape(-1))
        else:
            qweight, qzeros, scales, deq = to_awq(w, AWQ_GROUP)
            if dequantized:
                tensors[name] = ("F32", shape, np.ascontiguousarray(deq).view(np.uint8).reshape(-1))
            else:
                base = name[: -len(".weight")]
                del tensors[name]
                tensors[base + ".qweight"] = ("I32", list(qweight.shape), np.ascontiguousarray(qweight).view(np.uint8).reshape(-1))
                tensors[base + ".qzeros"] = ("I32", list(qzeros.shape), np.ascontiguousarray(qzeros).view(np.uint8).reshape(-1))
                tensors[base + ".scales"] = ("F16", list(scales.shape), np.ascontiguousarray(scales).view(np.uint8).reshape(-1))
    if not dequantized:
        config["quantization_config"] = (
            {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
            if quant == "fp8" else
            {"quant_method": "awq", "bits": 4, "group_size": AWQ_GROUP, "zero_point": True, "version": "gemm"})


AWQ_GROUP = 32


def write_safetensors(path: str, tensors: dict) -> int:
    names = sorted(tensors, key=lambda k: (-ELEM[tensors[k][0]], k))
    header, offset = {}, 0
    for k in names:
        dtype, shape, raw = tensors[k]
        n = raw.size
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k in names:
            f.write(np.ascontiguousarray(tensors[k][2]).tobytes())
    return offset


def write_weights(out: str, tensors: dict, shards: int) -> None:
    names = list(tensors)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        return
    weight_map, total = {}, 0
    per = -(-len(names) // shards)
    for s in range(shards):
        part = {k: tensors[k] for k in names[s * per:(s + 1) * per]}
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(os.path.join(out, file), part)
        weight_map.update({k: file for k in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def tokenizer_files(g: GGUFFile, out: str) -> None:
    model = g.require("tokenizer.ggml.model")
    tokens = g.require("tokenizer.ggml.tokens")
    types = g.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    with open(PRE_TOKENIZERS, encoding="utf-8") as f:
        sections = json.load(f)
    if model == "gpt2":
        pre = g.get("tokenizer.ggml.pre", "default")
        section = sections[{"default": "gpt2", "gpt-2": "gpt2", "deepseek-r1-qwen": "qwen2", "llama-bpe": "llama3"}.get(pre, pre)]
        merges = g.require("tokenizer.ggml.merges")
    else:
        section = sections["llama-spm"]
        raise SystemExit("gguf_to_hf.py: only byte-level BPE (gpt2) vocabularies are written here")
    vocab, added = {}, []
    for i, (text, t) in enumerate(zip(tokens, types)):
        if t in (CONTROL, USER_DEFINED):
            added.append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": t == USER_DEFINED, "special": t == CONTROL})
        else:
            vocab[text] = i
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": section["normalizer"], "pre_tokenizer": section["pre_tokenizer"], "post_processor": None,
        "decoder": section["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [m.split(" ", 1) for m in merges]},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tc: dict = {"tokenizer_class": "LlamaTokenizerFast", "model_max_length": 16384, "legacy": True}
    for key, gkey in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")):
        if gkey in g.metadata:
            tc[key] = {"__type": "AddedToken", "content": tokens[g.metadata[gkey]], "lstrip": False,
                       "normalized": True, "rstrip": False, "single_word": False}
    tc["add_bos_token"] = bool(g.get("tokenizer.ggml.add_bos_token", False))
    tc["add_eos_token"] = bool(g.get("tokenizer.ggml.add_eos_token", False))
    if "tokenizer.chat_template" in g.metadata:
        tc["chat_template"] = g.metadata["tokenizer.chat_template"]
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=2)


def write_folder(model: str, out: str, shards: int = 1, mtp: bool = False, quant: str | None = None,
                 dequantized: bool = False) -> dict:
    g = GGUFFile(model)
    os.makedirs(out, exist_ok=True)
    config = config_json(g)
    tensors = hf_tensors(g, config)
    if mtp:
        add_mtp_layer(tensors, config, np.random.default_rng(5))
    if quant:
        quantize_tensors(tensors, config, quant, dequantized)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    gen = {"do_sample": True, "temperature": 0.6, "top_p": 0.95}
    if "bos_token_id" in config:
        gen["bos_token_id"] = config["bos_token_id"]
    if "eos_token_id" in config:
        gen["eos_token_id"] = config["eos_token_id"]
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    write_weights(out, tensors, shards)
    tokenizer_files(g, out)
    return config


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--quant", choices=["fp8", "awq"], help="write the projections as FP8 blocks or AWQ int4")
    ap.add_argument("--dequantized", action="store_true", help="with --quant: the f32 values they stand for")
    args = ap.parse_args(argv)
    write_folder(args.model, args.out, args.shards, args.mtp, args.quant, args.dequantized)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
