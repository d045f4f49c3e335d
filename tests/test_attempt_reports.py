"""A job process reports to the database (issue 41; service/runner/report.py), on SQLite and PostgreSQL.

Events keep their order and reach the database once each, a retried write included; a terminal event is
written before the sink returns; text the database cannot hold (U+0000) is replaced, not lost with its event;
logs are shipped in pieces and read back as their last bytes; the supervisor moves reported events into the
job's events and deletes them; a Ray Jobs submission is told the database without its password; a local
process on another replica's host is not taken for alive.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from service.runner import process, report
from service.runner.report import EventOutbox, LogShipper, database_env, log_tail
from service.runner.supervisor import RunnerConfig, Supervisor
from service.store import repo
from service.store.db import Database
from service.store.models import AttemptEvent
from tests.test_service_store import migrated_database, postgres_url  # noqa: F401 - a fixture


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    yield from migrated_database(request, tmp_path)


def _running(db: Database, tmp_path: Path) -> str:
    with db.session() as s:
        job, _ = repo.create_job(s, {"name": "j"}, name="j", spec_hash="h" * 64, output_path=str(tmp_path / "o"))
        repo.start_attempt(s, job.id, run_dir=lambda j, n: str(tmp_path / "run"), host="h")
        return job.id


def _reported(db: Database, job_id: str) -> list[tuple[int, dict]]:
    with db.read() as s:
        rows = s.scalars(select(AttemptEvent).where(AttemptEvent.job_id == job_id).order_by(AttemptEvent.seq))
        return [(r.seq, dict(r.data)) for r in rows]


def test_events_arrive_in_order_once_and_the_terminal_one_before_the_sink_returns(db, tmp_path):
    job_id = _running(db, tmp_path)
    box = EventOutbox(db, job_id, 1, flush_s=60)  # the thread would wait a minute: only flushes write
    try:
        for i in range(3):
            box.report({"type": "progress", "ts": float(i), "phase": "curate", "done": i})
        assert _reported(db, job_id) == []  # queued, not yet written
        box.report({"type": "job_failed", "ts": 3.0, "category": "input", "message": "bad \x00 byte"})
        got = _reported(db, job_id)  # the terminal event forced the write of everything before it
        assert [seq for seq, _ in got] == [1, 2, 3, 4] and [d["type"] for _, d in got][-1] == "job_failed"
        assert got[-1][1]["message"] == "bad \ufffd byte" and box.terminal == "job_failed"
        with db.session() as s:  # a batch written again (its answer was lost) stores nothing twice
            s.execute(report._insert(s, AttemptEvent), [{"job_id": job_id, "attempt": 1, "seq": 4,
                                                         "data": {"type": "other"}}])
        assert _reported(db, job_id) == got
    finally:
        box.close()


def test_the_supervisor_stores_reported_events_in_order_and_deletes_them(db, tmp_path):
    job_id = _running(db, tmp_path)
    box = EventOutbox(db, job_id, 1)
    box.report({"type": "job_started", "ts": 1.0, "job": "j", "spec_hash": "h", "output": "/o", "parallelism": 1})
    box.report({"type": "phase", "ts": 2.0, "phase": "curate", "state": "started"})
    box.close()
    sup = Supervisor(db, RunnerConfig(state_dir=tmp_path / "state"))
    with db.session() as s:
        job = repo.lock_job(s, job_id)
        att = repo.current_attempt(s, job)
        assert sup._ingest(s, job, att) is False  # all of them in one step
        assert att.events_offset == 2
    with db.read() as s:
        assert [e.type for e in repo.events_after(s, job_id)] == ["state", "state", "job_started", "phase"]
    assert _reported(db, job_id) == []


def test_logs_are_shipped_in_pieces_and_read_back_as_their_last_bytes(db, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "LOG_PIECE", 7)
    job_id = _running(db, tmp_path)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "job.log").write_bytes(b"line one\nline two\n")
    shipper = LogShipper(db, job_id, 1, folder)
    shipper.ship()
    with open(folder / "job.log", "ab") as f:
        f.write(b"line three\n")
    (folder / "ray.log").write_bytes(b"ray says hi\n")
    shipper.close()
    with db.read() as s:
        assert log_tail(s, job_id, 1, "job", 1 << 20) == b"line one\nline two\nline three\n"
        assert log_tail(s, job_id, 1, "job", 11) == b"line three\n"
        assert log_tail(s, job_id, 1, "job", 0) == b""
        assert log_tail(s, job_id, 1, "ray", 100) == b"ray says hi\n"
        assert report.shipped(s, job_id, 1) == {"job": 29, "ray": 12}
    with db.session() as s:  # the supervisor's pass after the process is gone ships only what is new
        report.ship_rest(s, job_id, 1, str(folder))
    with db.read() as s:
        assert log_tail(s, job_id, 1, "job", 1 << 20) == b"line one\nline two\nline three\n"


def test_a_ray_jobs_submission_names_the_database_without_its_password():
    env = database_env("postgresql+psycopg://tm:s3cret@db.internal:5432/tm", "tm", keep_password=False)
    assert env == {"TOKENMILL_DATABASE_URL": "postgresql+psycopg://tm@db.internal:5432/tm",
                   "TOKENMILL_DATABASE_SCHEMA": "tm"}
    local = database_env("postgresql+psycopg://tm:s3cret@db.internal/tm", None, keep_password=True)
    assert local == {"TOKENMILL_DATABASE_URL": "postgresql+psycopg://tm:s3cret@db.internal/tm"}


def test_a_local_process_on_another_host_is_not_alive_here(tmp_path):
    executor = process.LocalProcesses(("true",), {}, "job.log")
    me = process.start_time(os.getpid())
    here = SimpleNamespace(host=executor.host, pid=os.getpid(), proc_started=me, run_dir=str(tmp_path))
    there = SimpleNamespace(host=f"{executor.host}-other", pid=os.getpid(), proc_started=me, run_dir=str(tmp_path))
    assert executor.folder_here(here) == str(tmp_path) and executor.folder_here(there) is None
    assert not executor.alive(there)  # the same pid and start time here mean nothing: another machine's process
    assert executor.reap(there) == []
