#!/usr/bin/env bash
# deploy/prometheus: the configuration and the rules are valid (`promtool check`), and the rules'
# unit tests pass (`promtool test rules`: series crossing and not crossing each threshold, and
# which alerts fire). promtool comes from Debian's prometheus package (scripts/install-deps.sh).
# usage: prometheus_test.sh SOURCE_DIR
set -uo pipefail
dir="$1/deploy/prometheus"
if ! command -v promtool > /dev/null; then
  echo "FAIL: promtool is not installed (scripts/install-deps.sh installs Debian's prometheus package)"
  exit 1
fi
failures=0
run() { echo "+ $*"; if "$@"; then echo "ok: $*"; else echo "FAIL: $*"; failures=$((failures + 1)); fi; }
cd "$dir" || exit 1
run promtool check rules duet-rules.yaml
run promtool check config prometheus.yml
cd tests || exit 1
run promtool test rules duet-rules.test.yaml
# The unit tests are not vacuous: a rule file whose thresholds moved makes them fail.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tests"
sed -e 's/> 0.85/> 0.95/' -e 's/> 0.30/> 0.50/' -e 's/> 0.01/> 0.05/' ../duet-rules.yaml > "$tmp/duet-rules.yaml"
cp duet-rules.test.yaml "$tmp/tests/"
if (cd "$tmp/tests" && promtool test rules duet-rules.test.yaml > "$tmp/out.txt" 2>&1); then
  echo "FAIL: the rule tests pass with moved thresholds"; failures=$((failures + 1))
else
  n=$(grep -c "alertname:" "$tmp/out.txt")
  if [ "$n" -ge 3 ]; then echo "ok: moved thresholds fail $n alert tests"; else
    echo "FAIL: moved thresholds fail only $n alert tests"; cat "$tmp/out.txt"; failures=$((failures + 1)); fi
fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
