#!/usr/bin/env bash
# usage: run_batch_test.sh DUET_BINARY WORK_DIR
# `duet run-batch` (OpenAI's batch file format) on a real model, against a real `duet serve` with
# the same settings:
#   - chat, completions, embeddings and Responses lines get the bodies the server answers over
#     HTTP for the same requests (greedy texts, token counts, embedding vectors), one output line
#     per request in the input's order, with custom_id, status_code and request_id;
#   - lines the server refuses carry its error (404 for a model it does not serve, 400 for a bad
#     parameter), lines that are not requests an error code, and the exit status is 1;
#   - a file of good lines exits 0, from stdin to stdout as well;
#   - 24 prompts run at once (--max-num-seqs 8) give the texts they give one at a time;
#   - input and output as http URLs (GET and PUT against a small server of the test's); a PUT that
#     keeps failing leaves the results in a local file;
#   - a missing input file or an output folder that does not exist stops it at once, naming it.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type f32 --seed 23 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
kv=(--kv-cache-memory 33554432 --threads 1)

# The good lines: each body is also sent to the server below.
$py - <<'PY'
import json
good = [
    ("chat-1", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
                                        "max_tokens": 12, "temperature": 0, "ignore_eos": True}),
    ("comp-1", "/v1/completions", {"model": "tiny", "prompt": [5, 77, 300, 12, 9, 41], "max_tokens": 8, "temperature": 0,
                                   "ignore_eos": True, "logprobs": 1}),
    ("comp-2", "/v1/completions", {"prompt": ["alpha beta", "gamma"], "max_tokens": 6, "temperature": 0, "ignore_eos": True}),
    ("emb-1", "/v1/embeddings", {"model": "tiny", "input": ["the first text", "a second one"]}),
    ("resp-1", "/v1/responses", {"model": "tiny", "input": "Say something.", "max_output_tokens": 7, "temperature": 0}),
    ("seeded", "/v1/chat/completions", {"messages": [{"role": "user", "content": "pick"}], "max_tokens": 6, "temperature": 1.0,
                                        "seed": 11, "ignore_eos": True}),
]
bad = [
    ("unknown-model", "/v1/completions", {"model": "other", "prompt": "x", "max_tokens": 2}),
    ("bad-param", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": -3}),
]
with open("good.jsonl", "w") as f:
    for cid, url, body in good:
        f.write(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n")
with open("all.jsonl", "w") as f:
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) for cid, url, body in good + bad]
    lines.insert(3, "")                       # blank: skipped
    lines.insert(5, "{this is not json")      # an error line, in its place
    lines.append(json.dumps({"custom_id": "streamed", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "x", "stream": True}}))
    lines.append(json.dumps({"custom_id": "models", "method": "POST", "url": "/v1/models", "body": {}}))
    f.write("\n".join(lines) + "\n")
json.dump([[cid, url, body] for cid, url, body in good], open("good.json", "w"))
PY

"$duet" run-batch -i all.jsonl -o all.out.jsonl -m tiny.gguf --served-model-name tiny "${kv[@]}" > run.out 2> run.err
rc=$?
if [ "$rc" = 1 ]; then pass "a batch with failed lines exits 1"; else failed "exit status $rc with failed lines"; cat run.err; fi
contains "the summary counts the lines" "11 requests, 6 succeeded, 5 failed" run.err

start_server ref --served-model-name tiny || exit 1
# The server's answer to each good body.
$py - "$PORT" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
out = {}
for cid, url, body in json.load(open("good.json")):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{url}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out[cid] = json.load(urllib.request.urlopen(req))
json.dump(out, open("served.json", "w"))
PY
[ -s served.json ] || failed "the server answered the reference requests"

if $py - <<'PY'
import json
served = json.load(open("served.json"))
lines = [json.loads(l) for l in open("all.out.jsonl")]
ids = [l["custom_id"] for l in lines]
assert ids == ["chat-1", "comp-1", "comp-2", "emb-1", None, "resp-1", "seeded", "unknown-model", "bad-param",
               "streamed", "models"], ids
for l in lines:
    assert list(l) == ["id", "custom_id", "response", "error"], list(l)
    assert l["id"].startswith("batch_req_"), l["id"]

def same_choices(a, b, key):
    assert len(a["choices"]) == len(b["choices"]), (a, b)
    for x, y in zip(a["choices"], b["choices"]):
        assert x[key] == y[key], (x, y)
        assert x["finish_reason"] == y["finish_reason"], (x, y)

by_id = {l["custom_id"]: l for l in lines}
for cid, want in served.items():
    l = by_id[cid]
    assert l["error"] is None and l["response"]["status_code"] == 200, l
    assert l["response"]["request_id"], l
    got = l["response"]["body"]
    assert got["object"] == want["object"], (got, want)
    if cid.startswith("chat") or cid == "seeded":
        same_choices(got, want, "message")
        assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"], (got, want)
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"], (got, want)
    elif cid.startswith("comp"):
        same_choices(got, want, "text")
        if cid == "comp-1":
            assert got["choices"][0]["logprobs"]["tokens"] == want["choices"][0]["logprobs"]["tokens"]
    elif cid.startswith("emb"):
        assert len(got["data"]) == 2
        for x, y in zip(got["data"], want["data"]):
            assert len(x["embedding"]) == len(y["embedding"]) > 0
            assert max(abs(p - q) for p, q in zip(x["embedding"], y["embedding"])) < 1e-6
    elif cid.startswith("resp"):
        assert got["output"][-1]["content"][0]["text"] == want["output"][-1]["content"][0]["text"], (got, want)
        assert got["usage"]["output_tokens"] == want["usage"]["output_tokens"] == 7, got["usage"]
    assert got.get("model", "tiny") == "tiny"
# Error lines: the server's own errors, and lines that never ran.
u = by_id["unknown-model"]["response"]
assert u["status_code"] == 404 and u["body"]["error"]["code"] == "model_not_found", u
b = by_id["bad-param"]["response"]
assert b["status_code"] == 400 and b["body"]["error"]["type"] == "invalid_request_error", b
assert lines[4]["response"] is None and lines[4]["error"]["code"] == "invalid_json", lines[4]
assert "line 6" in lines[4]["error"]["message"], lines[4]
assert by_id["streamed"]["error"]["code"] == "invalid_request", by_id["streamed"]
assert by_id["models"]["error"]["code"] == "invalid_url", by_id["models"]
PY
then pass "each line's body is the server's answer to the same request, in the input's order"
else failed "run-batch output against the server's answers"; fi

# Only good lines, from stdin to stdout: exit 0 and the same bodies.
"$duet" run-batch -i - -o - -m tiny.gguf --served-model-name tiny "${kv[@]}" < good.jsonl > stdout.jsonl 2> stdin.err
rc=$?
if [ "$rc" = 0 ] && $py - <<'PY'
import json
a = [json.loads(l) for l in open("stdout.jsonl")]
b = {l["custom_id"]: l for l in map(json.loads, open("all.out.jsonl"))}
assert [l["custom_id"] for l in a] == ["chat-1", "comp-1", "comp-2", "emb-1", "resp-1", "seeded"]
for l in a:
    x, y = l["response"]["body"], b[l["custom_id"]]["response"]["body"]
    if "choices" in x:
        assert [c.get("text", c.get("message")) for c in x["choices"]] == [c.get("text", c.get("message")) for c in y["choices"]]
PY
then pass "stdin to stdout, every line good: exit 0"; else failed "stdin to stdout (exit $rc)"; cat stdin.err; fi

# 24 prompts: all at once against one at a time.
$py - <<'PY'
import json
with open("many.jsonl", "w") as f:
    for i in range(24):
        body = {"prompt": [3 + i, 40 + 2 * i, 7, 90 + i], "max_tokens": 5 + i % 4, "temperature": 0, "ignore_eos": True}
        f.write(json.dumps({"custom_id": f"m{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
PY
"$duet" run-batch -i many.jsonl -o many.8.jsonl -m tiny.gguf "${kv[@]}" --max-num-seqs 8 2> many8.err
rc8=$?
"$duet" run-batch -i many.jsonl -o many.1.jsonl -m tiny.gguf "${kv[@]}" --max-num-seqs 1 2> many1.err
rc1=$?
if [ "$rc8$rc1" = 00 ] && $py - <<'PY'
import json
a = [json.loads(l) for l in open("many.8.jsonl")]
b = [json.loads(l) for l in open("many.1.jsonl")]
assert [l["custom_id"] for l in a] == [f"m{i}" for i in range(24)] == [l["custom_id"] for l in b]
for x, y in zip(a, b):
    tx, ty = x["response"]["body"]["choices"][0]["text"], y["response"]["body"]["choices"][0]["text"]
    assert tx == ty, (x["custom_id"], tx, ty)
    assert x["response"]["body"]["usage"]["completion_tokens"] == 5 + int(x["custom_id"][1:]) % 4
PY
then pass "24 prompts at once give the texts they give one at a time"; else failed "24 prompts (exit $rc8, $rc1)"; cat many8.err; fi

# http(s) URLs (vLLM's, for object stores): the input read with GET, the results sent with PUT;
# a PUT that keeps failing leaves the results in a local file and says where.
$py - > store.port 2> store.log <<'PY' &
import http.server, os, sys
class Store(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        path = "store" + self.path
        if not os.path.isfile(path):
            self.send_response(404); self.end_headers(); return
        data = open(path, "rb").read()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_PUT(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.startswith("/broken"):
            self.send_response(500); self.send_header("Content-Length", "0"); self.end_headers(); return
        open("store" + self.path, "wb").write(data)
        self.send_response(201); self.send_header("Content-Length", "0"); self.end_headers()
os.makedirs("store", exist_ok=True)
server = http.server.HTTPServer(("127.0.0.1", 0), Store)
print(server.server_port, flush=True)
server.serve_forever()
PY
pids+=($!)
for _ in $(seq 1 50); do [ -s store.port ] && break; sleep 0.1; done
sport=$(cat store.port)
mkdir -p store && cp good.jsonl store/in.jsonl
"$duet" run-batch -i "http://127.0.0.1:$sport/in.jsonl" -o "http://127.0.0.1:$sport/out.jsonl" -m tiny.gguf \
  --served-model-name tiny "${kv[@]}" 2> url.err
rc=$?
if [ "$rc" = 0 ] && $py - <<'PY'
import json
a = [json.loads(l) for l in open("store/out.jsonl")]
b = [json.loads(l) for l in open("stdout.jsonl")]
assert [l["custom_id"] for l in a] == [l["custom_id"] for l in b]
for x, y in zip(a, b):
    bx, by = x["response"]["body"], y["response"]["body"]
    if "choices" in bx:
        assert [c.get("text", c.get("message")) for c in bx["choices"]] == [c.get("text", c.get("message")) for c in by["choices"]]
PY
then pass "input from a URL (GET), results to a URL (PUT)"; else failed "run-batch with URLs (exit $rc)"; cat url.err; fi
expect_fail "an input URL that answers 404" "GET answered 404" \
  "$duet" run-batch -i "http://127.0.0.1:$sport/absent.jsonl" -o x.jsonl -m tiny.gguf "${kv[@]}"
expect_fail "an output URL that keeps failing" "the results are in run-batch-output-[0-9]+\.jsonl" \
  "$duet" run-batch -i good.jsonl -o "http://127.0.0.1:$sport/broken/out.jsonl" -m tiny.gguf "${kv[@]}"
kept=$(grep -oE 'run-batch-output-[0-9]+\.jsonl' err.txt | head -1)
if [ -n "$kept" ] && [ "$(wc -l < "$kept")" = 6 ]; then pass "the results kept locally"; else failed "kept results: '$kept'"; fi

expect_fail "a missing input file" "cannot read the batch input 'absent.jsonl'" \
  "$duet" run-batch -i absent.jsonl -o x.jsonl -m tiny.gguf "${kv[@]}"
expect_fail "an output folder that does not exist" "cannot write the batch output 'no/such/dir/out.jsonl'" \
  "$duet" run-batch -i good.jsonl -o no/such/dir/out.jsonl -m tiny.gguf "${kv[@]}"
expect_fail "a model that does not load" "absent.gguf" \
  "$duet" run-batch -i good.jsonl -o y.jsonl -m absent.gguf "${kv[@]}"

echo "$failures failure(s)"
[ "$failures" = 0 ]
