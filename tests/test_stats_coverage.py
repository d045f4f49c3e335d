"""stats.json explains where a job's time went: ``coverage``, the measured seconds over each phase's worker-seconds.

A small job with filters, PII and both dedup stages on a local two-worker Ray: every stage's ``seconds`` (its
batches, its workers' setup and the start of the worker processes it was the first in, every task of a dedup
stage: bands, verification, components, routing), curation's ``write_parts`` and the write phase's tasks, idle
workers and Ray's dispatch are counted once each, so they add up to no more than the worker-seconds of each phase
(wall x parallelism) and to nearly all of them. On a job this small, worker processes' starts are a fifth of the
curation phase and the tail of the write phase is workers with nothing left to do: before they were measured,
stats.json explained 0.58 of the curation phase and 0.36-0.57 of the write phase.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.job.engine import run_job
from pipeline.spec import parse_spec
from tests.corpus_fixtures import make_text, write_jsonl

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _corpus(folder: Path, n_docs: int) -> None:
    rng = random.Random(24)
    docs, base = [], []
    for i in range(n_docs):
        if base and i % 10 == 0:
            text = rng.choice(base)  # an exact copy
        elif base and i % 10 == 1:
            words = rng.choice(base).split()
            words[rng.randrange(len(words))] = "changed"
            text = " ".join(words)  # a near copy
        else:
            text = "\n\n".join(make_text(rng, rng.randint(60, 160)) for _ in range(rng.randint(2, 6)))
            base.append(text)
        docs.append({"id": f"d{i}", "text": text})
    for k in range(4):
        write_jsonl(folder / f"part-{k}.jsonl", docs[k::4])


def test_stage_seconds_cover_each_phase(ray_local, tmp_path):
    _corpus(tmp_path / "in", 6000)
    out = tmp_path / "out"
    run_job(parse_spec({
        "name": "coverage",
        "inputs": [{"path": str(tmp_path / "in" / "*.jsonl"), "format": "jsonl"}],
        "stages": [{"type": t} for t in ("normalize", "gopher_repetition", "gopher_quality", "c4", "fineweb",
                                          "pii", "exact_dedup")] + [{"type": "near_dedup"}],
        "tokenizer": {"train": {"vocab_size": 400}},
        "output": {"path": str(out)},
        "execution": {"parallelism": 2},
    }))
    stats = json.loads((out / "stats.json").read_text())
    by_stage = {s["stage"]: s for s in stats["stages"]}
    assert by_stage["07-exact_dedup"]["dropped"] and by_stage["08-near_dedup"]["dropped"]  # dedup did work
    assert by_stage["08-near_dedup"]["seconds"] > 0 and by_stage["07-exact_dedup"]["seconds"] > 0
    coverage, overhead = stats["coverage"], stats["overhead"]
    assert set(coverage) == {"curation", "tokenize_pack_write"}
    assert overhead["curation"]["write_parts"] > 0
    # the workers' wait for Ray Data's start, for the driver after each materialized dataset and at the end, and
    # where no task of the phase ran anywhere
    assert {"start_workers", "materialize", "finish", "between_tasks"} <= set(overhead["curation"])
    assert overhead["curation"]["start_workers"] > 0 and min(overhead["curation"].values()) >= 0
    write = overhead["tokenize_pack_write"]
    assert set(write) == {"idle", "dispatch"} and min(write.values()) >= 0
    tokenize = by_stage["90-tokenize"]
    assert sum(tokenize["steps"].values()) == pytest.approx(tokenize["seconds"], abs=0.01)  # every task, by step
    curate = sum(s["seconds"] for k, s in by_stage.items() if k != "90-tokenize") + sum(overhead["curation"].values())
    assert coverage["curation"] == pytest.approx(curate / (stats["seconds"]["curation"] * 2), abs=1e-3)
    assert coverage["tokenize_pack_write"] == pytest.approx(
        (tokenize["seconds"] + sum(write.values())) / (stats["seconds"]["tokenize_pack_write"] * 2), abs=1e-3)
    # counted once each: never more than the workers had, and nearly all of it (what curation leaves out is a
    # worker's wait while another one works: Ray's dispatch of its next task, the end of a pool's work)
    assert 0.9 <= coverage["curation"] <= 1.05, (coverage, stats["seconds"], overhead)
    assert 0.9 <= coverage["tokenize_pack_write"] <= 1.05, (coverage, stats["seconds"], overhead)
