#!/bin/bash
# What a file's download costs the server's memory: a file of SIZE MB uploaded in 8 MB parts (the
# Uploads API, into --files-dir), then downloaded with curl at RATE (curl's --limit-rate; 0: as
# fast as it goes) while the server's resident memory is read every 50 ms:
#
#   bench/download_memory.sh [--size 200] [--rate 50M] [--duet build/duet] [--port 8941]
#
# Prints the server's resident memory before, its peak during the download and the growth, the
# download's seconds and bytes, and whether they are the file's.
set -euo pipefail

size=200
rate=50M
port=8941
duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --duet) duet="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'kill "$pid" 2> /dev/null; rm -rf "$work"' EXIT
cd "$work"
"$duet" make-model --preset tiny --type q8_0 --seed 1 -o tiny.gguf 2> /dev/null
head -c $((size * 1000000)) /dev/urandom > file.jsonl
"$duet" serve --model tiny.gguf --port "$port" --threads 1 --files-dir "$work/files" \
  --files-store-mib $((size * 2 + 64)) > serve.out 2> serve.err &
pid=$!
for _ in $(seq 1 300); do grep -q "duet: ready" serve.err 2> /dev/null && break; sleep 0.1; done
url="http://127.0.0.1:$port/v1"
id() { /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
uid=$(curl -s "$url/uploads" -H 'Content-Type: application/json' \
  -d "{\"filename\": \"file.jsonl\", \"purpose\": \"batch\", \"bytes\": $(stat -c %s file.jsonl), \"mime_type\": \"text/jsonl\"}" | id)
split -b 8000000 -d -a 3 file.jsonl part.
parts=""
for p in part.*; do parts="$parts${parts:+,}\"$(curl -s "$url/uploads/$uid/parts" -F "data=@$p" | id)\""; done
fid=$(curl -s "$url/uploads/$uid/complete" -H 'Content-Type: application/json' -d "{\"part_ids\": [$parts]}" |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["file"]["id"])')
rss() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
sleep 1
before=$(rss); peak=$before
limit=()
[ "$rate" != 0 ] && limit=(--limit-rate "$rate")
start=$(date +%s.%N)
curl -s "${limit[@]}" -o back.jsonl "$url/files/$fid/content" &
cpid=$!
while kill -0 "$cpid" 2> /dev/null; do
  now=$(rss); [ "$now" -gt "$peak" ] && peak=$now
  sleep 0.05
done
wait "$cpid"
took=$(/usr/bin/python3 -c "import time; print(f'{time.time() - $start:.2f}')")
same=$(cmp -s file.jsonl back.jsonl && echo yes || echo NO)
echo "size ${size} MB, rate ${rate}: resident ${before} KiB before, peak ${peak} KiB, grew $(((peak - before) / 1024)) MiB;" \
  "downloaded $(stat -c %s back.jsonl) bytes in ${took} s; the file's bytes: ${same}"
