"""Issue 41's must-show, sped up: a schedule firing every minute for five minutes on two scheduler replicas
sharing one PostgreSQL database, the leading one lost once mid-way: exactly five runs, one per slot, each with
its one job. The clock is injected (minute by minute); the lease is short and real (the database's clock)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.runner.lease import DbLease
from service.schedules import scheduler as scheduler_module
from service.schedules.scheduler import Scheduler
from service.store import repo
from tests.corpus_fixtures import write_jsonl
from tests.test_leader_lease import _wait
from tests.test_service_schedules import Clock, _at, _docs, _spec, api  # noqa: F401 - api: a fixture
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

LEASE_S = 0.8
#: the minute (0-based) at which the leading replica is lost
LOST_AT = 2


class Killed(BaseException):
    """The replica's process ends here (SIGKILL): nothing after this line of it runs, nothing is released."""


@pytest.mark.parametrize("api", ["postgresql"], indirect=True)  # replicas share PostgreSQL, never SQLite
@pytest.mark.parametrize("how", ["killed_after_finding_the_slot", "killed_while_creating_the_job",
                                 "paused_while_scanning"])
def test_a_schedule_fires_once_per_slot_across_replicas_and_a_lost_leader(api, monkeypatch, how):  # noqa: F811
    client, headers, root, app = api
    db = app.state.db
    write_jsonl(root / "in" / "a.jsonl", _docs("a", 5, 0))
    body = client.post("/v1/schedules", json={"cron": "* * * * *", "spec": _spec(root)}, headers=headers).json()
    sid, slots = body["id"], [_at(t) for t in body["next_fire_times"]][:5]
    clock = Clock(slots[0] - timedelta(seconds=30))
    a, b = (Scheduler(db, app.state.settings, clock=clock,
                      leadership=DbLease(db, "scheduler", lease_s=LEASE_S, holder=who)) for who in ("a", "b"))
    lose = {"now": False}
    real_scan, real_add_run = scheduler_module.scan, repo.add_run

    def scan(*args, **kw):
        if lose["now"] and how != "killed_while_creating_the_job":
            lose["now"] = False
            if how == "killed_after_finding_the_slot":
                raise Killed
            _wait("b's takeover", b.leadership.acquire, timeout=LEASE_S + 5)  # a paused past its lease...
            b.step()  # ...while b fires the slot; then a wakes up and goes on with its stale claim
        return real_scan(*args, **kw)

    def add_run(*args, **kw):
        if lose["now"] and kw.get("job_id"):
            lose["now"] = False
            raise Killed  # the job is created in this transaction: it goes with it
        return real_add_run(*args, **kw)

    monkeypatch.setattr(scheduler_module, "scan", scan)
    monkeypatch.setattr(repo, "add_run", add_run)
    alive = [a, b]
    a.step()
    assert a.leading and not b.leading
    for minute, slot in enumerate(slots):
        clock.now = slot + timedelta(seconds=2)
        if minute == LOST_AT:
            lose["now"] = True
            if how.startswith("killed"):
                with pytest.raises(Killed):
                    a.step()
                alive = [b]
                assert len(_runs(db, sid)) == LOST_AT  # the slot is left due: no record, no job
                _wait("b's takeover", b.leadership.acquire, timeout=LEASE_S + 5)
        for replica in alive:
            replica.step()
        _end_queued_jobs(db)  # the run's job ends before the next slot (else overlap: skip)

    runs = _runs(db, sid)
    assert [r.fire_at for r in runs] == slots  # five runs, one per slot: none lost, none doubled
    assert all(r.job_id for r in runs) and len({r.job_id for r in runs}) == 5
    with db.read() as s:
        assert sorted(j.id for j in repo.list_jobs(s)) == sorted(r.job_id for r in runs)  # no job without its run
    assert b.leading and not a.leading


def _runs(db, sid: str) -> list:
    with db.read() as s:
        return sorted(repo.runs_of(s, sid, limit=100), key=lambda r: r.fire_at)


def _end_queued_jobs(db) -> None:
    with db.session() as s:
        for job in repo.queued_jobs(s):
            repo.cancel_job(s, job.id)

