"""Unit test of the reference GGUF reader (gguf_reader.py); needs numpy, not duet.

Two parts:
- synthetic: GGUF files written here byte by byte (a minimal writer below, following the spec)
  with every metadata value type, nested arrays, versions 2 and 3, both byte orders, a custom
  `general.alignment`, and tensors of every supported type built by hand with known values
  (Q8_0 and Q4_0 blocks assembled nibble by nibble), read back and compared exactly;
- real: the vocabulary GGUF files in shared/testdata/vocab (metadata only): architecture, token
  counts, and that the token/score/type arrays line up.

Usage: test_gguf_reader.py [--vocab-dir DIR] [--synthetic-only]
Exit codes: 0 pass, 1 failure, 77 skipped (numpy missing, or the vocab folder missing).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile

SKIP = 77

try:
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: numpy is not importable ({e})")
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as gr  # noqa: E402


# ---------------------------------------------------------------------------------------------
# A minimal GGUF writer, only for building test files. Values carry their GGUF type explicitly.

class V:
    """A typed metadata value: V(T_UINT8, 3), V(T_ARRAY, [V(...), ...], elem=T_...)."""

    def __init__(self, vtype: int, value, elem: int | None = None):
        self.vtype, self.value, self.elem = vtype, value, elem


def _enc_string(s: str, bo: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack(bo + "Q", len(b)) + b


def _enc_payload(v: V, bo: str) -> bytes:
    if v.vtype in gr._SCALAR_CODES:
        return struct.pack(bo + gr._SCALAR_CODES[v.vtype][0], v.value)
    if v.vtype == gr.T_STRING:
        return _enc_string(v.value, bo)
    if v.vtype == gr.T_ARRAY:
        out = struct.pack(bo + "IQ", v.elem, len(v.value))
        for x in v.value:
            assert x.vtype == v.elem, "array elements must all have the declared type"
            out += _enc_payload(x, bo)
        return out
    raise ValueError(v.vtype)


def write_gguf(path: str, kv: dict[str, V], tensors: list[tuple[str, list[int], int, bytes]],
               version: int = 3, bo: str = "<", alignment: int | None = None) -> None:
    """tensors: (name, GGUF dims innermost first, ggml type id, raw data bytes)."""
    align = alignment or gr.DEFAULT_ALIGNMENT
    if alignment is not None:
        kv = dict(kv, **{"general.alignment": V(gr.T_UINT32, alignment)})
    out = bytearray(b"GGUF")
    out += struct.pack(bo + "IQQ", version, len(tensors), len(kv))
    for k, v in kv.items():
        out += _enc_string(k, bo) + struct.pack(bo + "I", v.vtype) + _enc_payload(v, bo)
    offset = 0
    offsets = []
    for name, dims, type_id, data in tensors:
        offsets.append(offset)
        out += _enc_string(name, bo) + struct.pack(bo + "I", len(dims))
        out += b"".join(struct.pack(bo + "Q", d) for d in dims)
        out += struct.pack(bo + "IQ", type_id, offset)
        offset += -(-len(data) // align) * align
    out += b"\0" * (-len(out) % align)
    for (_, _, _, data), off in zip(tensors, offsets):
        out += data + b"\0" * (-len(data) % align)
    with open(path, "wb") as f:
        f.write(out)


# ---------------------------------------------------------------------------------------------
# Hand-built blocks with known values.

def q8_0_block(d: float, qs: list[int], bo: str = "<") -> bytes:
    assert len(qs) == 32
    return struct.pack(bo + "e", d) + struct.pack("32b", *qs)


def q4_0_block(d: float, q: list[int], bo: str = "<") -> bytes:
    """q: 32 unsigned 4-bit values; element j goes to the low nibble of byte j, element j + 16 to
    the high nibble of byte j."""
    assert len(q) == 32 and all(0 <= x <= 15 for x in q)
    return struct.pack(bo + "e", d) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


class Checker:
    def __init__(self):
        self.failures: list[str] = []
        self.count = 0

    def eq(self, what: str, got, want) -> None:
        self.count += 1
        if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
            ok = np.asarray(got).shape == np.asarray(want).shape and \
                np.array_equal(np.asarray(got), np.asarray(want))
        else:
            ok = got == want and type(got) is type(want)
        if not ok:
            self.failures.append(f"{what}: got {got!r}, expected {want!r}")

    def true(self, what: str, cond: bool) -> None:
        self.count += 1
        if not cond:
            self.failures.append(what)


ALL_TYPES_KV = {
    "general.architecture": V(gr.T_STRING, "llama"),
    "t.u8": V(gr.T_UINT8, 255),
    "t.i8": V(gr.T_INT8, -128),
    "t.u16": V(gr.T_UINT16, 65535),
    "t.i16": V(gr.T_INT16, -32768),
    "t.u32": V(gr.T_UINT32, 4000000000),
    "t.i32": V(gr.T_INT32, -2000000000),
    "t.f32": V(gr.T_FLOAT32, 1.5),
    "t.bool_t": V(gr.T_BOOL, True),
    "t.bool_f": V(gr.T_BOOL, False),
    "t.str": V(gr.T_STRING, "héllo ▁wörld ✓"),
    "t.empty_str": V(gr.T_STRING, ""),
    "t.u64": V(gr.T_UINT64, 2**64 - 1),
    "t.i64": V(gr.T_INT64, -(2**63)),
    "t.f64": V(gr.T_FLOAT64, 0.1),
    "t.arr_i32": V(gr.T_ARRAY, [V(gr.T_INT32, x) for x in (1, -2, 3)], elem=gr.T_INT32),
    "t.arr_f32": V(gr.T_ARRAY, [V(gr.T_FLOAT32, x) for x in (0.5, -0.25)], elem=gr.T_FLOAT32),
    "t.arr_bool": V(gr.T_ARRAY, [V(gr.T_BOOL, x) for x in (True, False)], elem=gr.T_BOOL),
    "t.arr_str": V(gr.T_ARRAY, [V(gr.T_STRING, s) for s in ("a", "", "<0x0A>", "▁the")],
                   elem=gr.T_STRING),
    "t.arr_empty": V(gr.T_ARRAY, [], elem=gr.T_UINT8),
    "t.arr_nested": V(gr.T_ARRAY, [
        V(gr.T_ARRAY, [V(gr.T_UINT16, 1), V(gr.T_UINT16, 2)], elem=gr.T_UINT16),
        V(gr.T_ARRAY, [], elem=gr.T_UINT16),
        V(gr.T_ARRAY, [V(gr.T_UINT16, 65535)], elem=gr.T_UINT16),
    ], elem=gr.T_ARRAY),
    "t.arr_nested_str": V(gr.T_ARRAY, [
        V(gr.T_ARRAY, [V(gr.T_STRING, "x"), V(gr.T_STRING, "yz")], elem=gr.T_STRING),
    ], elem=gr.T_ARRAY),
}
ALL_TYPES_WANT = {
    "general.architecture": "llama",
    "t.u8": 255, "t.i8": -128, "t.u16": 65535, "t.i16": -32768, "t.u32": 4000000000,
    "t.i32": -2000000000, "t.f32": 1.5, "t.bool_t": True, "t.bool_f": False,
    "t.str": "héllo ▁wörld ✓", "t.empty_str": "", "t.u64": 2**64 - 1, "t.i64": -(2**63),
    "t.f64": 0.1, "t.arr_i32": [1, -2, 3], "t.arr_f32": [0.5, -0.25], "t.arr_bool": [True, False],
    "t.arr_str": ["a", "", "<0x0A>", "▁the"], "t.arr_empty": [],
    "t.arr_nested": [[1, 2], [], [65535]], "t.arr_nested_str": [["x", "yz"]],
}


def tensor_cases(bo: str):
    """(name, dims, type, raw bytes, expected float32 array in numpy shape)."""
    cases = []
    f32 = np.array([[1.0, -2.0, 3.5], [0.0, 1e-30, -7.25]], dtype=np.float32)
    cases.append(("f32", [3, 2], gr.GGML_F32, f32.astype(np.dtype("f4").newbyteorder(bo))
                  .tobytes(), f32))
    # F16 bit patterns with known values: 1, -2, largest normal, smallest subnormal, -0, 0.333...
    f16_bits = [0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x3555]
    f16_want = np.array([1.0, -2.0, 65504.0, 2.0**-24, -0.0, 0.333251953125], dtype=np.float32)
    cases.append(("f16", [6], gr.GGML_F16, struct.pack(bo + "6H", *f16_bits), f16_want))
    # BF16: the top 16 bits of the float32.
    bf16_bits = [0x3F80, 0xC020, 0x4049, 0x0000, 0xBF00, 0x7F7F]
    bf16_want = np.array([1.0, -2.5, 3.140625, 0.0, -0.5, 3.3895313892515355e38], dtype=np.float32)
    cases.append(("bf16", [2, 3], gr.GGML_BF16, struct.pack(bo + "6H", *bf16_bits), bf16_want
                  .reshape(3, 2)))
    # Q8_0: two rows of 64 (two blocks each), every int8 value appears.
    q8_rows = []
    raw = b""
    for r, (d0, d1) in enumerate([(0.5, -0.125), (2.0**-14, 3.0)]):
        qa = [((r * 64 + j) % 256) - 128 for j in range(32)]
        qb = [127 - ((r * 64 + j) * 3 % 256) for j in range(32)]
        raw += q8_0_block(d0, qa, bo) + q8_0_block(d1, qb, bo)
        q8_rows.append([d0 * q for q in qa] + [d1 * q for q in qb])
    cases.append(("q8_0", [64, 2], gr.GGML_Q8_0, raw, np.array(q8_rows, dtype=np.float32)))
    # Q4_0: one row of 64; block 0 holds 0..15 then 15..0, block 1 a scrambled pattern.
    qa = list(range(16)) + list(range(15, -1, -1))
    qb = [(7 * j + 3) % 16 for j in range(32)]
    raw = q4_0_block(0.25, qa, bo) + q4_0_block(-1.5, qb, bo)
    want = [0.25 * (q - 8) for q in qa] + [-1.5 * (q - 8) for q in qb]
    cases.append(("q4_0", [64, 1], gr.GGML_Q4_0, raw, np.array([want], dtype=np.float32)))
    # A 3-d tensor, to check the dims order: GGUF dims [2, 3, 4] is numpy shape (4, 3, 2).
    t3 = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    cases.append(("f32_3d", [2, 3, 4], gr.GGML_F32,
                  t3.astype(np.dtype("f4").newbyteorder(bo)).tobytes(), t3))
    return cases


def check_synthetic(c: Checker, tmp: str) -> None:
    for version in (2, 3):
        for bo in ("<", ">"):
            for alignment in (None, 64, 8):
                tag = f"v{version} bo={bo} alignment={alignment}"
                path = os.path.join(tmp, f"t_{version}_{'le' if bo == '<' else 'be'}_"
                                         f"{alignment}.gguf")
                cases = tensor_cases(bo)
                write_gguf(path, ALL_TYPES_KV, [(n, d, t, r) for n, d, t, r, _ in cases],
                           version=version, bo=bo, alignment=alignment)
                g = gr.GGUFFile(path)
                c.eq(f"{tag}: version", g.version, version)
                c.eq(f"{tag}: byte order", g.byte_order, bo)
                c.eq(f"{tag}: alignment", g.alignment, alignment or 32)
                c.eq(f"{tag}: data offset aligned", g.data_offset % (alignment or 32), 0)
                for k, want in ALL_TYPES_WANT.items():
                    # exact: the float32 values are representable, 0.1 is stored as float64
                    c.eq(f"{tag}: {k}", g.metadata.get(k), want)
                    c.eq(f"{tag}: type of {k}", g.value_types[k], ALL_TYPES_KV[k].vtype)
                for name, dims, type_id, _, want in cases:
                    info = g.tensors[name]
                    c.eq(f"{tag}: dims of {name}", info.dims, tuple(dims))
                    c.eq(f"{tag}: type of {name}", info.type_id, type_id)
                    c.eq(f"{tag}: offset of {name} aligned", info.offset % (alignment or 32), 0)
                    got = g.tensor(name)
                    c.eq(f"{tag}: shape of {name}", got.shape, want.shape)
                    c.eq(f"{tag}: dtype of {name}", got.dtype, np.dtype(np.float32))
                    # exact, and -0.0 kept as -0.0
                    c.true(f"{tag}: values of {name}: got {got.ravel()[:8]}..., expected "
                           f"{want.ravel()[:8]}...",
                           got.shape == want.shape and np.array_equal(got.view(np.uint32),
                                                                       want.view(np.uint32)))


def check_quantize_round_trip(c: Checker) -> None:
    """Quantize random rows the way llama.cpp's reference quantizers do (Q8_0: d = amax/127,
    q = round(x/d); Q4_0: d = signed max / -8, q = clamp(round(x/d) + 8, 0, 15)) with plain Python
    per element, pack the bytes, dequantize with the reader, and compare with d * q computed here:
    the reader's vectorized unpacking must agree exactly with the per-element definition."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(32 * 5).astype(np.float32) * 3
    raw8, raw4, want8, want4 = b"", b"", [], []
    for b in range(5):
        blk = [float(v) for v in x[32 * b:32 * b + 32]]
        amax = max(abs(v) for v in blk)
        d = amax / 127
        dh = float(np.float16(d))
        q = [int(round(v / d)) if d else 0 for v in blk]
        raw8 += q8_0_block(dh, q)
        want8 += [dh * qi for qi in q]
        m = max(blk, key=abs)
        d4 = m / -8
        d4h = float(np.float16(d4))
        q4 = [min(15, max(0, int(round(v / d4)) + 8)) if d4 else 8 for v in blk]
        raw4 += q4_0_block(d4h, q4)
        want4 += [d4h * (qi - 8) for qi in q4]
    got8 = gr.dequantize(np.frombuffer(raw8, np.uint8), gr.GGML_Q8_0, 160)
    got4 = gr.dequantize(np.frombuffer(raw4, np.uint8), gr.GGML_Q4_0, 160)
    c.true("Q8_0 round trip matches d*q exactly",
           np.array_equal(got8, np.array(want8, dtype=np.float32)))
    c.true("Q4_0 round trip matches d*(q-8) exactly",
           np.array_equal(got4, np.array(want4, dtype=np.float32)))
    # and the quantization error is what the formats promise: half a step per element, plus
    # the rounding of the scale to fp16 (at most 2^-11 relative, times the largest |q|)
    d8 = np.abs(x.reshape(5, 32)).max(1, keepdims=True) / 127
    bound8 = d8 * (0.5 + 127 * 2.0**-11) + 1e-6
    c.true("Q8_0 quantization error within half a step",
           bool(np.all(np.abs(got8 - x).reshape(5, 32) <= bound8)))


def check_errors(c: Checker, tmp: str) -> None:
    """Malformed files fail with a GGUFError that says what is wrong."""
    def expect_error(tag: str, data: bytes, needle: str) -> None:
        path = os.path.join(tmp, "bad.gguf")
        with open(path, "wb") as f:
            f.write(data)
        try:
            gr.GGUFFile(path)
        except gr.GGUFError as e:
            c.true(f"{tag}: message {str(e)!r} should mention {needle!r}", needle in str(e))
        else:
            c.true(f"{tag}: expected a GGUFError", False)

    expect_error("bad magic", b"GGML" + b"\0" * 20, "magic")
    expect_error("version 1", b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1")
    expect_error("truncated", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + b"\x05", "end of file")
    good = os.path.join(tmp, "good.gguf")
    write_gguf(good, {"a": V(gr.T_UINT8, 1)}, [("w", [32], gr.GGML_Q8_0, b"\0" * 34)])
    data = open(good, "rb").read()
    expect_error("data cut off", data[:-40], "past the end")
    g = gr.GGUFFile(good)
    try:
        g.tensor("missing")
        c.true("missing tensor: expected a GGUFError", False)
    except gr.GGUFError as e:
        c.true(f"missing tensor message {e}", "'missing' not found" in str(e))


# ---------------------------------------------------------------------------------------------
# Real vocabulary files (metadata only; they hold no tensors).

def check_vocab(c: Checker, vocab_dir: str) -> None:
    """Reads every vocabulary file strictly, as any GGUF file is read."""
    files = sorted(f for f in os.listdir(vocab_dir) if f.endswith(".gguf"))
    c.true(f"no .gguf files in {vocab_dir}", bool(files))
    for name in files:
        path = os.path.join(vocab_dir, name)
        try:
            g = gr.GGUFFile(path)
        except gr.GGUFError as e:
            c.true(f"{name}: {e}", False)
            continue
        c.eq(f"{name}: version", g.version, 3)
        c.true(f"{name}: general.architecture is {g.get('general.architecture')!r}",
               isinstance(g.get("general.architecture"), str) and
               g.get("general.architecture") != "")
        tokens = g.get("tokenizer.ggml.tokens")
        c.true(f"{name}: tokenizer.ggml.tokens is a non-empty list of strings",
               isinstance(tokens, list) and len(tokens) > 0 and
               all(isinstance(t, str) for t in tokens))
        if not tokens:
            continue
        c.true(f"{name}: tokenizer.ggml.model is {g.get('tokenizer.ggml.model')!r}",
               g.get("tokenizer.ggml.model") in ("llama", "gpt2", "bert", "t5", "rwkv"))
        for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            if key in g.metadata:
                c.eq(f"{name}: len({key})", len(g.get(key)), len(tokens))
        # Known sizes of these tokenizers; vocab_size, where stored, must agree with the tokens.
        known = {"ggml-vocab-llama-spm.gguf": 32000, "ggml-vocab-gpt-2.gguf": 50257,
                 "ggml-vocab-qwen2.gguf": 151936, "ggml-vocab-llama-bpe.gguf": 128256}
        if name in known:
            c.eq(f"{name}: number of tokens", len(tokens), known[name])
        arch = g.get("general.architecture")
        if f"{arch}.vocab_size" in g.metadata:
            c.eq(f"{name}: {arch}.vocab_size", g.get(f"{arch}.vocab_size"), len(tokens))
        c.eq(f"{name}: tensors", len(g.tensors), 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab-dir", help="folder of real vocab GGUF files (shared/testdata/vocab)")
    ap.add_argument("--synthetic-only", action="store_true")
    args = ap.parse_args()

    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        check_synthetic(c, tmp)
        check_quantize_round_trip(c)
        check_errors(c, tmp)
    synthetic_count = c.count
    if c.failures:
        for f in c.failures:
            print("FAIL:", f)
        print(f"{len(c.failures)} of {c.count} synthetic checks failed")
        return 1
    print(f"synthetic: {synthetic_count} checks passed")
    if args.synthetic_only:
        return 0

    vocab_dir = args.vocab_dir
    if not vocab_dir or not os.path.isdir(vocab_dir):
        print(f"SKIP: vocab folder {vocab_dir!r} is missing (shared/testdata is not beside the "
              f"checkout)")
        return SKIP
    check_vocab(c, vocab_dir)
    for f in c.failures:
        print("FAIL:", f)
    print(f"vocab: {c.count - synthetic_count - len(c.failures)} of "
          f"{c.count - synthetic_count} checks passed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
