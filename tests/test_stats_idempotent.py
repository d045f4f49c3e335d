"""Counting survives Ray re-running work (issue 13): a batch reported twice is counted once, its
``rejected/`` file written once, and only losses of work (not application errors) restart curation.

No Ray node here: the stats actor's logic (:class:`StageTotals`) and the recorder run in this process.
The same batch retried by a real Ray task is tests/test_two_node.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import ray.exceptions as rex

from pipeline.job.curate import _drop_stale_rejects, lost_work
from pipeline.job.stats import StageRecorder, StageTotals, batch_key, in_reject_sample, reject_file_tag, task_key
from pipeline.stages.metrics import StageMetrics


def _metrics(values: list[float], lines: int) -> StageMetrics:
    m = StageMetrics()
    for v in values:
        m.observe("score", v)
    m.count("lines_removed", lines)
    return m


def test_a_batch_reported_again_is_counted_once() -> None:
    totals = StageTotals()
    report = {"docs_in": 100, "docs_out": 90, "dropped": {"too_short": 10}, "bytes_in": 5000, "bytes_out": 4500,
              "seconds": 0.5}
    assert totals.add("02-length", key="ords:a", metrics=_metrics([1.0, 2.0], 3), **report)
    assert totals.add("02-length", key="ords:b", metrics=_metrics([3.0], 1), **report)
    # the retry of batch a (a worker lost after it reported): same key, ignored whatever it carries
    assert not totals.add("02-length", key="ords:a", metrics=_metrics([1.0, 2.0], 3), **report)
    snap = totals.snapshot()["02-length"]
    assert (snap["docs_in"], snap["docs_out"], snap["dropped"], snap["bytes_in"], snap["bytes_out"]) == \
        (200, 180, {"too_short": 20}, 10000, 9000)
    assert snap["seconds"] == 1.0
    assert snap["counters"] == {"lines_removed": 4}
    assert snap["scores"]["score"]["count"] == 3
    assert totals.repeated() == {"02-length": 1}


def test_keys_are_per_stage_and_unkeyed_reports_always_add() -> None:
    totals = StageTotals()
    totals.add("01-normalize", key="ords:a", docs_in=10, docs_out=10)
    totals.add("02-length", key="ords:a", docs_in=10, docs_out=7)  # the same batch seen by the next stage
    totals.add("03-exact_dedup", docs_in=0, docs_out=0)  # from the driver: no task, no key
    totals.add("03-exact_dedup", docs_in=0, docs_out=0)
    snap = totals.snapshot()
    assert (snap["01-normalize"]["docs_out"], snap["02-length"]["docs_out"]) == (10, 7)
    assert "03-exact_dedup" in snap and totals.repeated() == {}


def test_reports_sent_together_count_as_if_sent_one_by_one() -> None:
    """A chain sends a batch's reports for all its stages in one call; a re-run's repeat is still ignored per
    stage and key, and a stage seen for the first time in the repeat still counts."""
    read, length = StageRecorder("00-read", None, None), StageRecorder("02-length", None, None)
    first = [read.report("ords:a", docs_in=10, docs_out=10), length.report("ords:a", docs_in=10, docs_out=7)]
    totals = StageTotals()
    totals.add_many(first)
    totals.add_many([read.report("ords:a", docs_in=10, docs_out=10), length.report("ords:b", docs_in=5, docs_out=5)])
    snap = totals.snapshot()
    assert (snap["00-read"]["docs_in"], snap["02-length"]["docs_in"], snap["02-length"]["docs_out"]) == (10, 15, 12)
    assert totals.repeated() == {"00-read": 1}


def test_a_driver_gap_counts_every_workers_wait_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's steps while no worker has a task (after a dataset is materialized, at the phase's end) cost
    every worker their wall time: counted from the last report, and never twice for one stretch of time."""
    clock = iter([100.0, 103.0, 103.0, 104.5, 110.0]).__next__
    monkeypatch.setattr("pipeline.job.stats.time.time", clock)
    totals = StageTotals()
    totals.add("07-exact_dedup", seconds=1.0, key="t1")  # a task ended at 100
    totals.driver_gap("materialize", 2)  # at 103: 3 s x 2 workers
    totals.driver_gap("materialize", 2)  # at 103 again, no report since: nothing more
    totals.add_overhead("write_parts", 0.5, "w1")  # a worker reported at 104.5
    totals.driver_gap("finish", 2)  # at 110: from 104.5
    assert totals.overheads() == {"finish": 11.0, "materialize": 6.0, "write_parts": 0.5}


def test_between_tasks_counts_the_stretches_no_task_ran_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no task of the phase ran on any worker (Ray Data starting an operator, the driver between a dedup
    stage's rounds), every worker waited: ``between_tasks``, from the moment every worker had started, never over
    a stretch a driver gap already counted."""
    now = [0.0]
    monkeypatch.setattr("pipeline.job.stats.time.time", lambda: now[0])
    totals = StageTotals()

    def report(at: float, seconds: float, key: str) -> None:
        now[0] = at
        totals.add("01-x", seconds=seconds, key=key, at=at)

    totals.add_overhead("start_workers", 2.0, "s:a", at=11.0)  # worker a waited until 11, b until 12
    totals.add_overhead("start_workers", 3.0, "s:b", at=12.0)
    report(14.0, 4.0, "k1")  # a: 10-14 (before 12, when b started, nothing is looked at)
    report(16.0, 3.0, "k2")  # b: 13-16, a idle from 14: covered by b
    report(18.0, 1.0, "k3")  # 17-18: nothing ran 16-17
    report(20.0, 2.0, "k3")  # a repeat (18-20): its work ran, its counts are not counted again
    now[0] = 30.0
    totals.driver_gap("materialize", 2)  # 18-30, counted here (12 s x 2)
    now[0] = 31.0
    totals.add_overhead("write_parts", 0.5, "w1", at=31.0)  # 30.5-31: nothing ran 30-30.5
    report(33.0, 1.0, "k4")  # 32-33: nothing ran 31-32
    out = totals.overheads(2)
    assert out["materialize"] == 24.0
    assert out["between_tasks"] == (1.0 + 0.5 + 1.0) * 2  # 16-17, 30-30.5, 31-32
    assert "between_tasks" not in totals.overheads()


def test_batch_key_names_the_documents_of_a_batch() -> None:
    assert batch_key([3, 4, 5]) == batch_key(np.array([3, 4, 5], dtype=np.int64))
    assert batch_key([3, 4, 5]) != batch_key([3, 4, 6])
    assert batch_key([3, 4, 5]) != batch_key([3, 4])
    assert task_key("02-length", "counts") is None  # outside a Ray task: nothing names the report


def test_a_batch_set_aside_twice_is_one_file(tmp_path: Path) -> None:
    rows = [{"id": "d1", "text": "x", "source": "a.jsonl", "ord": 1, "meta": "{}", "segments": None,
             "reason": "too_short", "detail": {}}]
    recorder = StageRecorder("02-length", None, str(tmp_path))
    recorder.rejects(rows, key="ords:a")
    recorder.rejects(rows, key="ords:a")  # the retried batch
    recorder.rejects(rows, key="ords:b")
    files = sorted((tmp_path / "02-length").iterdir())
    assert len(files) == 2 and all(f.name.startswith(reject_file_tag(1)) for f in files)
    assert [json.loads(line)["id"] for f in files for line in f.read_text().splitlines()] == ["d1", "d1"]
    StageRecorder("02-length", None, str(tmp_path), attempt=2).rejects(rows, key="ords:a")
    assert len(list((tmp_path / "02-length").iterdir())) == 3  # a later attempt's files are its own


def test_a_reject_sample_writes_the_same_share_of_drops_by_id(tmp_path: Path) -> None:
    """output.rejected_sample: a share of the drops chosen by id (the same on every call, and a smaller share
    keeps a subset of a larger one); the reader's malformed records are written whole."""
    rows = [{"id": f"d{i}", "text": "x", "source": "a.jsonl", "ord": i, "reason": "too_short", "detail": {}}
            for i in range(2000)]

    def written(share: float, key: str, **kw) -> set[str]:
        StageRecorder("02-length", None, str(tmp_path / str(share)), sample=share).rejects(rows, key=key, **kw)
        return {json.loads(line)["id"] for f in (tmp_path / str(share) / "02-length").iterdir()
                for line in f.read_text().splitlines()}

    tenth, half = written(0.1, "ords:a"), written(0.5, "ords:a")
    assert 140 < len(tenth) < 260 and 900 < len(half) < 1100
    assert tenth < half and tenth == {r["id"] for r in rows if in_reject_sample(r["id"], 0.1)}
    assert written(1.0, "ords:a") == {r["id"] for r in rows}
    assert written(0.1, "ords:b", sampled=False) == {r["id"] for r in rows}  # the reader's: every record
    assert all(in_reject_sample(f"d{i}", 1.0) for i in range(2000))


def test_a_later_attempt_drops_what_earlier_ones_left(tmp_path: Path) -> None:
    folder = tmp_path / "02-length"
    folder.mkdir()
    keep = folder / f"{reject_file_tag(2)}aa.jsonl"
    for name in (keep.name, f"{reject_file_tag(1)}aa.jsonl", f".{reject_file_tag(2)}bb.jsonl.123.tmp"):
        (folder / name).write_text("{}\n")
    _drop_stale_rejects(str(tmp_path), 2)
    assert [p.name for p in folder.iterdir()] == [keep.name]


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (rex.ObjectReconstructionFailedError("ab" * 28, None, ""), True),
        (rex.NodeDiedError("node 127.0.0.2 died"), True),
        (rex.WorkerCrashedError(), True),
        (rex.ActorDiedError(), True),
        (rex.OwnerDiedError("ab" * 28, None, ""), True),
        (rex.LocalRayletDiedError(), False),
        (ValueError("a stage's bug"), False),
        (rex.ActorDiedError(rex.RayTaskError("f", "tb", ValueError("bad param"))), False),  # its __init__ failed
    ],
)
def test_only_lost_work_restarts_curation(exc: BaseException, lost: bool) -> None:
    assert (lost_work(exc) is exc) is lost
    try:  # as Ray Data raises it: wrapped, the loss as the cause
        raise RuntimeError("dataset execution failed") from exc
    except RuntimeError as wrapped:
        assert (lost_work(wrapped) is exc) is lost


def test_curation_starts_over_when_ray_lost_work_and_gives_up_after_three(tmp_path: Path, monkeypatch) -> None:
    from pipeline.job import curate as curation
    from pipeline.job import events as ev
    from pipeline.job.errors import JobError

    curated, stage = tmp_path / "curated", tmp_path / "stage"
    curated.mkdir()
    attempts: list[int] = []
    fail_until = {"n": 1}

    def attempt_once(spec, curated_dir, stage_dir, par, emit, check_cancel, attempt):  # noqa: ANN001
        attempts.append(attempt)
        (Path(curated_dir) / f"part-{attempt}.parquet").write_text("x")
        (Path(stage_dir) / "rejected" / "02-length").mkdir(parents=True, exist_ok=True)
        (Path(stage_dir) / "rejected" / "02-length" / f"part-a{attempt}-x.jsonl").write_text("{}\n")
        if attempt <= fail_until["n"]:
            raise RuntimeError("dataset execution failed") from rex.ObjectReconstructionFailedError("ab" * 28, None, "")
        return {"left": sorted(p.name for p in Path(curated_dir).iterdir()),
                "rejected": sorted(p.name for p in (Path(stage_dir) / "rejected").rglob("*.jsonl"))}

    monkeypatch.setattr(curation, "_curate_once", attempt_once)
    events: list[ev.Event] = []
    record = curation.curate(None, str(curated), str(stage), 1, events.append, lambda: None)
    assert attempts == [1, 2]
    assert record == {"left": ["part-2.parquet"], "rejected": ["part-a2-x.jsonl"]}  # nothing of attempt 1 left
    assert [e.level for e in events if isinstance(e, ev.LogLine)] == ["warning"]

    attempts.clear()
    fail_until["n"] = curation.CURATE_ATTEMPTS
    with pytest.raises(JobError) as info:
        curation.curate(None, str(curated), str(stage), 1, events.append, lambda: None)
    assert attempts == [1, 2, 3] and info.value.category == "infra"

    def app_error(*args, **kwargs):  # noqa: ANN002, ANN003
        attempts.append(0)
        raise ValueError("a stage's bug")

    attempts.clear()
    monkeypatch.setattr(curation, "_curate_once", app_error)
    with pytest.raises(ValueError):
        curation.curate(None, str(curated), str(stage), 1, events.append, lambda: None)
    assert attempts == [0]  # not run again


def test_reject_lines_hold_what_json_can_and_orjson_cannot():
    """Rejected rows go out through orjson; a value it refuses (an int over 64 bits) falls back to json."""
    import json

    import numpy as np

    from pipeline.job.stats import _reject_line

    rows = [{"id": "a", "detail": {"n": np.int64(3), "arr": np.arange(2), 1: "int key"}, "text": "café"},
            {"id": "b", "detail": {"big": 2**70}, "text": "x"}]
    lines = [json.loads(_reject_line(r)) for r in rows]
    assert lines[0] == {"id": "a", "detail": {"n": 3, "arr": [0, 1], "1": "int key"}, "text": "café"}
    assert lines[1]["detail"]["big"] == 2**70
    assert all(_reject_line(r).endswith(b"\n") and _reject_line(r).count(b"\n") == 1 for r in rows)
