"""duet reads a GGUF file and the Hugging Face folder written from it (gguf_to_hf.py) to the same
model: the same logits and the same token ids.

    test_hf_folder.py --duet BUILD/duet --model F.gguf --work DIR [--shards N] [--mtp]
                      [--rel-tol X] [--lengths 1,2,7,33]
    test_hf_folder.py --duet BUILD/duet --model F.gguf --folder DIR [--quant fp8|awq] [--rel-tol X]
                      [--fp8-as-q8-0]

1. Writes DIR/folder from F.gguf (config.json, generation_config.json, safetensors: one file or N
   shards with an index, tokenizer.json, tokenizer_config.json).
2. `duet logits --top VOCAB --all-positions` on both, over random token lists (the 7-long one holds
   the first and the last id). The folder's weights are the file's bits, so for qwen2, qwen3 and
   deepseek2 the printed logits must be identical, character for character. llama is the one
   exception: a llama GGUF stores q/k rows permuted for adjacent-pair rope, the folder keeps
   Hugging Face's order and duet rotates halves there (duet.rope.layout = neox), so q.k sums its
   products in another order; --rel-tol bounds that difference (max |a - b| / (1 + max |a|) per
   position) and the argmax must agree.
3. `duet tokenize` (plain, --add-special, --parse-special) on a few texts: the same ids.
4. `duet inspect` on the folder, and with --mtp that it reports the skipped layer.

With --quant fp8|awq the comparison is another one: the folder holds the projections as FP8 blocks
(e4m3, one scale per 128 x 128) or AWQ int4 (group 32, zero points), and its twin holds them as the
f32 values those stand for (e4m3 value times scale, rounded once to f32). Both run with
DUET_MATMUL=exact (f32 activations). duet keeps FP8 as it is and decodes it exactly in the kernels,
to the twin's very values, so the logits must be identical (and `duet inspect` must list the
projections as fp8_e4m3_b128). AWQ becomes Q4_1 at load, and with --fp8-as-q8-0
(DUET_FP8=q8_0) FP8 becomes Q8_0: what remains then is that conversion, FP8's rounding to 8 bits
per 32 values (at most half a step of the block's largest value), AWQ's minimum rounded to fp16.
--rel-tol bounds it (the argmax is not compared: a random model's top logits can be closer than
that rounding); the converted folder must not give the twin's logits exactly (the conversion
ran).

With --folder the folder is not written here but given (`duet make-model --format hf` from the
same preset and seed as F.gguf); with --quant too, it is a quantized folder compared with F.gguf
in f32 (DUET_MATMUL=exact on both), so the bound covers the quantization itself as well.
Exit: 0 pass, 1 failure, 77 when numpy or torch is not importable (skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# First: it exits 77 without numpy and torch (gguf_to_hf uses llama_reference's permutation).
from reference_common import (  # noqa: E402
    duet_logits, logits_row, parse_lengths, report, run_command, token_lists)
from gguf_reader import GGUFFile  # noqa: E402
from gguf_to_hf import AWQ_ORDER, config_json, e4m3_table, hf_tensors, write_folder  # noqa: E402

import numpy as np  # noqa: E402

TEXTS = [
    "Hello world! def quicksort(xs):\n    return sorted(xs)  # 12345 67",
    "  leading spaces, trailing\t\n\n tabs and 3.14159 numbers 1000000",
    "中文的句子，还有日本語のテキスト。 한국어 문장",
    "émigré naïve café — “quotes” ‘and’ 🤖 emoji",
]


def read_folder_tensors(folder: str) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of the folder's safetensors (one file or the index's shards): name ->
    (dtype, shape, raw bytes), read here with the format's specification, not duet's reader."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        with open(os.path.join(folder, name), "rb") as f:
            blob = f.read()
        size = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + size])
        base = 8 + size
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], blob[base + b:base + e])
    return out


def check_quantized_weights(model: str, folder: str, quant: str, group: int) -> list[str]:
    """Each quantized projection of the folder, decoded here (e4m3 codes times the block scale;
    AWQ's (q - zero) * scale in its packing order), against the GGUF file's f32 weight: within
    half a step of the format (e4m3: 1/16 of the value, or half the smallest subnormal step, times
    the block's scale; AWQ: half the group's scale, and its rounding to fp16 at the range's end)."""
    g = GGUFFile(model)
    want = hf_tensors(g, config_json(g))
    got = read_folder_tensors(folder)
    problems, checked = [], 0
    table = e4m3_table()
    for name, (dtype, shape, raw) in want.items():
        if not name.startswith("model.layers.") or not name.endswith("_proj.weight") or len(shape) != 2:
            continue
        w = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.float32).reshape(shape).astype(np.float64)
        rows, cols = shape
        if quant == "fp8":
            if name not in got or got[name][0] != "F8_E4M3" or name + "_scale_inv" not in got:
                problems.append(f"{name}: not stored as F8_E4M3 with {name}_scale_inv")
                continue
            codes = np.frombuffer(got[name][2], dtype=np.uint8).reshape(shape)
            scale = np.frombuffer(got[name + "_scale_inv"][2], dtype=np.float32).astype(np.float64)
            scale = scale.reshape(-(-rows // 128), -(-cols // 128))
            s = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:rows, :cols]
            mag = codes & 0x7F
            if np.any(mag == 0x7F):
                problems.append(f"{name}: NaN codes")
                continue
            deq = table[mag] * np.where(codes & 0x80, -1.0, 1.0) * s
            bound = np.maximum(np.abs(w) / 16.0, s * 2.0 ** -10) * 1.0001 + 1e-12
        else:
            base = name[: -len(".weight")]
            if base + ".qweight" not in got:
                problems.append(f"{name}: no {base}.qweight")
                continue

            def unpack(m: np.ndarray) -> np.ndarray:
                out = np.zeros((m.shape[0], m.shape[1] * 8), dtype=np.int64)
                u = m.view(np.uint32)
                for i, col in enumerate(AWQ_ORDER):
                    out[:, col::8] = (u >> np.uint32(4 * i)) & 0xF
                return out

            q = unpack(np.frombuffer(got[base + ".qweight"][2], dtype=np.int32).reshape(cols, rows // 8))
            z = unpack(np.frombuffer(got[base + ".qzeros"][2], dtype=np.int32).reshape(cols // group, rows // 8))
            sc = np.frombuffer(got[base + ".scales"][2], dtype=np.float16).astype(np.float64).reshape(cols // group, rows)
            s = np.repeat(sc, group, axis=0)  # [in, out]
            deq = ((q - np.repeat(z, group, axis=0)) * s).T
            # The scale rounded to fp16 may be below (max - min) / 15: the 15 steps then fall short
            # of the range by up to 15 times that rounding (2^-11), and the clamp at 15 shows it.
            bound = (0.5 + 15 * 2.0 ** -11) * s.T * 1.0001 + 1e-12
        err = np.abs(deq - w)
        if np.any(err > bound):
            i = np.unravel_index(int(np.argmax(err - bound)), err.shape)
            problems.append(f"{name}: weight {i} decodes to {deq[i]:.6g}, the GGUF has {w[i]:.6g} (bound {bound[i]:.3g})")
        checked += 1
    if checked == 0:
        problems.append("no quantized projection was found to check")
    print(f"weights: {checked} quantized projections decoded within their format's rounding")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duet", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", help="where the folder is written (without --folder)")
    ap.add_argument("--folder", help="compare this folder instead of writing one")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--rel-tol", type=float, default=0.0, help="0: the logits must be identical")
    ap.add_argument("--lengths", default="1,2,7,33")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quant", choices=["fp8", "awq"])
    ap.add_argument("--awq-group", type=int, default=32, help="with --folder --quant awq: its group size")
    ap.add_argument("--fp8-as-q8-0", action="store_true", help="with --quant fp8: DUET_FP8=q8_0 (converted at load)")
    args = ap.parse_args(argv)
    # FP8 kept as it is and decoded exactly (the default), or converted to Q8_0 at load.
    exact_fp8 = args.quant == "fp8" and not args.fp8_as_q8_0
    if args.fp8_as_q8_0:
        os.environ["DUET_FP8"] = "q8_0"

    if args.folder:
        folder = args.folder
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if args.quant:
            os.environ["DUET_MATMUL"] = "exact"
    else:
        if not args.work:
            ap.error("--work is needed without --folder")
        folder = os.path.join(args.work, "folder")
        shutil.rmtree(folder, ignore_errors=True)
        config = write_folder(args.model, folder, args.shards, args.mtp, args.quant)
    if args.quant and not args.folder:
        # The twin with the dequantized values takes the GGUF file's place; f32 activations on both.
        twin = os.path.join(args.work, "dequantized")
        shutil.rmtree(twin, ignore_errors=True)
        write_folder(args.model, twin, args.shards, args.mtp, args.quant, dequantized=True)
        args.model = twin
        os.environ["DUET_MATMUL"] = "exact"
    vocab = int(config["vocab_size"])
    failures = []

    worst = 0.0
    for ids in token_lists(vocab, parse_lengths(args.lengths), args.seed):
        n = len(ids)
        # An f32 KV cache: with f16, llama's last-bit differences in k could round to different
        # halves and the bound would measure the cache's rounding, not the weights.
        a = duet_logits(args.duet, args.model, ids, vocab)
        b = duet_logits(args.duet, folder, ids, vocab)
        if len(a) != n or len(b) != n:
            failures.append(f"length {n}: {len(a)} positions from the file, {len(b)} from the folder")
            continue
        for pos, (la, lb) in enumerate(zip(a, b)):
            if la == lb:
                continue
            if args.rel_tol == 0.0:
                failures.append(f"length {n} position {pos}: the logits differ:\n  file   {la[:200]}\n  folder {lb[:200]}")
                break
            ra, rb = logits_row(la, vocab)[1], logits_row(lb, vocab)[1]
            err = float(np.max(np.abs(ra - rb)) / (1.0 + np.max(np.abs(ra))))
            worst = max(worst, err)
            # With --quant the weights differ by the conversion's rounding, and a random model's
            # top logits can be that close: the bound alone is checked there.
            argmax_differs = not args.quant and int(np.argmax(ra)) != int(np.argmax(rb))
            if not err <= args.rel_tol or argmax_differs:
                failures.append(f"length {n} position {pos}: relative error {err:.3g} (bound {args.rel_tol:g}), "
                                f"argmax {int(np.argmax(ra))} vs {int(np.argmax(rb))}")
                break
    print(f"logits: {'identical' if worst == 0.0 else f'max relative difference {worst:.3g}'} over lengths {args.lengths}")
    if args.folder and args.quant:
        failures += check_quantized_weights(args.model, folder, args.quant, args.awq_group)
    if args.quant and worst == 0.0 and not exact_fp8:
        failures.append("the quantized folder gives exactly the dequantized twin's logits: was it converted?")
    if args.quant == "fp8":
        kept = " fp8_e4m3_b128 " in run_command([args.duet, "inspect", folder])
        if kept != exact_fp8:
            failures.append(f"duet inspect lists the folder's projections {'as' if kept else 'not as'} fp8_e4m3_b128 "
                            f"(expected {'FP8 kept' if exact_fp8 else 'Q8_0'})")

    if not args.quant and "tokenizer.ggml.model" in GGUFFile(args.model).metadata:
        bos = GGUFFile(args.model).get("tokenizer.ggml.bos_token_id")
        tokens = GGUFFile(args.model).require("tokenizer.ggml.tokens")
        texts = TEXTS + ([tokens[bos] + TEXTS[0]] if bos is not None else [])
        for text in texts:
            for flags in ([], ["--add-special"], ["--parse-special"]):
                a = run_command([args.duet, "tokenize", "--model", args.model, *flags, text])
                b = run_command([args.duet, "tokenize", "--model", folder, *flags, text])
                if a != b:
                    failures.append(f"tokenize {flags} {text!r}: file {a.strip()[:200]} folder {b.strip()[:200]}")
        print(f"tokenize: {len(texts) * 3} runs compared")

    info = run_command([args.duet, "inspect", folder])
    if "folder: " not in info or "Hugging Face" not in info:
        failures.append(f"duet inspect does not describe the folder:\n{info[:500]}")
    if args.mtp and "duet.hf.mtp_layers_skipped = 1" not in info:
        failures.append("duet inspect does not report the skipped multi-token-prediction layer")

    return report(failures, "folder against GGUF")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
