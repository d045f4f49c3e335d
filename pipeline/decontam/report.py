"""``tokenmill contamination-report``: how much of each benchmark a corpus or a shard set contains.

The check to run by hand before a training run. The corpus is JSONL/Parquet files (files, folders,
globs), a tokenmill output folder's ``documents/`` output, or a finished shard set, whose documents are
re-assembled and decoded with its own tokenizer (:func:`pipeline.output.inspect.decode_documents`).
Matching is the ``decontaminate`` stage's (:class:`pipeline.decontam.match.Matcher`), with the same
defaults. Per benchmark it prints the documents that contain an item (exactly, and at ``min_overlap``),
the distinct items found, and the worst items: those found in the most documents, then with the highest
overlap. ``--json`` prints one JSON line instead; ``--max-rate`` makes it a gate (exit 1 above it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.decontam.index import BenchmarkIndex, benchmark_files, index_files
from pipeline.decontam.match import Match, Matcher
from pipeline.decontam.stage import DecontaminateParams
from pipeline.output.inspect import decode_documents, documents_index_name, iter_documents, load_documents_index
from pipeline.readers import expand_inputs, read_file
from pipeline.spec import InputSpec

#: document ids kept per item as examples
EXAMPLES = 3
#: documents matched together (as the stage matches a batch)
BATCH = 256
#: the stage's defaults, which the report's options share (the same matching, the same numbers)
STAGE = DecontaminateParams()


class InputError(ValueError):
    """A corpus or benchmark path that cannot be read (exit code 2)."""


# ---- documents of a corpus -------------------------------------------------------------------------------

def is_output_folder(path: Path) -> bool:
    return path.is_dir() and ((path / "manifest.json").is_file() or documents_index_name(path) is not None)


def iter_corpus(paths: list[str], source: str, text_field: str, id_field: str, bad: Counter
                ) -> Iterator[tuple[str, str]]:
    """``(doc id, text)`` of every document the paths name; unreadable records are counted in ``bad``."""
    for path in paths:
        if is_output_folder(Path(path)):
            yield from _output_documents(Path(path), source)
        else:
            yield from _files(path, text_field, id_field, bad)


def _files(path: str, text_field: str, id_field: str, bad: Counter) -> Iterator[tuple[str, str]]:
    spec = InputSpec(path=path, text_field=text_field, id_field=id_field)
    files = expand_inputs([spec])
    if not files:
        raise InputError(f"{path}: no file matches")
    for i, _, f in files:
        for doc in read_file(i, f, spec):
            if isinstance(doc, dict):
                yield doc["id"], doc["text"]
            else:
                bad[doc.reason] += 1


def _output_documents(out: Path, source: str) -> Iterator[tuple[str, str]]:
    has_docs = documents_index_name(out) is not None
    if source == "documents" or (source == "auto" and has_docs):
        if not has_docs:
            raise InputError(f"{out}: no documents/ output (the job ran with output.documents: null)")
        for doc in iter_documents(out, load_documents_index(out)):
            yield str(doc.get("id")), doc.get("text") or ""
        return
    if not (out / "manifest.json").is_file():
        raise InputError(f"{out}: no shard set (manifest.json)")
    for ord_, text in sorted(decode_documents(out).items()):
        yield f"ord:{ord_}", text


# ---- tallying --------------------------------------------------------------------------------------------

@dataclass
class ItemTally:
    benchmark: str
    item: str
    #: (field, rule) of the item's best match in each document that holds it
    found_by: Counter = field(default_factory=Counter)
    docs: int = 0
    exact_docs: int = 0
    max_overlap: float = 0.0
    max_span: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """Documents and items found, per benchmark."""

    docs: int = 0
    contaminated: int = 0
    docs_overlap: Counter = field(default_factory=Counter)
    docs_exact: Counter = field(default_factory=Counter)
    items: dict[tuple[str, str], ItemTally] = field(default_factory=dict)

    def add_batch(self, docs: list[tuple[str, str]], matcher: Matcher) -> None:
        for (doc_id, _), matches in zip(docs, matcher.match_batch([t for _, t in docs]), strict=True):
            self.add(doc_id, matches)

    def add(self, doc_id: str, matches: list[Match]) -> None:
        self.docs += 1
        if not matches:
            return
        self.contaminated += 1
        for bench in {m.benchmark for m in matches}:
            self.docs_overlap[bench] += 1
        for bench in {m.benchmark for m in matches if m.exact}:
            self.docs_exact[bench] += 1
        for m in matches:
            t = self.items.setdefault((m.benchmark, m.item), ItemTally(m.benchmark, m.item))
            t.docs += 1
            t.exact_docs += m.exact
            t.max_overlap = max(t.max_overlap, m.overlap)
            t.max_span = max(t.max_span, m.span)
            t.found_by[m.field, m.rule] += 1
            if len(t.examples) < EXAMPLES:
                t.examples.append(doc_id)

    def summary(self, index: BenchmarkIndex, top: int) -> dict:
        per = {}
        indexed = index.items_per_benchmark()
        for bench in index.benchmarks:
            found = [t for (b, _), t in self.items.items() if b == bench]
            n = indexed[bench]
            per[bench] = {
                "items": n, "items_skipped": index.skipped.get(bench, 0), "items_stock": index.stock.get(bench, 0),
                "docs_overlap": self.docs_overlap[bench], "docs_exact": self.docs_exact[bench],
                "doc_rate_overlap": _rate(self.docs_overlap[bench], self.docs),
                "doc_rate_exact": _rate(self.docs_exact[bench], self.docs),
                "items_found_overlap": len(found), "items_found_exact": sum(t.exact_docs > 0 for t in found),
                "item_rate_overlap": _rate(len(found), n),
                "item_rate_exact": _rate(sum(t.exact_docs > 0 for t in found), n),
                # items found, per field that matched and per rule (an item found two ways counts under both)
                "items_by_field": dict(sorted(Counter(f for t in found for f in {f for f, _ in t.found_by}).items())),
                "items_by_rule": dict(sorted(Counter(r for t in found for r in {r for _, r in t.found_by}).items())),
            }
        worst = sorted(self.items.values(), key=lambda t: (-t.docs, -t.max_overlap, t.benchmark, t.item))[:top]
        return {
            "docs": self.docs, "contaminated_docs": self.contaminated, "contaminated_rate": _rate(self.contaminated,
                                                                                               self.docs),
            "benchmarks": per,
            "worst_items": [{"benchmark": t.benchmark, "item": t.item, "docs": t.docs, "exact_docs": t.exact_docs,
                             "max_overlap": round(t.max_overlap, 4), "max_span": t.max_span,
                             "found_by": [f"{f}:{r}" for (f, r), _ in t.found_by.most_common()],
                             "examples": t.examples} for t in worst],
        }


def _rate(n: int, d: int) -> float:
    return round(n / d, 6) if d else 0.0


# ---- command line ----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokenmill contamination-report",
        description="Check a corpus (JSONL/Parquet files, a tokenmill output's documents) or a shard set "
                    "against benchmark files: per benchmark, documents and items found, and the worst items.")
    p.add_argument("corpus", nargs="+", help="files, folders or globs of JSONL/Parquet, or a tokenmill output folder")
    p.add_argument("--benchmarks", "-b", nargs="+", required=True, metavar="PATH",
                   help="benchmark files (JSONL(.gz/.zst) or Parquet), folders or globs")
    p.add_argument("--from", dest="source", choices=("auto", "documents", "shards"), default="auto",
                   help="for an output folder: its documents/ output (auto: when present) or its shards, decoded")
    p.add_argument("--ngram", type=int, default=STAGE.ngram)
    p.add_argument("--min-words", type=int, default=STAGE.min_words,
                   help="shorter benchmark items are not checked (counted as skipped)")
    p.add_argument("--stock-items", type=int, default=STAGE.stock_items,
                   help="a short item found in this many benchmark items is a stock question: not checked")
    p.add_argument("--min-overlap", type=float, default=STAGE.min_overlap,
                   help="fraction of an item's n-grams a document must contain")
    p.add_argument("--min-span", type=int, default=STAGE.min_span,
                   help="... or a piece of the item this many words long (consecutive n-grams)")
    p.add_argument("--min-span-share", type=float, default=STAGE.min_span_share,
                   help="... or a piece of at least --ngram words holding this share of the item's words")
    p.add_argument("--common-items", type=int, default=STAGE.common_items,
                   help="an n-gram found in this many items is a stock phrase: never part of a span")
    p.add_argument("--text-field", default="text", help="text field of the corpus's records")
    p.add_argument("--id-field", default="id", help="id field of the corpus's and the benchmarks' records")
    p.add_argument("--item-fields", nargs="+", default=None, metavar="FIELD",
                   help="fields of a benchmark record indexed as texts of the item (default: every text field "
                        "but --exclude-fields)")
    p.add_argument("--exclude-fields", nargs="*", default=list(STAGE.exclude_fields), metavar="FIELD",
                   help="fields never indexed (ids, metadata, test harness code)")
    p.add_argument("--benchmark-field", default="benchmark")
    p.add_argument("--top", type=int, default=10, help="worst items to list")
    p.add_argument("--max-rate", type=float, metavar="R",
                   help="exit 1 when any benchmark's contaminated-document rate (overlap) is above R")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of tables")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not 1 <= args.min_words <= args.ngram:
            raise InputError(f"--min-words must be in 1..--ngram ({args.ngram})")
        if not 0 < args.min_overlap <= 1:
            raise InputError("--min-overlap must be in (0, 1]")
        if not 0 < args.min_span_share <= 1:
            raise InputError("--min-span-share must be in (0, 1]")
        if args.min_span < args.ngram:
            raise InputError("--min-span must be at least --ngram (a span is a run of n-grams)")
        if args.common_items < 2:
            raise InputError("--common-items must be at least 2")
        bad: Counter = Counter()
        bad_items: Counter = Counter()
        for path in args.benchmarks:
            if not benchmark_files([path]):
                raise InputError(f"--benchmarks: no file matches {path!r}")
        index = index_files(args.benchmarks, ngram=args.ngram, min_words=args.min_words,
                            stock_items=args.stock_items, text_fields=args.item_fields, id_field=args.id_field,
                            benchmark_field=args.benchmark_field, bad=bad_items, exclude_fields=args.exclude_fields,
                            common_items=args.common_items)
        matcher = Matcher(index, args.min_overlap, args.min_span, args.min_span_share)
        tally = Tally()
        batch: list[tuple[str, str]] = []
        for item in iter_corpus(args.corpus, args.source, args.text_field, args.id_field, bad):
            batch.append(item)
            if len(batch) == BATCH:
                tally.add_batch(batch, matcher)
                batch = []
        tally.add_batch(batch, matcher)
    except (InputError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {"params": {"ngram": args.ngram, "min_words": args.min_words, "stock_items": args.stock_items,
                         "min_overlap": args.min_overlap, "min_span": args.min_span,
                         "min_span_share": args.min_span_share, "common_items": args.common_items,
                         "item_fields": args.item_fields, "indexed_fields": index.fields},
              **tally.summary(index, args.top), "unreadable": dict(bad), "unreadable_items": dict(bad_items)}
    over = sorted(b for b, s in result["benchmarks"].items()
                  if args.max_rate is not None and s["doc_rate_overlap"] > args.max_rate)
    result["over_max_rate"] = over
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print_report(result)
        if over:
            print(f"contaminated-document rate above {args.max_rate}: {', '.join(over)}")
    return 1 if over else 0


def print_report(r: dict) -> None:
    p = r["params"]
    bad = sum(r["unreadable"].values())
    print(f"{r['docs']:,} documents checked ({bad:,} unreadable records), {r['contaminated_docs']:,} contain a "
          f"benchmark item ({100 * r['contaminated_rate']:.3f} %); {p['ngram']}-grams of normalized words, "
          f"an item matches at >= {p['min_overlap']:.0%} of its n-grams, or with a piece of >= {p['min_span']} words "
          f"(or >= {p['ngram']} words and {p['min_span_share']:.0%} of it); fields: {', '.join(p['indexed_fields'])}")
    head = (f"{'benchmark':<16}{'items':>8}{'skipped':>9}{'stock':>7}{'docs exact':>12}{'docs overlap':>14}"
            f"{'doc rate':>10}{'items exact':>13}{'items overlap':>15}{'item rate':>11}")
    print(head)
    print("-" * len(head))
    for bench, s in r["benchmarks"].items():
        print(f"{bench:<16}{s['items']:>8,}{s['items_skipped']:>9,}{s['items_stock']:>7,}{s['docs_exact']:>12,}"
              f"{s['docs_overlap']:>14,}{100 * s['doc_rate_overlap']:>9.3f}%{s['items_found_exact']:>13,}"
              f"{s['items_found_overlap']:>15,}{100 * s['item_rate_overlap']:>10.2f}%")
    found = [(b, s) for b, s in r["benchmarks"].items() if s["items_by_field"]]
    if found:
        print("\nitems found per field that matched / per rule (whole: a short text found whole; overlap: "
              "enough of its n-grams; span: one piece of it):")
        for bench, s in found:
            print(f"  {bench:<16}" + ", ".join(f"{f} {n:,}" for f, n in s["items_by_field"].items()) + "  /  "
                  + ", ".join(f"{k} {n:,}" for k, n in s["items_by_rule"].items()))
    if r["worst_items"]:
        print("\nworst items (most documents, then highest overlap):")
        for t in r["worst_items"]:
            print(f"  {t['benchmark']:<12} {t['item']:<40} docs {t['docs']:>5,}  exact {t['exact_docs']:>5,}  "
                  f"max overlap {t['max_overlap']:.2f}  max span {t['max_span']:>4}  by {', '.join(t['found_by'])}  "
                  f"e.g. {', '.join(t['examples'])}")
    print("(skipped: items under --min-words words; stock: stock questions such as 'Which of the following is "
          "true?'; neither is checked. Rates: of the corpus's documents, of the benchmark's items)")
