"""``/v1/jobs``: submit, list, inspect, follow (server-sent events), read logs, cancel, retry."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from pipeline.problems import Problem
from pipeline.spec import JobSpec
from service import ownership
from service.admission import Refused, admit
from service.api import access, event_stream, schemas
from service.api.deps import DbDep, KeyDep, SettingsDep, SupervisorDep
from service.api.openapi import links
from service.api.schemas import INT32_MAX, JobId
from service.runner.report import log_tail
from service.store import repo
from service.store.db import Database
from service.store.models import PIPELINE, TERMINAL, ApiKey, JobState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=access.forbidden())
SubmitKey = Annotated[ApiKey, access.may("submit jobs")]
CancelKey = Annotated[ApiKey, access.may("cancel jobs")]
RetryKey = Annotated[ApiKey, access.may("retry jobs")]

#: most bytes of a log one request returns (its end); ``tail_bytes`` asks for less
MAX_LOG_BYTES = 4 << 20
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": schemas.Message, "description": "no such job"}}
#: a job's events and log are not JSON (their errors are: service/api/openapi.py documents them so)
_SSE = {"description": "`event:`, `id:` and `data:` (JSON) lines per event; the stream ends with the job",
        "content": {"text/event-stream": {"itemSchema": event_stream.ITEM_SCHEMA}}}
_LOG = {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "the end of the attempt's log",
        "headers": {"X-Attempt": {"schema": {"type": "integer"}, "description": "the attempt it is (0: none yet)"}}}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": schemas.Message, "description": "not possible in the job's state"}}
#: a submission's 409s: the idempotency one is a message, the output folder's a problem at `output.path`
_OUTPUT_CONFLICT: dict[str, Any] = {
    "description": "the Idempotency-Key was used for another spec; or `output.path` holds an earlier run's output "
                   "(set `output.overwrite`), an unfinished job of another spec, or files tokenmill did not write",
    "content": {"application/json": {"schema": {"anyOf": [{"$ref": "#/components/schemas/Message"},
                                                          {"$ref": "#/components/schemas/ProblemList"}]}}}}
#: a spec may also be sent as written, in YAML (read by the edge: :mod:`service.api.yaml_body`)
_YAML_BODY = {"requestBody": {"content": {"application/yaml": {"schema": {"$ref": "#/components/schemas/JobSpec"}}}}}
#: what a created job's id leads to (not /events: a queued job's stream lasts until the job ends)
_LINKS = links("job_id", {"GetJob": ("get", "/v1/jobs/{job_id}"), "CancelJob": ("post", "/v1/jobs/{job_id}/cancel"),
                          "RetryJob": ("post", "/v1/jobs/{job_id}/retry"), "GetLogs": ("get", "/v1/jobs/{job_id}/logs"),
                          "ListArtifacts": ("get", "/v1/jobs/{job_id}/artifacts")})


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.JobOut, responses={
    201: {"links": _LINKS},
    200: {"model": schemas.JobOut, "description": "the job this Idempotency-Key created earlier", "links": _LINKS},
    **access.forbidden("a path outside the roots or in another team's folder"),
    409: _OUTPUT_CONFLICT,
    422: {"model": schemas.ProblemList, "description": "an invalid spec (one problem per field path), or an "
                                                       "`output.path` that is, lies inside or contains an input"},
}, openapi_extra=_YAML_BODY)
def submit_job(spec: JobSpec, response: Response, key: SubmitKey, db: DbDep, settings: SettingsDep,
               supervisor: SupervisorDep,
               idempotency_key: Annotated[str | None, Header(max_length=255, min_length=1)] = None) -> schemas.JobOut:
    """Queue a job. The body is a job spec, as for `tokenmill run` (JSON, or YAML with `Content-Type:
    application/yaml`), with absolute paths inside the service's roots.

    The output folder is checked as `tokenmill run` checks it, at once: 409 when it holds an earlier run's
    output without `output.overwrite`, an unfinished job of another spec, or files tokenmill did not write;
    422 when it overlaps an input. A job queued behind another on the same folder is accepted.
    With an `Idempotency-Key` header, repeating the request returns the job the first one created (200)."""
    data = spec.model_dump(mode="json")
    with db.read() as s:  # a repeat gets its job whatever its run has put in the folder since
        earlier = repo.repeated_job(s, data, idempotency_key=idempotency_key, api_key_id=key.id)
        repeat = schemas.JobOut.of(earlier) if earlier is not None else None
    if repeat is not None:
        response.headers["Location"] = f"/v1/jobs/{repeat.id}"
        response.status_code = status.HTTP_200_OK
        return repeat
    admit(spec, settings, team=key.team, scope=access.team_scope(key))
    out_path = os.path.realpath(spec.output.path)
    with db.session() as s:
        if repo.writing_into(s, out_path, other_than=key.team):  # not joinable: the folder becomes theirs
            raise Refused(status.HTTP_403_FORBIDDEN, [Problem(("output", "path"), (
                f"{out_path} belongs to another team (its job is queued or running into it); choose another folder"),
                ownership.OTHER_TEAM)])
        job, created = repo.create_job(
            s, data, name=spec.name, spec_hash=spec.content_hash(), output_path=out_path,
            idempotency_key=idempotency_key, api_key_id=key.id, team=key.team)
        out = schemas.JobOut.of(job)
    response.headers["Location"] = f"/v1/jobs/{out.id}"
    if created:
        if supervisor is not None:
            supervisor.wake()
    else:
        response.status_code = status.HTTP_200_OK
    return out


@router.get("", response_model=schemas.JobList)
def list_jobs(key: KeyDep, db: DbDep,
              state: Annotated[list[JobState], Query(description="repeat to match any of several")] = [],  # noqa: B006
              name: Annotated[schemas.Text | None, Query(max_length=200)] = None,
              created_after: schemas.Time | None = None, created_before: schemas.Time | None = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              cursor: Annotated[str | None, Query(pattern=schemas.CURSOR_PATTERN,
                                                  description="the previous page's next_cursor")] = None,
              team: Annotated[str | None, Query(pattern=access.TEAM_RE.pattern, description=(
                  "an admin's filter (others see their own team's jobs only)"))] = None,
              ) -> schemas.JobList:
    """Jobs, newest first, filtered; follow `next_cursor` for the next page. A key sees its own team's jobs
    (an admin, every team's). Ablations are listed apart (`/v1/ablations`)."""
    scope = access.list_scope(key, team)
    with db.read() as s:
        jobs = repo.list_jobs(s, states=[str(x) for x in state], name=name, created_after=_aware(created_after),
                              created_before=_aware(created_before), before_seq=int(cursor, 16) if cursor else None,
                              limit=limit + 1, team=scope, kind=PIPELINE)
        items = [schemas.JobOut.of(j) for j in jobs[:limit]]
    return schemas.JobList(items=items, next_cursor=_encode_cursor(jobs[limit - 1].seq) if len(jobs) > limit else None)


@router.get("/{job_id}", response_model=schemas.JobDetail, responses=_NOT_FOUND)
async def get_job(job_id: JobId, key: KeyDep, db: DbDep) -> schemas.JobDetail:
    """State, attempts, per-stage documents in/out/dropped per reason, tokens, shards, throughput, timings."""
    # what clients poll: async, and the read goes through Database.run_read, not the thread pool (a sync route
    # would send its dependencies, its body and the response's validation there, each a handoff)
    scope = access.team_scope(key)
    job, attempts = await db.run_read(lambda conn: repo.job_status(conn, job_id, scope))
    return schemas.JobDetail.of_job(job, attempts)


@router.post("/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=schemas.JobOut,
             responses={**_NOT_FOUND, **_CONFLICT})
def cancel_job(job_id: JobId, key: CancelKey, db: DbDep, supervisor: SupervisorDep) -> schemas.JobOut:
    """A queued job is CANCELLED at once; a running one becomes CANCELLING, then CANCELLED once its process
    has stopped (SIGTERM: its Ray work is cancelled and nothing is published). 409 for a finished job, and for
    one that publishes its output already (cancel and publish are one decision: it ends SUCCEEDED)."""
    with db.session() as s:
        out = schemas.JobOut.of(repo.cancel_job(s, job_id, access.team_scope(key)))
    if supervisor is not None:
        supervisor.wake()
    return out


@router.post("/{job_id}/retry", status_code=status.HTTP_202_ACCEPTED, response_model=schemas.JobOut,
             responses={**_NOT_FOUND, **_CONFLICT})
def retry_job(job_id: JobId, key: RetryKey, db: DbDep, supervisor: SupervisorDep) -> schemas.JobOut:
    """Queue a FAILED or CANCELLED job again; its next attempt resumes: finished phases are skipped and
    shards already written are kept, not recomputed."""
    with db.session() as s:
        out = schemas.JobOut.of(repo.retry_job(s, job_id, access.team_scope(key)))
    if supervisor is not None:
        supervisor.wake()
    return out


@router.get("/{job_id}/logs", response_class=PlainTextResponse, responses={**_NOT_FOUND, 200: _LOG})
def get_logs(job_id: JobId, key: KeyDep, db: DbDep,
             attempt: Annotated[int | None, Query(ge=1, le=INT32_MAX, description="default: the latest")] = None,
             tail_bytes: Annotated[int, Query(ge=0, le=MAX_LOG_BYTES)] = MAX_LOG_BYTES,
             source: Annotated[Literal["job", "ray"], Query(description=(
                 "`job`: the job process's log, tokenmill's own lines; `ray`: Ray's output (its core, its loggers, "
                 "Ray Data's), kept apart"))] = "job") -> PlainTextResponse:
    """The job process's log (`source=job`, tokenmill's lines) or its Ray's (`source=ray`), the last `tail_bytes`."""
    with db.read() as s:
        job = repo.get_job(s, job_id, access.team_scope(key))
        number = attempt or job.attempt
        if number == 0:
            return PlainTextResponse("", headers={"X-Attempt": "0"})
        repo.get_attempt(s, job_id, number)
        data = log_tail(s, job_id, number, source, tail_bytes)  # shipped by the job process: service.runner.report
    return PlainTextResponse(data.decode("utf-8", errors="replace"), headers={"X-Attempt": str(number)})


def _event_cursor(last_event_id: Annotated[int | None, Header(ge=0, le=INT32_MAX, description=(
                      "the id of the last event received: the stream goes on after it"))] = None,
                  after: Annotated[int | None, Query(ge=0, le=INT32_MAX, description="as Last-Event-ID")] = None,
                  ) -> int:
    """Where the stream starts: after ``Last-Event-ID`` (what a reconnecting EventSource sends), else ``after``."""
    return last_event_id if last_event_id is not None else after or 0


async def _existing_job(job_id: JobId, key: KeyDep, db: DbDep) -> str:
    """The job's id, once it is known to be one the key may see (404 otherwise, before the stream starts)."""
    def check() -> None:
        with db.read() as s:
            repo.get_job(s, job_id, access.team_scope(key))

    await run_in_threadpool(check)
    return job_id


@router.get("/{job_id}/events", response_class=event_stream.EventStream, responses={**_NOT_FOUND, 200: _SSE})
async def follow_events(request: Request, key: KeyDep, db: DbDep, settings: SettingsDep,
                        job_id: Annotated[str, Depends(_existing_job)],
                        after: Annotated[int, Depends(_event_cursor)]) -> event_stream.EventStream:
    """The job's events as server-sent events (`event:` the type, `id:` its number, `data:` JSON), from the
    start or after `Last-Event-ID`; the stream ends after the event that makes the job SUCCEEDED, FAILED or
    CANCELLED. `state` events are the service's (the lifecycle); the others are the job engine's. Every
    event's data carries the `attempt` it belongs to."""
    async def page(last: int) -> event_stream.Page:
        # up to 500 events a page: in the thread pool whatever the store (the GIL is handed back every 5 ms)
        rows, state = await run_in_threadpool(_events_page, db, job_id, last)
        return rows, state in TERMINAL

    # a plain streaming body, not FastAPI's SSE tasks: a client that leaves is a normal end (service/api/event_stream)
    return event_stream.EventStream(event_stream.events(page, request, settings.events_poll_s, after))


def _events_page(db: Database, job_id: str, after: int) -> tuple[list[tuple[int, str, dict]], str]:
    """The job's state, then the events after ``after``: the terminal state and its event are committed
    together, so when the state read first is terminal the events read next include its event, and a page
    with no event after a terminal state means the stream has sent everything (on SQLite both reads see one
    snapshot; on PostgreSQL, read committed, this order is what makes it hold)."""
    with db.read() as s:
        state = repo.get_job(s, job_id).state
        rows = [(e.seq, e.type, {**e.data, "attempt": e.attempt}) for e in repo.events_after(s, job_id, after)]
        return rows, state


# ---- helpers --------------------------------------------------------------------------------------------


def _aware(t: datetime | None) -> datetime | None:
    """A time without a zone is taken as UTC."""
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


def _encode_cursor(seq: int) -> str:
    """The last job's sequence number as :data:`~service.api.schemas.CURSOR_PATTERN` says: every string of
    that form is a cursor (it reads as "jobs before this one"), so the schema is the whole rule."""
    return f"{seq:016x}"
