#!/usr/bin/env bash
# usage: batches_test.sh DUET_BINARY WORK_DIR
# OpenAI's Files and Batches APIs on a real `duet serve`: the official openai client's whole batch
# job (batches_client_test.mjs), curl's multipart upload given back byte for byte, the file
# store's budget (--files-store-mib), the routes off with --files-store-mib 0, a server stopped
# (SIGTERM) while a batch runs, duet:batches and duet:files_bytes in /metrics, and --api-key.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"
require_npm openai

"$duet" make-model --preset tiny --type f32 --seed 29 --ctx 4096 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf

start_server main --served-model-name tiny --max-num-seqs 2 || exit 1
if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_DIR="$PWD" node "$here/batches_client_test.mjs" > client.txt 2>&1; then
  pass "the openai client's batch job ($(tail -1 client.txt))"
else
  failed "the openai client's batch job:"; cat client.txt
fi

# curl's multipart upload, given back byte for byte (a file with no newline at its end, and a
# line that starts like the boundary would).
printf '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "--x"}}\n--------\n{"x": 1}' > odd.jsonl
STATUS=$(curl -s -o up.json -w '%{http_code}' -F purpose=batch -F "file=@odd.jsonl;filename=odd.jsonl" "http://127.0.0.1:$PORT/v1/files")
id=$($py -c 'import json,sys; print(json.load(open("up.json"))["id"])' 2>/dev/null)
curl -s -o back.jsonl "http://127.0.0.1:$PORT/v1/files/$id/content"
if [ "$STATUS" = 200 ] && cmp -s odd.jsonl back.jsonl; then pass "curl -F upload given back byte for byte"
else failed "curl upload: $STATUS $(head -c 300 up.json)"; fi
expect_error "a JSON body is not an upload" 400 invalid_request_error - POST /v1/files '{"purpose": "batch"}'
expect_error "an upload without a file part" 400 invalid_request_error file POST /v1/files "" -F purpose=batch
expect_error "GET of a file that is not there" 404 invalid_request_error - GET /v1/files/file-none
expect_error "PUT /v1/batches" 405 invalid_request_error - PUT /v1/batches '{}'
# The metrics: the files' bytes and the batches by status (the client's job left these behind).
curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt
if grep -qE '^duet:batches\{model_name="tiny",status="completed"\} [1-9]' metrics.txt &&
   grep -qE '^duet:batches\{model_name="tiny",status="cancelled"\} 1$' metrics.txt &&
   grep -qE '^duet:files_bytes\{model_name="tiny"\} [1-9]' metrics.txt; then
  pass "duet:batches{status} and duet:files_bytes in /metrics"
else
  failed "batch metrics: $(grep -E 'duet:(batches|files)' metrics.txt)"
fi
kill "$PID"; wait "$PID" 2>/dev/null

# With --api-key: the routes need the key, and a batch's lines run as the batch's.
start_server keyed --api-key sekret || exit 1
expect_error "no key, no upload" 401 authentication_error - POST /v1/files "" -F purpose=batch -F file=@odd.jsonl
printf '{"custom_id": "k", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 3}}\n' > keyed.jsonl
request POST /v1/files "" -F purpose=batch -F file=@keyed.jsonl -H 'Authorization: Bearer sekret'
fid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
request POST /v1/batches "{\"input_file_id\": \"$fid\", \"endpoint\": \"/v1/completions\", \"completion_window\": \"24h\"}" \
  -H 'Authorization: Bearer sekret'
bid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
for _ in $(seq 1 100); do
  request GET "/v1/batches/$bid" "" -H 'Authorization: Bearer sekret'
  grep -q '"status":"completed"' resp.json && break
  sleep 0.1
done
if grep -q '"request_counts":{"completed":1,"failed":0,"total":1}' resp.json; then pass "a batch's lines run under --api-key"
else failed "a batch under --api-key: $(head -c 400 resp.json)"; fi
kill "$PID"; wait "$PID" 2>/dev/null

# The budget: a 1 MiB store takes a 600 KiB file once.
start_server small --files-store-mib 1 || exit 1
head -c 614400 /dev/zero | tr '\0' 'x' > big.txt
request POST /v1/files "" -F purpose=batch -F file=@big.txt
first=$STATUS
expect_error "a file past --files-store-mib" 400 invalid_request_error file POST /v1/files "" -F purpose=batch -F file=@big.txt
[ "$first" = 200 ] && pass "the first 600 KiB file fits" || failed "the first file: $first"
kill "$PID"; wait "$PID" 2>/dev/null

start_server none --files-store-mib 0 || exit 1
expect_error "no files with --files-store-mib 0" 400 invalid_request_error - GET /v1/files
expect_error "no batches with --files-store-mib 0" 400 invalid_request_error - GET /v1/batches
kill "$PID"; wait "$PID" 2>/dev/null

# SIGTERM while a batch runs: the batch is cancelled, the server stops in time, with status 0.
start_server stopping --max-num-seqs 1 || exit 1
$py - <<'PY'
import json
with open("slow.jsonl", "w") as f:
    for i in range(200):
        f.write(json.dumps({"custom_id": f"s{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": f"x {i}", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}}) + "\n")
PY
request POST /v1/files "" -F purpose=batch -F file=@slow.jsonl
fid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
request POST /v1/batches "{\"input_file_id\": \"$fid\", \"endpoint\": \"/v1/completions\", \"completion_window\": \"24h\"}"
bid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
sleep 1
request GET "/v1/batches/$bid"
grep -q '"status":"in_progress"' resp.json || failed "the slow batch is not in progress: $(head -c 300 resp.json)"
start=$(date +%s)
kill -TERM "$PID"; wait "$PID"; rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" = 0 ] && [ "$took" -le 10 ]; then pass "SIGTERM under a running batch: exit 0 in ${took} s"
else failed "SIGTERM under a running batch: exit $rc after ${took} s"; tail -5 stopping.err; fi

echo "$failures failure(s)"
[ "$failures" = 0 ]
