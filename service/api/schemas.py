"""What the API returns: response models (the OpenAPI schema) and their construction from store rows.

The request body of ``POST /v1/jobs`` is :class:`pipeline.spec.JobSpec` itself, the model ``tokenmill run``
loads, so the API and the CLI accept exactly the same specs.

The rules of path and query parameters live here too (bounds, patterns), so that the routers declare them once
and the OpenAPI schema states what the server checks: an integer never reaches the store beyond what its column
holds (a 422 naming the parameter, not an overflow), and a U+0000 in any string of a request is a 422 naming
the field on every store (PostgreSQL text cannot hold it; SQLite would store it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal
from zoneinfo import available_timezones

from fastapi import Path
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError
from sqlalchemy.engine import Row

from pipeline import secret_fields
from pipeline.spec import JobSpec
from service.admission import NUL_MESSAGE
from service.schedules.cron import MACROS, check_cron, check_timezone, upcoming
from service.schedules.versions import DEDUP_STAGES
from service.store.models import ApiKey, Attempt, Job, JobState, RunState, Schedule, ScheduleRun, ScheduleVersion
from service.store.repo import AttemptRow

# ---- what a request's parameters may be ------------------------------------------------------------------

#: the largest value of an ``Integer`` column (attempt, event, run and version numbers: 4 bytes on PostgreSQL)
INT32_MAX = 2**31 - 1
#: the largest value of a ``BigInteger`` column (a job's sequence number)
INT64_MAX = 2**63 - 1
#: what ``secrets.token_hex(8)`` gives: a job's or a schedule's id (another string is 404: no such thing)
ID_PATTERN = r"^[0-9a-f]{16}$"
#: a page cursor: a job's sequence number as 16 hex digits, below 2**63 (:data:`INT64_MAX`)
CURSOR_PATTERN = r"^[0-7][0-9a-f]{15}$"
#: an artifact's name: up to 4 parts of ``[A-Za-z0-9_.-]`` not starting with ``.`` (routers/artifacts.py, 400)
ARTIFACT_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}){0,3}$"
#: a cron expression's shape: one of the macros (any case) or five fields of the characters cron syntax
#: uses; croniter then checks the fields' values (service/schedules/cron.py), and that the expression fires
_FIELD = r"[0-9A-Za-z*?/,#-]+"
_MACRO = "|".join("".join(f"[{c.upper()}{c}]" for c in m[1:]) for m in sorted(MACROS))
CRON_PATTERN = rf"^[ \t]*(@({_MACRO})|{_FIELD}([ \t]+{_FIELD}){{4}})[ \t]*$"
#: a time in a query: ISO 8601 (a time without a zone is UTC); pydantic would also take a number as Unix time,
#: which the schema's ``date-time`` does not say
_NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*[-+]?(inf|infinity|nan)\s*$", re.I)
#: a string without U+0000 (stated in the schema; :func:`no_nul` checks it with a message that says so)
NUL_FREE = r"^[^\x00]*$"


def no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_character", NUL_MESSAGE)  # the type admission's problems have
    return value


def _iso_time(value: Any) -> Any:
    if isinstance(value, str) and _NUMBER.match(value):
        raise PydanticCustomError("datetime_from_number", "an ISO 8601 date and time (2024-05-01T12:00:00Z), "
                                                          "not a number")
    return value


Time = Annotated[datetime, BeforeValidator(_iso_time)]
#: a job spec as every response shows it: each secret field ``<redacted>`` (:mod:`pipeline.secret_fields`); the
#: one place a spec leaves the API
ShownSpec = Annotated[dict[str, Any], AfterValidator(secret_fields.redact)]
#: a string of a request: no U+0000, refused alike on every store
Text = Annotated[str, AfterValidator(no_nul), Field(json_schema_extra={"pattern": NUL_FREE})]

# path parameters: the schema gives an id's form, the server answers 404 for any other (no such job), 422 for
# one with U+0000
JobId = Annotated[str, Path(description="a job's id", json_schema_extra={"pattern": ID_PATTERN}),
                  AfterValidator(no_nul)]
ScheduleId = Annotated[str, Path(description="a schedule's id", json_schema_extra={"pattern": ID_PATTERN}),
                       AfterValidator(no_nul)]
#: checked by ``routers/artifacts.check_name`` (400 for another form), U+0000 included
ArtifactName = Annotated[str, Path(description="a published file's path below the artifacts URL",
                                   json_schema_extra={"pattern": ARTIFACT_NAME_PATTERN, "maxLength": 512})]


class ErrorInfo(BaseModel):
    category: str = Field(description="validation | input | app | infra | cancelled")
    message: str | None = None


class JobOut(BaseModel):
    id: str
    name: str
    state: JobState
    attempt: int = Field(description="number of the latest attempt (0: not started yet)")
    output_path: str
    team: str = Field(description="the submitting key's team: who may see and act on the job")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: ErrorInfo | None = None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(**_base(job))


class StageFigures(BaseModel):
    model_config = ConfigDict(extra="allow")  # a stage's own counters and score summaries come along

    stage: str
    docs_in: int = 0
    docs_out: int = 0
    dropped: dict[str, int] = Field(default_factory=dict, description="documents dropped, per reason")
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


class PhaseInfo(BaseModel):
    state: str = Field(description="started | finished | skipped")
    seconds: float = 0.0


class Progress(BaseModel):
    done: int
    total: int | None = None
    unit: str | None = None
    per_s: float | None = None


class Shards(BaseModel):
    done: int = Field(0, description="shards written or kept from an earlier attempt, in the latest attempt")
    written: int = 0
    reused: int = Field(0, description="kept from an earlier attempt, not recomputed")
    total: int | None = Field(None, description="known once the write phase has ended")


class Throughput(BaseModel):
    docs_per_s: float | None = None
    tokens_per_s: float | None = None


class Series(BaseModel):
    """Throughput over time: cumulative ``[seconds since the attempt started, total so far]`` points (at most a
    few hundred: a long attempt keeps every other one), rates being the steps between consecutive points."""

    docs: list[tuple[float, int]] = Field(default_factory=list, description="documents read (curate)")
    tokens: list[tuple[float, int]] = Field(default_factory=list,
                                            description="tokens of the shards this attempt wrote, not those kept")


class AttemptOut(AttemptRow):
    """An attempt: the store's :class:`~service.store.repo.AttemptRow`, its fields declared there once."""

    @classmethod
    def of(cls, att: Attempt | AttemptRow) -> AttemptOut:
        return cls.model_validate(att, from_attributes=True)


class JobDetail(JobOut):
    phase: str | None = Field(None, description="the phase running now")
    phases: dict[str, PhaseInfo] = Field(default_factory=dict)
    progress: dict[str, Progress] = Field(default_factory=dict)
    stages: list[StageFigures] = Field(default_factory=list)
    shards: Shards = Field(default_factory=Shards)
    samples: int | None = None
    tokens: int | None = None
    documents: int | None = None
    throughput: Throughput = Field(default_factory=Throughput)
    series: Series = Field(default_factory=Series)
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per phase, and total")
    resumed_phases: list[str] = Field(default_factory=list, description="phases the latest attempt skipped")
    attempts: list[AttemptOut] = Field(default_factory=list)
    spec: ShownSpec

    @classmethod
    def of_job(cls, job: Job | Row[Any], attempts: Sequence[Attempt | AttemptRow]) -> JobDetail:
        """From the ORM objects or from :func:`service.store.repo.job_status`'s rows (same attribute names)."""
        s = job.summary or {}
        shards = s.get("shards") or {}
        return cls(
            **_base(job),
            phase=s.get("phase"),
            phases={k: PhaseInfo(state=v.get("state", "?"), seconds=v.get("seconds", 0.0))
                    for k, v in (s.get("phases") or {}).items()},
            progress={k: Progress(**v) for k, v in (s.get("progress") or {}).items()},
            stages=[StageFigures(stage=k, **v) for k, v in (s.get("stages") or {}).items()],
            shards=Shards(done=shards.get("written", 0) + shards.get("reused", 0), written=shards.get("written", 0),
                          reused=shards.get("reused", 0), total=shards.get("total")),
            samples=s.get("samples"), tokens=s.get("tokens"), documents=s.get("documents"),
            throughput=Throughput(**(s.get("throughput") or {})),
            series=Series(**(s.get("series") or {})),
            timings={k: float(v) for k, v in (s.get("seconds") or {}).items() if isinstance(v, int | float)},
            resumed_phases=s.get("resumed_phases") or [],
            attempts=[AttemptOut.of(a) for a in attempts],
            spec=job.spec,
        )


class JobList(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page; null on the last")


class Problem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ProblemList(BaseModel):
    detail: list[Problem]


class Message(BaseModel):
    detail: str


class Health(BaseModel):
    status: str


class Check(BaseModel):
    ok: bool
    detail: str


class Leader(BaseModel):
    """Whether this replica leads each loop (one replica leads each; every replica serves the API)."""

    supervisor: bool = Field(description="this replica runs the jobs")
    scheduler: bool = Field(description="this replica fires the schedules")


class Readiness(BaseModel):
    status: str = Field(description="ready | not_ready (leadership does not count: every replica serves)")
    checks: dict[str, Check]
    leader: Leader


class ApiKeyOut(BaseModel):
    id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, key: ApiKey) -> ApiKeyOut:
        return cls(id=key.id, name=key.name, created_at=key.created_at, revoked_at=key.revoked_at,
                   last_used_at=key.last_used_at)


def _base(job: Job | Row[Any]) -> dict[str, Any]:
    error = None
    if job.state in (JobState.FAILED, JobState.CANCELLED) and job.failure_category:
        error = ErrorInfo(category=job.failure_category, message=job.error_message)
    return {"id": job.id, "name": job.name, "state": JobState(job.state), "attempt": job.attempt,
            "output_path": job.output_path, "team": job.team, "created_at": job.created_at,
            "updated_at": job.updated_at,
            "started_at": job.started_at, "finished_at": job.finished_at, "error": error}


# ---- schedules and artifacts -----------------------------------------------------------------------------

Overlap = Literal["skip", "buffer_one"]


def _cron(value: str) -> str:
    return check_cron(value)


def _zone(value: str) -> str:
    return check_timezone(value)


#: a cron expression: :data:`CRON_PATTERN`'s shape (checked first: the schema says what the server refuses),
#: then croniter's rules
Cron = Annotated[str, Field(max_length=200, pattern=CRON_PATTERN,
                            description="five fields (minute hour day-of-month month day-of-week) or @hourly, "
                                        "@daily...; one that never fires (Feb 30) is refused too"),
                 AfterValidator(_cron)]
#: an IANA zone this machine knows: the schema lists them (what check_timezone accepts, exactly)
Zone = Annotated[str, Field(max_length=64, description="IANA name",
                            json_schema_extra={"enum": sorted(available_timezones())}), AfterValidator(_zone)]
ScheduleName = Annotated[Text, Field(min_length=1, max_length=200)]


def _needs_dedup(schema: dict[str, Any]) -> None:
    """A schedule's spec in the JSON schema: a job spec with an ``exact_dedup`` or ``near_dedup`` stage (what
    :func:`service.api.routers.schedules.check_spec` refuses otherwise, ``dedup_required``)."""
    rule = {"required": ["stages"], "properties": {"stages": {"contains": {
        "required": ["type"], "properties": {"type": {"enum": list(DEDUP_STAGES)}}}}}}
    for option in schema.get("anyOf", [schema]):  # SchedulePatch's: the spec, or null
        if "$ref" in option:
            option["allOf"] = [{"$ref": option.pop("$ref")}, rule]


class ScheduleIn(BaseModel):
    """A job spec run on a cron schedule; every run reads only new or changed input files and publishes a
    new version in ``spec.output.path`` (``v000001/``, ``v000002/``..., ``latest``)."""

    model_config = ConfigDict(extra="forbid")

    name: ScheduleName | None = Field(None, description="default: spec.name")
    cron: Cron
    timezone: Zone = "UTC"
    overlap: Overlap = Field("skip", description="a slot that comes while the previous run is going: skip it, "
                                                  "or keep one and run it when that run ends (buffer_one)")
    paused: bool = False
    spec: JobSpec = Field(description="needs an exact_dedup or near_dedup stage (what earlier versions "
                                      "published is dropped there)", json_schema_extra=_needs_dedup)


class SchedulePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ScheduleName | None = None
    cron: Cron | None = None
    timezone: Zone | None = None
    overlap: Overlap | None = None
    spec: JobSpec | None = Field(None, description="its output.path cannot change (409 naming it); needs an "
                                                   "exact_dedup or near_dedup stage", json_schema_extra=_needs_dedup)


class RunInputs(BaseModel):
    new: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    unchanged: int = 0
    skipped: int = Field(0, description="files in the input folders of no format a folder is read by")


class ScheduleRunOut(BaseModel):
    number: int
    fire_at: datetime = Field(description="the cron slot")
    started_at: datetime
    ended_at: datetime | None
    state: RunState
    message: str | None
    job_id: str | None
    version: int | None = Field(description="the version its job writes (published when the run succeeded)")
    inputs: RunInputs = Field(description="the input files it read: new, changed (and how many it left)")

    @classmethod
    def of(cls, run: ScheduleRun) -> ScheduleRunOut:
        return cls(number=run.number, fire_at=run.fire_at, started_at=run.started_at, ended_at=run.ended_at,
                   state=RunState(run.state), message=run.message, job_id=run.job_id, version=run.version,
                   inputs=RunInputs(**{k: v for k, v in (run.inputs or {}).items() if k in RunInputs.model_fields}))


class ScheduleRunList(BaseModel):
    items: list[ScheduleRunOut]
    next_cursor: int | None = Field(None, description="pass as ?before= for older runs; null on the last page")


class ScheduleOut(BaseModel):
    id: str
    name: str
    cron: str
    timezone: str
    overlap: Overlap
    paused: bool
    output_path: str
    team: str
    next_fire_at: datetime | None
    next_fire_times: list[datetime] = Field(description="the next slots (none while paused)")
    pending_fire_at: datetime | None = Field(None, description="buffer_one: a slot waiting for the running run")
    latest_version: int | None
    last_run: ScheduleRunOut | None
    created_at: datetime
    updated_at: datetime
    spec: ShownSpec

    @classmethod
    def of(cls, sched: Schedule, latest: int | None, last_run: ScheduleRun | None) -> ScheduleOut:
        return cls(id=sched.id, name=sched.name, cron=sched.cron, timezone=sched.timezone, overlap=sched.overlap,
                   paused=sched.paused, output_path=sched.output_path, team=sched.team,
                   next_fire_at=sched.next_fire_at,
                   next_fire_times=upcoming(sched.cron, sched.timezone, sched.next_fire_at),
                   pending_fire_at=sched.pending_fire_at, latest_version=latest,
                   last_run=ScheduleRunOut.of(last_run) if last_run is not None else None,
                   created_at=sched.created_at, updated_at=sched.updated_at, spec=sched.spec)


class ScheduleList(BaseModel):
    items: list[ScheduleOut]


class VersionOut(BaseModel):
    number: int
    path: str
    job_id: str
    run: int = Field(description="the run that published it; 0: adopted from the folder when the schedule was "
                                 "created (an earlier schedule's)")
    documents: int | None
    samples: int | None
    tokens: int | None
    shards: int | None
    published_at: datetime
    artifacts: str = Field(description="base URL path of its files (a trainer's --data)")

    @classmethod
    def of(cls, v: ScheduleVersion) -> VersionOut:
        return cls(number=v.number, path=v.path, job_id=v.job_id, run=v.run_number, documents=v.documents,
                   samples=v.samples, tokens=v.tokens, shards=v.shards, published_at=v.published_at,
                   artifacts=f"/v1/schedules/{v.schedule_id}/versions/{v.number}/artifacts")


class VersionList(BaseModel):
    items: list[VersionOut]
    latest: int | None


class ArtifactOut(BaseModel):
    name: str = Field(description="path below the artifacts URL")
    bytes: int
    sha256: str = Field(description="also the file's ETag")


class ArtifactList(BaseModel):
    files: list[ArtifactOut]
