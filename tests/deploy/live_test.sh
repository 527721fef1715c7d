#!/usr/bin/env bash
# deploy/ against a live `duet serve` (a tiny model on 127.0.0.1, port 0, JSON logs):
# - every query of the Grafana dashboard and every rule names metrics that /metrics exports,
#   with the labels it uses (check_metric_names.py);
# - the access lines duet writes carry every field deploy/filebeat maps (check_filebeat.py);
# - the routes the probes and health checks of deploy/ use answer as they expect.
# usage: live_test.sh DUET_BINARY WORK_DIR SOURCE_DIR
set -uo pipefail
duet="$1"
work="$2"
src="$3"
here="$src/tests/deploy"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$src/tests/server/lib.sh"

"$duet" make-model --preset tiny --type q8_0 --seed 1 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
# A RAPL package counter (the layout of /sys/class/powercap), so the energy metric is exported as
# on a machine that has one.
mkdir -p rapl/intel-rapl:0
echo package-0 > rapl/intel-rapl:0/name; echo 1000000000 > rapl/intel-rapl:0/max_energy_range_uj
echo 1000 > rapl/intel-rapl:0/energy_uj
DUET_POWERCAP_DIR="$work/rapl" start_server live --log-format json --log-file duet.log || exit 1

C=/v1/completions
CH=/v1/chat/completions
request POST $C '{"prompt": "Hello", "max_tokens": 4, "temperature": 0}'
[ "$STATUS" = 200 ] && pass "completion" || failed "completion ($STATUS)"
request POST $C '{"prompt": "Hello", "max_tokens": 4, "temperature": 0}'  # a prefix-cache hit
request POST $CH '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true}'
[ "$STATUS" = 200 ] && pass "streamed chat" || failed "streamed chat ($STATUS)"
request POST $C '{"prompt": "Hello", "max_tokens": -1}'
[ "$STATUS" = 400 ] && pass "a failing request" || failed "a failing request ($STATUS)"
request GET /v1/models
request GET /health
[ "$STATUS" = 200 ] && pass "/health answers 200 when ready" || failed "/health ($STATUS)"
sleep 1.1  # utilization is computed over at least a second between scrapes
curl -s "http://127.0.0.1:$PORT/metrics" > /dev/null
curl -s "http://127.0.0.1:$PORT/metrics" > metrics.txt

if $py "$here/check_metric_names.py" metrics.txt --dashboard "$src/deploy/grafana/dashboards/duet.json" \
     --rules "$src/deploy/prometheus/duet-rules.yaml"; then
  pass "dashboard and rules name exported metrics"; else failed "dashboard and rules name exported metrics"; fi
# The check is not vacuous: a misspelt metric and a label the metric lacks are both caught.
sed -e 's/vllm:num_preemptions_total/vllm:num_preemption_total/' -e 's/by (finished_reason)/by (finish_reason)/' \
  "$src/deploy/grafana/dashboards/duet.json" > bad.json
$py "$here/check_metric_names.py" metrics.txt --dashboard bad.json > bad.txt
if grep -q "'vllm:num_preemption_total' is not exported" bad.txt && grep -q "groups by \['finish_reason'\]" bad.txt; then
  pass "a wrong name and a wrong label are caught"; else failed "wrong names not caught"; cat bad.txt; fi

kill -TERM "$PID"; wait "$PID"
if $py "$here/check_filebeat.py" "$src/deploy/filebeat/filebeat.yml" duet.log; then
  pass "access lines carry the fields filebeat maps"; else failed "filebeat fields"; head -5 duet.log; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
