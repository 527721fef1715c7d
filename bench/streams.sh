#!/bin/bash
# duet serve against llama.cpp's llama-server under the same streaming load, one server at a time,
# in alternation, each driven by `duet bench serve` with random token ids:
#
#   bench/streams.sh [-t 2] [-c 16] [-n 32] [--input-len 64] [--output-len 32] [--rounds 2] \
#       [--ctx 4096] [--port 8931] [--duet build/duet] --llama LLAMA MODEL.gguf
#
# LLAMA is a llama-server binary or a build directory holding bin/llama-server. llama-server gets
# `--parallel C -c CTX` (its cache is split over the C slots: CTX must hold C x (in + out)); duet
# serves with its defaults; the servers listen on 127.0.0.1, ports PORT up to PORT + 2 x rounds - 1.
# Each round prints both servers' output tokens/s (and failed requests, if any), TTFT p50/p99, TPOT
# p50 and the ratio; the JSON of every run stays in $BENCH_OUT (default: a temporary directory).
set -euo pipefail

threads=$(nproc)
conc=16
num=32
in_len=64
out_len=32
rounds=2
ctx=4096
port=8931
duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
llama=""
model=""
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads="$2"; shift 2 ;;
    -c) conc="$2"; shift 2 ;;
    -n) num="$2"; shift 2 ;;
    --input-len) in_len="$2"; shift 2 ;;
    --output-len) out_len="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --duet) duet="$2"; shift 2 ;;
    --llama) llama="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "streams.sh: unknown option $1" >&2; exit 2 ;;
    *) model="$1"; shift ;;
  esac
done
if [ -z "$model" ] || [ -z "$llama" ]; then
  echo "usage: bench/streams.sh [options] --llama LLAMA MODEL.gguf (--help)" >&2
  exit 2
fi
[ -d "$llama" ] && llama="$llama/bin/llama-server"
[ -x "$llama" ] || { echo "streams.sh: $llama is not an executable llama-server" >&2; exit 2; }
[ -x "$duet" ] || { echo "streams.sh: $duet is not built (make build)" >&2; exit 2; }
[ -f "$model" ] || { echo "streams.sh: no model file $model" >&2; exit 2; }
out="${BENCH_OUT:-$(mktemp -d)}"
mkdir -p "$out"

# The vocabulary size, for the random prompt ids (tokens past it would be refused).
vocab=$("$duet" inspect "$model" 2>/dev/null | sed -n 's/.*vocab_size = \([0-9][0-9]*\).*/\1/p' | head -1)
[ -n "$vocab" ] || { echo "streams.sh: could not read the vocabulary size of $model (duet inspect)" >&2; exit 2; }

server=""
stop_server() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
  fi
}
trap stop_server EXIT

wait_ready() {  # until GET /health answers 200, or the server exits
  for _ in $(seq 1 600); do
    kill -0 "$server" 2>/dev/null || { echo "streams.sh: the $1 server exited (log: $out/$1.log)" >&2; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && return 0
    sleep 0.5
  done
  echo "streams.sh: the $1 server did not become ready" >&2
  exit 1
}

run_load() {  # engine round
  "$duet" bench serve --base-url "http://127.0.0.1:$port" --model bench -c "$conc" -n "$num" \
    --input-len "$in_len" --output-len "$out_len" --token-ids --vocab-size "$vocab" --seed 1 \
    --json "$out/$1-$2.json" > "$out/$1-$2.txt"
}

field() {  # file key
  /usr/bin/python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
failed() {  # file: the failed requests, if any
  /usr/bin/python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["failed"]; print(" (%d failed)" % f if f else "")' "$1"
}

echo "| round | duet output tok/s | llama-server | ratio | TTFT p50 / p99 ms, duet | llama-server | TPOT p50 ms, duet / llama-server |"
echo "| --- | ---: | ---: | ---: | --- | --- | --- |"
base_port=$port
for round in $(seq 1 "$rounds"); do
  # A new port for every server: the connections llama-server closes stay in TIME_WAIT for a minute
  # without SO_REUSEADDR, and no server can bind their port until then.
  port=$((base_port + 2 * round - 2))
  "$duet" serve --model "$model" --served-model-name bench --threads "$threads" --port "$port" --no-ui \
    > "$out/duet.log" 2>&1 &
  server=$!
  wait_ready duet
  run_load duet "$round"
  stop_server
  port=$((port + 1))
  "$llama" -m "$model" -a bench -t "$threads" --parallel "$conc" -c "$ctx" --port "$port" \
    > "$out/llama.log" 2>&1 &
  server=$!
  wait_ready llama-server
  run_load llama "$round"
  stop_server
  d="$out/duet-$round.json" l="$out/llama-$round.json"
  dt=$(field "$d" output_throughput) lt=$(field "$l" output_throughput)
  ratio=$(/usr/bin/python3 -c "print('%.2fx' % ($dt / $lt))")
  echo "| $round | $dt$(failed "$d") | $lt$(failed "$l") | $ratio | $(field "$d" median_ttft_ms) / $(field "$d" p99_ttft_ms) |" \
       "$(field "$l" median_ttft_ms) / $(field "$l" p99_ttft_ms) | $(field "$d" median_tpot_ms) / $(field "$l" median_tpot_ms) |"
done
echo "raw results: $out"
