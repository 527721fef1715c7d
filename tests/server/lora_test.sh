#!/usr/bin/env bash
# usage: lora_test.sh DUET_BINARY WORK_DIR
# LoRA adapters served beside the model (--lora-modules NAME=PATH, vLLM's multi-LoRA serving), with
# curl against a real `duet serve`:
#   - /v1/models lists each adapter after its model (root: its folder, parent: the model), and
#     GET /v1/models/NAME finds it;
#   - a request naming an adapter as its model runs with it: greedy tokens equal the argmax chain
#     of `duet logits --lora` (the offline path the reference test checks), and differ from the
#     base model's; the reply's model is the adapter's name;
#   - the base model and two adapters in one batch (concurrent requests) each give their own text;
#   - the prefix cache keeps each adapter's K/V apart: the base model's cached prompt is not a hit
#     for an adapter (and the adapter's text is still its own), an adapter's own repeat is;
#   - cache_salt: the same prompt under another salt is not a hit, under the same salt it is;
#   - loading and unloading at run time (vLLM's routes), and vllm:lora_requests_info in /metrics;
#   - refusals: an unknown model (404), a bad cache_salt (400), an adapter folder that does not
#     fit the model or does not exist, and an adapter named like the model (the server does not start);
#   - deepseek2 (MLA, experts): an adapter on every projection, routed experts included, served
#     greedy equals the offline chain and differs from the base model's, and its repeat is a
#     prefix hit of its own.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type f32 --seed 17 --ctx 32768 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
"$duet" inspect tiny.gguf > inspect.txt
key() { grep -oE "^  llama\.$1 = [0-9]+" inspect.txt | grep -oE '[0-9]+$'; }
hidden=$(key embedding_length); layers=$(key block_count); ff=$(key feed_forward_length)
heads=$(key attention.head_count); kv_heads=$(key attention.head_count_kv)
dims=(--layers "$layers" --hidden "$hidden" --q-dim "$hidden" --kv-dim $((hidden / heads * kv_heads)) --ff "$ff")
$py "$here/make_lora_adapter.py" --out sql "${dims[@]}" --seed 1 || exit 1
$py "$here/make_lora_adapter.py" --out chat "${dims[@]}" --seed 2 --rank 8 --alpha 32 --modules q_proj,v_proj,down_proj || exit 1
$py "$here/make_lora_adapter.py" --out wide "${dims[@]}" --seed 3 --hidden $((hidden * 2)) || exit 1

start_server main --served-model-name base --lora-modules sql=sql '{"name": "chat", "path": "chat"}' || exit 1

request GET /v1/models
if [ "$STATUS" = 200 ] && $py - resp.json "$PWD" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))["data"]
ids = [m["id"] for m in data]
assert ids == ["base", "sql", "chat"], ids
assert data[0]["parent"] is None and data[0]["root"] == "tiny.gguf", data[0]
assert data[1]["parent"] == "base" and data[1]["root"] == "sql", data[1]
assert data[2]["parent"] == "base" and data[2]["root"] == "chat", data[2]
PY
then pass "/v1/models lists the adapters after their model"; else failed "/v1/models: $(head -c 400 resp.json)"; fi
request GET /v1/models/chat
if [ "$STATUS" = 200 ] && grep -q '"parent":"base"' resp.json; then pass "GET /v1/models/chat"; else failed "GET /v1/models/chat: $STATUS $(head -c 300 resp.json)"; fi

# Greedy completions of token-id prompts; the text's ids via return_token_ids-free echo: logprobs
# carry the chosen tokens, which are compared with `duet logits` below.
prompt="[5, 77, 300, 12, 9, 41, 250, 3, 18, 99, 7, 64, 128, 200, 31, 45, 60, 2, 11, 90]"
complete() {  # complete OUT MODEL [extra fields]: greedy, 6 tokens, the response in OUT.json
  request POST /v1/completions "{\"model\": \"$2\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 0${3:-}}"
  cp resp.json "$1.json"
  [ "$STATUS" = 200 ] || failed "$1: $STATUS $(head -c 300 resp.json)"
}
complete base_alone base
complete sql_alone sql
complete chat_alone chat

# The offline path's greedy chain: one `duet logits` per step, with and without the adapter.
chain_model=tiny.gguf
chain() {  # chain OUT [--lora DIR]: 6 greedy token ids after the prompt, one per line in OUT (on $chain_model)
  local ids
  ids=$(echo "$prompt" | tr -d '[],')
  : > "$1"
  for _ in 1 2 3 4 5 6; do
    local next
    next=$("$duet" logits --model "$chain_model" --tokens "$ids" --top 1 "${@:2}" 2> /dev/null | grep -oE '"top": \[\[[0-9]+' | grep -oE '[0-9]+$')
    [ -n "$next" ] || { failed "duet logits ${*:2}"; return; }
    echo "$next" >> "$1"
    ids="$ids $next"
  done
}
chain base_chain.txt
chain sql_chain.txt --lora sql
chain chat_chain.txt --lora chat
# The served tokens: the completion's logprobs name each token as its text; tokenize them back
# through /tokenize would merge pieces, so ask for the ids with return_tokens_as_token_ids.
for m in base sql chat; do
  request POST /v1/completions "{\"model\": \"$m\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}"
  cp resp.json "${m}_ids.json"
done
if $py - <<'PY'
import json
for m in ("base", "sql", "chat"):
    r = json.load(open(f"{m}_ids.json"))
    assert r["model"] == m, (m, r["model"])
    served = [int(t.split(":")[1]) for t in r["choices"][0]["logprobs"]["tokens"]]
    offline = [int(x) for x in open(f"{m}_chain.txt").read().split()]
    assert served == offline, (m, served, offline)
texts = {m: json.load(open(f"{m}_alone.json"))["choices"][0]["text"] for m in ("base", "sql", "chat")}
assert len(set(texts.values())) == 3, texts
PY
then pass "each adapter's greedy tokens equal duet logits --lora's, and differ from the base model's"
else failed "served tokens against duet logits --lora"; fi

# Base and both adapters in one batch: each its own text.
curls=()
for m in base sql chat base sql chat; do
  curl -s -o "batch_${m}_$RANDOM.json" -X POST -H 'Content-Type: application/json' \
    --data-binary "{\"model\": \"$m\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true}" \
    "http://127.0.0.1:$PORT/v1/completions" &
  curls+=($!)
done
wait "${curls[@]}"
if $py - <<'PY'
import glob, json
alone = {m: json.load(open(f"{m}_alone.json"))["choices"][0]["text"] for m in ("base", "sql", "chat")}
files = glob.glob("batch_*.json")
assert len(files) == 6, files
for f in files:
    r = json.load(open(f))
    assert r["choices"][0]["text"] == alone[r["model"]], (f, r, alone)
PY
then pass "base and two adapters batched together: each gives its own text"; else failed "batched adapters"; fi

# The prefix cache: a fresh prompt (two blocks and more) cached by the base model is no hit for
# an adapter, whose text is the one of a server that never saw it; the adapter's repeat hits.
long="[$(seq -s ', ' 100 140)]"
cached() { $py -c "import json,sys; u=json.load(open(sys.argv[1]))['usage']; print((u.get('prompt_tokens_details') or {}).get('cached_tokens', 0))" "$1"; }
for step in base_1 base_2 sql_1 sql_2; do
  request POST /v1/completions "{\"model\": \"${step%_*}\", \"prompt\": $long, \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}"
  cp resp.json "prefix_$step.json"
done
base2=$(cached prefix_base_2.json); sql1=$(cached prefix_sql_1.json); sql2=$(cached prefix_sql_2.json)
if [ "$base2" -gt 0 ] && [ "$sql1" = 0 ] && [ "$sql2" -gt 0 ]; then
  pass "prefix cache: base repeat hits $base2, the adapter's first request 0, its repeat $sql2"
else
  failed "prefix cache per adapter: base repeat $base2, sql first $sql1, sql repeat $sql2"
fi
for salt in a a b; do
  request POST /v1/completions "{\"model\": \"base\", \"prompt\": [$(seq -s ', ' 200 240)], \"max_tokens\": 2, \"temperature\": 0, \"cache_salt\": \"$salt\"}"
  cp resp.json "salt_$salt$RANDOM.json"
  echo "$salt $(cached resp.json)" >> salts.txt
done
if [ "$(sed -n 1p salts.txt)" = "a 0" ] && [ "$(sed -n 2p salts.txt | cut -d' ' -f2)" -gt 0 ] && [ "$(sed -n 3p salts.txt)" = "b 0" ]; then
  pass "cache_salt: the same salt hits, another does not"
else
  failed "cache_salt: $(tr '\n' ';' < salts.txt)"
fi

expect_error "unknown model" 404 invalid_request_error model POST /v1/completions '{"model": "nope", "prompt": "hi"}'
expect_error "empty cache_salt" 400 invalid_request_error cache_salt POST /v1/completions '{"model": "sql", "prompt": "hi", "cache_salt": ""}'
request GET /health
[ "$STATUS" = 200 ] && pass "the server is healthy after all of it" || failed "health $STATUS"

request POST /v1/completions '{"model": "chat", "prompt": "the quick brown fox", "max_tokens": 8, "temperature": 0, "ignore_eos": true}'
cp resp.json chat_text.json
# A server run with the adapter alone gives the same text (no other adapter leaks into it), and
# the adapter's text after the base model's cached prompt equals a fresh server's.
kill "$PID"; wait "$PID" 2> /dev/null
# duet generate runs an adapter of --lora-modules by name, as the server does.
"$duet" generate -m tiny.gguf --lora-modules sql=sql chat=chat --lora chat -p "the quick brown fox" -n 8 --temperature 0 \
  --ignore-eos -t 1 > generate.txt 2> generate.err
if $py - <<'PY'
import json
served = json.load(open("chat_text.json"))["choices"][0]["text"]
offline = open("generate.txt", encoding="utf-8", errors="replace").read().rstrip("\n")
assert offline.endswith(served) and served, (served, offline)
PY
then pass "duet generate --lora chat gives the served adapter's text"; else failed "generate --lora: $(tail -2 generate.err)"; fi
start_server solo --lora-modules sql=sql || exit 1
request POST /v1/completions "{\"model\": \"sql\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true}"
cp resp.json solo.json
request POST /v1/completions "{\"model\": \"sql\", \"prompt\": $long, \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}"
cp resp.json solo_long.json
if $py - <<'PY'
import json
t = lambda f: json.load(open(f))["choices"][0]["text"]
assert t("solo.json") == t("sql_alone.json"), (t("solo.json"), t("sql_alone.json"))
assert t("solo_long.json") == t("prefix_sql_1.json"), (t("solo_long.json"), t("prefix_sql_1.json"))
PY
then pass "the adapter alone on a fresh server gives the same texts"; else failed "fresh server texts"; fi
kill "$PID"; wait "$PID" 2> /dev/null

# Loading and unloading while the server runs (vLLM's routes), only with --allow-runtime-lora-updating.
start_server closed || exit 1
request POST /v1/load_lora_adapter '{"lora_name": "sql", "lora_path": "sql"}'
[ "$STATUS" = 404 ] && pass "no runtime loading without the flag" || failed "load without the flag: $STATUS"
kill "$PID"; wait "$PID" 2> /dev/null
start_server runtime --allow-runtime-lora-updating || exit 1
text_of() { $py -c "import json,sys; print(json.load(open(sys.argv[1]))['choices'][0]['text'])" "$1"; }
request POST /v1/load_lora_adapter '{"lora_name": "sql", "lora_path": "sql"}'
if [ "$STATUS" = 200 ] && grep -q "Success: LoRA adapter 'sql' added successfully." resp.json; then pass "load_lora_adapter"
else failed "load_lora_adapter: $STATUS $(head -c 300 resp.json)"; fi
request POST /v1/completions "{\"model\": \"sql\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true}"
[ "$STATUS" = 200 ] && [ "$(text_of resp.json)" = "$(text_of sql_alone.json)" ] && pass "a loaded adapter gives the text it gives when loaded at start" \
  || failed "runtime sql text: $(head -c 300 resp.json)"
expect_error "loading a name twice" 400 invalid_request_error lora_name POST /v1/load_lora_adapter '{"lora_name": "sql", "lora_path": "chat"}'
expect_error "loading an adapter that does not fit" 400 invalid_request_error lora_path POST /v1/load_lora_adapter '{"lora_name": "w", "lora_path": "wide"}'
expect_error "loading without a path" 400 invalid_request_error lora_path POST /v1/load_lora_adapter '{"lora_name": "w"}'
request GET /v1/models
grep -q '"id":"sql"' resp.json && ! grep -q '"id":"w"' resp.json && pass "/v1/models lists the loaded adapter only" || failed "models after loads: $(head -c 300 resp.json)"
# An adapter with a request running (a long stream, cut by the client after the check) is not
# unloaded.
curl -s -N -o running.txt -X POST -H 'Content-Type: application/json' \
  --data-binary "{\"model\": \"sql\", \"prompt\": \"x\", \"max_tokens\": 30000, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true}" \
  "http://127.0.0.1:$PORT/v1/completions" &
running=$!
for _ in $(seq 1 50); do [ -s running.txt ] && break; sleep 0.1; done
request GET /metrics
if grep -qE '^vllm:lora_requests_info\{.*max_lora="256",running_lora_adapters="sql",waiting_lora_adapters=""\} [0-9.e+]+$' resp.json; then
  pass "vllm:lora_requests_info names the running adapter"
else
  failed "lora_requests_info: $(grep lora_requests_info resp.json)"
fi
request POST /v1/unload_lora_adapter '{"lora_name": "sql"}'
busy=$STATUS
cp resp.json busy.json
kill "$running"; wait "$running" 2> /dev/null
[ "$busy" = 400 ] && grep -q "unfinished request" busy.json && pass "no unloading under a running request" \
  || failed "unload while running: $busy $(head -c 300 busy.json)"
sleep 0.3  # the cut stream's abort reaches the engine
# The long prompt cached by sql, then sql unloaded and a new 'sql' loaded from chat's folder: its
# text is chat's (nothing of the old adapter's cache is reused).
request POST /v1/completions "{\"model\": \"sql\", \"prompt\": $long, \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}"
request POST /v1/unload_lora_adapter '{"lora_name": "sql"}'
if [ "$STATUS" = 200 ] && grep -q "Success: LoRA adapter 'sql' removed successfully." resp.json; then pass "unload_lora_adapter"
else failed "unload_lora_adapter: $STATUS $(head -c 300 resp.json)"; fi
expect_error "an unloaded adapter is no model" 404 invalid_request_error model POST /v1/completions '{"model": "sql", "prompt": "hi"}'
expect_error "unloading it again" 404 invalid_request_error lora_name POST /v1/unload_lora_adapter '{"lora_name": "sql"}'
request POST /v1/load_lora_adapter '{"lora_name": "sql", "lora_path": "chat"}'
request POST /v1/load_lora_adapter '{"lora_name": "chat2", "lora_path": "chat"}'
request POST /v1/completions "{\"model\": \"sql\", \"prompt\": $long, \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}"
cp resp.json reloaded.json
request POST /v1/completions "{\"model\": \"chat2\", \"prompt\": $long, \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}"
cp resp.json chat2.json
if [ "$(text_of reloaded.json)" = "$(text_of chat2.json)" ] && [ "$(cached reloaded.json)" = 0 ] && [ "$(text_of reloaded.json)" != "$(text_of prefix_sql_1.json)" ]; then
  pass "a name loaded again with other weights reuses none of the old cache"
else
  failed "reloaded sql: $(text_of reloaded.json) / chat2 $(text_of chat2.json) / old sql $(text_of prefix_sql_1.json), cached $(cached reloaded.json)"
fi
kill "$PID"; wait "$PID" 2> /dev/null

# Adapters that cannot be served stop the start with a message that says why.
refused() {  # refused NAME PATTERN ARGS...: the server exits non-zero and its log matches PATTERN
  local name="$1" pattern="$2"; shift 2
  timeout 60 "$duet" serve --model tiny.gguf --port 0 --kv-cache-memory 33554432 --threads 1 "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  if [ "$rc" != 0 ] && grep -qE -- "$pattern" "$name.err"; then pass "$name refused"; else failed "$name: exit $rc, log: $(tail -3 "$name.err")"; fi
}
refused wide_adapter "is [0-9]+ x [0-9]+, expected [0-9]+ x [0-9]+" --lora-modules wide=wide
refused missing_adapter "neither a folder" --lora-modules gone=no-such-folder
refused adapter_named_like_model "name already served" --served-model-name base --lora-modules base=sql
refused bad_lora_flag "NAME=PATH" --lora-modules just-a-name

# deepseek2 (V3's shape): an adapter on MLA's projections, the dense and shared feed-forwards and
# every routed expert, served beside the model.
"$duet" make-model --preset deepseek2-tiny-v3 --type f32 --seed 17 --ctx 4096 -o ds2.gguf 2> /dev/null || failed "make-model ds2"
"$duet" inspect ds2.gguf > ds2-inspect.txt
$py "$here/make_lora_adapter.py" --out ds2-lora --deepseek2 ds2-inspect.txt --seed 5 --std-b 0.1 || failed "ds2 adapter"
model_file=ds2.gguf
start_server ds2 --served-model-name ds2 --lora-modules ds2-lora=ds2-lora || exit 1
chain_model=ds2.gguf
chain ds2_base_chain.txt
chain ds2_lora_chain.txt --lora ds2-lora
for m in ds2 ds2-lora; do
  request POST /v1/completions "{\"model\": \"$m\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}"
  cp resp.json "served_$m.json"
  $py -c 'import json,sys; print("\n".join(t.split(":")[1] for t in json.load(open(sys.argv[1]))["choices"][0]["logprobs"]["tokens"]))' "served_$m.json" > "served_$m.txt" 2> /dev/null
done
if cmp -s served_ds2-lora.txt ds2_lora_chain.txt && cmp -s served_ds2.txt ds2_base_chain.txt && ! cmp -s served_ds2.txt served_ds2-lora.txt; then
  pass "deepseek2: the adapter's served greedy tokens are its offline chain, and not the model's"
else
  failed "deepseek2 chains: served $(tr '\n' ' ' < served_ds2-lora.txt)/ offline $(tr '\n' ' ' < ds2_lora_chain.txt)/ base $(tr '\n' ' ' < served_ds2.txt)"
fi
request POST /v1/completions "{\"model\": \"ds2-lora\", \"prompt\": $prompt, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}"
cp resp.json served_again.json
if [ "$(cached served_again.json)" -gt 0 ] && [ "$(text_of served_again.json)" = "$(text_of served_ds2-lora.json)" ]; then
  pass "deepseek2: the adapter's repeat is a prefix hit of its own, with the same text"
else
  failed "deepseek2 repeat: cached $(cached served_again.json), $(text_of served_again.json) / $(text_of served_ds2-lora.json)"
fi
kill "$PID"; wait "$PID" 2> /dev/null

echo "$failures failure(s)"
[ "$failures" = 0 ]
