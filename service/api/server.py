"""How ``tokenmill serve`` runs uvicorn: a deadline and a size cap on each request's head, and the server's limits.

uvicorn has no timeout on reading a request's line and headers: its keep-alive timer runs only between two
requests, is not armed when a connection opens, and every byte received cancels it. A client that opened a
connection and sent nothing, or half its headers, a byte now and then, held it, and its slot, for as long as it
liked. :class:`HeadDeadline` (mixed into uvicorn's own HTTP protocol classes) gives every request head
``head_timeout_s``, counted from the connection's opening, or from the first byte of the next request on a
kept-alive one, and :data:`MAX_HEAD_BYTES`; past either, the client gets 408 or 431 (JSON, as every refusal) and
the connection is closed. The body's own deadline is the edge middleware's (:mod:`service.api.edge`), as it
starts once the key has been checked.

The rest are uvicorn's own settings: ``timeout_keep_alive`` (``keepalive_s``) closes a connection idle between
requests, and ``limit_concurrency`` (``max_connections``) answers 503 to a request arriving while that many
connections or requests are open in the process (uvicorn's ``backlog``, 2048 waiting connections, stays).
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, cast

from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings

#: the most bytes of a request's line and headers: an API key and the usual headers take under 2 KB
MAX_HEAD_BYTES = 32 << 10


def _refusal(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


class HeadDeadline(asyncio.Protocol):
    """Mixed in before a uvicorn HTTP protocol class: closes a connection whose request head is not complete
    within ``head_timeout_s`` or over ``max_head_bytes``.

    A head is complete when the protocol has made the request's cycle (uvicorn's ``self.cycle``: a new object per
    request, made once the headers are parsed); it is awaited from the connection's opening and, after a
    response, from the next byte (until then the keep-alive timer watches the idle connection)."""

    # uvicorn's protocol attributes this reads
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any

    def __init__(self, *args: Any, head_timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head_timeout_s, self.max_head_bytes = head_timeout_s, max_head_bytes
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        awaiting, cycle = self._awaiting_head(), self.cycle
        if awaiting:  # counted up to the blank line that ends the head (what follows is the body)
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers are over {self.max_head_bytes} bytes")
                return  # never parsed
        super().data_received(data)
        if not awaiting or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # a body, a pipelined request (its head: once the response is out), a refusal, an upgrade
        if self.cycle is not cycle:  # the head is complete
            self._disarm()
        elif self._head_timer is None:  # the first bytes of a kept-alive connection's next request
            self._arm()

    def _awaiting_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_bytes = 0

    def _timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head():
            self._refuse(408, "Request Timeout",
                         f"the request line and headers did not arrive within {self.head_timeout_s:g} s")

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_refusal(status, reason, detail))
            self.transport.close()


_OVERLOADED_BODY = json.dumps({"detail": "the server has as many connections as --max-connections allows; "
                                         "retry shortly"}).encode()


async def overloaded(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """The 503 past ``limit_concurrency`` as JSON like every other refusal (uvicorn's own is plain text)."""
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(_OVERLOADED_BODY)).encode()),
                            (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": _OVERLOADED_BODY, "more_body": False})


# uvicorn's httptools protocol answers a request past the limit with its module's `service_unavailable`: the one
# name to rebind, in the `tokenmill serve` process only (this module is imported by nothing else)
httptools_impl.service_unavailable = overloaded


class GuardedHttpTools(HeadDeadline, HttpToolsProtocol):
    """uvicorn's protocol on httptools' parser (the one its ``http="auto"`` picks; httptools is a dependency of
    the service), with the head's deadline and cap."""


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run`` keywords for the settings' edge limits. The protocol goes as a ``functools.partial`` of a
    module-level class: uvicorn calls it like the class, and it pickles for ``--workers`` processes."""
    http = functools.partial(GuardedHttpTools, head_timeout_s=settings.head_timeout_s)
    return {"http": cast(type[asyncio.Protocol], http), "timeout_keep_alive": settings.keepalive_s,
            "limit_concurrency": settings.max_connections}
