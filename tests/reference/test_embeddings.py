"""duet's /v1/embeddings against the independent reference.

`duet serve` runs the model (port 0, an f32 KV cache, the exact matmul path: DUET_MATMUL=exact in
the test's environment); the inputs go as token ids, several in one request (computed in one step) and one
by one. The embedding of an input is its last token's final normalised hidden state: the
reference module's trace["result_norm"] at the last position (llama, qwen2, qwen3 or deepseek2
by general.architecture), optionally with the layers on several devices (--device-map). With
"normalize": false it is compared as it is, within 1e-4 of
(1 + max |ref|) as the logits are; by default it is the same vector at unit length.

Exit: 0 pass, 1 failure, 77 when numpy or torch is missing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import struct
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_common import report  # noqa: E402  (first: it exits 77 without numpy and torch)
from compare_logits import reference_for  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

REL_TOL = 1e-4


def start_server(duet: str, model: str, log: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    err = open(log, "w")
    proc = subprocess.Popen([duet, "serve", "--model", model, "--port", "0", "--threads", "1",
                             "--kv-cache-memory", str(32 << 20), "--kv-cache-dtype", "f32", *extra],
                            stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(600):
        text = open(log).read()
        if "duet: ready" in text:
            port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", text).group(1))
            return proc, port
        if proc.poll() is not None:
            raise RuntimeError(f"duet serve exited:\n{text}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("duet serve did not become ready")


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duet", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device-map", help="serve with this device map (the layers on several devices)")
    args = ap.parse_args()

    reference = reference_for(args.model)
    m = reference.load_model(args.model)
    vocab = m.cfg.vocab_size
    rng = np.random.default_rng(3)
    inputs = [rng.integers(0, vocab, size=n).tolist() for n in (1, 7, 33, 100)]
    want = []
    with torch.no_grad():
        for tokens in inputs:
            trace: dict = {}
            reference.forward(m, tokens, trace)
            want.append(trace["result_norm"][-1].double().numpy())

    failures: list[str] = []
    extra = ["--device-map", args.device_map] if args.device_map else []
    log = os.path.basename(args.model) + (".devices" if args.device_map else "") + ".serve.log"
    proc, port = start_server(args.duet, args.model, log, extra)
    try:
        together = post(port, {"input": inputs, "normalize": False})
        alone = [post(port, {"input": tokens, "normalize": False}) for tokens in inputs]
        unit = post(port, {"input": inputs})
        packed = post(port, {"input": inputs[2], "encoding_format": "base64"})
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    if together["usage"]["prompt_tokens"] != sum(len(t) for t in inputs):
        failures.append(f"usage {together['usage']} for {sum(len(t) for t in inputs)} tokens")
    for i, tokens in enumerate(inputs):
        r = want[i]
        scale = 1.0 + float(np.abs(r).max())
        for label, got in (("batched", together["data"][i]["embedding"]), ("alone", alone[i]["data"][0]["embedding"])):
            got = np.asarray(got, dtype=np.float64)
            if got.shape != r.shape:
                failures.append(f"input {i} ({label}): {got.shape[0]} values, the reference has {r.shape[0]}")
                continue
            err = float(np.abs(got - r).max())
            print(f"input {i} ({len(tokens)} tokens, {label}): max |duet - ref| = {err:.3e} "
                  f"(bound {REL_TOL * scale:.3e})")
            if not err <= REL_TOL * scale:
                failures.append(f"input {i} ({label}): max |duet - ref| = {err:.3e} > {REL_TOL * scale:.3e}")
        u = np.asarray(unit["data"][i]["embedding"], dtype=np.float64)
        expected = r / np.linalg.norm(r)
        if abs(np.linalg.norm(u) - 1.0) > 1e-5 or float(np.abs(u - expected).max()) > 1e-4:
            failures.append(f"input {i}: the normalised embedding is not the reference's at unit length "
                            f"(norm {np.linalg.norm(u):.6f}, max diff {float(np.abs(u - expected).max()):.3e})")
        if unit["data"][i]["index"] != i or unit["data"][i]["object"] != "embedding":
            failures.append(f"input {i}: data entry {unit['data'][i]['index']} {unit['data'][i]['object']}")
    raw = base64.b64decode(packed["data"][0]["embedding"])
    decoded = np.asarray(struct.unpack(f"<{len(raw) // 4}f", raw), dtype=np.float64)
    if decoded.shape != want[2].shape or float(np.abs(decoded - np.asarray(unit["data"][2]["embedding"])).max()) > 1e-7:
        failures.append("base64: not the float embedding's little-endian float32 bytes")
    where = f" on {args.device_map}" if args.device_map else ""
    return report(failures, f"embeddings of {os.path.basename(args.model)}{where}")


if __name__ == "__main__":
    sys.exit(main())
