"""``tokenmill report``: what every filter of an annotate-mode job would drop, before anything is cut.

Reads a job's ``documents`` output (the output folder, or its Parquet/JSONL parts) and, per filter and per
rule, prints how many documents it would drop on its own and in pipeline order (what a filter-mode run of the
same stages drops: :mod:`pipeline.filters.annotations`), a histogram of every score, and a few example
documents per reason, so thresholds can be picked before the corpus is cut. ``--json`` ends with one JSON line.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.documents import Drop
from pipeline.filters.annotations import failures, stored_verdicts
from pipeline.output.inspect import documents_index_name, iter_documents, load_documents_index
from pipeline.readers import expand_inputs, read_file
from pipeline.spec import InputSpec

QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


@dataclass
class FilterReport:
    at: int | None = None
    documents: int = 0
    alone: Counter = field(default_factory=Counter)
    in_order: Counter = field(default_factory=Counter)
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    scores: dict[str, array] = field(default_factory=dict)


@dataclass
class Report:
    documents: int = 0
    annotated: int = 0
    kept_in_order: int = 0
    filters: dict[str, FilterReport] = field(default_factory=dict)

    def add(self, doc: Mapping[str, Any], n_examples: int) -> None:
        self.documents += 1
        verdicts = stored_verdicts(doc.get("meta"))
        if not verdicts:
            return
        self.annotated += 1
        fails = failures(verdicts)
        if not fails:
            self.kept_in_order += 1
        for name, v in verdicts.items():
            fr = self.filters.setdefault(name, FilterReport())
            fr.at = v.get("at") if isinstance(v.get("at"), int) else fr.at
            fr.documents += 1
            for score, value in (v.get("scores") or {}).items():
                if isinstance(value, int | float):
                    fr.scores.setdefault(score, array("d")).append(float(value))
        for i, (name, reason) in enumerate(fails):
            fr = self.filters[name]
            fr.alone[reason] += 1
            if i == 0:
                fr.in_order[reason] += 1
            shown = fr.examples.setdefault(reason, [])
            if len(shown) < n_examples:
                shown.append({"id": str(doc.get("id")), "text": _snippet(str(doc.get("text", "")))})

    def to_json(self, bins: int = 10) -> dict[str, Any]:
        return {
            "documents": self.documents, "annotated": self.annotated, "kept_in_order": self.kept_in_order,
            "filters": {name: {
                "at": fr.at, "documents": fr.documents,
                "would_drop": sum(fr.alone.values()), "in_order": sum(fr.in_order.values()),
                "reasons": {r: {"alone": fr.alone[r], "in_order": fr.in_order[r], "examples": fr.examples.get(r, [])}
                            for r in sorted(fr.alone)},
                "scores": {s: score_summary(v, bins) for s, v in sorted(fr.scores.items())},
            } for name, fr in self.filters.items()},
        }


def score_summary(values: array, bins: int = 10) -> dict[str, Any]:
    """count, min, max, mean, quantiles and a histogram between the 1st and 99th percentiles (outliers in the
    end bins), so one extreme document does not squeeze every other into one bar."""
    a = np.frombuffer(values, dtype=np.float64)
    qs = np.quantile(a, QUANTILES)
    lo, hi = float(qs[0]), float(qs[-1])
    if hi <= lo:
        lo, hi = float(a.min()), float(a.max()) if a.max() > a.min() else float(a.min()) + 1.0
    counts, edges = np.histogram(np.clip(a, lo, hi), bins=bins, range=(lo, hi))
    return {"count": int(a.size), "min": float(a.min()), "max": float(a.max()), "mean": float(a.mean()),
            "quantiles": {f"p{round(q * 100):02d}": float(v) for q, v in zip(QUANTILES, qs, strict=True)},
            "histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}}


def _snippet(text: str, n: int = 160) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def iter_source(source: str) -> Iterator[Mapping[str, Any]]:
    """Documents of an output folder (its ``documents/`` index, checksummed parts) or of Parquet/JSONL files."""
    if os.path.isdir(source) and documents_index_name(source) is not None:
        yield from iter_documents(source, load_documents_index(source))
        return
    spec = InputSpec(path=source, format="documents")
    files = expand_inputs([spec])
    if not files:
        raise FileNotFoundError(f"{source}: no documents output (documents.json) and no files match")
    for i, input_spec, path in files:
        for item in read_file(i, path, input_spec):
            if not isinstance(item, Drop):
                yield item


def build_report(source: str, n_examples: int = 3) -> Report:
    report = Report()
    for doc in iter_source(source):
        report.add(doc, n_examples)
    return report


def format_report(data: dict[str, Any], show_examples: bool = True) -> str:
    n = data["documents"]
    lines = [f"{n:,} documents, {data['annotated']:,} with stored verdicts; a filter-mode run of these filters "
             f"keeps {data['kept_in_order']:,} ({_pct(data['kept_in_order'], n)})", ""]
    lines.append(f"{'filter / reason':<44} {'would drop alone':>18} {'in order':>18}")
    for name, fr in sorted(data["filters"].items(), key=lambda kv: (kv[1]["at"] is None, kv[1]["at"] or 0, kv[0])):
        d = fr["documents"]
        lines.append(f"{name:<44} {fr['would_drop']:>9,} {_pct(fr['would_drop'], d):>8} "
                     f"{fr['in_order']:>9,} {_pct(fr['in_order'], d):>8}")
        for reason, r in sorted(fr["reasons"].items(), key=lambda kv: -kv[1]["alone"]):
            lines.append(f"  {reason:<42} {r['alone']:>9,} {_pct(r['alone'], d):>8} "
                         f"{r['in_order']:>9,} {_pct(r['in_order'], d):>8}")
            if show_examples:
                for ex in r["examples"]:
                    lines.append(f"      {ex['id']}: {ex['text']}")
    lines.append("")
    lines.append("scores (histogram between p01 and p99; the end bins hold the rest)")
    for name, fr in data["filters"].items():
        for score, s in fr["scores"].items():
            q = s["quantiles"]
            lines.append(f"{name}.{score}: n={s['count']:,} min={s['min']:.4g} p10={q['p10']:.4g} "
                         f"p50={q['p50']:.4g} p90={q['p90']:.4g} max={s['max']:.4g}")
            edges, counts = s["histogram"]["edges"], s["histogram"]["counts"]
            top = max(counts) or 1
            for i, c in enumerate(counts):
                lines.append(f"    [{edges[i]:>10.4g}, {edges[i + 1]:>10.4g}) {'#' * round(30 * c / top):<30} {c:,}")
    return "\n".join(lines)


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f} %" if n else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenmill report", description=__doc__.splitlines()[0])
    p.add_argument("source", help="an output folder with a documents output, or documents Parquet/JSONL files")
    p.add_argument("--examples", type=int, default=3, metavar="N", help="example documents per reason")
    p.add_argument("--bins", type=int, default=10)
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    args = p.parse_args(argv)
    if not glob.has_magic(args.source) and not os.path.exists(args.source):
        print(f"error: {args.source}: no such file or folder", file=sys.stderr)
        return 2
    try:
        report = build_report(args.source, args.examples)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = report.to_json(args.bins)
    if not data["annotated"]:
        print(f"error: {args.source}: no document carries stored verdicts (run the filters with mode: annotate "
              "and output.documents set)", file=sys.stderr)
        return 2
    print(format_report(data, show_examples=args.examples > 0))
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
    return 0
