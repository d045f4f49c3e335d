"""Read throughput of pipeline.readers per format, and the WARC extraction settings against trafilatura's
defaults on the Article Extraction Benchmark pages (speed and word-level F1 against the gold text).

Formats: a JSONL.gz from the corpora as is; the same records re-encoded (in a temp folder) as JSONL.zst,
Parquet and a folder of .txt files; the WARC file. The peer for JSONL is a bare `gzip` + `json.loads`
loop (no validation, no ids, no meta); the peer for WARC is `trafilatura.extract` with its default
options (the readers use `fast=True`, no comments). Ratio = readers' WARC pages/s / peer pages/s.

    .venv/bin/python bench/readers.py [--data ../shared/corpora]
"""

from __future__ import annotations

import sys  # noqa: I001  (first: bench/ holds a tokenize.py that must not shadow the stdlib one)
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]
sys.path.insert(0, str(_BENCH.parent))

import argparse
import gzip
import json
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import zstandard  # noqa: E402
from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from bench.common import CORPORA, emit_json  # noqa: E402
from pipeline.documents import Drop  # noqa: E402
from pipeline.readers import expand_inputs, read_file  # noqa: E402
from pipeline.readers.warc import TRAFILATURA_OPTIONS  # noqa: E402
from pipeline.spec import InputSpec  # noqa: E402


def read_all(path: str, fmt: str = "auto") -> tuple[int, int, int]:
    """(docs, drops, text bytes) for every file an input names."""
    docs = drops = size = 0
    for file_index, spec, p in expand_inputs([InputSpec(path=path, format=fmt)]):
        for item in read_file(file_index, p, spec):
            if isinstance(item, Drop):
                drops += 1
            else:
                docs += 1
                size += len(item["text"].encode())
    return docs, drops, size


def timed(fn: Callable[[], tuple], repeat: int) -> tuple[float, tuple]:
    best, out = float("inf"), ()
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def bare_jsonl(path: Path) -> tuple[int, int, int]:
    n = size = 0
    with gzip.open(path, "rb") as fh:
        for line in fh:
            n += 1
            size += len(json.loads(line)["text"].encode())
    return n, 0, size


def word_f1(got: str, gold: str) -> float:
    a, b = Counter(re.findall(r"\w+", got.lower())), Counter(re.findall(r"\w+", gold.lower()))
    common = sum((a & b).values())
    if not common:
        return 0.0
    p, r = common / sum(a.values()), common / sum(b.values())
    return 2 * p * r / (p + r)


def warc_pages(path: Path) -> list[tuple[str, str | None, bytes]]:
    pages = []
    with open(path, "rb") as fh:
        for rec in ArchiveIterator(fh):
            if rec.rec_type == "response":
                pages.append((rec.rec_headers.get_header("X-Gold-Id") or "",
                              rec.rec_headers.get_header("WARC-Target-URI"), rec.content_stream().read()))
    return pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=CORPORA, help="the shared corpora folder")
    ap.add_argument("--jsonl", default="english/manpages_en.jsonl.gz", help="JSONL.gz under --data")
    ap.add_argument("--warc", default="web/aeb_pages.warc.gz", help="WARC under --data")
    ap.add_argument("--gold", default="web/html_gold_aeb.jsonl.gz", help="gold texts for the WARC pages")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    jsonl, warc, gold_path = args.data / args.jsonl, args.data / args.warc, args.data / args.gold
    if not jsonl.exists() or not warc.exists():
        sys.exit(f"no data under {args.data}: pass --data (the shared corpora folder)")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        records = [json.loads(line) for line in gzip.open(jsonl, "rb")]
        body = b"".join(json.dumps(r).encode() + b"\n" for r in records)
        zst = Path(tmp) / "docs.jsonl.zst"
        zst.write_bytes(zstandard.ZstdCompressor(level=3).compress(body))
        parquet = Path(tmp) / "docs.parquet"
        pq.write_table(pa.Table.from_pylist(records), parquet)
        txt = Path(tmp) / "txt"
        txt.mkdir()
        for i, r in enumerate(records[:3000]):
            (txt / f"{i:05d}.txt").write_text(r["text"], encoding="utf-8")
        cases = [
            ("jsonl.gz", lambda: read_all(str(jsonl))),
            ("jsonl.gz (bare gzip+json loop)", lambda: bare_jsonl(jsonl)),
            ("jsonl.zst", lambda: read_all(str(zst))),
            ("parquet", lambda: read_all(str(parquet))),
            ("text folder (3000 files)", lambda: read_all(str(txt))),
            ("warc.gz (trafilatura fast)", lambda: read_all(str(warc))),
        ]
        for name, fn in cases:
            secs, (docs, drops, size) = timed(fn, 1 if "warc" in name else args.repeat)
            rows.append((name, docs, drops, secs, docs / secs, size / secs / 1e6))

    import trafilatura

    pages = warc_pages(warc)
    gold = {}
    if gold_path.exists():
        for line in gzip.open(gold_path, "rb"):
            rec = json.loads(line)
            gold[rec["id"]] = rec["text"]
    scores = {}
    for name, options in [("readers", TRAFILATURA_OPTIONS), ("trafilatura defaults", {})]:
        t = time.perf_counter()
        texts = [(gid, trafilatura.extract(html, url=url, **options) or "") for gid, url, html in pages]
        secs = time.perf_counter() - t
        f1s = [word_f1(text, gold[gid]) for gid, text in texts if gid in gold]
        scores[name] = (len(pages) / secs, sum(f1s) / max(1, len(f1s)), len(f1s))

    print(f"{'format':34} {'docs':>7} {'drops':>6} {'seconds':>8} {'docs/s':>9} {'MB/s':>7}")
    for name, docs, drops, secs, dps, mbps in rows:
        print(f"{name:34} {docs:7d} {drops:6d} {secs:8.2f} {dps:9.0f} {mbps:7.1f}")
    print()
    print(f"{'HTML extraction':34} {'pages/s':>9} {'F1 vs gold':>11} {'pages':>6}")
    for name, (pps, f1, n) in scores.items():
        print(f"{name:34} {pps:9.1f} {f1:11.3f} {n:6d}")
    by = {name: dps for name, _, _, _, dps, _ in rows}
    ours, peer = scores["readers"], scores["trafilatura defaults"]
    emit_json({
        "bench": "readers",
        "jsonl_gz_docs_per_s": round(by["jsonl.gz"]),
        "bare_jsonl_gz_docs_per_s": round(by["jsonl.gz (bare gzip+json loop)"]),
        "jsonl_zst_docs_per_s": round(by["jsonl.zst"]),
        "parquet_docs_per_s": round(by["parquet"]),
        "text_files_docs_per_s": round(by["text folder (3000 files)"]),
        "warc_docs_per_s": round(by["warc.gz (trafilatura fast)"], 1),
        "html_pages_per_s": round(ours[0], 1),
        "peer_html_pages_per_s": round(peer[0], 1),
        "html_f1": round(ours[1], 3),
        "peer_html_f1": round(peer[1], 3),
        "ratio": round(ours[0] / peer[0], 2),
        "goal": 1.3,
    })


if __name__ == "__main__":
    main()
