"""Mixtures made by the control plane: each source is one of its own jobs or schedule versions, resolved and
pinned when the mixture is created (``latest`` becomes the number it is then), and written into the mixture
file as the artifacts URL path the trainer streams it from (``/v1/jobs/{id}/artifacts``,
``/v1/schedules/{id}/versions/{n}/artifacts``: relative to the server the mixture file is read from).

A path or URL source is refused here (422; the API's schema allows none): the service reads only its own
outputs, never a location a client names; ``tokenmill mix`` blends those where they can be read. A source that
cannot be used answers what its own artifacts URL would (404 no such job, schedule or version, or another
team's; 409 a job that has not succeeded; 403, 410), when every refused source says the same; any other mix is
a 422.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from fastapi import HTTPException, status

from pipeline.mixture_format import Mixture
from pipeline.mixture_plan import ResolvedSource, plan_mixture
from pipeline.mixture_spec import MixtureSpec, SourceSpec
from pipeline.problems import Problem, SpecError
from pipeline.shard_format import MANIFEST, MAX_MANIFEST_BYTES, Manifest, ShardFormatError, read_regular
from service.admission import Refused
from service.api.routers import artifacts
from service.settings import Settings
from service.store import repo
from service.store.db import Database


def _resolve_one(db: Database, settings: Settings, src: SourceSpec, team: str | None) -> ResolvedSource:
    pinned: dict[str, Any]
    if src.job is not None:
        where = artifacts.job_source(db, settings, src.job, team)
        location, pinned = f"/v1/jobs/{src.job}/artifacts", {"job": src.job}
    else:
        assert src.schedule is not None  # the spec holds exactly one of path, job, schedule
        number = artifacts.version_number(db, src.schedule, str(src.version or "latest"), team)
        where = artifacts.version_source(db, settings, src.schedule, number, team)
        location = f"/v1/schedules/{src.schedule}/versions/{number}/artifacts"
        pinned = {"schedule": src.schedule, "version": number}
    data = read_regular(os.path.join(where.folder, MANIFEST), MAX_MANIFEST_BYTES)
    return ResolvedSource(src, location, Manifest.from_json(data), hashlib.sha256(data).hexdigest(), pinned)


def resolve(db: Database, settings: Settings, spec: MixtureSpec, team: str | None) -> list[ResolvedSource]:
    """Every source's manifest, pinned; :class:`Refused` naming each source that cannot be used (another team's
    job or schedule than ``team``'s, None: any, as an unknown one), with the status the module gives."""
    problems, statuses, out = [], set(), []
    for i, src in enumerate(spec.sources):
        field = "path" if src.path is not None else "job" if src.job is not None else "schedule"
        code, why = status.HTTP_422_UNPROCESSABLE_CONTENT, ""
        if src.path is not None:
            why = ("the control plane blends its own jobs and schedule versions: give job or schedule (or run "
                   "`tokenmill mix` where the path can be read)")
        else:
            try:
                out.append(_resolve_one(db, settings, src, team))
                continue
            except HTTPException as exc:
                code, why = exc.status_code, str(exc.detail)
            except repo.NotFound as exc:
                code, why = status.HTTP_404_NOT_FOUND, str(exc)
            except (OSError, ShardFormatError) as exc:
                why = f"no readable manifest ({exc})"
        problems.append(Problem(("sources", i, field), f"{src.name}: {why}", "mixture"))
        statuses.add(code)
    if problems:
        raise Refused(statuses.pop() if len(statuses) == 1 else status.HTTP_422_UNPROCESSABLE_CONTENT, problems)
    return out


def make(db: Database, settings: Settings, spec: MixtureSpec, team: str | None) -> Mixture:
    try:
        return plan_mixture(spec, resolve(db, settings, spec, team))
    except Refused:
        raise
    except SpecError as exc:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.problems) from None
