"""What the references of this folder and the scripts that drive them share, so that each
architecture's file (llama_reference.py, qwen2_reference.py, qwen3_reference.py,
deepseek2_reference.py) holds only its own math, and each driver only its own checks.

Importing this module exits 77 (ctest's "skipped") when numpy or torch is not importable; every
script here that needs them imports it first.

For the references:
- `ArchKeys`: general.architecture checked, then the hyper-parameters under its prefix, and the
  vocabulary size (`<arch>.vocab_size`, else the embedding's rows, else the token list's length).
- `TensorLoader`: tensors as float64 torch tensors in numpy shape (GGUF dims reversed), each
  checked for its expected shape; every missing or mismatched tensor is collected before one
  error names them all.
- `Weights` and `decoder_forward`: the pre-norm decoder all four are (Hugging Face's
  DecoderLayer): h = embed[ids]; per layer h += attention(rmsnorm(h)), h += ffn(rmsnorm(h));
  logits = lm_head(rmsnorm(h)), with llama.cpp-style names for every intermediate in `trace`.
  RMSNorm, rotate_half and the SwiGLU MLP are here too.
- `logits_arg_parser` and `print_logits`: the command line `--model F.gguf --tokens "1 2 3"
  [--all-positions]` and its output, one JSON line {"pos": i, "logits": [...]} per position
  (only the last by default); `report` prints the failures of a check and gives its exit code.

For the drivers:
- `token_lists`: the random token lists of compare_logits.py and test_hf_folder.py (the 7-long
  one holds the last and the first id of the vocabulary), which deepseek2_reference.py
  --routing-stats runs too.
- `run_command`, `duet_logits` and `logits_rows`: `duet logits --top VOCAB --all-positions` with
  an f32 KV cache, and its JSON lines read back into a [T, vocab] float64 array, checking that
  every id appears once per position, sorted, and every position once.
- `quantize`, `TinyTensors`, `tiny_models`, `reference_logits`, `float64_tensors` and
  `check_close`: the self-tests' tiny models in every weight type, their loop, and the
  comparison of the reference with a second formulation; `np_rms_norm`, `np_swiglu`,
  `np_attention` and `GgmlRope` (rope angles and magnitudes as ggml's rope_yarn computes them,
  from the GGUF keys read anew), the numpy pieces of those second formulations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator

SKIP = 77

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: {os.path.basename(sys.argv[0])} needs numpy and torch under {sys.executable}: "
          f"{e}")
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as gr  # noqa: E402
from gguf_reader import GGUFError, GGUFFile  # noqa: E402

DTYPE = torch.float64


# -- reading a GGUF file ----------------------------------------------------------------------

class ArchKeys:
    """The hyper-parameters of a GGUF file under `<arch>.`, once general.architecture is `arch`
    (or one of the tuple `arch`, e.g. deepseek2 and deepseek32, each with its own prefix)."""

    def __init__(self, g: GGUFFile, arch: str | tuple[str, ...]):
        archs = (arch,) if isinstance(arch, str) else tuple(arch)
        found = g.require("general.architecture")
        if found not in archs:
            raise GGUFError(f"{g.path}: general.architecture is {found!r}, this reference handles "
                            f"{' or '.join(repr(a) for a in archs)} only")
        self.g, self.arch = g, found

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


# -- duet's logits ----------------------------------------------------------------------------

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


def run_command(cmd: list[str]) -> str:
    """The command's stdout; a RuntimeError with the end of its stderr when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[:4])} ...` exited with {proc.returncode}:\n"
                           f"{proc.stderr.strip()[-3000:]}")
    return proc.stdout


def duet_logits(duet: str, model: str, tokens: list[int], vocab: int,
                threads: int | None = None, kv_dtype: str = "f32") -> list[str]:
    """The JSON lines of `duet logits` with every logit (--top VOCAB) of every position."""
    # An f32 KV cache by default: an f16 one rounds every stored key and value to 11 bits, and the
    # bounds here are for f32 arithmetic (the C++ model tests bound the f16 cache separately). A
    # reference that rounds as the cache does may ask for another (deepseek2's kv_fp8: fp8).
    cmd = [duet, "logits", "--model", model, "--tokens", " ".join(map(str, tokens)),
           "--top", str(vocab), "--all-positions", "--kv-cache-dtype", kv_dtype]
    if threads:
        cmd += ["--threads", str(threads)]
    lines = (line.strip() for line in run_command(cmd).splitlines())
    return [line for line in lines if line.startswith("{")]


def logits_row(line: str, vocab: int) -> tuple[int, np.ndarray]:
    """(pos, logits [vocab]) of one line {"pos", "top": [[id, logit], ...]}, which must hold
    every id once, sorted by logit, descending."""
    obj = json.loads(line)
    pos = obj["pos"]
    dense = np.full(vocab, np.nan)
    seen = np.zeros(vocab, dtype=bool)
    for tok, logit in obj["top"]:
        if not 0 <= tok < vocab:
            raise RuntimeError(f"duet printed token id {tok} at position {pos}, outside the "
                               f"vocabulary of {vocab}")
        if seen[tok]:
            raise RuntimeError(f"duet printed token id {tok} twice at position {pos}")
        seen[tok] = True
        dense[tok] = logit
    if not seen.all():
        raise RuntimeError(f"duet printed {int(seen.sum())} logits at position {pos}, "
                           f"expected all {vocab} (--top {vocab})")
    tops = [l for _, l in obj["top"]]
    if any(a < b for a, b in zip(tops, tops[1:])):
        raise RuntimeError(f"duet's logits at position {pos} are not sorted descending")
    return pos, dense


def logits_rows(lines: list[str], vocab: int, n_positions: int) -> np.ndarray:
    """The lines as a [T, vocab] float64 array; positions 0..T-1 must each appear once."""
    rows = dict(logits_row(line, vocab) for line in lines)
    if sorted(rows) != list(range(n_positions)) or len(lines) != n_positions:
        raise RuntimeError(f"duet printed positions {[json.loads(l)['pos'] for l in lines]}, "
                           f"expected 0..{n_positions - 1}")
    return np.stack([rows[p] for p in range(n_positions)])


# -- the self-tests ----------------------------------------------------------------------------

def quantize(x: np.ndarray, type_name: str) -> tuple[int, bytes]:
    """float32 matrix -> (ggml type, raw bytes), rounding the way llama.cpp's reference
    quantizers do; the exact values do not matter here, both sides read the same bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if type_name == "f32":
        return gr.GGML_F32, x.astype("<f4").tobytes()
    if type_name == "f16":
        return gr.GGML_F16, x.astype("<f2").tobytes()
    if type_name == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        return gr.GGML_BF16, ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
    b = x.reshape(-1, 32)
    if type_name == "q8_0":
        d = np.abs(b).max(1) / 127
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
        blocks = np.zeros(len(b), np.dtype([("d", "<f2"), ("qs", "i1", (32,))]))
        blocks["d"] = d.astype(np.float16)
        blocks["qs"] = np.round(b * inv[:, None]).astype(np.int8)
        return gr.GGML_Q8_0, blocks.tobytes()
    if type_name == "q4_0":
        m = b[np.arange(len(b)), np.abs(b).argmax(1)]
        d = m / -8
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.round(b * inv[:, None]) + 8, 0, 15).astype(np.uint8)
        blocks = np.zeros(len(b), np.dtype([("d", "<f2"), ("qs", "u1", (16,))]))
        blocks["d"] = d.astype(np.float16)
        blocks["qs"] = q[:, :16] | (q[:, 16:] << 4)
        return gr.GGML_Q4_0, blocks.tobytes()
    raise ValueError(type_name)


class TinyTensors:
    """The tensors of a tiny random model, for test_gguf_reader.write_gguf: `add(name, shape, std,
    center)` draws center + std * N(0, 1) in numpy shape, stored in f32 for vectors (norms,
    biases) and in the model's type for the rest, unless `type_name` says otherwise."""

    def __init__(self, type_name: str, seed: int):
        self.type_name = type_name
        self.rng = np.random.default_rng(seed)
        self.tensors: list = []

    def add(self, name: str, shape: tuple[int, ...], std: float, center: float = 0.0,
            type_name: str | None = None) -> None:
        x = (center + std * self.rng.standard_normal(shape)).astype(np.float32)
        t, raw = quantize(x, type_name or ("f32" if len(shape) == 1 else self.type_name))
        self.tensors.append((name, list(reversed(shape)), t, raw))


def tiny_models(cases: list[tuple[str, int, dict]], write_model: Callable[..., None],
                token_seed: int, n_tokens: int, vocab: int = 96
                ) -> Iterator[tuple[str, str, dict, list[int]]]:
    """For each (type, seed, overrides): writes the model into a temporary folder, which lives
    while the caller iterates, and yields (tag, path, overrides, tokens): n_tokens random ids,
    then the first and the last id of the vocabulary."""
    rng = np.random.default_rng(token_seed)
    with tempfile.TemporaryDirectory() as tmp:
        for type_name, seed, over in cases:
            path = os.path.join(tmp, f"tiny_{type_name}_{seed}.gguf")
            write_model(path, type_name, seed, **over)
            tokens = rng.integers(0, vocab, size=n_tokens).tolist() + [0, vocab - 1]
            yield f"{type_name} {over or 'defaults'}", path, over, tokens


def reference_logits(reference: Any, path: str, tokens: list[int], trace: dict | None = None
                     ) -> tuple[Weights, np.ndarray]:
    """The model a reference module loads from `path`, and its logits [T, vocab] of `tokens`."""
    m = reference.load_model(path)
    with torch.no_grad():
        return m, reference.forward(m, tokens, trace).numpy()


def float64_tensors(g: GGUFFile) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized, as float64 numpy (for the second formulations)."""
    return {name: g.tensor(name).astype(np.float64) for name in g.tensors}


# The second formulations' numpy pieces: one token at a time, float64, written apart from the
# torch code above.

def np_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * w


def np_swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    g = gate @ x
    return down @ (g / (1 + np.exp(-g)) * (up @ x))


def np_attention(q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray], n_rep: int
                 ) -> np.ndarray:
    """One position's attention, head by head: q [H, d] against the cached keys and values (one
    [H_kv, d] per position), query head h reading kv head h // n_rep, softmax of q.k / sqrt(d)."""
    n_head, d = q.shape
    out = np.zeros((n_head, d))
    for head in range(n_head):
        kvh = head // n_rep
        s = np.array([q[head] @ k[kvh] for k in keys]) / np.sqrt(d)
        e = np.exp(s - s.max())
        e /= e.sum()
        out[head] = sum(e[j] * values[j][kvh] for j in range(len(values)))
    return out


class GgmlRope:
    """The rope of an `arch` GGUF file the way llama.cpp/ggml computes it, for the second
    formulations: the keys are read here again (not through a reference's config), and
    `cos_sin(pos)` gives the n_dims/2 pairs' cos and sin as ggml's rope_yarn does, pair index i
    (i0 = 2i in ggml):

        theta_extrap = pos * theta_scale^i,  theta_scale = base^(-2/n_dims)
        theta_interp = freq_scale * theta_extrap            (freq_scale = 1 / factor)
        ext_factor 0 (none, linear): theta = theta_interp, mscale = attn_factor
        ext_factor 1 (yarn): ramp_mix = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)
                             theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
                             mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale))
        cos = cos(theta) * mscale,  sin = sin(theta) * mscale

    with lo = max(0, floor(corr(beta_fast))), hi = min(n_dims - 1, ceil(corr(beta_slow))),
    corr(n_rot) = n_dims * ln(n_ctx_orig / (n_rot * 2 pi)) / (2 ln base) (ggml's
    rope_yarn_corr_dims). Which pairs a rope rotates (2i, 2i+1) or (i, i + n_dims/2) is the
    caller's."""

    def __init__(self, g: GGUFFile, arch: str, n_dims: int):
        def get(name: str, default: Any = None) -> Any:
            return g.get(f"{arch}.{name}", default)
        self.n_dims = n_dims
        self.base = float(get("rope.freq_base", 10000.0))
        kind = get("rope.scaling.type", "none")
        factor = 1.0
        if kind in ("linear", "yarn"):
            factor = float(get("rope.scaling.factor"))
        elif kind == "none" and get("rope.scale_linear") is not None:
            factor = float(get("rope.scale_linear"))
        self.freq_scale = 1.0 / factor
        self.ext_factor = 1.0 if kind == "yarn" else 0.0
        self.attn_factor = float(get("rope.scaling.yarn_attn_factor", 1.0))
        self.lo = self.hi = 0.0
        if kind == "yarn":
            n_ctx_orig = get("rope.scaling.original_context_length")
            beta_fast = float(get("rope.scaling.yarn_beta_fast", 32.0))
            beta_slow = float(get("rope.scaling.yarn_beta_slow", 1.0))

            def corr_dim(n_rot: float) -> float:
                return n_dims * np.log(n_ctx_orig / (n_rot * 2 * np.pi)) / (2 * np.log(self.base))
            self.lo = max(0.0, float(np.floor(corr_dim(beta_fast))))
            self.hi = min(n_dims - 1.0, float(np.ceil(corr_dim(beta_slow))))

    def cos_sin(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        theta_scale = self.base ** (-2.0 / self.n_dims)
        cos = np.zeros(self.n_dims // 2)
        sin = np.zeros(self.n_dims // 2)
        theta_extrap = float(pos)
        for i in range(self.n_dims // 2):
            theta_interp = self.freq_scale * theta_extrap
            theta, mscale = theta_interp, self.attn_factor
            if self.ext_factor != 0.0:
                y = (i - self.lo) / max(0.001, self.hi - self.lo)
                ramp_mix = (1 - min(1.0, max(0.0, y))) * self.ext_factor
                theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
                mscale *= 1.0 + 0.1 * np.log(1.0 / self.freq_scale)
            cos[i], sin[i] = np.cos(theta) * mscale, np.sin(theta) * mscale
            theta_extrap *= theta_scale
        return cos, sin


def check_close(failures: list[str], tag: str, got: np.ndarray, want: np.ndarray, what: str,
                note: str = "") -> None:
    """The reference's logits against the second formulation's: max |got - want| within 1e-10
    of (1 + max |want|), float64 against float64."""
    err = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    print(f"{tag}: max |reference - incremental| = {err:.2e} (max |logit| {scale:.3g}){note}")
    if not err <= 1e-10 * (1 + scale):
        failures.append(f"{tag}: {what} differ by {err:.3e}")
