"""Property-based fuzzing of the API (issues 12 and 23), on SQLite and PostgreSQL.

- **Every schemathesis check, against a live server** (tests/live_api.py): ``schemathesis run --checks all``
  (coverage, fuzzing and stateful phases) against the app served by uvicorn on 127.0.0.1 with a SQLite store:
  no 5xx; every status, content type, header and body documented (401, 400, 408, 413, 415, 422, 503, the
  streams' own media types, errors as JSON); schema-valid requests accepted and invalid ones refused (so every
  rule of a parameter is in the schema: bounds, id, cursor and name patterns, cron, zones); the key enforced;
  ``Allow`` on 405; a created job or schedule found through the schema's links, a deleted one gone. Valid specs
  get paths inside the roots and the event stream a finished job, so the run reaches the store, not only the
  404s. The same on PostgreSQL is in tests/test_service_store.py.
- **Bounds and U+0000, the same on both stores**: integers past what a column holds (an attempt, a run number,
  an event id in the query or in ``Last-Event-ID``) are a 422 naming the parameter, not an overflow in the
  store (SQLite) or a misleading message (PostgreSQL); a U+0000 in a spec string or a schedule's name is a 422
  naming the field before any store sees it.
- **Unauthenticated requests are refused**: generated requests without a key, or with a malformed,
  unknown or revoked one, get 401 on every operation but the probes (or 404 from the router when the generated
  path matches no route at all); nothing is created meanwhile.
- **Paths are confined**: hypothesis builds spec paths from plain names, ``.``, ``..``, symlinks leading out of
  and within a root, a NUL byte, relative forms, and the other root (input-only vs output-only: cross-root);
  a spec is refused with 403 naming the field exactly when a simple model of the rules says the path escapes
  (``service/confine.py``), with 422 naming it when it holds a NUL, else it is accepted or refused for another
  reason (422), never 403.
- **Path-like URL parameters never escape**: traversal sequences, sent raw as a hostile client would (HTTP
  libraries remove ``..`` segments before sending), as a job id, an artifact name or a dashboard file give 4xx
  and never a file's content; a NUL character in an id or a filter is a 422 (or, in an artifact name, the 400
  of a name that is not plain), never a server error.

Examples are bounded (:data:`LIVE_EXAMPLES` per operation for the live run, about 30 s on 2 cores; the in-process
tests within ~15 s).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from urllib.parse import unquote

import anyio
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.python import asgi
from starlette.requests import Request
from starlette.responses import FileResponse

from service.admission import NUL_MESSAGE
from service.api.app import create_app
from service.api.routers.artifacts import _range_refusal
from service.api.schemas import INT32_MAX
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from tests.live_api import beyond_the_schema, live_api, run_schemathesis
from tests.test_service_metrics import engine_events, seed_job
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

#: generated requests per operation in the live run (besides the coverage phase's, which does not depend on it):
#: about 3,200 requests in all, ~30 s on the 2 shared cores of CI
LIVE_EXAMPLES = 10
#: generated requests per operation and generation mode of the in-process fuzzing
MAX_EXAMPLES = 6
#: generated requests per operation sent without a valid key (each one four times: no key, a malformed, an
#: unknown and a revoked key); the key check comes before anything else a route does, so few are needed
UNAUTH_EXAMPLES = 4
PROBES = {"/healthz", "/readyz"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(request, tmp_path_factory):
    """``(app, headers, roots)``: an API-only app (no supervisor) with an input-only and an output-only root."""
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    in_root, out_root, outside = tmp / "in_root", tmp / "out_root", tmp / "outside"
    for d in (in_root / "in", out_root, outside):
        d.mkdir(parents=True)
    (in_root / "in" / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    (outside / "secret.jsonl").write_text('{"id": "s", "text": "secret"}\n')
    for root in (in_root, out_root):
        (root / "link_out").symlink_to(outside)  # inside a root, leading out of it
        (root / "link_in").symlink_to(root / "in" if root == in_root else out_root / "sub", target_is_directory=True)
    (out_root / "sub").mkdir()
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'fuzz.db'}"
    else:
        url, schema = request.getfixturevalue("postgres_url"), f"tm_test_{secrets.token_hex(6)}"
    db = Database(url, schema=schema)
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, "fuzz")
        revoked, revoked_token = repo.create_key(s, "revoked")
        repo.revoke_key(s, revoked.id)
    db.dispose()
    settings = Settings(state_dir=tmp / "state", database_url=url, database_schema=schema, input_roots=(in_root,),
                        output_roots=(out_root,), run_supervisor=False, max_body_bytes=64 << 10,
                        events_poll_s=0.05)
    app = create_app(settings)
    yield app, {"Authorization": f"Bearer {token}"}, {"in": in_root, "out": out_root, "outside": outside,
                                                      "revoked": revoked_token}
    asgi.shutdown_lifespans()  # schemathesis keeps the app's lifespan running between requests
    Database(url, schema=schema).drop_schema()


@pytest.fixture(scope="module")
def operations(service):
    """Every operation of the app's own OpenAPI schema (read with a key: it is not public by default)."""
    app, headers, _ = service
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=headers)
    schema.config.generation.update(with_security_parameters=False)  # the tests send their own keys
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/metrics"}
    return ops


#: hypothesis settings of each (operation, mode): fixed seed (a CI run fails only on a real regression), no
#: example database written into the work tree
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def _fuzz(operations, check, max_examples: int) -> None:
    """Run ``check(case)`` on generated valid requests of every operation. Driven with hypothesis directly
    (``APIOperation.as_strategy``) rather than schemathesis' pytest loader, whose fixture-based form relies on
    pytest internals that pytest 9 no longer has."""
    for op in operations:
        @settings(FUZZ, max_examples=max_examples)
        @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def run(case) -> None:
            check(case)

        try:
            run()
        except Exception as exc:
            exc.add_note(f"operation {op.label}")
            raise


@pytest.mark.slow
def test_every_schemathesis_check_passes_against_a_live_server(tmp_path):
    """``schemathesis run --checks all`` against the API on SQLite (see tests/live_api.py); it must also have
    gone deep: jobs and schedules created, operations on them reached through the links, a finished job's event
    stream read, invalid requests refused."""
    with live_api(tmp_path) as live:
        proc, seen = run_schemathesis(live, tmp_path, max_examples=LIVE_EXAMPLES)
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:]
    assert beyond_the_schema(tmp_path) == set()
    _went_deep(seen)


def _went_deep(seen: Counter[str]) -> None:
    """What a run that reached the store answered at least once (the PostgreSQL run checks the same)."""
    for reached in ("POST /v1/jobs 201", "POST /v1/schedules 201", "GET /v1/jobs/{job_id} 200",
                    "POST /v1/jobs/{job_id}/cancel 202", "GET /v1/schedules/{schedule_id} 200",
                    "GET /v1/jobs/{job_id}/events 200", "GET /v1/jobs/{job_id}/events 422", "GET /v1/jobs 422",
                    "GET /v1/jobs/{job_id} 401", "DELETE /v1/jobs 405"):
        assert seen[reached] > 0, (reached, sorted(seen.items()))


def test_huge_integers_and_nul_are_422_naming_the_field_on_every_store(service):
    """Each integer past its column (4 bytes: attempt, run and event numbers) is a 422 naming the parameter on
    both stores (it was a 500 on SQLite, an overflow, and on PostgreSQL a 422 blaming a NUL); one at the bound
    goes through (the control). A U+0000 in a spec string, a schedule's name or a query is a 422 naming the
    field on both (SQLite would store it, PostgreSQL refused it deep in the store)."""
    app, headers, roots = service
    out = roots["out"] / f"nul-{secrets.token_hex(3)}"
    spec = {"name": "b", "inputs": [{"path": str(roots["in"] / "in" / "*.jsonl")}], "output": {"path": str(out)},
            "stages": [{"type": "exact_dedup"}]}
    with asgi.get_client(app) as client:
        done = seed_job(app.state.db, "bounds", events=engine_events("bounds", time.time() - 60))
        sched = client.post("/v1/schedules", headers=headers, json={"cron": "@daily", "spec": spec})
        assert sched.status_code == 201, sched.text
        sid = sched.json()["id"]

        def refused(r, *loc: str | int, kind: str | None = None) -> None:
            assert r.status_code == 422, (loc, r.status_code, r.text)
            assert [p["loc"] for p in r.json()["detail"]] == [list(loc)], r.text
            assert kind is None or r.json()["detail"][0]["type"] == kind, r.text

        for huge in (str(2**63), "1" + "0" * 23):  # past any column; 10**23 is what 1e23 meant
            refused(client.get(f"/v1/jobs/{done}/logs", params={"attempt": huge}, headers=headers), "query", "attempt")
            refused(client.get(f"/v1/schedules/{sid}/runs", params={"before": huge}, headers=headers),
                    "query", "before")
            refused(client.get(f"/v1/jobs/{done}/events", params={"after": huge}, headers=headers), "query", "after")
            refused(client.get(f"/v1/jobs/{done}/events", headers={**headers, "Last-Event-ID": huge}),
                    "header", "last-event-id")
        refused(client.get(f"/v1/jobs/{done}/events", params={"after": INT32_MAX + 1}, headers=headers),
                "query", "after")
        refused(client.get("/v1/jobs", params={"cursor": "8" + "0" * 15}, headers=headers), "query", "cursor")
        # the control: at the bound, the request reaches the store and gets its ordinary answer
        assert client.get(f"/v1/jobs/{done}/logs", params={"attempt": INT32_MAX}, headers=headers).status_code == 404
        assert client.get(f"/v1/schedules/{sid}/runs", params={"before": INT32_MAX},
                          headers=headers).json()["items"] == []
        r = client.get(f"/v1/jobs/{done}/events", headers={**headers, "Last-Event-ID": str(INT32_MAX)})
        assert (r.status_code, r.text) == (200, "")  # nothing after it, and the job has ended
        assert client.get("/v1/jobs", params={"cursor": "7" + "f" * 15}, headers=headers).status_code == 200

        nul_out = {**spec, "output": {"path": str(out) + "\x00x"}}
        refused(client.post("/v1/jobs", json=nul_out, headers=headers), "body", "output", "path", kind="nul_character")
        nul_field = {**spec, "inputs": [{**spec["inputs"][0], "text_field": "te\x00xt"}]}
        refused(client.post("/v1/jobs", json=nul_field, headers=headers), "body", "inputs", 0, "text_field",
                kind="nul_character")
        refused(client.post("/v1/schedules", json={"name": "a\x00b", "cron": "@daily", "spec": spec}, headers=headers),
                "body", "name", kind="nul_character")
        refused(client.patch(f"/v1/schedules/{sid}", json={"name": "a\x00b"}, headers=headers), "body", "name")
        refused(client.post("/v1/schedules", json={"cron": "@daily", "spec": nul_out}, headers=headers),
                "body", "spec", "output", "path", kind="nul_character")
        refused(client.get("/v1/jobs", params={"name": "a\x00b"}, headers=headers), "query", "name")
        refused(client.get("/v1/jobs/a\x00b", headers=headers), "path", "job_id", kind="nul_character")
        assert client.get("/v1/jobs/a\x00b", headers=headers).json()["detail"][0]["msg"] == NUL_MESSAGE


@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
def test_requests_without_a_valid_key_are_refused(service, operations):
    """(On SQLite only: the key is checked before any query of the route, by the same code on both stores beyond
    one primary-key lookup, which tests/test_service_api.py covers on both.)"""
    app, _, roots = service
    with asgi.get_client(app) as client:
        before = client.get("/v1/jobs", headers=service[1]).json()["items"]

    def check(case) -> None:
        generated = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        for auth in (None, "Bearer nope", f"Bearer {roots['revoked']}", "Basic dXNlcjpwYXNz"):
            case.headers = {**generated, **({"Authorization": auth} if auth else {})}
            r = case.call()
            if case.path in PROBES:
                assert r.status_code < 500
                continue
            if r.status_code == 404:  # the router matched no route (e.g. a '/' in a generated id): no handler ran
                assert r.json() == {"detail": "Not Found"}, (case.method, case.formatted_path, r.text)
                continue
            assert r.status_code == 401, (case.method, case.formatted_path, auth, r.status_code, r.text[:300])
            assert r.headers.get("www-authenticate") == ["Bearer"]

    _fuzz(operations, check, max_examples=UNAUTH_EXAMPLES)
    with asgi.get_client(app) as client:
        assert client.get("/v1/jobs", headers=service[1]).json()["items"] == before  # nothing was created


# ---- paths in specs --------------------------------------------------------------------------------------------

SEGMENT = st.sampled_from(["a", "b", ".", "..", "link_out", "link_in", "nul\x00"])


def _escapes(segments: list[str]) -> bool:
    """The rules, as a model independent of service/confine.py: '..' is refused outright; the symlink leading
    out (at the top of each root) takes the path out, and nothing after it comes back (no '..'); below a plain
    name or link_in (which leads to a folder holding no link) it is just a missing name. (A NUL byte is refused
    before any of this, as in any string of a request: :func:`_refused_nul`.)"""
    named = [s for s in segments if s != "."]
    return ".." in segments or named[:1] == ["link_out"]


def _refused_nul(segments: list[str], r, loc: tuple) -> bool:
    """True when the path holds a NUL: then the answer must be a 422 naming the field, whatever else it has."""
    if "nul\x00" not in segments:
        return False
    assert r.status_code == 422, (segments, r.status_code, r.text)
    assert [(tuple(p["loc"]), p["type"]) for p in r.json()["detail"]] == [(loc, "nul_character")], r.text
    return True


@given(base=st.sampled_from(["in", "out"]), segments=st.lists(SEGMENT, max_size=4), leaf=st.booleans(),
       relative=st.booleans())
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_output_paths_outside_the_output_root_are_refused(service, base, segments, leaf, relative):
    app, headers, roots = service
    parts = [*segments, f"o{secrets.token_hex(3)}"] if leaf else segments
    raw = os.path.join("o", *parts) if relative else os.path.join(str(roots[base]), *parts)
    spec = {"name": "p", "inputs": [{"path": str(roots["in"] / "in" / "*.jsonl")}], "output": {"path": raw}}
    is_root = all(s == "." for s in parts)  # the root itself: never an output
    expect_refused = relative or base == "in" or is_root or _escapes(segments)  # "in" is input-only: cross-root
    with asgi.get_client(app) as client:
        r = client.post("/v1/jobs", json=spec, headers=headers)
    if _refused_nul(segments, r, ("body", "output", "path")):
        return
    if expect_refused:
        assert r.status_code == 403, (raw, r.status_code, r.text)
        assert {tuple(p["loc"]) for p in r.json()["detail"]} == {("body", "output", "path")}, r.text
    else:
        assert r.status_code in (201, 422), (raw, r.status_code, r.text)  # 422: preflight (e.g. overlap)


@given(base=st.sampled_from(["in", "out", "outside"]), segments=st.lists(SEGMENT, max_size=4),
       pattern=st.sampled_from(["*.jsonl", "a.jsonl", "secret.jsonl", "**/*.jsonl"]))
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_input_paths_outside_the_readable_roots_are_refused(service, base, segments, pattern):
    app, headers, roots = service
    raw = os.path.join(str(roots[base]), *segments, pattern)
    spec = {"name": "p", "inputs": [{"path": raw}], "output": {"path": str(roots["out"] / f"o{secrets.token_hex(3)}")}}
    # readable: the input root and the output root (a job may read what another wrote). A recursive glob from
    # a root's top reaches its link_out, and so escapes too
    escapes = base == "outside" or _escapes(segments) or (pattern.startswith("**") and all(s == "." for s in segments))
    with asgi.get_client(app) as client:
        r = client.post("/v1/jobs", json=spec, headers=headers)
    if _refused_nul(segments, r, ("body", "inputs", 0, "path")):
        return
    if escapes:
        assert r.status_code == 403, (raw, r.status_code, r.text)
        assert {tuple(p["loc"]) for p in r.json()["detail"]} == {("body", "inputs", 0, "path")}, r.text
    else:
        assert r.status_code in (201, 422), (raw, r.status_code, r.text)  # 422: no file matches


# ---- path-like URL parameters ------------------------------------------------------------------------------------

TRAVERSALS = ["..", "../..", "..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd", "....//....//etc/passwd",
              "..\\..\\etc\\passwd", "%252e%252e%252fetc", "/etc/passwd", ".tokenmill/marker.json",
              "rejected/00-read/x.jsonl", "%00", "a%00b"]


def test_a_nul_character_anywhere_is_refused_not_a_server_error(service):
    """PostgreSQL text cannot hold U+0000 (SQLite can): a NUL in an id or a filter is the same 422 naming the
    parameter on both, sent raw; in an artifact name, the 400 of a name that is not a plain path."""
    app, headers, _ = service
    with asgi.get_client(app):  # (starts the app once)
        pass
    for url, loc in (("/v1/jobs/a%00b", "job_id"), ("/v1/jobs/a%00b/events", "job_id"),
                     ("/v1/jobs?name=a%00b", "name"), ("/v1/schedules/a%00b", "schedule_id"),
                     ("/v1/schedules/a%00b/runs", "schedule_id"), ("/v1/jobs/a%00b/artifacts/x", "job_id"),
                     ("/v1/schedules/0123456789abcdef/versions/1/artifacts/a%00b", None)):
        status, body = _raw_get(app, url, headers)
        if loc is None:
            assert status == 400, (url, status, body[:200])
            continue
        assert status == 422, (url, status, body[:200])
        assert [p["loc"][-1] for p in json.loads(body)["detail"]] == [loc], (url, body[:200])


def _raw_get(app, raw_path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET ``raw_path`` exactly as written, as a server passes it on (``path`` percent-decoded, ``raw_path`` as
    sent): HTTP clients (requests, httpx) remove ``.`` and ``..`` segments before sending, a hostile one does not."""
    sent: dict = {"status": 0, "body": b""}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
        elif message["type"] == "http.response.body":
            sent["body"] += message.get("body", b"")

    path, _, query = raw_path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": unquote(path), "raw_path": path.encode(), "root_path": "", "query_string": query.encode(),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80), "state": {}}
    try:
        anyio.run(app, scope, receive, send)
    except Exception:  # the app answered 500 and re-raised (as under a server): report the 500
        if sent["status"] != 500:
            raise
    return sent["status"], sent["body"]


def test_traversal_in_url_parameters_never_reaches_a_file(service):
    app, headers, roots = service
    secret = (roots["outside"] / "secret.jsonl").read_text()
    with asgi.get_client(app) as client:  # (starts the app once)
        job_id = client.post("/v1/jobs", headers=headers, json={
            "name": "t", "inputs": [{"path": str(roots["in"] / "in" / "*.jsonl")}],
            "output": {"path": str(roots["out"] / "t")}}).json()["id"]
    for t in TRAVERSALS:
        for url in (f"/v1/jobs/{t}", f"/v1/jobs/{t}/logs", f"/v1/jobs/{job_id}/artifacts/{t}",
                    f"/v1/jobs/{job_id}/logs?attempt={t}", f"/dashboard/{t}", f"/{t}"):
            status, body = _raw_get(app, url, headers)
            assert 400 <= status < 500, (url, status, body[:200])
            assert b"root:" not in body and secret.encode() not in body and b"import " not in body, url


def test_a_bad_range_on_a_served_file_is_a_json_error(tmp_path):
    """starlette answers a malformed or unsatisfiable ``Range`` in plain text; the artifact routes answer the same
    statuses in JSON (a ``Range`` that ``If-Range`` cancels is no error, a good one is left to starlette)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10)
    st_ = path.stat()

    def answer(**headers: str):
        scope = {"type": "http", "method": "GET", "path": "/", "query_string": b"",
                 "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}
        response = FileResponse(path, stat_result=st_, headers={"ETag": '"abc"'})
        return _range_refusal(Request(scope), response, st_.st_size)

    malformed, outside = answer(range="bytes=5-2"), answer(range="bytes=20-30")
    assert (malformed.status_code, json.loads(malformed.body)["detail"]) == (400, "Range: start must be less than end")
    assert outside.status_code == 416 and outside.headers["content-range"] == "bytes */10"
    assert "detail" in json.loads(outside.body)
    assert answer(range="lines=1-2").status_code == 400
    assert answer(range="bytes=0-4") is None and answer() is None  # served by starlette (206, 200)
    assert answer(range="bytes=20-30", if_range='"other"') is None  # If-Range does not match: the whole file
