"""The demo corpus: real text of this Python installation, deterministic, capped, readable by the readers."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.demo_corpus import _python_files, build_demo_corpus
from pipeline.documents import Drop
from pipeline.readers import read_file
from pipeline.spec import InputSpec

MAX_BYTES = 2_000_000
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_demo_corpus(tmp_path_factory.mktemp("demo_a"), MAX_BYTES)


def load(paths: list[Path]) -> list[dict]:
    docs = []
    for p in paths:
        with gzip.open(p, "rt", encoding="utf-8") as fh:
            docs.extend(json.loads(line) for line in fh)
    return docs


def test_deterministic_bytes(corpus: list[Path], tmp_path: Path) -> None:
    again = build_demo_corpus(tmp_path / "b", MAX_BYTES)
    assert [p.name for p in corpus] == [p.name for p in again] == [
        "metadata.jsonl.gz", "licenses.jsonl.gz", "docstrings.jsonl.gz",
    ]
    for a, b in zip(corpus, again, strict=True):
        assert a.read_bytes() == b.read_bytes()


def test_fields_kinds_and_cap(corpus: list[Path]) -> None:
    docs = load(corpus)
    assert all(set(d) == {"id", "text", "source", "kind"} for d in docs)
    assert len({d["id"] for d in docs}) == len(docs)
    kinds = {d["kind"] for d in docs}
    assert kinds == {"metadata", "license", "docstring"}
    total = sum(len(d["text"].encode()) for d in docs)
    assert MAX_BYTES * 0.8 < total <= MAX_BYTES
    assert not any("/.venv/" in d["source"] or d["source"].startswith("/") for d in docs)


def test_contains_email_addresses(corpus: list[Path]) -> None:
    metadata = [d for d in load(corpus) if d["kind"] == "metadata"]
    assert any(EMAIL.search(d["text"]) for d in metadata)


def word_windows(text: str, n: int) -> set[int]:
    words = re.findall(r"\w+", text.lower())
    return {hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1)}


def test_contains_near_duplicates(corpus: list[Path]) -> None:
    """Two different texts that share a passage of 40 words in a row (e.g. two MIT licences)."""
    docs = [d for d in load(corpus) if d["kind"] == "license"]
    owner: dict[int, str] = {}
    pairs = set()
    for d in docs:
        for h in word_windows(d["text"], 40):
            other = owner.setdefault(h, d["text"])
            if other != d["text"]:
                pairs.add((hash(other), hash(d["text"])))
    assert pairs


def test_readers_read_it(corpus: list[Path]) -> None:
    n = 0
    for i, path in enumerate(corpus):
        for item in read_file(i, str(path), InputSpec(path=str(path))):
            assert not isinstance(item, Drop)
            n += 1
    assert n == len(load(corpus))


def test_skips_the_output_folder(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text('"""doc"""\n')
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "b.py").write_text('"""doc"""\n')
    (tmp_path / "z.py").write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in _python_files(tmp_path, tmp_path / "out")]
    assert found == ["z.py", "pkg/a.py"]


def test_command_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.demo_corpus", str(tmp_path / "c"), "--max-bytes", "300000"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("documents") == 3
    bad = subprocess.run(
        [sys.executable, "-m", "pipeline.demo_corpus", str(tmp_path / "d"), "--max-bytes", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and "--max-bytes must be positive" in bad.stderr
