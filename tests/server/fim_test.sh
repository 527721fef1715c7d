#!/usr/bin/env bash
# usage: fim_test.sh DUET_BINARY WORK_DIR SHARED_TESTDATA
# Fill in the middle (/v1/completions with `suffix`) on a model with DeepSeek-Coder's vocabulary
# (../shared/testdata/vocab): the prompt the server builds from prompt and suffix is the one the
# model's own markup gives when written out as text (<｜fim▁begin｜>...<｜fim▁hole｜>...<｜fim▁end｜>,
# parsed by the tokenizer), so both generate the same; and what cannot be filled in is refused.
# A CTest skip (77) when the shared vocabulary is absent.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vocab="${3:-}/vocab/ggml-vocab-deepseek-coder.gguf"
if [ ! -f "$vocab" ]; then echo "SKIP: $vocab is absent (the shared test data is not beside this checkout)"; exit 77; fi
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type q8_0 --seed 9 --vocab "$vocab" -o coder.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
"$duet" make-model --preset tiny --type q8_0 --seed 9 -o plain.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=coder.gguf
start_server coder || exit 1

completion() {  # completion NAME BODY: the response in NAME.json
  request POST /v1/completions "$2"
  cp resp.json "$1.json"
  [ "$STATUS" = 200 ] || failed "$1: $STATUS $(head -c 300 resp.json)"
}
prefix='def add(a, b):\n    '
suffix='\n    return c\n'
completion fim "{\"prompt\": \"$prefix\", \"suffix\": \"$suffix\", \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}"
completion markup "{\"prompt\": \"<｜fim▁begin｜>$prefix<｜fim▁hole｜>$suffix<｜fim▁end｜>\", \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}"
completion empty "{\"prompt\": \"$prefix\", \"suffix\": \"\", \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}"
completion left "{\"prompt\": \"$prefix\", \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}"
request POST /tokenize "{\"prompt\": \"<｜fim▁begin｜>$prefix<｜fim▁hole｜>$suffix<｜fim▁end｜>\"}"
cp resp.json tokens.json
if $py - <<'PY'
import json
fim, markup, empty, left = (json.load(open(f + ".json")) for f in ("fim", "markup", "empty", "left"))
tokens = json.load(open("tokens.json"))["tokens"]
# The markup's ids: BOS, <｜fim▁begin｜> (32016), the prefix, <｜fim▁hole｜> (32015), the suffix, <｜fim▁end｜> (32017).
assert tokens[0] == 32013 and tokens[1] == 32016 and tokens[-1] == 32017 and 32015 in tokens, tokens
assert fim["usage"]["prompt_tokens"] == markup["usage"]["prompt_tokens"] == len(tokens), (fim["usage"], len(tokens))
assert fim["choices"][0]["text"] == markup["choices"][0]["text"], (fim["choices"], markup["choices"])
# An empty suffix is no suffix: a left-to-right completion.
assert empty["choices"][0]["text"] == left["choices"][0]["text"] and empty["usage"]["prompt_tokens"] == left["usage"]["prompt_tokens"], (empty, left)
assert fim["usage"]["prompt_tokens"] > left["usage"]["prompt_tokens"]
PY
then pass "suffix fills in the middle in the model's markers"; else failed "fill in the middle: $(head -c 300 fim.json) / $(head -c 300 markup.json)"; fi

request POST /v1/completions "{\"prompt\": \"$prefix\", \"suffix\": \"$suffix\", \"max_tokens\": 4, \"stream\": true, \"ignore_eos\": true}"
grep -q '"finish_reason":"length"' resp.json && pass "streamed" || failed "streamed: $(head -c 300 resp.json)"
expect_error "echo with suffix" 400 invalid_request_error echo POST /v1/completions \
  "{\"prompt\": \"a\", \"suffix\": \"b\", \"echo\": true}"
expect_error "token ids with suffix" 400 invalid_request_error prompt POST /v1/completions \
  '{"prompt": [1, 2, 3], "suffix": "b"}'
expect_error "a suffix that is not text" 400 invalid_request_error suffix POST /v1/completions \
  '{"prompt": "a", "suffix": 5}'
kill "$PID"

model_file=plain.gguf
start_server plain || exit 1
expect_error "suffix on a model without the markers" 400 invalid_request_error suffix POST /v1/completions \
  '{"prompt": "a", "suffix": "b"}'
kill "$PID"

echo "$failures failures"
[ "$failures" -eq 0 ]
