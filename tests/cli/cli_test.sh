#!/usr/bin/env bash
# Runs the real `duet` binary the way a user would and checks what it prints.
# usage: cli_test.sh DUET_BINARY WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start_test "$@"

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
# --outlier-channels: channels 0, 32, 64, 96 of the attn/ffn norms x 16, nothing else changes
expect_ok "make-model outliers" "$duet" make-model --preset tiny --type f32 --seed 3 --outlier-channels 4 --outlier-scale 16 -o outliers.gguf
if /usr/bin/python3 - "$here" tiny-f32.gguf outliers.gguf <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1] + "/../reference")
from gguf_reader import GGUFFile
plain, out = GGUFFile(sys.argv[2]), GGUFFile(sys.argv[3])
for name in plain.tensors:
    a, b = plain.tensor(name), out.tensor(name)
    if name.endswith(("attn_norm.weight", "ffn_norm.weight")):
        want = a.copy()
        want[[0, 32, 64, 96]] *= 16
        assert np.array_equal(b, want), name
    else:
        assert np.array_equal(a, b), name
PY
then pass "make-model outliers scale 4 norm channels"; else failed "make-model outliers scale 4 norm channels"; fi
expect_fail "make-model outliers on deepseek2" "--outlier-channels applies to llama, qwen2 and qwen3" \
  "$duet" make-model --preset deepseek2-tiny-v2 --outlier-channels 4 -o x.gguf
# DeepSeek-V3.2's indexer options: only on deepseek32 presets, and a size it can rope
expect_fail "make-model indexer on deepseek2" "the indexer options apply to deepseek32 presets" \
  "$duet" make-model --preset deepseek2-tiny-v3 --index-topk 8 -o x.gguf
expect_fail "make-model indexer narrower than rope" "a head size of at least the 8 rotated dimensions \(have 4\)" \
  "$duet" make-model --preset deepseek32-tiny --index-head-dim 4 -o x.gguf
expect_ok "make-model indexer" "$duet" make-model --preset deepseek32-tiny --index-heads 2 --index-head-dim 64 \
  --index-topk 3 -o ds32.gguf
"$duet" inspect ds32.gguf > inspect.txt 2>&1
for kv in "deepseek32.attention.indexer.head_count = 2" "deepseek32.attention.indexer.key_length = 64" \
          "deepseek32.attention.indexer.top_k = 3" "blk.2.indexer.attn_q_b.weight"; do
  contains "make-model indexer: $kv" "$kv" inspect.txt
done
# DUET_INDEXER: f32 or fp8; fp8's Hadamard rotation needs a power-of-two head size.
expect_ok "indexer fp8" env DUET_INDEXER=fp8 "$duet" logits --model ds32.gguf --tokens "1 2 3 4 5" --top 1
expect_fail "indexer bad mode" "DUET_INDEXER is 'fp16', expected f32 or fp8" \
  env DUET_INDEXER=fp16 "$duet" logits --model ds32.gguf --tokens "1 2" --top 1
expect_ok "make-model indexer 24" "$duet" make-model --preset deepseek32-tiny --index-head-dim 24 -o ds32-24.gguf
expect_fail "indexer fp8 head size" "needs deepseek32.attention.indexer.key_length \(24\) to be a power of two" \
  env DUET_INDEXER=fp8 "$duet" logits --model ds32-24.gguf --tokens "1 2" --top 1

# make-model --format hf: a Hugging Face folder of the same model. deepseek2 in f32 gives the
# GGUF's logits character for character (tests/reference compares every architecture and type).
expect_ok "make-model hf gguf" "$duet" make-model --preset deepseek2-tiny-v3 --type f32 --seed 5 -o ds.gguf
expect_ok "make-model hf" "$duet" make-model --preset deepseek2-tiny-v3 --format hf --type f32 --seed 5 \
  --shard-size 500KB -o ds-hf
contains "make-model hf reports the shards" "wrote ds-hf/: config.json, generation_config.json, [0-9]+ safetensors shards" err.txt
for f in config.json generation_config.json model.safetensors.index.json model-00001-of-00005.safetensors \
         tokenizer.json tokenizer_config.json; do
  if [ -f "ds-hf/$f" ]; then pass "make-model hf wrote $f"; else failed "make-model hf wrote $f"; ls ds-hf; fi
done
if [ ! -e ds-hf/.make-model.gguf ]; then pass "make-model hf removed its GGUF"; else failed "make-model hf removed its GGUF"; fi
contains "make-model hf config" '"architectures": \[' ds-hf/config.json
contains "make-model hf chat template" '"chat_template": ' ds-hf/tokenizer_config.json
"$duet" logits --model ds.gguf --tokens "1 2 3 400 5" --top 4 --all-positions > ds-gguf.txt 2>&1
"$duet" logits --model ds-hf --tokens "1 2 3 400 5" --top 4 --all-positions > ds-hf.txt 2>&1
if [ -s ds-gguf.txt ] && cmp -s ds-gguf.txt ds-hf.txt; then pass "make-model hf = gguf logits"; else
  failed "make-model hf = gguf logits"; head -3 ds-gguf.txt ds-hf.txt; fi
for flags in "" "--add-special" "--parse-special"; do
  "$duet" tokenize --model ds.gguf $flags "Hello world! 3.14 中文 <｜begin▁of▁sentence｜>x" > tok-gguf.txt 2>&1
  "$duet" tokenize --model ds-hf $flags "Hello world! 3.14 中文 <｜begin▁of▁sentence｜>x" > tok-hf.txt 2>&1
  if [ -s tok-gguf.txt ] && cmp -s tok-gguf.txt tok-hf.txt; then pass "make-model hf = gguf tokens $flags"; else
    failed "make-model hf = gguf tokens $flags"; cat tok-gguf.txt tok-hf.txt; fi
done
expect_ok "make-model hf fp8" "$duet" make-model --preset deepseek2-tiny-v3 --format hf --type fp8 -o ds-fp8
contains "make-model hf fp8 config" '"quant_method": "fp8"' ds-fp8/config.json
expect_ok "make-model hf fp8 loads" "$duet" logits --model ds-fp8 --tokens "1 2 3" --top 2
expect_fail "make-model hf bad type" "unknown --type 'q8_0' for --format hf" \
  "$duet" make-model --format hf --type q8_0 -o x-hf
expect_fail "make-model hf awq group" "cannot be AWQ int4 with group 128" \
  "$duet" make-model --preset deepseek2-tiny-v2 --format hf --type awq -o x-hf
expect_fail "make-model hf split mla" "split-mla is a GGUF layout" \
  "$duet" make-model --preset deepseek2-tiny-v2 --format hf --split-mla -o x-hf
expect_fail "make-model bad format" "unknown --format 'onnx'" "$duet" make-model --format onnx -o x

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
# The KV cache type: f32 on request, the engine logs which; another value is refused.
expect_ok "generate f32 cache" "$duet" --log-level info generate --model tiny-q4_0.gguf --prompt "def main():" --max-tokens 4 --temperature 0 --ignore-eos --kv-cache-dtype f32
contains "generate f32 cache logged" "KV blocks of 16 tokens .*f32" err.txt
expect_ok "generate f16 cache" "$duet" --log-level info generate --model tiny-q4_0.gguf --prompt "def main():" --max-tokens 4 --temperature 0 --ignore-eos
contains "generate f16 cache is the default" "KV blocks of 16 tokens .*f16" err.txt
expect_ok "generate q8_0 cache" "$duet" --log-level info generate --model tiny-q4_0.gguf --prompt "def main():" --max-tokens 4 --temperature 0 --ignore-eos --kv-cache-dtype q8_0
contains "generate q8_0 cache logged" "KV blocks of 16 tokens .*q8_0" err.txt
# fp8: a V3-shaped latent of whole blocks (512 + 64) is served; the tiny llama's heads of 32, two
# to a row, are refused before anything runs, naming them.
expect_ok "make-model latent 512" "$duet" make-model --preset deepseek2-tiny-v3 --type f32 --seed 5 --kv-lora-rank 512 -o ds-kv512.gguf
expect_ok "generate fp8 cache" "$duet" --log-level info generate --model ds-kv512.gguf --prompt "def main():" --max-tokens 4 --temperature 0 --ignore-eos --kv-cache-dtype fp8
contains "generate fp8 cache logged" "KV blocks of 16 tokens .*fp8" err.txt
expect_fail "generate fp8 cache refused" "an fp8 KV cache holds heads in whole blocks of 128 values, or one head a row; this model's are 32 \(key\) and 32 \(value\)" "$duet" generate --model tiny-f32.gguf --prompt "x" --kv-cache-dtype fp8
expect_ok "generate numa distribute" "$duet" generate --model tiny-q4_0.gguf --prompt "def main():" --max-tokens 4 --temperature 0 --ignore-eos --numa distribute
expect_fail "generate bad numa" "--numa is 'sideways'" "$duet" generate --model tiny-f32.gguf --prompt "x" --numa sideways
expect_fail "generate bad cache type" "KV cache type is 'q8', expected f16, q8_0, fp8 or f32" "$duet" generate --model tiny-f32.gguf --prompt "x" --kv-cache-dtype q8

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
# bench -o jsonl: one JSON object per test with llama-bench's field names
expect_ok "bench jsonl" "$duet" bench --model tiny-q8_0.gguf -p 16 -n 8 -r 2 -o jsonl
if /usr/bin/python3 - out.txt <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [(r["test"], r["n_prompt"], r["n_gen"]) for r in rows] == [("pp16", 16, 0), ("tg8", 0, 8)], rows
for r in rows:
    assert r["avg_ts"] > 0 and r["stddev_ts"] >= 0 and len(r["samples_ts"]) == 2, r
    assert r["n_threads"] >= 1 and r["model_type"] == "llama", r
    assert r["type_k"] == r["type_v"] == "f16", r
    assert r["n_depth"] == 0 and r["n_batch"] == 2048, r
PY
then pass "bench jsonl fields"; else failed "bench jsonl fields: $(head -c 300 out.txt)"; fi
# bench -d: tests after a context of d tokens (llama-bench's depth), prompts in forward passes of -b
expect_ok "bench depth" "$duet" bench --model tiny-q8_0.gguf -p 16 -n 8 -d 0,40 -b 8 -r 1 -o jsonl
if /usr/bin/python3 - out.txt <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [(r["test"], r["n_depth"]) for r in rows] == [("pp16", 0), ("tg8", 0), ("pp16 @ d40", 40), ("tg8 @ d40", 40)], rows
assert all(r["avg_ts"] > 0 and r["n_batch"] == 8 for r in rows), rows
PY
then pass "bench depth rows"; else failed "bench depth rows: $(head -c 300 out.txt)"; fi
expect_fail "bench negative depth" "-d is -1" "$duet" bench --model tiny-q8_0.gguf -d -1
# A context past 32-bit positions, or past the memory, is refused by its size (it paged until killed).
expect_fail "bench 2^31-token prompt" "2147483648 tokens is more than a sequence may hold" \
  timeout 60 "$duet" bench --model tiny-q8_0.gguf -p 2147483648 -n 0 -r 1
expect_fail "bench depth past the memory" "a context of 1073741832 tokens takes 512.0 GiB of KV cache, more than" \
  timeout 60 "$duet" bench --model tiny-q8_0.gguf -p 8 -n 0 -d 1073741824 -r 1
expect_fail "bench bad output format" "-o is 'xml'" "$duet" bench --model tiny-q8_0.gguf -o xml
# bench bandwidth: memory read GB/s and a model's decode roofline
expect_ok "bench bandwidth" "$duet" bench bandwidth -t 2 --size-mib 64 -r 2 --model tiny-q4_0.gguf
contains "bandwidth line" "^Memory read: [0-9.]+ GB/s median, [0-9.]+ GB/s best \(2 threads, 64.00 MiB buffer, 2 runs\)$" out.txt
contains "roofline line" "^Weights read per token: .*; decode roofline: [0-9.]+ tokens/s at the median bandwidth$" out.txt
expect_fail "bench bandwidth small buffer" "--size-mib is 1" "$duet" bench bandwidth --size-mib 1
# A MoE file's roofline counts the routed experts a token picks, not all of them, and no MTP layer.
expect_ok "make-model moe mtp" "$duet" make-model --preset deepseek2-tiny-v3 --type q8_0 --mtp-layers 1 --seed 5 -o moe.gguf
expect_ok "bench bandwidth moe" "$duet" bench bandwidth -t 2 --size-mib 64 -r 1 --model moe.gguf
if /usr/bin/python3 - "$here" moe.gguf out.txt <<'PY'
import re, sys
sys.path.insert(0, sys.argv[1] + "/../reference")
from gguf_reader import GGUFFile
f = GGUFFile(sys.argv[2])
arch = f.require("general.architecture")
layers, used, experts = (f.require(f"{arch}.{k}") for k in ("block_count", "expert_used_count", "expert_count"))
assert 0 < used < experts and f.get(f"{arch}.nextn_predict_layers", 0) == 1
want, mtp = 0.0, 0
for name, t in f.tensors.items():
    if name == "token_embd.weight":
        continue  # one row a token (the file has its own output matrix)
    if name.startswith("blk."):
        if int(name.split(".")[1]) >= layers:
            mtp += 1
            continue
        if "_exps." in name:
            want += t.n_bytes() * used / experts
            continue
    want += t.n_bytes()
assert mtp > 0 and "output.weight" in f.tensors
line = open(sys.argv[3]).read()
m = re.search(r"^Weights read per token: .* \((\d+) bytes, (\d+) of (\d+) routed experts\)", line, re.M)
assert m, line
assert abs(int(m.group(1)) - want) <= 1 and (int(m.group(2)), int(m.group(3))) == (used, experts), (m.groups(), want)
PY
then pass "bench bandwidth moe bytes"; else failed "bench bandwidth moe bytes: $(tail -1 out.txt)"; fi

# bad files: clear errors, never a crash
expect_fail "missing file" "cannot open 'nope.gguf'" "$duet" inspect nope.gguf
head -c 1000 tiny-f32.gguf > truncated.gguf
expect_fail "truncated file" "truncated.gguf.*offset" "$duet" inspect truncated.gguf
head -c $(( $(stat -c %s tiny-f32.gguf) - 4096 )) tiny-f32.gguf > cut.gguf
expect_fail "file cut in the tensor data" "extends past the end of the file" "$duet" generate --model cut.gguf --prompt x
echo "not a model" > text.gguf
expect_fail "not a gguf" "not a GGUF file" "$duet" inspect text.gguf

# render-chat: a conversation through a chat template, printed without a trailing newline
cat > chat.json <<'JSON'
[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
JSON
cat > chat.jinja <<'JINJA'
{{ bos_token }}{% for m in messages %}
[{{ m.role }}] {{ m.content }}
{% endfor %}
{% if add_generation_prompt %}[assistant]{% if thinking %} <think>{% endif %}{% endif %}
JINJA
expect_ok "render-chat template" "$duet" render-chat --template chat.jinja --messages chat.json --var 'bos_token=<s>'
printf '<s>[system] Be brief.\n[user] Hi\n[assistant]' > want.txt
if cmp -s out.txt want.txt; then pass "render-chat output"; else failed "render-chat output"; cat out.txt; fi
expect_ok "render-chat variables" "$duet" render-chat --template chat.jinja --messages chat.json --var thinking=true
printf '[system] Be brief.\n[user] Hi\n[assistant] <think>' > want.txt
if cmp -s out.txt want.txt; then pass "render-chat --var JSON"; else failed "render-chat --var JSON"; cat out.txt; fi
expect_ok "render-chat no generation prompt" "$duet" render-chat --template chat.jinja --messages chat.json --no-generation-prompt
printf '[system] Be brief.\n[user] Hi\n' > want.txt
if cmp -s out.txt want.txt; then pass "render-chat --no-generation-prompt"; else failed "render-chat --no-generation-prompt"; cat out.txt; fi
echo '{"messages": [{"role": "user", "content": "Q"}], "chat_template_kwargs": {"thinking": true}}' > request.json
expect_ok "render-chat request body" "$duet" render-chat --template chat.jinja --messages request.json
printf '[user] Q\n[assistant] <think>' > want.txt
if cmp -s out.txt want.txt; then pass "render-chat chat_template_kwargs"; else failed "render-chat chat_template_kwargs"; cat out.txt; fi
# The tiny model has no chat template: its deepseek-coder vocabulary gets the built-in
# DeepSeek-Coder instruct format, with the vocabulary's BOS.
echo '[{"role": "user", "content": "Hi"}]' > user.json
expect_ok "render-chat built-in" "$duet" render-chat --model tiny-f32.gguf --messages user.json
printf '<｜begin▁of▁sentence｜>You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, and you only answer questions related to computer science. For politically sensitive questions, security and privacy issues, and other non-computer science questions, you will refuse to answer\n### Instruction:\nHi\n### Response:\n' > want.txt
if cmp -s out.txt want.txt; then pass "render-chat built-in coder format"; else failed "render-chat built-in coder format"; cat out.txt; fi
# A deepseek32 model (no template, as DeepSeek-V3.2 ships) gets V3.2's encoding; thinking on request.
expect_ok "render-chat built-in V3.2" "$duet" render-chat --model ds32.gguf --messages user.json --var thinking=true
printf '<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>' > want.txt
if cmp -s out.txt want.txt; then pass "render-chat built-in V3.2 format"; else failed "render-chat built-in V3.2 format"; cat out.txt; fi
printf '{%% for m in messages %%}\n{{ m.content + 1 }}\n{%% endfor %%}' > bad.jinja
expect_fail "render-chat runtime error" "bad.jinja: error at line 2, column 14: can only concatenate str" "$duet" render-chat --template bad.jinja --messages user.json
printf 'ok\n{%% if %%}' > bad.jinja
expect_fail "render-chat syntax error" "bad.jinja: syntax error at line 2, column 7" "$duet" render-chat --template bad.jinja --messages user.json
printf "{{ raise_exception('Only user and assistant roles are supported!') }}" > raise.jinja
expect_fail "render-chat raise_exception" "raise.jinja raised an error at line 1, column 4: Only user and assistant roles are supported!" "$duet" render-chat --template raise.jinja --messages user.json
expect_fail "render-chat needs a template" "give --model or --template" "$duet" render-chat --messages user.json

# bench serve: streaming requests against a real `duet serve` on the tiny model (port 0, loopback)
expect_fail "bench serve ftp" "must start with http:// or https://" "$duet" bench serve --base-url ftp://127.0.0.1:8000 --model tiny
expect_fail "bench serve refused" "connect: Connection refused" "$duet" bench serve --base-url http://127.0.0.1:1 --model tiny -n 1
if "$duet" serve --help > /dev/null 2>&1; then
  "$duet" serve --model tiny-q4_0.gguf --served-model-name tiny --port 0 --threads 2 --kv-cache-memory 16777216 \
    > serve.out 2> serve.err &
  serve_pid=$!
  for _ in $(seq 1 600); do  # up to 60 s
    if grep -q "^duet: ready" serve.err || ! kill -0 "$serve_pid" 2> /dev/null; then break; fi
    sleep 0.1
  done
  port=$(grep -oE "^duet: listening on http://127.0.0.1:[0-9]+" serve.err | grep -oE "[0-9]+$")
  if [ -n "$port" ] && grep -q "^duet: ready" serve.err; then
    url="http://127.0.0.1:$port"
    expect_ok "bench serve" "$duet" bench serve --base-url "$url" --model tiny --concurrency 4 --num-prompts 8 \
      --input-len 16 --output-len 8 --json bench.json
    contains "bench serve completed" "^Successful requests: +8 *$" out.txt
    contains "bench serve failed" "^Failed requests: +0 *$" out.txt
    contains "bench serve generated" "^Total generated tokens: +64 *$" out.txt
    contains "bench serve TPOT" "^Median TPOT \(ms\): +[0-9.]+" out.txt
    contains "bench serve calibration" "prompts are [0-9]+ words, 1[4-8] tokens for this server" err.txt
    if /usr/bin/python3 - bench.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"] == 8 and r["failed"] == 0 and r["errors"] == [], r
assert r["total_output_tokens"] == 64 and r["output_lens"] == [8] * 8, r["output_lens"]
assert len(set(r["input_lens"])) == 1 and 14 <= r["input_lens"][0] <= 18, r["input_lens"]
assert r["total_input_tokens"] == sum(r["input_lens"])
assert r["max_concurrency"] == 4 and r["request_rate"] == "inf" and r["max_concurrent_requests"] <= 4
assert r["duration"] > 0 and r["request_throughput"] > 0 and r["output_throughput"] > 0
assert abs(r["total_token_throughput"] - (r["total_input_tokens"] + 64) / r["duration"]) < 1e-6 * r["total_token_throughput"]
for m in ("ttft", "tpot", "itl", "e2el"):
    for s in ("mean", "median", "std", "p99"):
        assert r[f"{s}_{m}_ms"] >= 0, (s, m)
    assert r[f"median_{m}_ms"] <= r[f"p99_{m}_ms"] + 1e-9, m
assert 0 < r["mean_ttft_ms"] < r["mean_e2el_ms"]
PY
    then pass "bench serve JSON"; else failed "bench serve JSON"; cat bench.json; fi
    expect_ok "bench serve chat, Poisson arrivals" "$duet" bench serve --base-url "$url" --model tiny \
      --endpoint /v1/chat/completions --concurrency 2 --num-prompts 4 --request-rate 50 --input-len 16 --output-len 4 \
      --percentiles 50,90
    contains "bench serve chat" "^Successful requests: +4 *$" out.txt
    contains "bench serve percentiles" "^P90 ITL \(ms\): +[0-9.]+" out.txt
    expect_ok "bench serve token ids" "$duet" bench serve --base-url "$url" --model tiny --token-ids --vocab-size 512 \
      -c 8 -n 8 --input-len 12 --output-len 4 --json ids.json
    if /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["completed"] == 8 and r["input_lens"] == [12] * 8, r' ids.json
    then pass "bench serve token ids lengths"; else failed "bench serve token ids lengths"; fi
    expect_fail "bench serve unknown model" "calibration request .* failed: HTTP 404" "$duet" bench serve --base-url "$url" --model nope -n 1
  else
    failed "bench serve: duet serve did not print its ready line"; cat serve.err
  fi
  kill -TERM "$serve_pid" 2> /dev/null
  for _ in $(seq 1 100); do kill -0 "$serve_pid" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$serve_pid" 2> /dev/null
  wait "$serve_pid" 2> /dev/null
else
  failed "bench serve: 'duet serve' is not available"
fi

# quantize: an f32 model whose rows fit K-quants (multiples of 256) to every type
expect_ok "quantize: make-model" "$duet" make-model --preset tiny --n-embd 256 --n-ff 512 --n-head 4 --n-head-kv 4 \
  --type f32 --seed 5 -o qz-f32.gguf
for t in q8_0 q4_0 q4_1 q4_k q5_k q6_k q4_k_m; do
  expect_ok "quantize $t" "$duet" quantize qz-f32.gguf qz-$t.gguf --type $t --threads 2
  contains "quantize $t summary" "^wrote qz-$t.gguf \($t, file type [0-9]+\): 21 tensors" err.txt
  expect_ok "quantize $t: inspect" "$duet" inspect qz-$t.gguf
  cp out.txt qz-inspect-$t.txt
  expect_ok "quantize $t: logits" "$duet" logits --model qz-$t.gguf --tokens "1 2 3 4 5" --top 3 --all-positions
  if [ "$(wc -l < out.txt)" -eq 5 ]; then pass "quantize $t: logits lines"; else failed "quantize $t: logits lines"; fi
done
for t in q8_0 q4_0 q4_1 q4_k q5_k q6_k; do
  contains "quantize $t: weights in $t" "blk.1.ffn_down.weight +$t +\[512, 256\]" qz-inspect-$t.txt
  contains "quantize $t: norms stay f32" "blk.1.ffn_norm.weight +f32 +\[256\]" qz-inspect-$t.txt
  contains "quantize $t: output in $t" "^  output.weight +$t " qz-inspect-$t.txt
done
contains "quantize file type q4_k" "general.file_type = 14$" qz-inspect-q4_k.txt
contains "quantize quantization version" "general.quantization_version = 2$" qz-inspect-q4_k.txt
# q4_k_m with 2 layers: use_more_bits picks layer 1 (the last eighth) for attn_v and ffn_down
contains "quantize q4_k_m file type" "general.file_type = 15$" qz-inspect-q4_k_m.txt
contains "quantize q4_k_m output q6_k" "^  output.weight +q6_k " qz-inspect-q4_k_m.txt
contains "quantize q4_k_m embeddings q4_k" "^  token_embd.weight +q4_k " qz-inspect-q4_k_m.txt
contains "quantize q4_k_m attn_v 0" "blk.0.attn_v.weight +q4_k " qz-inspect-q4_k_m.txt
contains "quantize q4_k_m attn_v 1" "blk.1.attn_v.weight +q6_k " qz-inspect-q4_k_m.txt
contains "quantize q4_k_m ffn_down 0" "blk.0.ffn_down.weight +q4_k " qz-inspect-q4_k_m.txt
contains "quantize q4_k_m ffn_down 1" "blk.1.ffn_down.weight +q6_k " qz-inspect-q4_k_m.txt
contains "quantize q4_k_m counts" "^tensor types: 5 f32 .*, 13 q4_k .*, 3 q6_k" qz-inspect-q4_k_m.txt
# the same bytes with one thread; q8_0 from f32 is what make-model writes from the same seed
expect_ok "quantize one thread" "$duet" quantize qz-f32.gguf qz-q4_k_m-1.gguf --type q4_k_m --threads 1
if cmp -s qz-q4_k_m.gguf qz-q4_k_m-1.gguf; then pass "quantize same bytes on 1 and 2 threads"; else failed "quantize same bytes on 1 and 2 threads"; fi
expect_ok "quantize: make-model q8_0" "$duet" make-model --preset tiny --n-embd 256 --n-ff 512 --n-head 4 --n-head-kv 4 \
  --type q8_0 --seed 5 -o qz-made-q8_0.gguf
expect_ok "quantize: logits of made q8_0" "$duet" logits --model qz-made-q8_0.gguf --tokens "1 2 3 4 5" --top 5
cp out.txt qz-made.txt
expect_ok "quantize: logits of quantized q8_0" "$duet" logits --model qz-q8_0.gguf --tokens "1 2 3 4 5" --top 5
if cmp -s qz-made.txt out.txt; then pass "quantize q8_0 = make-model q8_0"; else failed "quantize q8_0 = make-model q8_0"; fi
# requantizing a quantized file goes through dequantization
expect_ok "quantize from q8_0" "$duet" quantize qz-q8_0.gguf qz-q8-q4_k.gguf --type q4_k
contains "quantize from q8_0 summary" "q4_k 16" err.txt
# rows that do not fit 256 fall back to q8_0 (the tiny preset's ffn_down rows are 256, others 128)
expect_ok "quantize fallback" "$duet" quantize tiny-f32.gguf qz-fallback.gguf --type q4_k
contains "quantize fallback note" "fell back to q8_0" err.txt
expect_ok "quantize fallback: inspect" "$duet" inspect qz-fallback.gguf
contains "quantize fallback: q8_0 rows" "blk.0.attn_q.weight +q8_0 " out.txt
contains "quantize fallback: q4_k rows" "blk.0.ffn_down.weight +q4_k " out.txt
contains "quantize file type q4_1" "general.file_type = 3$" qz-inspect-q4_1.txt
expect_fail "quantize bad type" "unknown --type 'q3_x' \(expected q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, q4_k_m or awq4\)" \
  "$duet" quantize qz-f32.gguf x.gguf --type q3_x
mkdir -p not-a-model
expect_fail "quantize folder without config.json" "not-a-model" "$duet" quantize not-a-model x.gguf --type q4_k
expect_fail "quantize missing input" "cannot open 'nope.gguf'" "$duet" quantize nope.gguf x.gguf --type q4_k

# kl-divergence: a model against itself, and fewer bits cost more
expect_ok "kl-divergence with itself" "$duet" kl-divergence qz-f32.gguf qz-f32.gguf --max-tokens 64
contains "kl-divergence of a model with itself" "^mean KL divergence: 0.000000" out.txt
contains "kl-divergence top-1 with itself" "^top-1 agreement: 100.00%" out.txt
contains "kl-divergence token count" "^tokens: 64 \(sequences of up to 128\)" out.txt
expect_ok "kl-divergence q8_0" "$duet" kl-divergence qz-f32.gguf qz-q8_0.gguf --max-tokens 200 --ctx 64 --json
cp out.txt kl-q8_0.json
expect_ok "kl-divergence q4_0" "$duet" kl-divergence qz-f32.gguf qz-q4_0.gguf --max-tokens 200 --ctx 64 --json
cp out.txt kl-q4_0.json
if /usr/bin/python3 - kl-q8_0.json kl-q4_0.json <<'PY'
import json, sys
q8, q4 = (json.load(open(p)) for p in sys.argv[1:3])
assert q8["tokens"] == q4["tokens"] == 200 and q8["ctx"] == 64, (q8, q4)
assert 0 < q8["kl_mean"] < q4["kl_mean"], (q8, q4)
assert q8["top1_agreement"] > q4["top1_agreement"], (q8, q4)
assert q8["kl_median"] <= q8["kl_p99"] <= q8["kl_max"] and q8["ppl_base"] == q4["ppl_base"], q8
PY
then pass "kl-divergence: q8_0 closer than q4_0"; else failed "kl-divergence: q8_0 closer than q4_0"; cat kl-q8_0.json kl-q4_0.json; fi
printf 'text for the comparison\n' > kl.txt
expect_ok "kl-divergence text file" "$duet" kl-divergence qz-f32.gguf qz-q4_0.gguf --text-file kl.txt
expect_fail "kl-divergence missing text" "cannot open text file 'nope.txt'" "$duet" kl-divergence qz-f32.gguf qz-q4_0.gguf --text-file nope.txt
expect_ok "kl-divergence: other vocabulary" "$duet" make-model --preset tiny --vocab-size 384 -o v384.gguf
expect_fail "kl-divergence vocabularies differ" "'v384.gguf' has 384: they cannot be compared" \
  "$duet" kl-divergence qz-f32.gguf v384.gguf

# awq4 on a model with outlier input channels (4 of 256 norm weights x 16): calibration, the scale
# search (no group worse than round-to-nearest), a Q4_1 file that runs, and a lower KL divergence
# from the f32 model than plain round-to-nearest q4_1.
expect_ok "awq: make-model" "$duet" make-model --preset tiny --n-embd 256 --n-ff 512 --n-head 4 --n-head-kv 2 \
  --outlier-channels 4 --outlier-scale 16 --type f32 --seed 8 -o awq-f32.gguf
expect_ok "awq: quantize q4_1" "$duet" quantize awq-f32.gguf awq-rtn.gguf --type q4_1 --threads 2
expect_ok "awq: quantize awq4" "$duet" quantize awq-f32.gguf awq-awq4.gguf --type awq4 --threads 2 --verbose
cp err.txt awq-report.txt
contains "awq: summary" "^wrote awq-awq4.gguf \(awq4: q4_1, file type 3\): 21 tensors \(f32 5, q4_1 16\)" awq-report.txt
contains "awq: calibration" "^AWQ: 512 calibration tokens, 8 groups searched over 20 alphas" awq-report.txt
contains "awq: per-group report" "^blk.1.ffn_down: alpha [0-9.]+, output error" awq-report.txt
if /usr/bin/python3 - awq-report.txt <<'PY'
import re, sys
rows = [re.search(r"output error (\S+) \(round-to-nearest (\S+),", l) for l in open(sys.argv[1])]
rows = [(float(m.group(1)), float(m.group(2))) for m in rows if m]
assert len(rows) == 8, rows
assert all(e <= r for e, r in rows), rows
# q/k/v and gate/up read the outlier channels: there the search must win by far
qkv = [l for l in open(sys.argv[1]) if "attn_qkv:" in l]
assert all(float(re.search(r"x([0-9.]+)\)", l).group(1)) < 0.8 for l in qkv), qkv
PY
then pass "awq: no group worse than round-to-nearest, q/k/v much better"; else failed "awq: per-group errors"; cat awq-report.txt; fi
expect_ok "awq: inspect" "$duet" inspect awq-awq4.gguf
contains "awq: norms absorbed 1/s in f32" "blk.0.attn_norm.weight +f32 +\[256\]" out.txt
contains "awq: weights in q4_1" "blk.0.attn_q.weight +q4_1 +\[256, 256\]" out.txt
expect_ok "awq: generate" "$duet" generate --model awq-awq4.gguf --prompt "def main():" --max-tokens 8 --temperature 0 --ignore-eos
expect_ok "awq: kl-divergence q4_1" "$duet" kl-divergence awq-f32.gguf awq-rtn.gguf --max-tokens 256 --json
cp out.txt kl-rtn.json
expect_ok "awq: kl-divergence awq4" "$duet" kl-divergence awq-f32.gguf awq-awq4.gguf --max-tokens 256 --json
cp out.txt kl-awq.json
if /usr/bin/python3 - kl-rtn.json kl-awq.json <<'PY'
import json, sys
rtn, awq = (json.load(open(p)) for p in sys.argv[1:3])
assert rtn["tokens"] == awq["tokens"] == 256, (rtn, awq)
assert 0 < awq["kl_mean"] < 0.85 * rtn["kl_mean"], (awq["kl_mean"], rtn["kl_mean"])
PY
then pass "awq: lower KL divergence than round-to-nearest q4_1"; else failed "awq: KL"; cat kl-rtn.json kl-awq.json; fi
# --awq-grid 1 tries alpha 0 only: every s is 1, and the file is --type q4_1's, byte for byte
expect_ok "awq: grid 1" "$duet" quantize awq-f32.gguf awq-grid1.gguf --type awq4 --awq-grid 1
if cmp -s awq-grid1.gguf awq-rtn.gguf; then pass "awq: grid 1 = q4_1"; else failed "awq: grid 1 = q4_1"; fi
# The folding keeps the model's function: scaled but unrounded (f32) weights give the same
# next-token distributions (llama with grouped-query attention, and qwen2 whose v bias absorbs 1/s)
expect_ok "awq: qwen2 model" "$duet" make-model --preset qwen2-tiny --outlier-channels 4 --outlier-scale 16 -o awq-qwen2.gguf
for m in awq-f32 awq-qwen2; do
  expect_ok "awq: $m scaled in f32" "$duet" quantize $m.gguf $m-scaled.gguf --type awq4 --awq-weights f32
  contains "awq: $m f32 summary" "^wrote $m-scaled.gguf \(awq4: f32, file type 0\)" err.txt
  expect_ok "awq: $m kl-divergence of the scaled f32" "$duet" kl-divergence $m.gguf $m-scaled.gguf --max-tokens 256 --json
  if /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["kl_mean"] < 1e-8 and r["top1_agreement"] == 1.0, r' out.txt
  then pass "awq: $m folding keeps the function"; else failed "awq: $m folding keeps the function"; cat out.txt; fi
done
printf 'a few words of calibration text, repeated: a few words of calibration text.\n' > calib.txt
expect_ok "awq: --calibration" "$duet" quantize awq-f32.gguf awq-calib.gguf --type awq4 --calibration calib.txt --awq-grid 4
contains "awq: calibration file tokens" "^AWQ: [0-9]+ calibration tokens, 8 groups searched over 4 alphas" err.txt
expect_fail "awq: missing calibration file" "cannot open calibration file 'nope.txt'" \
  "$duet" quantize awq-f32.gguf x.gguf --type awq4 --calibration nope.txt
expect_fail "awq: bad grid" "--awq-grid is 0" "$duet" quantize awq-f32.gguf x.gguf --type awq4 --awq-grid 0
expect_ok "awq: deepseek2 model" "$duet" make-model --preset deepseek2-tiny-v2 --type f32 -o ds.gguf
expect_fail "awq: deepseek2 unsupported" "--type awq4 supports the llama, qwen2 and qwen3 architectures; 'ds.gguf' is 'deepseek2'" \
  "$duet" quantize ds.gguf x.gguf --type awq4
expect_fail "quantize missing input" "cannot open 'nope.gguf'" "$duet" quantize nope.gguf x.gguf --type q4_k

# The MLA prefill's settings are checked when a model loads, before any output, not at the first
# long prompt.
for bad in "DUET_MLA_PREFILL=bogus|DUET_MLA_PREFILL is 'bogus', expected auto or absorbed" \
           "DUET_MLA_EXPAND_MIB=0|DUET_MLA_EXPAND_MIB is '0', expected a number of MiB"; do
  expect_fail "generate refuses ${bad%%|*}" "${bad#*|}" env "${bad%%|*}" "$duet" generate --model ds.gguf --prompt x --max-tokens 1
  if [ -s out.txt ]; then failed "generate printed output with ${bad%%|*}"; fi
done

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
