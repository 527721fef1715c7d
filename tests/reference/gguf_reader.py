"""A small GGUF reader written from the GGUF specification (ggml docs/gguf.md).

It is the reference side of duet's tests, so it shares no code with duet's C++ reader: it parses
the header, every metadata value type (nested arrays included), the tensor infos and the aligned
data section, and dequantizes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
tensors to float32 with vectorized numpy.

Layout reminders from the spec:
- header: magic "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_kv_count
  (versions 2 and 3; version 1 used uint32 counts and is not supported here). Version 3 allows
  big-endian files; the version field then reads byte-swapped, which is how we detect it.
- string: uint64 length, then that many UTF-8 bytes, no terminator.
- metadata kv: string key, uint32 value type, value; an array value is uint32 element type,
  uint64 count, then the elements (which may themselves be arrays).
- tensor info: string name, uint32 n_dims, uint64 dims[n_dims] (innermost first), uint32 ggml
  type, uint64 offset relative to the data section.
- the data section starts at the first multiple of `general.alignment` (default 32) after the
  tensor infos.

A tensor with GGUF dims [ne0, ne1] is a row-major numpy array of shape (ne1, ne0): ne0 is the
contiguous (innermost) dimension. `GGUFFile.tensor()` returns that numpy shape.

Usage as a script: `python3 gguf_reader.py FILE.gguf` prints the metadata and tensor table.
"""

from __future__ import annotations

import mmap
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types (gguf_metadata_value_type).
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL = range(8)
T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(8, 13)

# Fixed-size scalar value types: struct code and numpy type code (endianness added at use).
_SCALAR_CODES = {
    T_UINT8: ("B", "u1"),
    T_INT8: ("b", "i1"),
    T_UINT16: ("H", "u2"),
    T_INT16: ("h", "i2"),
    T_UINT32: ("I", "u4"),
    T_INT32: ("i", "i4"),
    T_FLOAT32: ("f", "f4"),
    T_BOOL: ("?", "u1"),
    T_UINT64: ("Q", "u8"),
    T_INT64: ("q", "i8"),
    T_FLOAT64: ("d", "f8"),
}

VALUE_TYPE_NAMES = {
    T_UINT8: "UINT8", T_INT8: "INT8", T_UINT16: "UINT16", T_INT16: "INT16",
    T_UINT32: "UINT32", T_INT32: "INT32", T_FLOAT32: "FLOAT32", T_BOOL: "BOOL",
    T_STRING: "STRING", T_ARRAY: "ARRAY", T_UINT64: "UINT64", T_INT64: "INT64",
    T_FLOAT64: "FLOAT64",
}

# ggml tensor types that this reader dequantizes: id -> (name, elements per block, bytes per block).
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 6, 7, 12, 13, 14
GGML_TYPES = {
    GGML_F32: ("F32", 1, 4),
    GGML_F16: ("F16", 1, 2),
    GGML_Q4_0: ("Q4_0", 32, 2 + 16),
    GGML_Q4_1: ("Q4_1", 32, 2 + 2 + 16),
    GGML_Q5_0: ("Q5_0", 32, 2 + 4 + 16),
    GGML_Q5_1: ("Q5_1", 32, 2 + 2 + 4 + 16),
    GGML_Q8_0: ("Q8_0", 32, 2 + 32),
    GGML_Q4_K: ("Q4_K", 256, 2 + 2 + 12 + 128),
    GGML_Q5_K: ("Q5_K", 256, 2 + 2 + 12 + 32 + 128),
    GGML_Q6_K: ("Q6_K", 256, 128 + 64 + 16 + 2),
    GGML_BF16: ("BF16", 1, 2),
}
# Names of other ggml types, only so that error messages can say what was found.
_OTHER_GGML_TYPE_NAMES = {
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
    26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
}


def ggml_type_name(type_id: int) -> str:
    if type_id in GGML_TYPES:
        return GGML_TYPES[type_id][0]
    return _OTHER_GGML_TYPE_NAMES.get(type_id, f"type#{type_id}")


class GGUFError(ValueError):
    """A malformed or unsupported GGUF file; the message names the file and the place."""


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: innermost (contiguous) first
    type_id: int
    offset: int  # relative to the data section

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy (row-major) shape: GGUF dims reversed."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.type_id)

    def n_bytes(self) -> int:
        if self.type_id not in GGML_TYPES:
            raise GGUFError(f"tensor '{self.name}' has ggml type {self.type_name}, "
                            f"which this reader does not dequantize")
        _, block, block_bytes = GGML_TYPES[self.type_id]
        if self.dims and self.dims[0] % block != 0:
            raise GGUFError(f"tensor '{self.name}' of type {self.type_name} has row length "
                            f"{self.dims[0]}, not a multiple of the block size {block}")
        return self.n_elements // block * block_bytes


class _Cursor:
    """Sequential reads from a buffer with a fixed byte order."""

    def __init__(self, buf, path: str):
        self.buf = buf
        self.pos = 0
        self.path = path
        self.bo = "<"  # struct byte order; switched to ">" for big-endian files

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: unexpected end of file reading {what} at byte "
                            f"{self.pos} (needs {n} bytes, file has {len(self.buf)})")

    def scalar(self, code: str, what: str):
        size = struct.calcsize(code)
        self.need(size, what)
        (v,) = struct.unpack_from(self.bo + code, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("I", what)

    def u64(self, what: str) -> int:
        return self.scalar("Q", what)

    def string(self, what: str) -> str:
        n = self.u64(what + " length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: {what} at byte {self.pos - n} is not valid UTF-8: {e}")

    def array_of(self, np_code: str, count: int, what: str) -> np.ndarray:
        dt = np.dtype(np_code).newbyteorder(self.bo)
        n = dt.itemsize * count
        self.need(n, what)
        arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
        self.pos += n
        return arr

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR_CODES:
            v = self.scalar(_SCALAR_CODES[vtype][0], what)
            return bool(v) if vtype == T_BOOL else v
        if vtype == T_STRING:
            return self.string(what)
        if vtype == T_ARRAY:
            etype = self.u32(what + " element type")
            count = self.u64(what + " element count")
            if etype in _SCALAR_CODES:
                arr = self.array_of(_SCALAR_CODES[etype][1], count, what)
                if etype == T_BOOL:
                    return [bool(x) for x in arr]
                return arr.tolist()
            if etype not in (T_STRING, T_ARRAY):
                raise GGUFError(f"{self.path}: {what} has unknown array element type {etype}")
            return [self.value(etype, f"{what}[{i}]") for i in range(count)]
        raise GGUFError(f"{self.path}: {what} has unknown value type {vtype} at byte "
                        f"{self.pos - 4}")


class GGUFFile:
    """A parsed GGUF file. `metadata` maps key -> Python value (arrays are lists, possibly nested),
    `value_types` maps key -> GGUF value type, `tensors` maps name -> TensorInfo in file order."""

    def __init__(self, path: str):
        self.path = str(path)
        with open(self.path, "rb") as f:
            # An empty file cannot be mapped; let the header check report it instead.
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if \
                f.seek(0, 2) > 0 else b""
        cur = _Cursor(self._buf, self.path)
        cur.need(4, "magic")
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: magic is {magic!r}, expected {GGUF_MAGIC!r}")
        cur.pos = 4
        version = cur.u32("version")
        if version & 0xFFFF == 0 and version != 0:
            # A big-endian file: the version reads byte-swapped in little-endian order.
            cur.bo = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        self.byte_order = cur.bo
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported "
                            f"(expected 2 or 3)")
        self.version = version
        n_tensors = cur.u64("tensor_count")
        n_kv = cur.u64("metadata_kv_count")

        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, int] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.u32(f"value type of '{key}'")
            if key in self.metadata:
                raise GGUFError(f"{self.path}: metadata key '{key}' appears twice")
            self.metadata[key] = cur.value(vtype, f"metadata '{key}'")
            self.value_types[key] = vtype

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            a = self.metadata["general.alignment"]
            if self.value_types["general.alignment"] != T_UINT32 or a <= 0 or a % 8 != 0:
                raise GGUFError(f"{self.path}: general.alignment is {a!r} of type "
                                f"{VALUE_TYPE_NAMES.get(self.value_types['general.alignment'])}, "
                                f"expected a UINT32 multiple of 8")
            self.alignment = a

        self.tensors: dict[str, TensorInfo] = {}
        for i in range(n_tensors):
            name = cur.string(f"tensor #{i} name")
            n_dims = cur.u32(f"tensor '{name}' n_dims")
            dims = tuple(int(cur.u64(f"tensor '{name}' dim {d}")) for d in range(n_dims))
            type_id = cur.u32(f"tensor '{name}' type")
            offset = cur.u64(f"tensor '{name}' offset")
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor '{name}' appears twice")
            if offset % self.alignment != 0:
                raise GGUFError(f"{self.path}: tensor '{name}' offset {offset} is not a multiple "
                                f"of the alignment {self.alignment}")
            self.tensors[name] = TensorInfo(name, dims, type_id, offset)

        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        if n_tensors and self.data_offset > len(self._buf):
            raise GGUFError(f"{self.path}: data section would start at byte {self.data_offset}, "
                            f"past the end of the file ({len(self._buf)} bytes)")
        for info in self.tensors.values():
            if info.type_id not in GGML_TYPES:
                continue  # size unknown here; reading it raises a clear error
            end = self.data_offset + info.offset + info.n_bytes()
            if end > len(self._buf):
                raise GGUFError(f"{self.path}: tensor '{info.name}' ({info.type_name}, dims "
                                f"{list(info.dims)}) ends at byte {end}, past the end of the "
                                f"file ({len(self._buf)} bytes)")

    # -- metadata helpers -----------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata key '{key}' is missing")
        return self.metadata[key]

    # -- tensor data ----------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a uint8 array (a view into the mapped file)."""
        info = self._info(name)
        n = info.n_bytes()
        start = self.data_offset + info.offset
        if start + n > len(self._buf):
            raise GGUFError(f"{self.path}: tensor '{name}' ({info.type_name}, dims "
                            f"{list(info.dims)}) needs bytes [{start}, {start + n}), the file "
                            f"has {len(self._buf)}")
        return np.frombuffer(self._buf, dtype=np.uint8, count=n, offset=start)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, in numpy (row-major) shape: GGUF dims reversed."""
        info = self._info(name)
        flat = dequantize(self.raw(name), info.type_id, info.n_elements, self.byte_order)
        return flat.reshape(info.shape)

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: tensor '{name}' not found "
                            f"({len(self.tensors)} tensors in the file)")
        return self.tensors[name]


def dequantize(raw: np.ndarray, type_id: int, n_elements: int, byte_order: str = "<") -> np.ndarray:
    """Dequantize `raw` (uint8 bytes of one tensor) of ggml type `type_id` to a flat float32 array.

    Q8_0 block (34 bytes): fp16 d, int8 qs[32]; x[j] = d * qs[j].
    Q4_0 block (18 bytes): fp16 d, uint8 qs[16]; x[j] = d * ((qs[j] & 15) - 8) and
    x[j + 16] = d * ((qs[j] >> 4) - 8) for j in 0..15.
    Q4_1 block (20 bytes): fp16 d, fp16 m, uint8 qs[16]; x[j] = d * (qs[j] & 15) + m and
    x[j + 16] = d * (qs[j] >> 4) + m.
    Q5_0 block (22 bytes): fp16 d, uint32 qh, uint8 qs[16]; value j < 16 is (qs[j] & 15) with bit j
    of qh as its fifth bit, value j + 16 is (qs[j] >> 4) with bit j + 16; x = d * (value - 16).
    Q5_1 block (24 bytes): fp16 d, fp16 m, then Q5_0's qh and qs; x = d * value + m.
    The K-quants hold super-blocks of 256 in sub-blocks with 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K)
    scales, see _k_quant below.
    """
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    bo = byte_order
    if type_id == GGML_F32:
        out = raw.view(np.dtype("f4").newbyteorder(bo)).astype(np.float32)
    elif type_id == GGML_F16:
        out = raw.view(np.dtype("f2").newbyteorder(bo)).astype(np.float32)
    elif type_id == GGML_BF16:
        # bf16 is the top half of a float32: widen the bits and reinterpret.
        bits = raw.view(np.dtype("u2").newbyteorder(bo)).astype(np.uint32) << 16
        out = bits.view(np.float32)
    elif type_id == GGML_Q8_0:
        block = np.dtype([("d", np.dtype("f2").newbyteorder(bo)), ("qs", "i1", (32,))])
        b = raw.view(block)
        out = (b["d"].astype(np.float32)[:, None] * b["qs"].astype(np.float32)).reshape(-1)
    elif type_id == GGML_Q4_0:
        block = np.dtype([("d", np.dtype("f2").newbyteorder(bo)), ("qs", "u1", (16,))])
        b = raw.view(block)
        qs = b["qs"]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
        out = (b["d"].astype(np.float32)[:, None] * q.astype(np.float32)).reshape(-1)
    elif type_id == GGML_Q4_1:
        f2 = np.dtype("f2").newbyteorder(bo)
        block = np.dtype([("d", f2), ("m", f2), ("qs", "u1", (16,))])
        b = raw.view(block)
        qs = b["qs"]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        out = (b["d"].astype(np.float32)[:, None] * q + b["m"].astype(np.float32)[:, None]).reshape(-1)
    elif type_id in (GGML_Q5_0, GGML_Q5_1):
        f2 = np.dtype("f2").newbyteorder(bo)
        fields = [("d", f2)] + ([("m", f2)] if type_id == GGML_Q5_1 else [])
        block = np.dtype(fields + [("qh", np.dtype("u4").newbyteorder(bo)), ("qs", "u1", (16,))])
        b = raw.view(block)
        qs = b["qs"]
        fifth = ((b["qh"][:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        q = (np.concatenate([qs & 0x0F, qs >> 4], axis=1) | fifth).astype(np.float32)
        d = b["d"].astype(np.float32)[:, None]
        out = (d * q + b["m"].astype(np.float32)[:, None] if type_id == GGML_Q5_1 else d * (q - 16)).reshape(-1)
    elif type_id in (GGML_Q4_K, GGML_Q5_K, GGML_Q6_K):
        out = _k_quant(raw, type_id, bo)
    else:
        raise GGUFError(f"ggml type {ggml_type_name(type_id)} is not supported by this reader "
                        f"(supported: {', '.join(v[0] for v in GGML_TYPES.values())})")
    if out.size != n_elements:
        raise GGUFError(f"{ggml_type_name(type_id)} data holds {out.size} elements, "
                        f"expected {n_elements}")
    return out


def _k_quant(raw: np.ndarray, type_id: int, bo: str) -> np.ndarray:
    """Q4_K, Q5_K and Q6_K super-blocks of 256 values, as the GGUF specification lays them out.

    Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes of eight 6-bit scales and eight 6-bit mins,
    qs[128]. Sub-block j < 4 has scale scales[j] & 63 and min scales[j + 4] & 63; j >= 4 has
    scale (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4 and min (scales[j + 4] >> 4) |
    (scales[j] >> 6) << 4. Bytes qs[32i .. 32i + 31] hold sub-block 2i in their low nibbles and
    2i + 1 in their high ones; x = d * scale * q - dmin * min.
    Q5_K (176 bytes): Q4_K's header, qh[32], qs[128]; sub-block s's fifth bit of value l is bit s
    of qh[l].
    Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d. Half h (128 values) uses
    ql[64h ..], qh[32h ..]; value 32k + l (k < 4, l < 32) of the half is ql[64h + l + 32 (k & 1)]'s
    low (k < 2) or high nibble with bits 2k, 2k + 1 of qh[32h + l] above it, minus 32, times
    d * scales[8h + 2k + l // 16].
    """
    f2 = np.dtype("f2").newbyteorder(bo)
    if type_id == GGML_Q6_K:
        b = raw.view(np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("sc", "i1", (16,)), ("d", f2)]))
        n = b.shape[0]
        ql = b["ql"].reshape(n, 2, 2, 32)   # [block, half, which 32 bytes, l]
        qh = b["qh"].reshape(n, 2, 1, 32)
        low = np.stack([ql[:, :, 0] & 15, ql[:, :, 1] & 15, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
        high = np.stack([(qh[:, :, 0] >> (2 * k)) & 3 for k in range(4)], axis=2)
        q = (low | (high << 4)).astype(np.float32) - 32          # [block, half, k, l]
        sc = b["sc"].astype(np.float32).reshape(n, 2, 4, 2)      # [block, half, k, l // 16]
        scale = np.repeat(sc, 16, axis=3) * b["d"].astype(np.float32)[:, None, None, None]
        return (q * scale).reshape(-1)
    fields = [("d", f2), ("dmin", f2), ("scales", "u1", (12,))]
    if type_id == GGML_Q5_K:
        fields.append(("qh", "u1", (32,)))
    b = raw.view(np.dtype(fields + [("qs", "u1", (128,))]))
    n = b.shape[0]
    s12 = b["scales"].astype(np.uint32)
    sc = np.empty((n, 8), np.float32)
    mn = np.empty((n, 8), np.float32)
    for j in range(8):
        if j < 4:
            sc[:, j] = s12[:, j] & 63
            mn[:, j] = s12[:, j + 4] & 63
        else:
            sc[:, j] = (s12[:, j + 4] & 15) | ((s12[:, j - 4] >> 6) << 4)
            mn[:, j] = (s12[:, j + 4] >> 4) | ((s12[:, j] >> 6) << 4)
    qs = b["qs"].reshape(n, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)  # sub-block 2i, 2i + 1
    if type_id == GGML_Q5_K:
        qh = b["qh"][:, None, :]                                                       # [block, 1, l]
        q += (((qh >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) * 16).astype(np.float32)
    d = b["d"].astype(np.float32)[:, None, None]
    dmin = b["dmin"].astype(np.float32)[:, None, None]
    return (d * sc[:, :, None] * q - dmin * mn[:, :, None]).reshape(-1)


def _short(v: Any) -> str:
    if isinstance(v, list):
        head = ", ".join(_short(x) for x in v[:4])
        return f"[{head}{', ...' if len(v) > 4 else ''}] (len {len(v)})"
    return repr(v)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gguf_reader.py FILE.gguf", file=sys.stderr)
        return 2
    g = GGUFFile(argv[1])
    print(f"GGUF v{g.version} byte order {g.byte_order} alignment {g.alignment} "
          f"data at {g.data_offset}")
    for k, v in g.metadata.items():
        print(f"  {k} ({VALUE_TYPE_NAMES[g.value_types[k]]}) = {_short(v)}")
    for t in g.tensors.values():
        print(f"  tensor {t.name} {t.type_name} dims {list(t.dims)} offset {t.offset}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
