#!/usr/bin/env bash
# Several ranks as a user runs them: real `mpirun` processes on this machine (loopback, shared
# memory), each loading its share of the same file. Pipeline parallelism gives the logits of one
# process bit for bit; tensor parallelism (and deepseek2's expert parallelism) gives them within
# the bound of its allreduce (docs/ARCHITECTURE.md, "Ranks"), with a LoRA adapter too; the
# engine's greedy outputs of 16 prompts at once equal their one-at-a-time outputs under T = 2 and
# P = 2.
# usage: parallel_test.sh DUET_BINARY WORK_DIR MPIRUN
set -uo pipefail
mpirun_bin="$3"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# In a session of its own: mpirun signals its ranks' process groups when a job ends early.
mpi() { local np="$1"; shift; setsid -w timeout 300 "$mpirun_bin" --oversubscribe --bind-to none -np "$np" "$@"; }

expect_ok "make-model llama" "$duet" make-model --preset tiny --type q8_0 --seed 3 -o llama.gguf
expect_ok "make-model qwen2" "$duet" make-model --preset qwen2-tiny --type f16 --seed 3 -o qwen2.gguf
# qwen3: each rank normalizes its own heads (the norm weights are per head, whole on every rank)
expect_ok "make-model qwen3" "$duet" make-model --preset qwen3-tiny --type f16 --seed 3 -o qwen3.gguf
# f16: the tiny model's shared expert (32 wide) has no whole q8_0 blocks to split over two ranks
expect_ok "make-model deepseek2" "$duet" make-model --preset deepseek2-tiny-v3 --type f16 --seed 3 -o ds2.gguf
expect_ok "make-model deepseek2 v2" "$duet" make-model --preset deepseek2-tiny-v2 --type f32 --seed 3 -o ds2v2.gguf
# deepseek32: every rank runs the whole indexer (its weights whole on each) and so chooses the same
# positions; top-6 leaves positions 7 to 11 of the 11 tokens sparse
expect_ok "make-model deepseek32" "$duet" make-model --preset deepseek32-tiny --index-topk 6 --type f16 --seed 3 -o ds32.gguf

tokens="1 5 9 14 2 7 33 12 8 40 3"
# same_bits NAME A B: identical logits files
same_bits() { if [ -s "$2" ] && cmp -s "$2" "$3"; then pass "$1"; else failed "$1"; diff "$2" "$3" | head -5; fi; }
# within_bound NAME ONE MANY: every logit within 1e-3 of the logits' range, and the same best
# token wherever the best two are further apart than twice the largest difference.
within_bound() {
  if $py - "$2" "$3" <<'PY'
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])]
many = [json.loads(l) for l in open(sys.argv[2])]
assert len(one) == len(many) and one, (len(one), len(many))
worst = 0.0
for a, b in zip(one, many):
    da = {i: v for i, v in a["top"]}
    db = {i: v for i, v in b["top"]}
    assert da.keys() == db.keys(), "different vocabularies"
    span = max(da.values()) - min(da.values())
    diff = max(abs(da[i] - db[i]) for i in da)
    worst = max(worst, diff / span)
    assert diff <= 1e-3 * span, f"pos {a['pos']}: logits differ by {diff} (range {span})"
    best = sorted(da, key=lambda i: -da[i])
    if da[best[0]] - da[best[1]] > 2 * diff:
        assert max(db, key=lambda i: db[i]) == best[0], f"pos {a['pos']}: another best token"
print(f"largest difference: {worst:.2e} of the logits' range")
PY
  then pass "$1"; else failed "$1"; fi
}

top=1000000  # more than any vocabulary here: every logit
for m in llama qwen2 qwen3 ds2 ds2v2 ds32; do
  "$duet" logits --model "$m.gguf" --tokens "$tokens" --all-positions --top "$top" --threads 1 > "$m-one.txt" 2> err.txt \
    || { failed "$m: one process"; cat err.txt; }
  mpi 2 "$duet" logits --model "$m.gguf" --tokens "$tokens" --all-positions --top "$top" --threads 1 \
    --pipeline-parallel-size 2 > "$m-pp2.txt" 2> err.txt || { failed "$m: mpirun pp 2"; cat err.txt; }
  same_bits "$m: P = 2 gives the logits of one process, bit for bit" "$m-one.txt" "$m-pp2.txt"
  mpi 2 "$duet" logits --model "$m.gguf" --tokens "$tokens" --all-positions --top "$top" --threads 1 \
    --tensor-parallel-size 2 > "$m-tp2.txt" 2> err.txt || { failed "$m: mpirun tp 2"; cat err.txt; }
  within_bound "$m: T = 2 within the allreduce's bound" "$m-one.txt" "$m-tp2.txt"
  mpi 2 "$duet" logits --model "$m.gguf" --tokens "$tokens" --all-positions --top "$top" --threads 1 \
    --tensor-parallel-size 2 --no-shm-collectives > "$m-tp2-mpi.txt" 2> err.txt || { failed "$m: tp 2 over MPI"; cat err.txt; }
  same_bits "$m: T = 2 gives the same bits over MPI and shared memory" "$m-tp2.txt" "$m-tp2-mpi.txt"
done
for m in llama ds2 ds32; do
  mpi 4 "$duet" logits --model "$m.gguf" --tokens "$tokens" --all-positions --top "$top" --threads 1 \
    --tensor-parallel-size 2 --pipeline-parallel-size 2 > "$m-tp2pp2.txt" 2> err.txt || { failed "$m: mpirun 2 x 2"; cat err.txt; }
  within_bound "$m: T x P = 2 x 2 within the bound" "$m-one.txt" "$m-tp2pp2.txt"
  same_bits "$m: T x P = 2 x 2 gives the bits of T = 2" "$m-tp2.txt" "$m-tp2pp2.txt"
done

# --- LoRA adapters over ranks: each rank keeps its share (B's rows of the projections split by
# their outputs, A's columns of those split by their inputs) and none of another stage's layers.
# The q8_0 model's adapter runs through int8 kernels, whose rounding of the rank-r intermediate
# differs when it is split over ranks: T is compared on the exact path (DUET_MATMUL=exact).
lora_dims() {  # lora_dims MODEL: make_lora_adapter.py's size options for its shapes
  "$duet" inspect "$1" > inspect.txt
  local arch; arch=$(sed -n 's/^architecture: //p' inspect.txt)
  key() { grep -oE "^  $arch\.$1 = [0-9]+" inspect.txt | grep -oE '[0-9]+$'; }
  local hidden heads kv
  hidden=$(key embedding_length); heads=$(key attention.head_count); kv=$(key attention.head_count_kv)
  echo --layers "$(key block_count)" --hidden "$hidden" --q-dim "$hidden" --kv-dim $((hidden / heads * kv)) --ff "$(key feed_forward_length)"
}
for m in llama qwen2; do
  # shellcheck disable=SC2046
  $py "$here/../server/make_lora_adapter.py" --out "$m-lora" $(lora_dims "$m.gguf") --seed 4 --std-b 0.05 \
    || { failed "$m: make_lora_adapter"; continue; }
  lora=(--lora "$m-lora" --tokens "$tokens" --all-positions --top "$top" --threads 1)
  "$duet" logits --model "$m.gguf" "${lora[@]}" > "$m-lora-one.txt" 2> err.txt || { failed "$m: LoRA, one process"; cat err.txt; }
  if cmp -s "$m-lora-one.txt" "$m-one.txt"; then failed "$m: the adapter changes nothing"; fi
  mpi 2 "$duet" logits --model "$m.gguf" "${lora[@]}" --pipeline-parallel-size 2 > "$m-lora-pp2.txt" 2> err.txt \
    || { failed "$m: LoRA, pp 2"; cat err.txt; }
  same_bits "$m: a LoRA adapter under P = 2 gives the logits of one process, bit for bit" "$m-lora-one.txt" "$m-lora-pp2.txt"
  DUET_MATMUL=exact "$duet" logits --model "$m.gguf" "${lora[@]}" > "$m-lora-exact.txt" 2> err.txt || { failed "$m: LoRA exact"; cat err.txt; }
  DUET_MATMUL=exact mpi 2 "$duet" logits --model "$m.gguf" "${lora[@]}" --tensor-parallel-size 2 > "$m-lora-tp2.txt" 2> err.txt \
    || { failed "$m: LoRA, tp 2"; cat err.txt; }
  within_bound "$m: a LoRA adapter under T = 2 within the allreduce's bound" "$m-lora-exact.txt" "$m-lora-tp2.txt"
done
# deepseek2 (V3's shape, f16): an adapter on MLA's q_a, q_b, kv_a, kv_b and o, the dense layer's
# feed-forward, the shared experts and every routed expert. kv_b's update goes through each rank's
# own heads, an expert's on the rank that runs it (expert parallelism).
ds2_lora() {
  "$duet" inspect ds2.gguf > inspect.txt &&
    $py "$here/../server/make_lora_adapter.py" --out ds2-lora --deepseek2 inspect.txt --seed 6 --std-b 0.05
}
if ds2_lora; then
  lora=(--lora ds2-lora --tokens "$tokens" --all-positions --top "$top" --threads 1)
  "$duet" logits --model ds2.gguf "${lora[@]}" > ds2-lora-one.txt 2> err.txt || { failed "ds2: LoRA, one process"; cat err.txt; }
  if cmp -s ds2-lora-one.txt ds2-one.txt; then failed "ds2: the adapter changes nothing"; fi
  mpi 2 "$duet" logits --model ds2.gguf "${lora[@]}" --pipeline-parallel-size 2 > ds2-lora-pp2.txt 2> err.txt \
    || { failed "ds2: LoRA, pp 2"; cat err.txt; }
  same_bits "ds2: a LoRA adapter under P = 2 gives the logits of one process, bit for bit" ds2-lora-one.txt ds2-lora-pp2.txt
  DUET_MATMUL=exact "$duet" logits --model ds2.gguf "${lora[@]}" > ds2-lora-exact.txt 2> err.txt || { failed "ds2: LoRA exact"; cat err.txt; }
  DUET_MATMUL=exact mpi 2 "$duet" logits --model ds2.gguf "${lora[@]}" --tensor-parallel-size 2 > ds2-lora-tp2.txt 2> err.txt \
    || { failed "ds2: LoRA, tp 2"; cat err.txt; }
  within_bound "ds2: a LoRA adapter under T = 2 (heads, shared experts, routed experts split) within the bound" \
    ds2-lora-exact.txt ds2-lora-tp2.txt
else
  failed "ds2: make_lora_adapter"
fi
DUET_MATMUL=exact mpi 4 "$duet" logits --model llama.gguf --lora llama-lora --tokens "$tokens" --all-positions --top "$top" \
  --threads 1 --tensor-parallel-size 2 \
  --pipeline-parallel-size 2 > llama-lora-tp2pp2.txt 2> err.txt || { failed "llama: LoRA, 2 x 2"; cat err.txt; }
within_bound "llama: a LoRA adapter under T x P = 2 x 2 within the bound" llama-lora-exact.txt llama-lora-tp2pp2.txt

# --- the engine: 16 prompts at once equal one at a time, greedy, under T = 2 and under P = 2 ----
$py - <<'PY'
import json
words = ["alpha", "beta", "gamma", "delta", "tree", "river", "code", "sort", "list", "map"]
with open("prompts.jsonl", "w") as f:
    for i in range(16):
        text = " ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 5))
        f.write(json.dumps({"prompt": text, "max_tokens": 6 + i % 4, "temperature": 0, "ignore_eos": True}) + "\n")
PY
for flags in "--tensor-parallel-size 2" "--pipeline-parallel-size 2"; do
  mpi 2 "$duet" generate --model llama.gguf --prompts-file prompts.jsonl --threads 1 $flags -o batched.jsonl \
    > /dev/null 2> err.txt || { failed "generate $flags"; cat err.txt; }
  mpi 2 "$duet" generate --model llama.gguf --prompts-file prompts.jsonl --threads 1 $flags --max-num-seqs 1 \
    -o alone.jsonl > /dev/null 2> err.txt || { failed "generate $flags one at a time"; cat err.txt; }
  # The tokens of every prompt (prefix-cache hits differ with the order, so num_cached_tokens may).
  tokens_of() { $py -c "import json,sys; [print(json.loads(l)['index'], json.loads(l)['token_ids']) for l in open(sys.argv[1])]" "$1"; }
  tokens_of batched.jsonl > batched.txt; tokens_of alone.jsonl > alone.txt
  if [ "$(wc -l < batched.txt)" = 16 ] && cmp -s batched.txt alone.txt; then
    pass "16 greedy requests at once equal one at a time ($flags)"
  else
    failed "batch invariance ($flags)"; diff batched.txt alone.txt | head -5
  fi
  if [ "$flags" = "--pipeline-parallel-size 2" ]; then
    "$duet" generate --model llama.gguf --prompts-file prompts.jsonl --threads 1 -o single.jsonl > /dev/null 2>&1
    tokens_of single.jsonl > single.txt
    same_bits "P = 2 generates what one process does" single.txt batched.txt
  fi
done

# --- refused with a clear message --------------------------------------------------------------
expect_fail "sizes without mpirun" "needs 2 ranks: start it with mpirun -np 2" \
  "$duet" logits --model llama.gguf --tokens "1 2" --tensor-parallel-size 2
mpi 2 "$duet" logits --model llama.gguf --tokens "1 2" --tensor-parallel-size 4 > out.txt 2> err.txt
rc=$?
if [ "$rc" -ne 0 ] && grep -q "is 4 ranks, but the job has 2" err.txt; then pass "sizes that do not match mpirun -np"
else failed "sizes that do not match (exit $rc)"; cat err.txt; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
