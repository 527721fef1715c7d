# The checks of request_options_test.sh against a running `duet serve` of the coder model:
#   request_options_check.py options PORT       return_token_ids, allowed_token_ids, bad_words,
#                                               continue_final_message, best_of, score and rerank
#   request_options_check.py logprobs PORT DUET  prompt_logprobs and echo with logprobs against
#                                               `duet logits` over the whole vocabulary
#   request_options_check.py whole PORT DUET     with --max-logprobs -1: logprobs -1 and
#                                               prompt_logprobs -1 give the whole vocabulary;
#                                               /tokenize's chat_template_kwargs, return_token_strs
# Prints ok:/FAIL: lines; exits 1 when a check failed.
import json
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np

port = ""
failures = 0


def check(ok, name, detail=""):
    global failures
    print(f"ok: {name}" if ok else f"FAIL: {name} {detail}")
    failures += 0 if ok else 1


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



def options():
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
    # best_of: the n of best_of candidates (drawn as n = best_of draws them) with the highest
    # logprob per token, as their logprobs show.
    draw = {"model": "coder", "prompt": prompt, "temperature": 1.2, "seed": 7, "max_tokens": 6, "ignore_eos": True}
    st, every = post("/v1/completions", {**draw, "n": 5, "logprobs": 0})
    means = sorted((-sum(c["logprobs"]["token_logprobs"]) / len(c["logprobs"]["token_logprobs"]), c["index"], c["text"])
                   for c in every.get("choices", []))
    st2, best = post("/v1/completions", {**draw, "n": 2, "best_of": 5})
    got = [c["text"] for c in sorted(best.get("choices", []), key=lambda c: c["index"])]
    check(st == 200 and st2 == 200 and got == [m[2] for m in means[:2]] and len(set(m[2] for m in means)) == 5 and
          best["usage"]["completion_tokens"] == 12,
          f"best_of 5, n 2: candidates {[m[1] for m in means[:2]]} of 5, the highest logprob per token",
          f"{st} {st2} {got} {means} {json.dumps(best)[:300]}")
    for bad, why in (({"n": 2, "best_of": 1}, "best_of"), ({"best_of": 3, "stream": True}, "best_of")):
        st, err = post("/v1/completions", {**draw, **bad})
        check(st == 400 and err["error"]["param"] == why, f"{bad}: 400 naming {why}", f"{st} {err}")

    # score and rerank: the cosines of the embeddings /v1/embeddings gives.
    docs = ["def sort(items): return sorted(items)", "the weather is nice today", "sort a list", "import numpy as np"]
    vecs = [d["embedding"] for d in post("/v1/embeddings", {"model": "coder", "input": ["sort a list"] + docs})[1]["data"]]
    cos = [sum(a * b for a, b in zip(vecs[0], v)) for v in vecs[1:]]
    st, sc = post("/v1/score", {"model": "coder", "text_1": "sort a list", "text_2": docs})
    check(st == 200 and [d["index"] for d in sc["data"]] == [0, 1, 2, 3] and
          all(abs(d["score"] - c) < 1e-5 for d, c in zip(sc["data"], cos)) and abs(cos[2] - 1) < 1e-5,
          "score: one text against each, the cosines of /v1/embeddings' vectors", f"{st} {sc} {cos}")
    st, pw = post("/score", {"model": "coder", "text_1": ["sort a list", docs[1]], "text_2": [docs[0], docs[1]]})
    check(st == 200 and abs(pw["data"][0]["score"] - cos[0]) < 1e-5 and abs(pw["data"][1]["score"] - 1) < 1e-5,
          "score: two lists pair by pair", f"{st} {pw}")
    order = sorted(range(4), key=lambda i: -cos[i])
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        st, rr = post(path, {"model": "coder", "query": "sort a list", "documents": docs, "top_n": 3})
        check(st == 200 and [x["index"] for x in rr["results"]] == order[:3] and
              all(x["document"]["text"] == docs[x["index"]] and abs(x["relevance_score"] - cos[x["index"]]) < 1e-5 for x in rr["results"]),
              f"{path}: the documents best first, top_n 3", f"{st} {rr}")
    for path, body, param in (("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
                              ("/v1/score", {"text_1": "a"}, "text_2"),
                              ("/v1/rerank", {"query": "a", "documents": []}, "documents"),
                              ("/v1/rerank", {"documents": ["a"]}, "query"),
                              ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n")):
        st, e = post(path, {"model": "coder", **body})
        check(st == 400 and e["error"]["param"] == param, f"{path} {body}: 400 naming {param}", f"{st} {e}")


def log_softmax(duet, ids):
    out = subprocess.run([duet, "logits", "-m", "coder.gguf", "--tokens", " ".join(map(str, ids)), "--all-positions",
                          "--top", "32256", "-t", "1"], capture_output=True, text=True, check=True).stdout
    logits = np.zeros((len(ids), 32256))
    for line in out.splitlines():
        row = json.loads(line)
        for t, v in row["top"]:
            logits[row["pos"], t] = v
    lsm = logits - logits.max(axis=1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    return lsm


def logprobs(duet):
    prompt = "def quicksort(items):\n    if len(items) <= 1:\n        return items\n    pivot = items[0]\n"
    ids = post("/tokenize", {"model": "coder", "prompt": prompt})[1]["tokens"]
    lsm = log_softmax(duet, ids)
    # A normal request first, so that the prompt is in the prefix cache.
    post("/v1/completions", {"model": "coder", "prompt": prompt, "max_tokens": 1})
    st, r = post("/v1/completions", {"model": "coder", "prompt": prompt, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 3})
    pl = r["choices"][0]["prompt_logprobs"] if st == 200 else []
    worst, ranks_ok, tops_ok = 0.0, True, True
    for i in range(1, len(ids)):
        e = pl[i][str(ids[i])]
        ref = lsm[i - 1]
        worst = max(worst, abs(e["logprob"] - ref[ids[i]]))
        ranks_ok = ranks_ok and e["rank"] == int((ref > ref[ids[i]]).sum()) + 1
        want_top = list(np.argsort(-ref, kind="stable")[:3])
        got_top = sorted((v["rank"], int(t)) for t, v in pl[i].items() if v["rank"] <= 3)
        tops_ok = tops_ok and [t for _, t in got_top][:3] == [int(t) for t in want_top]
    check(st == 200 and pl[0] is None and len(pl) == len(ids) and worst < 2e-3 and ranks_ok and tops_ok,
          f"prompt_logprobs of {len(ids)} tokens in chunks of 16: within {worst:.1e} of the log-softmax of duet logits, ranks and top 3 the same",
          f"{st} {worst} {ranks_ok} {tops_ok} {json.dumps(r)[:300]}")
    check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "a prompt_logprobs request computes the cached prompt again",
          json.dumps(r["usage"]))
    # echo + logprobs: the prompt's tokens first (lm-evaluation-harness's loglikelihood request).
    st, e = post("/v1/completions", {"model": "coder", "prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1})
    lp = e["choices"][0]["logprobs"]
    check(st == 200 and lp["token_logprobs"][0] is None and len(lp["tokens"]) == len(ids) + 1 and
          all(abs(lp["token_logprobs"][i] - lsm[i - 1][ids[i]]) < 2e-3 for i in range(1, len(ids))) and
          e["choices"][0]["text"].startswith(prompt) and lp["text_offset"][len(ids)] == len(prompt),
          "echo with logprobs: the prompt's tokens and logprobs, then the output's", json.dumps(e)[:400])
    # As lm-evaluation-harness sends its loglikelihood requests: token id prompts in one request.
    short = ids[:9]
    st, lm = post("/v1/completions", {"model": "coder", "prompt": [ids, short], "max_tokens": 1, "temperature": 0, "logprobs": 1,
                                      "echo": True, "seed": 1234})
    ok = st == 200 and len(lm["choices"]) == 2
    for ch, p in zip(sorted(lm.get("choices", []), key=lambda c: c["index"]), (ids, short)):
        l = ch["logprobs"]
        ok = ok and len(l["token_logprobs"]) == len(p) + 1 and l["token_logprobs"][0] is None and l["top_logprobs"][0] is None
        ok = ok and all(abs(l["token_logprobs"][i] - lsm[i - 1][p[i]]) < 2e-3 for i in range(1, len(p)))
        # lm-evaluation-harness's greedy check: the token's logprob against the best of top_logprobs.
        ok = ok and all((abs(l["token_logprobs"][i] - max(l["top_logprobs"][i].values())) < 1e-6) == (int(np.argmax(lsm[i - 1])) == p[i])
                        for i in range(1, len(p)))
    check(ok, "echo with logprobs over token id prompts in one request, as lm-evaluation-harness scores", json.dumps(lm)[:300])
    chunks = stream("/v1/completions", {"model": "coder", "prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1})
    first = chunks[0]["choices"][0]["logprobs"]
    check(first["token_logprobs"][:len(ids)] == lp["token_logprobs"][:len(ids)] and first["tokens"][:len(ids)] == lp["tokens"][:len(ids)],
          "echo with logprobs streamed: the first chunk carries the prompt's")
    # Chat: at the top, and in a stream's first chunk.
    messages = [{"role": "user", "content": "Sort a list"}]
    st, c = post("/v1/chat/completions", {"model": "coder", "messages": messages, "max_tokens": 3, "prompt_logprobs": 0})
    chat_ids = post("/tokenize", {"model": "coder", "messages": messages})[1]["tokens"]
    cl = c.get("prompt_logprobs") or []
    check(st == 200 and len(cl) == len(chat_ids) and cl[0] is None and all(list(x) == [str(chat_ids[i])] for i, x in enumerate(cl) if i),
          "chat: prompt_logprobs at the top, the prompt's tokens only with 0", json.dumps(c)[:300])
    chunks = stream("/v1/chat/completions", {"model": "coder", "messages": messages, "max_tokens": 3, "prompt_logprobs": 0})
    check(chunks[0].get("prompt_logprobs") == cl, "chat stream: prompt_logprobs in the first chunk")
    for bad in (21, -1, "x"):
        st, err = post("/v1/completions", {"model": "coder", "prompt": prompt, "prompt_logprobs": bad})
        check(st == 400 and err["error"]["param"] == "prompt_logprobs", f"prompt_logprobs {bad!r}: 400", f"{st} {err}")


def whole(duet):
    prompt = "def f(x):"
    ids = post("/tokenize", {"model": "coder", "prompt": prompt})[1]["tokens"]
    lsm = log_softmax(duet, ids)
    st, r = post("/v1/completions", {"model": "coder", "prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": -1,
                                     "prompt_logprobs": -1, "return_tokens_as_token_ids": True})
    ch = r["choices"][0] if st == 200 else {}
    first = ch.get("logprobs", {}).get("top_logprobs", [{}])[0]
    got = {int(k.split(":")[1]): v for k, v in first.items()}
    worst = max((abs(v - lsm[len(ids) - 1][t]) for t, v in got.items()), default=1.0)
    check(st == 200 and len(got) == 32256 and worst < 2e-3 and abs(sum(np.exp(list(got.values()))) - 1) < 1e-3 and
          len(ch["logprobs"]["top_logprobs"]) == 2,
          f"logprobs -1: all {len(got)} tokens of the vocabulary per output token, within {worst:.1e} of duet logits",
          f"{st} {json.dumps(r)[:300]}")
    pl = ch.get("prompt_logprobs") or [None]
    ok = len(pl) == len(ids) and pl[0] is None
    for i in range(1, len(pl)):
        ranks = sorted(v["rank"] for v in pl[i].values())
        ok = ok and len(pl[i]) == 32256 and ranks[0] == 1 and ranks[-1] == 32256
        ok = ok and all(abs(v["logprob"] - lsm[i - 1][int(t)]) < 2e-3 for t, v in pl[i].items())
    check(ok, f"prompt_logprobs -1: the whole vocabulary at each of {len(ids)} prompt tokens, ranks 1 to 32256")
    st, c = post("/v1/chat/completions", {"model": "coder", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                          "logprobs": True, "top_logprobs": 25})
    top = c["choices"][0]["logprobs"]["content"][0]["top_logprobs"] if st == 200 else []
    check(len(top) == 25, "top_logprobs 25, past OpenAI's 20, under --max-logprobs -1", f"{st} {json.dumps(c)[:300]}")
    # /tokenize renders chat_template_kwargs as chat does (V3.1's thinking).
    messages = [{"role": "user", "content": "Sort a list"}]
    rendered = {}
    for thinking in (True, False):
        kw = {"thinking": thinking}
        rendered[thinking] = post("/tokenize", {"model": "coder", "messages": messages, "chat_template_kwargs": kw})[1]["tokens"]
        st, c = post("/v1/chat/completions", {"model": "coder", "messages": messages, "max_tokens": 1,
                                              "chat_template_kwargs": kw, "return_token_ids": True})
        check(st == 200 and c.get("prompt_token_ids") == rendered[thinking],
              f"/tokenize with chat_template_kwargs thinking {thinking}: chat's prompt ids", f"{st} {json.dumps(c)[:200]}")
    check(rendered[True] != rendered[False], "thinking true and false render differently")
    # return_token_strs: the byte-level vocabulary entries, which GPT-2's byte map turns back into the text.
    text = "def f(x):\n    return x  # naïve"
    st, t = post("/tokenize", {"model": "coder", "prompt": text, "add_special_tokens": False, "return_token_strs": True})
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    to_char = {b: chr(b) for b in printable}
    to_char.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in printable)})
    to_byte = {c: b for b, c in to_char.items()}
    strs = t.get("token_strs", [])
    back = bytes(to_byte[c] for s in strs for c in s).decode("utf-8", "replace")
    check(st == 200 and len(strs) == len(t["tokens"]) and back == text, "return_token_strs: the vocabulary's entries, the text byte for byte",
          f"{st} {strs} {back!r}")
    st, t = post("/tokenize", {"model": "coder", "prompt": text})
    check("token_strs" not in t, "no token_strs unless asked")
    for bad in (32257, -2):
        st, err = post("/v1/completions", {"model": "coder", "prompt": prompt, "logprobs": bad})
        check(st == 400 and err["error"]["param"] == "logprobs" and "-1 (the whole vocabulary)" in err["error"]["message"],
              f"logprobs {bad}: 400", f"{st} {err}")


if __name__ == "__main__":
    port = sys.argv[2]
    if sys.argv[1] == "options":
        options()
    elif sys.argv[1] == "whole":
        whole(sys.argv[3])
    else:
        logprobs(sys.argv[3])
    print(f"{failures} check(s) failed")
    sys.exit(1 if failures else 0)
