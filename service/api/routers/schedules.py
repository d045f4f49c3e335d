"""``/v1/schedules``: scheduled corpus refreshes. Create, list, inspect, update, delete, pause and resume a
schedule; read its run history and its published versions (their files: ``routers/artifacts.py``).

A schedule's spec is checked as a job's is (schema 422, roots 403, address 422), except that an input may
match no file yet: each run checks the files it reads. It also needs an ``exact_dedup`` or ``near_dedup``
stage (a refresh drops there what earlier versions published), an output folder outside its inputs, and a
folder no other schedule publishes into or around (409).

A deleted schedule's versions stay served under its id (``versions``, ``versions/N/artifacts``; its other
routes are 404). A new schedule on a folder that already holds versions (a deleted schedule's: its history
went, its folders stayed) adopts those this service's jobs published: they are listed and served as its own,
numbering goes on after them, later runs dedup against them and load the first one's tokenizer. A version no job of this
service wrote, or one still being written, is a 409 naming it (:func:`service.store.repo.adopt_versions`).

A schedule's secrets (the PII ``salt``) show as ``<redacted>``; a PATCH whose spec sends ``<redacted>`` back for
one keeps the stored value (:func:`with_stored_secrets`), so a spec read with GET can be changed and sent back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from pipeline import secret_fields
from pipeline.output.layout import OutputError
from pipeline.output.open_store import check_not_overlapping
from pipeline.problems import NO_MATCH, Problem, SpecError
from pipeline.spec import JobSpec, parse_spec
from service import ownership
from service.admission import Refused, admit
from service.api import access, schemas
from service.api.deps import DbDep, KeyDep, SettingsDep
from service.api.openapi import links
from service.api.schemas import INT32_MAX, ScheduleId
from service.schedules import versions
from service.schedules.cron import next_fire, system_clock
from service.settings import Settings
from service.store import repo
from service.store.models import ApiKey, Schedule

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], responses=access.forbidden())
CreateKey = Annotated[ApiKey, access.may("create schedules")]
ChangeKey = Annotated[ApiKey, access.may("change schedules")]
DeleteKey = Annotated[ApiKey, access.may("delete schedules")]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": schemas.Message, "description": "no such schedule"}}
_REFUSED: dict[int | str, dict[str, Any]] = {
    **access.forbidden("a path outside the roots or in another team's folder"),
    409: {"model": schemas.Message, "description": "another schedule publishes into or around this folder, or "
                                                   "the folder holds other files, or versions it cannot adopt; "
                                                   "an update's spec names another folder than the schedule's"},
    422: {"model": schemas.ProblemList, "description": "an invalid schedule or spec: one problem per field path"},
}


#: what a created schedule's id leads to
_LINKS = links("schedule_id", {
    "GetSchedule": ("get", "/v1/schedules/{schedule_id}"), "UpdateSchedule": ("patch", "/v1/schedules/{schedule_id}"),
    "DeleteSchedule": ("delete", "/v1/schedules/{schedule_id}"),
    "PauseSchedule": ("post", "/v1/schedules/{schedule_id}/pause"),
    "ResumeSchedule": ("post", "/v1/schedules/{schedule_id}/resume"),
    "ListRuns": ("get", "/v1/schedules/{schedule_id}/runs"),
    "ListVersions": ("get", "/v1/schedules/{schedule_id}/versions")})

#: where a schedule's spec lies in its request body
_SPEC_AT = ("body", "spec")


def check_spec(spec: JobSpec, settings: Settings, others: dict[str, tuple[str, str]], team: str,
               own_id: str | None = None) -> str:
    """The schedule's resolved output folder, or :class:`Refused` / :class:`repo.Conflict` saying why not. A
    schedule runs as its ``team`` (an admin's too): its roots, its folders."""
    if not versions.has_dedup_stage(spec.model_dump(mode="json")):
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, [Problem(
            ("stages",), "a schedule needs an exact_dedup or near_dedup stage: each run drops there the "
                         "documents earlier versions published", "dedup_required")], _SPEC_AT)
    try:
        admit(spec, settings, versioned=True, team=team, scope=team)
    except Refused as exc:  # a path matching nothing yet is fine: each run checks the files it reads
        kept = [p for p in exc.problems if p.kind != NO_MATCH]
        if kept:
            raise Refused(exc.status_code, kept, _SPEC_AT) from None
    out = os.path.realpath(spec.output.path)
    try:
        check_not_overlapping(out, [inp.path for inp in spec.inputs])
    except OutputError as exc:
        # OutputError's one line names its field first: the reason is what follows it
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, [Problem(
            ("output", "path"), str(exc).removeprefix("output.path: "), "overlaps_inputs")], _SPEC_AT) from None
    for path, (other, owner) in others.items():
        if other != own_id and (Path(out).is_relative_to(path) or Path(path).is_relative_to(out)):
            which = f"schedule {other}" if owner == team else "another team's schedule"  # no other team's id
            raise repo.Conflict(f"spec.output.path: {which} publishes into {path}; a schedule's folder "
                                "may not be, contain or lie inside another's")
    theirs = [n for n in versions.on_disk(out)
              if (owned := ownership.owner_of(str(versions.version_dir(out, n)))) and owned[1] != team]
    if theirs:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(("output", "path"), (
            f"{out} holds versions another team's jobs wrote; choose another folder"), ownership.OTHER_TEAM)],
            _SPEC_AT)
    try:
        foreign = sorted(n for n in os.listdir(out) if n != versions.LATEST and not versions.parse_number(n))
    except (FileNotFoundError, NotADirectoryError):
        foreign = []
    if foreign:
        raise repo.Conflict(f"spec.output.path: {out} holds files that are not a schedule's versions "
                            f"({', '.join(foreign[:3])}); choose an empty or new folder")
    return out


def with_stored_secrets(spec: JobSpec, stored: dict[str, Any]) -> JobSpec:
    """``spec`` with each secret sent as ``<redacted>`` (a spec read from a response, sent back changed elsewhere)
    given the value the schedule's ``stored`` spec holds at that field, then validated with it
    (:func:`pipeline.secret_fields.keep_stored`); a placeholder with no stored value is left for admission to
    refuse."""
    data = spec.model_dump(mode="json")
    kept = secret_fields.keep_stored(data, stored)
    if kept == data:
        return spec
    try:
        return parse_spec(kept)
    except SpecError as exc:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.problems, _SPEC_AT) from None


def _same_folder(spec: JobSpec, current: str) -> None:
    """An update's spec publishes where the schedule does: another folder is a 409 (the schedule's state decides,
    not the body's schema), checked before the costlier checks of :func:`check_spec`."""
    try:
        out = os.path.realpath(spec.output.path)
    except ValueError:  # U+0000: check_spec's admission names it (422)
        return
    if out != current:
        raise repo.Conflict(f"spec.output.path: a schedule's versions stay in {current}; create another schedule "
                            "for another folder")


def _out(s: Any, sched: Schedule) -> schemas.ScheduleOut:
    runs = repo.runs_of(s, sched.id, limit=1)
    latest = repo.versions_of(s, sched.id)
    return schemas.ScheduleOut.of(sched, latest[-1].number if latest else None, runs[0] if runs else None)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.ScheduleOut,
             responses={201: {"links": _LINKS}, **_REFUSED})
def create_schedule(body: schemas.ScheduleIn, response: Response, key: CreateKey, db: DbDep,
                    settings: SettingsDep) -> schemas.ScheduleOut:
    """Create a schedule; its first slot is the first one the cron expression names after now. Versions
    already in its folder (a deleted schedule's) become its own (409 for any it cannot adopt)."""
    with db.read() as s:
        others = repo.schedule_outputs(s)
    out = check_spec(body.spec, settings, others, key.team)
    nxt = next_fire(body.cron, body.timezone, system_clock())
    found = {n: str(versions.version_dir(out, n)) for n in versions.on_disk(out)}
    with db.session() as s:
        sched = repo.create_schedule(s, name=body.name or body.spec.name, cron=body.cron, timezone=body.timezone,
                                     overlap=body.overlap, paused=body.paused, spec=body.spec.model_dump(mode="json"),
                                     output_path=out, next_fire_at=nxt, api_key_id=key.id, team=key.team)
        repo.adopt_versions(s, sched, found)
        result = _out(s, sched)
    response.headers["Location"] = f"/v1/schedules/{result.id}"
    return result


@router.get("", response_model=schemas.ScheduleList)
def list_schedules(key: KeyDep, db: DbDep,
                   team: Annotated[str | None, Query(pattern=access.TEAM_RE.pattern, description=(
                       "an admin's filter (others see their own team's schedules only)"))] = None,
                   ) -> schemas.ScheduleList:
    scope = access.list_scope(key, team)
    with db.read() as s:
        return schemas.ScheduleList(items=[_out(s, sc) for sc in repo.list_schedules(s, team=scope)])


@router.get("/{schedule_id}", response_model=schemas.ScheduleOut, responses=_NOT_FOUND)
def get_schedule(schedule_id: ScheduleId, key: KeyDep, db: DbDep) -> schemas.ScheduleOut:
    """The schedule, its next slots, its latest version and last run."""
    with db.read() as s:
        return _out(s, repo.get_schedule(s, schedule_id, access.team_scope(key)))


@router.patch("/{schedule_id}", response_model=schemas.ScheduleOut, responses={**_NOT_FOUND, **_REFUSED})
def update_schedule(schedule_id: ScheduleId, body: schemas.SchedulePatch, key: ChangeKey, db: DbDep,
                    settings: SettingsDep) -> schemas.ScheduleOut:
    """Change the name, cron expression, time zone, overlap policy or spec (not its output folder); a new
    cron expression or zone takes effect from now."""
    if body.spec is not None:
        with db.read() as s:
            sched = repo.get_schedule(s, schedule_id, access.team_scope(key))
            current, stored, team = sched.output_path, sched.spec, sched.team
            others = repo.schedule_outputs(s)
        body.spec = with_stored_secrets(body.spec, stored)
        _same_folder(body.spec, current)
        check_spec(body.spec, settings, others, team, own_id=schedule_id)
    with db.session() as s:
        sched = repo.lock_schedule(s, schedule_id, access.team_scope(key))
        if body.name is not None:
            sched.name = body.name
        if body.overlap is not None:
            sched.overlap = body.overlap
        if body.spec is not None:
            sched.spec = body.spec.model_dump(mode="json")
        if body.cron is not None or body.timezone is not None:
            sched.cron = body.cron or sched.cron
            sched.timezone = body.timezone or sched.timezone
            if not sched.paused:
                sched.next_fire_at = next_fire(sched.cron, sched.timezone, system_clock())
        sched.updated_at = system_clock()
        return _out(s, sched)


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT, responses={
    **_NOT_FOUND, 409: {"model": schemas.Message, "description": "a run is going"}})
def delete_schedule(schedule_id: ScheduleId, key: DeleteKey, db: DbDep) -> Response:
    """Delete the schedule and its history. The published versions stay on disk (a trainer may be reading
    them) and stay served under this id (`.../versions`, `.../versions/N/artifacts`, `latest` the newest at
    deletion); the schedule's other routes answer 404. A schedule created on the same folder adopts them."""
    with db.session() as s:
        repo.delete_schedule(s, schedule_id, access.team_scope(key))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{schedule_id}/pause", response_model=schemas.ScheduleOut, responses=_NOT_FOUND)
def pause_schedule(schedule_id: ScheduleId, key: ChangeKey, db: DbDep) -> schemas.ScheduleOut:
    """No slot fires while paused (a run already going finishes and publishes)."""
    with db.session() as s:
        sched = repo.lock_schedule(s, schedule_id, access.team_scope(key))
        sched.paused, sched.next_fire_at, sched.pending_fire_at = True, None, None
        sched.updated_at = system_clock()
        return _out(s, sched)


@router.post("/{schedule_id}/resume", response_model=schemas.ScheduleOut, responses=_NOT_FOUND)
def resume_schedule(schedule_id: ScheduleId, key: ChangeKey, db: DbDep) -> schemas.ScheduleOut:
    """Fire again from the next slot after now (slots missed while paused are not made up)."""
    with db.session() as s:
        sched = repo.lock_schedule(s, schedule_id, access.team_scope(key))
        if sched.paused:
            sched.paused = False
            sched.next_fire_at = next_fire(sched.cron, sched.timezone, system_clock())
            sched.updated_at = system_clock()
        return _out(s, sched)


@router.get("/{schedule_id}/runs", response_model=schemas.ScheduleRunList, responses=_NOT_FOUND)
def list_runs(schedule_id: ScheduleId, key: KeyDep, db: DbDep,
              before: Annotated[int | None, Query(ge=1, le=INT32_MAX,
                                                  description="a run number: older runs only")] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50) -> schemas.ScheduleRunList:
    """Run history, newest first: each run's slot, state, message, job, version and the files it read."""
    with db.read() as s:
        repo.get_schedule(s, schedule_id, access.team_scope(key))
        runs = repo.runs_of(s, schedule_id, before=before, limit=limit + 1)
        items = [schemas.ScheduleRunOut.of(r) for r in runs[:limit]]
    return schemas.ScheduleRunList(items=items, next_cursor=runs[limit - 1].number if len(runs) > limit else None)


@router.get("/{schedule_id}/versions", response_model=schemas.VersionList, responses=_NOT_FOUND)
def list_versions(schedule_id: ScheduleId, key: KeyDep, db: DbDep) -> schemas.VersionList:
    """Published versions, oldest first; `latest` is the number `versions/latest` redirects to. A deleted
    schedule's are still listed (and served), as they were when it was deleted."""
    with db.read() as s:
        items = [schemas.VersionOut.of(v) for v in repo.served_versions(s, schedule_id, access.team_scope(key))]
    return schemas.VersionList(items=items, latest=items[-1].number if items else None)
