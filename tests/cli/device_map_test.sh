#!/usr/bin/env bash
# The device map as a user meets it: `duet devices`, `duet inspect --device-map` (the plan), every
# command that runs a model under a map (same tokens and logits as on one device), bad maps
# refused before anything is loaded, and `duet serve` with the YAML config's device_map: and
# its per-device metrics.
# usage: device_map_test.sh DUET_BINARY WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../server/lib.sh"  # and through it lib.sh here
start_test "$@"

expect_ok "make-model llama" "$duet" make-model --preset tiny --type q8_0 --seed 7 -o tiny.gguf
expect_ok "make-model deepseek2" "$duet" make-model --preset deepseek2-tiny-v3 --type q8_0 --seed 7 -o moe.gguf

# --- duet devices ----------------------------------------------------------------------------
expect_ok "devices" "$duet" devices
contains "devices lists cpu" "^  cpu +cpu +[0-9]+ cores?" out.txt
contains "devices lists a NUMA node" "^  cpu:[0-9]+ +numa" out.txt
cuda_built="${DUET_CUDA_BUILT:-0}"
if [ "$cuda_built" = 1 ]; then
  contains "devices names the backends" "backends: cpu \(built\), cuda \(built\)" out.txt
  if ! grep -q "^  cuda:" out.txt; then contains "devices says why no GPU is listed" "^cuda: no GPU: cudaGetDeviceCount: " out.txt; fi
else
  contains "devices names the backends" "backends: cpu \(built\), cuda \(not built\)" out.txt
fi
expect_ok "devices --json" "$duet" devices --json
if DUET_CUDA_BUILT="$cuda_built" $py - out.txt <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
assert d["backends"] == {"cpu": True, "cuda": os.environ["DUET_CUDA_BUILT"] == "1"}, d["backends"]
names = [x["name"] for x in d["devices"]]
assert names[0] == "cpu" and any(n.startswith("cpu:") for n in names), names
for x in d["devices"]:
    assert {"name", "kind", "memory_bytes", "free_bytes", "cpus", "threads"} <= set(x), x
    assert x["memory_bytes"] > 0 and (x["cpus"] or x["kind"] == "cuda"), x
node = [x for x in d["devices"] if x["kind"] == "numa"][0]
assert node["node"] == int(node["name"].split(":")[1]), node
PY
then pass "devices JSON shape"; else failed "devices JSON shape: $(head -c 300 out.txt)"; fi

# --- the plan ---------------------------------------------------------------------------------
expect_ok "inspect plan" "$duet" inspect tiny.gguf --device-map "embed=cpu[1],layers.0-0=cpu[0],layers.1-1=cpu[1]"
contains "plan: first device" "^  cpu\[1\]: embed, layer 1, lm_head; weights .*, KV .* per token" out.txt
contains "plan: second device" "^  cpu\[0\]: layer 0; weights" out.txt
contains "plan: copies" "copies per step: 2 per micro-batch" out.txt
expect_ok "inspect plan, experts apart" "$duet" inspect moe.gguf --moe-experts "cpu[1]" --device-map "cpu[0]"
contains "plan: experts device" "^  cpu\[1\]: layers 1-2 \(experts\); weights .*, KV 0.0 KiB per token" out.txt
contains "plan: experts copies" "copies per step: 4 per micro-batch" out.txt

# --- every command under maps: the same tokens and logits as on one device ---------------------
maps=("layers.0-0=cpu[0],layers.1-1=cpu[1]"
      '{"transformer.layers.0-0": "cpu[0]", "transformer.layers.1-1": "cpu[1]"}'
      "embed=guarded:0,model.layers.0-0=guarded:1,model.layers.1-1=guarded:0,lm_head=guarded:1"
      "guarded:0")
expect_ok "generate on cpu" "$duet" generate --model tiny.gguf --prompt "Hello there" --max-tokens 12 --temperature 0 --ignore-eos
cp out.txt gen-one.txt
"$duet" logits --model tiny.gguf --tokens "1 2 3 4 5 6 7" --all-positions > logits-one.txt
for m in "${maps[@]}"; do
  expect_ok "generate --device-map $m" "$duet" generate --model tiny.gguf --prompt "Hello there" --max-tokens 12 \
    --temperature 0 --ignore-eos --device-map "$m"
  if cmp -s gen-one.txt out.txt; then pass "same tokens under $m"; else failed "tokens under $m"; diff gen-one.txt out.txt; fi
  "$duet" logits --model tiny.gguf --tokens "1 2 3 4 5 6 7" --all-positions --device-map "$m" > logits-map.txt
  if [ -s logits-map.txt ] && cmp -s logits-one.txt logits-map.txt; then pass "same logits under $m"; else failed "logits under $m"; fi
done
"$duet" generate --model moe.gguf --prompt "Hello there" --max-tokens 12 --temperature 0 --ignore-eos > moe-one.txt 2>/dev/null
for args in "--moe-experts guarded:0" "--override-tensor ffn_.*_exps=cpu[1] --device-map cpu[0]" \
            "--device-map layers.0-1=cpu[0],layers.2-2=cpu[1] --moe-experts guarded:1"; do
  # shellcheck disable=SC2086
  expect_ok "generate moe $args" "$duet" generate --model moe.gguf --prompt "Hello there" --max-tokens 12 \
    --temperature 0 --ignore-eos $args
  if cmp -s moe-one.txt out.txt; then pass "same moe tokens with $args"; else failed "moe tokens with $args"; fi
done
expect_ok "bench under a map" "$duet" bench --model tiny.gguf -p 16 -n 4 -r 1 --device-map "layers.0-0=cpu[0],layers.1-1=cpu[1]"
contains "bench under a map prints its rows" "^\| llama .* \| (pp16|tg4) \|" out.txt
expect_ok "kl-divergence under a map" "$duet" kl-divergence tiny.gguf tiny.gguf --device-map "layers.0-0=cpu[0],layers.1-1=cpu[1]"

# --- bad maps: a clear error, and nothing loaded (no 'loaded' line) ----------------------------
bad() {
  local name="$1" pattern="$2"; shift 2
  expect_fail "$name" "$pattern" "$duet" --log-level info generate --model tiny.gguf --prompt x "$@"
  if grep -q "loaded " err.txt; then failed "$name: the model was loaded"; fi
}
bad "unknown device" "device map key 'layers.0-1': device 'tpu:0' is not known" --device-map "layers.0-1=tpu:0"
bad "missing NUMA node" "no NUMA node 9" --device-map "layers.0-1=cpu:9"
bad "missing core" "core 9999 is not one" --device-map "layers.0-1=cpu[9999]"
bad "overlap" "keys 'layers.0-1' and 'layers.1-1' both place layers 1" --device-map "layers.0-1=cpu[0],layers.1-1=cpu[1]"
bad "gap" "leaves layers 1 out" --device-map "layers.0-0=cpu[0]"
bad "missing layer" "names layer 5, but the model has 2 layers" --device-map "layers.0-5=cpu[0]"
bad "does not parse" "does not parse" --device-map "layers.0-1"
bad "bad JSON" "not valid JSON" --device-map "{\"layers.0-1\": "
bad "bad override" "matches no tensor" --override-tensor "nothing_like_this=cpu[1]"
bad "experts on a dense model" "has no routed experts" --moe-experts "cpu[1]"
bad "shared cores" "share core 0" --device-map "layers.0-0=cpu,layers.1-1=cpu[0]"
bad "does not fit" "does not fit cpu\[0\].*KV cache" --device-map "layers.0-0=cpu[0],layers.1-1=cpu[1]" \
  --kv-cache-memory 1125899906842624

# --- serve: device_map: in the YAML config; the plan in the start-up log; metrics per device ----
model_file=tiny.gguf
cat > duet.yaml <<'YAML'
log_level: info
device_map:
  transformer.layers.0-0: cpu[0]
  transformer.layers.1-1: cpu[1]
YAML
start_server mapped --config duet.yaml || exit 1
contains "serve logs the plan" "cpu\[0\]: embed, layer 0; weights" mapped.err
request POST /v1/completions '{"prompt": "Hello there", "max_tokens": 12, "temperature": 0, "ignore_eos": true}'
if [ "$STATUS" = 200 ] && $py - resp.json gen-one.txt <<'PY'
import json, sys
text = json.load(open(sys.argv[1]))["choices"][0]["text"]
assert open(sys.argv[2]).read().rstrip("\n") == "Hello there" + text, text
PY
then pass "serve under the YAML map answers as one device does"; else failed "serve under the map ($STATUS: $(head -c 200 resp.json))"; fi
curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt
if $py - metrics.txt <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
devices = {s.labels["device"] for s in fams["duet:device_utilization_ratio"].samples}
assert devices == {"cpu[0]", "cpu[1]"}, devices
for d in devices:
    mem = {s.labels["kind"]: s.value for s in fams["duet:device_memory_used_bytes"].samples if s.labels["device"] == d}
    assert mem["weights"] > 0 and mem["kv"] > 0, (d, mem)
    steps = [s.value for s in fams["duet:device_step_seconds"].samples
             if s.name.endswith("_count") and s.labels["device"] == d]
    assert steps[0] >= 12, (d, steps)
    busy = [s.value for s in fams["duet:device_busy_seconds"].samples if s.labels["device"] == d]
    assert busy[0] > 0, (d, busy)
PY
then pass "metrics per device"; else failed "metrics per device"; grep "device" metrics.txt | head -20; fi
kill -TERM "$PID"; wait "$PID"
printf 'device_map:\n  layers.0-1: cpu:77\n' > bad.yaml
"$duet" serve --model tiny.gguf --port 0 --config bad.yaml > bad.out 2> bad.err
rc=$?
if [ "$rc" -ne 0 ] && grep -q "no NUMA node 77" bad.err; then pass "serve refuses a bad YAML map"; else failed "serve bad YAML map ($rc)"; cat bad.err; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
