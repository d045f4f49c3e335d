"""Dedup through the whole job (run_job): counts in stats.json, rejects, the index, and a refresh."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.job.engine import run_job
from pipeline.spec import parse_spec
from tests.corpus_fixtures import write_jsonl
from tests.test_dedup_stages import edit, random_text

pytestmark = pytest.mark.ray


def _spec(inputs: Path, out: Path, near: dict | None = None, exact: dict | None = None):
    return parse_spec({
        "name": "dedup",
        "inputs": [{"path": str(inputs)}],
        "stages": [{"type": "normalize"}, {"type": "exact_dedup", "params": exact or {}},
                   {"type": "near_dedup", "params": {"threshold": 0.7, **(near or {})}}],
        "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 200}},
        "packing": {"seq_len": 256},
        "output": {"path": str(out), "samples_per_shard": 16},
        "execution": {"batch_size": 32},
    })


def _rejected(out: Path, key: str) -> dict[str, dict]:
    return {r["id"]: r for f in sorted((out / "rejected" / key).glob("*.jsonl"))
            for r in map(json.loads, f.read_text().splitlines())}


def test_dedup_stages_in_a_job_and_a_refresh(ray_shared, tmp_path: Path) -> None:
    rng = random.Random(5)
    texts = [random_text(rng, 120) for _ in range(40)]
    a = [{"id": f"a{i}", "text": t} for i, t in enumerate(texts)]
    b = [{"id": "b0", "text": texts[3]}, {"id": "b1", "text": edit(rng, texts[8], 0.01)},
         {"id": "b2", "text": random_text(rng, 120)}]
    write_jsonl(tmp_path / "in1" / "a.jsonl", a)
    write_jsonl(tmp_path / "in1" / "b.jsonl", b)
    first = run_job(_spec(tmp_path / "in1", tmp_path / "out1"))

    stats = {s["stage"]: s for s in json.loads((first.output_dir / "stats.json").read_text())["stages"]}
    assert stats["02-exact_dedup"]["dropped"] == {"exact_duplicate": 1}
    assert stats["03-near_dedup"]["dropped"] == {"near_duplicate": 1}
    assert stats["03-near_dedup"]["docs_out"] == 41
    assert _rejected(first.output_dir, "02-exact_dedup")["b0"]["kept_id"] == "a3"
    assert _rejected(first.output_dir, "03-near_dedup")["b1"]["kept_id"] == "a8"
    for stage in ("exact_dedup", "near_dedup"):
        assert (first.output_dir / "index" / stage / "meta.json").is_file()

    # a refresh: new inputs checked against what the first job published, old corpus untouched
    c = [{"id": "c0", "text": texts[10]}, {"id": "c1", "text": edit(rng, b[2]["text"], 0.01)},
         {"id": "c2", "text": random_text(rng, 120)}]
    write_jsonl(tmp_path / "in2" / "c.jsonl", c)
    against = {"dedup_against": str(first.output_dir)}
    second = run_job(_spec(tmp_path / "in2", tmp_path / "out2", near=against, exact=against))
    stats = {s["stage"]: s for s in json.loads((second.output_dir / "stats.json").read_text())["stages"]}
    assert stats["02-exact_dedup"]["dropped"] == {"exact_duplicate_of_published": 1}
    assert stats["03-near_dedup"]["dropped"] == {"near_duplicate_of_published": 1}
    assert stats["03-near_dedup"]["docs_out"] == 1
    assert _rejected(second.output_dir, "03-near_dedup")["c1"]["kept_id"] == "b2"
