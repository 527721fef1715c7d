# The Redis KV tier's test client: sends every prompt of a set (concurrently) to a duet server
# with greedy sampling and writes {name: text} as JSON; any failed request fails the run.
# usage: redis_client.py PORT SET OUT [CONCURRENCY]  (SET: a, b or all, then :SALT for other prompts)
import http.client
import json
import sys
import threading

port, which, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 4


def prompts(which):
    # Groups of prompts sharing a long prefix (several full KV blocks), each with its own tail.
    which, _, salt = which.partition(":")
    groups = {"a": range(0, 4), "b": range(4, 8), "all": range(0, 8)}[which]
    out = {}
    for g in groups:
        prefix = " ".join(f"topic{g}{salt} word{i}" for i in range(18))
        for s in range(2):
            out[f"g{g}s{s}"] = prefix + " " + " ".join(f"tail{s} item{j}" for j in range(3))
    return out


results, errors = {}, []


def run(items):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for name, prompt in items:
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0})
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                errors.append(f"{name}: HTTP {resp.status} {data[:200]!r}")
                continue
            results[name] = json.loads(data)["choices"][0]["text"]
        except Exception as e:  # a dropped connection is a failed request
            errors.append(f"{name}: {e!r}")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)


items = sorted(prompts(which).items())
threads = [threading.Thread(target=run, args=(items[i::concurrency],)) for i in range(concurrency)]
for t in threads:
    t.start()
for t in threads:
    t.join()
json.dump(results, open(out, "w"), indent=1, sort_keys=True)
if errors:
    print("\n".join(errors))
    sys.exit(1)
