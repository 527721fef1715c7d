"""LoRA adapters: duet's logits with a PEFT adapter against the float64 reference run on the
merged weights W + scale * B A (Hugging Face layout, as PEFT's merge_and_unload computes them).

    test_lora.py --duet BUILD/duet --work DIR [--device-map MAP] [--type q8_0 --fast]
                 [--archs llama,qwen2[,qwen3][,deepseek2]] [--merge-self-test]

For llama (`duet make-model --preset tiny`, a GGUF whose q/k rows are in llama.cpp's permuted
order, and the Hugging Face folder written from it, whose rows are not) and qwen2
(`--preset qwen2-tiny`), and with `--archs` naming qwen3 for qwen3 (`--preset qwen3-tiny`: the
adapters on q_proj/k_proj act before the per-head q/k norms, q rows n_head * head_dim !=
n_embd, YaRN; not in the default list, see main()), it writes PEFT adapter folders here (adapter_config.json and
adapter_model.safetensors under PEFT's tensor names) with random A and B:
  - rank 4, lora_alpha 8 (scale 2), every projection of every layer, F32;
  - rank 8, use_rslora with lora_alpha 16 (scale 16 / sqrt 8), q_proj and v_proj of layer 0 and
    down_proj of the last layer only, BF16 (the reference reads the rounded values);
and a GGUF adapter as llama.cpp's convert_lora_to_gguf writes it (rank 4, adapter.lora.alpha 12,
F16, blk.N.attn_q.weight.lora_a/lora_b, llama's q/k B rows permuted as the converter permutes
them, so that duet must undo that for the Hugging Face folder; exact path only);
and compares `duet logits --lora DIR` with the reference on the merged weights over token lists
of lengths 1, 7 and 40, every position and logit, with compare_logits.py's metric and bound
(1e-4 relative on the exact path, an f32 KV cache). So that the test can fail, every adapter must
move the base model's logits by more than 100 times the bound, and duet without the adapter
must still equal the base reference. With --device-map, duet runs the layers where the map says
(the adapter's matrices go with their layers). With --type q8_0 --fast the base models are Q8_0
and duet runs its fast path (DUET_MATMUL=fast: int8 activations, and the adapters' matrices as
Q8_0 with the rank padded to 32), against the bound of the other fast comparisons, 5e-2
(measured: see tests/reference/README.md); the adapter must still move the logits by 10 times
the bound.

Refusals checked (a clear error naming the problem, exit non-zero): a B matrix of the wrong
shape, a tensor of a module duet does not apply (embed_tokens), DoRA, a missing
adapter_model.safetensors, a GGUF model given as an adapter, a GGUF adapter of another
architecture.

deepseek2 (`--archs deepseek2`, not in the default list; see run_deepseek2()): `--preset
deepseek2-tiny-v2` (direct query, softmax router), `deepseek2-tiny-v3` (q_lora, sigmoid router with
groups), the v3 file written with `--split-mla` from the same seed (attn_k_b/attn_v_b instead
of attn_kv_b; f32/f16/bf16 only) and `deepseek32-tiny` (DeepSeek-V3.2: v3 with the lightning
indexer, whose own projections take no adapter; measured 1.7e-6 at worst). PEFT modules under HF modeling_deepseek's names, each updating
the GGUF tensor DS2_MODULES names: self_attn.q_proj (V2) or q_a_proj and q_b_proj (V3),
kv_a_proj_with_mqa, kv_b_proj (in the split layout: each head's nope rows, transposed, into
attn_k_b, its v rows into attn_v_b), o_proj; mlp.gate/up/down_proj on the leading dense layers,
mlp.shared_experts.gate/up/down_proj on the MoE layers; and the routed experts,
mlp.experts.E.gate/up/down_proj on the MoE layers, into slab E of the stacked
ffn_gate_exps/ffn_up_exps/ffn_down_exps (GGUF dims [in, out, experts]; DS2_EXPERT_MODULES).
Adapters: rank 4 (scale 2) on every one of them on every layer (every routed expert's three
included), F32; rank 8 rsLoRA (scale 16 / sqrt 8) on q_proj or q_b_proj and kv_b_proj of layer 0,
and shared_experts.down_proj, experts.0.gate_proj, experts.0.down_proj and experts.3.down_proj of
the last layer, BF16. The reference is deepseek2_reference.py on the file with W + scale * B A
merged into those GGUF tensors in float64 (MergedGGUF: the reference's own loader reads them, so
the split layout goes through its own attn_k_b/attn_v_b -> kv_b_proj assembly; the merged expert
tensors take the place of its ExpertTensor). Before duet's LoRA runs, self-tests of the merge
(also alone with --merge-self-test, which needs no LoRA support in duet): every updated reference
weight is HF's W + scale * B A and no other weight moved (the routed experts expert by expert);
merging -scale * B A back gives the file's tensors; B = 0 leaves the logits bit for bit; the two
layouts of one seed hold the same weights, their merges the same tensors but kv_b's (the routed
experts' bit for bit) and their merged models the same logits (1e-12); each adapter moves the
logits by more than 100 times the bound, and so does its routed-expert part alone; no model's
router, merged or not, has a top-k or group margin below 1e-5 over the token lists (duet's
float32 routers are about 1e-6 from the reference's, so on the exact path an expert flip is a
defect, not noise; an adapter on a layer's experts leaves that layer's routing alone, the router
reading the normalised input, but moves the later layers'); and (f32) duet WITHOUT an adapter on
the merged weights written as a GGUF (its own loader, split layout included) matches the
reference within the bound, so that a failure of the LoRA comparison is the LoRA's. duet then
runs every model without and with each adapter, exact path, 1e-4. Refusals: a routed expert's
module on a dense layer (mlp.experts.0.gate_proj on layer 0, message with "experts" and "layer
0"), and mlp.gate_proj on a MoE layer (message naming gate_proj and the layer). No --fast (int8
activations flip these tiny models' experts, see README.md) and no GGUF adapter for deepseek2.

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    duet_logits, logits_rows, report, run_command)
import gguf_reader as gr  # noqa: E402
import gguf_to_hf  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402
import deepseek2_reference  # noqa: E402
import llama_reference  # noqa: E402
import qwen2_reference  # noqa: E402
import qwen3_reference  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REL_TOL = 1e-4  # --fast: 5e-2
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FIELD = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
         "gate_proj": "w_gate", "up_proj": "w_up", "down_proj": "w_down"}
PREFIX = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest even), returned as the uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_adapter(out: str, model, rank: int, alpha: float, targets: dict[int, list[str]], seed: int,
                  dtype: str = "F32", rslora: bool = False, extra: dict | None = None,
                  config_extra: dict | None = None,
                  shape_of: Callable[[int, str], tuple[int, int]] | None = None) -> dict:
    """A PEFT folder with random A [rank, in] and B [out, rank] for `targets` (layer -> modules);
    returns {(layer, module): (A, B)} as float64, the values the file holds. A module is llama's
    short name (q_proj: self_attn.q_proj, gate_proj: mlp.gate_proj) with its shape from `model`'s
    weights, or, with `shape_of(layer, module) -> (out, in)`, the path under the layer
    (self_attn.kv_b_proj, mlp.shared_experts.down_proj: deepseek2)."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors, values = {}, {}
    for layer, modules in targets.items():
        for m in modules:
            if shape_of is None:
                n_out, n_in = getattr(model.layers[layer], FIELD[m]).shape
                path = f"{PREFIX[m]}.{m}"
            else:
                n_out, n_in = shape_of(layer, m)
                path = m
            a = rng.normal(0, 1 / np.sqrt(n_in), (rank, n_in)).astype(np.float32)
            b = rng.normal(0, 0.15, (n_out, rank)).astype(np.float32)
            name = f"base_model.model.model.layers.{layer}.{path}"
            for suffix, x in (("lora_A", a), ("lora_B", b)):
                if dtype == "BF16":
                    bits = to_bf16(x)
                    x = from_bf16(bits)
                    raw = bits.view(np.uint8).reshape(-1)
                else:
                    raw = x.view(np.uint8).reshape(-1)
                tensors[f"{name}.{suffix}.weight"] = (dtype, list(x.shape), raw)
                if suffix == "lora_A":
                    a = x
                else:
                    b = x
            values[(layer, m)] = (a.astype(np.float64), b.astype(np.float64))
    for k, v in (extra or {}).items():
        tensors[k] = v
    gguf_to_hf.write_safetensors(os.path.join(out, "adapter_model.safetensors"), tensors)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora,
              "target_modules": sorted({m.split(".")[-1] for ms in targets.values() for m in ms}),
              "bias": "none", "fan_in_fan_out": False, "lora_dropout": 0.0,
              "base_model_name_or_path": "tiny", "task_type": "CAUSAL_LM"}
    config.update(config_extra or {})
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return values


GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def write_gguf_adapter(path: str, model, arch: str, rank: int, alpha: float, seed: int) -> dict:
    """A GGUF LoRA adapter over every projection, F16, as llama.cpp's converter writes it; returns
    {(layer, module): (A, B)} in Hugging Face's layout, the values the file holds."""
    rng = np.random.default_rng(seed)
    tensors, values = [], {}
    for layer, lw in enumerate(model.layers):
        for m in MODULES:
            n_out, n_in = getattr(lw, FIELD[m]).shape
            a = rng.normal(0, 1 / np.sqrt(n_in), (rank, n_in)).astype(np.float16)
            b = rng.normal(0, 0.15, (n_out, rank)).astype(np.float16)
            values[(layer, m)] = (a.astype(np.float64), b.astype(np.float64))
            stored_b = b
            if arch == "llama" and m in ("q_proj", "k_proj"):
                heads = model.cfg.n_head if m == "q_proj" else model.cfg.n_head_kv
                stored_b = llama_reference.permute_rows(b, heads)
            name = f"blk.{layer}.{GGUF_NAMES[m]}.weight"
            tensors.append((name + ".lora_a", [n_in, rank], 1, np.ascontiguousarray(a).tobytes()))
            tensors.append((name + ".lora_b", [rank, n_out], 1, np.ascontiguousarray(stored_b).tobytes()))
    kv = {"general.architecture": V(gr.T_STRING, arch), "general.type": V(gr.T_STRING, "adapter"),
          "adapter.type": V(gr.T_STRING, "lora"), "adapter.lora.alpha": V(gr.T_FLOAT32, alpha)}
    write_gguf(path, kv, tensors)
    return values


def merged_logits(reference, path: str, values: dict, scale: float, tokens: list[int]) -> np.ndarray:
    m = reference.load_model(path)
    for (layer, module), (a, b) in values.items():
        lw = m.layers[layer]
        w = getattr(lw, FIELD[module])
        setattr(lw, FIELD[module], w + scale * torch.from_numpy(b @ a))
    with torch.no_grad():
        return reference.forward(m, tokens).numpy()


def compare(duet: np.ndarray, ref: np.ndarray) -> float:
    """max over positions of max|duet - ref| / (1 + max|ref|), and the argmax check."""
    worst = 0.0
    for p in range(ref.shape[0]):
        bound = REL_TOL * (1 + np.abs(ref[p]).max())
        err = np.abs(duet[p] - ref[p]).max()
        worst = max(worst, err / (1 + np.abs(ref[p]).max()))
        best = int(np.argmax(ref[p]))
        got = int(np.argmax(duet[p]))
        if got != best and ref[p][best] - ref[p][got] > 2 * bound:
            return float("inf")
    return worst


DEVICE_MAP: list[str] = []


def duet_logits_lora(duet: str, model: str, adapter: str | None, tokens: list[int], vocab: int) -> np.ndarray:
    cmd = [duet, "logits", "--model", model, "--tokens", " ".join(map(str, tokens)), "--top", str(vocab),
           "--all-positions", "--kv-cache-dtype", "f32"] + DEVICE_MAP
    if adapter:
        cmd += ["--lora", adapter]
    lines = [line.strip() for line in run_command(cmd).splitlines() if line.strip().startswith("{")]
    return logits_rows(lines, vocab, len(tokens))


def expect_refusal(duet: str, model: str, adapter: str, needle: str, failures: list[str], what: str,
                   pattern: str | None = None) -> None:
    """duet logits with the adapter must fail with `needle` in its message (and, with `pattern`, a
    match of that regular expression too)."""
    proc = subprocess.run([duet, "logits", "--model", model, "--tokens", "1 2", "--lora", adapter],
                          capture_output=True, text=True)
    if proc.returncode == 0 or needle not in proc.stderr or (pattern and not re.search(pattern, proc.stderr)):
        want = f"'{needle}'" + (f" and /{pattern}/" if pattern else "")
        failures.append(f"{what}: expected a refusal naming {want}, got exit {proc.returncode}: "
                        f"{proc.stderr.strip()[-400:]}")
    else:
        print(f"refused as expected ({what}): {proc.stderr.strip().splitlines()[-1][:200]}")


# -- deepseek2 ---------------------------------------------------------------------------------
#
# PEFT module (its path under model.layers.N, Hugging Face modeling_deepseek's names) -> the GGUF
# tensor blk.N.<name>.weight it updates (llama.cpp's names; deepseek2's rows are not permuted)
# and the deepseek2_reference LayerWeights field that the reference builds from that tensor (HF's
# weight, [out, in]). kv_b_proj updates attn_kv_b, or in the split layout attn_k_b (W_UK^T per
# head) and attn_v_b (W_UV); both hold the reference's wkv_b.
DS2_MODULES = {
    "self_attn.q_proj": ("attn_q", "wq"),
    "self_attn.q_a_proj": ("attn_q_a", "wq_a"),
    "self_attn.q_b_proj": ("attn_q_b", "wq_b"),
    "self_attn.kv_a_proj_with_mqa": ("attn_kv_a_mqa", "wkv_a"),
    "self_attn.kv_b_proj": ("attn_kv_b", "wkv_b"),
    "self_attn.o_proj": ("attn_output", "wo"),
    "mlp.gate_proj": ("ffn_gate", "w_gate"),  # the leading dense layers only
    "mlp.up_proj": ("ffn_up", "w_up"),
    "mlp.down_proj": ("ffn_down", "w_down"),
    "mlp.shared_experts.gate_proj": ("ffn_gate_shexp", "sh_gate"),  # the MoE layers
    "mlp.shared_experts.up_proj": ("ffn_up_shexp", "sh_up"),
    "mlp.shared_experts.down_proj": ("ffn_down_shexp", "sh_down"),
}
# A routed expert's module, mlp.experts.E.<proj> on a MoE layer, updates slab E of the stacked
# tensor blk.N.<name>.weight (GGUF dims [in, out, experts]: numpy shape [E, out, in]), which the
# reference reads as the LayerWeights field's [e] (deepseek2_reference.ExpertTensor).
DS2_EXPERT_MODULES = {"gate_proj": ("ffn_gate_exps", "exp_gate"), "up_proj": ("ffn_up_exps", "exp_up"),
                      "down_proj": ("ffn_down_exps", "exp_down")}
DS2_EXPERT_RE = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)")
DS2_FIELDS = ["wq", "wq_a", "wq_b", "wkv_a", "wkv_b", "wo", "w_gate", "w_up", "w_down", "sh_gate", "sh_up",
              "sh_down", "attn_norm", "q_a_norm", "kv_a_norm", "ffn_norm", "router", "router_bias"]
# The smallest router margin (top-k and group boundaries, over the test's token lists) the merged
# models may have: duet's float32 router scores differ from the float64 reference's by about 1e-6,
# so a margin far above that cannot flip an expert on the exact path, and a flip is a defect.
DS2_MIN_ROUTER_MARGIN = 1e-5


def ds2_expert(module: str) -> tuple[int, str] | None:
    """(E, "gate_proj" | "up_proj" | "down_proj") of a routed expert's module, else None."""
    m = DS2_EXPERT_RE.fullmatch(module)
    return (int(m.group(1)), m.group(2)) if m else None


def ds2_layer_modules(cfg, layer: int) -> list[str]:
    """Every module the contract updates on this layer (see DS2_MODULES and DS2_EXPERT_MODULES):
    on a MoE layer the shared experts' and every routed expert's."""
    mods = ["self_attn.q_a_proj", "self_attn.q_b_proj"] if cfg.q_lora_rank else ["self_attn.q_proj"]
    mods += ["self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", "self_attn.o_proj"]
    if not cfg.is_moe_layer(layer):
        mods += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    else:
        if cfg.n_expert_shared:
            mods += ["mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"]
        mods += [f"mlp.experts.{e}.{proj}" for e in range(cfg.n_expert) for proj in DS2_EXPERT_MODULES]
    return mods


def ds2_shape_of(cfg) -> Callable[[int, str], tuple[int, int]]:
    """(out, in) of a module, Hugging Face's shapes from the config (not from the file, whose
    layout may be split): also the dense MLP's and a routed expert's on any layer, for the
    refusals."""
    d, H, qhd = cfg.n_embd, cfg.n_head, cfg.q_head_dim
    sh, fe = cfg.n_ff_exp * cfg.n_expert_shared, cfg.n_ff_exp
    shapes = {
        "self_attn.q_proj": (H * qhd, d), "self_attn.q_a_proj": (cfg.q_lora_rank, d),
        "self_attn.q_b_proj": (H * qhd, cfg.q_lora_rank),
        "self_attn.kv_a_proj_with_mqa": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d),
        "self_attn.kv_b_proj": (H * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
        "self_attn.o_proj": (d, H * cfg.v_head_dim),
        "mlp.gate_proj": (cfg.n_ff, d), "mlp.up_proj": (cfg.n_ff, d), "mlp.down_proj": (d, cfg.n_ff),
        "mlp.shared_experts.gate_proj": (sh, d), "mlp.shared_experts.up_proj": (sh, d),
        "mlp.shared_experts.down_proj": (d, sh),
    }

    def shape_of(layer: int, module: str) -> tuple[int, int]:
        if module.startswith("mlp.experts."):  # mlp.experts.E.gate_proj
            return (d, fe) if module.endswith("down_proj") else (fe, d)
        return shapes[module]
    return shape_of


class MergedGGUF(gr.GGUFFile):
    """A GGUF file whose tensor(name) returns the float64 values in `merged` where it has them
    (deepseek2_reference.load_model reads its weights through tensor(); its routed experts it
    reads slab by slab through raw(), so ds2_load_merged puts MergedExperts in their place)."""

    def __init__(self, path: str, merged: dict[str, np.ndarray]):
        super().__init__(path)
        self.merged = merged

    def tensor(self, name: str) -> np.ndarray:
        if name in self.merged:
            return self.merged[name]
        return super().tensor(name)


class MergedExperts:
    """A merged stacked expert tensor [E, out, in] (float64) in the place of the reference's
    ExpertTensor: [e] is expert e's matrix, as ExpertTensor's."""

    def __init__(self, w: np.ndarray):
        self.w, self.shape = w, w.shape

    def __getitem__(self, e: int) -> torch.Tensor:
        if not 0 <= e < self.shape[0]:
            raise IndexError(f"expert {e} of {self.shape[0]}")
        return torch.from_numpy(self.w[e])


def ds2_merge(g: gr.GGUFFile, values: dict, scale: float) -> dict[str, np.ndarray]:
    """The GGUF tensors the adapter updates, W + scale * B A in float64, by llama.cpp's names: the
    contract duet's C++ implements. kv_b_proj's delta [H * (nope + v), kv_lora] goes, head by head,
    to attn_kv_b, or in the split layout its nope rows transposed to attn_k_b [H, kv_lora, nope] and
    its v rows to attn_v_b [H, v, kv_lora]. mlp.experts.E.<proj>'s delta [out, in] goes to slab E of
    ffn_<proj>_exps [E, out, in] (GGUF dims [in, out, E]: element (E, o, i) at (E * out + o) * in + i).
    A module whose tensor the file lacks raises KeyError."""
    cfg = deepseek2_reference.read_config(g)
    merged: dict[str, np.ndarray] = {}

    def weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in merged:
            if name not in g.tensors:
                raise KeyError(f"{g.path} has no tensor {name}")
            merged[name] = np.array(g.tensor(name), dtype=np.float64)  # a copy
        if merged[name].shape != shape:
            raise ValueError(f"{name} is {merged[name].shape}, the delta needs {shape}")
        return merged[name]

    H, nope, vd, r = cfg.n_head, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    for (layer, module), (a, b) in sorted(values.items()):
        delta = scale * (b @ a)
        p = f"blk.{layer}."
        expert = ds2_expert(module)
        if expert is not None:
            e, proj = expert
            name = p + DS2_EXPERT_MODULES[proj][0] + ".weight"
            if name not in g.tensors:
                raise KeyError(f"{g.path} has no tensor {name} (layer {layer} is not a MoE layer)")
            n_expert = g.tensors[name].shape[0]
            if not 0 <= e < n_expert:
                raise ValueError(f"{module}: {name} has {n_expert} experts")
            weight(name, (n_expert, *delta.shape))[e] += delta
        elif module == "self_attn.kv_b_proj" and p + "attn_kv_b.weight" not in g.tensors:
            per_head = delta.reshape(H, nope + vd, r)
            weight(p + "attn_k_b.weight", (H, r, nope))[...] += per_head[:, :nope, :].transpose(0, 2, 1)
            weight(p + "attn_v_b.weight", (H, vd, r))[...] += per_head[:, nope:, :]
        else:
            weight(p + DS2_MODULES[module][0] + ".weight", delta.shape)[...] += delta
    return merged


def ds2_load_merged(path: str, values: dict, scale: float):
    """deepseek2_reference's model of the file with the adapter merged into its GGUF tensors (the
    merged routed experts' stacked tensors as MergedExperts)."""
    merged = ds2_merge(gr.GGUFFile(path), values, scale)
    m = deepseek2_reference.load_model(MergedGGUF(path, merged))
    for i, lw in enumerate(m.layers):
        for tensor, field in DS2_EXPERT_MODULES.values():
            name = f"blk.{i}.{tensor}.weight"
            if name in merged:
                setattr(lw, field, MergedExperts(merged[name]))
    return m


def ds2_expert_weights(m, layer: int, field: str) -> list[torch.Tensor]:
    """Every routed expert's matrix of one stacked tensor of a MoE layer."""
    return [getattr(m.layers[layer], field)[e] for e in range(m.cfg.n_expert)]


def ds2_write_merged(path: str, values: dict, scale: float, out: str) -> None:
    """A copy of the f32 GGUF file `path` with the merged tensors (rounded to f32) written over
    its own: a model duet reads without an adapter."""
    g = gr.GGUFFile(path)
    merged = ds2_merge(g, values, scale)
    shutil.copyfile(path, out)
    with open(out, "r+b") as f:
        for name, w in merged.items():
            info = g.tensors[name]
            if info.type_id != gr.GGML_F32 or g.byte_order != "<":
                raise ValueError(f"{path}: {name} is not a little-endian F32 tensor")
            f.seek(g.data_offset + info.offset)
            f.write(np.ascontiguousarray(w, dtype="<f4").tobytes())


def ds2_logits(m, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return deepseek2_reference.forward(m, tokens).numpy()


def ds2_self_test(label: str, path: str, base, values: dict, scale: float, failures: list[str]) -> None:
    """The merge checked without duet's LoRA: through the reference's own loader (which builds wkv_b
    from attn_k_b/attn_v_b in the split layout), every updated weight is HF's W + scale * B A and
    every other weight is unchanged (the routed experts expert by expert: those of the adapter
    hold W_e + scale * B A, the others are the file's); merging -scale * B A back gives the file's
    tensors again; and an adapter whose B is zero changes no logit."""
    merged_m = ds2_load_merged(path, values, scale)
    want, want_exp = {}, {}
    for (layer, module), (a, b) in values.items():
        expert = ds2_expert(module)
        if expert is None:
            want[(layer, DS2_MODULES[module][1])] = scale * torch.from_numpy(b @ a)
        else:
            want_exp[(layer, DS2_EXPERT_MODULES[expert[1]][1], expert[0])] = scale * torch.from_numpy(b @ a)
    unused = set(want_exp)
    for i, (lb, lm) in enumerate(zip(base.layers, merged_m.layers)):
        for f in DS2_FIELDS:
            wb, wm = getattr(lb, f), getattr(lm, f)
            if wb is None or wm is None:
                if (wb is None) != (wm is None) or (i, f) in want:
                    failures.append(f"{label}: layer {i} {f}: missing after the merge")
                continue
            d = want.get((i, f), torch.zeros_like(wb))
            err = float((wm - wb - d).abs().max())
            if not err <= 1e-12 * (1 + float(wb.abs().max()) + float(d.abs().max())):
                failures.append(f"{label}: layer {i} {f}: merged - base differs from scale * B A by {err:.2e}")
        for _, f in DS2_EXPERT_MODULES.values():  # the routed experts, expert by expert
            if getattr(lb, f) is None or getattr(lm, f) is None:
                if getattr(lb, f) is not getattr(lm, f):
                    failures.append(f"{label}: layer {i} {f}: missing after the merge")
                continue
            for e, (wb, wm) in enumerate(zip(ds2_expert_weights(base, i, f), ds2_expert_weights(merged_m, i, f))):
                unused.discard((i, f, e))
                d = want_exp.get((i, f, e), torch.zeros_like(wb))
                err = float((wm - wb - d).abs().max())
                if not err <= 1e-12 * (1 + float(wb.abs().max()) + float(d.abs().max())):
                    failures.append(f"{label}: layer {i} {f}[{e}]: merged - base differs from scale * B A by "
                                    f"{err:.2e}")
    if unused:
        failures.append(f"{label}: routed experts of the adapter not in the merged model: {sorted(unused)}")
    g = gr.GGUFFile(path)
    once = MergedGGUF(path, ds2_merge(g, values, scale))
    back = ds2_merge(once, values, -scale)
    for name, w in back.items():
        orig = g.tensor(name).astype(np.float64)
        err = float(np.abs(w - orig).max())
        if not err <= 1e-12 * (1 + float(np.abs(orig).max())):
            failures.append(f"{label}: {name} merged and un-merged differs from the file by {err:.2e}")
    zero_b = {k: (a, np.zeros_like(b)) for k, (a, b) in values.items()}
    tokens = list(range(0, base.cfg.vocab_size, max(1, base.cfg.vocab_size // 9)))
    if not np.array_equal(ds2_logits(ds2_load_merged(path, zero_b, scale), tokens), ds2_logits(base, tokens)):
        failures.append(f"{label}: an adapter with B = 0 changes the reference's logits")


def ds2_router_margins(m, token_lists: list[list[int]]) -> tuple[float, str]:
    """The smallest top-k / group margin of the model's routers over the token lists, and where."""
    worst, where = math.inf, "no MoE layer"
    for layer, s in deepseek2_reference.routing_stats(m, token_lists).items():
        for name in ("topk_margin", "group_margin"):
            if s[name] < worst:
                worst, where = s[name], f"layer {layer} {name}"
    return worst, where


def run_deepseek2(args, failures: list[str]) -> None:
    """deepseek2 (MLA + MoE): PEFT adapters on every module of the contract (DS2_MODULES and the
    routed experts' DS2_EXPERT_MODULES), on --preset deepseek2-tiny-v2 (direct query),
    deepseek2-tiny-v3 (q_lora) and the v3 file in the split-MLA layout (same seed, so the same
    weights), against deepseek2_reference.py on the merged GGUF tensors; the merge self-tests
    first; then the refusals."""
    work = args.work
    models = {}
    # v32: DeepSeek-V3.2 (deepseek32-tiny: v3 plus the indexer, which has no adapter modules; the
    # adapted q_a_proj moves the indexer's query, so the positions chosen, too).
    layouts = [("v2", "deepseek2-tiny-v2", []), ("v3", "deepseek2-tiny-v3", []), ("v32", "deepseek32-tiny", [])]
    if args.type in ("f32", "f16", "bf16"):
        layouts.append(("v3_split", "deepseek2-tiny-v3", ["--split-mla"]))
    else:  # attn_k_b's rows are qk_nope_head_dim (16 on the presets): no 32-blocks
        print(f"deepseek2: no split-MLA model in {args.type} (attn_k_b's rows of 16 are not whole blocks)")
    for name, preset, extra in layouts:
        path = os.path.join(work, f"deepseek2-{name}.gguf")
        run_command([args.duet, "make-model", "--preset", preset, "--type", args.type, "--seed", "21", "-o", path]
                    + extra)
        models[name] = path
    base = {name: deepseek2_reference.load_model(path) for name, path in models.items()}
    # The two layouts of one seed hold the same weights (the reference builds wkv_b from both).
    for i, (l3, ls) in enumerate(zip(base["v3"].layers, base["v3_split"].layers) if "v3_split" in base else []):
        for f in DS2_FIELDS:
            x, y = getattr(l3, f), getattr(ls, f)
            if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
                failures.append(f"deepseek2: v3 and v3 --split-mla differ in layer {i} {f}: the split-MLA "
                                "checks below would compare different models")
        for _, f in DS2_EXPERT_MODULES.values():
            if (getattr(l3, f) is None) != (getattr(ls, f) is None) or (getattr(l3, f) is not None and not all(
                    torch.equal(x, y) for x, y in zip(ds2_expert_weights(base["v3"], i, f),
                                                      ds2_expert_weights(base["v3_split"], i, f)))):
                failures.append(f"deepseek2: v3 and v3 --split-mla differ in layer {i} {f} (routed experts)")
    rng = np.random.default_rng(25)
    token_lists = [rng.integers(0, base["v2"].cfg.vocab_size, size=n).tolist() for n in (1, 7, 40)]
    # (name, rank, alpha, targets(cfg), dtype, rslora, scale). rank4: every module on every layer,
    # every routed expert's gate/up/down_proj included; rank8: a few modules, among them three of
    # two routed experts (0 and 3) of the last layer only (an adapter may cover some experts and
    # some layers).
    adapter_specs = [
        ("rank4", 4, 8.0, lambda c: {l: ds2_layer_modules(c, l) for l in range(c.n_layer)}, "F32", False, 2.0),
        ("rank8_rslora_bf16", 8, 16.0,
         lambda c: {0: ["self_attn.q_b_proj" if c.q_lora_rank else "self_attn.q_proj", "self_attn.kv_b_proj"],
                    c.n_layer - 1: ["mlp.shared_experts.down_proj", "mlp.experts.0.down_proj",
                                    "mlp.experts.0.gate_proj", "mlp.experts.3.down_proj"]},
         "BF16", True, 16.0 / np.sqrt(8)),
    ]
    # One adapter folder per config (v3's serves both v3 layouts): {model: [(name, folder, values, scale)]}
    adapters: dict[str, list] = {}
    for cfg_name in ("v2", "v3", "v32"):
        cfg = base[cfg_name].cfg
        for name, rank, alpha, targets, dtype, rslora, scale in adapter_specs:
            folder = os.path.join(work, f"deepseek2-{cfg_name}-{name}")
            values = write_adapter(folder, None, rank, alpha, targets(cfg), seed=len(name) * 7 + rank, dtype=dtype,
                                   rslora=rslora, shape_of=ds2_shape_of(cfg))
            for model in ((cfg_name, "v3_split") if cfg_name == "v3" and "v3_split" in models else (cfg_name,)):
                adapters.setdefault(model, []).append((name, folder, values, scale))

    # The merge, checked without duet.
    n_before = len(failures)
    refs: dict[tuple[str, str], list[np.ndarray]] = {}
    for model, path in models.items():
        base_refs = [ds2_logits(base[model], t) for t in token_lists]
        refs[(model, "")] = base_refs
        margin, where = ds2_router_margins(base[model], token_lists)
        print(f"deepseek2 {model} without an adapter: smallest router margin {margin:.2e} ({where})")
        if margin < DS2_MIN_ROUTER_MARGIN:
            failures.append(f"deepseek2 {model}: a router margin of {margin:.2e} ({where}) is too close to a tie "
                            "for the comparison (choose other token lists)")
        for name, _, values, scale in adapters[model]:
            label = f"deepseek2 {model} {name}"
            ds2_self_test(label, path, base[model], values, scale, failures)
            m = ds2_load_merged(path, values, scale)
            refs[(model, name)] = [ds2_logits(m, t) for t in token_lists]
            moved = max(np.abs(r - b).max() / (1 + np.abs(b).max()) for r, b in zip(refs[(model, name)], base_refs))
            margin, where = ds2_router_margins(m, token_lists)
            print(f"{label}: the adapter moves the logits by {moved:.2e}; smallest router margin {margin:.2e} "
                  f"({where})")
            if moved < 100 * REL_TOL:
                failures.append(f"{label}: the adapter moves the logits by only {moved:.2e}: the test could not "
                                "tell it from none")
            if margin < DS2_MIN_ROUTER_MARGIN:
                failures.append(f"{label}: a router margin of {margin:.2e} ({where}) is too close to a tie for "
                                "the comparison (choose another adapter seed)")
            # The routed experts' part alone must move the logits too, or duet could skip it unseen.
            experts_only = {k: v for k, v in values.items() if ds2_expert(k[1]) is not None}
            if experts_only:
                me = ds2_load_merged(path, experts_only, scale)
                moved_e = max(np.abs(ds2_logits(me, t) - b).max() / (1 + np.abs(b).max())
                              for t, b in zip(token_lists, base_refs))
                print(f"{label}: its {len(experts_only)} routed-expert modules alone move the logits by {moved_e:.2e}")
                if moved_e < 100 * REL_TOL:
                    failures.append(f"{label}: the routed experts' part moves the logits by only {moved_e:.2e}: the "
                                    "test could not tell it from none")
            if args.type == "f32":
                # duet without an adapter on the merged weights written as a GGUF (its own loader, the
                # split layout's too): the comparison below can pass, so a failure there is the LoRA's.
                merged_path = os.path.join(work, f"deepseek2-{model}-{name}-merged.gguf")
                ds2_write_merged(path, values, scale, merged_path)
                mm = deepseek2_reference.load_model(merged_path)
                vocab = mm.cfg.vocab_size
                err = max(compare(duet_logits_lora(args.duet, merged_path, None, t, vocab), ds2_logits(mm, t))
                          for t in token_lists)
                print(f"{label}: duet on the merged weights as an f32 GGUF, no adapter: {err:.2e}")
                if err > REL_TOL:
                    failures.append(f"{label}: duet on the merged weights as an f32 GGUF (no adapter) is {err:.2e} "
                                    f"from the reference > {REL_TOL:.0e}: the merge or the routing margins are wrong")
    for name, _, values, scale in (adapters["v3"] if "v3_split" in models else []):
        # The split layout changes only where kv_b_proj's delta goes: every other merged tensor
        # (the routed experts' included) is the kv_b layout's, bit for bit.
        m3 = ds2_merge(gr.GGUFFile(models["v3"]), values, scale)
        ms = ds2_merge(gr.GGUFFile(models["v3_split"]), values, scale)
        for n in sorted(set(m3) | set(ms)):
            if "attn_kv_b" in n or "attn_k_b" in n or "attn_v_b" in n:
                continue
            if n not in m3 or n not in ms or not np.array_equal(m3[n], ms[n]):
                failures.append(f"deepseek2 {name}: the split-MLA merge's {n} differs from the kv_b merge's")
        for t, x, y in zip(token_lists, refs[("v3", name)], refs[("v3_split", name)]):
            err = float(np.abs(x - y).max())
            if not err <= 1e-12 * (1 + float(np.abs(x).max())):
                failures.append(f"deepseek2 {name}: the split-MLA merge's logits differ from the kv_b merge's by "
                                f"{err:.2e} ({len(t)} tokens)")
    print(f"deepseek2 merge self-tests: {'passed' if len(failures) == n_before else 'FAILED'}")
    if args.merge_self_test:
        return

    # duet against the merged reference.
    for model, path in models.items():
        vocab = base[model].cfg.vocab_size
        for name, folder, _, _ in [("no adapter", None, None, None)] + adapters[model]:
            for tokens, ref in zip(token_lists, refs[(model, "" if folder is None else name)]):
                label = f"deepseek2 {os.path.basename(path)} {name}, {len(tokens)} tokens"
                try:
                    got = duet_logits_lora(args.duet, path, folder, tokens, vocab)
                except RuntimeError as e:
                    failures.append(f"{label}: {e}")
                    if "not yet for deepseek2" in str(e):
                        return  # this build has no deepseek2 LoRA: one failure says it
                    break  # the other token lists would fail the same way
                err = compare(got, ref)
                print(f"{label}: {err:.2e} (bound {REL_TOL:.0e})")
                if err > REL_TOL:
                    failures.append(f"{label}: {err:.2e} > {REL_TOL:.0e}")

    # The refusals: a routed expert's module on a dense layer (layer 0: both presets have
    # leading_dense_block_count 1), and the dense MLP's module on a MoE layer.
    for model in ("v2", "v3"):
        cfg = base[model].cfg
        moe = cfg.n_dense_lead
        if cfg.is_moe_layer(0):
            failures.append(f"deepseek2 {model}: layer 0 is a MoE layer: no dense layer for the refusal")
            continue
        folder = os.path.join(work, f"deepseek2-{model}-bad-expert-on-dense")
        write_adapter(folder, None, 4, 8.0, {0: ["self_attn.o_proj", "mlp.experts.0.gate_proj"],
                                             moe: ["mlp.experts.0.gate_proj"]}, seed=5, shape_of=ds2_shape_of(cfg))
        expect_refusal(args.duet, models[model], folder, "experts", failures,
                       f"deepseek2 {model}: mlp.experts.0.gate_proj on dense layer 0", pattern=r"\blayer 0\b")
    cfg = base["v3"].cfg
    moe = cfg.n_dense_lead
    folder = os.path.join(work, "deepseek2-v3-bad-dense-on-moe")
    write_adapter(folder, None, 4, 8.0, {0: ["mlp.gate_proj"], moe: ["mlp.gate_proj"]}, seed=6,
                  shape_of=ds2_shape_of(cfg))
    expect_refusal(args.duet, models["v3"], folder, "gate_proj", failures,
                   f"deepseek2 v3: mlp.gate_proj on MoE layer {moe}", pattern=rf"layers?[ .]{moe}\b")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duet", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device-map")
    ap.add_argument("--type", default="f32")
    ap.add_argument("--fast", action="store_true")
    # qwen3 (preset qwen3-tiny) is prepared but not in the default list, so that the existing
    # ctest lines keep their meaning; run it with --archs qwen3 (its own ctest line). Measured
    # once: exact 1.4e-7 to 8.6e-7, fast Q8_0 up to 3.7e-2, two CPU devices as exact.
    # deepseek2 (presets deepseek2-tiny-v2/-v3, and v3 --split-mla) likewise: --archs deepseek2.
    ap.add_argument("--archs", default="llama,qwen2",
                    help="comma-separated architectures to test: llama, qwen2, qwen3, deepseek2")
    ap.add_argument("--merge-self-test", action="store_true",
                    help="deepseek2: only the checks of the merge (no LoRA support needed in duet)")
    args = ap.parse_args()
    if args.device_map:
        DEVICE_MAP.extend(["--device-map", args.device_map])
    global REL_TOL
    if args.fast:
        REL_TOL = 5e-2
    os.environ["DUET_MATMUL"] = "fast" if args.fast else "exact"
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    failures: list[str] = []
    rng = np.random.default_rng(5)
    known = {"llama": ("tiny", llama_reference), "qwen2": ("qwen2-tiny", qwen2_reference),
             "qwen3": ("qwen3-tiny", qwen3_reference)}
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    if not archs or any(a not in known and a != "deepseek2" for a in archs):
        ap.error(f"--archs: each of {archs} must be one of {sorted(known) + ['deepseek2']}")
    if "deepseek2" in archs and args.fast:
        ap.error("deepseek2 has no fast-path comparison: int8 activations flip the tiny models' experts "
                 "(see tests/reference/README.md)")
    if args.merge_self_test and archs != ["deepseek2"]:
        ap.error("--merge-self-test is for --archs deepseek2")
    cases = [(a, *known[a]) for a in archs if a != "deepseek2"]
    for arch, preset, reference in cases:
        base = os.path.join(args.work, f"{arch}.gguf")
        run_command([args.duet, "make-model", "--preset", preset, "--type", args.type, "--seed", "21", "-o", base])
        models = [base]
        if arch == "llama" and not args.fast:
            folder = os.path.join(args.work, "llama-hf")
            gguf_to_hf.main(["--model", base, "--out", folder])
            models.append(folder)
        m = reference.load_model(base)
        n_layer, vocab = len(m.layers), m.cfg.vocab_size
        adapters = [
            ("rank4", 4, 8.0, {l: MODULES for l in range(n_layer)}, "F32", False, 2.0),
            ("rank8_rslora_bf16", 8, 16.0, {0: ["q_proj", "v_proj"], n_layer - 1: ["down_proj"]}, "BF16", True,
             16.0 / np.sqrt(8)),
        ]
        gguf_adapter = os.path.join(args.work, f"{arch}-lora.gguf")
        gguf_values = write_gguf_adapter(gguf_adapter, m, arch, 4, 12.0, seed=99)
        for length in (1, 7, 40):
            tokens = rng.integers(0, vocab, size=length).tolist()
            with torch.no_grad():
                base_ref = reference.forward(m, tokens).numpy()
            for model in models:
                plain = compare(duet_logits_lora(args.duet, model, None, tokens, vocab), base_ref)
                if plain > REL_TOL:
                    failures.append(f"{arch} {os.path.basename(model)} without an adapter, {length} tokens: "
                                    f"{plain:.2e} from the base reference")
            for name, rank, alpha, targets, dtype, rslora, scale in adapters:
                folder = os.path.join(args.work, f"{arch}-{name}")
                values = write_adapter(folder, m, rank, alpha, targets, seed=len(name) * 7 + rank, dtype=dtype,
                                       rslora=rslora)
                ref = merged_logits(reference, base, values, scale, tokens)
                moved = np.abs(ref - base_ref).max() / (1 + np.abs(base_ref).max())
                if moved < 10 * REL_TOL:
                    failures.append(f"{arch} {name}: the adapter moves the logits by only {moved:.2e}: the test "
                                    "could not tell it from none")
                for model in models:
                    err = compare(duet_logits_lora(args.duet, model, folder, tokens, vocab), ref)
                    label = f"{arch} {os.path.basename(model)} {name}, {length} tokens"
                    print(f"{label}: {err:.2e} (bound {REL_TOL:.0e}; the adapter moves the logits by {moved:.2e})")
                    if err > REL_TOL:
                        failures.append(f"{label}: {err:.2e} > {REL_TOL:.0e}")
            # Not on the fast path: its int8 activations err in proportion to what they carry, and
            # this adapter (scale 3 on every projection) moves the logits further than the fast
            # bound was measured for (9e-2 at 40 tokens); the PEFT adapters cover the fast path.
            ref = merged_logits(reference, base, gguf_values, 12.0 / 4, tokens)
            for model in ([] if args.fast else models):
                err = compare(duet_logits_lora(args.duet, model, gguf_adapter, tokens, vocab), ref)
                label = f"{arch} {os.path.basename(model)} GGUF adapter, {length} tokens"
                print(f"{label}: {err:.2e} (bound {REL_TOL:.0e})")
                if err > REL_TOL:
                    failures.append(f"{label}: {err:.2e} > {REL_TOL:.0e}")
        if arch == "llama" and not args.fast:
            lw = m.layers[0]
            q_out, n_in = lw.wq.shape
            bad = os.path.join(args.work, "bad-shape")
            write_adapter(bad, m, 4, 8.0, {0: ["q_proj"]}, seed=1,
                          extra={"base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight":
                                 ("F32", [4, n_in], np.zeros((4, n_in), np.float32).view(np.uint8).reshape(-1)),
                                 "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight":
                                 ("F32", [q_out + 2, 4], np.zeros((q_out + 2, 4), np.float32).view(np.uint8).reshape(-1))})
            expect_refusal(args.duet, base, bad, "layers.1.self_attn.k_proj.lora_B.weight", failures, "a wrong shape")
            embed = os.path.join(args.work, "bad-embed")
            write_adapter(embed, m, 4, 8.0, {0: ["q_proj"]}, seed=2,
                          extra={"base_model.model.model.embed_tokens.lora_A.weight":
                                 ("F32", [4, vocab], np.zeros((4, vocab), np.float32).view(np.uint8).reshape(-1))})
            expect_refusal(args.duet, base, embed, "embed_tokens", failures, "an embedding adapter")
            dora = os.path.join(args.work, "bad-dora")
            write_adapter(dora, m, 4, 8.0, {0: ["q_proj"]}, seed=3, config_extra={"use_dora": True})
            expect_refusal(args.duet, base, dora, "use_dora", failures, "DoRA")
            missing = os.path.join(args.work, "bad-missing")
            write_adapter(missing, m, 4, 8.0, {0: ["q_proj"]}, seed=4)
            os.remove(os.path.join(missing, "adapter_model.safetensors"))
            expect_refusal(args.duet, base, missing, "adapter_model.safetensors", failures, "no weights")
            expect_refusal(args.duet, base, base, "is not a LoRA adapter", failures, "a model file as the adapter")
            other = os.path.join(args.work, "qwen2-for-llama.gguf")
            write_gguf(other, {"general.architecture": V(gr.T_STRING, "qwen2"), "general.type": V(gr.T_STRING, "adapter"),
                               "adapter.type": V(gr.T_STRING, "lora")}, [])
            expect_refusal(args.duet, base, other, "is for qwen2, the model is llama", failures, "another architecture's")
    if "deepseek2" in archs:
        run_deepseek2(args, failures)
    return report(failures, "LoRA logits against the merged-weight reference")


if __name__ == "__main__":
    sys.exit(main())
