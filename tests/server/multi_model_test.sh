#!/usr/bin/env bash
# usage: multi_model_test.sh DUET_BINARY WORK_DIR
# Several models in one server: --model given twice (a llama and a deepseek2) answers each model
# exactly as a server of that model alone does (openai client), both at once; /v1/models lists
# them, /metrics labels every sample by model_name; a model that fails to load leaves the other
# serving (/health per model); `models:` in the YAML gives each model its own limits.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

require_npm openai
"$duet" make-model --preset tiny --type q8_0 --seed 5 -o a.gguf 2> /dev/null || { echo "make-model a failed"; exit 1; }
"$duet" make-model --preset deepseek2-tiny-v3 --type q8_0 --seed 7 -o b.gguf 2> /dev/null || { echo "make-model b failed"; exit 1; }

# start_yaml NAME ARGS...: like start_server, without a --model (the models come from --config).
start_yaml() {
  local name="$1"; shift
  "$duet" serve --port 0 --kv-cache-memory 33554432 --threads 1 "$@" > "$name.out" 2> "$name.err" &
  PID=$!
  pids+=("$PID")
  for _ in $(seq 1 300); do
    if grep -q "duet: ready" "$name.err" 2>/dev/null; then
      PORT=$(grep -oE "listening on http://127.0.0.1:[0-9]+" "$name.err" | grep -oE "[0-9]+$" | head -1)
      return 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then echo "server $name exited:"; cat "$name.err"; return 1; fi
    sleep 0.1
  done
  echo "server $name did not become ready:"; cat "$name.err"; return 1
}

run_client() {  # run_client NAME MODELS OUT
  if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_MODELS="$2" DUET_OUT="$3" NODE_PATH="$here/node_modules" \
     node "$here/multi_model_client_test.mjs" > "$1.txt" 2>&1; then
    pass "$1 ($(grep -c '^ok' "$1.txt") checks)"
  else
    failed "$1"; cat "$1.txt"
  fi
}

# Each model alone, for reference.
model_file=a.gguf
start_server alone-a --served-model-name light --chat-template deepseek-v3 || exit 1
run_client "light alone" light alone-a.json
kill "$PID"
model_file=b.gguf
start_server alone-b --served-model-name gen --chat-template deepseek-v3 || exit 1
run_client "gen alone" gen alone-b.json
kill "$PID"

# Side by side.
model_file=a.gguf
start_server both --model b.gguf --served-model-name light --served-model-name gen --chat-template deepseek-v3 || exit 1
run_client "light and gen in one server" light,gen both.json
curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt
curl -s "http://127.0.0.1:$PORT/health" > health.json
if $py - alone-a.json alone-b.json both.json metrics.txt health.json <<'PY'
import json, sys
from prometheus_client.parser import text_string_to_metric_families
alone = {**json.load(open(sys.argv[1])), **json.load(open(sys.argv[2]))}
both = json.load(open(sys.argv[3]))
assert alone == both, {k: (alone.get(k), both.get(k)) for k in alone.keys() | both.keys() if alone.get(k) != both.get(k)}
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[4]).read())}
for name in ("vllm:generation_tokens", "vllm:num_requests_running", "vllm:time_to_first_token_seconds",
             "duet:requests", "duet:kv_cache_blocks"):
    labels = {s.labels["model_name"] for s in fams[name].samples}
    assert labels == {"light", "gen"}, (name, labels)
gen = {s.labels["model_name"]: s.value for s in fams["vllm:generation_tokens"].samples}
# 3 completions of 12 tokens, a chat of up to 8, 6 streams of 20 (the 404 goes to no model's engine).
assert 36 + 120 <= gen["light"] <= 36 + 8 + 120 and 36 + 120 <= gen["gen"] <= 36 + 8 + 120, gen
health = json.load(open(sys.argv[5]))
assert health["status"] == "ok" and set(health["models"]) == {"light", "gen"}, health
PY
then pass "answers equal each model alone; metrics labelled by model_name"; else failed "side by side: answers or metrics"; fi
kill "$PID"

# A model that fails to load leaves the other serving.
start_server broken --model missing.gguf --served-model-name light --served-model-name broken || exit 1
grep -q "model 'broken' failed to load" broken.err && pass "the failed model is reported" || failed "no load error: $(cat broken.err)"
request GET /health
[ "$STATUS" = 200 ] && grep -q '"degraded"' resp.json && grep -q '"failed"' resp.json \
  && pass "/health is up, degraded, naming the failed model" || failed "/health: $STATUS $(cat resp.json)"
request GET "/health?model=broken"
[ "$STATUS" = 503 ] && grep -q "missing.gguf" resp.json && pass "/health?model=broken is 503 with the reason" \
  || failed "/health?model=broken: $STATUS $(cat resp.json)"
request GET "/health?model=light"
[ "$STATUS" = 200 ] && pass "/health?model=light is 200" || failed "/health?model=light: $STATUS"
expect_error "a request to the failed model" 503 service_unavailable_error - POST /v1/completions '{"model": "broken", "prompt": "x", "max_tokens": 2}'
grep -q "failed to load" resp.json || failed "the 503 does not say the model failed to load: $(cat resp.json)"
request POST /v1/completions '{"model": "light", "prompt": "x", "max_tokens": 2}'
[ "$STATUS" = 200 ] && pass "the other model serves" || failed "light after broken: $STATUS $(cat resp.json)"
request GET /v1/models
$py -c "import json; d = json.load(open('resp.json'))['data']; assert [m['id'] for m in d] == ['light'], d" \
  && pass "/v1/models lists the model that serves" || failed "/v1/models: $(cat resp.json)"
kill "$PID"
if "$duet" serve --model missing1.gguf --model missing2.gguf --port 0 > none.out 2> none.err; then
  failed "a server with no model that loads started"
else
  grep -q "missing1.gguf" none.err && pass "no model loads: the server exits with the first error" || failed "none: $(cat none.err)"
fi

# models: in the YAML, each with its own limits.
cat > models.yaml <<'YAML'
max_num_seqs: 8
models:
  - model: a.gguf
    served_model_name: light
    max_model_len: 64
    max_num_seqs: 2
  - model: b.gguf
    served_model_name: gen
    speculative_method: ngram
    num_speculative_tokens: 2
YAML
start_yaml yaml --config models.yaml || exit 1
request GET /v1/models
$py - resp.json <<'PY' && pass "models: from the YAML, each with its own max_model_len" || failed "YAML models: $(cat resp.json)"
import json, sys
d = {m["id"]: m for m in json.load(open(sys.argv[1]))["data"]}
assert set(d) == {"light", "gen"} and d["light"]["max_model_len"] == 64 and d["gen"]["max_model_len"] > 64, d
PY
long=$($py -c "import json; print(json.dumps({'model': 'light', 'prompt': ' '.join(['word'] * 80), 'max_tokens': 4}))")
expect_error "light refuses a prompt over its own 64 tokens" 400 invalid_request_error prompt POST /v1/completions "$long"
request POST /v1/completions "${long/light/gen}"
[ "$STATUS" = 200 ] && pass "gen takes the same prompt" || failed "gen with the long prompt: $STATUS $(cat resp.json)"
kill "$PID"
# A model whose device fails, with no spare, makes its own engine unhealthy; the other serves on.
cat > crash.yaml <<'YAML'
api_key: k
models:
  - model: a.gguf
    served_model_name: light
    device_map: "cpu[0]"
  - model: b.gguf
    served_model_name: gen
    device_map: "cpu[1]"
YAML
start_yaml crash --config crash.yaml || exit 1
AUTH=(-H 'Authorization: Bearer k')
request POST /v1/completions '{"model": "gen", "prompt": "x", "max_tokens": 4}' "${AUTH[@]}"
[ "$STATUS" = 200 ] && pass "gen serves on cpu[1]" || failed "gen before the fault: $STATUS $(cat resp.json)"
request POST /admin/fault '{"device": "cpu[1]", "step": 1, "mode": "fail"}' "${AUTH[@]}"
[ "$STATUS" = 200 ] || failed "arming the fault: $STATUS $(cat resp.json)"
request POST /v1/completions '{"model": "gen", "prompt": "x", "max_tokens": 4}' "${AUTH[@]}"
[ "$STATUS" -ge 500 ] && pass "gen fails when its device does ($STATUS)" || failed "gen after the fault: $STATUS $(cat resp.json)"
request GET "/health?model=gen"
[ "$STATUS" = 503 ] && grep -q unhealthy resp.json && pass "/health?model=gen is 503 unhealthy" || failed "gen health: $STATUS $(cat resp.json)"
request GET /health
[ "$STATUS" = 200 ] && grep -q degraded resp.json && pass "/health stays up, degraded" || failed "health after the fault: $STATUS $(cat resp.json)"
request POST /v1/completions '{"model": "light", "prompt": "x", "max_tokens": 4}' "${AUTH[@]}"
[ "$STATUS" = 200 ] && pass "light serves on after gen's device failed" || failed "light after the fault: $STATUS $(cat resp.json)"
request GET /metrics
grep -q 'model_name="light"' resp.json && grep -q 'model_name="gen"' resp.json && pass "metrics of both still served" \
  || failed "metrics after the fault"
kill "$PID"

printf 'models:\n  - model: a.gguf\n    port: 9\n' > bad.yaml
if "$duet" serve --config bad.yaml > bad.out 2> bad.err; then
  failed "a server-wide key in a model entry was accepted"
else
  grep -q "'port' is not a per-model key" bad.err && pass "a server-wide key in a model entry is refused" || failed "bad entry: $(cat bad.err)"
fi
if "$duet" serve --model a.gguf --model a.gguf --port 0 > dup.out 2> dup.err; then
  failed "two models with one name accepted"
else
  grep -q "two models are served as 'a.gguf'" dup.err && pass "two models with one name are refused" || failed "dup: $(cat dup.err)"
fi
echo "$failures failures"
[ "$failures" -eq 0 ]
