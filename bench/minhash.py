"""MinHash signatures per second: kernels.minhash against datasketch, same shingles, same num_perm, one core.

Documents: ~2 KB windows cut from English text of ../shared/corpora (or --data). Both sides go from
text to a 128-value signature: datasketch as its users run it (the same word-5-gram shingles, built in
Python, then ``MinHash.update_batch``, SHA-1), tokenmill with ``MinHasher.signatures`` on batches.
The process is pinned to one CPU. Repetitions alternate between the two and the best of each counts,
so that load from other processes penalizes neither side more. The sha1 row is tokenmill with
datasketch's hash function (signatures equal to datasketch's, checked here on a sample).
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from datasketch import MinHash  # noqa: E402

from bench.common import default_paths, emit_json, read_texts  # noqa: E402
from kernels.minhash import MinHasher  # noqa: E402


def windows(texts: list[str], size: int, count: int) -> list[str]:
    """Cut texts into ``size``-character windows (at a space), ``count`` of them."""
    out = []
    for text in texts:
        pos = 0
        while pos + size <= len(text) and len(out) < count:
            end = text.rfind(" ", pos + size // 2, pos + size)
            end = end if end > pos else pos + size
            out.append(text[pos:end])
            pos = end
        if len(out) >= count:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", type=Path, help="JSONL(.gz) files with a text field")
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--doc-chars", type=int, default=2048)
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--batch", type=int, default=512, help="documents per kernel call")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer-docs", type=int, default=1500, help="documents datasketch signs per repetition")
    args = ap.parse_args()
    paths = args.data or default_paths(
        "english/manpages_en.jsonl.gz", "english/python_docs.jsonl.gz", "english/usr_share_doc.jsonl.gz",
        "english/debian_handbook.jsonl.gz",
    )
    if not paths:
        sys.exit("no data: pass --data FILE.jsonl.gz (../shared/corpora not found)")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    docs = windows(read_texts(paths, limit_bytes=args.docs * args.doc_chars * 3), args.doc_chars, args.docs)
    if not docs:
        sys.exit("no documents of the requested size in the data")
    peer_docs = docs[: args.peer_docs]
    fast = MinHasher(num_perm=args.num_perm)
    sha1 = MinHasher(num_perm=args.num_perm, hashfunc="sha1")

    def run_kernel(mh: MinHasher, texts: list[str]) -> float:
        t0 = time.perf_counter()
        for i in range(0, len(texts), args.batch):
            mh.signatures(texts[i : i + args.batch])
        return len(texts) / (time.perf_counter() - t0)

    def run_peer(texts: list[str], with_shingling: bool) -> float:
        shingles = None if with_shingling else [fast.shingles(t) for t in texts]
        t0 = time.perf_counter()
        for k, text in enumerate(texts):
            m = MinHash(num_perm=args.num_perm)
            m.update_batch(fast.shingles(text) if with_shingling else shingles[k])
        return len(texts) / (time.perf_counter() - t0)

    # correctness first: the sha1 kernel reproduces datasketch on a sample
    sample = peer_docs[:50]
    for text, sig in zip(sample, sha1.signatures(sample), strict=True):
        ref = MinHash(num_perm=args.num_perm)
        ref.update_batch(fast.shingles(text))
        if not np.array_equal(ref.hashvalues, sig):
            sys.exit("sha1 kernel signatures differ from datasketch: not benchmarking")

    best = {"fast": 0.0, "sha1": 0.0, "peer": 0.0, "peer_update_only": 0.0}
    for _ in range(args.repeat):
        best["peer"] = max(best["peer"], run_peer(peer_docs, True))
        best["fast"] = max(best["fast"], run_kernel(fast, docs))
        best["peer_update_only"] = max(best["peer_update_only"], run_peer(peer_docs, False))
        best["sha1"] = max(best["sha1"], run_kernel(sha1, docs[: len(peer_docs)]))

    mean_chars = sum(map(len, docs)) / len(docs)
    ratio = best["fast"] / best["peer"]
    print(f"{len(docs)} documents, mean {mean_chars:.0f} chars, num_perm {args.num_perm}, one CPU, "
          f"best of {args.repeat}")
    print(f"{'method':58s} {'docs/s':>10s} {'vs datasketch':>14s}")
    rows = [
        ("datasketch: python shingles + MinHash.update_batch (sha1)", best["peer"]),
        ("datasketch: MinHash.update_batch only (shingles prebuilt)", best["peer_update_only"]),
        ("tokenmill kernel, hashfunc=sha1 (equal to datasketch)", best["sha1"]),
        ("tokenmill kernel, hashfunc=fast (default)", best["fast"]),
    ]
    for name, value in rows:
        print(f"{name:58s} {value:10.0f} {value / best['peer']:13.1f}x")
    emit_json({
        "bench": "minhash", "docs": len(docs), "doc_chars": round(mean_chars), "num_perm": args.num_perm,
        "docs_per_s": round(best["fast"]), "peer_docs_per_s": round(best["peer"]),
        "peer_update_only_docs_per_s": round(best["peer_update_only"]),
        "sha1_docs_per_s": round(best["sha1"]), "ratio": round(ratio, 1),
        "ratio_vs_update_only": round(best["fast"] / best["peer_update_only"], 1), "goal": 10,
    })


if __name__ == "__main__":
    main()
