"""One fold of a job's events (issue 21): :class:`pipeline.job.fold.JobSummary` over a recorded sequence as the
service stores it (a failed attempt, then a resumed one that keeps a shard), checked against the summary the
API shows, folded whole or in the supervisor's chunks, and the same figures the CLI's view reads."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from pipeline.job import events as ev
from pipeline.job.fold import SERIES_POINTS, JobSummary
from service.api.schemas import JobDetail
from service.progress import JobView
from service.runner.summary import fold, fold_all

STAGES = {"00-read": {"docs_in": 500, "docs_out": 500, "dropped": {}},
          "01-exact_dedup": {"docs_in": 500, "docs_out": 450, "dropped": {"exact_duplicate": 50}}}


def _shard(i: int, tokens: int, ts: float, writer: str, reused: bool = False) -> ev.ShardWritten:
    return ev.ShardWritten(name=f"shards/shard-{i:06d}.tar", sha256=str(i) * 64, samples=8, tokens=tokens,
                           writer=writer, reused=reused, ts=ts)


FIRST = [  # attempt 1: curate and tokenizer finish, one shard, then the worker is lost
    ev.StateChanged(state="RUNNING", attempt=1, ts=999.0),
    ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=2, ts=1000.0),
    ev.PhaseChanged(phase="curate", state="started", ts=1000.0),
    ev.PhaseProgress(phase="curate", done=500, total=None, unit="docs", ts=1002.0),
    ev.StageCounters(stages=STAGES, ts=1004.0),
    ev.PhaseChanged(phase="curate", state="finished", seconds=4.0, ts=1004.0),
    ev.PhaseChanged(phase="tokenizer", state="started", ts=1004.0),
    ev.PhaseChanged(phase="tokenizer", state="finished", seconds=1.0, ts=1005.0),
    ev.PhaseChanged(phase="write", state="started", ts=1005.0),
    _shard(0, 1000, 1007.0, "h:1"),
    ev.LogLine(level="warning", message="a worker died", ts=1007.5),
    ev.JobFailed(category="infra", message="worker lost", phase="write", ts=1008.0),
]
SECOND = [  # attempt 2 resumes: finished phases skipped, the first shard kept, one more written
    ev.StateChanged(state="QUEUED", attempt=1, message="resuming", ts=1009.0),
    ev.StateChanged(state="RUNNING", attempt=2, ts=1999.0),
    ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=2, resumed_phases=("curate", "tokenizer"),
                  ts=2000.0),
    ev.PhaseChanged(phase="curate", state="skipped", seconds=4.0, ts=2000.0),
    ev.PhaseChanged(phase="tokenizer", state="skipped", seconds=1.0, ts=2000.0),
    ev.PhaseChanged(phase="write", state="started", ts=2000.0),
    _shard(0, 1000, 2000.5, "h:1", reused=True),
    _shard(1, 1200, 2002.0, "h:2"),
    ev.PhaseProgress(phase="write", done=2, total=2, unit="ranges", ts=2002.0),
    ev.PhaseChanged(phase="write", state="finished", seconds=2.5, ts=2002.5),
    ev.PhaseChanged(phase="finalize", state="started", ts=2002.5),
    ev.PhaseChanged(phase="finalize", state="finished", seconds=0.5, ts=2003.0),
    ev.JobFinished(output="/o", shards=2, samples=16, tokens=2200, documents=450, seconds=3.0, ts=2003.0),
]

AFTER_FIRST = {
    "attempt": 1, "started_ts": 1000.0, "phase": "write",
    "phases": {"curate": {"state": "finished", "seconds": 4.0, "started_ts": 1000.0},
               "tokenizer": {"state": "finished", "seconds": 1.0, "started_ts": 1004.0},
               "write": {"state": "started", "seconds": 0.0, "started_ts": 1005.0}},
    "progress": {"curate": {"done": 500, "total": None, "unit": "docs", "per_s": 250.0}},
    "stages": STAGES, "shards": {"written": 1, "reused": 0, "total": None}, "samples": 8, "tokens": 1000,
    "documents": None, "throughput": {"docs_per_s": 250.0, "tokens_per_s": 500.0},
    "seconds": {"curate": 4.0, "tokenizer": 1.0}, "resumed_phases": [], "parallelism": 2, "new_tokens": 1000,
    "writers": ["h:1"], "series": {"docs": [[2.0, 500]], "tokens": [[7.0, 1000]]}, "finished": False, "ray": None,
    "error": {"category": "infra", "message": "worker lost", "phase": "write"},
}
AFTER_SECOND = {
    "attempt": 2, "started_ts": 2000.0, "phase": None,
    "phases": {"curate": {"state": "skipped", "seconds": 4.0}, "tokenizer": {"state": "skipped", "seconds": 1.0},
               "write": {"state": "finished", "seconds": 2.5, "started_ts": 2000.0},
               "finalize": {"state": "finished", "seconds": 0.5, "started_ts": 2002.5}},
    "progress": {"write": {"done": 2, "total": 2, "unit": "ranges", "per_s": 1.0}},
    "stages": {}, "shards": {"written": 1, "reused": 1, "total": 2}, "samples": 16, "tokens": 2200,
    "documents": 450, "throughput": {"docs_per_s": None, "tokens_per_s": 600.0},  # new tokens / write seconds
    "seconds": {"curate": 4.0, "tokenizer": 1.0, "write": 2.5, "finalize": 0.5, "total": 3.0},
    "resumed_phases": ["curate", "tokenizer"], "parallelism": 2, "new_tokens": 1200, "writers": ["h:1", "h:2"],
    "series": {"docs": [], "tokens": [[2.0, 1200]]}, "finished": True, "ray": None,
}


def _stored(events: list[ev.Event]) -> list[dict]:
    """The events as the store keeps them and the event stream sends them (each with its ``attempt``)."""
    return [{**ev.to_dict(e), "attempt": 2} for e in events]


def test_a_failed_then_resumed_job_folds_to_the_summary_the_api_shows():
    s = JobSummary()
    for e in FIRST:
        s.apply(e)
    assert s.to_dict() == AFTER_FIRST
    for e in SECOND:
        s.apply(e)
    assert s.to_dict() == AFTER_SECOND
    assert JobSummary.from_dict(s.to_dict()) == s

    # the service: stored dicts parsed back into typed events, folded one record or one chunk at a time
    one_by_one: dict = {"attempt": 0}
    for rec in _stored(FIRST + SECOND):
        one_by_one = fold(one_by_one, rec)
    chunked = fold_all(fold_all({"attempt": 0}, _stored(FIRST)), _stored(SECOND))
    assert one_by_one == chunked == AFTER_SECOND

    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = SimpleNamespace(id="j1", name="j", state="SUCCEEDED", attempt=2, output_path="/o", created_at=now,
                          team="default", updated_at=now, started_at=now, finished_at=now, failure_category=None,
                          error_message=None, summary=chunked, spec={})
    shown = JobDetail.of_job(row, []).model_dump(mode="json")
    assert {k: shown[k] for k in ("phase", "shards", "samples", "tokens", "documents", "throughput", "timings",
                                  "resumed_phases", "progress", "series")} == {
        "phase": None, "shards": {"done": 2, "written": 1, "reused": 1, "total": 2}, "samples": 16, "tokens": 2200,
        "documents": 450, "throughput": {"docs_per_s": None, "tokens_per_s": 600.0},
        "timings": AFTER_SECOND["seconds"], "resumed_phases": ["curate", "tokenizer"],
        "progress": AFTER_SECOND["progress"], "series": AFTER_SECOND["series"]}
    assert shown["phases"]["curate"] == {"state": "skipped", "seconds": 4.0}


def test_the_cli_view_reads_the_same_summary():
    view = JobView()
    for e in FIRST + SECOND:
        view.apply(e)
    assert view.summary.to_dict() == AFTER_SECOND
    assert [ph.state for ph in view.phases.values()] == ["skipped", "skipped", "finished", "finished"]
    assert view.write_text() == "2 shard(s) (1 kept from an earlier run), 2.2k tokens, 480 tokens/s, 2 writers"


def test_before_job_started_only_the_attempt_and_a_refusal_are_kept():
    refused = fold({"attempt": 1}, ev.to_dict(ev.JobFailed(category="validation", message="bad spec", ts=5.0)))
    assert refused == {"attempt": 1, "error": {"category": "validation", "message": "bad spec", "phase": None}}
    assert fold(refused, {"type": "no_such_event", "ts": 6.0}) == refused  # a record no event class reads
    assert fold(refused, {"type": "shard_written", "ts": 6.0}) == refused  # its fields missing
    started = fold(refused, ev.to_dict(ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=1, ts=7.0)))
    assert "error" not in started and started["attempt"] == 1 and started["shards"]["written"] == 0


def test_a_long_attempt_keeps_its_whole_series_coarser():
    s = JobSummary()
    s.apply(ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=1, ts=0.0))
    s.apply(ev.PhaseChanged(phase="curate", state="started", ts=0.0))
    for i in range(1, 1001):
        s.apply(ev.PhaseProgress(phase="curate", done=10 * i, total=None, unit="docs", ts=float(i)))
    points = s.series.docs
    assert len(points) <= SERIES_POINTS and points[0] == (1.0, 10) and points[-1] == (1000.0, 10_000)
    assert all(b[0] > a[0] for a, b in zip(points, points[1:], strict=False))
