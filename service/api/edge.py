"""The HTTP edge: a request shows its key before the service reads a byte of its body.

FastAPI reads and parses a body before it runs a route's dependencies, so with the key checked by a dependency
alone a stranger's 1 MiB of bad JSON was read, parsed and answered 422 with a parse position. :class:`Edge`, a
pure ASGI middleware (it never touches ``receive`` before the check), runs first:

- It finds the route a request is for in a table built from the app's routes. A route whose dependencies
  include :func:`service.api.deps.require_key` needs a key; the others (``/healthz``, ``/readyz``, the
  dashboard's static files, ``/docs`` with ``--public-docs``) do not. A path no route takes goes on to the
  router, whose 404, 405 or redirect reads no body.
- For a route that needs one, the key is checked from the headers (:func:`service.api.deps.resolve_key`, the
  one check: the dependency takes the key found here). Without a live key: 401 with ``require_key``'s JSON body
  and ``WWW-Authenticate``, and ``Connection: close`` when a body was announced, so its unread bytes go with the
  connection.
- Then the body, if any, is read here, whole, before the app runs: more than ``max_body_bytes`` (by
  ``Content-Length``, or counted while reading a chunked body) gets 413, a body not all there
  ``body_timeout_s`` after the head gets 408; both close the connection. The app then reads it from memory,
  a YAML body (``Content-Type: application/yaml``) as the JSON it means (:mod:`service.api.yaml_body`).
- A JSON or YAML body, to a route that takes one, that cannot be read or nests deeper than
  :data:`pipeline.nesting.MAX_DEPTH` is a 422 with its one problem (:mod:`service.api.json_body`,
  :mod:`service.api.yaml_body`): never a parser's ``RecursionError``.

Every other answer here is ``{"detail": "..."}`` JSON, labelled in the latency histogram with the route's template.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import BaseRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.stages.custom import refuse_references
from service.api import json_body, yaml_body
from service.api.deps import CHALLENGE, KEY_SCOPE, UNAUTHORIZED, require_key, resolve_key

#: why a spec sent to the service may not name a ``module:Class`` stage (importing it runs code on the server)
NO_REFERENCES = ("the service runs built-in and installed stages only (a module:Class is imported and run on the "
                 "server): install the stage's package where the service runs, with a tokenmill.stages entry point, "
                 "and name the stage by it")


@dataclass(frozen=True)
class _Route:
    regex: re.Pattern[str]
    methods: frozenset[str]
    route: BaseRoute  # what the router puts in scope["route"]: the latency label's template
    needs_key: bool
    takes_body: bool  # FastAPI parses its body (a route without one ignores whatever is sent)


def route_table(routes: Iterable[BaseRoute]) -> list[_Route]:
    """The app's routes in the router's order, each with whether it needs a key."""
    table = []
    for ctx in iter_route_contexts(list(routes)):
        if ctx.path is None:
            continue
        regex, _, _ = compile_path(ctx.path)
        table.append(_Route(regex, frozenset(ctx.methods or ()), ctx.original_route,
                            needs_key(getattr(ctx.original_route, "dependant", None)),
                            getattr(ctx.original_route, "body_field", None) is not None))
    return table


def needs_key(dependant: Dependant | None) -> bool:
    return any(d.call is require_key for d in _walk(dependant))


def _walk(dependant: Dependant | None) -> Iterator[Dependant]:
    if dependant is not None:
        yield dependant
        for d in dependant.dependencies:
            yield from _walk(d)


class Edge:
    """The key check, then the bounded, timed body read, before the app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute], max_body_bytes: int, body_timeout_s: float):
        self.app = app
        self.table = route_table(routes)  # built with the middleware stack, at the first request: all routes are in
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refuse_references(NO_REFERENCES)  # this request's context: its spec names built-in and installed stages only
        length = _announced_length(scope)  # None: no body
        route = self._match(scope)
        if route is None:  # the router's 404 / 405 / redirect: nothing reads the body
            await self.app(scope, receive, send if length is None else _closing(send))
            return
        if route.needs_key:
            app = scope["app"]
            try:
                key = await resolve_key(app, Headers(scope=scope).get("authorization"))
            except Exception as exc:  # the database: the app's own handler answers (503), as for a route
                scope["route"] = route.route
                await _handled(app, exc, scope, send if length is None else _closing(send))
                return
            if key is None:
                await self._refuse(scope, send, route, 401, UNAUTHORIZED, CHALLENGE, close=length is not None)
                return
            scope[KEY_SCOPE] = key
        if length is None:
            await self.app(scope, receive, send)
            return
        if length > self.max_body_bytes:
            await self._refuse(scope, send, route, 413, self._too_large())
            return
        body = await self._read(receive)
        if isinstance(body, int):
            detail = self._too_large() if body == 413 else (
                f"the request body did not arrive within {self.body_timeout_s:g} s")
            await self._refuse(scope, send, route, body, detail)
        elif body is not None:  # None: the client left
            problem = None
            if route.takes_body:  # a route without a body ignores whatever is sent
                content_type = Headers(scope=scope).get("content-type")
                if yaml_body.is_yaml(content_type):
                    converted = await run_in_threadpool(yaml_body.to_json, body)  # a parse: off the loop
                    if isinstance(converted, dict):
                        problem = converted
                    else:
                        body, scope = converted, _as_json(scope, len(converted))
                elif json_body.is_json(content_type):  # none given too: FastAPI reads it as JSON
                    problem = await run_in_threadpool(json_body.problem, body)
            if problem is not None:
                scope["route"] = route.route
                await JSONResponse({"detail": [problem]}, 422)(scope, _no_body, send)
                return
            await self.app(scope, _replay(body, receive), send)

    def _match(self, scope: Scope) -> _Route | None:
        path, method = scope["path"], scope["method"]
        for r in self.table:
            if method in r.methods and r.regex.match(path):
                return r
        return None

    async def _read(self, receive: Receive) -> bytes | int | None:
        """The whole body; 413 over the limit, 408 past the deadline; None if the client disconnected."""
        body = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    body += message.get("body", b"")
                    if len(body) > self.max_body_bytes:
                        return 413
                    if not message.get("more_body", False):
                        return bytes(body)
        except TimeoutError:
            return 408

    def _too_large(self) -> str:
        return f"the request body is over the limit of {self.max_body_bytes} bytes"

    async def _refuse(self, scope: Scope, send: Send, route: _Route, status: int, detail: str,
                      headers: dict[str, str] | None = None, close: bool = True) -> None:
        scope["route"] = route.route
        headers = {**(headers or {}), **({"Connection": "close"} if close else {})}
        await JSONResponse({"detail": detail}, status, headers=headers)(scope, _no_body, send)


def _announced_length(scope: Scope) -> int | None:
    """The body's announced size: None without one (no ``Content-Length`` above 0, no ``Transfer-Encoding``: no
    body, RFC 9112 6.3), 0 for a chunked one (counted while read); the server refused malformed values."""
    headers = Headers(scope=scope)
    if "transfer-encoding" in headers:
        return 0
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        return 0
    return length if length > 0 else None


def _as_json(scope: Scope, length: int) -> Scope:
    """``scope`` with the headers of a JSON body of ``length`` bytes (a YAML body converted)."""
    drop = (b"content-type", b"content-length", b"transfer-encoding")
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in drop]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json"),
                                 (b"content-length", str(length).encode())]}


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then the server's own messages (the disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()
    return replay


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` added to the response: its request's body will not be read."""
    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)
    return closing


async def _no_body() -> Message:
    return {"type": "http.disconnect"}  # a refusal never reads the request


async def _handled(app: Any, exc: Exception, scope: Scope, send: Send) -> None:
    """Answer ``exc`` with the app's handler for its type (re-raised when there is none, or the handler
    re-raises: the server's 500)."""
    handler = next((app.exception_handlers[t] for t in type(exc).__mro__ if t in app.exception_handlers), None)
    if handler is None:
        raise exc
    request = Request(scope, _no_body)
    response = await handler(request, exc) if inspect.iscoroutinefunction(handler) else \
        await run_in_threadpool(handler, request, exc)
    await response(scope, _no_body, send)
