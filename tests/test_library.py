"""tokenmill as a library: ``tokenmill.run(spec)`` and ``tokenmill.apply(stage, docs)`` (tokenmill/).

One job (``test_run_and_apply_keep_the_same_documents``) runs a filter, an annotating filter and a transforming
stage through ``tokenmill.run``, and the same documents through ``tokenmill.apply``: the same ids, texts and
annotations come out. Everything else runs in this process, without Ray.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

import tokenmill
from tests.corpus_fixtures import make_text, write_jsonl

#: a filter in annotate mode first (its verdicts carry ``at: 1`` in a job and in apply alike), then a filter
#: that drops, then a stage that edits text
STAGES = [
    {"type": "gopher_quality", "params": {"mode": "annotate"}},
    {"type": "length", "params": {"min_chars": 80}},
    {"type": "normalize"},
]


def _docs(n: int = 48) -> list[dict]:
    rng = random.Random(7)
    docs = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            text = make_text(rng, 8)  # too short: length drops it
        elif kind == 1:
            text = "  " + make_text(rng, 40) + "\u00a0\u00a0spaced  "  # normalize edits it
        elif kind == 2:
            text = "# " + " ".join(["#tag"] * 30) + " " + make_text(rng, 30)  # gopher would drop: annotated
        else:
            text = "\n".join(make_text(rng, rng.randint(30, 60)) for _ in range(3))
        docs.append({"id": f"d{i:02d}", "text": text, "meta": {"n": i}})
    return docs


def _records(docs: list[dict]) -> list[dict]:
    """The documents as JSONL records: a record's fields besides id and text are what a reader puts in meta."""
    return [{"id": d["id"], "text": d["text"], **d["meta"]} for d in docs]


def _applied(docs: list[dict]) -> list[dict]:
    for stage in STAGES:
        docs = tokenmill.apply(stage, docs).kept
    return docs


def test_run_and_apply_keep_the_same_documents(ray_shared, tmp_path: Path) -> None:
    docs = _docs()
    write_jsonl(tmp_path / "in.jsonl", _records(docs))
    result = tokenmill.run({
        "name": "library", "inputs": [{"path": str(tmp_path / "in.jsonl")}], "stages": STAGES,
        "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 100}}, "packing": {"seq_len": 64},
        "output": {"path": str(tmp_path / "out"), "documents": "jsonl"}, "execution": {"parallelism": 1},
    })
    assert result.output == tmp_path / "out"
    assert result.stats == json.loads((tmp_path / "out" / "stats.json").read_text())
    assert result.manifest == json.loads((tmp_path / "out" / "manifest.json").read_text())
    written = [json.loads(line) for f in sorted((tmp_path / "out" / "documents").glob("part-*.jsonl"))
               for line in f.read_text().splitlines()]

    kept = _applied(docs)
    assert [d["id"] for d in kept] == [d["id"] for d in written]
    assert 0 < len(kept) < len(docs)  # the filter dropped some: a stage that kept all would prove nothing
    assert [d["text"] for d in kept] == [d["text"] for d in written]
    assert any(d["text"] != o["text"] for d in kept for o in docs if o["id"] == d["id"])  # normalize edited
    for d, w in zip(kept, written, strict=True):
        assert d["meta"] == w["meta"], (d["id"], w["id"])
    assert any(not d["meta"]["filters"]["gopher_quality"]["keep"] for d in kept)  # annotated would-drops


def test_apply_returns_kept_dropped_and_the_stage_counters() -> None:
    docs = [{"id": "a", "text": "short"}, {"text": "long enough " * 10}]
    result = tokenmill.apply({"type": "length", "params": {"min_chars": 20}}, docs)
    assert [d["id"] for d in result] == ["1"] and len(result) == 1  # an id missing: its position, as a reader's
    (dropped,) = result.dropped
    assert (dropped.doc["id"], dropped.reason, dropped.detail) == ("a", "too_short", {"scores": {"chars": 5}})
    assert result.scores["chars"]["count"] == 2

    annotated = tokenmill.apply("gopher_quality", docs, params={"mode": "annotate"})
    assert len(annotated) == 2 and not annotated.dropped
    assert annotated.counters == {"would_drop:gopher_quality:min_words": 2}
    assert "meta" not in docs[0]  # the caller's documents are left as they were


def test_apply_runs_in_batches_and_sets_a_stage_up_once() -> None:
    calls = []

    class Counting(tokenmill.Stage):
        name = "counting"

        def setup(self) -> None:
            calls.append("setup")

        def process(self, docs):
            calls.append(len(docs))
            return docs

    ready = tokenmill.stage(Counting)
    docs = [{"text": str(i)} for i in range(5)]
    assert len(tokenmill.apply(ready, docs, batch_size=2)) == 5
    assert len(tokenmill.apply(ready, docs)) == 5
    assert calls == ["setup", 2, 2, 1, 5]


@pytest.mark.parametrize(("stage", "params", "message"), [
    ({"type": "length", "params": {"min_chars": -1}}, None, "params.min_chars: Input should be greater than or equal"),
    ({"type": "lenght"}, None, "type: unknown stage 'lenght' (did you mean 'length'?"),
    ("no_such_pkg.filters:Mine", None, "type: cannot import no_such_pkg.filters: No module named 'no_such_pkg'"),
    ("json:JSONDecoder", None, "type: json:JSONDecoder is not a stage: subclass"),
    ("exact_dedup", None, "type: 'exact_dedup' needs the whole dataset on Ray"),
    (tokenmill.FilterStage, {"mode": "drop"}, "params.mode: Input should be 'filter' or 'annotate'"),
])
def test_apply_refuses_a_bad_stage_naming_the_field(stage, params, message) -> None:
    with pytest.raises(tokenmill.SpecError) as caught:
        tokenmill.apply(stage, [{"text": "x"}], params=params)
    assert str(caught.value).startswith(message), str(caught.value)


def test_run_refuses_a_bad_spec_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(tokenmill.SpecError) as caught:
        tokenmill.run({"name": "x", "inputs": [{"path": str(tmp_path / "none*.jsonl")}],
                       "stages": [{"type": "length", "params": {"min_chars": "many"}}],
                       "output": {"path": str(tmp_path / "out")}})
    lines = str(caught.value).splitlines()
    assert any(line.startswith("stages.0.params.min_chars: ") for line in lines), lines
    with pytest.raises(tokenmill.SpecError, match="cannot read"):
        tokenmill.run(tmp_path / "missing.yaml")


def test_import_tokenmill_is_cheap() -> None:
    """``import tokenmill`` (a notebook's first line) imports neither Ray nor the engine."""
    import subprocess

    code = "import sys, tokenmill; print(sorted(m for m in ('ray', 'pipeline.job.engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"
