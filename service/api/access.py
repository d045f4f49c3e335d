"""Who may do what: every API key is a principal with a role and a team, and this is where the API asks.

- ``admin``: everything, on every team's jobs, schedules and mixtures (lists show all teams; ``team=`` narrows
  them), and the audit (``GET /v1/audit``).
- ``member``: submit, and act on (cancel, retry, change, delete, mix) its own team's jobs, schedules and mixtures.
- ``reader``: read its own team's jobs (state, events, logs), artifacts and shards, schedules and their versions,
  and mixtures: the key a training cluster's loader holds.

Two answers, both independent of what exists, so neither says anything about another team's work:

- an action the role does not allow is 403 naming the role (``role reader may not submit jobs``), from the
  route's dependency (:func:`may`), before the route reads anything;
- another team's job, schedule or mixture is 404 with the body an unknown id gets: the routes pass the store
  :func:`team_scope` (None for an admin: every team), and the store raises :class:`service.store.repo.Hidden`
  (a :class:`~service.store.repo.NotFound` with the unknown id's message) for a row of another team; lists are
  filtered by the same scope.

The role and team come with the key's row, which the key cache already holds: the check is a comparison, no
read. Which folders a team may use is :meth:`service.settings.Settings.roots`' business (per-team roots).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, status

from service.api.deps import require_key
from service.api.schemas import Message
from service.roles import TEAM_RE, Role
from service.store.models import DEFAULT_TEAM, ApiKey

__all__ = ["DEFAULT_TEAM", "TEAM_RE", "Role", "list_scope", "may", "team_scope"]

_WRITERS = frozenset({Role.ADMIN, Role.MEMBER})
_ADMINS = frozenset({Role.ADMIN})


def team_scope(key: ApiKey) -> str | None:
    """The team whose rows ``key`` sees: None (every team) for an admin."""
    return None if key.role == Role.ADMIN else key.team


def list_scope(key: ApiKey, team: str | None) -> str | None:
    """The team a list is filtered by: an admin's ``team=`` (None: all); anyone else's own team, and 403 for
    another (the answer does not depend on what that team has)."""
    if key.role == Role.ADMIN:
        return team
    if team is not None and team != key.team:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {key.role} may not list another team's work")
    return key.team


class Permission:
    """A route's dependency: the caller's key when its role is one of ``roles``, else 403 naming the role."""

    def __init__(self, action: str, roles: frozenset[Role]):
        self.action, self.roles = action, roles

    async def __call__(self, key: Annotated[ApiKey, Depends(require_key)]) -> ApiKey:
        if key.role not in self.roles:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {key.role} may not {self.action}")
        return key


#: a route's 403 in the OpenAPI schema (:func:`forbidden`)
_ROLE_403 = "the key's role may not do this, or (a list) name another team"


def forbidden(problems: str | None = None) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry of a route that may answer 403 for the role; ``problems``: it also answers 403
    with a problem list (a path outside the roots or in another team's folder), described so."""
    if problems is None:
        return {403: {"model": Message, "description": _ROLE_403}}
    return {403: {"description": f"{_ROLE_403} (a message); {problems} (one problem per path)", "content": {
        "application/json": {"schema": {"anyOf": [{"$ref": "#/components/schemas/Message"},
                                                  {"$ref": "#/components/schemas/ProblemList"}]}}}}}


def may(action: str, admin_only: bool = False) -> Any:
    """The dependency of a route that changes something (``action``: what the 403 says the role may not do,
    e.g. "submit jobs"): members and admins, or admins only."""
    return Depends(Permission(action, _ADMINS if admin_only else _WRITERS))
