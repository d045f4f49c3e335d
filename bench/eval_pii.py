"""PII detection on shared/corpora/pii: precision and recall per entity type, and docs/s against plain Presidio.

Usage: ``python bench/eval_pii.py [--limit N] [--files faker_docs,faker_templates,presidio_synth] [--prose-mb 3]``

Three detectors run on the same documents in this process, batch by batch in turn, with the same score
threshold (0.4):

- **tokenmill**: ``PiiDetector``, the ``pii`` stage's detector: the recognizers only on the prefilter's
  candidate windows, several windows per recognizer call;
- **presidio (same recognizers)**: a plain Presidio ``AnalyzerEngine.analyze`` on each whole document with
  tokenmill's recognizers, NLP engine and language code: the speed ``ratio`` is against this one, and its
  spans must be tokenmill's (``identical_docs``);
- **presidio (its own)**: the same, with Presidio's own card, phone and URL recognizers (tokenmill widens
  those, see ``pipeline/pii/recognizers.py``): Presidio's recall and precision.

All outputs go through the same overlap resolution. **Matching rule**: a predicted span is correct when it
overlaps (shares at least one character with) a gold span of the same type; a gold span is found when a
predicted span of its type overlaps it. Gold labels are mapped to Presidio's names (EMAIL -> EMAIL_ADDRESS,
IBAN -> IBAN_CODE, DOMAIN_NAME -> URL). Recall is reported for the gold types tokenmill detects;
``precision`` is over every span predicted (all default types), so a span of a type the corpus does not
label (US_BANK_NUMBER, UUID) counts as wrong. ``min_recall`` is the lowest recall of the six goal types.
``--prose-mb N`` also times tokenmill and Presidio on N MB of real documentation (Debian handbook, Python
docs), where PII is rare. The last line is one JSON object with the key figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CORPORA, iter_jsonl, read_texts
from pipeline.pii.analyzer import LANGUAGE, build_analyzer, build_recognizers
from pipeline.pii.detector import SCORE_THRESHOLD, Entity, PiiDetector, resolve

GOAL_TYPES = ("EMAIL_ADDRESS", "CREDIT_CARD", "IP_ADDRESS", "IBAN_CODE", "US_SSN", "PHONE_NUMBER")
LABEL_MAP = {"EMAIL": "EMAIL_ADDRESS", "IBAN": "IBAN_CODE", "DOMAIN_NAME": "URL"}
FILES = ("faker_docs", "faker_templates", "presidio_synth")


def load(files: list[str], limit: int | None) -> list[dict]:
    docs = []
    for name in files:
        for rec in iter_jsonl(CORPORA / "pii" / f"{name}.jsonl.gz"):
            rec["file"] = name
            rec["gold"] = [(s["start"], s["end"], LABEL_MAP.get(s["label"], s["label"])) for s in rec["spans"]]
            docs.append(rec)
    return docs[:limit] if limit else docs


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def score(docs: list[dict], preds: list[list[Entity]], types: list[str]) -> dict[str, dict[str, float]]:
    """Per type: gold, found, predicted, correct, recall, precision (overlap matching, see module doc)."""
    c: dict[str, Counter] = {t: Counter() for t in types}
    for doc, pred in zip(docs, preds, strict=True):
        for s, e, label in doc["gold"]:
            if label in c:
                c[label]["gold"] += 1
                c[label]["found"] += any(p.type == label and overlaps((s, e), (p.start, p.end)) for p in pred)
        for p in pred:
            c.setdefault(p.type, Counter())["predicted"] += 1
            c[p.type]["correct"] += any(
                label == p.type and overlaps((s, e), (p.start, p.end)) for s, e, label in doc["gold"])
    out = {}
    for t, k in c.items():
        out[t] = dict(k, recall=k["found"] / k["gold"] if k["gold"] else None,
                      precision=k["correct"] / k["predicted"] if k["predicted"] else None)
    return out


def fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.3f}"


def plain(analyzer, texts: list[str]) -> tuple[list[list[Entity]], float]:
    """``AnalyzerEngine.analyze`` on each whole text, overlaps resolved like the stage's; and the seconds."""
    t0 = time.perf_counter()
    out = []
    for text in texts:
        results = analyzer.analyze(text, language=LANGUAGE, score_threshold=SCORE_THRESHOLD)
        out.append(resolve([Entity(r.start, r.end, r.entity_type, r.score) for r in results]))
    return out, time.perf_counter() - t0


def time_prose(detector: PiiDetector, megabytes: float) -> dict[str, float]:
    """tokenmill and plain Presidio (same recognizers) on real documentation, where PII is rare."""
    paths = [CORPORA / "english" / "debian_handbook.jsonl.gz", CORPORA / "english" / "python_docs.jsonl.gz"]
    texts = read_texts([p for p in paths if p.exists()], limit_bytes=int(megabytes * 1e6))
    ours_s = same_s = 0.0
    for i in range(0, len(texts), 64):
        batch = texts[i : i + 64]
        t0 = time.perf_counter()
        detector.detect(batch)
        ours_s += time.perf_counter() - t0
        same_s += plain(detector.analyzer, batch)[1]
    mb = sum(map(len, texts)) / 1e6
    print(f"real documentation, {len(texts)} documents, {mb:.1f} M chars: tokenmill {mb / ours_s:.2f} M chars/s, "
          f"presidio (same recognizers) {mb / same_s:.2f} M chars/s, ratio {same_s / ours_s:.2f}x")
    return {"docs": len(texts), "mchars": round(mb, 2), "ratio": round(same_s / ours_s, 2),
            "mchars_per_s": round(mb / ours_s, 3), "presidio_mchars_per_s": round(mb / same_s, 3)}


def overall_precision(sc: dict) -> float:
    pred = sum(v.get("predicted", 0) for v in sc.values())
    return sum(v.get("correct", 0) for v in sc.values()) / pred if pred else 1.0


def min_recall(sc: dict) -> float:
    return min(sc[t]["recall"] for t in GOAL_TYPES if sc.get(t, {}).get("gold"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="first N documents only")
    ap.add_argument("--files", default=",".join(FILES))
    ap.add_argument("--prose-mb", type=float, default=0.0, help="also time N MB of real documentation")
    args = ap.parse_args(argv)
    docs = load(args.files.split(","), args.limit)
    texts = [d["text"] for d in docs]

    t0 = time.perf_counter()
    detector = PiiDetector()
    build_s = time.perf_counter() - t0
    stock = build_analyzer(build_recognizers(widen=False))
    # first use compiles Presidio's regexes and loads phonenumbers' region metadata: not part of the rate
    warm = texts[:200]
    detector.detect(warm), plain(detector.analyzer, warm), plain(stock, warm)

    # batch by batch, each detector in turn on the same batch: load from other processes on a shared
    # machine then slows all of them alike instead of skewing the ratio
    ours: list[list[Entity]] = []
    same_preds: list[list[Entity]] = []
    stock_preds: list[list[Entity]] = []
    ours_s = same_s = stock_s = 0.0
    analysed = 0
    for i in range(0, len(texts), 256):  # the stage's batches
        batch = texts[i : i + 256]
        t0 = time.perf_counter()
        ours.extend(detector.detect(batch))
        ours_s += time.perf_counter() - t0
        analysed += detector.chars_analysed
        preds, seconds = plain(detector.analyzer, batch)  # the same recognizers, the plain way
        same_preds.extend(preds)
        same_s += seconds
        preds, seconds = plain(stock, batch)  # Presidio's own recognizers
        stock_preds.extend(preds)
        stock_s += seconds

    gold_types = {label for d in docs for _, _, label in d["gold"]}
    types = sorted(gold_types & set(detector.entities))
    runs = {"tokenmill": ours, "presidio (same recognizers)": same_preds, "presidio (its own)": stock_preds}
    scores = {name: score(docs, preds, types) for name, preds in runs.items()}
    identical = sum(a == b for a, b in zip(ours, same_preds, strict=True))

    print(f"{len(docs)} documents ({sum(map(len, texts)) / 1e6:.2f} M chars) from {args.files}; "
          f"score threshold {SCORE_THRESHOLD}; overlap matching; detector built in {build_s:.1f} s")
    head = " | ".join(f"{n[:26]:^26}" for n in runs)
    print(f"{'type':<18} {'gold':>6} | {head}")
    print(f"{'':<18} {'':>6} | " + " | ".join(f"{'recall':>8} {'prec':>8} {'pred':>8}" for _ in runs))
    for t in sorted(set().union(*scores.values())):
        gold = max(sc.get(t, {}).get("gold", 0) for sc in scores.values())
        cells = [(sc.get(t, {}).get("recall"), sc.get(t, {}).get("precision"), sc.get(t, {}).get("predicted", 0))
                 for sc in scores.values()]
        print(f"{t:<18} {gold:>6} | " + " | ".join(f"{fmt(r):>8} {fmt(p):>8} {n:>8}" for r, p, n in cells))
    for name, sc in scores.items():
        print(f"{name:<28} precision {overall_precision(sc):.4f}   min recall (6 goal types) {min_recall(sc):.4f}")
    ratio = same_s / ours_s
    chars = max(sum(map(len, texts)), 1)
    print(f"speed: tokenmill {len(docs) / ours_s:.1f} docs/s; presidio with the same recognizers "
          f"{len(docs) / same_s:.1f} docs/s (ratio {ratio:.2f}x); presidio with its own recognizers "
          f"{len(docs) / stock_s:.1f} docs/s (ratio {stock_s / ours_s:.2f}x)")
    print(f"candidate windows hold {analysed / chars:.1%} of the characters; "
          f"spans identical to presidio (same recognizers) on {identical}/{len(docs)} documents")
    ours_sc, stock_sc = scores["tokenmill"], scores["presidio (its own)"]
    prose = time_prose(detector, args.prose_mb) if args.prose_mb else None
    print(json.dumps({
        "docs": len(docs), "min_recall": round(min_recall(ours_sc), 4),
        "precision": round(overall_precision(ours_sc), 4), "ratio": round(ratio, 2),
        "docs_per_s": round(len(docs) / ours_s, 1), "presidio_docs_per_s": round(len(docs) / same_s, 1),
        "identical_docs": identical,
        "recall": {t: round(ours_sc[t]["recall"], 4) for t in GOAL_TYPES if ours_sc.get(t, {}).get("gold")},
        "presidio_own": {"min_recall": round(min_recall(stock_sc), 4),
                         "precision": round(overall_precision(stock_sc), 4),
                         "recall": {t: round(stock_sc[t]["recall"], 4) for t in GOAL_TYPES
                                    if stock_sc.get(t, {}).get("gold")}},
        **({"prose": prose} if prose else {}),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
