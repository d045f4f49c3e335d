"""``/v1/ablations``: ``tokenmill ablate`` run by the service (issue 40).

An ablation is a job of kind ``ablation``: the supervisor queues, launches, cancels and resumes it as any job
(its process runs the ablation's steps, :mod:`service.runner.ablation_attempt`), and its log and events are a
job's (``/v1/jobs/{id}/logs``, ``.../events``). ``POST`` takes the ablation file as JSON with absolute paths
inside the service's roots (a proxy config may also be one shipped with tokenmill); ``GET`` shows its state,
the steps its step log records as done and, once written, the summary of its ``ablation.json``: per variant
the mean and seed spread of each score, and the gaps between variants.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response, status
from pydantic import BaseModel, Field

from pipeline.preflight import input_problems
from pipeline.problems import Problem, SpecError
from service import ownership
from service.ablation.confine import plan_problems, problems
from service.ablation.plan import Layout, make_plan
from service.ablation.spec import AblationSpec
from service.admission import Refused, nul_problems
from service.api import access, schemas
from service.api.deps import DbDep, KeyDep, SettingsDep, SupervisorDep
from service.api.openapi import links
from service.store import repo
from service.store.models import ABLATION, ApiKey, Job, JobState

router = APIRouter(prefix="/v1/ablations", tags=["ablations"], responses=access.forbidden())
SubmitKey = Annotated[ApiKey, access.may("submit ablations")]
CancelKey = Annotated[ApiKey, access.may("cancel ablations")]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": schemas.Message, "description": "no such ablation"}}
_LINKS = links("ablation_id", {"GetAblation": ("get", "/v1/ablations/{ablation_id}"),
                               "CancelAblation": ("post", "/v1/ablations/{ablation_id}/cancel")})


class Score(BaseModel):
    mean: float
    spread: float = Field(description="max - min over the seeds")
    n: int = Field(description="seeds")


class AblationOut(BaseModel):
    id: str = Field(description="its job's id (its log: /v1/jobs/{id}/logs)")
    name: str
    team: str
    state: JobState
    attempt: int
    out: str = Field(description="the ablation's folder")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: schemas.ErrorInfo | None = None
    steps_done: list[str] = Field(default_factory=list, description="steps its step log records as done")
    scores: dict[str, dict[str, Score]] | None = Field(
        None, description="per variant, per score (common: bits per byte on the common validation set)")
    gaps: dict[str, dict[str, Any]] | None = Field(None, description="per pair A-B: mean(A) - mean(B) per score")

    @classmethod
    def of(cls, job: Job) -> AblationOut:
        base = schemas.JobOut.of(job)
        out = Path(job.output_path)
        data = _read_json(out / "ablation.json") if job.state == JobState.SUCCEEDED else None
        scores = {name: {k: Score(**{f: s[f] for f in Score.model_fields}) for k, s in v["scores"].items() if s}
                  for name, v in data["variants"].items()} if data else None
        return cls(id=job.id, name=job.name, team=job.team, state=base.state, attempt=job.attempt, out=str(out),
                   created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                   error=base.error, steps_done=_steps_done(Layout(out).steps), scores=scores,
                   gaps=data.get("gaps") if data else None)


class AblationList(BaseModel):
    items: list[AblationOut]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _steps_done(path: Path) -> list[str]:
    """The steps recorded done, in the order they finished (service/ablation/steps.py's log)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    done: dict[str, None] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "done":
            done[str(record.get("step"))] = None
    return list(done)


def _admit(spec: AblationSpec, key: ApiKey, settings: SettingsDep) -> None:
    """As a job spec is admitted: U+0000 (422), paths outside the roots or in another team's folder (403), a raw
    input that matches no file (422), then the plan (each variant's job spec, 422 at ``variants.NAME...``)."""
    nul = nul_problems(spec.model_dump(mode="json"))
    if nul:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, nul)
    roots = settings.roots(access.team_scope(key))
    refused = problems(spec, roots)
    if refused:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(p.loc, p.msg, "path_not_allowed") for p in refused])
    missing = input_problems(spec.raw, ("raw", "path"))
    if missing:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, missing)
    try:
        plan = make_plan(spec)
    except SpecError as exc:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.problems) from None
    refused = plan_problems(plan, roots)
    if refused:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(p.loc, p.msg, "path_not_allowed") for p in refused])
    foreign = [p for job in plan.jobs.values() for p in ownership.problems(job, writer=key.team, reader=None)]
    if foreign:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(("out",), foreign[0].msg, foreign[0].kind)])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=AblationOut, responses={
    201: {"links": _LINKS},
    200: {"model": AblationOut, "description": "the ablation this Idempotency-Key created earlier", "links": _LINKS},
    **access.forbidden("a path outside the roots or in another team's folder"),
    409: {"model": schemas.Message, "description": "the Idempotency-Key was used for another request"},
    422: {"model": schemas.ProblemList, "description": "an invalid ablation file: one problem per field path"},
})
def submit_ablation(spec: AblationSpec, response: Response, key: SubmitKey, db: DbDep, settings: SettingsDep,
                    supervisor: SupervisorDep,
                    idempotency_key: Annotated[str | None, Header(max_length=255, min_length=1)] = None,
                    ) -> AblationOut:
    """Queue an ablation: the ablation file of `tokenmill ablate`, as JSON, with absolute paths inside the
    service's roots. It runs as a job (its log: `/v1/jobs/{id}/logs`); a rerun of the same file into the same
    `out` skips the steps an earlier run finished. With an `Idempotency-Key` header, repeating the request
    returns the ablation the first one created (200), as `POST /v1/jobs` does."""
    data = spec.model_dump(mode="json", exclude_none=True)
    with db.read() as s:  # a repeat gets its ablation whatever its run has written since
        earlier = repo.repeated_job(s, data, idempotency_key=idempotency_key, api_key_id=key.id)
        repeat = AblationOut.of(earlier) if earlier is not None else None
    if repeat is not None:
        response.headers["Location"] = f"/v1/ablations/{repeat.id}"
        response.status_code = status.HTTP_200_OK
        return repeat
    _admit(spec, key, settings)
    with db.session() as s:
        job, created = repo.create_job(s, data, name=spec.name, spec_hash=repo.request_hash(data),
                                       output_path=os.path.realpath(spec.out), idempotency_key=idempotency_key,
                                       api_key_id=key.id, team=key.team, kind=ABLATION)
        out = AblationOut.of(job)
    response.headers["Location"] = f"/v1/ablations/{out.id}"
    if created:
        if supervisor is not None:
            supervisor.wake()
    else:
        response.status_code = status.HTTP_200_OK
    return out


@router.get("", response_model=AblationList)
def list_ablations(key: KeyDep, db: DbDep) -> AblationList:
    """The ablations, newest first (a key's own team's; an admin's, every team's), up to 100."""
    with db.read() as s:
        jobs = repo.list_jobs(s, kind=ABLATION, team=access.team_scope(key), limit=100)
        return AblationList(items=[AblationOut.of(j) for j in jobs])


def _get(s: Any, ablation_id: str, key: ApiKey) -> Job:
    job = repo.get_job(s, ablation_id, access.team_scope(key))
    if job.kind != ABLATION:
        raise repo.NotFound(f"no ablation {ablation_id!r}")
    return job


@router.get("/{ablation_id}", response_model=AblationOut, responses=_NOT_FOUND)
def get_ablation(ablation_id: schemas.JobId, key: KeyDep, db: DbDep) -> AblationOut:
    """State, the steps done, and once it succeeded each variant's mean and spread per score and the gaps."""
    with db.read() as s:
        return AblationOut.of(_get(s, ablation_id, key))


@router.post("/{ablation_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=AblationOut,
             responses={**_NOT_FOUND, 409: {"model": schemas.Message, "description": "it has finished"}})
def cancel_ablation(ablation_id: schemas.JobId, key: CancelKey, db: DbDep, supervisor: SupervisorDep) -> AblationOut:
    """As a job's cancel: a queued ablation is CANCELLED at once, a running one once its process has stopped
    (a later submission of the same file resumes from its step log)."""
    with db.session() as s:
        _get(s, ablation_id, key)
        out = AblationOut.of(repo.cancel_job(s, ablation_id, access.team_scope(key)))
    if supervisor is not None:
        supervisor.wake()
    return out
