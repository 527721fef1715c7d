#!/usr/bin/env bash
# `duet make-model --vocab FILE`: synthetic models in the R1 distills' shapes with their exact
# tokenizers (../shared/testdata/vocab). Checks that the model file carries the vocabulary file's
# tokenizer keys unchanged (padded with unused "[PAD<id>]" tokens up to the model's rows, as
# llama.cpp's converter pads), that Llama 3 rope scaling is written as llama.cpp writes it, and
# that test cases of the vocabulary give the expected ids from the model file and from the
# Hugging Face folder of the same model.
# usage: make_model_vocab_test.sh DUET_BINARY WORK_DIR VOCAB_DIR; exits 77 without the vocab files.
set -uo pipefail
duet="$1"
work="$2"
vocab_dir="$3"
here="$(cd "$(dirname "$0")" && pwd)"
for v in qwen2 llama-bpe; do
  if [ ! -f "$vocab_dir/ggml-vocab-$v.gguf" ]; then
    echo "skipped: $vocab_dir/ggml-vocab-$v.gguf does not exist (shared test data not available)"
    exit 77
  fi
done
if ! /usr/bin/python3 -c "import numpy" 2>/dev/null; then echo "skipped: /usr/bin/python3 has no numpy"; exit 77; fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
expect_ok() { local name="$1"; shift; if "$@" > out.txt 2> err.txt; then pass "$name"; else failed "$name (exit $?)"; cat err.txt; fi; }
expect_fail() {
  local name="$1" pattern="$2"; shift 2
  "$@" > out.txt 2> err.txt; local rc=$?
  if [ "$rc" -eq 1 ] && grep -qE -- "$pattern" err.txt; then pass "$name"; else failed "$name (exit $rc)"; cat err.txt; fi
}

# The presets' own vocabulary sizes with small layers (the embedding keeps every row).
small=(--layers 1 --n-embd 64 --n-head 2 --n-head-kv 1 --n-ff 64 --type q8_0 --seed 2)
expect_ok "r1-distill-qwen-1.5b --vocab qwen2" \
  "$duet" make-model --preset r1-distill-qwen-1.5b "${small[@]}" --vocab "$vocab_dir/ggml-vocab-qwen2.gguf" -o qwen-1.5b.gguf
grep -q "vocab 151936 with the tokenizer of" err.txt && pass "qwen-1.5b: 151936 rows" || { failed "qwen-1.5b: 151936 rows"; cat err.txt; }
expect_ok "r1-distill-qwen-7b --vocab qwen2" \
  "$duet" make-model --preset r1-distill-qwen-7b "${small[@]}" --vocab "$vocab_dir/ggml-vocab-qwen2.gguf" -o qwen-7b.gguf
grep -q "vocab 152064 with the tokenizer of" err.txt && pass "qwen-7b: 152064 rows" || { failed "qwen-7b: 152064 rows"; cat err.txt; }
expect_ok "r1-distill-llama-8b --vocab llama-bpe" \
  "$duet" make-model --preset r1-distill-llama-8b "${small[@]}" --vocab "$vocab_dir/ggml-vocab-llama-bpe.gguf" -o llama-8b.gguf
expect_ok "r1-distill-qwen-7b --format hf --vocab qwen2" \
  "$duet" make-model --preset r1-distill-qwen-7b "${small[@]/q8_0/f32}" --format hf --vocab "$vocab_dir/ggml-vocab-qwen2.gguf" -o qwen-7b-hf

# The tokenizer keys, independently read (tests/reference/gguf_reader.py), and Llama 3's rope
# divisors computed here from the published formula.
if /usr/bin/python3 - "$here/../reference" "$vocab_dir" <<'PY'
import math, sys
sys.path.insert(0, sys.argv[1])
from gguf_reader import GGUFFile
vocab_dir = sys.argv[2]
UNUSED = 5
def check(model_path, vocab_name, rows):
    m, v = GGUFFile(model_path), GGUFFile(f"{vocab_dir}/ggml-vocab-{vocab_name}.gguf")
    keys = [k for k in v.metadata if k.startswith("tokenizer.")]
    assert keys == [k for k in m.metadata if k.startswith("tokenizer.")], (model_path, "tokenizer keys differ")
    n = len(v.get("tokenizer.ggml.tokens"))
    for k in keys:
        a, b = m.get(k), v.get(k)
        if k == "tokenizer.ggml.tokens":
            assert a[:n] == b and a[n:] == [f"[PAD{i}]" for i in range(n, rows)], (model_path, k)
        elif k == "tokenizer.ggml.token_type":
            assert list(a[:n]) == list(b) and all(t == UNUSED for t in a[n:]), (model_path, k)
        elif k == "tokenizer.ggml.scores":
            assert list(a[:n]) == list(b) and all(s == 0 for s in a[n:]), (model_path, k)
        else:
            assert a == b, (model_path, k, a, b)
    arch = m.get("general.architecture")
    assert m.get(f"{arch}.vocab_size") == rows, (model_path, m.get(f"{arch}.vocab_size"))
    assert m.tensor("token_embd.weight").shape[0] == rows, (model_path, m.tensor("token_embd.weight").shape)
    return m
check("qwen-1.5b.gguf", "qwen2", 151936)
check("qwen-7b.gguf", "qwen2", 152064)
m = check("llama-8b.gguf", "llama-bpe", 128256)
assert m.get("llama.rope.freq_base") == 500000.0
assert abs(m.get("llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-12
head_dim = 64 // 2
want = []
for i in range(head_dim // 2):
    wavelen = 2 * math.pi * 500000.0 ** (2 * i / head_dim)
    if wavelen < 8192 / 4.0:
        want.append(1.0)
    elif wavelen > 8192 / 1.0:
        want.append(8.0)
    else:
        smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
        want.append(1 / ((1 - smooth) / 8.0 + smooth))
got = m.tensor("rope_freqs.weight")
assert len(got) == len(want) and all(abs(g - w) <= 1e-6 * w for g, w in zip(got, want)), (list(got), want)
assert got[0] == 1.0 and got[-1] == 8.0, "the divisors span both ends"
PY
then pass "tokenizer keys copied, padding, rope_freqs"; else failed "tokenizer keys copied, padding, rope_freqs"; fi

# Test cases of each vocabulary through the model files and the folder: the expected ids.
case_ids() {  # case_ids VOCAB INDEX: prints the case's text into case.txt and its ids
  /usr/bin/python3 - "$vocab_dir/ggml-vocab-$1.gguf" "$2" <<'PY'
import sys
base, i = sys.argv[1], int(sys.argv[2])
texts = open(base + ".inp", encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")
open("case.txt", "w", encoding="utf-8", newline="").write(texts[i])
print(open(base + ".out", encoding="utf-8").read().split("\n")[i].strip())
PY
}
for c in 3 12 22 33 45; do
  for pair in qwen-7b.gguf:qwen2 qwen-7b-hf:qwen2 qwen-1.5b.gguf:qwen2 llama-8b.gguf:llama-bpe; do
    model="${pair%%:*}" vocab="${pair##*:}"
    want="$(case_ids "$vocab" "$c")"
    got="$("$duet" tokenize --model "$model" --text-file case.txt 2> err.txt)"
    if [ -n "$want" ] && [ "$got" = "$want" ]; then pass "$model case $c"; else
      failed "$model case $c: expected '$want', got '$got'"; cat err.txt; fi
  done
done

expect_fail "--vocab larger than --vocab-size" "has 151936 tokens, more than --vocab-size 1000" \
  "$duet" make-model --preset tiny --vocab "$vocab_dir/ggml-vocab-qwen2.gguf" --vocab-size 1000 -o x.gguf
expect_fail "--vocab with --corpus" "--vocab and --corpus exclude each other" \
  "$duet" make-model --preset tiny --vocab "$vocab_dir/ggml-vocab-qwen2.gguf" --corpus case.txt -o x.gguf
expect_fail "--vocab not a GGUF file" "case.txt.*not a GGUF file" "$duet" make-model --preset tiny --vocab case.txt -o x.gguf
expect_fail "--vocab missing" "cannot open 'nope.gguf'" "$duet" make-model --preset tiny --vocab nope.gguf -o x.gguf

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
