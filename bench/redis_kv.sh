#!/usr/bin/env bash
# The Redis KV tier's time to first token: one prompt's first answer on a cold server without
# Redis, on a cold server writing to Redis, on a restarted server reading its blocks back from
# Redis, and again from its local prefix cache; alternated over rounds.
# usage: bench/redis_kv.sh DUET MODEL.gguf [ROUNDS] [PROMPT_WORDS] [TIMEOUT_MS]
set -uo pipefail
duet="$(realpath "$1")"; model="$(realpath "$2")"; rounds="${3:-3}"; words="${4:-150}"; timeout_ms="${5:-1000}"
work="${BENCH_OUT:-/tmp/redis_kv_bench}"
rm -rf "$work" && mkdir -p "$work/redis" && cd "$work" || exit 1
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis" --save "" --appendonly no > redis.log 2>&1 &
redis_pid=$!
trap 'kill $redis_pid $spid 2> /dev/null' EXIT
sleep 0.5
spid=""
start() {  # start NAME ARGS...
  local name=$1; shift
  "$duet" --log-level debug serve --model "$model" --port 0 --threads 2 --kv-cache-memory 1073741824 \
    --served-model-name m "$@" \
    > "$name.out" 2> "$name.err" &
  spid=$!
  for _ in $(seq 1 600); do grep -q "duet: ready" "$name.err" && break; sleep 0.1; done
  sport=$(grep -oE "listening on http://127.0.0.1:[0-9]+" "$name.err" | grep -oE "[0-9]+$")
  # One short request first, so that the weights' first touch is not in the measured times.
  curl -s -o /dev/null "http://127.0.0.1:$sport/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "m", "prompt": "warm up", "max_tokens": 1}'
}
stop() { kill "$spid"; wait "$spid" 2> /dev/null; }
ask() {  # ask SALT: seconds to the whole answer of one token
  local prompt
  prompt=$(/usr/bin/python3 -c "import sys; print(' '.join(f'w{sys.argv[1]}x{i}' for i in range(int(sys.argv[2]))))" "$1" "$words")
  curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$sport/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"m\", \"prompt\": \"$prompt\", \"max_tokens\": 1, \"temperature\": 0}"
}
metric() { curl -s "http://127.0.0.1:$sport/metrics" | grep -E "^$1" | awk '{s += $2} END {print s + 0}'; }
redis=(--kv-cache-redis "redis://127.0.0.1:$port" --kv-cache-redis-timeout-ms "$timeout_ms")
printf "%-6s %10s %12s %14s %12s %10s %10s %10s\n" round plain_s cold_redis_s restarted_s local_s hits MiB_read fetch
for r in $(seq 1 "$rounds"); do
  start plain; plain=$(ask "$r"); stop
  start cold "${redis[@]}"; cold=$(ask "$r"); sleep 2; stop
  start restarted "${redis[@]}"; restarted=$(ask "$r"); hits=$(metric duet:kv_redis_hits_total)
  bytes=$(metric 'duet:kv_redis_bytes_total\{.*dir="read"'); local_=$(ask "$r"); stop
  fetch_ms=$(grep -oE "blocks fetched in [0-9.]+ ms" restarted.err | grep -oE "[0-9.]+ ms" | tail -1)
  printf "%-6s %10s %12s %14s %12s %10s %10.1f %10s\n" "$r" "$plain" "$cold" "$restarted" "$local_" "$hits" \
    "$(echo "$bytes / 1048576" | bc -l)" "${fetch_ms:-none}"
done
