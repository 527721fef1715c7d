"""Checks deploy/filebeat/filebeat.yml against a log that `duet serve --log-format json` wrote.

usage: check_filebeat.py FILEBEAT.yml DUET.log

- the input reads ndjson from the folder duet's systemd unit / containers log to;
- the timestamp processor's field is on every line, and its Go layout matches duet's `ts`;
- every field a rename processor maps is on every line that processor applies to (lines whose
  message is "request" for the access-line processors), unless it says ignore_missing, and then
  at least one line of the log has it (no mapping of a field duet never writes);
- every field of the access lines is mapped, so nothing lands in Elasticsearch unnamed.
Exits 1 naming each problem.
"""

from __future__ import annotations

import json
import re
import sys

import yaml


def go_layout_regex(layout: str) -> re.Pattern:
    """The subset of Go's reference-time layout that Filebeat configurations use."""
    parts = [("2006", r"\d{4}"), ("01", r"\d{2}"), ("02", r"\d{2}"), ("15", r"\d{2}"), ("04", r"\d{2}"),
             ("05", r"\d{2}"), (".000000", r"\.\d{6}"), (".000", r"\.\d{3}"), (".999", r"(\.\d{1,3})?"),
             ("Z07:00", r"(Z|[+-]\d{2}:\d{2})")]
    out, i = "", 0
    while i < len(layout):
        for token, rx in parts:
            if layout.startswith(token, i):
                out += rx
                i += len(token)
                break
        else:
            out += re.escape(layout[i])
            i += 1
    return re.compile(out + r"\Z")


def main() -> int:
    config = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
    lines = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
    problems = []
    access = [l for l in lines if l.get("msg") == "request"]
    if not access:
        problems.append(f"{sys.argv[2]} has no access lines (msg 'request')")

    inputs = config["filebeat.inputs"]
    duet_inputs = [i for i in inputs if i.get("id") == "duet"]
    if len(duet_inputs) != 1:
        problems.append("expected one filebeat input with id 'duet'")
    else:
        i = duet_inputs[0]
        if i.get("type") != "filestream" or not any("ndjson" in p for p in i.get("parsers", [])):
            problems.append("the duet input must be a filestream with an ndjson parser")
        if "/var/log/duet/*.log" not in i.get("paths", []):
            problems.append(f"the duet input reads {i.get('paths')}, not /var/log/duet/*.log")

    mapped = set()
    for proc in config["processors"]:
        (kind, body), = proc.items()
        if kind == "timestamp":
            field = body["field"]
            mapped.add(field)
            regexes = [go_layout_regex(l) for l in body["layouts"]]
            for l in lines:
                if field not in l:
                    problems.append(f"timestamp field '{field}' missing from {l}")
                elif not any(r.match(l[field]) for r in regexes):
                    problems.append(f"'{l[field]}' does not match the layouts {body['layouts']}")
            for t in body.get("test", []):
                if not any(r.match(t) for r in regexes):
                    problems.append(f"the timestamp test value {t!r} does not match its layouts")
        elif kind == "rename":
            when = body.get("when.equals.message")
            # Renames run in order: `msg` is `message` by the time the access processors run.
            applies = access if when == "request" else lines
            if when not in (None, "request"):
                problems.append(f"a rename applies when message is {when!r}, which duet never writes")
            for f in body["fields"]:
                src = f["from"]
                mapped.add(src)
                have = [l for l in applies if src in l]
                if not body.get("ignore_missing", False) and len(have) != len(applies):
                    missing = next(l for l in applies if src not in l)
                    problems.append(f"'{src}' (mapped to {f['to']}) is missing from {missing}")
                if not have:
                    problems.append(f"'{src}' (mapped to {f['to']}) is on no line of the log")
    for l in access:
        unmapped = set(l) - mapped
        if unmapped:
            problems.append(f"access line fields not mapped: {sorted(unmapped)}")
            break
    for p in problems:
        print("FAIL:", p)
    print(f"{len(lines)} log lines, {len(access)} access lines, {len(mapped)} mapped fields; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
