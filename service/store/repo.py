"""Every query and state change of the control plane, as functions of a :class:`~sqlalchemy.orm.Session`.

Writers of a job lock its row first (``SELECT ... FOR UPDATE`` on PostgreSQL; on SQLite every transaction
already holds the write lock), so the API (cancel, retry) and the supervisor (start, finish) never
interleave on one job, and the per-job event numbering has no gaps or repeats. Each state change is
checked against :data:`service.store.models.TRANSITIONS` and recorded as a ``state`` event in the same
transaction, so the event stream always agrees with the row.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import bindparam, delete, func, or_, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from service import auth
from service.roles import DEFAULT_ROLE
from service.store.models import (
    ACTIVE,
    CONSUMED,
    DEFAULT_TEAM,
    PIPELINE,
    TERMINAL,
    TRANSITIONS,
    ApiKey,
    Attempt,
    AuditEntry,
    Job,
    JobEvent,
    JobState,
    RetiredVersion,
    RunState,
    Schedule,
    ScheduleRun,
    ScheduleVersion,
    utcnow,
)

#: a key's ``last_used_at`` is refreshed at most this often, so authenticating is not a write per request
LAST_USED_RESOLUTION = timedelta(minutes=1)


class NotFound(LookupError):
    pass


class Hidden(NotFound):
    """Another team's row, answered as an unknown one (the same message): see :mod:`service.api.access`."""


def owned(row: Any, team: str | None, missing: NotFound) -> Any:
    """``row`` when it exists and ``team`` (None: any team) owns it; else ``missing``, or :class:`Hidden` with
    its message for another team's row."""
    if row is None:
        raise missing
    if team is not None and row.team != team:
        raise Hidden(str(missing))
    return row


class Conflict(RuntimeError):
    """The request does not fit the job's state (cancel a finished job, retry a running one)."""


class IdempotencyConflict(Conflict):
    """An Idempotency-Key reused with a different spec."""


#: SQLSTATEs of a value PostgreSQL cannot hold: a number beyond its column's type; a character it cannot
#: convert (U+0000 in JSONB is one; psycopg itself refuses U+0000 in a text parameter, with no SQLSTATE)
_OUT_OF_RANGE, _UNTRANSLATABLE = "22003", "22P05"


def unstorable(exc: DataError) -> tuple[str, str]:
    """``(message, type)`` of a value the database refused (a :class:`~sqlalchemy.exc.DataError`): a number
    out of its column's range, a U+0000 (only when it is one), else the database's own first line. The API
    checks bounds and U+0000 before any query (so both stores answer alike, naming the field); this is the
    last line, for a value those checks missed."""
    orig = exc.orig
    full = str(orig)
    state, text = getattr(orig, "sqlstate", None), full.splitlines()[0] if full else type(orig).__name__
    if state == _OUT_OF_RANGE:
        return f"a number is out of the database's range ({text})", "number_out_of_range"
    if "NUL (0x00)" in full or (state == _UNTRANSLATABLE and "\\u0000" in full):
        return "a value holds U+0000 (NUL), which the database cannot store", "nul_character"
    return f"a value the database cannot store ({text})", "unstorable"


def request_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---- jobs ------------------------------------------------------------------------------------------------


def create_job(s: Session, spec: dict[str, Any], *, name: str, spec_hash: str, output_path: str,
               idempotency_key: str | None = None, api_key_id: str | None = None,
               team: str = DEFAULT_TEAM, kind: str = PIPELINE) -> tuple[Job, bool]:
    """A new QUEUED job (``kind``: :data:`~service.store.models.PIPELINE` or ``ABLATION``), or ``(existing,
    False)`` when this key (per API key) was used before with the same spec."""
    digest = request_hash(spec)
    scoped = _scoped(idempotency_key, api_key_id)
    if scoped is not None:
        existing = _by_idempotency(s, scoped, digest)
        if existing is not None:
            return existing, False
    job = Job(id=secrets.token_hex(8), name=name, state=JobState.QUEUED, spec=spec, spec_hash=spec_hash,
              output_path=output_path, idempotency_key=scoped, request_hash=digest, api_key_id=api_key_id,
              team=team, kind=kind, attempt=0, cancel_requested=False, summary={}, event_seq=0)
    try:
        with s.begin_nested():  # a concurrent request with the same key: the unique index decides
            s.add(job)
            s.flush()
    except IntegrityError:
        existing = _by_idempotency(s, scoped, digest) if scoped else None
        if existing is None:
            raise
        return existing, False
    _state_event(s, job)
    return job, True


def repeated_job(s: Session, spec: dict[str, Any], *, idempotency_key: str | None,
                 api_key_id: str | None = None) -> Job | None:
    """The job an earlier request with this Idempotency-Key and spec created (:class:`IdempotencyConflict` for
    another spec): a repeat is answered with it before any check of the spec against the filesystem, which the
    first job's run has changed since (its output folder now holds its shard set)."""
    scoped = _scoped(idempotency_key, api_key_id)
    return _by_idempotency(s, scoped, request_hash(spec)) if scoped is not None else None


def _scoped(idempotency_key: str | None, api_key_id: str | None) -> str | None:
    return f"{api_key_id or '-'}:{idempotency_key}" if idempotency_key else None


def _by_idempotency(s: Session, scoped: str, digest: str) -> Job | None:
    job = s.scalars(select(Job).where(Job.idempotency_key == scoped)).one_or_none()
    if job is not None and job.request_hash != digest:
        raise IdempotencyConflict("Idempotency-Key: already used for another spec (job "
                                  f"{job.id}); use a new key for a new job")
    return job


def get_job(s: Session, job_id: str, team: str | None = None) -> Job:
    """The job; :class:`NotFound` when unknown or (``team`` given) another team's."""
    job = s.scalars(select(Job).where(Job.id == job_id)).one_or_none()
    return owned(job, team, NotFound(f"no job {job_id!r}"))


class AttemptRow(BaseModel):
    """An attempt as a status read returns it: the columns the API shows (its ``AttemptOut`` is this record)."""

    number: int
    host: str
    pid: int | None
    started_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    outcome: str | None = Field(None, description="succeeded | failed | cancelled | lost (ended without a result)")


#: the attempt columns a status read selects, in the order of :class:`AttemptRow`'s fields
_ATTEMPT_COLUMNS = tuple(AttemptRow.model_fields)


_STATUS_JOB = (Job.id, Job.name, Job.state, Job.attempt, Job.output_path, Job.created_at, Job.updated_at,
               Job.started_at, Job.finished_at, Job.failure_category, Job.error_message, Job.summary, Job.spec,
               Job.team)
#: built once (building a statement costs about as much CPU as running it on SQLite) and polled: the job's
#: columns and its attempts', one row per attempt, in one statement (so one snapshot on any store)
_JOB_STATUS = (select(*_STATUS_JOB, *(getattr(Attempt, f).label(f"attempt_{f}") for f in _ATTEMPT_COLUMNS))
               .outerjoin(Attempt, Attempt.job_id == Job.id).where(Job.id == bindparam("job_id"))
               .order_by(Attempt.number))


def job_status(conn: Connection | Session, job_id: str,
               team: str | None = None) -> tuple[Row[Any], list[AttemptRow]]:
    """What ``GET /v1/jobs/{id}`` shows: the job's row (``.id``, ``.state``, ``.summary``, ``.spec``, ... as on
    :class:`Job`) and its attempts, oldest first. Columns, not ORM objects: a poll reads this many times a
    second and the ORM's identity map and instance loading would cost more than the query."""
    rows = conn.execute(_JOB_STATUS, {"job_id": job_id}).all()
    owned(rows[0] if rows else None, team, NotFound(f"no job {job_id!r}"))
    n = len(_STATUS_JOB)
    # the columns come typed from the database: no validation
    return rows[0], [AttemptRow.model_construct(**dict(zip(_ATTEMPT_COLUMNS, r[n:], strict=True)))
                     for r in rows if r[n] is not None]


def lock_job(s: Session, job_id: str, team: str | None = None) -> Job:
    """The job's row, locked for this transaction and re-read (never a stale copy from the session)."""
    stmt = select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    return owned(s.scalars(stmt).one_or_none(), team, NotFound(f"no job {job_id!r}"))


def list_jobs(s: Session, *, states: Iterable[str] = (), name: str | None = None,
              created_after: datetime | None = None, created_before: datetime | None = None,
              before_seq: int | None = None, limit: int = 50, team: str | None = None,
              kind: str | None = None) -> list[Job]:
    """Newest first; ``before_seq`` is the cursor (the ``seq`` of the last job of the previous page); ``team``:
    that team's only; ``kind``: that kind's only."""
    stmt = select(Job).order_by(Job.seq.desc()).limit(limit)
    if kind is not None:
        stmt = stmt.where(Job.kind == kind)
    if team is not None:
        stmt = stmt.where(Job.team == team)
    states = list(states)
    if states:
        stmt = stmt.where(Job.state.in_(states))
    if name is not None:
        stmt = stmt.where(Job.name == name)
    if created_after is not None:
        stmt = stmt.where(Job.created_at > created_after)
    if created_before is not None:
        stmt = stmt.where(Job.created_at < created_before)
    if before_seq is not None:
        stmt = stmt.where(Job.seq < before_seq)
    return list(s.scalars(stmt))


def transition(s: Session, job: Job, to: JobState, *, category: str | None = None,
               message: str | None = None) -> None:
    """Move a locked job to ``to`` (refused unless the lifecycle allows it) and record the change."""
    current = JobState(job.state)
    if to not in TRANSITIONS[current]:
        raise Conflict(f"job {job.id} is {current}; it cannot become {to}")
    now = utcnow()
    job.state = to
    job.updated_at = now
    if to == JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if to in TERMINAL:
        job.finished_at = now
    if to == JobState.FAILED:
        job.failure_category, job.error_message = category or "app", message
    elif to == JobState.CANCELLED:
        job.failure_category, job.error_message = "cancelled", message
    _state_event(s, job, category=category if to == JobState.FAILED else None, message=message)


def cancel_job(s: Session, job_id: str, team: str | None = None) -> Job:
    """QUEUED -> CANCELLED at once; RUNNING -> CANCELLING (the supervisor signals the process); a job
    already cancelling is left as it is; a finished one is a :class:`Conflict`."""
    job = lock_job(s, job_id, team)
    state = JobState(job.state)
    if state == JobState.QUEUED:
        transition(s, job, JobState.CANCELLED, message="cancelled before it started")
    elif state == JobState.RUNNING:
        if publishing(s, job):  # the one decision between cancel and publish (service.runner.publish)
            raise Conflict(f"job {job.id} is publishing its output: too late to cancel (it ends SUCCEEDED, "
                           "or FAILED if the publish fails)")
        job.cancel_requested = True
        transition(s, job, JobState.CANCELLING)
    elif state != JobState.CANCELLING:
        raise Conflict(f"job {job.id} is {state}: nothing to cancel")
    return job


def claim_publish(s: Session, job: Job, attempt: int) -> bool:
    """Whether attempt ``attempt`` of the locked ``job`` may publish its output (:mod:`service.runner.publish`):
    not once a cancel was accepted; else the claim is recorded (a ``publishing`` event), after which
    :func:`cancel_job` refuses. Asked again (the answer was lost), the same answer."""
    if job.cancel_requested or JobState(job.state) != JobState.RUNNING or job.attempt != attempt:
        return False
    if not publishing(s, job):
        append_events(s, job, attempt, [{"type": "publishing", "ts": time.time(), "source": "service"}])
    return True


def publishing(s: Session, job: Job) -> bool:
    """Whether the job's current attempt was allowed to publish (:func:`claim_publish`)."""
    return last_event(s, job.id, job.attempt, ("publishing",)) is not None


def retry_job(s: Session, job_id: str, team: str | None = None) -> Job:
    """FAILED or CANCELLED -> QUEUED, behind the jobs queued now; its next attempt resumes the output's work."""
    job = lock_job(s, job_id, team)
    if JobState(job.state) not in (JobState.FAILED, JobState.CANCELLED):
        raise Conflict(f"job {job.id} is {job.state}; only a FAILED or CANCELLED job can be retried")
    job.cancel_requested = False
    job.failure_category = job.error_message = job.finished_at = None
    job.queued_at = utcnow()
    transition(s, job, JobState.QUEUED, message="retried")
    return job


def writing_into(s: Session, output_path: str, *, other_than: str) -> bool:
    """Whether a queued or running job of another team than ``other_than`` writes into ``output_path``."""
    stmt = select(Job.id).where(Job.output_path == output_path, Job.team != other_than,
                                Job.state.not_in([str(x) for x in TERMINAL])).limit(1)
    return s.scalar(stmt) is not None


def queued_jobs(s: Session, limit: int = 100) -> Sequence[Job]:
    """The queue, first come first."""
    stmt = select(Job).where(Job.state == JobState.QUEUED).order_by(Job.queued_at, Job.seq).limit(limit)
    return s.scalars(stmt).all()


def active_jobs(s: Session) -> Sequence[Job]:
    return s.scalars(select(Job).where(Job.state.in_(list(ACTIVE))).order_by(Job.seq)).all()


# ---- attempts --------------------------------------------------------------------------------------------


def start_attempt(s: Session, job_id: str, *, run_dir: Callable[[str, int], str], host: str) -> tuple[Job, Attempt]:
    """QUEUED -> RUNNING as attempt ``n + 1``; the process is recorded by :func:`set_process` once started."""
    job = lock_job(s, job_id)
    if job.state != JobState.QUEUED:
        raise Conflict(f"job {job_id} is {job.state}, not QUEUED")
    job.attempt += 1
    job.summary = {"attempt": job.attempt}  # the figures shown are the latest attempt's
    attempt = Attempt(job_id=job.id, number=job.attempt, run_dir=run_dir(job.id, job.attempt),
                      host=host, events_offset=0)
    s.add(attempt)
    transition(s, job, JobState.RUNNING)
    s.flush()
    return job, attempt


def current_attempt(s: Session, job: Job) -> Attempt | None:
    if job.attempt == 0:
        return None
    stmt = select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.attempt)
    return s.scalars(stmt).one_or_none()


def attempts_of(s: Session, job_id: str) -> Sequence[Attempt]:
    return s.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)).all()


def get_attempt(s: Session, job_id: str, number: int) -> Attempt:
    attempt = s.scalars(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)).one_or_none()
    if attempt is None:
        raise NotFound(f"job {job_id!r} has no attempt {number}")
    return attempt


# ---- events ----------------------------------------------------------------------------------------------


def append_events(s: Session, job: Job, attempt: int, records: Sequence[dict[str, Any]]) -> list[JobEvent]:
    """Store ``records`` (each ``{"type", "ts", ...}``) as the job's next events; ``job`` must be locked."""
    rows = []
    for rec in records:
        job.event_seq += 1
        rows.append(JobEvent(job_id=job.id, seq=job.event_seq, attempt=attempt, type=str(rec.get("type", "?"))[:32],
                             ts=float(rec.get("ts") or time.time()), data=dict(rec)))
    s.add_all(rows)
    return rows


def events_after(s: Session, job_id: str, after_seq: int = 0, limit: int = 500) -> Sequence[JobEvent]:
    stmt = (select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after_seq)
            .order_by(JobEvent.seq).limit(limit))
    return s.scalars(stmt).all()


def last_event(s: Session, job_id: str, attempt: int, types: Sequence[str]) -> JobEvent | None:
    """The attempt's latest event of one of ``types`` (e.g. its terminal ``job_finished`` / ``job_failed``)."""
    stmt = (select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.attempt == attempt, JobEvent.type.in_(types))
            .order_by(JobEvent.seq.desc()).limit(1))
    return s.scalars(stmt).one_or_none()


def _state_event(s: Session, job: Job, *, category: str | None = None, message: str | None = None) -> None:
    rec: dict[str, Any] = {"type": "state", "ts": time.time(), "state": str(job.state), "attempt": job.attempt}
    if category:
        rec["category"] = category
    if message:
        rec["message"] = message
    append_events(s, job, job.attempt, [rec])


# ---- API keys --------------------------------------------------------------------------------------------


def create_key(s: Session, name: str, role: str = DEFAULT_ROLE, team: str = DEFAULT_TEAM) -> tuple[ApiKey, str]:
    """A new key of ``role`` in ``team`` (:mod:`service.api.access`) and its token (shown once: only its hash is
    kept)."""
    new = auth.generate()
    key = ApiKey(id=new.id, name=name, secret_hash=new.secret_hash, role=role, team=team)
    s.add(key)
    s.flush()
    return key, new.token


def list_keys(s: Session) -> Sequence[ApiKey]:
    return s.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)).all()


def revoke_key(s: Session, key_id: str) -> ApiKey:
    key = s.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"no API key {key_id!r}")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key


def authenticate(s: Session, token: str) -> ApiKey | None:
    """The live key ``token`` is, else None (malformed, unknown, wrong secret, revoked); refreshes its
    ``last_used_at`` (in a write transaction; the API reads with :func:`find_key` and :func:`touch_key`)."""
    parsed = auth.parse(token)
    if parsed is None:
        return None
    key = find_key(s, parsed[0])
    if key is None or not auth.matches(parsed[1], key.secret_hash):
        return None
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        key.last_used_at = now
    return key


def find_key(s: Session, key_id: str) -> ApiKey | None:
    """The key ``key_id``, unless unknown or revoked (a read: the caller checks the secret)."""
    key = s.get(ApiKey, key_id)
    return None if key is None or key.revoked_at is not None else key


def touch_key(s: Session, key_id: str) -> None:
    """Set the key's ``last_used_at`` to now unless it was set within :data:`LAST_USED_RESOLUTION` (one
    UPDATE, no read; a no-op when another process got there first)."""
    now = utcnow()
    s.execute(update(ApiKey).where(ApiKey.id == key_id, or_(ApiKey.last_used_at.is_(None),
                                                             ApiKey.last_used_at < now - LAST_USED_RESOLUTION))
              .values(last_used_at=now).execution_options(synchronize_session=False))


# ---- schedules -------------------------------------------------------------------------------------------
# A schedule's writers (the API's pause/resume/update/delete, the scheduler's fire and settle) lock its row
# first, as jobs' writers do, so a firing and a pause never interleave.


def create_schedule(s: Session, *, name: str, cron: str, timezone: str, overlap: str, paused: bool,
                    spec: dict[str, Any], output_path: str, next_fire_at: datetime | None,
                    api_key_id: str | None = None, team: str = DEFAULT_TEAM) -> Schedule:
    sched = Schedule(id=secrets.token_hex(8), name=name, cron=cron, timezone=timezone, overlap=overlap,
                     paused=paused, spec=spec, output_path=output_path, api_key_id=api_key_id, team=team,
                     next_fire_at=None if paused else next_fire_at, pending_fire_at=None, run_seq=0)
    try:
        with s.begin_nested():  # two schedules on one folder: the unique index decides
            s.add(sched)
            s.flush()
    except IntegrityError:
        raise Conflict(f"output.path: another schedule already publishes into {output_path}") from None
    return sched


def get_schedule(s: Session, schedule_id: str, team: str | None = None) -> Schedule:
    sched = s.get(Schedule, schedule_id)
    if sched is None:
        raise _no_schedule(s, schedule_id, team)
    return owned(sched, team, NotFound(f"no schedule {schedule_id!r}"))


def _no_schedule(s: Session, schedule_id: str, team: str | None = None) -> NotFound:
    """The 404 of an unknown schedule; a deleted one's says where its versions are still served (to its team)."""
    stmt = select(RetiredVersion.id).where(RetiredVersion.schedule_id == schedule_id)
    if team is not None:
        stmt = stmt.where(RetiredVersion.team == team)
    if s.scalar(stmt.limit(1)) is not None:
        return NotFound(f"schedule {schedule_id!r} was deleted; its published versions are still served at "
                        f"/v1/schedules/{schedule_id}/versions")
    return NotFound(f"no schedule {schedule_id!r}")


def lock_schedule(s: Session, schedule_id: str, team: str | None = None) -> Schedule:
    stmt = (select(Schedule).where(Schedule.id == schedule_id).with_for_update()
            .execution_options(populate_existing=True))
    sched = s.scalars(stmt).one_or_none()
    if sched is None:
        raise _no_schedule(s, schedule_id, team)
    return owned(sched, team, NotFound(f"no schedule {schedule_id!r}"))


def list_schedules(s: Session, limit: int = 500, team: str | None = None) -> Sequence[Schedule]:
    stmt = select(Schedule) if team is None else select(Schedule).where(Schedule.team == team)
    return s.scalars(stmt.order_by(Schedule.created_at, Schedule.id).limit(limit)).all()


def schedule_outputs(s: Session) -> dict[str, tuple[str, str]]:
    """``{output_path: (schedule id, team)}`` of every schedule (a new one may not nest in or around another's)."""
    return {row.output_path: (row.id, row.team)
            for row in s.execute(select(Schedule.output_path, Schedule.id, Schedule.team))}


def delete_schedule(s: Session, schedule_id: str, team: str | None = None) -> None:
    """Delete the schedule and its history; refused while a run is going. Its published versions stay on disk
    and are kept as :class:`RetiredVersion` rows, so their URLs under this id keep serving them."""
    sched = lock_schedule(s, schedule_id, team)
    active = active_run(s, schedule_id)
    if active is not None:
        raise Conflict(f"schedule {schedule_id} has run {active.number} going (job {active.job_id}); "
                       "cancel that job or wait for it, then delete")
    now = utcnow()
    for v in versions_of(s, schedule_id):
        s.add(RetiredVersion(schedule_id=v.schedule_id, team=sched.team, number=v.number, path=v.path, job_id=v.job_id,
                             run_number=v.run_number, documents=v.documents, samples=v.samples, tokens=v.tokens,
                             shards=v.shards, published_at=v.published_at, retired_at=now))
    s.execute(delete(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule_id))
    s.execute(delete(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id))
    s.delete(sched)


def due_schedule_ids(s: Session, now: datetime) -> list[str]:
    """Schedules with a slot at or before ``now``, or a buffered slot waiting for its previous run."""
    stmt = (select(Schedule.id).where(Schedule.paused.is_(False))
            .where(or_(Schedule.next_fire_at <= now, Schedule.pending_fire_at.is_not(None)))
            .order_by(Schedule.next_fire_at))
    return list(s.scalars(stmt))


def add_run(s: Session, sched: Schedule, *, fire_at: datetime, state: str, message: str | None = None,
            job_id: str | None = None, version: int | None = None, inputs: dict[str, Any] | None = None,
            fingerprints: dict[str, Any] | None = None) -> ScheduleRun:
    """The schedule's next run (``sched`` must be locked)."""
    sched.run_seq += 1
    run = ScheduleRun(schedule_id=sched.id, number=sched.run_seq, fire_at=fire_at, state=state, message=message,
                      job_id=job_id, version=version, inputs=inputs or {}, fingerprints=fingerprints or {})
    if state != RunState.RUNNING:
        run.ended_at = utcnow()
    s.add(run)
    s.flush()
    return run


def active_run(s: Session, schedule_id: str) -> ScheduleRun | None:
    stmt = select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id, ScheduleRun.state == RunState.RUNNING)
    return s.scalars(stmt.order_by(ScheduleRun.number.desc()).limit(1)).one_or_none()


def running_runs(s: Session) -> Sequence[ScheduleRun]:
    return s.scalars(select(ScheduleRun).where(ScheduleRun.state == RunState.RUNNING).order_by(ScheduleRun.id)).all()


def runs_of(s: Session, schedule_id: str, *, before: int | None = None, limit: int = 50) -> Sequence[ScheduleRun]:
    """Newest first; ``before`` is a run number (the cursor)."""
    stmt = select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id)
    if before is not None:
        stmt = stmt.where(ScheduleRun.number < before)
    return s.scalars(stmt.order_by(ScheduleRun.number.desc()).limit(limit)).all()


def last_consumed_run(s: Session, schedule_id: str) -> ScheduleRun | None:
    """The latest run whose inputs count as read: its fingerprints are the baseline of the next run."""
    stmt = (select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id,
                                      ScheduleRun.state.in_([str(x) for x in CONSUMED]))
            .order_by(ScheduleRun.number.desc()).limit(1))
    return s.scalars(stmt).one_or_none()


def prune_fingerprints(s: Session, run: ScheduleRun) -> None:
    """Drop the snapshots of the runs before ``run`` (a consuming run): only the latest one is ever a baseline,
    and a snapshot holds one entry per input file."""
    s.execute(update(ScheduleRun).where(ScheduleRun.schedule_id == run.schedule_id, ScheduleRun.number < run.number)
              .values(fingerprints={}))


def max_reserved_version(s: Session, schedule_id: str) -> int:
    """The highest version number any run of the schedule reserved (published or not)."""
    value = s.scalar(select(func.max(ScheduleRun.version)).where(ScheduleRun.schedule_id == schedule_id))
    return int(value or 0)


def add_version(s: Session, run: ScheduleRun, *, path: str, documents: int | None, samples: int | None,
                tokens: int | None, shards: int | None) -> ScheduleVersion:
    assert run.version is not None and run.job_id is not None
    version = ScheduleVersion(schedule_id=run.schedule_id, number=run.version, path=path, job_id=run.job_id,
                              run_number=run.number, documents=documents, samples=samples, tokens=tokens,
                              shards=shards)
    s.add(version)
    s.flush()
    return version


#: ``ScheduleVersion.run_number`` of a version adopted from the folder (published before the schedule existed)
ADOPTED_RUN = 0


def adopt_versions(s: Session, sched: Schedule, folders: dict[int, str]) -> list[ScheduleVersion]:
    """Record as ``sched``'s versions the ``{number: folder}`` found in its output folder that a job of this
    service published (a schedule deleted and created again on its folder): the same number, job and figures,
    run :data:`ADOPTED_RUN`. A folder whose jobs all failed is a failed run's: skipped (its number stays
    used). :class:`Conflict`, naming them, for folders no job of this service wrote (copied in, another
    service's) and for jobs still queued or running into the folder: adopting the first would publish what
    this service never checked, and the second would be published by no one."""
    pending = s.scalars(select(Job).where(Job.state.not_in([str(x) for x in TERMINAL])).order_by(Job.seq)).all()
    busy = [f"{os.path.basename(job.output_path)} (job {job.id}, {job.state})" for job in pending
            if os.path.dirname(job.output_path) == sched.output_path]  # a queued job has no folder yet
    real = {os.path.realpath(path): number for number, path in folders.items()}
    jobs = s.scalars(select(Job).where(Job.output_path.in_(list(real))).order_by(Job.seq.desc())).all() \
        if real else []
    written: set[int] = set()
    done: dict[int, Job] = {}
    for job in jobs:  # newest first
        number = real[job.output_path]
        written.add(number)
        if job.state == JobState.SUCCEEDED:
            done.setdefault(number, job)
    unknown = [os.path.basename(folders[n]) for n in sorted(folders) if n not in written]
    if unknown or busy:
        why = [f"{', '.join(unknown)}: no job of this service wrote them"] if unknown else []
        why += [f"{', '.join(busy)}: still being written"] if busy else []
        raise Conflict(f"spec.output.path: {sched.output_path} holds versions this schedule cannot adopt "
                       f"({'; '.join(why)}); move them away, or wait for the jobs, or choose another folder")
    adopted = []
    for number, job in sorted(done.items()):
        summary = job.summary or {}
        version = ScheduleVersion(schedule_id=sched.id, number=number, path=folders[number], job_id=job.id,
                                  run_number=ADOPTED_RUN, documents=summary.get("documents"),
                                  samples=summary.get("samples"), tokens=summary.get("tokens"),
                                  shards=(summary.get("shards") or {}).get("total"),
                                  published_at=job.finished_at or job.updated_at)
        s.add(version)
        adopted.append(version)
    s.flush()
    return adopted


def versions_of(s: Session, schedule_id: str) -> Sequence[ScheduleVersion]:
    stmt = select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule_id)
    return s.scalars(stmt.order_by(ScheduleVersion.number)).all()


def get_version(s: Session, schedule_id: str, number: int | None, team: str | None = None) -> ScheduleVersion:
    """Version ``number``, or the latest one when ``number`` is None; a deleted schedule's from what it kept
    (:func:`served_versions`); :class:`Hidden` for another team's (``team`` given)."""
    sched = s.get(Schedule, schedule_id)
    if sched is not None:
        owned(sched, team, NotFound(f"no schedule {schedule_id!r}"))
    stmt = select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule_id)
    if number is not None:
        stmt = stmt.where(ScheduleVersion.number == number)
    version = s.scalars(stmt.order_by(ScheduleVersion.number.desc()).limit(1)).one_or_none()
    if version is not None:
        return version
    if sched is None:
        kept = served_versions(s, schedule_id, team)  # NotFound for an unknown schedule
        found = [v for v in kept if number is None or v.number == number][-1:]
        if found:
            return found[0]
    which = f"version {number}" if number is not None else "published version yet"
    raise NotFound(f"schedule {schedule_id!r} has no {which}")


def served_versions(s: Session, schedule_id: str, team: str | None = None) -> Sequence[ScheduleVersion]:
    """The versions served under ``schedule_id``, oldest first: the schedule's own, or, once it is deleted,
    those it had then (as detached :class:`ScheduleVersion` objects, never added to the session: the API
    reads them as it reads a live schedule's); :class:`NotFound` for an id no schedule ever had."""
    sched = s.get(Schedule, schedule_id)
    if sched is not None:
        owned(sched, team, NotFound(f"no schedule {schedule_id!r}"))
        return versions_of(s, schedule_id)
    stmt = select(RetiredVersion).where(RetiredVersion.schedule_id == schedule_id).order_by(RetiredVersion.number)
    kept = s.scalars(stmt).all()
    owned(kept[0] if kept else None, team, NotFound(f"no schedule {schedule_id!r}"))
    return [ScheduleVersion(schedule_id=r.schedule_id, number=r.number, path=r.path, job_id=r.job_id,
                            run_number=r.run_number, documents=r.documents, samples=r.samples, tokens=r.tokens,
                            shards=r.shards, published_at=r.published_at) for r in kept]


# ---- audit -----------------------------------------------------------------------------------------------


def add_audit(s: Session, **columns: Any) -> AuditEntry:
    """One audited request (:class:`~service.store.models.AuditEntry`'s columns)."""
    entry = AuditEntry(**columns)
    s.add(entry)
    return entry


def list_audit(s: Session, *, team: str | None = None, key_id: str | None = None, outcome: str | None = None,
               after: datetime | None = None, before_id: int | None = None, limit: int = 50) -> list[AuditEntry]:
    """Newest first; ``before_id`` is the cursor (the id of the last entry of the previous page)."""
    stmt = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    for column, value in ((AuditEntry.team, team), (AuditEntry.key_id, key_id), (AuditEntry.outcome, outcome)):
        if value is not None:
            stmt = stmt.where(column == value)
    if after is not None:
        stmt = stmt.where(AuditEntry.at > after)
    if before_id is not None:
        stmt = stmt.where(AuditEntry.id < before_id)
    return list(s.scalars(stmt))
