"""Server-sent events as the body of a plain streaming response, so a client that leaves is a normal end.

FastAPI's own SSE path (an endpoint that yields, ``response_class=EventSourceResponse``) runs the generator in a
producer task and a keepalive task joined by memory streams. When a client left while an event was on its way,
the request's exit stack closed the stream the keepalive task was sending into: its ``BrokenResourceError``
ended the request as ``ERROR: Exception in ASGI application`` (an ``ExceptionGroup``) in the server's log. Here
the generator is the response's body: Starlette's disconnect listener cancels it when the client leaves, and
nothing else is left to fail.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi.sse import KEEPALIVE_COMMENT, format_sse_event
from starlette.requests import Request
from starlette.responses import StreamingResponse

#: an idle stream sends a comment this often, so proxies keep it open and a client gone is noticed
PING_S = 15.0
#: a page of events: ``(seq, type, data)`` each, and whether the stream has sent everything once it is empty
Page = tuple[list[tuple[int, str, dict[str, Any]]], bool]

#: the ``200`` of a route answering :class:`EventStream` in the OpenAPI schema: each event's fields
ITEM_SCHEMA = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                                                "id": {"type": "string"}, "retry": {"type": "integer", "minimum": 0}}}


class EventStream(StreamingResponse):
    """``text/event-stream``, not cached or buffered by a proxy. No class ``media_type``: the route's ``responses``
    documents the stream (:data:`ITEM_SCHEMA`), FastAPI adds no schema of its own."""

    def __init__(self, body: AsyncIterator[bytes], status_code: int = 200):  # FastAPI's schema reads the default
        super().__init__(body, status_code, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def events(page: Callable[[int], Awaitable[Page]], request: Request, poll_s: float,
                 after: int) -> AsyncIterator[bytes]:
    """Every event after ``after``, page by page, then every ``poll_s`` the new ones, until an empty page says
    the stream is done or the client left; a comment every :data:`PING_S` of quiet."""
    last, quiet = after, 0.0
    while True:
        rows, done = await page(last)
        for seq, kind, data in rows:
            last = seq
            yield format_sse_event(data_str=json.dumps(_finite(data)), event=kind, id=str(seq))
        if rows:
            quiet = 0.0
            continue
        if done or await request.is_disconnected():
            return
        if quiet >= PING_S:
            yield KEEPALIVE_COMMENT
            quiet = 0.0
        await anyio.sleep(poll_s)
        quiet += poll_s


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has none; a browser's ``JSON.parse`` refuses them), as
    FastAPI's own SSE path sent them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
