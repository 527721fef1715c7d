# Shared by the server test scripts: results, starting `duet serve` on 127.0.0.1 port 0, requests
# with curl, and OpenAI error bodies checked. Source it, then call start_test "$@" (../cli/lib.sh)
# or enter the work directory with $duet set; set $model_file before start_server.
source "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"  # failures, pass, failed, expect_ok, expect_fail
py=/usr/bin/python3
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT

# require_npm PACKAGE...: exits, failing, unless each npm package is installed here (tests/server).
require_npm() {
  local pkg dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  for pkg in "$@"; do
    if [ ! -d "$dir/node_modules/$pkg" ]; then
      echo "the $pkg npm package is not installed in $dir (run scripts/install-deps.sh)"
      exit 1
    fi
  done
}

# start_server NAME ARGS...: starts `duet serve` in the background; sets PORT and PID. The KV
# pool is 32 MiB unless SERVER_KV_ARGS is set (empty: sized from the memory available).
start_server() {
  local name="$1"; shift
  local kv=(--kv-cache-memory 33554432)
  [ -n "${SERVER_KV_ARGS+set}" ] && read -r -a kv <<< "$SERVER_KV_ARGS"
  "$duet" serve --model "$model_file" --port 0 "${kv[@]}" --threads "${SERVER_THREADS:-1}" "$@" > "$name.out" 2> "$name.err" &
  PID=$!
  pids+=("$PID")
  PORT=""
  for _ in $(seq 1 300); do
    if grep -q "duet: ready" "$name.err" 2>/dev/null; then
      PORT=$(grep -oE "listening on https?://127.0.0.1:[0-9]+" "$name.err" | grep -oE "[0-9]+$" | head -1)
      return 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then echo "server $name exited:"; cat "$name.err"; return 1; fi
    sleep 0.1
  done
  echo "server $name did not become ready:"; cat "$name.err"; return 1
}

# request METHOD PATH [BODY] [extra curl args...]: status in $STATUS, body in resp.json
request() {
  local method="$1" path="$2" body="${3:-}"; shift 3 2>/dev/null || shift $#
  if [ -n "$body" ]; then
    STATUS=$(curl -s -o resp.json -w '%{http_code}' -X "$method" -H 'Content-Type: application/json' \
      --data-binary "$body" "$@" "http://127.0.0.1:$PORT$path")
  else
    STATUS=$(curl -s -o resp.json -w '%{http_code}' -X "$method" "$@" "http://127.0.0.1:$PORT$path")
  fi
}

# expect_error NAME STATUS TYPE PARAM METHOD PATH BODY [curl args]: an OpenAI error body
expect_error() {
  local name="$1" status="$2" type="$3" param="$4"; shift 4
  request "$@"
  if [ "$STATUS" = "$status" ] && $py - resp.json "$type" "$param" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert set(e) >= {"message", "type", "param", "code"}, e
assert e["type"] == sys.argv[2], e
if sys.argv[3] != "-":
    assert e["param"] == sys.argv[3], e
assert e["message"], e
PY
  then pass "$name"; else failed "$name (got $STATUS: $(head -c 300 resp.json))"; fi
}
