"""A folder or wildcard input reads only the files whose format it recognises; the rest are counted.

The case that made this rule: a staging file ``b.jsonl.next`` left in a schedule's input folder was read as
plain text and published as one 2 MB "document".
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pipeline.readers import expand_inputs, read_file
from pipeline.readers.paths import detect_format, named_by
from pipeline.spec import InputSpec
from tests.corpus_fixtures import make_text, write_jsonl


def _folder(root: Path) -> Path:
    """A folder as a user leaves it: data, a copy in progress, a binary, notes, code and OS litter."""
    root.mkdir(parents=True)
    rng = random.Random(0)
    write_jsonl(root / "a.jsonl", [{"id": f"a{i}", "text": make_text(rng, 40)} for i in range(3)])
    write_jsonl(root / "sub" / "b.jsonl.gz", [{"id": "b0", "text": make_text(rng, 40)}], compress=True)
    write_jsonl(root / "x.jsonl.next", [{"id": "n0", "text": make_text(rng, 40)}])
    (root / "notes.bin").write_bytes(bytes(range(256)) * 8)
    (root / "README").write_text("A plain note without a suffix is text.\n")
    (root / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(64))
    (root / "tool.py").write_text("def main():\n    return 'code is text'\n")
    return root


def _read(spec: InputSpec) -> tuple[list[str], Counter, dict[str, dict]]:
    ids, reasons, details = [], Counter(), {}
    for file_index, inp, path in expand_inputs([spec]):
        for item in read_file(file_index, path, inp):
            if isinstance(item, dict):
                ids.append(item["id"])
            else:
                reasons[item.reason] += 1
                details[item.doc["source"]] = {"reason": item.reason, **item.detail}
    return sorted(ids), reasons, details


def test_a_folder_reads_known_formats_and_counts_the_rest(tmp_path: Path) -> None:
    root = _folder(tmp_path / "in")
    ids, reasons, details = _read(InputSpec(path=str(root)))
    assert ids == ["README:0", "a0", "a1", "a2", "b0", "tool.py:0"]
    assert reasons == {"unknown_format": 3}
    assert details["x.jsonl.next"]["suffix"] == ".next" and details["notes.bin"]["suffix"] == ".bin"
    assert details[".DS_Store"]["reason"] == "unknown_format"  # no suffix, but binary: sniffed
    assert "format: text" in details["notes.bin"]["hint"]

    ids, reasons, _ = _read(InputSpec(path=str(root / "**")))  # a bare ** is a folder read whole: same rule
    assert reasons == {"unknown_format": 3} and "a0" in ids


def test_format_text_or_naming_the_file_reads_it(tmp_path: Path) -> None:
    root = _folder(tmp_path / "in")
    ids, reasons, _ = _read(InputSpec(path=str(root), format="text"))
    assert "x.jsonl.next:0" in ids and "a.jsonl:0" in ids and ".DS_Store:0" in ids  # every file one document
    assert reasons == {"invalid_utf8": 1}  # notes.bin, as text, is not UTF-8: counted
    ids, reasons, _ = _read(InputSpec(path=str(root / "x.jsonl.next")))  # named: the user means it
    assert ids == ["x.jsonl.next:0"] and not reasons
    ids, reasons, _ = _read(InputSpec(path=str(root / "*.next")))  # a glob naming the suffix: the same
    assert ids == ["x.jsonl.next:0"] and not reasons


@pytest.mark.parametrize(
    ("input_path", "path", "named"),
    [
        ("/d/a.log", "/d/a.log", True),
        ("/d/", "/d/a.log", False),
        ("/d/*.log", "/d/a.log", True),
        ("/d/**/*.md", "/d/x/a.md", True),
        ("/d/*", "/d/a.log", False),
        ("/d/part-*", "/d/part-1.log", False),
        ("/d/*.*", "/d/a.log", False),
        ("s3://b/p/", "s3://b/p/a.log", False),
        ("s3://b/p/*.log", "s3://b/p/a.log", True),
    ],
)
def test_named_by(input_path: str, path: str, named: bool) -> None:
    assert named_by(input_path, path) is named


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.jsonl.next", "unknown"), ("a.bin", "unknown"), ("a.csv.gz", "unknown"), ("a.md", "text"),
     ("a.txt.zst", "text"), ("a.rs", "text"), ("LICENSE", "text"), ("a.parquet", "parquet"), ("a.wet.gz", "warc")],
)
def test_detect_format_in_a_folder(name: str, fmt: str) -> None:
    assert detect_format(f"/d/{name}", "auto", named=False) == fmt
    assert detect_format(f"/d/{name}", "auto") == ("text" if fmt == "unknown" else fmt)


def test_a_schedule_on_a_folder_does_not_fingerprint_a_staging_file(tmp_path: Path) -> None:
    """A copy in progress starts no run; renamed when done, it is a new file."""
    from service.schedules import fingerprints

    root = _folder(tmp_path / "in")
    first = fingerprints.scan([InputSpec(path=str(root))], {})
    names = sorted(Path(p).name for p in first.snapshot)
    # by name only: .DS_Store (no suffix) is fingerprinted, and the run's reader sniffs and counts it
    assert names == [".DS_Store", "README", "a.jsonl", "b.jsonl.gz", "tool.py"] and first.skipped == 2
    assert first.summary()["skipped"] == 2
    again = fingerprints.scan([InputSpec(path=str(root))], {p: dict(f, racy=False) for p, f in first.snapshot.items()})
    assert again.to_read == [] and again.skipped == 2
    (root / "x.jsonl.next").rename(root / "x.jsonl")
    assert [Path(p).name for _, p in fingerprints.scan([InputSpec(path=str(root))], first.snapshot).new] == ["x.jsonl"]


def test_a_job_counts_unknown_files_in_stats_and_rejected(ray_shared, tmp_path: Path) -> None:
    from pipeline.job.engine import run_job
    from pipeline.spec import parse_spec

    root = _folder(tmp_path / "in")
    out = tmp_path / "out"
    run_job(parse_spec({"name": "formats", "inputs": [{"path": str(root)}], "stages": [], "tokenizer": None,
                        "output": {"path": str(out), "documents": "jsonl"},
                        "execution": {"batch_size": 8, "parallelism": 2}}))
    stats = json.loads((out / "stats.json").read_text())
    dropped = Counter({r: n for s in stats["stages"] for r, n in s["dropped"].items()})
    assert dropped["unknown_format"] == 3
    rows = [json.loads(line) for f in (out / "rejected").rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(r["source"] for r in rows if r["reason"] == "unknown_format") == [".DS_Store", "notes.bin",
                                                                                    "x.jsonl.next"]
    kept = [json.loads(line)["id"] for f in (out / "documents").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(kept) == ["README:0", "a0", "a1", "a2", "b0", "tool.py:0"]
