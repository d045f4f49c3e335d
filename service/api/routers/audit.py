"""``GET /v1/audit``: the audit trail (:mod:`service.api.audit`), newest first, for admins."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.api import access, schemas
from service.api.deps import DbDep
from service.api.routers.jobs import _aware  # one rule for a time without a zone: UTC
from service.store import repo
from service.store.models import ApiKey, AuditEntry

router = APIRouter(prefix="/v1/audit", tags=["audit"])
AdminKey = Annotated[ApiKey, access.may("read the audit", admin_only=True)]


class AuditOut(BaseModel):
    id: int
    at: datetime
    key_id: str | None = Field(description="the key's id (a refused unknown key's too); null: no key shown")
    key_name: str | None
    team: str | None
    role: str | None
    action: str = Field(description="`METHOD /route/{template}`")
    target: str = Field(description="the request's path, or what it created")
    status: int
    outcome: Literal["ok", "refused"]
    detail: str | None = Field(description="a refusal's reason")

    @classmethod
    def of(cls, e: AuditEntry) -> AuditOut:
        return cls(id=e.id, at=e.at, key_id=e.key_id, key_name=e.key_name, team=e.team, role=e.role,
                   action=e.action, target=e.target, status=e.status, outcome=e.outcome,
                   detail=e.detail)


class AuditList(BaseModel):
    items: list[AuditOut]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page; null on the last")


@router.get("", response_model=AuditList, responses=access.forbidden())
def list_audit(key: AdminKey, db: DbDep,
               team: Annotated[str | None, Query(pattern=access.TEAM_RE.pattern)] = None,
               key_id: Annotated[str | None, Query(pattern=r"^[0-9a-f]{12}$")] = None,
               outcome: Literal["ok", "refused"] | None = None,
               after: Annotated[schemas.Time | None, Query(description="only entries after this time")] = None,
               limit: Annotated[int, Query(ge=1, le=500)] = 50,
               cursor: Annotated[str | None, Query(pattern=schemas.CURSOR_PATTERN,
                                                   description="the previous page's next_cursor")] = None,
               ) -> AuditList:
    """Every mutating request and every refusal (401, 403, 409, another team's 404), newest first, filtered;
    follow `next_cursor` for the next page."""
    with db.read() as s:
        rows = repo.list_audit(s, team=team, key_id=key_id, outcome=outcome, after=_aware(after),
                               before_id=int(cursor, 16) if cursor else None, limit=limit + 1)
        items = [AuditOut.of(e) for e in rows[:limit]]
    return AuditList(items=items, next_cursor=f"{rows[limit - 1].id:016x}" if len(rows) > limit else None)
