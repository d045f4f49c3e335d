"""The control plane's tables: jobs, their attempts, their events, and API keys.

A job is a spec plus a lifecycle (:class:`JobState`); each time a job process is started for it an
:class:`Attempt` row records which process (pid and start time, so a reused pid is never mistaken for
it) and how far its event file has been read. :class:`JobEvent` rows are the job's event log: the
engine's events (``pipeline.job.events``, as written by the job process) and the service's own
``state`` events, numbered per job (``seq``) so a client can resume a stream where it stopped.
A :class:`Schedule` refreshes a corpus on a cron schedule: each firing is a :class:`ScheduleRun` (which
input files it read, the job it queued) and each run that publishes adds a :class:`ScheduleVersion`; a deleted
schedule's versions are kept as :class:`RetiredVersion` rows, so their pinned URLs keep serving their files.

Schema changes go through Alembic revisions in ``service/store/migrations/versions`` (never
``create_all``), so a database made by an older release is upgraded in place.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class JobState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


#: states a job never leaves by itself (only ``retry`` takes FAILED and CANCELLED back to QUEUED)
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: states in which a job process may exist
ACTIVE = frozenset({JobState.RUNNING, JobState.CANCELLING})

#: the lifecycle: every state change goes through :func:`service.store.repo.transition`, which refuses others
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    # back to QUEUED: the job process died without a result and the job resumes as a new attempt;
    # CANCELLED without CANCELLING: the process was cancelled from outside the service (a SIGTERM by hand)
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLING, JobState.CANCELLED,
                                 JobState.QUEUED}),
    JobState.CANCELLING: frozenset({JobState.CANCELLED, JobState.SUCCEEDED, JobState.FAILED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}


#: the team of every key, job, schedule and mixture made before teams existed (revision 0005)
DEFAULT_TEAM = "default"
#: a job's kinds (:attr:`Job.kind`)
PIPELINE, ABLATION = "pipeline", "ablation"


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both backends: SQLite stores no zone, so it is put back on the way out."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware one (UTC)")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


#: JSONB on PostgreSQL (indexable, compact), JSON text elsewhere
JSONType = JSON().with_variant(JSONB(), "postgresql")
#: SQLite autoincrements only an ``INTEGER PRIMARY KEY``
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType}


class Job(Base):
    __tablename__ = "jobs"

    #: insertion order: the queue's tie-break and the list cursor
    seq: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    state: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]]
    spec_hash: Mapped[str] = mapped_column(String(64))
    output_path: Mapped[str] = mapped_column(Text)
    #: ``<api key id or ->:<Idempotency-Key header>``, unique: a repeated submission returns the first job
    idempotency_key: Mapped[str | None] = mapped_column(String(320), unique=True)
    #: sha256 of the submitted spec: the same key with another spec is a conflict, not a repeat
    request_hash: Mapped[str] = mapped_column(String(64))
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    #: the submitting key's team (:mod:`service.api.access`): only its keys and admins see the job
    team: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_TEAM)
    #: what its process runs: the pipeline engine (``pipeline``) or an ablation's steps (``ablation``, revision 0007)
    kind: Mapped[str] = mapped_column(String(16), server_default=PIPELINE)
    #: number of the latest attempt (0: never started)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    failure_category: Mapped[str | None] = mapped_column(String(16))
    error_message: Mapped[str | None] = mapped_column(Text)
    #: figures folded from the events (``service.runner.summary``): what ``GET /v1/jobs/{id}`` shows
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: last ``seq`` given to one of this job's events
    event_seq: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: queue order: a job waits behind those queued before it
    queued_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_jobs_state_queued_at", "state", "queued_at"),
        Index("ix_jobs_created_at", "created_at"),
        Index("ix_jobs_team_seq", "team", "seq"),
        Index("ix_jobs_kind_seq", "kind", "seq"),
    )


class Attempt(Base):
    """One job process: who it is, where its files are, how far its events were read, how it ended."""

    __tablename__ = "job_attempts"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    run_dir: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    #: the process's start time (seconds since the epoch, as the kernel reports it): with the pid, its identity
    proc_started: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    #: succeeded | failed | cancelled | lost (died without a result)
    outcome: Mapped[str | None] = mapped_column(String(16))
    #: the last of the attempt's reported events (:class:`AttemptEvent` ``seq``) already stored as JobEvent rows
    events_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    cancel_sent_at: Mapped[datetime | None]
    #: what the job process is to run (``service.runner.report``): the spec with the service's settings
    run: Mapped[dict[str, Any] | None]
    #: the job process asked to publish its output (``service.runner.publish``) ...
    publish_requested_at: Mapped[datetime | None]
    #: ... and the supervisor's answer, ``granted`` or ``refused``, decided under the job's row lock
    publish_answer: Mapped[str | None] = mapped_column(String(8))

    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_job_attempts_job_number"),)


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    #: 1, 2, ... per job: the server-sent event id
    seq: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, Any]]

    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),)


class AttemptEvent(Base):
    """An event a job process reported, waiting for the supervisor to store it as a :class:`JobEvent` (in
    ``seq`` order: one writer per attempt) and fold it into the job's summary; deleted once stored."""

    __tablename__ = "attempt_events"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    #: 1, 2, ... per attempt, given by the job process
    seq: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]]

    __table_args__ = (UniqueConstraint("job_id", "attempt", "seq", name="uq_attempt_events_job_attempt_seq"),)


class AttemptLog(Base):
    """A piece of a job process's log (``source`` ``job``: its own lines, ``ray``: Ray's output), bytes
    ``offset`` to ``offset + len(data)`` of the file it writes where it runs."""

    __tablename__ = "attempt_logs"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(8))
    offset: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (UniqueConstraint("job_id", "attempt", "source", "offset",
                                       name="uq_attempt_logs_job_attempt_source_offset"),)


class ApiKey(Base):
    """A bearer key: only its sha256 is stored (see :mod:`service.auth`)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    secret_hash: Mapped[str] = mapped_column(String(64))
    #: admin | member | reader (:mod:`service.api.access`); keys made before roles are admins of ``default``
    role: Mapped[str] = mapped_column(String(16))
    team: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


# ---- schedules (corpus refreshes) ------------------------------------------------------------------------


class RunState(StrEnum):
    """What one firing of a schedule came to (see :mod:`service.schedules.scheduler`)."""

    RUNNING = "running"  # its job is queued or running
    SUCCEEDED = "succeeded"  # its job published a new version
    EMPTY = "empty"  # its job found no document that earlier versions had not published: no version
    UNCHANGED = "unchanged"  # no input file was new or changed: no job
    SKIPPED = "skipped"  # the previous run was still going (overlap policy)
    FAILED = "failed"  # refused (paths, preflight) or its job failed or was cancelled


#: runs whose snapshot of the input files is the next run's baseline (what they saw is read or was read before)
CONSUMED = frozenset({RunState.SUCCEEDED, RunState.EMPTY, RunState.UNCHANGED})


class Schedule(Base):
    """A job spec run again on a cron schedule, each run reading only new or changed input files and
    publishing a new version of the shard set under the spec's ``output.path``."""

    __tablename__ = "schedules"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    #: skip | buffer_one
    overlap: Mapped[str] = mapped_column(String(16))
    paused: Mapped[bool] = mapped_column(default=False)
    #: the job spec each run derives its job from (inputs, stages, tokenizer, packing, output folder)
    spec: Mapped[dict[str, Any]]
    #: the resolved ``output.path``: versions are ``v000001/``, ``v000002/``... in it, ``latest`` names the newest
    output_path: Mapped[str] = mapped_column(Text, unique=True)
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    team: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_TEAM)
    #: the next slot the cron expression names (None while paused)
    next_fire_at: Mapped[datetime | None] = mapped_column(index=True)
    #: overlap ``buffer_one``: a slot that came while a run was going, fired once that run ends
    pending_fire_at: Mapped[datetime | None]
    #: number of the last run (runs are numbered 1, 2, ... per schedule)
    run_seq: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ScheduleRun(Base):
    __tablename__ = "schedule_runs"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    #: the cron slot this run is for (unique per schedule: two schedulers never fire one slot twice)
    fire_at: Mapped[datetime]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text)
    job_id: Mapped[str | None] = mapped_column(String(32))
    #: the version number reserved for the run's output (``v{version:06d}``); published only if it succeeds
    version: Mapped[int | None] = mapped_column(Integer)
    #: ``{"new": [paths], "changed": [paths], "unchanged": n, "skipped": n}``: what the run read
    inputs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: ``{path: {size, mtime_ns, sha256, racy}}`` of every input file when the run fired (the next baseline)
    fingerprints: Mapped[dict[str, Any]] = mapped_column(default=dict)

    __table_args__ = (
        UniqueConstraint("schedule_id", "number", name="uq_schedule_runs_number"),
        UniqueConstraint("schedule_id", "fire_at", name="uq_schedule_runs_slot"),
        Index("ix_schedule_runs_state", "state"),
    )


class _VersionColumns:
    """What a version is, live or retired: its number, folder, the job and run that made it, its figures."""

    number: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    job_id: Mapped[str] = mapped_column(String(32))
    run_number: Mapped[int] = mapped_column(Integer)
    #: documents kept, samples, tokens, shards (from the job's figures; None when not produced)
    documents: Mapped[int | None] = mapped_column(BigInteger)
    samples: Mapped[int | None] = mapped_column(BigInteger)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    shards: Mapped[int | None] = mapped_column(Integer)


class ScheduleVersion(_VersionColumns, Base):
    """A published version: an immutable shard set (``path``) that trainers pin by number."""

    __tablename__ = "schedule_versions"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    published_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("schedule_id", "number", name="uq_schedule_versions_number"),)


class RetiredVersion(_VersionColumns, Base):
    """A version of a deleted schedule, kept under the schedule's old id: its folder stays on disk and trainers
    pin ``/v1/schedules/{id}/versions/{n}/artifacts``, so those URLs keep serving it (schedule ids are never
    reused). No foreign key: the schedule row is gone."""

    __tablename__ = "retired_versions"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(String(32))
    #: its schedule's team (the schedule row is gone)
    team: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_TEAM)
    published_at: Mapped[datetime]
    #: when its schedule was deleted
    retired_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("schedule_id", "number", name="uq_retired_versions_number"),)


class StoredMixture(Base):
    """A mixture made by ``POST /v1/mixtures``: its spec, and the mixture file as served (``document``, whose
    sha256 is also its id's source: the same pinned sources give the same mixture)."""

    __tablename__ = "mixtures"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column()
    document: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    samples: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int] = mapped_column(BigInteger)
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    team: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_TEAM)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEntry(Base):
    """One audited request (:mod:`service.api.audit`): every mutating request and every refusal, with who
    asked (the key's id and name, team and role as they were then), what, on what, and how it ended."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    #: None: no well-formed key was shown (a 401)
    key_id: Mapped[str | None] = mapped_column(String(32))
    key_name: Mapped[str | None] = mapped_column(String(200))
    team: Mapped[str | None] = mapped_column(String(64))
    role: Mapped[str | None] = mapped_column(String(16))
    #: ``METHOD /route/{template}``
    action: Mapped[str] = mapped_column(String(200))
    #: the request's path, or what it created (its ``Location``)
    target: Mapped[str] = mapped_column(Text)
    status: Mapped[int] = mapped_column(Integer)
    #: ok | refused
    outcome: Mapped[str] = mapped_column(String(16))
    #: a refusal's reason (its ``detail``, shortened)
    detail: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_audit_team_id", "team", "id"),)


class LeaderLease(Base):
    """Who leads a loop among replicas on PostgreSQL (:mod:`service.runner.lease`); unused on SQLite."""

    __tablename__ = "leader_leases"

    #: the loop: supervisor | scheduler
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: ``host:pid:random`` of the replica that holds (or last held) it
    holder: Mapped[str] = mapped_column(String(200))
    #: raised at each acquisition: a write checks it, so a former holder's write is refused
    token: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime]
    #: by the database's clock; another replica may take the lease only after it
    expires_at: Mapped[datetime]
