"""LoRA adapters: duet's logits with a PEFT adapter against the float64 reference run on the
merged weights W + scale * B A (Hugging Face layout, as PEFT's merge_and_unload computes them).

    test_lora.py --duet BUILD/duet --work DIR [--device-map MAP] [--type q8_0 --fast]
                 [--archs llama,qwen2[,qwen3]]

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

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    duet_logits, logits_rows, report, run_command)
import gguf_reader as gr  # noqa: E402
import gguf_to_hf  # noqa: E402
from test_gguf_reader import V, write_gguf  # noqa: E402
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
                  config_extra: dict | None = None) -> dict:
    """A PEFT folder with random A [rank, in] and B [out, rank] for `targets` (layer -> modules);
    returns {(layer, module): (A, B)} as float64, the values the file holds."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors, values = {}, {}
    for layer, modules in targets.items():
        lw = model.layers[layer]
        for m in modules:
            w = getattr(lw, FIELD[m])
            n_out, n_in = w.shape
            a = rng.normal(0, 1 / np.sqrt(n_in), (rank, n_in)).astype(np.float32)
            b = rng.normal(0, 0.15, (n_out, rank)).astype(np.float32)
            name = f"base_model.model.model.layers.{layer}.{PREFIX[m]}.{m}"
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
              "target_modules": sorted({m for ms in targets.values() for m in ms}),
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


def expect_refusal(duet: str, model: str, adapter: str, needle: str, failures: list[str], what: str) -> None:
    proc = subprocess.run([duet, "logits", "--model", model, "--tokens", "1 2", "--lora", adapter],
                          capture_output=True, text=True)
    if proc.returncode == 0 or needle not in proc.stderr:
        failures.append(f"{what}: expected a refusal naming '{needle}', got exit {proc.returncode}: "
                        f"{proc.stderr.strip()[-400:]}")
    else:
        print(f"refused as expected ({what}): {proc.stderr.strip().splitlines()[-1][:200]}")


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
    ap.add_argument("--archs", default="llama,qwen2",
                    help="comma-separated architectures to test: llama, qwen2, qwen3")
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
    if not archs or any(a not in known for a in archs):
        ap.error(f"--archs: each of {archs} must be one of {sorted(known)}")
    cases = [(a, *known[a]) for a in archs]
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
    return report(failures, "LoRA logits against the merged-weight reference")


if __name__ == "__main__":
    sys.exit(main())
