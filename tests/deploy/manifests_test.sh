#!/usr/bin/env bash
# The Dockerfile, deploy/compose.yaml, deploy/k8s and deploy/systemd, checked without a Docker
# daemon or a cluster (none runs where the tests run): check_manifests.py parses them and checks
# their cross-references; systemd-analyze verifies the unit; and the configurations they ship are
# loaded by a real `duet serve`, whose answers on the probe and health-check routes are checked.
# usage: manifests_test.sh DUET_BINARY WORK_DIR SOURCE_DIR
set -uo pipefail
duet="$1"
work="$2"
src="$3"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$src/tests/server/lib.sh"
export WORK="$work"

if $py "$src/tests/deploy/check_manifests.py" "$src" "$duet" routes.txt; then
  pass "manifests parse and agree with each other"; else failed "manifests"; fi

# The checks are not vacuous: broken copies fail with the message that names the break.
mutate() {  # mutate NAME PATTERN FILE SED-EXPR: a copy of the files with FILE edited must fail with PATTERN
  local name="$1" pattern="$2" file="$3" expr="$4"
  rm -rf mut && mkdir mut && cp -r "$src/deploy" "$src/Dockerfile" "$src/.dockerignore" "$src/scripts" mut/
  ln -s "$src/src" mut/src && ln -s "$src/cmake" mut/cmake && ln -s "$src/CMakeLists.txt" mut/CMakeLists.txt
  sed -i "$expr" "mut/$file"
  if $py "$src/tests/deploy/check_manifests.py" mut "$duet" mut-routes.txt > mut.txt 2>&1; then
    failed "$name: not caught"
  elif grep -q -- "$pattern" mut.txt; then pass "$name: caught"; else failed "$name: $(grep FAIL mut.txt | head -3)"; fi
}
mutate "service targets a port the pod lacks" "targets web" deploy/k8s/service.yaml 's/targetPort: http/targetPort: web/'
mutate "grace period shorter than the drain" "terminationGracePeriodSeconds 20" deploy/k8s/deployment.yaml 's/terminationGracePeriodSeconds: 35/terminationGracePeriodSeconds: 20/'
mutate "unknown config key" "'shutdown_timout' is not a setting" deploy/k8s/configmap.yaml 's/shutdown_timeout: 30/shutdown_timout: 30/'
mutate "runtime library missing" "does not install libyaml-cpp0.7" Dockerfile 's/ libyaml-cpp0.7 / /'
mutate "image runs as root" "non-root USER" Dockerfile 's/^USER duet/USER root/'
mutate "prometheus scrapes the wrong port" "not duet:8000" deploy/prometheus/prometheus.yml 's/duet:8000/duet:9000/'
mutate "grafana dashboards not mounted" "no mount provides" deploy/grafana/provisioning/dashboards/duet.yaml 's#dashboards/duet$#dashboards/other#'
mutate "TimeoutStopSec shorter than the drain" "TimeoutStopSec=20" deploy/systemd/duet.service 's/TimeoutStopSec=35/TimeoutStopSec=20/'

# systemd-analyze verify prints (and does not fail on) unknown keys and bad values: any output
# is a failure. ExecStart points at the binary under test, which must exist for the check.
if command -v systemd-analyze > /dev/null; then
  sed "s#/usr/local/bin/duet#$duet#" "$src/deploy/systemd/duet.service" > duet.service
  if systemd-analyze verify ./duet.service > verify.txt 2>&1 && [ ! -s verify.txt ]; then
    pass "systemd-analyze verify duet.service"; else failed "systemd-analyze verify: $(cat verify.txt)"; fi
  sed 's/^Restart=on-failure/Restart=sometimes/' duet.service > bad.service
  systemd-analyze verify ./bad.service > bad.txt 2>&1
  [ -s bad.txt ] && pass "systemd-analyze catches a bad value" || failed "systemd-analyze is silent on a bad value"
else
  echo "note: systemd-analyze is not installed here; the unit was checked by check_manifests.py only"
fi

# The shipped configurations start a real server (the model and address replaced for the test),
# and every route a probe or health check asks answers 200 once the model is loaded.
"$duet" make-model --preset tiny --type q8_0 --seed 1 -o tiny.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=tiny.gguf
for cfg in k8s-duet.yaml "$src/deploy/systemd/duet.yaml"; do
  start_server "$(basename "$cfg" .yaml)" --config "$cfg" --host 127.0.0.1 --log-file server.log || exit 1
  while read -r route; do
    [ -n "$route" ] || continue
    request GET "$route"
    [ "$STATUS" = 200 ] && pass "$cfg: GET $route answers 200" || failed "$cfg: GET $route ($STATUS)"
  done < routes.txt
  grep -q '"msg":"request"\|"msg": "request"\|engine:' server.log && pass "$cfg: JSON log to --log-file" \
    || failed "$cfg: no JSON log lines"
  kill -TERM "$PID"; wait "$PID"
  [ $? -eq 0 ] && pass "$cfg: SIGTERM exits 0" || failed "$cfg: SIGTERM exit status"
done

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
