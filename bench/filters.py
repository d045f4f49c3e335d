"""Heuristic quality filters: tokenmill's Gopher quality / repetition, C4 and FineWeb against datatrove's.

Both sides judge the same documents (a sample of ../shared/corpora: every ``english/*.jsonl.gz`` and
``code/code.jsonl.gz``, ``--mb`` megabytes spread evenly over the files, records larger than a file's share
skipped: a larger ``--mb`` takes more and larger documents). Reported per filter: documents per second on one
core for each, their ratio, and the share of documents on which both make the same keep/drop decision (plus
the same reason, and for C4 the same cleaned text). tokenmill's C4 runs with datatrove's defaults for the comparison
(``min_words_per_line: 3``, ``min_num_sentences: 5``, ``'`` as an end mark); tokenmill's own defaults (the paper's)
are reported on an extra line.

datatrove lives in its own virtualenv, ``.venv-bench`` at the repository root, created on first use from
``bench/requirements-filters.txt`` (``--setup`` only creates it): nothing is added to the project's ``.venv``.
This script runs under the project's python and starts ``.venv-bench/bin/python bench/filters.py --peer ...``
as a subprocess that runs datatrove on the same sample file and writes its verdicts and timings as JSON. The
peer mode imports nothing from tokenmill. Both processes are pinned to the same single CPU; repetitions
alternate between the two sides and the best time of each counts, so load from other processes penalizes neither
more. Each tokenmill filter starts with empty word caches (a fresh worker; in a pipeline, filters of one
worker share them).

    .venv/bin/python bench/filters.py --setup            # once, with the package registry reachable
    scripts/netns.sh .venv/bin/python bench/filters.py [--mb 4] [--repeat 2] [--show 3]

(inside the loopback-only namespace, which shows that neither side downloads anything at run time).
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import hashlib
import json
import os
import subprocess
import tempfile
import time

from bench.common import CORPORA, REPO, emit_json, iter_jsonl

VENV = REPO / ".venv-bench"
REQUIREMENTS = REPO / "bench" / "requirements-filters.txt"
FILTERS = ("gopher_quality", "gopher_repetition", "c4", "fineweb")
#: datatrove's C4QualityFilter defaults, as tokenmill params (tokenmill's own defaults are the paper's)
C4_AS_DATATROVE = {"min_words_per_line": 3, "min_num_sentences": 5, "end_marks": [".", "?", "!", '"', "'"]}

#: datatrove's reason names -> tokenmill's rule names
REASONS = {
    "gopher_short_doc": "min_words", "gopher_long_doc": "max_words",
    "gopher_below_avg_threshold": "min_avg_word_length", "gopher_above_avg_threshold": "max_avg_word_length",
    "gopher_too_many_hashes": "symbol_word_ratio", "gopher_too_many_ellipsis": "symbol_word_ratio",
    "gopher_too_many_bullets": "bullet_lines_ratio", "gopher_too_many_end_ellipsis": "ellipsis_lines_ratio",
    "gopher_below_alpha_threshold": "alpha_words_ratio", "gopher_enough_stop_words": "stop_words",
    "dup_para_frac": "dup_para_ratio", "dup_para_char_frac": "dup_para_char_ratio",
    "dup_line_frac": "dup_line_ratio", "dup_line_char_frac": "dup_line_char_ratio",
    **{f"top_{n}_gram": f"top_{n}gram_char_ratio" for n in range(2, 5)},
    **{f"duplicated_{n}_n_grams": f"dup_{n}gram_char_ratio" for n in range(5, 11)},
}


def text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def pin_one_cpu() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


# ---------------------------------------------------------------- peer side (runs in .venv-bench)


def run_peer(sample: Path, out: Path) -> None:
    """datatrove on every document, filter by filter; verdicts and seconds to ``out`` (JSON)."""
    import spacy
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.utils.text import split_into_words

    docs = [json.loads(line) for line in sample.read_text(encoding="utf-8").splitlines()]
    split_into_words("load the tokenizer before timing")
    filters = {
        "gopher_quality": GopherQualityFilter(), "gopher_repetition": GopherRepetitionFilter(),
        "c4": C4QualityFilter(), "fineweb": FineWebQualityFilter(),
    }
    result: dict = {"spacy": spacy.__version__, "filters": {}}
    for name, f in filters.items():
        verdicts = []
        t0 = time.perf_counter()
        for d in docs:
            doc = Document(text=d["text"], id=d["id"])
            v = f.filter(doc)
            keep, reason = (True, None) if v is True else (False, v[1] if isinstance(v, tuple) else None)
            verdicts.append([keep, reason, text_hash(doc.text) if name == "c4" and keep else None])
        result["filters"][name] = {"seconds": time.perf_counter() - t0, "verdicts": verdicts}
    out.write_text(json.dumps(result), encoding="utf-8")


# ---------------------------------------------------------------- tokenmill side


def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV.name} from {REQUIREMENTS.relative_to(REPO)} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    return python


def sample_docs(paths: list[Path], megabytes: float) -> list[dict]:
    """Records from every file, ``megabytes`` in all, an equal share per file; larger records skipped."""
    share = megabytes * 1e6 / len(paths)
    docs = []
    for path in paths:
        size = 0
        for i, rec in enumerate(iter_jsonl(path)):
            text = rec.get("text")
            if not isinstance(text, str) or not text.strip() or len(text) > share:
                continue
            if size + len(text) > share:
                break
            docs.append({"id": f"{path.parent.name}/{path.name.split('.')[0]}:{i}", "text": text})
            size += len(text)
    return docs


def make_stage(name: str, c4_params: dict):
    """A set-up stage with empty word caches, as in a fresh worker (each filter is timed cold)."""
    from pipeline.filters import text as textmod
    from pipeline.filters.c4 import C4Quality
    from pipeline.filters.fineweb import FineWebQuality
    from pipeline.filters.gopher import GopherQuality, GopherRepetition
    from pipeline.stages.base import StageContext

    textmod.reset_splitters()
    cls = {"gopher_quality": GopherQuality, "gopher_repetition": GopherRepetition, "c4": C4Quality,
           "fineweb": FineWebQuality}[name]
    stage = cls(cls.Params(**(c4_params if name == "c4" else {})), StageContext("bench", "", 0, ""))
    stage.setup()
    return stage


def run_ours(docs: list[dict], c4_params: dict, only: tuple[str, ...] = FILTERS) -> dict:
    """tokenmill's stages, each over every document (batches of 256 through ``run_batch``)."""
    from pipeline.stages.base import run_batch

    out = {}
    for name in only:
        stage = make_stage(name, c4_params)
        verdicts = {}
        t0 = time.perf_counter()
        for i in range(0, len(docs), 256):
            batch = [{"id": d["id"], "text": d["text"], "meta": {}} for d in docs[i : i + 256]]
            res = run_batch(stage, batch)
            for d in res.kept:
                verdicts[d["id"]] = [True, None, text_hash(d["text"]) if name == "c4" else None, {}]
            for drop in res.drops:
                rule = drop.reason.split(":", 1)[1]
                verdicts[drop.doc["id"]] = [False, rule, None, drop.detail.get("scores", {})]
        out[name] = {"seconds": time.perf_counter() - t0, "verdicts": [verdicts[d["id"]] for d in docs]}
    return out


def compare(name: str, docs: list[dict], ours: list, peer: list, show: int) -> dict:
    same = same_reason = same_text = kept_both = 0
    diffs = []
    for d, o, p in zip(docs, ours, peer, strict=True):
        if o[0] == p[0]:
            same += 1
            if o[0]:
                kept_both += 1
                same_text += name != "c4" or o[2] == p[2]
            same_reason += o[0] or REASONS.get(p[1], p[1]) == o[1]
        else:
            diffs.append((d["id"], o, p))
    for doc_id, o, p in diffs[:show]:
        print(f"  {name} differs on {doc_id}: tokenmill {'keep' if o[0] else 'drop ' + o[1]} {o[3]}, "
              f"datatrove {'keep' if p[0] else 'drop ' + str(p[1])}")
    n = len(docs)
    return {
        "agree": same / n, "same_reason": same_reason / n, "differ": len(diffs),
        "kept_ours": sum(v[0] for v in ours) / n, "kept_peer": sum(v[0] for v in peer) / n,
        "same_text": same_text / kept_both if kept_both else 1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--setup", action="store_true", help="only create .venv-bench")
    ap.add_argument("--data", nargs="*", type=Path, help="JSONL(.gz) files with a text field")
    ap.add_argument("--mb", type=float, default=4.0, help="megabytes of text in the sample")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--show", type=int, default=3, help="differing documents to print per filter")
    args = ap.parse_args()
    if args.peer:
        pin_one_cpu()
        run_peer(args.peer, args.out)
        return
    python = ensure_venv()
    if args.setup:
        return
    paths = args.data or sorted(CORPORA.glob("english/*.jsonl.gz")) + sorted(CORPORA.glob("code/*.jsonl.gz"))
    if not paths:
        sys.exit("no data: pass --data FILE.jsonl.gz (../shared/corpora not found)")
    pin_one_cpu()
    docs = sample_docs(paths, args.mb)
    import spacy

    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / "sample.jsonl"
        sample.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        best_peer: dict[str, float] = {}
        best_ours: dict[str, float] = {}
        peer = ours = None
        for _ in range(args.repeat):
            result = Path(tmp) / "peer.json"
            subprocess.run([str(python), __file__, "--peer", str(sample), "--out", str(result)], check=True,
                           cwd=REPO)
            peer = json.loads(result.read_text(encoding="utf-8"))
            ours = run_ours(docs, C4_AS_DATATROVE)
            for name in FILTERS:
                best_peer[name] = min(best_peer.get(name, 1e18), peer["filters"][name]["seconds"])
                best_ours[name] = min(best_ours.get(name, 1e18), ours[name]["seconds"])
    if peer["spacy"] != spacy.__version__:
        print(f"warning: spaCy {spacy.__version__} here, {peer['spacy']} in {VENV.name}: tokenizer rules may differ")
    c4_paper = run_ours(docs, {}, only=("c4",))["c4"]

    n, chars = len(docs), sum(len(d["text"]) for d in docs)
    print(f"{n} documents, {chars / 1e6:.1f} M characters (mean {chars / n:.0f}), one CPU, best of {args.repeat}; "
          f"datatrove {_version(python)}, spaCy {spacy.__version__}")
    stats = {name: compare(name, docs, ours[name]["verdicts"], peer["filters"][name]["verdicts"], args.show)
             for name in FILTERS}
    print(f"{'filter':18s} {'tokenmill/s':>11s} {'datatrove/s':>11s} {'ratio':>6s} {'agree':>7s} "
          f"{'reason':>7s} {'kept tm':>8s} {'kept dt':>8s}")
    ratios = {}
    for name in FILTERS:
        ours_rate, peer_rate = n / best_ours[name], n / best_peer[name]
        ratios[name] = ours_rate / peer_rate
        st = stats[name]
        print(f"{name:18s} {ours_rate:11.1f} {peer_rate:11.1f} {ratios[name]:5.1f}x {st['agree']:7.2%} "
              f"{st['same_reason']:7.2%} {st['kept_ours']:8.1%} {st['kept_peer']:8.1%}")
    print(f"c4: same cleaned text on {stats['c4']['same_text']:.2%} of the documents both keep; "
          f"tokenmill's own C4 defaults (paper: 5 words/line, 3 sentences) keep "
          f"{sum(v[0] for v in c4_paper['verdicts']) / n:.1%}")
    total = sum(best_peer.values()) / sum(best_ours.values())
    print(f"all four: {total:.1f}x the documents per second of datatrove")
    emit_json({
        "bench": "filters", "docs": n, "chars": chars, "ratio": round(total, 2),
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
        "docs_per_s": {k: round(n / v, 1) for k, v in best_ours.items()},
        "peer_docs_per_s": {k: round(n / v, 1) for k, v in best_peer.items()},
        "agree": {k: round(v["agree"], 4) for k, v in stats.items()},
        "same_reason": {k: round(v["same_reason"], 4) for k, v in stats.items()},
        "c4_same_text": round(stats["c4"]["same_text"], 4), "goal_ratio": 3, "goal_agree": 0.99,
    })


def _version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import datatrove, importlib.metadata as m; "
                          "print(m.version('datatrove'))"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    main()
