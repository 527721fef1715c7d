#!/usr/bin/python3
"""Soak and overload: drives `duet serve` for a long time with more than it can serve.

usage: bench/soak.py --model M.gguf [--minutes 30] [--clients 24] [--out DIR] [--duet BIN] [-- SERVE_FLAGS...]

Clients send, at random: chat requests without and with streaming (their text is checked), streams
the client leaves after two chunks, prompts longer than the context, and malformed bodies. The
server is started here with 8 sequences at a time and a queue of 8, so part of the load is
refused with 503 and Retry-After (the client then waits as told): that is the server protecting
itself, not a loss.

Every 10 s the server's resident memory, open file descriptors, KV blocks in use and the counts
so far go to DIR/samples.csv. At the end, once the load stops, it fails (exit 1) when:
- a valid request was lost: a connection error, a status other than 200 or 503, a 200 without
  text, or a stream that ended without [DONE];
- a bad request did not get its 400;
- memory grew without bound: the resident size of the last fifth of the run is more than 10%
  (plus 64 MiB) above that of the second fifth (the first is warm-up);
- descriptors grew: more open at the end, idle, than at the start idle (plus 4);
- KV blocks stay in use after the load stopped and every request finished.
"""
import argparse
import csv
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DUET = os.path.join(HERE, "..", "build", "duet")

WORDS = ("the model serves requests from many clients at once while memory stays flat and every "
         "valid request is answered in time under load with streams and errors").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {}
        self.lost = []

    def add(self, key, n=1):
        with self.lock:
            self.c[key] = self.c.get(key, 0) + n

    def lose(self, what):
        with self.lock:
            self.c["lost"] = self.c.get("lost", 0) + 1
            if len(self.lost) < 50:
                self.lost.append(what)

    def snapshot(self):
        with self.lock:
            return dict(self.c)


def prompt(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def post(port, path, body, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def retry_after(resp):
    try:
        return min(5.0, float(resp.getheader("Retry-After", "1")))
    except ValueError:
        return 1.0


def client(port, rng, counts, stop, max_len):
    while not stop.is_set():
        kind = rng.choices(["chat", "stream", "leave", "too_long", "malformed"], [35, 35, 10, 10, 10])[0]
        try:
            if kind in ("chat", "stream", "leave"):
                body = json.dumps({"model": "soak", "stream": kind != "chat", "max_tokens": rng.randint(8, 48),
                                   "messages": [{"role": "user", "content": prompt(rng, rng.randint(4, 60))}]})
                conn, resp = post(port, "/v1/chat/completions", body)
                if resp.status == 503:
                    resp.read()
                    counts.add("refused_503")
                    conn.close()
                    time.sleep(retry_after(resp))
                    continue
                if resp.status != 200:
                    counts.lose(f"{kind}: status {resp.status}: {resp.read()[:200]!r}")
                    conn.close()
                    continue
                if kind == "chat":
                    out = json.loads(resp.read())
                    choice = out["choices"][0]
                    # A random-weights model may end at once (its first token end-of-sequence): an
                    # answer is a finished choice with the tokens it counts.
                    if choice["finish_reason"] not in ("stop", "length") or out["usage"]["completion_tokens"] < 1 \
                            or not isinstance(choice["message"].get("content"), str):
                        counts.lose(f"chat: 200 without an answer: {out}")
                    else:
                        counts.add("ok_chat")
                elif kind == "leave":
                    for _ in range(2):
                        resp.readline()
                    conn.sock.shutdown(socket.SHUT_RDWR)
                    conn.close()
                    counts.add("left_mid_stream")
                    continue
                else:
                    done, error = False, None
                    for raw in resp:
                        line = raw.decode().strip()
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: ") and '"error"' in line:
                            error = line
                    if error is not None:
                        counts.lose(f"stream: error event {error[:200]}")
                    elif not done:
                        counts.lose("stream: ended without [DONE]")
                    else:
                        counts.add("ok_stream")
                conn.close()
            elif kind == "too_long":
                body = json.dumps({"model": "soak", "max_tokens": 4,
                                   "prompt": " ".join(["word"] * (max_len + 50))})
                conn, resp = post(port, "/v1/completions", body)
                resp.read()
                conn.close()
                if resp.status == 503:
                    counts.add("refused_503")
                    time.sleep(retry_after(resp))
                elif resp.status != 400:
                    counts.add("bad_not_400")
                    counts.lose(f"too_long: status {resp.status}")
                else:
                    counts.add("ok_400")
            else:
                body = rng.choice(['{"model": "soak", "messages": [', '{"messages": 5}', 'not json',
                                   '{"model": "soak", "messages": [{"role": "user", "content": "x"}], "n": -1}',
                                   '{"model": "soak", "prompt": "x", "temperature": "hot"}'])
                conn, resp = post(port, "/v1/chat/completions" if "messages" in body else "/v1/completions", body)
                resp.read()
                conn.close()
                if resp.status == 503:
                    counts.add("refused_503")
                    time.sleep(retry_after(resp))
                elif resp.status != 400:
                    counts.lose(f"malformed: status {resp.status} for {body}")
                else:
                    counts.add("ok_400")
        except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
            counts.lose(f"{kind}: {type(e).__name__}: {e}")


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def sample(pid, port):
    with open(f"/proc/{pid}/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) * 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    usage = metric(text, "vllm:kv_cache_usage_perc") or 0.0
    blocks = metric(text, "duet:kv_cache_blocks") or 0.0
    running = metric(text, "vllm:num_requests_running") or 0.0
    waiting = metric(text, "vllm:num_requests_waiting") or 0.0
    return rss, fds, round(usage * blocks), running, waiting


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--max-model-len", type=int, default=512)
    # The pool's pages are touched as blocks are first used, so the resident size grows until the
    # whole pool has been used once: a pool of a fixed size makes that growth end early in the run.
    ap.add_argument("--kv-cache-mib", type=int, default=64)
    ap.add_argument("--out", default="soak-out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duet", default=DUET, help="the binary (default: build/duet of this checkout)")
    ap.add_argument("serve_flags", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    port = free_port()
    log = open(os.path.join(a.out, "server.log"), "w")
    server = subprocess.Popen([a.duet, "serve", "--model", a.model, "--served-model-name", "soak", "--port", str(port),
                               "--max-model-len", str(a.max_model_len), "--max-num-seqs", "8", "--max-queued-requests", "8",
                               "--kv-cache-memory", str(a.kv_cache_mib << 20),
                               *a.serve_flags], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                sys.exit(f"FAIL: the server exited ({server.returncode}) before it was ready; see {a.out}/server.log")
            time.sleep(0.5)
        start_rss, start_fds, _, _, _ = sample(server.pid, port)
        counts, stop = Counts(), threading.Event()
        threads = [threading.Thread(target=client, args=(port, random.Random(a.seed * 1000 + i), counts, stop,
                                                         a.max_model_len), daemon=True) for i in range(a.clients)]
        for t in threads:
            t.start()
        rows = []
        t0 = time.time()
        with open(os.path.join(a.out, "samples.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["seconds", "rss_bytes", "open_fds", "kv_blocks_in_use", "running", "waiting", "ok_chat",
                        "ok_stream", "left_mid_stream", "ok_400", "refused_503", "lost"])
            while time.time() - t0 < a.minutes * 60:
                time.sleep(10)
                if server.poll() is not None:
                    sys.exit(f"FAIL: the server died (exit {server.returncode}) after {time.time() - t0:.0f} s")
                rss, fds, kv, running, waiting = sample(server.pid, port)
                c = counts.snapshot()
                row = [round(time.time() - t0), rss, fds, kv, running, waiting] + [
                    c.get(k, 0) for k in ("ok_chat", "ok_stream", "left_mid_stream", "ok_400", "refused_503", "lost")]
                rows.append(row)
                w.writerow(row)
                f.flush()
                print(" ".join(f"{h}={v}" for h, v in zip(["t", "rss", "fds", "kv", "run", "wait", "chat", "stream",
                                                             "left", "400", "503", "lost"], row)), flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=600)
        # Idle: every request finished (the running and waiting gauges at 0), then the last sample.
        for _ in range(120):
            rss, fds, kv, running, waiting = sample(server.pid, port)
            if running == 0 and waiting == 0:
                break
            time.sleep(1)
        time.sleep(2)
        end_rss, end_fds, end_kv, _, _ = sample(server.pid, port)
        c = counts.snapshot()
        fifth = max(1, len(rows) // 5)
        early = statistics.median(r[1] for r in rows[fifth:2 * fifth]) if len(rows) >= 5 else start_rss
        late = statistics.median(r[1] for r in rows[-fifth:])
        failures = []
        if c.get("lost", 0) > 0:
            failures.append(f"{c['lost']} valid requests lost, e.g. {counts.lost[:5]}")
        if late > early * 1.10 + (64 << 20):
            failures.append(f"resident memory grew from {early / 2**20:.0f} MiB to {late / 2**20:.0f} MiB")
        if end_fds > start_fds + 4:
            failures.append(f"open descriptors {start_fds} at the start, {end_fds} at the end (idle both times)")
        if end_kv > 0:
            failures.append(f"{end_kv} KV blocks still in use with no request running")
        summary = {
            "minutes": a.minutes, "clients": a.clients, "counts": c,
            "rss_mib": {"start": round(start_rss / 2**20, 1), "second_fifth": round(early / 2**20, 1),
                        "last_fifth": round(late / 2**20, 1), "end": round(end_rss / 2**20, 1),
                        "max": round(max(r[1] for r in rows) / 2**20, 1) if rows else None},
            "open_fds": {"start": start_fds, "max": max((r[2] for r in rows), default=None), "end": end_fds},
            "kv_blocks_in_use_end": end_kv, "failures": failures,
        }
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(json.dumps(summary, indent=2))
        if failures:
            print("FAIL: " + "; ".join(failures))
            sys.exit(1)
        print("ok: soak passed")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
