"""Issue 37: a client that leaves a job's event stream (``/v1/jobs/{id}/events``) is a normal end of the stream:
the server (uvicorn, a real process) logs no ERROR and no traceback, on SQLite and PostgreSQL, whether the
client left an idle stream (a QUEUED job, the supervisor off) or one that events were flowing through."""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from service.store import repo
from service.store.db import Database
from tests.live_api import live_api
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture


def _leave(base: str, token: str, job_id: str, backlog: bool) -> None:
    """Open the job's events and close the socket (a reset): on an idle stream (no event for a QUEUED job), or,
    with ``backlog``, after the first event, the client reading no more while the server has plenty to send."""
    host = urlsplit(base)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's sends back up at once
        sock.settimeout(10)
        sock.connect((host.hostname, host.port))
        sock.sendall(f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        seen = sock.recv(4096)
        assert seen.startswith(b"HTTP/1.1 200"), seen
        while backlog and b"\nid: " not in seen:
            seen += sock.recv(4096)
        time.sleep(0.3)  # idle, or an event on its way through the server's streams
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_client_leaving_the_event_stream_logs_no_error(request, tmp_path: Path, store: str):
    url, schema = (None, None) if store == "sqlite" else \
        (request.getfixturevalue("postgres_url"), f"tm_test_{secrets.token_hex(6)}")
    with live_api(tmp_path, url, schema) as live:
        headers = {"Authorization": f"Bearer {live.token}"}
        job = httpx.post(f"{live.url}/v1/jobs", headers=headers, timeout=30, json={
            "name": "follow", "inputs": [{"path": live.inputs}], "output": {"path": str(live.output_root / "o")}})
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        _leave(live.url, live.token, job_id, backlog=False)
        db = Database(url or f"sqlite:///{tmp_path / 'live.db'}", schema=schema)
        try:  # as a running job's engine appends them: ~10 MB to send, more than the sockets buffer
            with db.session() as s:
                repo.append_events(s, repo.get_job(s, job_id), 1,
                                   [{"type": "progress", "ts": time.time(), "note": "x" * 40_000}] * 250)
        finally:
            db.dispose()
        for _ in range(2):
            _leave(live.url, live.token, job_id, backlog=True)
        time.sleep(0.5)  # the server notices the last one
        assert httpx.get(f"{live.url}/healthz", timeout=10).status_code == 200
    log = (tmp_path / "serve.log").read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
