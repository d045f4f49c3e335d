"""``tokenmill follow`` / ``submit --follow`` (issue 39's first-hour edges): a job that SUCCEEDED ends with the
summary table ``tokenmill run`` prints, made from the output's ``stats.json`` the server serves; the follow loop
runs here against a fake client (no server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipeline.job import events as ev
from pipeline.job.summary import format_summary
from service.commands import follow
from service.commands.exits import EXIT_OK
from service.commands.http_client import ClientError

STATS = {
    "job": "web", "seconds": {"total": 3.0}, "parallelism": 2,
    "stages": [{"stage": "00-read", "docs_in": 10, "docs_out": 10, "dropped": {}, "bytes_in": 0, "bytes_out": 500,
                "seconds": 0.1},
               {"stage": "01-lid", "docs_in": 10, "docs_out": 10, "dropped": {}, "bytes_in": 500, "bytes_out": 500,
                "seconds": 0.2, "counters": {"would_drop:lid:language": 2}}],
    "output": {"tokens": 0, "samples": 0, "shards": 0}, "throughput": {"docs_per_s": 3.3, "tokens_per_s": 0.0},
}


class _Response:
    def __init__(self, body: dict[str, Any]):
        self.body = body

    def json(self) -> dict[str, Any]:
        return self.body


class _FakeApi:
    """The two calls follow makes: the job's events, then (once it SUCCEEDED) its detail and stats.json."""

    def __init__(self, final: str, stats_status: int | None = None):
        self.final, self.stats_status = final, stats_status
        self.asked: list[str] = []

    def events(self, job_id: str, after: int) -> Iterator[tuple[int, str, dict[str, Any]]]:
        yield 1, "state", {"state": "RUNNING", "attempt": 1}
        yield 2, "job_started", ev.to_dict(ev.JobStarted(job="web", spec_hash="h", output="/srv/out/web",
                                                         parallelism=2, ts=1.0))
        yield 3, "state", {"state": self.final, "attempt": 1}

    def request(self, method: str, path: str, **_: Any) -> _Response:
        self.asked.append(f"{method} {path}")
        if path.endswith("/stats.json"):
            if self.stats_status:
                raise ClientError(f"HTTP {self.stats_status}: a later job replaced this output", 2)
            return _Response(STATS)
        return _Response({"id": "j1", "output_path": "/srv/out/web"})


def test_a_followed_job_that_succeeded_ends_with_the_run_summary(capsys):
    api = _FakeApi("SUCCEEDED")
    assert follow.follow_job(api, "j1") == EXIT_OK  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert "job j1: SUCCEEDED, attempt 1" in err
    assert out.endswith(format_summary(STATS, "/srv/out/web") + "\n")
    assert "would-drop: lid:language=2" in out and "written to  /srv/out/web" in out
    assert api.asked == ["GET /v1/jobs/j1", "GET /v1/jobs/j1/artifacts/stats.json"]


def test_no_summary_for_a_failed_job_and_a_note_when_the_stats_are_gone(capsys):
    api = _FakeApi("FAILED")
    assert follow.follow_job(api, "j1") == 1  # type: ignore[arg-type]
    assert api.asked == [] and "docs in" not in capsys.readouterr().out
    gone = _FakeApi("SUCCEEDED", stats_status=410)
    assert follow.follow_job(gone, "j1") == EXIT_OK  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert "docs in" not in out and "no summary: HTTP 410" in err
