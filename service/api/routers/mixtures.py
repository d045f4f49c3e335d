"""``/v1/mixtures``: weighted, pinned blends of this service's jobs and schedule versions (issue 25).

``POST`` takes a mixture spec (as ``tokenmill mix``: ``job`` or ``schedule`` sources) and answers 201 with the
mixture, or 200 with the one already made when the same spec resolves to the same pinned sources (a mixture's
id is its file's sha256: creating is idempotent). ``GET`` lists them or shows one; its file is served like a
job's artifacts (``.../artifacts/mixture.json``, ETag = sha256, immutable): the trainer's ``--data``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from pydantic import BaseModel, Field

from pipeline.mixture_format import MIXTURE
from pipeline.mixture_spec import MixtureSpec
from service.api import access, schemas
from service.api import mixture_sources as mixtures
from service.api.deps import DbDep, KeyDep, SettingsDep
from service.api.routers.artifacts import IMMUTABLE
from service.store import mixtures as store
from service.store.models import ApiKey, StoredMixture

router = APIRouter(prefix="/v1/mixtures", tags=["mixtures"], responses=access.forbidden())
CreateKey = Annotated[ApiKey, access.may("create mixtures")]

MixtureId = Annotated[str, Path(description="a mixture's id", pattern=schemas.ID_PATTERN)]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": schemas.Message, "description": "no such mixture"}}


class MixtureSourceOut(BaseModel):
    name: str
    pinned: dict[str, Any] = Field(description="the job, or the schedule and version number, it was pinned to")
    location: str = Field(description="where the trainer reads it, relative to this server")
    target_share: float = Field(description="share of the mixture's non-padding tokens")
    samples: int
    tokens: int
    epochs: float


class MixtureOut(BaseModel):
    id: str
    name: str
    team: str
    sha256: str = Field(description="of the mixture file")
    samples: int
    tokens: int
    seed: int
    created_at: datetime
    data: str = Field(description="the mixture file's URL path: a trainer's --data")
    sources: list[MixtureSourceOut]

    @classmethod
    def of(cls, row: StoredMixture) -> MixtureOut:
        doc = json.loads(row.document)
        return cls(id=row.id, name=row.name, team=row.team, sha256=row.sha256, samples=row.samples, tokens=row.tokens,
                   seed=doc["seed"], created_at=row.created_at, data=f"/v1/mixtures/{row.id}/artifacts/{MIXTURE}",
                   sources=[MixtureSourceOut(**{k: s[k] for k in MixtureSourceOut.model_fields})
                            for s in doc["sources"]])


class MixtureList(BaseModel):
    items: list[MixtureOut]


#: a source that cannot be used, when every refused source has the same reason (service/api/mixture_sources.py)
_SOURCES_REFUSED: dict[int | str, dict[str, Any]] = {code: {"model": schemas.ProblemList, "description": why}
                                                     for code, why in (
    (403, "a source's output lies outside the output roots"), (404, "no such job, schedule or version"),
    (409, "a source's job has not succeeded"), (410, "a later job replaced a source's output"))}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=MixtureOut, responses={
    200: {"model": MixtureOut, "description": "the same spec over the same pinned sources: the mixture made before"},
    **_SOURCES_REFUSED,
    422: {"model": schemas.ProblemList, "description": "an invalid spec, a source that cannot be used or sources "
                                                       "that differ in tokenizer, seq_len or dtype: one problem each"},
})
def create_mixture(spec: MixtureSpec, response: Response, key: CreateKey, db: DbDep,
                   settings: SettingsDep) -> MixtureOut:
    """Plan a mixture of this service's jobs (``job: ID``) and schedule versions (``schedule: ID``, ``version: N``
    or ``latest``, pinned now), by ``weight`` or ``tokens`` per source, with ``max_epochs``, ``total_tokens``,
    ``fill`` and ``seed`` as for ``tokenmill mix``."""
    mixture = mixtures.make(db, settings, spec, access.team_scope(key))
    with db.session() as s:
        row, created = store.save_mixture(s, name=spec.name, spec=spec.model_dump(mode="json", exclude_none=True),
                                          document=mixture.to_json(), samples=mixture.total_samples,
                                          tokens=mixture.total_tokens, api_key_id=key.id, team=key.team)
        out = MixtureOut.of(row)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/mixtures/{out.id}"
    return out


@router.get("", response_model=MixtureList)
def list_mixtures(key: KeyDep, db: DbDep,
                  team: Annotated[str | None, Query(pattern=access.TEAM_RE.pattern, description=(
                      "an admin's filter (others see their own team's mixtures only)"))] = None) -> MixtureList:
    """The mixtures, newest first (a key's own team's; an admin's, every team's)."""
    scope = access.list_scope(key, team)
    with db.read() as s:
        return MixtureList(items=[MixtureOut.of(m) for m in store.list_mixtures(s, team=scope)])


@router.get("/{mixture_id}", response_model=MixtureOut, responses=_NOT_FOUND)
def get_mixture(mixture_id: MixtureId, key: KeyDep, db: DbDep) -> MixtureOut:
    """The mixture: its sources, the versions they were pinned to, their shares, samples, tokens and epochs."""
    with db.read() as s:
        return MixtureOut.of(store.get_mixture(s, mixture_id, access.team_scope(key)))


@router.get("/{mixture_id}/artifacts", response_model=schemas.ArtifactList, responses=_NOT_FOUND)
def list_mixture_artifacts(mixture_id: MixtureId, key: KeyDep, db: DbDep) -> schemas.ArtifactList:
    """The mixture's one file, ``mixture.json`` (its sources are read from their own artifacts URLs)."""
    with db.read() as s:
        row = store.get_mixture(s, mixture_id, access.team_scope(key))
    return schemas.ArtifactList(files=[schemas.ArtifactOut(name=MIXTURE, bytes=len(row.document.encode()),
                                                           sha256=row.sha256)])


@router.get("/{mixture_id}/artifacts/{name:path}", responses={
    **_NOT_FOUND, 200: {"content": {"application/json": {}}, "description": "the mixture file (ETag: its sha256)"},
    304: {"description": "If-None-Match matched its ETag"}})
def get_mixture_artifact(request: Request, mixture_id: MixtureId, name: schemas.ArtifactName, key: KeyDep,
                         db: DbDep) -> Response:
    """``mixture.json``: never changes (cached as immutable)."""
    with db.read() as s:
        row = store.get_mixture(s, mixture_id, access.team_scope(key))
    if name != MIXTURE:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"a mixture serves only {MIXTURE}")
    headers = {"ETag": f'"{row.sha256}"', "Cache-Control": IMMUTABLE}
    if request.headers.get("if-none-match", "").strip() in (f'"{row.sha256}"', f'W/"{row.sha256}"', "*"):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(row.document.encode(), media_type="application/json", headers=headers)
