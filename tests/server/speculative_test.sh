#!/usr/bin/env bash
# usage: speculative_test.sh DUET_BINARY WORK_DIR
# Speculative decoding against a real server with the official openai client: with n-gram drafts
# on llama and deepseek2, and with MTP drafts (DeepSeek-V3's multi-token-prediction layer) on a
# deepseek2 Hugging Face folder that has one, greedy and seeded answers, streamed and not, equal
# those of the same server without drafts; drafts are counted under vLLM's metric names; `duet
# generate` with MTP drafts prints what it prints without; bad settings are refused at start.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"
# Equal answers with and without drafts is batch invariance, which deepseek2 (MLA) models keep
# with their prefill in decode's absorbed form (by default a long prompt chunk may attend in the
# expanded form, another rounding).
export DUET_MLA_PREFILL=absorbed

require_npm openai
"$duet" make-model --preset tiny --type q8_0 --seed 5 -o llama.gguf 2> /dev/null || { echo "make-model llama failed"; exit 1; }
"$duet" make-model --preset deepseek2-tiny-v3 --type q8_0 --seed 5 -o deepseek2.gguf 2> /dev/null \
  || { echo "make-model deepseek2 failed"; exit 1; }
"$duet" make-model --preset deepseek2-tiny-v3 --type bf16 --seed 5 --mtp-layers 1 --format hf -o deepseek2-mtp \
  2> /dev/null || { echo "make-model deepseek2 with an MTP layer failed"; exit 1; }

run_client() {  # run_client NAME OUT
  if DUET_URL="http://127.0.0.1:$PORT/v1" DUET_MODEL="$model_file" DUET_OUT="$2" NODE_PATH="$here/node_modules" \
     node "$here/speculative_client_test.mjs" > "$1.txt" 2>&1; then
    return 0
  fi
  cat "$1.txt"
  return 1
}

# arch model method min_accepted: answers with drafts equal those without, drafts counted (and at
# least min_accepted of them kept: a random MTP layer guesses the model's tokens rarely).
for run in "llama llama.gguf ngram 1" "deepseek2 deepseek2.gguf ngram 1" "deepseek2-mtp deepseek2-mtp mtp 0"; do
  read -r arch model_file method min_accepted <<< "$run"
  start_server "$arch-plain" --chat-template deepseek-v3 || exit 1
  run_client "$arch-plain" "$arch-plain.json" || failed "$arch without drafts"
  kill "$PID"
  if [ "$method" = ngram ]; then
    start_server "$arch-$method" --chat-template deepseek-v3 --speculative-method ngram --num-speculative-tokens 4 \
      --prompt-lookup-min 1 || exit 1
  else
    start_server "$arch-$method" --chat-template deepseek-v3 --speculative-method mtp --num-speculative-tokens 3 || exit 1
  fi
  run_client "$arch-$method" "$arch-$method.json" || failed "$arch with $method drafts"
  curl -s "http://127.0.0.1:$PORT/metrics" > "$arch-metrics.txt"
  kill "$PID"
  if $py - "$arch-plain.json" "$arch-$method.json" "$arch-metrics.txt" "$min_accepted" <<'PY'
import json, sys
from prometheus_client.parser import text_string_to_metric_families
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert len(a) == 16 and a.keys() == b.keys(), (len(a), a.keys() ^ b.keys())
for k in a:
    assert a[k] == b[k], (k, a[k], b[k])
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[3]).read())}
value = lambda n: sum(s.value for s in fams[n].samples)
drafts, tokens, accepted = (value(f"vllm:spec_decode_num_{n}") for n in ("drafts", "draft_tokens", "accepted_tokens"))
per_pos = value("vllm:spec_decode_num_accepted_tokens_per_pos")
print(f"{drafts:.0f} drafts, {tokens:.0f} draft tokens, {accepted:.0f} accepted")
assert drafts > 0 and int(sys.argv[4]) <= accepted <= tokens and per_pos == accepted, (drafts, tokens, accepted, per_pos)
PY
  then pass "$arch: answers with $method drafts equal those without, drafts counted"; else failed "$arch: answers or metrics differ"; fi
done

# duet generate with MTP drafts: the same greedy text, and the acceptance line.
prompt="def add(a, b):
    return a + b

def add(a, b):
    return"
"$duet" generate --model deepseek2-mtp -p "$prompt" -n 40 --temperature 0 --ignore-eos --threads 1 > gen-plain.txt 2> gen-plain.err
if "$duet" generate --model deepseek2-mtp -p "$prompt" -n 40 --temperature 0 --ignore-eos --threads 1 \
     --speculative-method mtp --num-speculative-tokens 3 > gen-mtp.txt 2> gen-mtp.err \
   && [ -s gen-plain.txt ] && cmp -s gen-plain.txt gen-mtp.txt; then
  pass "generate: greedy text with MTP drafts equals the text without"
else
  failed "generate with MTP drafts: $(diff gen-plain.txt gen-mtp.txt | head -5) $(tail -3 gen-mtp.err)"
fi

model_file=llama.gguf
refused() {  # refused NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  if "$duet" serve --model llama.gguf --port 0 "$@" > bad.out 2> bad.err; then
    failed "$name accepted"
  else
    grep -q -- "$pattern" bad.err && pass "$name refused" || failed "$name: $(cat bad.err)"
  fi
}
refused "an unknown method" "expected ngram, mtp or none" --speculative-method eagle
refused "ngram without --num-speculative-tokens" "num_speculative_tokens is 0" --speculative-method ngram
refused "17 drafts" "expected 1 to 16" --speculative-method ngram --num-speculative-tokens 17
refused "a lookup range upside down" "prompt_lookup_min is 3" --speculative-method ngram --num-speculative-tokens 2 \
  --prompt-lookup-min 3 --prompt-lookup-max 2
refused "mtp on llama (no MTP layer)" "no multi-token-prediction layer" --speculative-method mtp --num-speculative-tokens 1
echo "$failures failures"
[ "$failures" -eq 0 ]
