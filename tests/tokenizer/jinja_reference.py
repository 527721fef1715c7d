"""Renders templates with Python's jinja2, set up the way Hugging Face's apply_chat_template sets
it up (ImmutableSandboxedEnvironment, loopcontrols, the generation tag, tojson as json.dumps with
ensure_ascii=False, raise_exception and strftime_now).

usage: jinja_reference.py CASES.json RESULTS.json
CASES.json: [{"source", "vars" (object), "trim_blocks", "lstrip_blocks"}, ...]
RESULTS.json: [{"ok": true, "output": "..."} or {"ok": false, "error": "..."}, ...] in order.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} renders its body, as in transformers."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment(trim_blocks, lstrip_blocks):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=trim_blocks, lstrip_blocks=lstrip_blocks, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    results = []
    for case in cases:
        try:
            env = environment(case["trim_blocks"], case["lstrip_blocks"])
            output = env.from_string(case["source"]).render(**case["vars"])
            results.append({"ok": True, "output": output})
        except Exception as e:  # every failure is a result to compare, not a crash of the harness
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(results, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main()
