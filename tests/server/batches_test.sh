#!/usr/bin/env bash
# usage: batches_test.sh DUET_BINARY WORK_DIR
# OpenAI's Files and Batches APIs on a real `duet serve`: the official openai client's whole batch
# job (batches_client_test.mjs), curl's multipart upload given back byte for byte, the file
# store's budget (--files-store-mib), the routes off with --files-store-mib 0, a server stopped
# (SIGTERM) while a batch runs, duet:batches and duet:files_bytes in /metrics, and --api-key;
# with --files-dir, a server stopped halfway through a batch (SIGTERM, then kill -9) and the next
# one on the folder going on with it (each line answered once, as a direct request answers it),
# one server per folder; a file past --max-body-bytes sent in parts (the Uploads API), the server
# restarted halfway through; a 40 MB download read as the client takes it.
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

if "$duet" serve --model "$model_file" --port 0 --max-running-batches 0 > none.out 2> none.err; then
  failed "--max-running-batches 0 started"
elif grep -q "max-running-batches is 0, expected 1 to 64" none.err; then pass "--max-running-batches 0 is refused"
else failed "--max-running-batches 0: $(tail -3 none.err)"; fi
if "$duet" serve --model "$model_file" --port 0 --files-dir "$PWD/none" --files-store-mib 0 > none.out 2> none.err; then
  failed "--files-dir with --files-store-mib 0 started"
elif grep -q "keeps none" none.err; then pass "--files-dir with --files-store-mib 0 is refused"
else failed "--files-dir with --files-store-mib 0: $(tail -3 none.err)"; fi

# A file past --max-body-bytes goes up in parts through the Uploads API (curl), into a folder.
start_server parts --max-body-bytes 65536 --files-dir "$PWD/parts" || exit 1
$py -c 'import json; open("big.jsonl", "w").write("".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x" * 150}}) + "\n" for i in range(1000)))'
size=$(stat -c %s big.jsonl)
split -b 60000 -d big.jsonl big.part.
# Expect: 100-continue: the 413 comes before the body is sent (else curl may still be sending it when
# the server answers and closes).
expect_error "a file past --max-body-bytes in one request" 413 invalid_request_error - POST /v1/files "" -F purpose=batch -F file=@big.jsonl -H "Expect: 100-continue"
request POST /v1/uploads "{\"filename\": \"big.jsonl\", \"purpose\": \"batch\", \"bytes\": $size, \"mime_type\": \"text/jsonl\"}"
uid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
part_ids=""
sent=0
for f in big.part.*; do
  request POST "/v1/uploads/$uid/parts" "" -F "data=@$f"
  part_ids="$part_ids${part_ids:+,}\"$($py -c 'import json; print(json.load(open("resp.json"))["id"])')\""
  sent=$((sent + 1))
  if [ "$sent" = 2 ]; then
    # The server stops halfway through the upload; the next one on the folder goes on with it.
    kill "$PID"; wait "$PID" 2>/dev/null
    start_server parts2 --max-body-bytes 65536 --files-dir "$PWD/parts" || exit 1
  fi
done
request POST "/v1/uploads/$uid/complete" "{\"part_ids\": [$part_ids], \"md5\": \"$(md5sum < big.jsonl | cut -c1-32)\"}"
file_id=$($py -c 'import json; r = json.load(open("resp.json")); print(r["file"]["id"] if r.get("status") == "completed" else "")' 2>/dev/null)
curl -s -o big.back "http://127.0.0.1:$PORT/v1/files/$file_id/content"
if [ -n "$file_id" ] && cmp -s big.jsonl big.back && [ -s "parts/files/$file_id" ] && [ ! -e "parts/uploads/$uid" ] &&
   grep -q "pending uploads kept from before: 1" parts2.err; then
  pass "a $size-byte file in $(ls big.part.* | wc -l) parts of at most 60000 bytes (--max-body-bytes 65536), the server restarted after 2, kept in --files-dir"
else
  failed "the upload in parts: $(head -c 300 resp.json)"
fi
kill "$PID"; wait "$PID" 2>/dev/null

# A download is read as the client takes it: a 40 MB file fetched at 8 MB/s adds far less than
# itself to the server's memory, has its Content-Length, outlives the file's deletion halfway,
# and a client that leaves mid-download leaves the server serving.
start_server download --files-dir "$PWD/download" --files-store-mib 64 || exit 1
$py -c '
import json, random
random.seed(7)
with open("huge.jsonl", "w") as f:
    for i in range(200000):
        f.write(json.dumps({"custom_id": f"h{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": "%032x" % random.getrandbits(128) * 3}}) + "\n")'
size=$(stat -c %s huge.jsonl)
split -b 8000000 -d huge.jsonl huge.part.
request POST /v1/uploads "{\"filename\": \"huge.jsonl\", \"purpose\": \"batch\", \"bytes\": $size, \"mime_type\": \"text/jsonl\"}"
uid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
part_ids=""
for f in huge.part.*; do
  request POST "/v1/uploads/$uid/parts" "" -F "data=@$f"
  part_ids="$part_ids${part_ids:+,}\"$($py -c 'import json; print(json.load(open("resp.json"))["id"])')\""
done
request POST "/v1/uploads/$uid/complete" "{\"part_ids\": [$part_ids]}"
huge_id=$($py -c 'import json; r = json.load(open("resp.json")); print(r["file"]["id"] if r.get("status") == "completed" else "")' 2>/dev/null)
rss() { awk '/^VmRSS/ {print $2}' "/proc/$PID/status"; }
sleep 0.5
base=$(rss); most=$base
curl -s --limit-rate 8M -D huge.headers -o huge.back "http://127.0.0.1:$PORT/v1/files/$huge_id/content" &
cpid=$!
deleted=""
for i in $(seq 1 200); do
  kill -0 "$cpid" 2>/dev/null || break
  now=$(rss); [ "$now" -gt "$most" ] && most=$now
  if [ "$i" = 10 ]; then request DELETE "/v1/files/$huge_id"; deleted=$STATUS; fi
  sleep 0.1
done
wait "$cpid"; crc=$?
grown=$(( (most - base) / 1024 ))
if [ "$crc" = 0 ] && [ "$deleted" = 200 ] && cmp -s huge.jsonl huge.back &&
   grep -qi "^content-length: $size" huge.headers && [ "$grown" -lt 12 ] && [ ! -e "download/files/$huge_id" ]; then
  pass "a $size-byte download at 8 MB/s grew the server by $grown MiB, deleted halfway and still whole"
else
  failed "the slow download: curl $crc, DELETE $deleted, grown $grown MiB, $(stat -c %s huge.back) bytes back, $(grep -i content-length huge.headers)"
fi
# A client that leaves mid-download: the server goes on answering, the next download is whole.
request POST /v1/files "" -F purpose=batch -F "file=@huge.part.00"
part_id=$($py -c 'import json; print(json.load(open("resp.json"))["id"])' 2>/dev/null)
left=$($py -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(f"GET /v1/files/{sys.argv[2]}/content HTTP/1.1\r\nHost: x\r\n\r\n".encode())
got = 0
while got < 65536:
    got += len(s.recv(65536))
s.close()
print(got >= 65536)' "$PORT" "$part_id")
curl -s -o part.back "http://127.0.0.1:$PORT/v1/files/$part_id/content"
request GET /health
if [ "$left" = True ] && [ "$STATUS" = 200 ] && cmp -s huge.part.00 part.back; then
  pass "a client that left mid-download left the server serving"
else
  failed "after a client left mid-download: curl $left, /health $STATUS, $(stat -c %s part.back) bytes back"
fi
kill "$PID"; wait "$PID" 2>/dev/null

# --files-dir: the files and batches outlive the server; a batch stopped halfway goes on with the
# next server on the folder, the lines it had answered not sent again.
start_server kept --served-model-name tiny --max-num-seqs 2 --files-dir "$PWD/kept" || exit 1
# A second server on the folder is refused at once.
if "$duet" serve --model "$model_file" --port 0 --files-dir "$PWD/kept" > second.out 2> second.err; then
  failed "a second server on the same --files-dir started"
elif grep -q "another server uses this folder" second.err; then pass "one server per --files-dir"
else failed "a second server on the folder: $(tail -3 second.err)"; fi
$py - <<'PY'
import json
with open("resume.jsonl", "w") as f:
    for i in range(24):
        f.write(json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "tiny", "prompt": f"kept line {i}", "max_tokens": 2000, "temperature": 0,
                                     "ignore_eos": True}}) + "\n")
PY
# An Anthropic message batch, ended before the restarts: kept with its results.
request POST /v1/messages/batches '{"requests": [{"custom_id": "m1", "params": {"model": "tiny", "max_tokens": 5, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}}, {"custom_id": "m2", "params": {"model": "tiny", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "Bye"}]}}]}'
mbid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
for _ in $(seq 1 300); do
  request GET "/v1/messages/batches/$mbid"
  grep -q '"processing_status":"ended"' resp.json && break
  sleep 0.05
done
curl -s -o mb_before.jsonl "http://127.0.0.1:$PORT/v1/messages/batches/$mbid/results"
request POST /v1/files "" -F purpose=batch -F file=@resume.jsonl
fid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
request POST /v1/batches "{\"input_file_id\": \"$fid\", \"endpoint\": \"/v1/completions\", \"completion_window\": \"24h\"}"
bid=$($py -c 'import json; print(json.load(open("resp.json"))["id"])')
for _ in $(seq 1 300); do
  request GET "/v1/batches/$bid"
  $py -c 'import json,sys; sys.exit(0 if json.load(open("resp.json"))["request_counts"]["completed"] >= 3 else 1)' && break
  sleep 0.05
done
kill -TERM "$PID"; wait "$PID"; rc=$?
before=$($py -c 'import json; print(json.load(open("kept/batches/'"$bid"'.json"))["status"])')
if [ "$rc" = 0 ] && [ "$before" = in_progress ]; then pass "SIGTERM with --files-dir keeps the running batch in_progress"
else failed "the stopped batch: exit $rc, status $before"; fi
# The next server names the folder in its YAML config.
printf 'files_dir: %s\n' "$PWD/kept" > kept.yaml
start_server kept2 --served-model-name tiny --max-num-seqs 2 --config kept.yaml || exit 1
# It dies (kill -9) after three more lines; a third server goes on after what the second wrote.
first_part=$(grep -oE 'going on after [0-9]+ answered' kept2.err | grep -oE '[0-9]+')
for _ in $(seq 1 300); do
  request GET "/v1/batches/$bid"
  $py -c 'import json,sys; sys.exit(0 if json.load(open("resp.json"))["request_counts"]["completed"] >= int(sys.argv[1]) + 3 else 1)' "${first_part:-0}" && break
  sleep 0.05
done
kill -9 "$PID"; wait "$PID" 2>/dev/null
start_server kept3 --served-model-name tiny --max-num-seqs 2 --files-dir "$PWD/kept" || exit 1
for _ in $(seq 1 600); do
  request GET "/v1/batches/$bid"
  grep -q '"status":"completed"' resp.json && break
  sleep 0.1
done
cp resp.json resumed.json
request GET "/v1/files?purpose=batch"
grep -q "\"$fid\"" resp.json || failed "the uploaded file is not listed after the restart: $(head -c 300 resp.json)"
out_id=$($py -c 'import json; print(json.load(open("resumed.json"))["output_file_id"])')
curl -s -o resumed_out.jsonl "http://127.0.0.1:$PORT/v1/files/$out_id/content"
# Each line once, with what a direct request answers.
$py - "$PORT" <<'PY' > resumed_check.txt 2>&1
import json, sys, urllib.request
port = sys.argv[1]
batch = json.load(open("resumed.json"))
assert batch["status"] == "completed", batch
assert batch["request_counts"] == {"total": 24, "completed": 24, "failed": 0}, batch["request_counts"]
lines = [json.loads(l) for l in open("resumed_out.jsonl")]
ids = sorted(l["custom_id"] for l in lines)
assert ids == sorted(f"k{i}" for i in range(24)), ids
want = {json.loads(l)["custom_id"]: json.loads(l)["body"] for l in open("resume.jsonl")}
for l in lines:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(want[l["custom_id"]]).encode(),
                                 headers={"Content-Type": "application/json"})
    direct = json.load(urllib.request.urlopen(req))
    got = l["response"]["body"]["choices"][0]["text"]
    assert got == direct["choices"][0]["text"], (l["custom_id"], got, direct["choices"][0]["text"])
print("ok")
PY
curl -s -o mb_after.jsonl "http://127.0.0.1:$PORT/v1/messages/batches/$mbid/results"
if [ "$(grep -c '"type":"succeeded"' mb_before.jsonl)" = 2 ] && cmp -s mb_before.jsonl mb_after.jsonl; then
  pass "an ended message batch and its results outlive two restarts in --files-dir"
else
  failed "the message batch after the restarts: $(head -c 300 mb_before.jsonl) / $(head -c 300 mb_after.jsonl)"
fi
answered=$(grep -oE 'going on after [0-9]+ answered' kept3.err | grep -oE '[0-9]+')
if grep -q '^ok$' resumed_check.txt && [ "${first_part:-0}" -ge 3 ] && [ "${answered:-0}" -gt "${first_part:-0}" ] &&
   [ "${answered:-0}" -lt 24 ]; then
  pass "after SIGTERM and kill -9 the next servers went on after $first_part and $answered answered lines: 24 lines once each, as direct requests"
else
  failed "the batch after the restarts (${first_part:-none}, then ${answered:-none} answered before): $(tail -5 resumed_check.txt)"
fi
kill "$PID"; wait "$PID" 2>/dev/null

echo "$failures failure(s)"
[ "$failures" = 0 ]
