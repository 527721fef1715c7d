"""Checks that the Grafana dashboard and the Prometheus rules in deploy/ ask only for metrics that a
live `duet serve` exports.

usage: check_metric_names.py METRICS.txt --dashboard DASH.json ... --rules RULES.yaml ...

METRICS.txt is a scrape of /metrics. Every PromQL expression of the dashboard (panel targets and
template-variable queries) and of the rules is tokenized; the metric names it selects must be
sample names in the scrape (recorded rule names and Prometheus' own `up` excepted), every query
must select at least one metric, and the labels it matches on or groups by must be labels those
metrics carry (or `job`/`instance`, which Prometheus adds). Exits 1 naming each problem.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import yaml

TARGET_LABELS = {"job", "instance"}
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Aggregations may put their grouping clause before the parenthesis: `sum by (le) (...)`.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
            "group_right", "inf", "nan"} | AGGREGATIONS
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(r'''\s+|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|'''
                   r'''\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|!=|=~|!~|==|>=|<=|.''')


def read_scrape(path: str) -> dict[str, set[str]]:
    """Sample name -> the label names it carries."""
    out: dict[str, set[str]] = {}
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s", line)
        if not m:
            raise SystemExit(f"{path}: cannot read the sample line {line!r}")
        labels = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(3) or ""))
        out.setdefault(m.group(1), set()).update(labels)
    return out


def selections(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The metrics an expression selects, each with the label names its matchers use, and the
    label names of its grouping clauses (by, without, on, ...)."""
    expr = re.sub(r"\$__\w+|\$\{[^}]*\}|\$\w+", "X", expr)  # Grafana variables
    tokens = [t for t in TOKEN.findall(expr) if not t.isspace()]
    metrics: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        t = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if t in GROUPING and nxt == "(":
            j = i + 2
            while j < len(tokens) and tokens[j] != ")":
                if re.match(r"[A-Za-z_]", tokens[j]):
                    grouping.add(tokens[j])
                j += 1
            i = j + 1
            continue
        if t == "{":  # a selector without a name: {__name__="..."} is not used here
            raise ValueError(f"a selector without a metric name in {expr!r}")
        if re.match(r"[A-Za-z_:]", t) and t.lower() not in KEYWORDS and nxt != "(":
            labels: set[str] = set()
            if nxt == "{":
                j = i + 2
                while j < len(tokens) and tokens[j] != "}":
                    if re.match(r"[A-Za-z_]", tokens[j]) and tokens[j + 1] in ("=", "!=", "=~", "!~"):
                        labels.add(tokens[j])
                    j += 1
                i = j
            metrics.append((t, labels))
        i += 1
    return metrics, grouping


def dashboard_queries(path: str) -> list[tuple[str, str]]:
    """(where, expr) of every panel target and query variable."""
    d = json.load(open(path, encoding="utf-8"))
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"{path}: panel '{p.get('title')}' target {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(d.get("panels", []))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)\s*", q)
        if not m:
            raise SystemExit(f"{path}: variable {v['name']}: expected label_values(EXPR, LABEL), found {q!r}")
        out.append((f"{path}: variable ${v['name']}", f"{m.group(1)}"))
        out.append((f"{path}: variable ${v['name']} (its label)", f"{m.group(1).split('{')[0]}{{{m.group(2)}=\"\"}}"))
    return out


def rules_queries(path: str) -> tuple[list[tuple[str, str]], set[str]]:
    doc = yaml.safe_load(open(path, encoding="utf-8"))
    out, recorded = [], set()
    for g in doc["groups"]:
        for r in g["rules"]:
            name = r.get("record") or r.get("alert")
            out.append((f"{path}: {name}", r["expr"]))
            if "record" in r:
                recorded.add(r["record"])
    return out, recorded


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scrape")
    ap.add_argument("--dashboard", action="append", default=[])
    ap.add_argument("--rules", action="append", default=[])
    args = ap.parse_args()
    exported = read_scrape(args.scrape)
    queries, recorded = [], set()
    for d in args.dashboard:
        queries += dashboard_queries(d)
    for r in args.rules:
        q, rec = rules_queries(r)
        queries += q
        recorded |= rec
    problems = []
    names = set()
    for where, expr in queries:
        try:
            metrics, grouping = selections(expr)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        if not metrics:
            problems.append(f"{where}: selects no metric: {expr!r}")
        carried = set(TARGET_LABELS)
        for name, labels in metrics:
            names.add(name)
            if name in recorded or name in PROMETHEUS_OWN:
                carried |= {"model_name", "le"} if name in recorded else set()
                continue
            if name not in exported:
                problems.append(f"{where}: '{name}' is not exported by duet serve")
                continue
            carried |= exported[name]
            missing = labels - exported[name] - TARGET_LABELS
            if missing:
                problems.append(f"{where}: '{name}' has no label {sorted(missing)} (it has {sorted(exported[name])})")
        if grouping - carried:
            problems.append(f"{where}: groups by {sorted(grouping - carried)}, which no metric of it carries")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(queries)} queries, {len(names)} metric names checked against {len(exported)} exported samples; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
