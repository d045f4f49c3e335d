"""The two fast paths of the filters against the libraries they stand in for, on ``../shared/corpora`` text, in
one process: the same answers, and how much cheaper (every fast path, with its reference and its difference
test: :data:`pipeline.fast.FAST_PATHS`).

- ``lid``: :meth:`FastTextModel.best` (``pipeline/fast/fasttext_predict.py``) against fastText's own
  ``predict`` (k=1) with the bundled lid.176.ftz, batches of 256 documents as the stage runs them, on every
  document of lid/, web/, code/ and english/. Reported: CPU-seconds of each, their ratio, documents whose label
  or whose decision at ``min_score`` 0.65 differs (goal: none), the largest probability difference, and how
  many documents were handed to fastText as too close to call; ``c_splitter``: whether the token splitter's C
  extension (``kernels/text_native.c``) was built, else its Python equivalent ran.
- ``words``: :meth:`ChunkRules.split` (``pipeline/fast/spacy_rules.py``) against spaCy's tokenizer of the
  language, on the distinct chunks of those texts that are not plain words (what the cache misses), for en, de,
  ru, fr and xx. Reported per language: microseconds a chunk of each, chunks whose tokens differ (goal: none),
  and the share the port leaves to spaCy.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/fast_paths.py [--docs N] [--chunks N]``. Prints one JSON line;
keys ``lid_ratio``, ``lid_label_diffs``, ``lid_decision_diffs``, ``words_ratio`` (spaCy's time / the port's,
over every language), ``words_diffs``.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import random
import time

from bench.common import CORPORA, emit_json, iter_jsonl

GLOBS = ("lid/*.jsonl.gz", "web/*.jsonl.gz", "code/*.jsonl.gz", "english/*.jsonl.gz")


def load_texts(data: Path, limit: int) -> list[str]:
    texts: list[str] = []
    for pattern in GLOBS:
        for path in sorted(data.glob(pattern)):
            for rec in iter_jsonl(path):
                texts.append(str(rec.get("text") or ""))
                if len(texts) >= limit:
                    return texts
    return texts


def bench_lid(texts: list[str]) -> dict:
    from kernels import fasttext_tokens
    from pipeline.filters.fasttext_model import FastTextModel, default_lid_model

    model = FastTextModel(default_lid_model())
    native = model.predict
    asked = 0

    def counting(batch, k=1):
        nonlocal asked
        asked += len(batch)
        return native(batch, k)

    t_native = t_fast = 0.0
    labels = decisions = 0
    worst = 0.0
    for start in range(0, len(texts), 256):
        batch = texts[start : start + 256]
        t = time.process_time()
        want = native(batch, k=1)
        t_native += time.process_time() - t
        model.predict = counting  # type: ignore[method-assign]
        t = time.process_time()
        got = model.best(batch, cutoffs=(0.65,))
        t_fast += time.process_time() - t
        model.predict = native  # type: ignore[method-assign]
        for w, g in zip(want, got, strict=True):
            labels += (w[0][0] if w else None) != (g[0][0] if g else None)
            decisions += bool(w and w[0][1] >= 0.65) != bool(g and g[0][1] >= 0.65)
            if w and g:
                worst = max(worst, abs(w[0][1] - g[0][1]))
    return {"docs": len(texts), "native_cpu_s": round(t_native, 2), "fast_cpu_s": round(t_fast, 2),
            "ratio": round(t_native / t_fast, 2), "label_diffs": labels, "decision_diffs": decisions,
            "max_prob_diff": worst, "asked_fasttext": asked, "c_splitter": fasttext_tokens.native()}


def bench_words(texts: list[str], n: int, langs: list[str]) -> dict:
    from pipeline.fast.word_chain import WordChain

    chunks = sorted({c for t in texts for c in t.split() if not c.isalpha()})
    random.Random(0).shuffle(chunks)
    chunks = chunks[:n]
    out: dict[str, dict] = {}
    for lang in langs:
        s = WordChain(lang)
        t = time.process_time()
        ours = [s.rules.split(c) for c in chunks]
        t_rules = time.process_time() - t
        t = time.process_time()
        want = [tok for i in range(0, len(chunks), 500) for tok in s.spacy_tokens(chunks[i : i + 500])]
        t_spacy = time.process_time() - t
        diffs = [c for c, o, w in zip(chunks, ours, want, strict=True) if o is not None and o != w]
        out[lang] = {"chunks": len(chunks), "rules_us": round(t_rules / len(chunks) * 1e6, 1),
                     "spacy_us": round(t_spacy / len(chunks) * 1e6, 1), "diffs": len(diffs), "examples": diffs[:5],
                     "left_to_spacy": round(sum(o is None for o in ours) / len(chunks), 3)}
    return out


def figures(result: dict) -> dict:
    """What bench/RESULTS.md shows: the LID comparison, and per language the word splitter's ratio to spaCy."""
    out = {f"lid.{k}": v for k, v in result["lid"].items()}
    for lang, w in result["words"].items():
        out[f"words.{lang}.ratio"] = round(w["spacy_us"] / w["rules_us"], 2) if w["rules_us"] else None
        out.update({f"words.{lang}.{k}": w[k] for k in ("diffs", "left_to_spacy")})
    out.update(words_ratio=result["words_ratio"], words_diffs=result["words_diffs"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=CORPORA)
    ap.add_argument("--docs", type=int, default=10**9, help="documents for lid (default: all)")
    ap.add_argument("--chunks", type=int, default=20_000, help="distinct chunks per language for words")
    ap.add_argument("--langs", default="en,de,ru,fr,xx")
    ap.add_argument("--json", type=Path,
                    help="write the result here instead of bench/results/fast_paths_<machine>.json")
    args = ap.parse_args()
    texts = load_texts(args.data, args.docs)
    if not texts:
        sys.exit(f"no corpora under {args.data} (pass --data)")
    lid = bench_lid(texts)
    print(f"lid: {lid['docs']:,} documents, fastText {lid['native_cpu_s']} CPU-s, fast path {lid['fast_cpu_s']} "
          f"CPU-s: {lid['ratio']}x; label diffs {lid['label_diffs']}, decision diffs {lid['decision_diffs']}, "
          f"largest probability difference {lid['max_prob_diff']:.1e}, {lid['asked_fasttext']} asked of fastText")
    words = bench_words(texts, args.chunks, args.langs.split(","))
    for lang, w in words.items():
        print(f"words {lang}: {w['chunks']:,} chunks, port {w['rules_us']} us, spaCy {w['spacy_us']} us a chunk; "
              f"diffs {w['diffs']}, left to spaCy {w['left_to_spacy']:.1%}")
    rules = sum(w["rules_us"] for w in words.values())
    spacy = sum(w["spacy_us"] for w in words.values())
    result = {"bench": "fast_paths", "lid": lid, "words": words, "lid_ratio": lid["ratio"],
              "lid_label_diffs": lid["label_diffs"], "lid_decision_diffs": lid["decision_diffs"],
              "words_ratio": round(spacy / rules, 2), "words_diffs": sum(w["diffs"] for w in words.values())}
    emit_json(result, args.json, figures=figures(result))


if __name__ == "__main__":
    main()
