#!/usr/bin/env bash
# usage: request_options_test.sh DUET_BINARY WORK_DIR SHARED_TESTDATA
# vLLM's request options on a real `duet serve` with DeepSeek-Coder's vocabulary and chat format:
# return_token_ids (completions and chat, streamed or not: the ids are /tokenize's and add up to
# the text), allowed_token_ids (each greedy token is the one a +100 logit_bias on the same ids
# picks, step by step), bad_words (the words' token sequences, as /tokenize gives them, never
# finished in the output, which is the free output up to the first one), continue_final_message
# (the prompt is the rendering cut after the last message's text, /tokenize agrees, and the
# answer is the completion of those ids), best_of (the n of the candidates n = best_of draws with
# the highest logprob per token), prompt_logprobs (each prompt token's logprob and rank
# against the log-softmax of `duet logits --all-positions` over the whole vocabulary, computed in
# chunks of 16 tokens, never from the prefix cache; chat's at the top, streamed in the first
# chunk), echo with logprobs (the prompt's tokens first, as lm-evaluation-harness scores), score
# and rerank (the cosines of /v1/embeddings' vectors, best first), and the refusals; with
# max_logprobs -1 (YAML), logprobs and prompt_logprobs -1 over the whole vocabulary; /tokenize's
# chat_template_kwargs (V3.1's thinking, as chat renders it) and return_token_strs (the byte-level
# vocabulary entries, which decode to the text).
# A CTest skip (77) when the shared vocabulary is absent.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vocab="${3:-}/vocab/ggml-vocab-deepseek-coder.gguf"
if [ ! -f "$vocab" ]; then echo "SKIP: $vocab is absent (the shared test data is not beside this checkout)"; exit 77; fi
source "$here/lib.sh"
start_test "$@"

"$duet" make-model --preset tiny --type q8_0 --seed 9 --vocab "$vocab" -o coder.gguf 2> /dev/null || { echo "make-model failed"; exit 1; }
model_file=coder.gguf
start_server coder --served-model-name coder --chat-template deepseek-coder || exit 1

$py "$here/request_options_check.py" options "$PORT"
rc=$?
kill "$PID"; wait "$PID" 2>/dev/null

# prompt_logprobs against the model's own logits over the whole vocabulary, the prompt computed
# in chunks of 16 tokens.
start_server chunks --served-model-name coder --chat-template deepseek-coder --max-num-batched-tokens 16 || exit 1
$py "$here/request_options_check.py" logprobs "$PORT" "$duet"
rc2=$?
kill "$PID"; wait "$PID" 2>/dev/null

# --max-logprobs -1 (here from YAML): -1 asks for the whole vocabulary. With DeepSeek-V3.1's
# template: /tokenize's chat_template_kwargs and return_token_strs.
printf 'max_logprobs: -1\n' > whole.yaml
start_server whole --served-model-name coder --chat-template "$3/chat-templates/deepseek-v3.1.jinja" --config whole.yaml || exit 1
$py "$here/request_options_check.py" whole "$PORT" "$duet"
rc3=$?
kill "$PID"; wait "$PID" 2>/dev/null
if "$duet" serve --model "$model_file" --port 0 --max-logprobs -2 > bad.out 2> bad.err; then
  echo "FAIL: --max-logprobs -2 started"; rc3=1
elif grep -q -- "--max-logprobs is -2, expected -1" bad.err; then echo "ok: --max-logprobs -2 is refused"
else echo "FAIL: --max-logprobs -2: $(tail -2 bad.err)"; rc3=1; fi
[ "$rc" = 0 ] && [ "$rc2" = 0 ] && [ "$rc3" = 0 ]
