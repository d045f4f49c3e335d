"""Helpers shared by the benchmarks: where the shared corpora are, reading JSONL.gz texts."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPORA = REPO.parent / "shared" / "corpora"


def read_texts(paths: list[Path], limit_bytes: int | None = None, field: str = "text") -> list[str]:
    texts, size = [], 0
    for path in paths:
        for rec in iter_jsonl(path):
            text = rec.get(field)
            if isinstance(text, str) and text.strip():
                texts.append(text)
                size += len(text)
                if limit_bytes and size >= limit_bytes:
                    return texts
    return texts


def iter_jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def default_paths(*relative: str) -> list[Path]:
    return [CORPORA / r for r in relative if (CORPORA / r).exists()]


def emit_json(result: dict, path: Path | None = None) -> None:
    """A bench's result as its last stdout line (what scripts read), and in ``path`` too when given."""
    line = json.dumps(result)
    if path:
        path.write_text(line + "\n")
    print(line)
