"""What the references of this folder and the scripts that drive them share, so that each
architecture's file (llama_reference.py, qwen2_reference.py, deepseek2_reference.py) holds only
its own math, and each driver only its own checks.

Importing this module exits 77 (ctest's "skipped") when numpy or torch is not importable; every
script here that needs them imports it first.

For the references:
- `ArchKeys`: general.architecture checked, then the hyper-parameters under its prefix, and the
  vocabulary size (`<arch>.vocab_size`, else the embedding's rows, else the token list's length).
- `TensorLoader`: tensors as float64 torch tensors in numpy shape (GGUF dims reversed), each
  checked for its expected shape; every missing or mismatched tensor is collected before one
  error names them all.
- `Weights` and `decoder_forward`: the pre-norm decoder all three are (Hugging Face's
  DecoderLayer): h = embed[ids]; per layer h += attention(rmsnorm(h)), h += ffn(rmsnorm(h));
  logits = lm_head(rmsnorm(h)), with llama.cpp-style names for every intermediate in `trace`.
  RMSNorm, rotate_half and the SwiGLU MLP are here too.
- `logits_arg_parser` and `print_logits`: the command line `--model F.gguf --tokens "1 2 3"
  [--all-positions]` and its output, one JSON line {"pos": i, "logits": [...]} per position
  (only the last by default); `report` prints the failures of a check and gives its exit code.

For the drivers:
- `token_lists`: the random token lists of compare_logits.py (the 7-long one holds the last and
  the first id of the vocabulary), which deepseek2_reference.py --routing-stats runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

SKIP = 77

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: {os.path.basename(sys.argv[0])} needs numpy and torch under {sys.executable}: "
          f"{e}")
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_reader import GGUFError, GGUFFile  # noqa: E402

DTYPE = torch.float64


# -- reading a GGUF file ----------------------------------------------------------------------

class ArchKeys:
    """The hyper-parameters of a GGUF file under `<arch>.`, once general.architecture is `arch`."""

    def __init__(self, g: GGUFFile, arch: str):
        found = g.require("general.architecture")
        if found != arch:
            raise GGUFError(f"{g.path}: general.architecture is {found!r}, this reference handles "
                            f"'{arch}' only")
        self.g, self.arch = g, arch

    def key(self, name: str) -> Any:
        return self.g.require(f"{self.arch}.{name}")

    def get(self, name: str, default: Any = None) -> Any:
        return self.g.get(f"{self.arch}.{name}", default)

    def has(self, name: str) -> bool:
        return f"{self.arch}.{name}" in self.g.metadata

    def vocab_size(self) -> int:
        if self.has("vocab_size"):
            return int(self.get("vocab_size"))
        if "token_embd.weight" in self.g.tensors:
            return self.g.tensors["token_embd.weight"].dims[1]
        return len(self.g.get("tokenizer.ggml.tokens", []))


class TensorLoader:
    """`t(name, shape)`: the tensor as float64 torch, or None with the problem recorded; `done()`
    raises one error naming every problem."""

    def __init__(self, g: GGUFFile):
        self.g = g
        self.problems: list[str] = []

    def check(self, name: str, shape: tuple[int, ...], optional: bool = False) -> bool:
        if name not in self.g.tensors:
            if not optional:
                self.problems.append(f"tensor '{name}' is missing")
            return False
        got = self.g.tensors[name].shape
        if got != shape:
            self.problems.append(f"tensor '{name}' has shape {list(got)}, expected {list(shape)} "
                                 f"(numpy order, GGUF dims reversed)")
            return False
        return True

    def __call__(self, name: str, shape: tuple[int, ...], optional: bool = False
                 ) -> torch.Tensor | None:
        if not self.check(name, shape, optional):
            return None
        return torch.from_numpy(self.g.tensor(name).astype(np.float64))

    def head(self, tok_embd: torch.Tensor | None, n_embd: int, vocab: int
             ) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
        """(output_norm, lm_head, tied): lm_head is `output.weight`, or the embedding when that
        tensor is absent."""
        out_norm = self("output_norm.weight", (n_embd,))
        tied = "output.weight" not in self.g.tensors
        lm_head = tok_embd if tied else self("output.weight", (vocab, n_embd))
        return out_norm, lm_head, tied

    def done(self) -> None:
        if self.problems:
            raise GGUFError(f"{self.g.path}: " + "; ".join(self.problems))


# -- the decoder ------------------------------------------------------------------------------

@dataclass
class Weights:
    cfg: Any                # the architecture's config (n_layer, rms_eps, vocab_size, ...)
    tok_embd: torch.Tensor  # [vocab, n_embd]
    layers: list            # the architecture's LayerWeights, each with attn_norm and ffn_norm
    out_norm: torch.Tensor
    lm_head: torch.Tensor   # [vocab, n_embd]
    tied: bool


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
           ) -> torch.Tensor:
    return (torch.nn.functional.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


Sublayer = Callable[[torch.Tensor, Any, int], torch.Tensor]  # (normed x, layer weights, index)


def decoder_forward(m: Weights, tokens: list[int], attention: Sublayer, ffn: Sublayer,
                    trace: dict | None = None) -> torch.Tensor:
    """Logits [T, vocab] in float64 for the token ids at positions 0..T-1. With `trace` (a dict),
    the intermediates are stored under llama.cpp-style names ('attn_out-0', 'l_out-1', ...)."""
    cfg = m.cfg
    bad = [t for t in tokens if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ValueError(f"token ids {bad} are outside the vocabulary [0, {cfg.vocab_size})")
    h = m.tok_embd[torch.tensor(tokens, dtype=torch.long)]
    if trace is not None:
        trace["inp_embd"] = h
    for i, lw in enumerate(m.layers):
        a = attention(rms_norm(h, lw.attn_norm, cfg.rms_eps), lw, i)
        h = h + a
        f = ffn(rms_norm(h, lw.ffn_norm, cfg.rms_eps), lw, i)
        if trace is not None:
            trace[f"attn_out-{i}"] = a
            trace[f"ffn_inp-{i}"] = h
            trace[f"ffn_out-{i}"] = f
        h = h + f
        if trace is not None:
            trace[f"l_out-{i}"] = h
    h = rms_norm(h, m.out_norm, cfg.rms_eps)
    if trace is not None:
        trace["result_norm"] = h
    return h @ m.lm_head.T


# -- the command line -------------------------------------------------------------------------

def logits_arg_parser(arch: str, model_required: bool = True, tokens_required: bool = True
                      ) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=f"float64 reference logits of a {arch} GGUF model")
    ap.add_argument("--model", required=model_required, help=f"{arch} GGUF file")
    ap.add_argument("--tokens", required=tokens_required, help='token ids, e.g. "1 2 3"')
    ap.add_argument("--all-positions", action="store_true",
                    help="print every position, not only the last")
    return ap


def print_logits(ap: argparse.ArgumentParser, args: argparse.Namespace,
                 load_model: Callable[[str], Weights],
                 forward: Callable[[Weights, list[int]], torch.Tensor]) -> int:
    """Loads --model and prints the logits of --tokens ("1 2 3" or "1,2,3") as JSON lines."""
    tokens = [int(t) for t in args.tokens.replace(",", " ").split()]
    if not tokens:
        ap.error("--tokens is empty")
    m = load_model(args.model)
    with torch.no_grad():
        logits = forward(m, tokens)
    positions = range(len(tokens)) if args.all_positions else [len(tokens) - 1]
    for p in positions:
        print(json.dumps({"pos": p, "logits": logits[p].tolist()}))
    return 0


def report(failures: list[str], what: str) -> int:
    """Prints every failure and the verdict; the exit code."""
    for f in failures:
        print("FAIL:", f)
    print(f"{what}:", "FAILED" if failures else "passed")
    return 1 if failures else 0


# -- the token lists --------------------------------------------------------------------------

DEFAULT_LENGTHS = "1,2,7,33,100"


def parse_lengths(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def token_lists(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lists = []
    for n in lengths:
        ids = rng.integers(0, vocab, size=n).tolist()
        if n == 7:
            ids[0], ids[-1] = vocab - 1, 0  # the edges of the embedding table
        lists.append(ids)
    return lists
