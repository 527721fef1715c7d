"""DeepSeek-V3's multi-token-prediction (MTP) layer: duet's logits against a float64 reference.

    test_mtp_reference.py --duet BUILD/duet --work DIR [--preset deepseek2-tiny-v3] [--own-head]
                          [--make "make-model options"]

`duet make-model --mtp-layers 1` writes a deepseek2 model with one MTP layer after the last
(blk.N.* for its decoder block, llama.cpp's blk.N.nextn.{enorm,hnorm,eh_proj,shared_head_norm}
and, with --own-head, nextn.{embed_tokens,shared_head_head}), as a GGUF file and as a Hugging
Face folder (model.layers.N.{enorm,hnorm,eh_proj,shared_head.*,...}). For each token list
t0..t(T-1), `duet logits --mtp --all-positions` prints at position i the MTP layer's logits of
t(i+2). The reference computes them here from the module's description in the DeepSeek-V3 report
(section 2.2) as vLLM and SGLang run it, written without duet's code:

    h_i   = the model's final hidden state at i, after its output norm (model.norm)
    x_i   = eh_proj @ concat(RMSNorm_enorm(embed(t(i+1))), RMSNorm_hnorm(h_i))
    x     = block(x) over positions 0..T-2: the layer's own MLA attention (causal, rope at i,
            its own keys) and its MoE or dense feed-forward, with residuals
    logits_i = head @ RMSNorm_shared_head_norm(x_i)

where embed and head are the layer's own when it has them, else the model's. The decoder block
itself is deepseek2_reference.py's (the float64 port of Hugging Face's modeling code), loaded at
index N. Both of duet's readings (the GGUF file and the folder) must match the reference within
the compare_logits.py bound (1e-4 relative; the same float32-versus-float64 argument, one more
layer), with argmax agreement. A layer run on the wrong inputs fails by far more: with the concat
order swapped, the hidden state before the output norm, or the hidden state at i paired with
t(i) instead of t(i+1), the logits
move by far more than the bound (checked on every list: the reference perturbed each of those
ways must differ from itself by over 100 times the bound).

Exit: 0 pass, 1 failure, 77 when torch or numpy is not importable.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    logits_rows, rms_norm, run_command, swiglu, token_lists)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import deepseek2_reference as ref  # noqa: E402
from gguf_reader import GGUFFile  # noqa: E402
from reference_common import TensorLoader  # noqa: E402

REL_TOL = 1e-4


def load_mtp(path: str):
    """(main model weights, MTP block weights, its own tensors) from a GGUF file."""
    m = ref.load_model(path)
    g = GGUFFile(path)
    c = m.cfg
    t = TensorLoader(g)
    n = c.n_layer
    block = ref.load_layer(g, t, c, n)
    p = f"blk.{n}.nextn."
    d, V = c.n_embd, c.vocab_size
    own = {
        "enorm": t(p + "enorm.weight", (d,)),
        "hnorm": t(p + "hnorm.weight", (d,)),
        "eh_proj": t(p + "eh_proj.weight", (d, 2 * d)),
        "head_norm": t(p + "shared_head_norm.weight", (d,)),
        "embed": t(p + "embed_tokens.weight", (V, d), optional=True),
        "head": t(p + "shared_head_head.weight", (V, d), optional=True),
    }
    t.done()
    if own["embed"] is None:
        own["embed"] = m.tok_embd
    if own["head"] is None:
        own["head"] = m.lm_head
    return m, block, own


def mtp_reference(m, block, own, tokens: list[int], variant: str = "") -> np.ndarray:
    """[T-1, vocab] float64: the MTP layer's logits at positions 0..T-2."""
    c = m.cfg
    trace: dict = {}
    ref.forward(m, tokens, trace)
    h = trace["result_norm"] if variant != "pre-norm" else trace[f"l_out-{c.n_layer - 1}"]
    T = len(tokens)
    nxt = tokens[:-1] if variant == "same-token" else tokens[1:]
    e = rms_norm(own["embed"][torch.tensor(nxt, dtype=torch.long)], own["enorm"], c.rms_eps)
    hn = rms_norm(h[:T - 1], own["hnorm"], c.rms_eps)
    pair = [hn, e] if variant == "swapped" else [e, hn]
    x = torch.cat(pair, dim=-1) @ own["eh_proj"].T
    cos, sin = ref.rope_cos_sin(torch.arange(T - 1), c)
    x = x + ref.attention(rms_norm(x, block.attn_norm, c.rms_eps), block, c, cos, sin)
    f_in = rms_norm(x, block.ffn_norm, c.rms_eps)
    if c.is_moe_layer(c.n_layer):
        x = x + ref.moe(f_in, block, c)
    else:
        x = x + swiglu(f_in, block.w_gate, block.w_up, block.w_down)
    return (rms_norm(x, own["head_norm"], c.rms_eps) @ own["head"].T).numpy()


def duet_mtp_logits(duet: str, model: str, tokens: list[int], vocab: int) -> np.ndarray:
    cmd = [duet, "logits", "--model", model, "--tokens", " ".join(map(str, tokens)), "--mtp",
           "--top", str(vocab), "--all-positions", "--kv-cache-dtype", "f32"]
    lines = [line.strip() for line in run_command(cmd).splitlines() if line.startswith("{")]
    return logits_rows(lines, vocab, len(tokens) - 1)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(max(np.abs(got[p] - want[p]).max() / (1 + np.abs(want[p]).max()) for p in range(len(want))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duet", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--preset", default="deepseek2-tiny-v3")
    ap.add_argument("--type", default="f32")
    ap.add_argument("--own-head", action="store_true")
    ap.add_argument("--make", default="", help="more make-model options")
    ap.add_argument("--lengths", default="2,3,7,33,70")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    gguf = os.path.join(args.work, "mtp.gguf")
    folder = os.path.join(args.work, "mtp_hf")
    make = [args.duet, "make-model", "--preset", args.preset, "--seed", "31", "--mtp-layers", "1"]
    make += (["--mtp-own-head"] if args.own_head else []) + shlex.split(args.make)
    run_command(make + ["--type", args.type, "-o", gguf])
    run_command(make + ["--type", args.type, "--format", "hf", "-o", folder])

    m, block, own = load_mtp(gguf)
    vocab = m.cfg.vocab_size
    print(f"model: {ref.describe(m)}; MTP layer {m.cfg.n_layer} "
          f"({'own' if args.own_head else 'shared'} embedding and head)")
    failures: list[str] = []
    worst = 0.0
    for tokens in token_lists(vocab, [int(x) for x in args.lengths.split(",")], 7):
        with torch.no_grad():
            want = mtp_reference(m, block, own, tokens)
            if len(tokens) > 2:
                for variant in ("swapped", "pre-norm", "same-token"):
                    err = relative_error(mtp_reference(m, block, own, tokens, variant), want)
                    if err < 100 * REL_TOL:
                        failures.append(f"{len(tokens)} tokens: the {variant} variant differs by only {err:.2e}: "
                                        f"the test would not tell it apart")
        for where, path in (("GGUF", gguf), ("folder", folder)):
            got = duet_mtp_logits(args.duet, path, tokens, vocab)
            err = relative_error(got, want)
            worst = max(worst, err)
            if err > REL_TOL:
                failures.append(f"{where}, {len(tokens)} tokens: relative error {err:.3e} > {REL_TOL:g}")
            for p in range(len(want)):
                a, b = int(got[p].argmax()), int(want[p].argmax())
                if a != b and want[p][b] - want[p][a] > 2 * REL_TOL * (1 + np.abs(want[p]).max()):
                    failures.append(f"{where}, {len(tokens)} tokens, position {p}: argmax {a}, reference {b}")
    print(f"max relative error |duet - ref| / (1 + max|ref|) = {worst:.3e} (bound {REL_TOL:g})")
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
