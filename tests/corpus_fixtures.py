"""Small generated corpora for tests (the shared corpora may be absent on a fresh machine)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

WORDS = (
    "the of and to in is was for that with as on by at from his her which are be this an not or have one had "
    "river mountain engine packet kernel garden lantern harbor violin copper meadow signal archive thunder "
    "quietly rapidly under over between because however although therefore whenever village compiler queue "
    "token shard sequence window matrix protocol silver orchard ledger canyon beacon mosaic glacier velvet"
).split()


def make_text(rng: random.Random, n_words: int) -> str:
    out, line = [], []
    for i in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) >= rng.randint(6, 14) or i == n_words - 1:
            out.append(" ".join(line).capitalize() + ".")
            line = []
    return " ".join(out)


def write_jsonl(path: Path, records: list[dict], compress: bool = False) -> Path:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return path


def clean_corpus(folder: Path, n_docs: int = 300, seed: int = 0) -> list[dict]:
    """Two files of varied-length documents (some longer than a sequence), ids unique."""
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        n = rng.choice([5, 20, 60, 150, 400]) + rng.randint(0, 30)
        docs.append({"id": f"doc-{i}", "text": make_text(rng, n)})
    half = n_docs // 2
    write_jsonl(folder / "a.jsonl", docs[:half])
    write_jsonl(folder / "b.jsonl.gz", docs[half:], compress=True)
    return docs
