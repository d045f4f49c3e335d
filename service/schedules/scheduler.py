"""The scheduler: fires schedules at their cron slots as refresh jobs and publishes what those jobs write.

One thread per service, beside the supervisor, and one leading scheduler at a time (an ``flock`` on
``STATE/scheduler.lock`` with SQLite, the ``scheduler`` lease row with PostgreSQL: :mod:`service.runner.lease`).
Every :data:`POLL_S` a tick does:

1. **settle** each running refresh: once its job has SUCCEEDED the version it wrote is recorded and
   ``OUT/latest`` names it; a job that FAILED or was CANCELLED makes the run ``failed`` (its inputs are read
   again by the next run, since only a run that consumed them moves the baseline); a job that failed only
   because dedup left no document (every new document was already published) makes the run ``empty``.
2. **fire** each schedule whose slot has come (``next_fire_at <= clock()``):

   - the next slot is computed from now: slots missed while the service was down fire once, not once
     each (APScheduler calls this "coalesce");
   - the previous run still going: overlap ``skip`` records a ``skipped`` run; ``buffer_one`` keeps one
     slot waiting and fires it as soon as that run ends (a further slot meanwhile is skipped) — the
     names and meanings of Temporal's schedule overlap policies SKIP and BUFFER_ONE;
   - else the input files are fingerprinted against the last consuming run's snapshot
     (:mod:`service.schedules.fingerprints`); nothing new or changed is an ``unchanged`` run and no job;
     otherwise a job reading only those files (:func:`service.schedules.versions.refresh_spec`) is
     checked as the API checks a submission (:func:`service.admission.admit`) and queued.

Exactly once, through crashes and leader changes: a slot is taken (``next_fire_at`` moved on) in the same
transaction that records its run and creates its job, after checking that it is still the schedule's due slot
and that this replica still holds its lease (:meth:`LeaderLoop.fence`); a slot is unique per schedule in the
database too. Fingerprinting reads files, so it runs outside any transaction (a SQLite writer would block the
API meanwhile): between the read that finds the slot due and the write that takes it nothing is recorded, so a
scheduler that dies there leaves the slot due for the next leader, and one that dies later left it fired.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from pipeline.problems import SpecError
from pipeline.spec import parse_spec
from service.admission import admit
from service.runner.leader import LeaderLoop
from service.runner.lease import Leadership, leadership_for
from service.schedules import versions
from service.schedules.cron import Clock, next_fire, system_clock
from service.schedules.fingerprints import Scan, scan
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from service.store.models import CONSUMED, JobState, RunState, Schedule, ScheduleRun, utcnow

log = logging.getLogger("tokenmill.scheduler")

#: seconds between ticks: a fire is at most this late (cron's own resolution is a minute)
POLL_S = 1.0
#: how the job engine says that no document survived the stages (``pipeline.job.engine``): for a refresh,
#: every new document was already published
NOTHING_SURVIVED = "no document survived the stages"


@dataclass
class _Claim:
    """A slot taken by :meth:`Scheduler.fire`, with what the scan and the job spec need."""

    schedule_id: str
    slot: datetime
    template: dict[str, Any]
    output_path: str
    baseline: dict[str, Any]
    earlier: list[str]
    reserved: int
    #: the schedule's team: its runs' jobs are that team's, checked against its roots and folders
    team: str
    #: the slot is the buffered one (``pending_fire_at``), not ``next_fire_at``
    pending: bool
    #: the tick's time: the next slot is computed from it
    now: datetime


class Scheduler(LeaderLoop):
    name = "scheduler"

    def __init__(self, db: Database, settings: Settings, *, clock: Clock = system_clock,
                 wake_jobs: Callable[[], None] | None = None, poll_s: float = POLL_S,
                 leadership: Leadership | None = None):
        super().__init__(leadership or leadership_for(db, self.name, settings.state_dir / "scheduler.lock",
                                                      settings.lease_s), poll_s)
        self.db, self.settings, self.clock = db, settings, clock
        self.wake_jobs = wake_jobs or (lambda: None)
        self._repaired = False


    def tick(self) -> None:
        if not self._repaired:
            self.repair_latest()
            self._repaired = True
        self.settle()
        now = self.clock()
        with self.db.session() as s:
            due = repo.due_schedule_ids(s, now)
        for schedule_id in due:
            self.fire(schedule_id, now)

    # ---- settle ------------------------------------------------------------------------------------------

    def settle(self) -> None:
        with self.db.session() as s:
            ids = [r.id for r in repo.running_runs(s)]
        for run_id in ids:
            self._settle(run_id)

    def _settle(self, run_id: int) -> None:
        published: tuple[str, int] | None = None
        with self.db.session() as s:
            self.fence(s)
            run = s.get(ScheduleRun, run_id)
            if run is None:
                return
            sched = repo.lock_schedule(s, run.schedule_id)
            s.refresh(run)
            if run.state != RunState.RUNNING:
                return
            try:
                job = repo.get_job(s, run.job_id or "")
            except repo.NotFound:
                _end(run, RunState.FAILED, f"its job {run.job_id} no longer exists")
                return
            state = JobState(job.state)
            if state == JobState.SUCCEEDED:
                assert run.version is not None
                folder = versions.version_dir(sched.output_path, run.version)
                summary = job.summary or {}
                repo.add_version(s, run, path=str(folder), documents=summary.get("documents"),
                                 samples=summary.get("samples"), tokens=summary.get("tokens"),
                                 shards=(summary.get("shards") or {}).get("total"))
                _end(run, RunState.SUCCEEDED, f"published version {run.version} ({folder.name})")
                repo.prune_fingerprints(s, run)
                published = (sched.output_path, run.version)
            elif state == JobState.FAILED and job.failure_category == "input" and \
                    (job.error_message or "").startswith(NOTHING_SURVIVED):
                _end(run, RunState.EMPTY, "every new document was already published or dropped: nothing to publish")
                repo.prune_fingerprints(s, run)
            elif state in (JobState.FAILED, JobState.CANCELLED):
                _end(run, RunState.FAILED, f"job {job.id} {state}: {job.error_message or job.failure_category}")
            else:
                return
            sched.updated_at = utcnow()
        if published is not None:
            try:
                versions.write_latest(*published)
            except OSError as exc:
                log.warning("cannot write %s: %s; retrying", Path(published[0]) / versions.LATEST, exc)
                self._repaired = False  # the next tick's repair_latest writes it
            log.info("schedule %s: published version %d", run.schedule_id, published[1])
            self.wake()  # a buffered slot may fire now

    def repair_latest(self) -> None:
        """Make each ``OUT/latest`` name the newest recorded version (a crash between the two writes)."""
        with self.db.session() as s:
            newest = {sc.output_path: max((v.number for v in repo.versions_of(s, sc.id)), default=0)
                      for sc in repo.list_schedules(s)}
        for out, number in newest.items():
            if number and versions.read_latest(out) != number:
                try:
                    versions.write_latest(out, number)
                except OSError as exc:
                    log.warning("cannot write %s: %s", Path(out) / versions.LATEST, exc)

    # ---- fire --------------------------------------------------------------------------------------------

    def fire(self, schedule_id: str, now: datetime) -> ScheduleRun | None:
        """Take the schedule's due slot (if it still is) and run it; the run, or None when nothing was due."""
        claim = self._claim(schedule_id, now)
        if claim is None:
            return None
        try:
            found = scan(parse_spec(claim.template).inputs, claim.baseline)
        except (OSError, SpecError) as exc:
            return self._record(claim, RunState.FAILED, f"cannot list the inputs: {exc}")
        if not found.to_read:
            return self._record(claim, RunState.UNCHANGED, "no input file is new or changed", found)
        return self._start(claim, found)

    def _claim(self, schedule_id: str, now: datetime) -> _Claim | None:
        """The slot to fire, read without taking it (:meth:`_take` does, with its run); a slot that comes while the
        previous run is going is taken here, buffered or skipped by the overlap policy."""
        with self.db.session() as s:
            self.fence(s)  # first, as in every transaction here: the lease's row lock before the schedule's
            sched = repo.lock_schedule(s, schedule_id)
            if sched.paused:
                return None
            active = repo.active_run(s, schedule_id)
            if sched.next_fire_at is not None and sched.next_fire_at <= now:
                slot, pending = sched.next_fire_at, False
                if active is not None:
                    self._overlap(s, sched, active, now)
                    return None
            elif sched.pending_fire_at is not None and active is None:
                slot, pending = sched.pending_fire_at, True
            else:
                return None
            last = repo.last_consumed_run(s, schedule_id)
            return _Claim(schedule_id=sched.id, slot=slot, template=dict(sched.spec),
                          output_path=sched.output_path, baseline=dict(last.fingerprints) if last else {},
                          earlier=[v.path for v in repo.versions_of(s, schedule_id)],  # adopted ones too
                          reserved=repo.max_reserved_version(s, schedule_id), team=sched.team, pending=pending,
                          now=now)

    def _overlap(self, s: Session, sched: Schedule, active: ScheduleRun, now: datetime) -> None:
        """The due slot while run ``active`` goes on: buffered (``buffer_one``, one at most) or a ``skipped`` run."""
        slot = sched.next_fire_at
        assert slot is not None
        sched.next_fire_at = next_fire(sched.cron, sched.timezone, max(now, slot))
        sched.updated_at = utcnow()
        if sched.overlap == "buffer_one" and sched.pending_fire_at is None:
            sched.pending_fire_at = slot
            return
        why = "a slot is already waiting for it" if sched.overlap == "buffer_one" else "overlap: skip"
        self._add(s, sched, slot, RunState.SKIPPED, f"run {active.number} (job {active.job_id}) was still going; {why}")

    def _take(self, s: Session, claim: _Claim) -> Schedule | None:
        """Lock the schedule and take the claimed slot, in the transaction that records its run; None when the slot
        is no longer this scheduler's to fire (taken meanwhile, paused, changed, a run going)."""
        self.fence(s)
        sched = repo.lock_schedule(s, claim.schedule_id)
        if repo.active_run(s, claim.schedule_id) is not None:
            return None
        if claim.pending:
            if sched.pending_fire_at != claim.slot:
                return None
        elif sched.paused or sched.next_fire_at != claim.slot:
            return None
        else:
            sched.next_fire_at = next_fire(sched.cron, sched.timezone, max(claim.now, claim.slot))
        sched.pending_fire_at = None  # this run covers a buffered slot too
        sched.updated_at = utcnow()
        return sched

    def _add(self, s: Any, sched: Any, slot: datetime, state: RunState, message: str, **kw: Any) -> ScheduleRun | None:
        try:
            with s.begin_nested():
                return repo.add_run(s, sched, fire_at=slot, state=state, message=message, **kw)
        except IntegrityError:  # this slot has a run already (another scheduler)
            return None

    def _record(self, claim: _Claim, state: RunState, message: str, found: Scan | None = None) -> ScheduleRun | None:
        """A run without a job; its snapshot is kept only when it is the next baseline (``unchanged``)."""
        with self.db.session() as s:
            sched = self._take(s, claim)
            if sched is None:
                return None
            kw: dict[str, Any] = {"inputs": found.summary()} if found is not None else {}
            if found is not None and state in CONSUMED:
                kw["fingerprints"] = found.snapshot
            run = self._add(s, sched, claim.slot, state, message, **kw)
            if run is not None and state in CONSUMED:
                repo.prune_fingerprints(s, run)
            return run

    def _start(self, claim: _Claim, found: Scan) -> ScheduleRun | None:
        number = max(claim.reserved, versions.highest_on_disk(claim.output_path)) + 1
        data = versions.refresh_spec(claim.template, found.to_read, claim.output_path, number, claim.earlier)
        try:
            spec = parse_spec(data)
            admit(spec, self.settings, team=claim.team, scope=claim.team)
        except SpecError as exc:  # the schema's problems or admission's (Refused): one `field: message` line each
            return self._record(claim, RunState.FAILED, f"refused: {exc}", found)
        with self.db.session() as s:
            sched = self._take(s, claim)
            if sched is None:
                return None
            run_number = sched.run_seq + 1
            try:
                with s.begin_nested():
                    job, _ = repo.create_job(s, spec.model_dump(mode="json"), name=spec.name,
                                             spec_hash=spec.content_hash(),
                                             output_path=os.path.realpath(spec.output.path),
                                             idempotency_key=f"schedule-{sched.id}-run-{run_number}",
                                             api_key_id=sched.api_key_id, team=sched.team)
                    run = repo.add_run(s, sched, fire_at=claim.slot, state=RunState.RUNNING, job_id=job.id,
                                       version=number, message=f"job {job.id} writes {versions.version_name(number)}",
                                       inputs=found.summary(), fingerprints=found.snapshot)
            except IntegrityError:
                return None
        log.info("schedule %s: run %d queued job %s (%d new, %d changed files)", claim.schedule_id, run.number,
                 run.job_id, len(found.new), len(found.changed))
        self.wake_jobs()
        return run


def _end(run: ScheduleRun, state: RunState, message: str) -> None:
    run.state = state
    run.message = message
    run.ended_at = utcnow()
