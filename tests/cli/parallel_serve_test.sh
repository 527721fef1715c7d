#!/usr/bin/env bash
# `mpirun -np 2 duet serve --tensor-parallel-size 2`: it serves like one process (a LoRA adapter
# loaded and unloaded at run time too), and when a rank dies (SIGKILL) or hangs (SIGSTOP)
# mid-generation, every request in flight gets an error within seconds, /health reports
# unhealthy, mpirun exits non-zero and no process of the job is left.
# usage: parallel_serve_test.sh DUET_BINARY WORK_DIR MPIRUN
set -uo pipefail
mpirun_bin="$3"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model="$work/serve-model.gguf"  # a path of this test alone: its processes are found by it
expect_ok "make-model" "$duet" make-model --preset tiny --type q8_0 --seed 5 --ctx 32768 -o "$model"
job_pids() { pgrep -f -- "--model $model" || true; }

# start_job NAME ARGS...: mpirun -np 2 duet serve in the background; sets MPIRUN_PID and PORT.
start_job() {
  local name="$1"; shift
  # In a session of its own: mpirun signals its ranks' process groups when a job ends early.
  setsid -w "$mpirun_bin" --oversubscribe --bind-to none -np 2 "$duet" serve --model "$model" --port 0 --threads 1 \
    --kv-cache-memory 16777216 --served-model-name serve-model --tensor-parallel-size 2 "$@" > "$name.out" 2> "$name.err" &
  MPIRUN_PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    if grep -q "duet: ready" "$name.err" 2>/dev/null; then
      PORT=$(grep -oE "listening on http://127.0.0.1:[0-9]+" "$name.err" | grep -oE "[0-9]+$" | head -1)
      return 0
    fi
    if ! kill -0 "$MPIRUN_PID" 2>/dev/null; then echo "job $name exited:"; cat "$name.err"; return 1; fi
    sleep 0.1
  done
  echo "job $name did not become ready:"; cat "$name.err"; return 1
}
# The world rank of a process of the job.
rank_of() { tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
rank_pid() { for p in $(job_pids); do [ "$(rank_of "$p")" = "$1" ] && echo "$p"; done | head -1; }
# wait_gone SECONDS: mpirun and every rank have exited; prints mpirun's status in RC.
wait_gone() {
  local t=0
  while kill -0 "$MPIRUN_PID" 2>/dev/null && [ "$t" -lt $(($1 * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  wait "$MPIRUN_PID" 2>/dev/null; RC=$?
  sleep 0.5
  [ -z "$(job_pids)" ]
}

body='{"model": "serve-model", "prompt": "one two three", "max_tokens": 12, "temperature": 0}'
long='{"model": "serve-model", "prompt": "one two three", "max_tokens": 30000, "ignore_eos": true, "temperature": 0}'

# An embedding over two ranks (the hidden state reaches rank 0 in the logits row): the vector one
# process gives for the same input.
emb='{"model": "serve-model", "input": ["one two three", "four"], "normalize": false}'
"$duet" serve --model "$model" --port 0 --threads 1 --kv-cache-memory 16777216 --served-model-name serve-model \
  > one.out 2> one.err &
one_pid=$!
for _ in $(seq 1 300); do grep -q "duet: ready" one.err 2>/dev/null && break; sleep 0.1; done
one_port=$(grep -oE "listening on http://127.0.0.1:[0-9]+" one.err | grep -oE "[0-9]+$" | head -1)
curl -s -o one_emb.json -H 'Content-Type: application/json' -d "$emb" "http://127.0.0.1:$one_port/v1/embeddings"
kill "$one_pid"; wait "$one_pid" 2>/dev/null

# A LoRA adapter loaded at run time (/v1/load_lora_adapter) over two ranks: each rank reads its
# share into the same slot, and its completion is one process's with the adapter from the start;
# unloaded, it is gone on every rank, and its slot takes it again. On the exact path: the int8
# kernels round the adapter's intermediate per rank.
"$duet" inspect "$model" > inspect.txt
key() { grep -oE "^  llama\.$1 = [0-9]+" inspect.txt | grep -oE '[0-9]+$'; }
$py "$here/../server/make_lora_adapter.py" --out "$work/sql" --layers "$(key block_count)" --hidden "$(key embedding_length)" \
  --q-dim "$(key embedding_length)" --kv-dim $(($(key embedding_length) / $(key attention.head_count) * $(key attention.head_count_kv))) \
  --ff "$(key feed_forward_length)" --seed 6 --std-b 0.05
sql='{"model": "sql", "prompt": "one two three", "max_tokens": 12, "temperature": 0}'
DUET_MATMUL=exact "$duet" serve --model "$model" --port 0 --threads 1 --kv-cache-memory 16777216 --served-model-name serve-model \
  --lora-modules "sql=$work/sql" > lora_one.out 2> lora_one.err &
one_pid=$!
for _ in $(seq 1 300); do grep -q "duet: ready" lora_one.err 2>/dev/null && break; sleep 0.1; done
one_port=$(grep -oE "listening on http://127.0.0.1:[0-9]+" lora_one.err | grep -oE "[0-9]+$" | head -1)
curl -s -o lora_one.json -H 'Content-Type: application/json' -d "$sql" "http://127.0.0.1:$one_port/v1/completions"
curl -s -o base_one.json -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$one_port/v1/completions"
kill "$one_pid"; wait "$one_pid" 2>/dev/null
text_of() { $py -c "import json,sys; print(json.load(open(sys.argv[1]))['choices'][0]['text'])" "$1" 2>/dev/null; }
if DUET_MATMUL=exact start_job lora --allow-runtime-lora-updating; then
  post() { curl -s -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "http://127.0.0.1:$PORT$3"; }
  load="{\"lora_name\": \"sql\", \"lora_path\": \"$work/sql\"}"
  c1=$(post loaded.txt "$load" /v1/load_lora_adapter)
  c2=$(post lora_tp.json "$sql" /v1/completions)
  c3=$(post base_tp.json "$body" /v1/completions)
  if [ "$c1" = 200 ] && [ "$c2" = 200 ] && [ -n "$(text_of lora_one.json)" ] &&
     [ "$(text_of lora_tp.json)" = "$(text_of lora_one.json)" ] && [ "$(text_of base_tp.json)" = "$(text_of base_one.json)" ] &&
     [ "$(text_of lora_tp.json)" != "$(text_of base_tp.json)" ]; then
    pass "an adapter loaded at run time over two ranks answers as one process's"
  else failed "LoRA over two ranks: load $c1 ($(head -c 200 loaded.txt)), $c2 '$(text_of lora_tp.json)' against '$(text_of lora_one.json)'"; fi
  c1=$(post unloaded.txt '{"lora_name": "sql"}' /v1/unload_lora_adapter)
  c2=$(post gone.json "$sql" /v1/completions)
  c3=$(post missing.json '{"lora_name": "x", "lora_path": "/nonexistent"}' /v1/load_lora_adapter)
  c4=$(post loaded.txt "$load" /v1/load_lora_adapter)
  c5=$(post again.json "$sql" /v1/completions)
  if [ "$c1" = 200 ] && [ "$c2" = 404 ] && [ "$c3" = 400 ] && [ "$c4" = 200 ] && [ "$c5" = 200 ] &&
     [ "$(text_of again.json)" = "$(text_of lora_one.json)" ]; then
    pass "unloaded over two ranks it is gone (404), a bad path is refused, and loaded again it answers the same"
  else failed "LoRA unload/reload over two ranks: $c1 $c2 $c3 ($(head -c 200 missing.json)) $c4 $c5"; fi
  kill "$MPIRUN_PID"; wait_gone 20 || for p in $(job_pids); do kill -9 "$p"; done
else
  failed "the job with --allow-runtime-lora-updating starts"
fi

for failure in kill stop; do
  if ! start_job "$failure" --rank-timeout 3; then failed "$failure: the job starts"; continue; fi
  code=$(curl -s -o ok.json -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$PORT/v1/completions")
  if [ "$code" = 200 ] && $py -c "import json,sys; assert json.load(open('ok.json'))['usage']['completion_tokens'] == 12"; then
    pass "$failure: a completion over two ranks"
  else failed "$failure: completion ($code: $(head -c 200 ok.json))"; fi
  if [ "$failure" = kill ]; then
    curl -s -o tp_emb.json -H 'Content-Type: application/json' -d "$emb" "http://127.0.0.1:$PORT/v1/embeddings"
    if $py - one_emb.json tp_emb.json <<'PY'
import json, sys
one, tp = (json.load(open(f))["data"] for f in sys.argv[1:3])
assert len(one) == len(tp) == 2, (one, tp)
for a, b in zip(one, tp):
    x, y = a["embedding"], b["embedding"]
    assert len(x) == len(y) == 128, (len(x), len(y))
    scale = 1 + max(abs(v) for v in x)
    assert max(abs(p - q) for p, q in zip(x, y)) <= 1e-3 * scale, max(abs(p - q) for p, q in zip(x, y))
PY
    then pass "embeddings over two ranks are one process's"; else failed "embeddings over two ranks: $(head -c 300 tp_emb.json)"; fi
  fi
  curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt
  if $py - metrics.txt <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def value(pattern):
    m = re.search(pattern + r" ([0-9.e+-]+)$", text, re.M)
    assert m, pattern
    return float(m.group(1))
assert value(r'duet:collective_latency_seconds_count\{model_name="serve-model",op="allreduce"\}') > 0
assert value(r'duet:collective_latency_seconds_count\{model_name="serve-model",op="send"\}') > 0
for rank in (0, 1):
    assert value(r'duet:rank_step_seconds_count\{model_name="serve-model",rank="%d"\}' % rank) > 0, rank
PY
  then pass "$failure: collective latency and per-rank step time in /metrics"
  else failed "$failure: metrics: $(grep -E 'collective|rank_step' metrics.txt | head -5)"; fi
  code=$(curl -s -o health.json -w '%{http_code}' "http://127.0.0.1:$PORT/health")
  [ "$code" = 200 ] && pass "$failure: healthy" || failed "$failure: /health $code"
  # Requests that would run for minutes, one streamed and one not.
  curl -s -o inflight.json -w '%{http_code}' -H 'Content-Type: application/json' -d "$long" \
    "http://127.0.0.1:$PORT/v1/completions" > inflight.code &
  c1=$!
  curl -s -N -H 'Content-Type: application/json' -d "${long%\}}, \"stream\": true}" \
    "http://127.0.0.1:$PORT/v1/completions" > stream.txt &
  c2=$!
  sleep 1.5
  victim=$(rank_pid 1)
  start=$(date +%s.%N)
  if [ "$failure" = kill ]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
  unhealthy=0
  for _ in $(seq 1 100); do
    code=$(curl -s -o health.json -w '%{http_code}' --max-time 1 "http://127.0.0.1:$PORT/health")
    if [ "$code" = 503 ]; then unhealthy=1; break; fi
    kill -0 "$MPIRUN_PID" 2>/dev/null || break
    sleep 0.1
  done
  wait "$c1" "$c2"
  took=$($py -c "import time; print(round(time.time() - $start, 1))")
  code=$(cat inflight.code)
  if [ "$code" = 503 ] && grep -q '"error"' inflight.json; then
    pass "$failure: the request in flight got a 503 ($took s after the rank failed)"
  else failed "$failure: request in flight got $code: $(head -c 300 inflight.json)"; fi
  if grep -q '"text"' stream.txt && tail -c 2000 stream.txt | grep -q '"error"'; then
    pass "$failure: the stream in flight had tokens, then an error"
  else failed "$failure: stream: $(head -c 200 stream.txt) ... $(tail -c 300 stream.txt)"; fi
  if [ "$failure" = stop ]; then
    [ "$unhealthy" = 1 ] && pass "stop: /health reported unhealthy" || failed "stop: /health never said 503"
  fi
  if wait_gone 20; then pass "$failure: no process of the job is left"; else failed "$failure: processes left: $(job_pids)"; fi
  [ "$RC" -ne 0 ] && pass "$failure: mpirun exited non-zero ($RC)" || failed "$failure: mpirun exited 0"
  if $py -c "import sys; sys.exit(0 if $took < 15 else 1)"; then pass "$failure: within seconds ($took s)"
  else failed "$failure: took $took s"; fi
  for p in $(job_pids); do kill -9 "$p"; done
done

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
