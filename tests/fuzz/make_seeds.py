#!/usr/bin/python3
"""Writes the binary seeds of the fuzz corpus (GGUF and safetensors files, fuzz_deep's
descriptions) into corpus/.

Small valid files of each shape the readers accept, and a few near misses. Run again only to
change them; the text seeds (JSON, templates, HTTP) are written by hand in their folders.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == STR:
        return gguf_str(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, i) for i in items)
    fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
           U64: "<Q", I64: "<q", F64: "<d"}[t]
    return struct.pack(fmt, v)


def gguf(metadata, tensors, version=3, alignment=32):
    """tensors: (name, ggml type, dims (innermost first), data bytes)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, t, v in metadata:
        out += gguf_str(key) + struct.pack("<I", t) + gguf_value(t, v)
    offset = 0
    offsets = []
    for name, ggml_type, dims, data in tensors:
        offsets.append(offset)
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
        offset += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    for (_, _, _, data), off in zip(tensors, offsets):
        out += data + b"\0" * (-len(data) % alignment)
    return out


def write(folder, name, data):
    os.makedirs(os.path.join(HERE, "corpus", folder), exist_ok=True)
    with open(os.path.join(HERE, "corpus", folder, name), "wb") as f:
        f.write(data)


tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["he", "hel", "hello"]
meta = [
    ("general.architecture", STR, "llama"),
    ("general.name", STR, "seed"),
    ("llama.context_length", U32, 128),
    ("llama.rope.freq_base", F32, 10000.0),
    ("tokenizer.ggml.model", STR, "gpt2"),
    ("tokenizer.ggml.pre", STR, "deepseek-llm"),
    ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
    ("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3] + [1] * (len(tokens) - 3))),
    ("tokenizer.ggml.merges", ARR, (STR, ["h e", "he l", "hel l"])),
    ("tokenizer.ggml.bos_token_id", U32, 1),
    ("tokenizer.ggml.eos_token_id", U32, 2),
    ("tokenizer.ggml.add_bos_token", BOOL, True),
    ("tokenizer.chat_template", STR, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"),
]
f32 = struct.pack("<8f", *[0.5 * i for i in range(8)])
q8_0 = struct.pack("<e", 0.25) + bytes(range(32))  # one Q8_0 block
write("gguf", "llama_tokenizer_v3.gguf", gguf(meta, [("token_embd.weight", 0, [4, 2], f32),
                                                     ("blk.0.attn_q.weight", 8, [32, 1], q8_0)]))
write("gguf", "metadata_only_v2.gguf", gguf(meta[:4], [], version=2))
write("gguf", "all_scalar_types.gguf", gguf([("u8", U8, 7), ("i8", I8, -7), ("u16", U16, 700), ("i16", I16, -700),
                                             ("u32", U32, 70000), ("i32", I32, -70000), ("f32", F32, 1.5),
                                             ("bool", BOOL, False), ("u64", U64, 1 << 40), ("i64", I64, -(1 << 40)),
                                             ("f64", F64, 2.25), ("nested", ARR, (ARR, [(U8, [1, 2]), (U8, [])]))],
                                            []))
write("gguf", "truncated.gguf", gguf(meta, [("token_embd.weight", 0, [4, 2], f32)])[:150])


def safetensors(tensors, metadata=None):
    header = {}
    data = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


write("safetensors", "two_tensors.safetensors",
      safetensors([("model.embed_tokens.weight", "F32", [2, 4], f32),
                   ("model.norm.weight", "BF16", [4], struct.pack("<4H", 0x3f80, 0x4000, 0x4040, 0x4080))],
                  {"format": "pt"}))
write("safetensors", "fp8_with_scale.safetensors",
      safetensors([("w", "F8_E4M3", [2, 2], bytes([0x38, 0x40, 0xb8, 0x00])),
                   ("w_scale_inv", "F32", [1, 1], struct.pack("<f", 0.5))]))
write("safetensors", "empty.safetensors", safetensors([]))


# fuzz_deep: byte 0 what the text is (0 template, 1 chat body, 2 completions body), bytes 1-2 the
# count N, then PREFIX, OPEN, MIDDLE, CLOSE, SUFFIX separated by \x1f (fuzz_deep.cpp).
def deep(kind, n, prefix, open_="", middle="", close="", suffix=""):
    return bytes([kind]) + struct.pack("<H", n) + "\x1f".join([prefix, open_, middle, close, suffix]).encode()


CHAT = '{"messages": [{"role": "user", "content": "hi"}], '
write("deep", "template_nested_ifs", deep(0, 1000, "", "{% if 1 %}", "x", "{% endif %}"))
write("deep", "template_filter_chain", deep(0, 30000, "{{ 'a'", "|upper", "", "", " }}"))
write("deep", "template_concat_chain", deep(0, 30000, "{{ 'a'", " ~ 'a'", "", "", " }}"))
write("deep", "template_not_chain", deep(0, 30000, "{{ ", "not ", "1", "", " }}"))
# Loops and macros within the step budget (its runaway cases take seconds under the sanitizers;
# jinja_test has them).
write("deep", "template_nested_loops", deep(0, 3, "", "{% for i\x01 in range(10) %}", "x", "{% endfor %}"))
write("deep", "template_nested_lists", deep(0, 0, "{% set ns = namespace(x=1) %}{% for i in range(100000) %}"
                                                  "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}"))
write("deep", "template_macro_fanout", deep(0, 0, "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}"
                                                  "{% endif %}{% endmacro %}{{ f(8) }}"))
write("deep", "regex_nested_groups", deep(1, 50000, CHAT + '"guided_regex": "', "(", "a", ")", '"}'))
write("deep", "regex_optional_run", deep(2, 60000, '{"prompt": "x", "guided_regex": "', "a?", "", "", '"}'))
write("deep", "grammar_rule_chain", deep(2, 60000, '{"prompt": "x", "guided_grammar": "root ::= r0\\n',
                                         "r\x01 ::= r\x02\\n", 'r\x03 ::= \\"a\\"', "", '"}'))
write("deep", "grammar_nested_groups", deep(1, 50000, CHAT + '"guided_grammar": "root ::= ', "(", '\\"a\\"', ")", '"}'))
write("deep", "schema_nested_arrays", deep(2, 20000, '{"prompt": "x", "response_format": {"type": "json_schema", '
                                           '"json_schema": {"name": "s", "schema": ', '{"type": "array", "items": ',
                                           '{"type": "string"}', "}", "}}}"))
write("deep", "schema_ref_chain", deep(1, 20000, CHAT + '"guided_json": {"$defs": {', '"d\x01": {"$ref": "#/$defs/d\x02"}, ',
                                       '"d\x03": {"type": "integer"}', "", '}, "$ref": "#/$defs/d0"}}'))
write("deep", "many_logit_bias_keys", deep(2, 60000, '{"prompt": "x", "logit_bias": {', '"\x01": 1, ', '"0": 1', "", "}}"))
write("deep", "many_messages", deep(1, 10000, '{"messages": [', '{"role": "user", "content": "hi"}, ',
                                    '{"role": "user", "content": "hi"}', "", "]}"))
write("deep", "many_stop_strings", deep(2, 60000, '{"prompt": "x", "stop": [', '"s\x01", ', '"s"', "", "]}"))
write("deep", "deep_tool_parameters", deep(1, 20000, CHAT + '"tools": [{"type": "function", "function": {"name": "f", '
                                           '"parameters": ', '{"type": "object", "properties": {"a": ',
                                           '{"type": "string"}', "}}", "}}]}"))
