"""The audit trail: one ``audit`` row per mutating request and per refusal, written before the answer goes out.

:class:`Audit` is a pure ASGI middleware outside the edge (:mod:`service.api.edge`), so it sees the edge's 401s
too. It decides when the response starts, from the method and the status:

- a request that may change something (any method but GET, HEAD, OPTIONS), whatever its outcome;
- a refusal of any request: 401 (no valid key), 403 (a role that may not, a path outside the roots), 409, and a
  404 that hid another team's row (:class:`service.store.repo.Hidden`: the app's handler marks the request's
  :class:`Note`; the client sees the unknown id's answer, the audit says what it was).

A read that succeeds (a status poll, a shard download) writes nothing and costs one comparison here: the API's
latency under load (bench/api_load.py) is its reads'. Each row holds the key (id and name, its team and role),
the action (``METHOD /route/{template}``), the target (the path, or what a creation made: its ``Location``),
the status, the outcome (``ok`` or ``refused``) and a refusal's reason (its ``detail``). The row is committed
before the response's first byte is sent, so a client that reads ``GET /v1/audit`` next finds it. A row the
database refuses is logged, and the response goes out all the same.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import auth
from service.api.deps import KEY_SCOPE
from service.store import repo
from service.store.db import Database
from service.store.models import ApiKey

log = logging.getLogger(__name__)
#: the scope key of a request's :class:`Note`
NOTE_SCOPE = "tokenmill.audit"
READS = frozenset({"GET", "HEAD", "OPTIONS"})
#: statuses that are a refusal on any request
REFUSALS = frozenset({401, 403, 409})
#: characters of a refusal's detail kept
MAX_DETAIL = 1000


@dataclass
class Note:
    """What the app tells the audit about a request (shared by the copies of its scope)."""

    hidden: bool = False


def mark_hidden(scope: Scope) -> None:
    """This request's 404 hid another team's row."""
    note = scope.get(NOTE_SCOPE)
    if isinstance(note, Note):
        note.hidden = True


class Audit:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        note = scope[NOTE_SCOPE] = Note()
        held: list[Message] = []
        started: dict[str, Any] = {}

        async def audited(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                if scope["method"] in READS and status not in REFUSALS and not (status == 404 and note.hidden):
                    started["pass"] = True
                    await send(message)
                    return
                started["status"] = status
                started["location"] = Headers(raw=message.get("headers", [])).get("location")
                held.append(message)
                if status < 400:  # nothing to read in the body: written now
                    await self._write(scope, started, None)
                    await _flush(held, send)
                return
            if started.get("pass") or message["type"] != "http.response.body" or not held:
                await send(message)
                return
            held.append(message)
            if not message.get("more_body", False):
                body = b"".join(m.get("body", b"") for m in held[1:])
                await self._write(scope, started, _detail(body))
                await _flush(held, send)

        await self.app(scope, receive, audited)

    async def _write(self, scope: Scope, started: dict[str, Any], detail: str | None) -> None:
        db: Database | None = getattr(scope["app"].state, "db", None)
        if db is None:
            return
        key: ApiKey | None = scope.get(KEY_SCOPE)
        status = started["status"]
        route = getattr(scope.get("route"), "path", None) or scope["path"]
        row = {"key_id": key.id if key is not None else _shown_key_id(scope), "key_name": key.name if key else None,
               "team": key.team if key else None, "role": key.role if key else None,
               "action": f"{scope['method']} {route}"[:200],
               "target": started["location"] if status < 400 and started["location"] else scope["path"],
               "status": status, "outcome": "ok" if status < 400 else "refused", "detail": detail}
        try:
            await run_in_threadpool(_insert, db, row)
        except Exception:  # noqa: BLE001 - the request's answer goes out whatever the audit's store says
            log.exception("audit: could not record %s %s (%s)", scope["method"], scope["path"], status)


def _insert(db: Database, row: dict[str, Any]) -> None:
    with db.session() as s:
        repo.add_audit(s, **row)


def _shown_key_id(scope: Scope) -> str | None:
    """The id part of a well-formed key that was refused (unknown or revoked): the public half only."""
    value = Headers(scope=scope).get("authorization", "")
    parsed = auth.parse(value.partition(" ")[2]) if value.lower().startswith("bearer ") else None
    return parsed[0] if parsed else None


def _detail(body: bytes) -> str | None:
    """A refusal's ``detail``, as one line (a list of problems: ``field: message`` each)."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        return body[:MAX_DETAIL].decode("utf-8", "replace") or None
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(x) for x in p.get('loc', [])[1:])}: {p.get('msg')}"
                           if isinstance(p, dict) else str(p) for p in detail)
    return None if detail is None else str(detail)[:MAX_DETAIL]


async def _flush(held: list[Message], send: Send) -> None:
    for message in held:
        await send(message)
    held.clear()
