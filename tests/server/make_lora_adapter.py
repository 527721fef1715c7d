"""Writes a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors, F32) with
random A and B for a llama-shaped model, for the server tests; the standard library only.

    make_lora_adapter.py --out DIR --layers N --hidden H --q-dim Q --kv-dim K --ff F
                         [--rank 4] [--alpha 8] [--seed 1] [--modules q_proj,v_proj,...] [--std-b 0.3]
                         [--extra PATH=OUTxIN@FIRST-LAST ...]

--extra adds a module of any other shape on a range of layers, PATH inside model.layers.N
("self_attn.kv_b_proj", "mlp.shared_experts.up_proj": deepseek2's); with --modules "" the
adapter holds only those.

    make_lora_adapter.py --out DIR --deepseek2 INSPECT.txt [--rank ...]

writes one on every projection duet updates in a deepseek2 model (MLA's query, kv_a, kv_b and o,
the dense layers' feed-forward, the shared and every routed expert), its sizes read from what
`duet inspect` printed for the model.
"""
import argparse
import json
import os
import random
import struct

SHAPES = {  # (out, in) of each projection
    "q_proj": ("q", "h"), "k_proj": ("kv", "h"), "v_proj": ("kv", "h"), "o_proj": ("h", "q"),
    "gate_proj": ("ff", "h"), "up_proj": ("ff", "h"), "down_proj": ("h", "ff"),
}


def deepseek2_modules(inspect_path: str) -> list:
    """--extra specs for every projection of the deepseek2 (or deepseek32) model `duet inspect`
    described (deepseek32's indexer has no adapter modules)."""
    keys = {}
    for line in open(inspect_path):
        parts = line.strip().split(" = ")
        arch = parts[0].split(".")[0]
        if len(parts) == 2 and arch in ("deepseek2", "deepseek32") and parts[1].isdigit():
            keys[parts[0][len(arch) + 1:]] = int(parts[1])
    d, heads, last = keys["embedding_length"], keys["attention.head_count"], keys["block_count"] - 1
    kvl, rope = keys["attention.kv_lora_rank"], keys["rope.dimension_count"]
    qk, v = keys["attention.key_length"], keys["attention.value_length"]
    dense = keys.get("leading_dense_block_count", 0)
    every = f"0-{last}"
    out = []
    if "attention.q_lora_rank" in keys:
        ql = keys["attention.q_lora_rank"]
        out += [f"self_attn.q_a_proj={ql}x{d}@{every}", f"self_attn.q_b_proj={heads * qk}x{ql}@{every}"]
    else:
        out += [f"self_attn.q_proj={heads * qk}x{d}@{every}"]
    out += [f"self_attn.kv_a_proj_with_mqa={kvl + rope}x{d}@{every}",
            f"self_attn.kv_b_proj={heads * (qk - rope + v)}x{kvl}@{every}",
            f"self_attn.o_proj={d}x{heads * v}@{every}"]
    if dense > 0:
        ff = keys["feed_forward_length"]
        out += [f"mlp.gate_proj={ff}x{d}@0-{dense - 1}", f"mlp.up_proj={ff}x{d}@0-{dense - 1}",
                f"mlp.down_proj={d}x{ff}@0-{dense - 1}"]
    if dense <= last:
        eff, moe = keys["expert_feed_forward_length"], f"{dense}-{last}"
        shared = eff * keys.get("expert_shared_count", 0)
        if shared > 0:
            out += [f"mlp.shared_experts.gate_proj={shared}x{d}@{moe}", f"mlp.shared_experts.up_proj={shared}x{d}@{moe}",
                    f"mlp.shared_experts.down_proj={d}x{shared}@{moe}"]
        for e in range(keys["expert_count"]):
            out += [f"mlp.experts.{e}.gate_proj={eff}x{d}@{moe}", f"mlp.experts.{e}.up_proj={eff}x{d}@{moe}",
                    f"mlp.experts.{e}.down_proj={d}x{eff}@{moe}"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--layers", "--hidden", "--q-dim", "--kv-dim", "--ff"):
        ap.add_argument(name, type=int, default=0)
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--deepseek2", help="`duet inspect` output of a deepseek2 model: every projection of it")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modules", default=",".join(SHAPES))
    ap.add_argument("--std-b", type=float, default=0.3)
    a = ap.parse_args()
    if a.deepseek2:
        a.modules = ""
        a.extra += deepseek2_modules(a.deepseek2)
    dims = {"h": a.hidden, "q": a.q_dim, "kv": a.kv_dim, "ff": a.ff}
    rng = random.Random(a.seed)
    modules = [m for m in a.modules.split(",") if m]
    tensors = []
    for layer in range(a.layers):
        for m in modules:
            n_out, n_in = (dims[d] for d in SHAPES[m])
            part = "self_attn" if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            name = f"base_model.model.model.layers.{layer}.{part}.{m}"
            tensors.append((f"{name}.lora_A.weight", [a.rank, n_in], n_in ** -0.5))
            tensors.append((f"{name}.lora_B.weight", [n_out, a.rank], a.std_b))
    targets = list(modules)
    for spec in a.extra:
        path, rest = spec.split("=")
        size, layers = rest.split("@")
        n_out, n_in = (int(v) for v in size.split("x"))
        first, last = (int(v) for v in layers.split("-"))
        for layer in range(first, last + 1):
            name = f"base_model.model.model.layers.{layer}.{path}"
            tensors.append((f"{name}.lora_A.weight", [a.rank, n_in], n_in ** -0.5))
            tensors.append((f"{name}.lora_B.weight", [n_out, a.rank], a.std_b))
        if path.split(".")[-1] not in targets:
            targets.append(path.split(".")[-1])
    header, blobs, offset = {}, [], 0
    for name, shape, std in tensors:
        count = shape[0] * shape[1]
        blob = struct.pack(f"<{count}f", *(rng.gauss(0, std) for _ in range(count)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": a.rank, "lora_alpha": a.alpha, "target_modules": targets,
                   "bias": "none", "task_type": "CAUSAL_LM"}, f)


if __name__ == "__main__":
    main()
