"""FastAPI dependencies: the app's settings, database and supervisor, and the bearer-key check.

Routes open their own transactions (``with db.session() as s:``, ``with db.read() as s:`` for reads) so a
transaction's end, and any error it raises, happen inside the handler, before the response.

The dependencies are ``async`` because FastAPI runs a plain ``def`` dependency in the thread pool: a hop
per dependency per request, which cost more than the work they do. The key check reads the database only
when its cache (:mod:`service.api.keycache`) has no fresh entry, and then in the thread pool.

The key is checked once per request, by :func:`resolve_key`: the edge middleware (:mod:`service.api.edge`) calls
it from the headers before any body is read, for every route that depends on :func:`require_key`, and leaves
the key in the request's scope; ``require_key`` takes it from there.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from service.runner.supervisor import Supervisor
from service.settings import Settings
from service.store.db import Database
from service.store.models import ApiKey

bearer = HTTPBearer(auto_error=False, description="an API key from `tokenmill apikey create`")
#: where the edge leaves the request's key (scope key)
KEY_SCOPE = "tokenmill.api_key"
UNAUTHORIZED = "a valid API key is required (Authorization: Bearer ...)"
CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_db(request: Request) -> Database:
    return request.app.state.db


async def get_supervisor(request: Request) -> Supervisor | None:
    return request.app.state.supervisor


async def resolve_key(app: Any, authorization: str | None) -> ApiKey | None:
    """The live key an ``Authorization`` header value names, else None (no header, another scheme than
    ``Bearer``, a malformed, unknown or revoked key: one answer for all), through the app's key cache."""
    scheme, token = get_authorization_scheme_param(authorization)
    if scheme.lower() != "bearer" or not token:
        return None
    return await app.state.key_cache.authenticate(app.state.db, token)


async def require_key(request: Request,
                      creds: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]) -> ApiKey:
    """The caller's live API key, else 401. ``creds`` puts the bearer scheme in the OpenAPI schema; the key is
    the one the edge found (it refused the request without one), or checked here on a route the edge does not
    guard (none today)."""
    key: ApiKey | None
    if KEY_SCOPE in request.scope:
        key = request.scope[KEY_SCOPE]
    else:
        key = await resolve_key(request.app, request.headers.get("authorization"))
    if key is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, UNAUTHORIZED, headers=CHALLENGE)
    request.state.api_key_id = key.id
    return key


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Database, Depends(get_db)]
SupervisorDep = Annotated[Supervisor | None, Depends(get_supervisor)]
KeyDep = Annotated[ApiKey, Depends(require_key)]
