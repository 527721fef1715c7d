"""`duet quantize` reads a Hugging Face folder as it reads the GGUF file the folder was written
from: quantizing either gives a GGUF file that runs to the same logits and tokenizes the same.

    test_quantize_hf.py --duet BUILD/duet --model F.gguf --work DIR --types q8_0,q4_k[,awq4]
                        [--rel-tol X]

1. Writes DIR/folder from F.gguf with gguf_to_hf.py.
2. For each type: `duet quantize F.gguf` and `duet quantize DIR/folder` to two GGUF files.
3. Every tensor of the two outputs holds the same bytes (for the types the numpy reader sizes:
   F32, F16, Q8_0, Q4_0, Q4_1), and `duet logits --all-positions` gives the same logits over
   random token lists: the folder holds the file's bits, and awq4's calibration sees the same
   activations, so it picks the same scales. A llama folder keeps Hugging Face's q/k row order
   and rotates halves (duet.rope.layout = neox); its output must be back in the GGUF order
   llama.cpp reads, without that key. --rel-tol allows a difference in the logits instead (with
   the same argmax), for when the calibration of a llama folder, which sums q.k in another
   order, lands on other scales.
4. The folder's output carries the tokenizer: `duet tokenize` on it gives F.gguf's ids, and
   `duet generate` (greedy) runs on it.

Exit: 0 pass, 1 failure, 77 when numpy is not importable (skipped).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# First: it exits 77 without numpy and torch (gguf_to_hf uses llama_reference's permutation).
from reference_common import duet_logits, logits_row, report, run_command as run  # noqa: E402
from gguf_reader import GGML_TYPES, GGUFFile  # noqa: E402
from gguf_to_hf import write_folder  # noqa: E402

import numpy as np  # noqa: E402

TEXT = "def quicksort(xs):\n    return sorted(xs)  # Hello world 12345"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duet", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--types", default="q8_0,q4_k")
    ap.add_argument("--rel-tol", type=float, default=0.0, help="0: the logits must be identical")
    ap.add_argument("--seed", type=int, default=99)
    args = ap.parse_args(argv)

    os.makedirs(args.work, exist_ok=True)
    folder = os.path.join(args.work, "folder")
    shutil.rmtree(folder, ignore_errors=True)
    config = write_folder(args.model, folder)
    vocab = int(config["vocab_size"])
    rng = np.random.default_rng(args.seed)
    token_lists = [rng.integers(0, vocab, size=n).tolist() for n in (1, 7, 33)]
    failures = []

    for qtype in args.types.split(","):
        from_file = os.path.join(args.work, f"file-{qtype}.gguf")
        from_folder = os.path.join(args.work, f"folder-{qtype}.gguf")
        run([args.duet, "quantize", args.model, from_file, "--type", qtype, "--threads", "2"])
        run([args.duet, "quantize", folder, from_folder, "--type", qtype, "--threads", "2"])
        a_file, b_file = GGUFFile(from_file), GGUFFile(from_folder)
        if "duet.rope.layout" in b_file.metadata:
            failures.append(f"{qtype}: the folder's output says duet.rope.layout = {b_file.metadata['duet.rope.layout']}")
        compared = 0
        for name, info in a_file.tensors.items():
            other = b_file.tensors.get(name)
            if other is None or other.type_id != info.type_id or other.dims != info.dims:
                failures.append(f"{qtype}: tensor {name} is {info.type_name} {info.dims} from the file, "
                                f"{other.type_name + ' ' + str(other.dims) if other else 'missing'} from the folder")
            elif info.type_id in GGML_TYPES:
                if a_file.raw(name).tobytes() != b_file.raw(name).tobytes() and args.rel_tol == 0.0:
                    failures.append(f"{qtype}: tensor {name} ({info.type_name}) differs between the two outputs")
                compared += 1
        print(f"{qtype}: {compared} of {len(a_file.tensors)} tensors compared byte for byte")
        worst = 0.0
        for ids in token_lists:
            a = duet_logits(args.duet, from_file, ids, vocab)
            b = duet_logits(args.duet, from_folder, ids, vocab)
            if len(a) != len(ids) or len(b) != len(ids):
                failures.append(f"{qtype}: {len(a)} and {len(b)} positions for {len(ids)} tokens")
                continue
            for pos, (la, lb) in enumerate(zip(a, b)):
                if la == lb:
                    continue
                ra, rb = logits_row(la, vocab)[1], logits_row(lb, vocab)[1]
                err = float(np.max(np.abs(ra - rb)) / (1.0 + np.max(np.abs(ra))))
                worst = max(worst, err)
                if args.rel_tol == 0.0 or not err <= args.rel_tol or int(np.argmax(ra)) != int(np.argmax(rb)):
                    failures.append(f"{qtype}, {len(ids)} tokens, position {pos}: relative difference {err:.3g} "
                                    f"(bound {args.rel_tol:g}), argmax {int(np.argmax(ra))} vs {int(np.argmax(rb))}")
                    break
        print(f"{qtype}: logits {'identical' if worst == 0.0 else f'within {worst:.3g}'}")

        want = run([args.duet, "tokenize", "--model", args.model, "--add-special", TEXT])
        got = run([args.duet, "tokenize", "--model", from_folder, "--add-special", TEXT])
        if want != got:
            failures.append(f"{qtype}: tokenize on the folder's output gives {got.strip()[:200]}, want {want.strip()[:200]}")
        gen = subprocess.run([args.duet, "generate", "--model", from_folder, "--prompt", "def f(x):", "--max-tokens", "8",
                              "--temperature", "0", "--ignore-eos"], capture_output=True, text=True)
        if gen.returncode != 0 or not gen.stdout.startswith("def f(x):"):
            failures.append(f"{qtype}: generate on the folder's output failed ({gen.returncode}): {gen.stderr[-500:]}")

    return report(failures, "quantize from a folder")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
