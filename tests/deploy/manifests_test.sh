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
mutate "no reload for logrotate" "ExecReload=None" deploy/systemd/duet.service "/^ExecReload=/d"
mutate "batches kept outside any volume" "which no volume holds" deploy/compose.yaml "s#duet-files:/var/lib/duet/files#duet-files:/var/lib/duet/other#"

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

# Log rotation: the shipped logrotate file, run by logrotate itself against a running server. Its
# paths point into the work folder and its postrotate sends SIGHUP to the server straight (no
# systemd here: in service, the unit's ExecReload does).
mkdir -p logs
start_server rotate --config "$src/deploy/systemd/duet.yaml" --host 127.0.0.1 --log-file "$work/logs/duet.log" || exit 1
request GET /v1/models
sed -e "s#/var/log/duet/#$work/logs/#" -e "s#systemctl reload duet.service#kill -HUP $PID#" \
  "$src/deploy/systemd/duet.logrotate" > rotate.conf
if grep -q "kill -HUP $PID" rotate.conf && grep -q "$work/logs/" rotate.conf; then
  logrotate -f -s rotate.state rotate.conf > rotate.out 2>&1 || failed "logrotate: $(cat rotate.out)"
  sleep 0.5
  request GET /v1/models
  if kill -0 "$PID" 2> /dev/null && [ "$STATUS" = 200 ]; then pass "the server serves on after the rotation"
  else failed "the server after SIGHUP ($STATUS)"; fi
  [ -s logs/duet.log.1 ] && grep -q "v1/models" logs/duet.log.1 && pass "logrotate moved the old log to duet.log.1" \
    || failed "no rotated log: $(ls logs)"
  grep -q "opened the log file .* again" logs/duet.log && grep -q "v1/models" logs/duet.log \
    && pass "new lines go to a new duet.log" || failed "the new log: $(head -c 300 logs/duet.log)"
  grep -q "opened the log file .* again" logs/duet.log.1 && failed "a line after the rotation went to the old file" \
    || pass "nothing after the rotation went to the old file"
else
  failed "duet.logrotate no longer has the path or postrotate line this test rewrites: $(cat rotate.conf)"
fi
# A log folder that is gone comes back; a path that cannot be a folder is an error in the old
# file, and the server serves on.
mv logs logs.moved
kill -HUP "$PID"; sleep 0.5
request GET /v1/models
[ "$STATUS" = 200 ] && grep -q "opened the log file .* again" logs/duet.log 2> /dev/null \
  && pass "a log folder removed after the rotation is made again" || failed "SIGHUP without a log folder ($STATUS): $(ls)"
mv logs logs.second && echo "not a folder" > logs
kill -HUP "$PID"; sleep 0.5
request GET /v1/models
[ "$STATUS" = 200 ] && grep -q "SIGHUP: cannot open log file" logs.second/duet.log \
  && pass "a log file that cannot be opened again is an error in the old one, not a crash" \
  || failed "SIGHUP with a file where the folder was ($STATUS): $(tail -c 300 logs.second/duet.log)"
kill -TERM "$PID"; wait "$PID"
# Without a log file SIGHUP changes nothing (its default action would end the process).
start_server hup || exit 1
kill -HUP "$PID"; sleep 0.3
request GET /health
[ "$STATUS" = 200 ] && pass "SIGHUP with logs on stderr: the server serves on" || failed "SIGHUP ended the server"
kill -TERM "$PID"; wait "$PID"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
