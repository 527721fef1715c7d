#!/usr/bin/env bash
# Runs the real `duet` binary the way a user would and checks what it prints.
# usage: cli_test.sh DUET_BINARY WORK_DIR
set -uo pipefail
duet="$1"
work="$2"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
# expect_ok NAME CMD...: the command succeeds
expect_ok() { local name="$1"; shift; if "$@" > out.txt 2> err.txt; then pass "$name"; else failed "$name (exit $?)"; cat err.txt; fi; }
# expect_fail NAME PATTERN CMD...: the command fails with exit 1 and stderr matching PATTERN
expect_fail() {
  local name="$1" pattern="$2"; shift 2
  "$@" > out.txt 2> err.txt; local rc=$?
  if [ "$rc" -eq 1 ] && grep -qE -- "$pattern" err.txt; then pass "$name"; else failed "$name (exit $rc)"; cat err.txt; fi
}
contains() { if grep -qE -- "$2" "$3"; then pass "$1"; else failed "$1: no /$2/ in $3"; head -20 "$3"; fi; }

# make-model: deterministic, every type.
expect_ok "make-model tiny f32" "$duet" make-model --preset tiny --type f32 --seed 3 -o tiny-f32.gguf
expect_ok "make-model again" "$duet" make-model --preset tiny --type f32 --seed 3 -o again.gguf
if cmp -s tiny-f32.gguf again.gguf; then pass "same seed, same bytes"; else failed "same seed, same bytes"; fi
expect_ok "make-model other seed" "$duet" make-model --preset tiny --type f32 --seed 4 -o other.gguf
if cmp -s tiny-f32.gguf other.gguf; then failed "other seed, other bytes"; else pass "other seed, other bytes"; fi
for t in f16 bf16 q8_0 q4_0; do
  expect_ok "make-model tiny $t" "$duet" make-model --preset tiny --type $t --seed 3 -o tiny-$t.gguf
done
expect_fail "make-model bad type" "unknown --type 'q3_x'" "$duet" make-model --type q3_x -o x.gguf
expect_fail "make-model bad dims" "multiples of 32" "$duet" make-model --type q4_0 --n-embd 48 --n-head 4 --n-head-kv 4 -o x.gguf

# inspect
expect_ok "inspect" "$duet" inspect tiny-q4_0.gguf
contains "inspect architecture" "^architecture: llama" out.txt
contains "inspect hyper-parameters" "llama.block_count = 2" out.txt
contains "inspect tokenizer" "^tokenizer: gpt2 \(pre-tokenizer deepseek-coder\), 512 tokens" out.txt
contains "inspect tensor row" "blk.1.ffn_down.weight +q4_0 +\[256, 128\] +18432" out.txt
contains "inspect parameter count" "^parameters: .*\(229376\)|^parameters: " out.txt
contains "inspect types" "q4_0" out.txt

# tokenize
expect_ok "tokenize" "$duet" tokenize --model tiny-f32.gguf "Hello world, hello code."
contains "tokenize prints ids" "^[0-9]+( [0-9]+)*$" out.txt
ids=$(cat out.txt)
expect_ok "tokenize add-special" "$duet" tokenize --model tiny-f32.gguf --add-special "Hello world, hello code."
bos=$(grep -oE "bos: [0-9]+" <("$duet" inspect tiny-f32.gguf) | grep -oE "[0-9]+")
if [ "$(cat out.txt)" = "$bos $ids" ]; then pass "add-special prepends bos"; else failed "add-special prepends bos: $(cat out.txt) vs $bos $ids"; fi
printf 'line one\nline two' > text.txt
expect_ok "tokenize text-file" "$duet" tokenize --model tiny-f32.gguf --text-file text.txt

# logits: JSON lines, one per position with --all-positions
expect_ok "logits" "$duet" logits --model tiny-f32.gguf --tokens "1 2 3 4 5" --top 3 --all-positions
if /usr/bin/python3 - out.txt <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["pos"] for l in lines] == [0, 1, 2, 3, 4], lines
for l in lines:
    assert len(l["top"]) == 3
    values = [v for _, v in l["top"]]
    assert values == sorted(values, reverse=True)
PY
then pass "logits JSON lines"; else failed "logits JSON lines"; fi
expect_ok "logits last position" "$duet" logits --model tiny-q8_0.gguf --tokens "7,8,9"
if [ "$(wc -l < out.txt)" -eq 1 ] && grep -q '"pos": 2' out.txt; then pass "logits last only"; else failed "logits last only"; fi
expect_fail "logits token out of range" "token id 512 is outside the vocabulary" "$duet" logits --model tiny-f32.gguf --tokens "1 512"
expect_fail "logits bad token text" "'x1' is not a token id" "$duet" logits --model tiny-f32.gguf --tokens "1 x1"

# generate: greedy is deterministic, seeded sampling is reproducible, speed goes to stderr
expect_ok "generate greedy" "$duet" generate --model tiny-q4_0.gguf --prompt "def main():" --max-tokens 12 --temperature 0 --ignore-eos
cp out.txt greedy1.txt
contains "generate stats" "prompt: [0-9]+ tokens .*tok/s.*generation: 12 tokens" err.txt
expect_ok "generate greedy again" "$duet" generate --model tiny-q4_0.gguf --prompt "def main():" --max-tokens 12 --temperature 0 --ignore-eos --threads 1
if cmp -s greedy1.txt out.txt; then pass "greedy deterministic across thread counts"; else failed "greedy deterministic"; diff greedy1.txt out.txt; fi
contains "generate echoes the prompt" "^def main\(\):" out.txt
expect_ok "generate seeded" "$duet" generate --model tiny-f16.gguf --prompt "x" --max-tokens 16 --temperature 1 --seed 9 --ignore-eos
cp out.txt seeded1.txt
expect_ok "generate seeded again" "$duet" generate --model tiny-f16.gguf --prompt "x" --max-tokens 16 --temperature 1 --seed 9 --ignore-eos
if cmp -s seeded1.txt out.txt; then pass "seeded sampling reproducible"; else failed "seeded sampling reproducible"; fi
expect_fail "generate prompt too long" "the prompt has [0-9]+ tokens, but the maximum context length is 4" "$duet" generate --model tiny-f32.gguf --prompt "a long prompt that does not fit" --max-model-len 4
expect_fail "generate bad temperature" "temperature is -1" "$duet" generate --model tiny-f32.gguf --prompt "x" --temperature -1

# generate --prompts-file: one JSON line per prompt, in input order; bad lines get an error
cat > prompts.jsonl <<'JSONL'
{"prompt": "Hello world", "max_tokens": 5, "temperature": 0, "ignore_eos": true}
{"prompt": "def f(x):", "max_tokens": 4, "temperature": 0.7, "seed": 3, "n": 2, "ignore_eos": true}
{"prompt": "bad", "top_p": 7}
not json
{"prompt": "x", "max_tokens": 3, "logprobs": 2, "temperature": 0, "ignore_eos": true}
{"prompt": "Hello world", "max_tokens": 5, "temperature": 0, "ignore_eos": true}
JSONL
"$duet" generate --model tiny-q8_0.gguf --prompts-file prompts.jsonl > out.txt 2> err.txt; rc=$?
if [ "$rc" -eq 1 ] && grep -q "2 of 6 prompts failed" err.txt; then pass "prompts-file exit status"; else failed "prompts-file exit status ($rc)"; cat err.txt; fi
if /usr/bin/python3 - out.txt <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["index"] for l in lines] == [0, 1, 2, 3, 4, 5], lines
assert len(lines[0]["token_ids"]) == 5 and lines[0]["finish_reason"] == "length"
assert len(lines[1]["choices"]) == 2 and all(len(c["token_ids"]) == 4 for c in lines[1]["choices"])
assert "top_p" in lines[2]["error"] and "line 3" in lines[2]["error"], lines[2]
assert "line 4" in lines[3]["error"]
assert len(lines[4]["logprobs"]) == 3 and all(len(t["top"]) == 2 for t in lines[4]["logprobs"])
assert lines[5]["token_ids"] == lines[0]["token_ids"] and lines[5]["text"] == lines[0]["text"]
PY
then pass "prompts-file JSON lines"; else failed "prompts-file JSON lines"; cat out.txt; fi

# bench throughput: offline throughput over concurrent requests
expect_ok "bench throughput" "$duet" bench throughput --model tiny-q4_0.gguf --num-prompts 8 --input-len 16 --output-len 8 --max-num-seqs 4
contains "bench throughput line" "^Throughput: [0-9.]+ requests/s, [0-9.]+ total tokens/s, [0-9.]+ output tokens/s$" out.txt
contains "bench throughput details" "^Requests: 8 \(16 input \+ 8 output tokens each\).*max 4 sequences at once" out.txt

# bench: a llama-bench style table, one row per test
expect_ok "bench" "$duet" bench --model tiny-q8_0.gguf -p 16,32 -n 8 -r 2
contains "bench pp row" "^\| llama \| .* \| pp16 \| [0-9.]+ ± [0-9.]+ \|$" out.txt
contains "bench tg row" "^\| llama \| .* \| tg8 \| [0-9.]+ ± [0-9.]+ \|$" out.txt
if [ "$(grep -c '^| llama' out.txt)" -eq 3 ]; then pass "bench rows"; else failed "bench rows"; fi
expect_fail "bench bad repetitions" "-r is 0" "$duet" bench --model tiny-q8_0.gguf -r 0

# bad files: clear errors, never a crash
expect_fail "missing file" "cannot open 'nope.gguf'" "$duet" inspect nope.gguf
head -c 1000 tiny-f32.gguf > truncated.gguf
expect_fail "truncated file" "truncated.gguf.*offset" "$duet" inspect truncated.gguf
head -c $(( $(stat -c %s tiny-f32.gguf) - 4096 )) tiny-f32.gguf > cut.gguf
expect_fail "file cut in the tensor data" "extends past the end of the file" "$duet" generate --model cut.gguf --prompt x
echo "not a model" > text.gguf
expect_fail "not a gguf" "not a GGUF file" "$duet" inspect text.gguf

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
