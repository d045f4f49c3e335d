"""The HTTP client of the commands that talk to a tokenmill server (``submit``, ``status``, ``follow``, ``logs``,
``cancel``, ``retry``, ``audit``, ``mix --server``): requests with the API key, a refusal as one
:class:`ClientError` line per problem with the exit code it means (2 a 4xx, 1 a 5xx or no answer), and a job's
server-sent events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from service.commands.exits import EXIT_FAILURE, EXIT_USAGE

DEFAULT_SERVER = "http://127.0.0.1:8000"
#: seconds a request may take (a submit runs the spec's file checks on the server)
TIMEOUT_S = 60.0


class ClientError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class Api:
    """A thin httpx client that turns HTTP errors into :class:`ClientError` lines."""

    def __init__(self, server: str, api_key: str | None):
        if not api_key:
            raise ClientError("no API key: pass --api-key or set TOKENMILL_API_KEY", EXIT_USAGE)
        self.client = httpx.Client(base_url=server.rstrip("/"), timeout=TIMEOUT_S,
                                   headers={"Authorization": f"Bearer {api_key}"})

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ClientError(f"{self.client.base_url}: {exc}", EXIT_FAILURE) from None
        _check(r)
        return r

    def events(self, job_id: str, after: int) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """``(id, event, data)`` of the job's server-sent events after ``after``, until the stream ends."""
        headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
        with self.client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                                timeout=httpx.Timeout(TIMEOUT_S, read=None)) as r:
            if r.is_error:
                r.read()
                _check(r)
            fields: dict[str, str] = {}
            for line in r.iter_lines():
                if not line:
                    if "data" in fields:
                        yield int(fields.get("id", after)), fields.get("event", "message"), json.loads(fields["data"])
                    fields = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value[1:] if value.startswith(" ") else value


def _check(r: Any) -> None:
    if r.status_code < 400:
        return
    try:
        detail = r.json().get("detail")
    except ValueError:
        detail = r.text.strip()
    if isinstance(detail, list):
        lines = [f"{'.'.join(str(x) for x in p.get('loc', [])[1:]) or 'request'}: {p.get('msg')}" for p in detail]
    else:
        lines = [str(detail)]
    msg = "\n".join(f"HTTP {r.status_code}: {line}" for line in lines)
    raise ClientError(msg, EXIT_USAGE if r.status_code < 500 else EXIT_FAILURE)
