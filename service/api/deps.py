"""FastAPI dependencies: the app's settings, database and supervisor, and the bearer-key check.

Routes open their own transactions (``with db.session() as s:``, ``with db.read() as s:`` for reads) so a
transaction's end, and any error it raises, happen inside the handler, before the response.

The dependencies are ``async`` because FastAPI runs a plain ``def`` dependency in the thread pool: a hop
per dependency per request, which cost more than the work they do. The key check reads the database only
when its cache (:mod:`service.api.keycache`) has no fresh entry, and then in the thread pool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.keycache import KeyCache
from service.runner.supervisor import Supervisor
from service.settings import Settings
from service.store.db import Database
from service.store.models import ApiKey

bearer = HTTPBearer(auto_error=False, description="an API key from `tokenmill apikey create`")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_db(request: Request) -> Database:
    return request.app.state.db


async def get_supervisor(request: Request) -> Supervisor | None:
    return request.app.state.supervisor


async def require_key(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
                      db: Annotated[Database, Depends(get_db)]) -> ApiKey:
    """The caller's live API key, else 401 (no key, a malformed, unknown or revoked one: one answer for all)."""
    key = None
    if creds is not None:
        cache: KeyCache = request.app.state.key_cache
        key = await cache.authenticate(db, creds.credentials)
    if key is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a valid API key is required (Authorization: Bearer ...)",
                            headers={"WWW-Authenticate": "Bearer"})
    request.state.api_key_id = key.id
    return key


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Database, Depends(get_db)]
SupervisorDep = Annotated[Supervisor | None, Depends(get_supervisor)]
KeyDep = Annotated[ApiKey, Depends(require_key)]
