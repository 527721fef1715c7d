"""Compare duet's logits with the float64 PyTorch reference on one GGUF file (llama_reference.py,
qwen2_reference.py, qwen3_reference.py or deepseek2_reference.py, picked by
general.architecture; deepseek2_reference.py also reads deepseek32, DeepSeek-V3.2).

    compare_logits.py --duet BUILD/duet --model F.gguf [--seed 1234] [--lengths 1,2,7,33,100]
                      [--rel-tol 1e-4] [--threads N] [--verbose]

For each token list (random ids drawn with a fixed seed, one list per length; the 7-long list
also holds the first and the last id of the vocabulary) it runs
`duet logits --model F --tokens "..." --top VOCAB --all-positions` (every logit of every
position) and the reference on the same file, and compares every position.

Metric, per position p (over the whole vocabulary):
    err_p   = max_i |duet_p[i] - ref_p[i]|
    bound_p = rel_tol * (1 + max_i |ref_p[i]|)
and the position passes when err_p <= bound_p and duet's argmax is the reference's argmax (or,
when the reference's two best logits are closer than 2 * bound_p, so that rounding may legally
swap them, duet's argmax is one whose reference logit is within 2 * bound_p of the best).

Why this tolerance: duet dequantizes the weights exactly (the same values the reference reads
with its own reader) and keeps activations in float32 for every weight type, while the reference
runs in float64, so the only difference is float32 rounding (unit roundoff 6e-8) accumulated
over dot products of length n_embd/n_ff, two norms per layer, softmax and the lm_head, plus duet
printing 8 significant digits. Measured on the tiny preset (lengths 1, 2, 7, 33, 100, all
positions, every logit), max over positions of err_p / (1 + max|ref_p|):

    f32 8.8e-7   f16 8.1e-7   bf16 7.0e-7   q8_0 7.3e-7   q4_0 6.0e-7
    f32 tied, no rope scaling 5.6e-7   f32 n_head_kv == n_head 6.4e-7
    q4_0 n_embd 96, 3 heads / 1 kv head, 3 layers, rope base 5e5: 7.3e-7
    (absolute: at most 3.4e-6 on logits up to 4.4; the same with --threads 1 and 2)
    qwen2 (--preset qwen2-tiny, DUET_MATMUL=exact): f32 4.4e-7   f16 5.1e-7   bf16 4.8e-7
    q8_0 4.4e-7   q4_0 4.1e-7   f32 tied + linear rope x4 3.7e-7   f32 one kv head 3.9e-7
    q8_0 sliding window 8 on layers 1-2 of 3: 3.9e-7 (absolute at most 2.2e-6). NEOX rope
    replaced by adjacent-pair rope measures 0.88, the window ignored 0.54.
    qwen3 (--preset qwen3-tiny: per-head q/k RMSNorm, head_dim 48 != n_embd / n_head, YaRN x4
    over 1024 positions, DUET_MATMUL=exact): f32 7.5e-7   f16 8.1e-7   bf16 5.8e-7   q8_0 7.9e-7
    q4_0 6.0e-7; tied with R1-0528-Qwen3-8B's attn_factor 5.1e-7, multi-head without rope
    scaling 6.4e-7, one kv head with linear x4 5.2e-7, heads of 32 q8_0 7.0e-7; q4_k_m 7.0e-7 and
    q6_k 8.9e-7 (heads of 64). YaRN on llama 6.1e-7 and qwen2 6.0e-7. Defects measured on
    qwen3-tiny: the q norm skipped 0.34, YaRN's magnitude factor dropped 0.53, plain frequencies
    with the magnitude kept 0.65, the softmax scale from n_embd / n_head 0.36, adjacent-pair rope
    1.3.
    deepseek2 (MLA + MoE, DUET_MATMUL=exact): --preset deepseek2-tiny-v2 f32 8.3e-7, f16 9.9e-7,
    bf16 1.0e-6, q8_0 8.9e-7, q4_0 6.9e-7; deepseek2-tiny-v3 f32 1.2e-6, f16 1.1e-6, bf16 1.1e-6,
    q8_0 1.2e-6, q4_0 1.0e-6; V2 groups 1.3e-6, V2 norm without YaRN 9.4e-7, V3 direct q 1.1e-6,
    the real head sizes (V2-Lite / V3 shapes, narrow) 1.1e-6 / 1.6e-6 (absolute at most 6.6e-6;
    the same with --threads 1 and 2). Defects measured on the tiny presets: softmax scale without
    YaRN's mscale^2 0.40 (v2) / 0.67 (v3), plain rope frequencies instead of YaRN 0.60 / 0.96, rope
    pairs (i, i + d/2) on the stored layout 1.1, the routed scaling factor dropped 0.33 / 0.68,
    the correction bias ignored 0.11, V3 weights from the biased scores 0.34, the group limit
    ignored 0.76 (v3) / 0.28 (V2 groups). An MoE adds one way to exceed a bound that is not a
    defect of the arithmetic: router scores at the top-k or group boundary closer than the error
    of the activations flip an expert. `deepseek2_reference.py --routing-stats` prints the
    smallest margins over these token lists (1e-4 and more on the presets, far above float32
    noise), so on the exact path a flip is a real defect; the fast int8 path's activation error
    (about 1e-2) does flip experts (see tests/reference/README.md).
    deepseek32 (DeepSeek-V3.2, --preset deepseek32-tiny: v3 plus the lightning indexer, 4 heads
    of 32 choosing 8 keys per query; DUET_MATMUL=exact): f32 9.8e-7, f16 7.5e-7, bf16 1.0e-6, q8_0
    7.8e-7, q4_0 9.0e-7, split MLA 1.3e-6, --index-topk 3 8.1e-7, 2 index heads of 16 top-5
    1.2e-6. The lists of 33 and 100 tokens (and of 7 with top-3) drop keys, and the choice moves
    the logits by 0.7 to 1.5 from attention over every key. The indexer is a second boundary like
    the router's: `deepseek2_reference.py --index-stats` prints the smallest gap between the
    top_k-th and the next index score (1.8e-5 and more on those files) and counts the choices
    decided by an exact tie (keys that every head's relu zeroes score 0: 1 to 35 per layer), which
    the reference gives to the lower position, as duet does; the other way round measures 0.96
    to 1.05.

The bound 1e-4 sits about 100x above that noise, which leaves room for other summation orders
(SIMD paths, thread splits, other devices) and longer sequences, and at least 10x below the
smallest real defect measured on the same models: rms eps 1e-5 instead of 1e-6 moves the
logits by 1.3e-3; a missing linear rope factor by 0.57, q/k rows left in GGUF order by 0.57, and
kv head h % n_kv instead of h / n_rep by 0.91 (relative, same metric). Rounding activations
breaks the stated contract and fails too: K and V stored as f16 measure 3.5e-4, as bf16 2.8e-3
(so a future f16 KV cache needs its own, stated tolerance here, not a silent bump).

Exit: 0 pass, 1 failure (the message names list, position, error, bound), 77 when torch or
numpy is not importable (ctest reports it as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import (  # noqa: E402  (first: it exits 77 without numpy and torch)
    DEFAULT_LENGTHS, duet_logits, logits_rows, parse_lengths, token_lists)
import deepseek2_reference  # noqa: E402
import llama_reference  # noqa: E402
import qwen2_reference  # noqa: E402
import qwen3_reference  # noqa: E402
from gguf_reader import GGUFFile  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REFERENCES = {"llama": llama_reference, "qwen2": qwen2_reference, "qwen3": qwen3_reference,
              "deepseek2": deepseek2_reference, "deepseek32": deepseek2_reference}


def reference_for(path: str):
    """The reference module for the file's general.architecture (llama when absent)."""
    arch = GGUFFile(path).get("general.architecture", "llama")
    if arch not in REFERENCES:
        raise ValueError(f"no reference for architecture {arch!r} (have {sorted(REFERENCES)})")
    return REFERENCES[arch]

DEFAULT_REL_TOL = 1e-4


# --kv-fp8: a cached value this close (relative) to a midpoint of e4m3's grid may round apart in
# float32 and float64 (float32's rounding of a value after a few layers is a few 1e-7), and the
# positions compared, at least this many.
KV_MIDPOINT_MARGIN = 1e-5
KV_MIN_COMPARED = 40


def run_duet(duet: str, model: str, tokens: list[int], vocab: int, threads: int | None,
             kv_dtype: str = "f32") -> np.ndarray:
    """duet's logits for every position, as a [T, vocab] float64 array."""
    return logits_rows(duet_logits(duet, model, tokens, vocab, threads, kv_dtype), vocab, len(tokens))


def compare(duet_logits: np.ndarray, ref: np.ndarray, rel_tol: float, label: str
            ) -> tuple[list[str], float, float]:
    """Returns (failure messages, max err, max err / (1 + max|ref|)) over the positions."""
    failures = []
    worst_abs, worst_rel = 0.0, 0.0
    for p in range(ref.shape[0]):
        d, r = duet_logits[p], ref[p]
        if not np.all(np.isfinite(d)):
            bad = np.flatnonzero(~np.isfinite(d))[:5].tolist()
            failures.append(f"{label} position {p}: duet logits are not finite at ids {bad}")
            continue
        diff = np.abs(d - r)
        err = float(diff.max())
        scale = 1.0 + float(np.abs(r).max())
        bound = rel_tol * scale
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / scale)
        if err > bound:
            i = int(diff.argmax())
            failures.append(f"{label} position {p}: max |duet - ref| = {err:.3e} at id {i} "
                            f"(duet {d[i]:.8g}, ref {r[i]:.8g}) > bound {bound:.3e} = "
                            f"{rel_tol:g} * (1 + max|ref| {scale - 1:.4g}), "
                            f"relative error {err / scale:.3e}")
            continue
        a_duet, a_ref = int(d.argmax()), int(r.argmax())
        if a_duet != a_ref and r[a_ref] - r[a_duet] > 2 * bound:
            failures.append(f"{label} position {p}: argmax differs: duet {a_duet} (ref logit "
                            f"{r[a_duet]:.8g}), reference {a_ref} (ref logit {r[a_ref]:.8g}), "
                            f"gap {r[a_ref] - r[a_duet]:.3e} > 2 * bound {2 * bound:.3e}")
    return failures, worst_abs, worst_rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duet", required=True, help="the duet executable")
    ap.add_argument("--model", required=True,
                    help="llama, qwen2, qwen3, deepseek2 or deepseek32 GGUF file (from duet "
                         "make-model)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the random token lists")
    ap.add_argument("--lengths", default=DEFAULT_LENGTHS, help="token list lengths")
    ap.add_argument("--rel-tol", type=float, default=DEFAULT_REL_TOL,
                    help="bound per position: rel_tol * (1 + max|ref|)")
    ap.add_argument("--threads", type=int, help="passed to duet logits")
    ap.add_argument("--verbose", action="store_true", help="print the error of every list")
    ap.add_argument("--index-fp8", action="store_true",
                    help="deepseek32: the indexer's q and k rounded to FP8 as DeepSeek's kernels "
                         "do, in the reference and in duet (DUET_INDEXER=fp8)")
    ap.add_argument("--kv-fp8", action="store_true",
                    help="deepseek2, deepseek32: duet's fp8 KV cache (--kv-cache-dtype fp8) and the "
                         "reference's rounding of the cache rows as it holds them; also requires "
                         "that rounding to move the reference's logits by over 10 times the bound")
    args = ap.parse_args()

    for path, what in ((args.duet, "duet executable"), (args.model, "model")):
        if not os.path.exists(path):
            print(f"FAIL: {what} {path} does not exist")
            return 1
    try:
        reference = reference_for(args.model)
        m = reference.load_model(args.model)
    except Exception as e:  # a reader error is a failure, with its message
        print(f"FAIL: the reference could not load {args.model}: {e}")
        return 1
    cfg = m.cfg
    if args.index_fp8:
        if not getattr(cfg, "index_n_head", 0):
            print(f"FAIL: --index-fp8: {args.model} has no indexer")
            return 1
        cfg.index_fp8 = True
        os.environ["DUET_INDEXER"] = "fp8"
    if args.kv_fp8:
        if not hasattr(cfg, "kv_fp8"):
            print(f"FAIL: --kv-fp8: the reference of {args.model} has no fp8 cache rounding")
            return 1
        cfg.kv_fp8 = True
    lengths = parse_lengths(args.lengths)
    if hasattr(reference, "describe"):
        print(f"model {os.path.basename(args.model)}: {reference.describe(m)}; "
              f"rel_tol {args.rel_tol:g}")
    else:
        window = getattr(cfg, "sliding_window", 0)
        head_dim = (f" of {cfg.head_dim}" if cfg.head_dim * cfg.n_head != cfg.n_embd else "")
        print(f"model {os.path.basename(args.model)}: n_embd {cfg.n_embd}, layers {cfg.n_layer}, "
              f"heads {cfg.n_head}/{cfg.n_head_kv}{head_dim}, n_ff {cfg.n_ff}, "
              f"vocab {cfg.vocab_size}, {llama_reference.describe_rope(cfg)}, "
              f"{'tied' if m.tied else 'separate'} lm_head"
              f"{f', sliding window {window} from layer {cfg.max_window_layers}' if window else ''}"
              f"; rel_tol {args.rel_tol:g}")

    all_failures = []
    worst_abs, worst_rel = 0.0, 0.0
    kv_move = 0.0  # --kv-fp8: how far the cache's rounding moves the reference's logits
    kv_compared, kv_positions = 0, 0
    for tokens in token_lists(cfg.vocab_size, lengths, args.seed):
        label = f"list of {len(tokens)} tokens"
        with torch.no_grad():
            if args.kv_fp8:
                reference.KV_MIDPOINT_DISTANCES = []
            ref = reference.forward(m, tokens).numpy()
            if args.kv_fp8:
                # Positions up to the first token whose cache row has a value within float32's
                # noise of a rounding midpoint: from it on, duet's float32 and this float64 may
                # round that value one step (1/16 to 1/8 of it) apart, and a MoE model's routing
                # turns that into other experts. Earlier positions never read that row.
                nearest = torch.stack(reference.KV_MIDPOINT_DISTANCES).amin(dim=0)
                reference.KV_MIDPOINT_DISTANCES = None
                close = torch.nonzero(nearest < KV_MIDPOINT_MARGIN).flatten()
                upto = int(close[0]) if len(close) else len(tokens)
                kv_compared, kv_positions = kv_compared + upto, kv_positions + len(tokens)
                if upto == 0:
                    continue
                cfg.kv_fp8 = False
                unrounded = reference.forward(m, tokens).numpy()
                cfg.kv_fp8 = True
                kv_move = max(kv_move, float((np.abs(ref[:upto] - unrounded[:upto]).max(axis=1) /
                                              (1.0 + np.abs(ref[:upto]).max(axis=1))).max()))
        try:
            got = run_duet(args.duet, args.model, tokens, cfg.vocab_size, args.threads,
                           "fp8" if args.kv_fp8 else "f32")
            if args.kv_fp8:
                got, ref = got[:upto], ref[:upto]
        except (RuntimeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            all_failures.append(f"{label}: {e}")
            continue
        failures, wa, wr = compare(got, ref, args.rel_tol, label)
        worst_abs, worst_rel = max(worst_abs, wa), max(worst_rel, wr)
        if args.verbose:
            print(f"  {label}: max |duet - ref| {wa:.3e}, relative {wr:.3e}, "
                  f"max |ref| {np.abs(ref).max():.4g}")
        all_failures += failures

    print(f"max |duet - ref| = {worst_abs:.3e}; max relative error "
          f"|duet - ref| / (1 + max|ref|) = {worst_rel:.3e} (bound {args.rel_tol:g})")
    if args.kv_fp8:
        print(f"fp8 cache: {kv_compared} of {kv_positions} positions compared (the others follow a "
              f"cached value within {KV_MIDPOINT_MARGIN:g} of an e4m3 rounding midpoint); the "
              f"cache's rounding moves the reference's logits there by up to {kv_move:.3e} "
              f"(relative; required over {10 * args.rel_tol:g})")
        if kv_move <= 10 * args.rel_tol:
            all_failures.append("the fp8 cache's rounding hardly moves the logits: this comparison "
                                "could not tell a cache that rounds from one that does not")
        if kv_compared < KV_MIN_COMPARED:
            all_failures.append(f"only {kv_compared} positions could be compared (at least "
                                f"{KV_MIN_COMPARED} required): choose other lengths or another seed")
    if all_failures:
        for f in all_failures[:20]:
            print("FAIL:", f)
        if len(all_failures) > 20:
            print(f"... and {len(all_failures) - 20} more")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
