"""``/metrics`` (issue 12): the job figures Prometheus scrapes come from the store, on SQLite and PostgreSQL.

Jobs are made directly in the store with engine-shaped events folded into their summaries, as the supervisor
does, so no job process or Ray is needed. :func:`seed_job` and :func:`add_events` are shared with
tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from pipeline.job import events as ev
from service.api.app import create_app
from service.api.routers.metrics import PHASE_BUCKETS, JobFigures
from service.runner.summary import fold
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from service.store.models import JobState, utcnow
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

# ---- jobs made in the store --------------------------------------------------------------------------------

#: the stages of the seeded job: (key, docs_in, docs_out, {reason: dropped}, seconds)
STAGES = [("00-read", 1020, 1020, {}, 1.5), ("01-length", 1020, 950, {"length:too_short": 70}, 0.5),
          ("02-exact_dedup", 950, 900, {"exact_duplicate": 50}, 0.75)]
#: tokens of each shard the seeded job writes
SHARD_TOKENS = [1000, 1200, 900, 700]
#: (phase, seconds) of the seeded job's phases
PHASES = [("curate", 3.0), ("tokenizer", 2.0), ("write", 4.0), ("finalize", 0.5)]


def stage_counters(scale: float = 1.0) -> dict[str, dict[str, Any]]:
    return {key: {"docs_in": int(n_in * scale), "docs_out": int(n_out * scale),
                  "dropped": {r: int(n * scale) for r, n in dropped.items()}, "bytes_in": 0, "bytes_out": 0,
                  "seconds": secs * scale}
            for key, n_in, n_out, dropped, secs in STAGES}


def engine_events(name: str, t0: float, *, shards: int = len(SHARD_TOKENS), finish: bool = True) -> list[dict]:
    """What a job's ``events.jsonl`` holds: curate (progress at 1 s steps), tokenizer, write (``shards`` shards)
    and, with ``finish``, finalize and ``job_finished``."""
    e: list[ev.Event] = [ev.JobStarted(job=name, spec_hash="h" * 64, output="/out", parallelism=2, ts=t0),
                         ev.PhaseChanged(phase="curate", state="started", ts=t0)]
    e += [ev.PhaseProgress(phase="curate", done=d, total=None, unit="docs", ts=t0 + i + 1)
          for i, d in enumerate((200, 500, 1020))]
    e += [ev.StageCounters(stages=stage_counters(), ts=t0 + 3),
          ev.PhaseChanged(phase="curate", state="finished", seconds=PHASES[0][1], ts=t0 + 3),
          ev.PhaseChanged(phase="tokenizer", state="started", ts=t0 + 3),
          ev.PhaseChanged(phase="tokenizer", state="finished", seconds=PHASES[1][1], ts=t0 + 5),
          ev.PhaseChanged(phase="write", state="started", ts=t0 + 5)]
    e += [ev.ShardWritten(name=f"shards/shard-{i:06d}.tar", sha256="0" * 64, samples=16, tokens=tokens,
                          writer="host:1", ts=t0 + 6 + i) for i, tokens in enumerate(SHARD_TOKENS[:shards])]
    if finish:
        e += [ev.PhaseChanged(phase="write", state="finished", seconds=PHASES[2][1], ts=t0 + 9),
              ev.PhaseChanged(phase="finalize", state="started", ts=t0 + 9),
              ev.PhaseChanged(phase="finalize", state="finished", seconds=PHASES[3][1], ts=t0 + 9.5),
              ev.JobFinished(output="/out", shards=len(SHARD_TOKENS), samples=16 * len(SHARD_TOKENS),
                             tokens=sum(SHARD_TOKENS), documents=STAGES[-1][2], seconds=9.5, ts=t0 + 9.5)]
    return [ev.to_dict(x) for x in e]


def seed_job(db: Database, name: str, *, events: Sequence[dict] = (), state: JobState = JobState.SUCCEEDED,
             out: str | None = None) -> str:
    """A job as the supervisor leaves it: started (attempt 1), ``events`` stored and folded, then ``state``."""
    out = out or f"/data/{secrets.token_hex(4)}"
    with db.session() as s:
        job, _ = repo.create_job(s, {"name": name, "inputs": [{"path": "/data/in"}], "output": {"path": out}},
                                 name=name, spec_hash="h" * 64, output_path=out)
        job_id = job.id
    if state == JobState.QUEUED:
        return job_id
    with db.session() as s:
        repo.start_attempt(s, job_id, run_dir=lambda j, n: f"/nonexistent/{j}/{n}", host="test")
    add_events(db, job_id, events)
    if state != JobState.RUNNING:
        with db.session() as s:
            job = repo.lock_job(s, job_id)
            repo.current_attempt(s, job).outcome = "succeeded" if state == JobState.SUCCEEDED else "failed"
            repo.transition(s, job, state, category="app" if state == JobState.FAILED else None,
                            message="seeded" if state != JobState.SUCCEEDED else None)
    return job_id


def add_events(db: Database, job_id: str, records: Sequence[dict]) -> None:
    """Store more events of the job's current attempt and fold them into its summary (the supervisor's ingest)."""
    with db.session() as s:
        job = repo.lock_job(s, job_id)
        repo.append_events(s, job, job.attempt, list(records))
        summary = dict(job.summary or {})
        for rec in records:
            summary = fold(summary, rec)
        job.summary = summary
        job.updated_at = utcnow()


# ---- the API -------------------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request, tmp_path):
    """``(client, headers)``: an API-only app on a fresh database."""
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'metrics.db'}"
    else:
        url, schema = request.getfixturevalue("postgres_url"), f"tm_test_{secrets.token_hex(6)}"
    app = create_app(Settings(state_dir=tmp_path / "state", database_url=url, database_schema=schema,
                              run_supervisor=False))
    with TestClient(app) as client:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "metrics")
        yield client, {"Authorization": f"Bearer {token}"}
        app.state.db.drop_schema()


def scrape(client: TestClient, headers: dict) -> dict[tuple[str, frozenset], float]:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_metrics_need_the_key_and_speak_openmetrics_on_request(service):
    client, headers = service
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer tm_000000000000_" + "x" * 43}).status_code == 401
    r = client.get("/metrics", headers={**headers, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


def test_job_figures_come_from_the_store_and_follow_new_events(service):
    client, headers = service
    db = client.app.state.db
    t0 = time.time() - 60
    seed_job(db, "done", events=engine_events("done", t0))
    running = seed_job(db, "live", events=engine_events("live", t0, shards=1, finish=False), state=JobState.RUNNING)
    seed_job(db, "waiting", state=JobState.QUEUED)
    failed = seed_job(db, "broken", events=[ev.to_dict(ev.JobStarted(job="b", spec_hash="h", output="/o",
                                                                       parallelism=1, ts=t0))],
                      state=JobState.FAILED)

    m = scrape(client, headers)
    assert {st: value(m, "tokenmill_jobs", state=st) for st in JobState} == {
        "QUEUED": 1, "RUNNING": 1, "CANCELLING": 0, "SUCCEEDED": 1, "FAILED": 1, "CANCELLED": 0}
    for key, n_in, n_out, dropped, secs in STAGES:  # the two jobs that curated: each counts its stages
        stage = key.split("-", 1)[1]
        assert value(m, "tokenmill_stage_documents_in_total", stage=stage) == 2 * n_in
        assert value(m, "tokenmill_stage_documents_out_total", stage=stage) == 2 * n_out
        assert value(m, "tokenmill_stage_seconds_total", stage=stage) == pytest.approx(2 * secs)
        for reason, n in dropped.items():
            assert value(m, "tokenmill_stage_documents_dropped_total", stage=stage, reason=reason) == 2 * n
    assert value(m, "tokenmill_tokens_written_total") == sum(SHARD_TOKENS) + SHARD_TOKENS[0]
    assert value(m, "tokenmill_shards_total", how="written") == len(SHARD_TOKENS) + 1
    # phase durations: a histogram of the finished phases (the running job finished curate and tokenizer)
    for phase, secs in PHASES:
        n = 2 if phase in ("curate", "tokenizer") else 1
        assert value(m, "tokenmill_phase_duration_seconds_count", phase=phase) == n
        assert value(m, "tokenmill_phase_duration_seconds_sum", phase=phase) == pytest.approx(n * secs)
        for bound in PHASE_BUCKETS:
            le = next(dict(k[1])["le"] for k in m if k[0] == "tokenmill_phase_duration_seconds_bucket"
                      and dict(k[1]).get("phase") == phase and float(dict(k[1])["le"]) == bound)
            assert value(m, "tokenmill_phase_duration_seconds_bucket", phase=phase, le=le) == (n if secs <= bound
                                                                                                 else 0)

    # the running job moves on: its new figures replace its old ones at the next scrape
    add_events(client.app.state.db, running, [
        ev.to_dict(ev.ShardWritten(name="shards/shard-000001.tar", sha256="1" * 64, samples=16, tokens=5000,
                                   writer="host:2", ts=t0 + 7))])
    with db.session() as s:
        repo.retry_job(s, failed)
    m2 = scrape(client, headers)
    assert value(m2, "tokenmill_tokens_written_total") == sum(SHARD_TOKENS) + SHARD_TOKENS[0] + 5000
    assert value(m2, "tokenmill_shards_total", how="written") == len(SHARD_TOKENS) + 2
    assert value(m2, "tokenmill_jobs", state="FAILED") == 0 and value(m2, "tokenmill_jobs", state="QUEUED") == 2
    assert value(m2, "tokenmill_stage_documents_in_total", stage="read") == 2 * STAGES[0][1]  # unchanged


def test_http_latency_is_labelled_by_route_template(service):
    client, headers = service
    db = client.app.state.db
    ids = [seed_job(db, f"j{i}", state=JobState.QUEUED) for i in range(2)]
    for job_id in ids:
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    assert client.get("/v1/jobs/no-such-job", headers=headers).status_code == 404
    assert client.get("/no/such/route").status_code == 404
    assert client.get(f"/v1/jobs/{ids[0]}").status_code == 401
    m = scrape(client, headers)
    hist = "tokenmill_http_request_duration_seconds_count"
    assert value(m, hist, method="GET", route="/v1/jobs/{job_id}", status="200") == 2
    assert value(m, hist, method="GET", route="/v1/jobs/{job_id}", status="404") == 1
    assert value(m, hist, method="GET", route="/v1/jobs/{job_id}", status="401") == 1
    assert value(m, hist, method="GET", route="unmatched", status="404") == 1
    assert not any(k[0].startswith("tokenmill_http") and any(job_id in v for _, v in k[1]) for k in m
                   for job_id in ids)  # no raw path in a label
    assert value(m, "tokenmill_http_request_duration_seconds_bucket", method="GET", route="/v1/jobs/{job_id}",
                 status="200", le="+Inf") == 2


def test_job_figures_ignore_a_malformed_summary():
    """Summaries are folded from events a job process wrote; a figure of the wrong type counts as nothing."""
    f = JobFigures.of({"stages": {"01-x": {"docs_in": "many", "docs_out": 3, "dropped": {"x:y": True}},
                                  "02-y": "garbage"}, "phases": {"curate": {"state": "finished", "seconds": None}},
                       "shards": [1], "tokens": 7.0})
    assert (f.docs_in["x"], f.docs_out["x"], f.dropped[("x", "x:y")], f.tokens) == (0, 3, 0, 7)
    assert f.phases == [("curate", 0.0)] and f.shards_written == 0
    assert JobFigures.of(None) == JobFigures()
