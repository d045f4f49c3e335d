"""FastAPI dependencies: the app's settings, database and supervisor, and the bearer-key check.

Routes open their own transactions (``with db.session() as s:``) so a transaction's end, and any error
it raises, happen inside the handler, before the response.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.settings import Settings
from service.runner.supervisor import Supervisor
from service.store import repo
from service.store.db import Database
from service.store.models import ApiKey

bearer = HTTPBearer(auto_error=False, description="an API key from `tokenmill apikey create`")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Database:
    return request.app.state.db


def get_supervisor(request: Request) -> Supervisor | None:
    return request.app.state.supervisor


def require_key(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
                db: Annotated[Database, Depends(get_db)]) -> ApiKey:
    """The caller's live API key, else 401 (no key, a malformed, unknown or revoked one: one answer for all)."""
    key = None
    if creds is not None:
        with db.session() as s:
            key = repo.authenticate(s, creds.credentials)
    if key is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a valid API key is required (Authorization: Bearer ...)",
                            headers={"WWW-Authenticate": "Bearer"})
    request.state.api_key_id = key.id
    return key


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Database, Depends(get_db)]
SupervisorDep = Annotated[Supervisor | None, Depends(get_supervisor)]
KeyDep = Annotated[ApiKey, Depends(require_key)]
