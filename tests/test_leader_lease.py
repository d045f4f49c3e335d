"""Leadership of the supervisor and the scheduler (service/runner/lease.py): a lease row on PostgreSQL with a
fencing token, the file lock on SQLite. Short leases, so each test takes about a second."""

from __future__ import annotations

import secrets
import threading
import time

import pytest

from service.runner.leader import LeaderLoop
from service.runner.lease import DbLease, FileLock, LostLease
from service.runner.supervisor import RunnerConfig, Supervisor
from service.schedules.scheduler import Scheduler
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from service.store.models import JobState
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

LEASE_S = 0.6


@pytest.fixture
def pg(postgres_url):  # noqa: F811 - the fixture imported above
    db = Database(postgres_url, schema=f"tm_test_{secrets.token_hex(6)}")
    db.migrate()
    yield db
    db.drop_schema()
    db.dispose()


def _wait(what: str, cond, timeout: float = 5.0) -> float:
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_one_replica_leads_a_killed_one_is_taken_over_after_expiry_and_its_writes_are_refused(pg):
    a, b = (DbLease(pg, "supervisor", lease_s=LEASE_S, holder=h) for h in ("a", "b"))
    assert a.acquire() and a.leading and not b.acquire()
    for _ in range(3):  # renewed at every poll: held past lease_s
        time.sleep(LEASE_S / 2.5)
        assert a.acquire() and not b.acquire()
    first = a.token
    killed = time.monotonic()
    assert a.acquire()  # its last renewal; then it is killed: no renewal, no release
    _wait("the takeover", b.acquire)
    took = time.monotonic() - killed
    assert LEASE_S - 0.05 <= took <= LEASE_S + 1.0, took  # not before the lease expired by the database's clock
    assert b.token == first + 1 and b.leading
    assert not a.leading  # by its own clock too: it stops acting before the other may start
    with pg.session() as s, pytest.raises(LostLease, match="took it over"):
        a.token = first  # a write in flight with the old token (a paused process waking up)
        a.fence(s)
    with pg.session() as s:
        b.fence(s)  # the holder's write goes through
    assert not a.acquire()  # and the old one may not lead again while b renews


def test_a_clean_stop_hands_over_at_once_and_each_loop_leads_on_its_own(pg):
    ticks: dict[str, int] = {"a": 0, "b": 0}

    class Loop(LeaderLoop):
        def __init__(self, who: str):
            super().__init__(DbLease(pg, "scheduler", lease_s=30.0, holder=who), poll_s=0.02)
            self.who = who

        def tick(self) -> None:
            with pg.session() as s:
                self.fence(s)
            ticks[self.who] += 1

    a, b = Loop("a"), Loop("b")
    a.start()
    _wait("a leads", lambda: ticks["a"] > 0)
    b.start()
    time.sleep(0.2)
    assert a.leading and not b.leading and ticks["b"] == 0
    other = DbLease(pg, "supervisor", lease_s=30.0, holder="b")
    assert other.acquire()  # another loop's lease: held apart
    other.release()
    a.stop()
    assert not a.leading
    assert _wait("b takes over", lambda: ticks["b"] > 0) < 2.0  # not the 30 s of expiry
    b.stop()


def test_a_long_tick_keeps_the_lease_while_the_loop_lives(pg):
    """A tick longer than the lease (a scan hashing large new files) still leads: the loop renews between polls."""
    went_on = threading.Event()

    class Slow(LeaderLoop):
        def tick(self) -> None:
            time.sleep(LEASE_S * 2.5)
            with pg.session() as s:
                self.fence(s)  # not refused: the lease was renewed meanwhile
            went_on.set()

    slow = Slow(DbLease(pg, "scheduler", lease_s=LEASE_S, holder="slow"), poll_s=30.0)
    other = DbLease(pg, "scheduler", lease_s=LEASE_S, holder="other")
    slow.start()
    try:
        _wait("it leads", lambda: slow.leading)
        while not went_on.is_set():
            assert not other.acquire()
            time.sleep(0.05)
    finally:
        slow.stop()
    assert other.acquire()  # released by the stop


def test_an_old_supervisor_launches_nothing_once_another_took_over(pg, tmp_path):
    config = RunnerConfig(state_dir=tmp_path / "state", job_command=("false",), poll_s=0.05)
    old = Supervisor(pg, config, leadership=DbLease(pg, "supervisor", lease_s=LEASE_S, holder="old"))
    assert old.leadership.acquire()
    time.sleep(LEASE_S + 0.1)  # it paused past its lease
    assert DbLease(pg, "supervisor", lease_s=30.0, holder="new").acquire()
    with pg.session() as s:
        job, _ = repo.create_job(s, {"name": "j"}, name="j", spec_hash="h" * 64, output_path=str(tmp_path / "o"))
    with pytest.raises(LostLease):
        old.tick()
    with pg.session() as s:
        assert repo.get_job(s, job.id).state == JobState.QUEUED and not repo.attempts_of(s, job.id)


def test_the_lease_is_a_setting(pg, tmp_path):
    from service.api.app import runner_config
    from service.commands.serve import _settings, build_parser

    settings = Settings.from_env({"TOKENMILL_LEASE_S": "4", "TOKENMILL_STATE_DIR": str(tmp_path)})
    assert Supervisor(pg, runner_config(settings)).leadership.lease_s == 4
    assert Scheduler(pg, settings).leadership.lease_s == 4
    assert _settings(build_parser().parse_args(["--lease-s", "7"])).lease_s == 7


def test_sqlite_keeps_the_file_lock(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'store.db'}")
    db.migrate()
    state = tmp_path / "state"
    sup = Supervisor(db, RunnerConfig(state_dir=state))
    sched = Scheduler(db, Settings(state_dir=state, database_url=str(db.url)))
    assert isinstance(sup.leadership, FileLock) and sup.leadership.path == state / "supervisor.lock"
    assert isinstance(sched.leadership, FileLock) and sched.leadership.path == state / "scheduler.lock"
    other = FileLock(state / "supervisor.lock")
    assert sup.leadership.acquire() and not other.acquire()
    with db.session() as s:
        sup.fence(s)  # nothing to check while the lock is held
    sup.stop()  # released at once
    assert other.acquire()
    other.release()
    db.dispose()
