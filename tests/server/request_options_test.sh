#!/usr/bin/env bash
# usage: request_options_test.sh DUET_BINARY WORK_DIR SHARED_TESTDATA
# vLLM's request options on a real `duet serve` with DeepSeek-Coder's vocabulary and chat format:
# return_token_ids (completions and chat, streamed or not: the ids are /tokenize's and add up to
# the text), allowed_token_ids (each greedy token is the one a +100 logit_bias on the same ids
# picks, step by step), bad_words (the words' token sequences, as /tokenize gives them, never
# finished in the output, which is the free output up to the first one), continue_final_message
# (the prompt is the rendering cut after the last message's text, /tokenize agrees, and the
# answer is the completion of those ids), and the refusals.
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

$py - "$PORT" <<'PY'
import json, sys, urllib.error, urllib.request

port = sys.argv[1]
failures = 0


def check(ok, name, detail=""):
    global failures
    if ok:
        print(f"ok: {name}")
    else:
        failures += 1
        print(f"FAIL: {name} {detail}")


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def stream(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def tokens(text, special=True):
    return post("/tokenize", {"model": "coder", "prompt": text, "add_special_tokens": special})[1]["tokens"]


def text_of(ids):
    return post("/detokenize", {"model": "coder", "tokens": ids})[1]["prompt"]


def contains(seq, part):
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


base = {"model": "coder", "temperature": 0, "ignore_eos": True}
prompt = "def fibonacci(n):\n"
prompt_ids = tokens(prompt)

# return_token_ids on completions: two prompts, n = 2.
st, r = post("/v1/completions", {**base, "prompt": [prompt, "import os\n"], "n": 2, "max_tokens": 10, "return_token_ids": True})
ok = st == 200 and len(r["choices"]) == 4
for ch in r.get("choices", []):
    want = prompt_ids if ch["index"] < 2 else tokens("import os\n")
    ok = ok and ch["prompt_token_ids"] == want and len(ch["token_ids"]) == 10 and text_of(ch["token_ids"]) == ch["text"]
check(ok, "return_token_ids: completions' prompt_token_ids are /tokenize's, token_ids make the text", json.dumps(r)[:300])
plain = post("/v1/completions", {**base, "prompt": prompt, "max_tokens": 10})[1]
check("token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0], "no ids unless asked for")
chunks = stream("/v1/completions", {**base, "prompt": prompt, "max_tokens": 10, "return_token_ids": True})
got = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
firsts = [ch["prompt_token_ids"] for c in chunks for ch in c["choices"] if "prompt_token_ids" in ch]
check(got == r["choices"][0]["token_ids"] and firsts == [prompt_ids],
      "return_token_ids: a completion's stream sends the prompt's ids once and every token's", f"{got} {firsts}")

messages = [{"role": "user", "content": "Write a function that adds two numbers"}]
st, c = post("/v1/chat/completions", {**base, "messages": messages, "max_tokens": 8, "return_token_ids": True})
chat_ids = post("/tokenize", {"model": "coder", "messages": messages})[1]["tokens"]
check(st == 200 and c.get("prompt_token_ids") == chat_ids and text_of(c["choices"][0]["token_ids"]) == c["choices"][0]["message"]["content"],
      "return_token_ids: chat's prompt_token_ids are /tokenize's messages, token_ids make the content", json.dumps(c)[:300])
chunks = stream("/v1/chat/completions", {**base, "messages": messages, "max_tokens": 8, "return_token_ids": True})
got = [t for k in chunks for ch in k["choices"] for t in ch.get("token_ids", [])]
check(chunks[0].get("prompt_token_ids") == chat_ids and got == c["choices"][0]["token_ids"],
      "return_token_ids: a chat stream's first chunk has the prompt's ids, its chunks every token's")

# allowed_token_ids: only those, each the most likely of them (a +100 bias on them picks the same).
allowed = tokens(" return a + b * c", False)
st, r = post("/v1/completions", {**base, "prompt": prompt, "max_tokens": 8, "allowed_token_ids": allowed, "return_token_ids": True})
gen = r["choices"][0]["token_ids"] if st == 200 else []
ok = len(gen) == 8 and all(t in allowed for t in gen)
for i in range(len(gen)):
    s = post("/v1/completions", {**base, "prompt": prompt_ids + gen[:i], "max_tokens": 1, "return_token_ids": True,
                                 "logit_bias": {str(a): 100 for a in allowed}})[1]
    ok = ok and s["choices"][0]["token_ids"] == [gen[i]]
check(ok, f"allowed_token_ids: {len(gen)} tokens, each the one a +100 logit_bias on the same ids picks", f"{st} {gen} {allowed}")
for bad, why in (([], "empty"), ([99999999], "out of the vocabulary"), ("5", "not a list")):
    st, e = post("/v1/completions", {**base, "prompt": prompt, "allowed_token_ids": bad})
    check(st == 400 and e["error"]["param"] == "allowed_token_ids", f"allowed_token_ids {why}: 400", f"{st} {e}")

# bad_words: a word the free output has (a whole token of letters) never comes.
free = post("/v1/completions", {**base, "prompt": prompt, "max_tokens": 16, "return_token_ids": True})[1]["choices"][0]["token_ids"]
word = next((text_of([t]).strip() for t in free if text_of([t]).strip().isalpha() and len(text_of([t]).strip()) > 1), None)
if word is None:
    check(False, "bad_words: the free output has no word to ban", text_of(free))
else:
    plain_ids, spaced_ids = tokens(word, False), tokens(" " + word, False)
    sequences = [plain_ids] + ([spaced_ids] if spaced_ids[0] != plain_ids[0] and len(spaced_ids) == len(plain_ids) else [])
    banned = post("/v1/completions", {**base, "prompt": prompt, "max_tokens": 16, "return_token_ids": True,
                                      "bad_words": [word]})[1]["choices"][0]["token_ids"]
    first = min(i for i in range(len(free)) if any(free[max(0, i + 1 - len(s)):i + 1] == s for s in sequences))
    check(not any(contains(banned, s) for s in sequences) and banned[:first + 1 - max(len(s) for s in sequences)] ==
          free[:first + 1 - max(len(s) for s in sequences)] and banned != free,
          f"bad_words [{word!r}]: its sequences {sequences} never finished; the free output until then", f"{free} {banned}")
for bad, why in ("word", "a string"), ([""], "an empty word"), ([3], "a number"):
    st, e = post("/v1/completions", {**base, "prompt": prompt, "bad_words": bad})
    check(st == 400 and e["error"]["param"] == "bad_words", f"bad_words {why}: 400", f"{st} {e}")

# continue_final_message: the assistant's answer begun by the client goes on.
begun = messages + [{"role": "assistant", "content": "Here is the function:"}]
full = post("/tokenize", {"model": "coder", "messages": begun, "add_generation_prompt": False})[1]["tokens"]
cont = post("/tokenize", {"model": "coder", "messages": begun, "continue_final_message": True})[1]["tokens"]
st, c = post("/v1/chat/completions", {**base, "messages": begun, "continue_final_message": True, "max_tokens": 8,
                                      "return_token_ids": True})
same = post("/v1/completions", {**base, "prompt": cont, "max_tokens": 8, "return_token_ids": True})[1]["choices"][0]
check(st == 200 and c["prompt_token_ids"] == cont and len(cont) < len(full) and full[:len(cont)] == cont and
      text_of(cont).endswith("Here is the function:") and c["choices"][0]["token_ids"] == same["token_ids"],
      "continue_final_message: the rendering cut after the last text (/tokenize agrees), continued as a completion",
      f"{st} {text_of(cont)[-60:]!r} {len(cont)} {len(full)}")
st, e = post("/v1/chat/completions", {**base, "messages": begun, "continue_final_message": True, "add_generation_prompt": True})
check(st == 400 and e["error"]["param"] == "continue_final_message", "continue_final_message with add_generation_prompt: 400", f"{st} {e}")
st, e = post("/v1/chat/completions", {**base, "messages": begun[:1] + [{"role": "assistant", "content": ""}],
                                      "continue_final_message": True})
check(st == 400, "continue_final_message on an empty last message: 400", f"{st} {e}")
print(f"{failures} check(s) failed")
sys.exit(1 if failures else 0)
PY
rc=$?
kill "$PID"; wait "$PID" 2>/dev/null
exit $rc
