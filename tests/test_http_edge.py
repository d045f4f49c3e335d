"""The HTTP edge (issue 23): what a stranger can make ``tokenmill serve`` do before showing a key.

One real ``tokenmill serve`` on 127.0.0.1 (a 2 s head and body timeout, so the stalls end quickly), spoken to
over raw sockets, so a test sees which bytes the server needed before it answered:

- keyless POSTs (bad JSON, a 1 MiB body, a 100k-deep JSON) get 401 after their headers alone, before a byte of
  the body is sent; keyed, the same bodies get 422 / 413 / 400 (the control: the body is read then); headers
  over 32 KiB get 431;
- connections that stall (nothing sent, half the headers, all headers and half a keyed body) get 408 and are
  closed within the timeouts; a keyless one with half a body is refused at once; an idle one is closed after
  the keep-alive; past ``--max-connections`` a request gets 503;
- 40 keyless connections that each send ~1 MB leave the server's RSS within 10 % of what it was.

In process: an unknown key id is read from the database once per TTL, not once per request; the routes the
edge lets through without a key are exactly the probes, the dashboard's files (and the docs with
``public_docs``); a database down during the key check is a 503, as it was from the dependency.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from service import auth
from service.api.app import create_app
from service.api.edge import route_table
from service.api.keycache import KeyCache
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from service.store.models import ApiKey
from tests.live_api import wait_healthy
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 2  # the server's head, body and keep-alive timeouts here
MAX_CONNECTIONS = 60
UNAUTHORIZED = {"detail": "a valid API key is required (Authorization: Bearer ...)"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``(port, pid, token)`` of a ``tokenmill serve`` with short edge timeouts."""
    tmp = tmp_path_factory.mktemp("edge")
    state, root = tmp / "state", tmp / "data"
    (root / "in").mkdir(parents=True)
    state.mkdir()
    db = Database(f"sqlite:///{state / 'tokenmill.db'}")
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, "edge")
    db.dispose()
    port = free_port()
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--state-dir", str(state), "--root", str(root), "--log-level", "warning",
         "--head-timeout-s", str(TIMEOUT_S), "--body-timeout-s", str(TIMEOUT_S), "--keepalive-s", str(TIMEOUT_S),
         "--max-connections", str(MAX_CONNECTIONS)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    wait_healthy(proc, f"http://127.0.0.1:{port}", tmp / "serve.log")
    yield port, proc.pid, token
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    log.close()


def _head(method: str, path: str, length: int | None = None, token: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=15)


def _until_closed(sock: socket.socket) -> bytes:
    """All the server sends until it closes the connection (a socket timeout fails the test)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


def test_a_stranger_is_refused_on_its_headers_before_any_body_is_read(server):
    port, _, token = server
    bodies = {"bad json": b'{"name": "x", ', "1 MiB": b" " * (1 << 20) + b"{}", "100k deep": b"[" * 100_000}
    for what, body in bodies.items():
        with _connect(port) as sock:  # the headers only: the server answers, and closes, without the body
            sock.sendall(_head("POST", "/v1/jobs", len(body)))
            status, headers, answer = _parse(_until_closed(sock))
        assert status == 401 and json.loads(answer) == UNAUTHORIZED, what
        assert headers["www-authenticate"] == "Bearer" and headers["connection"] == "close", what
        r = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 401 and r.json() == UNAUTHORIZED, what  # a client that sends it all: the same
    # the control: with a key the same bodies are read and refused for what they hold
    keyed = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    codes = {what: httpx.post(f"http://127.0.0.1:{port}/v1/jobs", content=body, headers=keyed, timeout=30)
             for what, body in bodies.items()}
    assert {what: r.status_code for what, r in codes.items()} == {"bad json": 422, "1 MiB": 413, "100k deep": 422}
    assert codes["100k deep"].json()["detail"][0]["type"] == "too_deep"  # refused before the parser recursed
    assert codes["1 MiB"].json() == {"detail": f"the request body is over the limit of {1 << 20} bytes"}
    assert codes["bad json"].json()["detail"][0]["type"] == "json_invalid"
    with _connect(port) as sock:  # over the limit by its Content-Length: 413 before the body, too
        sock.sendall(_head("POST", "/v1/jobs", (1 << 20) + 1, token))
        status, headers, answer = _parse(_until_closed(sock))
    assert status == 413 and "detail" in json.loads(answer) and headers["connection"] == "close"
    with _connect(port) as sock:  # headers past 32 KiB: 431, not parsed
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (40 << 10))
        status, headers, answer = _parse(_until_closed(sock))
    assert status == 431 and "over 32768 bytes" in json.loads(answer)["detail"] and headers["connection"] == "close"
    # a route without a key reads nothing either; an unknown path is the router's 404, without a key
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    assert httpx.get(f"http://127.0.0.1:{port}/no/such/route").status_code == 404


def test_stalled_connections_get_408_and_are_closed_within_the_timeouts(server):
    port, _, token = server
    stalls = {
        "nothing sent": b"",
        "half the headers": _head("POST", "/v1/jobs", 100, token)[:40],
        "headers, half a keyed body": _head("POST", "/v1/jobs", 100, token) + b'{"name": "x", ' + b" " * 30,
        "headers, half a keyless body": _head("POST", "/v1/jobs", 100) + b" " * 50,
        "idle after a response": _head("GET", "/healthz"),
    }
    socks = {what: _connect(port) for what in stalls}
    start = time.monotonic()
    for what, data in stalls.items():
        socks[what].sendall(data)
    answers, closed_after = {}, {}

    def wait(what: str) -> None:
        answers[what] = _until_closed(socks[what])
        closed_after[what] = time.monotonic() - start
    threads = [threading.Thread(target=wait, args=(what,)) for what in stalls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in socks.values():
        s.close()
    statuses = {what: _parse(raw)[0] if raw else None for what, raw in answers.items()}
    assert statuses == {"nothing sent": 408, "half the headers": 408, "headers, half a keyed body": 408,
                        "headers, half a keyless body": 401, "idle after a response": 200}, answers
    for what in ("nothing sent", "half the headers", "headers, half a keyed body"):
        assert "did not arrive within 2 s" in json.loads(_parse(answers[what])[2])["detail"], what
    # the timers, not an immediate close, and well before a stall could hold a connection long (generous)
    assert closed_after["headers, half a keyless body"] < TIMEOUT_S, closed_after
    for what in ("nothing sent", "half the headers", "headers, half a keyed body", "idle after a response"):
        assert TIMEOUT_S * 0.75 < closed_after[what] < TIMEOUT_S * 4, closed_after


def test_connections_past_the_limit_get_503(server):
    port, _, token = server
    held = [_connect(port) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # accepted
        r = httpx.get(f"http://127.0.0.1:{port}/healthz")
        assert r.status_code == 503 and "max-connections" in r.json()["detail"]
    finally:
        for s in held:
            s.close()
    end = time.monotonic() + 10
    while httpx.get(f"http://127.0.0.1:{port}/healthz").status_code != 200:
        assert time.monotonic() < end, "the held connections' slots did not come back"
        time.sleep(0.1)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_forty_strangers_sending_a_megabyte_each_leave_the_memory_as_it_was(server):
    port, pid, _ = server
    body = b"x" * 1_000_000

    def stranger(sock: socket.socket) -> None:
        try:
            sock.sendall(_head("POST", "/v1/jobs", 1 << 20) + body)  # 1 MiB announced, ~1 MB sent, then a stall
        except OSError:
            pass  # refused and closed under it: the point

    for _ in range(2):  # warm: the first refusals allocate what every later one reuses
        s = _connect(port)
        stranger(s)
        s.close()
    time.sleep(0.5)
    before = _rss_kib(pid)
    socks = [_connect(port) for _ in range(40)]
    threads = [threading.Thread(target=stranger, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in socks:
        s.close()
    time.sleep(1.0)  # the server sees the closes
    after = _rss_kib(pid)
    assert after <= before * 1.10, (before, after)


# ---- in process --------------------------------------------------------------------------------------------


def _app(tmp_path: Path, **settings) -> object:
    return create_app(Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'edge.db'}",
                               run_supervisor=False, **settings))


def test_an_unknown_key_id_is_read_once_per_ttl(tmp_path):
    class Clock:
        now = 1000.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    app = _app(tmp_path)
    with TestClient(app) as client:
        app.state.key_cache = KeyCache(ttl_s=10.0, clock=clock)
        reads = []
        event.listen(app.state.db.engine, "before_cursor_execute",
                     lambda conn, cursor, statement, *a: reads.append(statement) if "api_keys" in statement else None)
        new = auth.generate()
        stranger = {"Authorization": f"Bearer {new.token}"}
        for _ in range(5):
            assert client.get("/v1/jobs", headers=stranger).status_code == 401
        assert len(reads) == 1
        other = {"Authorization": f"Bearer {auth.generate().token}"}
        assert client.get("/v1/jobs", headers=other).status_code == 401 and len(reads) == 2  # another id: its read
        assert client.get("/v1/jobs", headers={"Authorization": "Bearer tm_nope"}).status_code == 401
        assert len(reads) == 2  # malformed: no read at all
        clock.now += 10.0
        assert client.get("/v1/jobs", headers=stranger).status_code == 401 and len(reads) == 3  # the TTL is over
        # a key inserted here under an id remembered as unknown works at once
        with app.state.db.session() as s:
            s.add(ApiKey(id=new.id, name="late", secret_hash=new.secret_hash, role="admin", team="default"))
        assert client.get("/v1/jobs", headers=stranger).status_code == 200


def test_the_routes_without_a_key_are_the_probes_the_dashboard_and_public_docs(tmp_path):
    def public(app) -> set[str]:
        return {r.route.path for r in route_table(app.router.routes) if not r.needs_key}

    base = {"/healthz", "/readyz", "/", "/dashboard/{name}"}
    # without --public-docs, /docs and /redoc are keyless too: a JSON 404 saying how to enable them (no schema)
    assert public(_app(tmp_path)) == base | {"/docs", "/redoc"}
    assert public(_app(tmp_path, public_docs=True)) == base | {"/openapi.json", "/docs", "/docs/oauth2-redirect",
                                                               "/redoc"}


def test_a_database_down_during_the_key_check_is_a_503(tmp_path):
    app = _app(tmp_path)
    with TestClient(app) as client:
        def down(*args):
            raise OperationalError("SELECT", {}, Exception("connection refused"))
        app.state.key_cache._read = down
        r = client.post("/v1/jobs", content=b"{}", headers={"Authorization": f"Bearer {auth.generate().token}",
                                                             "Content-Type": "application/json"})
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and "unavailable" in r.json()["detail"]
