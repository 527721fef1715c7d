#!/usr/bin/env bash
# One process with 2 threads against 2 ranks of 1 thread each (tensor parallelism, then pipeline
# parallelism), in alternation, on the same file: `duet bench` pp and tg of one sequence.
# usage: bench/parallel.sh [-p 64] [-n 32] [-r 3] [--rounds 2] MODEL.gguf
set -euo pipefail
p=64 n=32 r=3 rounds=2
while [ $# -gt 1 ]; do
  case "$1" in
    -p) p="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    -r) r="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 1 ;;
  esac
done
model="$1"
duet="$(cd "$(dirname "$0")/.." && pwd)/build/duet"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in $(seq 1 "$rounds"); do
  echo "round $round: one process, 2 threads"
  "$duet" bench -m "$model" -p "$p" -n "$n" -r "$r" -t 2 | tail -2
  for flag in --tensor-parallel-size --pipeline-parallel-size; do
    echo "round $round: mpirun -np 2, 1 thread each, $flag 2"
    mpirun --oversubscribe --bind-to none -np 2 "$duet" bench -m "$model" -p "$p" -n "$n" -r "$r" -t 1 "$flag" 2 | tail -2
  done
done
