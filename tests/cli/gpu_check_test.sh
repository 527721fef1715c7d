#!/usr/bin/env bash
# scripts/gpu-check.sh in its dry run (DUET_GPU_CHECK_DRY_RUN=1: the GPU part stubbed, guarded:0
# standing for cuda:0, tiny models): every step it can take without a GPU passes, and the summary
# (markdown and JSON, in $OUT) says it was a dry run.
# usage: gpu_check_test.sh BUILD_DIR WORK_DIR
set -uo pipefail
build="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work" && mkdir -p "$work/out" || exit 1
cd "$work" || exit 1
source "$here/lib.sh"
py=/usr/bin/python3

DUET_GPU_CHECK_DRY_RUN=1 OUT="$work/out" bash "$here/../../scripts/gpu-check.sh" "$build" > run.log 2>&1
rc=$?
if [ "$rc" = 0 ]; then pass "the dry run passes"; else failed "the dry run exited $rc: $(tail -30 run.log)"; fi
contains "the summary says it was a dry run" "DRY RUN.*DUET_GPU_CHECK_DRY_RUN=1" out/gpu-check.md
contains "the summary names the stand-in device" "device guarded:0" out/gpu-check.md
if $py - out/gpu-check.json "$build" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
assert d["dry_run"] is True and d["device"] == "guarded:0", d
steps = {s["name"]: s["result"] for s in d["steps"]}
assert steps["gpu"] == "skip" and steps["build"] == "skip", steps
for name in ("cuda_tests", "logits_coder", "logits_v2", "logits_v3fp8", "bench_pp_tg", "bench_tg_no_graphs", "bench_decode_b64",
             "bench_decode_b64_no_graphs", "bench_serve"):
    assert steps.get(name) == "pass", (name, steps)
n = d["numbers"]
for key in ("prefill_tokens_per_s", "decode_b1_tokens_per_s", "decode_b1_tokens_per_s_no_graphs",
            "decode_b64_tokens_per_s", "decode_b64_tokens_per_s_no_graphs", "serve_output_tokens_per_s"):
    assert float(n[key]) > 0, (key, n)
if os.path.exists(os.path.join(sys.argv[2], "tests/backend/cuda_ops_test")):
    assert int(n["cuda_tests_skipped"]) >= 1, n  # the GPU tests report themselves skipped here
PY
then pass "the JSON summary: every step and number"; else failed "the JSON summary: $(cat out/gpu-check.json)"; fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
