"""The control plane's API and supervisor (issue 12), without Ray.

- The API (FastAPI's TestClient, on SQLite and PostgreSQL): bearer keys on every route but the health
  probes, 422 with field paths, 403 for paths outside the roots (``..``, symlinks, globs), 413, the
  Idempotency-Key, filters and cursors, cancel/retry conflicts, server-sent events resumed with
  Last-Event-ID, logs.
- The supervisor with a stand-in job process (a short script that writes engine-shaped events): the queue
  and its concurrency limit, a crashed process resumed as a new attempt, cancel by SIGTERM, a restarted
  supervisor re-attaching to a live process, a process found by its run folder, pid reuse.
The real job process, with Ray, over real HTTP: tests/test_service_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from pipeline.spec import JobSpec
from service import auth
from service.admission import cpu_problems
from service.api.app import SETTINGS_ENV, app_from_env, create_app
from service.api.keycache import KeyCache, _Entry
from service.commands.serve import main as main_serve
from service.confine import Roots
from service.runner import process
from service.runner.report import Reporter, log_tail
from service.runner.summary import fold, with_stats
from service.runner.supervisor import RunnerConfig, Supervisor
from service.settings import Settings, machine_cpus
from service.store import repo
from service.store.db import Database
from service.store.models import ApiKey, AttemptEvent, JobState, utcnow
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

# ---- the API ----------------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request, tmp_path):
    """``(client, headers, data_root)``: an API-only app (no supervisor) on a fresh database."""
    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'api.db'}"
    else:
        url, schema = request.getfixturevalue("postgres_url"), f"tm_test_{secrets.token_hex(6)}"
    settings = Settings(state_dir=tmp_path / "state", database_url=url, database_schema=schema,
                        input_roots=(root,), output_roots=(root,), run_supervisor=False, max_body_bytes=64 << 10,
                        events_poll_s=0.05)
    app = create_app(settings)
    with TestClient(app) as client:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "test")
        yield client, {"Authorization": f"Bearer {token}"}, root
        app.state.db.drop_schema()


def _spec(root: Path, name: str = "job", out: str = "out", **extra) -> dict:
    return {"name": name, "inputs": [{"path": str(root / "in" / "*.jsonl")}], "output": {"path": str(root / out)},
            **extra}


def _submit(client, headers, spec, **hdr):
    return client.post("/v1/jobs", json=spec, headers={**headers, **hdr})


def test_every_route_but_health_needs_a_valid_key(api):
    client, headers, root = api
    job_id = _submit(client, headers, _spec(root)).json()["id"]
    with client.app.state.db.session() as s:
        revoked, revoked_token = repo.create_key(s, "old")
        repo.revoke_key(s, revoked.id)
    routes = [(m.upper(), path.replace("{job_id}", job_id)) for path, ops in client.app.openapi()["paths"].items()
              for m in ops] + [("GET", "/openapi.json")]
    assert {p for _, p in routes} >= {"/v1/jobs", f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events",
                                      f"/v1/jobs/{job_id}/logs", f"/v1/jobs/{job_id}/cancel",
                                      f"/v1/jobs/{job_id}/retry", "/openapi.json", "/healthz", "/readyz"}
    for bad in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {revoked_token}"},
                {"Authorization": headers["Authorization"].replace("Bearer", "Basic")}):
        for method, path in routes:
            r = client.request(method, path, headers=bad, json=_spec(root) if method == "POST" else None)
            if path in ("/healthz", "/readyz"):
                assert r.status_code == 200, (method, path)
            else:
                assert r.status_code == 401, (method, path, bad, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).json()["state"] == "QUEUED"  # nothing happened
    schema = client.get("/openapi.json", headers=headers).json()
    assert "/v1/jobs/{job_id}/events" in schema["paths"] and "HTTPBearer" in schema["components"]["securitySchemes"]


def test_invalid_specs_get_422_naming_each_field(api):
    client, headers, root = api
    r = _submit(client, headers, {**_spec(root), "stages": [{"type": "nope"}, {"type": "length",
                                                                            "params": {"min_words": "many"}}]})
    assert r.status_code == 422
    locs = {tuple(p["loc"]): p["msg"] for p in r.json()["detail"]}
    assert "unknown stage 'nope'" in locs[("body", "stages", 0, "type")]
    assert ("body", "stages", 1, "params", "min_words") in locs
    r = _submit(client, headers, {**_spec(root), "packing": {"seq_len": 0}, "surprise": 1})
    assert {tuple(p["loc"]) for p in r.json()["detail"]} == {("body", "packing", "seq_len"), ("body", "surprise")}
    r = _submit(client, headers, {"name": "x"})
    assert {tuple(p["loc"]) for p in r.json()["detail"]} == {("body", "inputs"), ("body", "output")}
    r = _submit(client, headers, _spec(root) | {"inputs": [{"path": str(root / "in" / "*.parquet")}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "inputs", 0, "path"]  # no such file
    r = _submit(client, headers, _spec(root) | {"execution": {"address": "ray://elsewhere:10001"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "execution", "address"]
    for body in (b"{not json", b"[]", b"", b"\xe9"):  # not UTF-8 too: one 422 form for any broken body
        r = client.post("/v1/jobs", content=body, headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 422 and isinstance(r.json()["detail"], list), body
    assert client.get("/v1/jobs", headers=headers).json()["items"] == []


def test_a_spec_may_ask_at_most_max_job_cpus_and_job_cpus_is_only_the_default(api, tmp_path):
    client, headers, root = api
    cap = client.app.state.settings.job_cpu_cap
    assert cap == machine_cpus()  # no --max-job-cpus, a local Ray: this machine's CPUs
    for field in ("num_cpus", "parallelism"):
        r = _submit(client, headers, _spec(root, out=f"o-{field}") | {"execution": {field: cap + 1}})
        assert r.status_code == 422 and [p["loc"] for p in r.json()["detail"]] == [["body", "execution", field]]
        assert f"the {cap} CPUs" in r.json()["detail"][0]["msg"]
    r = _submit(client, headers, _spec(root) | {"execution": {"num_cpus": cap + 1, "parallelism": 10 * cap}})
    assert {tuple(p["loc"]) for p in r.json()["detail"]} == {("body", "execution", "num_cpus"),
                                                             ("body", "execution", "parallelism")}
    assert client.get("/v1/jobs", headers=headers).json()["items"] == []
    r = _submit(client, headers, _spec(root) | {"execution": {"num_cpus": cap, "parallelism": cap}})
    assert r.status_code == 201, r.text  # at the cap

    assert Settings(max_job_cpus=3).job_cpu_cap == 3 and Settings(max_job_cpus=64, job_cpus=2).job_cpu_cap == 64
    assert Settings(job_cpus=machine_cpus() + 4).job_cpu_cap == machine_cpus() + 4  # the admin's default fits
    assert Settings(ray_address="head:6379").job_cpu_cap is None  # a cluster: its size bounds a job
    assert Settings(ray_jobs_url="http://head:8265", max_job_cpus=8).job_cpu_cap == 8
    assert Settings.from_env({"TOKENMILL_MAX_JOB_CPUS": "5"}).job_cpu_cap == 5
    spec = JobSpec.model_validate(_spec(root) | {"execution": {"num_cpus": 4, "parallelism": 5}})
    assert [p.loc for p in cpu_problems(spec, 4)] == [("execution", "parallelism")] and cpu_problems(spec, 5) == []
    with pytest.raises(ValueError, match="job_cpus"):
        Settings(job_cpus=8, max_job_cpus=4)
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # a container's --cpus 1.5
    assert machine_cpus(str(tmp_path / "cpu.max")) == min(2, machine_cpus())
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert machine_cpus(str(tmp_path / "cpu.max")) == machine_cpus(str(tmp_path / "none"))
    # the flag reaches the settings: a default above the cap is refused before anything starts
    assert main_serve(["--state-dir", str(tmp_path / "s"), "--job-cpus", "3", "--max-job-cpus", "2"]) == 2


def test_each_problem_is_a_422_item_at_its_field(api):
    """Issue 21: a schema error and bad stage params (a field's, a stage validator's) in one 422, each an item at its
    loc; then a missing input file; no message keeps pydantic's "Value error, " prefix."""
    client, headers, root = api
    r = _submit(client, headers, {**_spec(root), "packing": {"seq_len": 0}, "stages": [
        {"type": "length", "params": {"min_chars": "many"}}, {"type": "near_dedup", "params": {"bands": 4}},
        {"type": "pii", "params": {"entities": ["NOPE"]}}]})
    assert r.status_code == 422
    items = {tuple(p["loc"]): p for p in r.json()["detail"]}
    assert set(items) == {("body", "packing", "seq_len"), ("body", "stages", 0, "params", "min_chars"),
                          ("body", "stages", 1, "params"), ("body", "stages", 2, "params", "entities")}, items
    assert items[("body", "stages", 1, "params")]["msg"] == "give both bands and rows, or neither"
    assert items[("body", "stages", 2, "params", "entities")]["msg"].startswith("unknown ['NOPE']")
    missing = str(root / "in" / "none" / "*.jsonl")
    r = _submit(client, headers, _spec(root) | {"inputs": [{"path": missing}]})
    assert r.status_code == 422 and r.json()["detail"] == [
        {"loc": ["body", "inputs", 0, "path"], "msg": f"no file matches {missing!r}", "type": "no_match"}]
    assert not any(p["msg"].startswith("Value error") for p in [*items.values(), *r.json()["detail"]])


def test_paths_outside_the_roots_are_refused(api, tmp_path):
    client, headers, root = api
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "x.jsonl").write_text('{"text": "secret"}\n')
    (root / "in" / "link").symlink_to(outside)  # a folder inside the root that leads out of it
    (root / "out_link").symlink_to(outside)
    cases = {
        ("inputs", 0, "path"): [{"inputs": [{"path": "/etc/passwd"}]},
                                {"inputs": [{"path": str(root / "in" / ".." / ".." / "secret" / "x.jsonl")}]},
                                {"inputs": [{"path": str(root / "in" / "link" / "x.jsonl")}]},
                                {"inputs": [{"path": str(root / "in" / "*" / "*.jsonl")}]},  # matches via link
                                {"inputs": [{"path": str(root / "in")}]},  # the folder holds the link
                                {"inputs": [{"path": "in/*.jsonl"}]}, {"inputs": [{"path": "~/x.jsonl"}]}],
        ("output", "path"): [{"output": {"path": "/tmp/elsewhere"}}, {"output": {"path": str(root)}},
                             {"output": {"path": str(root / "out_link" / "o")}},
                             {"output": {"path": str(root / "a" / ".." / ".." / "o")}}],
        ("tokenizer", "path"): [{"tokenizer": {"path": str(outside / "x.jsonl")}}],
        ("stages", 0, "params", "dedup_against"): [
            {"stages": [{"type": "exact_dedup", "params": {"dedup_against": str(outside)}}]}],
    }
    for loc, overrides in cases.items():
        for over in overrides:
            r = _submit(client, headers, _spec(root) | over)
            assert r.status_code == 403, (over, r.text)
            assert {tuple(p["loc"]) for p in r.json()["detail"]} == {("body", *loc)}, (over, r.json())
    (root / "in" / "link").unlink()
    assert _submit(client, headers, _spec(root)).status_code == 201  # the same spec, inside the roots


def test_a_body_over_the_limit_gets_413(api):
    client, headers, root = api
    big = _spec(root) | {"stages": [{"type": "normalize", "params": {}}] * 4000}
    assert client.post("/v1/jobs", content=json.dumps(big), headers={**headers, "Content-Type": "application/json"}
                       ).status_code == 413

    def chunks():  # no Content-Length: the limit still holds while reading
        for _ in range(100):
            yield b" " * 4096
    r = client.post("/v1/jobs", content=chunks(), headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 413


def test_idempotency_key_and_job_detail(api):
    client, headers, root = api
    first = _submit(client, headers, _spec(root), **{"Idempotency-Key": "abc"})
    again = _submit(client, headers, _spec(root), **{"Idempotency-Key": "abc"})
    other = _submit(client, headers, _spec(root, "other"), **{"Idempotency-Key": "abc"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert first.json()["id"] == again.json()["id"] and first.headers["location"] == f"/v1/jobs/{first.json()['id']}"
    detail = client.get(f"/v1/jobs/{first.json()['id']}", headers=headers).json()
    assert detail["state"] == "QUEUED" and detail["attempt"] == 0 and detail["spec"]["name"] == "job"
    assert detail["output_path"] == os.path.realpath(root / "out")
    assert len(client.get("/v1/jobs", headers=headers).json()["items"]) == 1


def test_list_filters_and_cursor(api):
    client, headers, root = api
    ids = [_submit(client, headers, _spec(root, f"n{i % 2}", f"o{i}")).json()["id"] for i in range(5)]
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=headers)
    seen, cursor = [], None
    while True:
        page = client.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})},
                          headers=headers).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]

    def ids_for(**params):
        return [j["id"] for j in client.get("/v1/jobs", params=params, headers=headers).json()["items"]]

    assert ids_for(state="CANCELLED") == [ids[0]]
    assert ids_for(state=["CANCELLED", "QUEUED"], name="n0") == [ids[4], ids[2], ids[0]]
    assert ids_for(created_after="2999-01-01T00:00:00Z") == []
    assert len(ids_for(created_before="2999-01-01T00:00:00")) == 5  # no zone: UTC
    for bad in ({"state": "DONE"}, {"limit": 0}, {"limit": 10_000}, {"cursor": "garbage"},
                {"created_after": "yesterday"}):
        assert client.get("/v1/jobs", params=bad, headers=headers).status_code == 422, bad


def test_cancel_retry_and_unknown_jobs(api):
    client, headers, root = api
    job_id = _submit(client, headers, _spec(root)).json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=headers).status_code == 409  # queued: nothing to retry
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    assert (r.status_code, r.json()["state"], r.json()["error"]["category"]) == (202, "CANCELLED", "cancelled")
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=headers).status_code == 409
    r = client.post(f"/v1/jobs/{job_id}/retry", headers=headers)
    assert (r.status_code, r.json()["state"], r.json()["error"]) == (202, "QUEUED", None)
    for path in ("/v1/jobs/0123456789abcdef", "/v1/jobs/nope/events", "/v1/jobs/nope/logs"):
        assert client.get(path, headers=headers).status_code == 404, path
    for path in ("/v1/jobs/nope/cancel", "/v1/jobs/nope/retry"):
        assert client.post(path, headers=headers).status_code == 404, path
    assert client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 3}, headers=headers).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/logs", headers=headers).text == ""  # never started
    assert client.delete(f"/v1/jobs/{job_id}", headers=headers).status_code == 405


#: a PII salt: the secret of a ``hash`` action (issue 37)
SALT = "pepper-0123456789-abcdef"


def _pii_spec(root: Path, salt: str = SALT, **extra) -> dict:
    return _spec(root, stages=[{"type": "normalize"}, {"type": "pii", "params": {
        "salt": salt, "actions": {"EMAIL_ADDRESS": "hash"}}}], **extra)


def test_a_secret_never_comes_back_from_the_api_and_the_store_keeps_its_value(api):
    """Issue 37: the PII salt is ``<redacted>`` in every response that shows a spec; the database keeps it; a spec
    that still holds the placeholder is refused at the field, and a refused salt is not echoed."""
    client, headers, root = api
    r = _submit(client, headers, _pii_spec(root))
    assert r.status_code == 201 and SALT not in r.text
    job_id = r.json()["id"]
    detail = client.get(f"/v1/jobs/{job_id}", headers=headers)
    assert detail.json()["spec"]["stages"][1]["params"]["salt"] == "<redacted>" and SALT not in detail.text
    assert detail.json()["spec"]["stages"][1]["params"]["actions"] == {"EMAIL_ADDRESS": "hash"}
    listed = client.get("/v1/jobs", headers=headers)
    assert [j["id"] for j in listed.json()["items"]] == [job_id] and SALT not in listed.text
    for route in ("cancel", "retry"):
        assert SALT not in client.post(f"/v1/jobs/{job_id}/{route}", headers=headers).text
    with client.app.state.db.read() as s:
        assert repo.get_job(s, job_id).spec["stages"][1]["params"]["salt"] == SALT  # what a run will use

    # a spec copied from a response: the placeholder is no salt (nothing is stored to stand for)
    r = _submit(client, headers, detail.json()["spec"])
    assert r.status_code == 422 and [p["loc"] for p in r.json()["detail"]] == [
        ["body", "stages", 1, "params", "salt"]] and "<redacted>" in r.json()["detail"][0]["msg"]
    short = "pepper-short"  # under 16 bytes: refused, and not echoed
    r = _submit(client, headers, _pii_spec(root, salt=short, out="o2"))
    assert r.status_code == 422 and short not in r.text
    assert r.json()["detail"][0]["loc"] == ["body", "stages", 1, "params", "salt"]


def _sse(text: str) -> list[dict]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if fields:
            out.append({"id": int(fields["id"]), "event": fields["event"], "data": json.loads(fields["data"])})
    return out


def test_events_stream_ends_at_a_terminal_state_and_resumes_after_last_event_id(api):
    client, headers, root = api
    job_id = _submit(client, headers, _spec(root)).json()["id"]
    with client.app.state.db.session() as s:  # what the supervisor would store while the job runs
        job, _ = repo.start_attempt(s, job_id, run_dir=lambda j, n: str(root / j / str(n)), host="h")
        repo.append_events(s, job, 1, [{"type": "phase", "ts": 1.0, "phase": "curate", "state": "started"}])
        repo.transition(s, job, JobState.FAILED, category="input", message="no document survived")
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse(r.read().decode())
    assert [(e["id"], e["event"]) for e in events] == [(1, "state"), (2, "state"), (3, "phase"), (4, "state")]
    assert events[-1]["data"] == {**events[-1]["data"], "state": "FAILED", "category": "input"}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers={**headers, "Last-Event-ID": "2"}) as r:
        assert [e["id"] for e in _sse(r.read().decode())] == [3, 4]
    with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"after": 3}, headers=headers) as r:
        assert [e["id"] for e in _sse(r.read().decode())] == [4]
    r = client.get(f"/v1/jobs/{job_id}/events", headers={**headers, "Last-Event-ID": "x"})  # an event id is a number
    assert (r.status_code, r.json()["detail"][0]["loc"]) == (422, ["header", "last-event-id"])
    detail = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert detail["error"] == {"category": "input", "message": "no document survived"}
    assert detail["attempts"][0]["number"] == 1


def test_readyz_reports_database_and_ray(api):
    client, _, _ = api
    body = client.get("/readyz").json()
    assert body["status"] == "ready" and body["checks"]["database"]["ok"] and body["checks"]["ray"]["ok"]
    assert body["leader"] == {"supervisor": False, "scheduler": False}  # API only: this replica leads neither


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_keys_are_cached_for_at_most_the_ttl_and_a_revocation_here_applies_at_once(api):
    client, headers, root = api
    clock = _Clock()
    client.app.state.key_cache = cache = KeyCache(ttl_s=10.0, clock=clock)
    db = client.app.state.db
    key_id = headers["Authorization"].split("_")[1]
    assert client.get("/v1/jobs", headers=headers).status_code == 200 and len(cache) == 1
    with db.read() as s:
        assert s.get(ApiKey, key_id).last_used_at is not None  # the read that filled the cache refreshed it
    wrong = {"Authorization": headers["Authorization"][:-1] + ("A" if headers["Authorization"][-1] != "A" else "B")}
    assert client.get("/v1/jobs", headers=wrong).status_code == 401  # a cached key still checks the secret
    # revoked by another process (a plain UPDATE: no ORM event reaches this process's cache)
    with db.session() as s:
        s.execute(update(ApiKey).where(ApiKey.id == key_id).values(revoked_at=utcnow()))
    clock.now += 9.9
    assert client.get("/v1/jobs", headers=headers).status_code == 200  # within the TTL: the cached row
    clock.now += 0.1
    assert client.get("/v1/jobs", headers=headers).status_code == 401 and len(cache) == 0
    # a new key works at once, and a revocation flushed in this process drops it from the cache at once
    with db.session() as s:
        other, token = repo.create_key(s, "other")
    mine = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/jobs", headers=mine).status_code == 200 and len(cache) == 1
    with db.session() as s:
        repo.revoke_key(s, other.id)
    assert len(cache) == 0 and client.get("/v1/jobs", headers=mine).status_code == 401


def test_key_reads_are_shared_refreshed_ahead_of_expiry_and_skipped_with_a_zero_ttl():
    new = auth.generate()
    key = ApiKey(id=new.id, name="k", secret_hash=new.secret_hash)
    reads = []
    clock = _Clock()

    def read(db, key_id, secret, started):  # stands in for the database read, in the thread pool as it is
        reads.append(started)
        time.sleep(0.05)
        return _Entry(key, key.secret_hash, started + cache.ttl_s / 2, started + cache.ttl_s)

    async def scenario() -> None:
        # 20 requests at once on a cold cache: one read, all wait for it
        assert [k.id for k in await asyncio.gather(*(cache.authenticate(None, new.token) for _ in range(20)))] \
            == [new.id] * 20 and len(reads) == 1
        assert await cache.authenticate(None, "tm_nothex_x") is None and len(reads) == 1  # malformed: no read
        clock.now += 6.0  # past half the entry's life: served at once, a read starts in the background
        assert (await cache.authenticate(None, new.token)).id == new.id
        assert list(cache._loading) == [new.id]  # returned while its read was still going
        await asyncio.sleep(0.2)
        assert len(reads) == 2 and reads[-1] == clock.now and not cache._loading
        clock.now += 6.0  # 12 s after the first read, 6 s after the second: still live, no read
        assert (await cache.authenticate(None, new.token)).id == new.id and len(reads) == 2

    cache = KeyCache(ttl_s=10.0, clock=clock)
    cache._read = read
    asyncio.run(scenario())
    reads.clear()
    cache = KeyCache(ttl_s=0)
    cache._read = read
    for _ in range(3):
        assert asyncio.run(cache.authenticate(None, new.token)).id == new.id
    assert len(reads) == 3 and len(cache) == 0


def test_serve_workers_get_the_same_settings_through_the_environment(tmp_path, monkeypatch):
    settings = Settings(state_dir=tmp_path / "state", input_roots=(tmp_path / "in",), output_roots=(tmp_path,),
                        max_running=3, auth_cache_s=2.5, freeze_gc=True, run_supervisor=False)
    monkeypatch.setenv(SETTINGS_ENV, settings.model_dump_json())
    assert app_from_env().state.settings == settings
    assert main_serve(["--workers", "0"]) == 2


# ---- the figures a job shows, folded from its events -----------------------------------------------------


def test_summary_folds_events_into_figures():
    events = [
        {"type": "job_started", "ts": 100.0, "job": "j", "spec_hash": "h", "output": "/o", "parallelism": 1,
         "resumed_phases": ["curate"]},
        {"type": "phase", "ts": 100.0, "phase": "curate", "state": "skipped", "seconds": 3.0},
        {"type": "phase", "ts": 101.0, "phase": "write", "state": "started"},
        {"type": "shard_written", "ts": 101.5, "name": "shards/shard-000000.tar", "sha256": "a", "samples": 8,
         "tokens": 900, "writer": "h:1", "reused": True},
        {"type": "shard_written", "ts": 103.0, "name": "shards/shard-000001.tar", "sha256": "b", "samples": 8,
         "tokens": 1000, "writer": "h:1", "reused": False},
        {"type": "progress", "ts": 103.0, "phase": "write", "done": 50, "total": 100, "unit": "docs"},
        {"type": "stage_counters", "ts": 103.0, "stages": {"01-normalize": {"docs_in": 10, "docs_out": 9,
                                                                          "dropped": {"normalize:empty": 1}}}},
    ]
    s: dict = {}
    for e in events:
        s = fold(s, e)
    assert s["resumed_phases"] == ["curate"] and s["phase"] == "write"
    assert s["shards"] == {"written": 1, "reused": 1, "total": None} and s["tokens"] == 1900
    assert s["throughput"]["tokens_per_s"] == 500.0  # new tokens over the write phase's time so far
    assert s["progress"]["write"] == {"done": 50, "total": 100, "unit": "docs", "per_s": 25.0}
    assert s["stages"]["01-normalize"]["dropped"] == {"normalize:empty": 1}
    s = fold(s, {"type": "job_finished", "ts": 104.0, "output": "/o", "shards": 2, "samples": 16, "tokens": 1900,
                 "documents": 9, "seconds": 4.0})
    s = with_stats(s, {"stages": [{"stage": "90-tokenize", "docs_in": 9, "docs_out": 9, "dropped": {}}],
                       "throughput": {"docs_per_s": 2.2, "tokens_per_s": 633.3}, "seconds": {"total": 4.0},
                       "output": {"shards": 2, "samples": 16, "tokens": 1900}})
    assert s["shards"]["total"] == 2 and s["documents"] == 9 and s["throughput"]["docs_per_s"] == 2.2
    assert list(s["stages"]) == ["90-tokenize"]
    assert fold(s, {"type": "job_started", "ts": 200.0, "job": "j", "spec_hash": "h", "output": "/o",
                    "parallelism": 1})["shards"] == {"written": 0, "reused": 0, "total": None}  # a new attempt


# ---- the supervisor, with a stand-in job process ----------------------------------------------------------

FAKE_JOB = r'''
import os, signal, sys, time
from pathlib import Path
from service.runner.report import Reporter, database_from_env
arg = lambda name: sys.argv[sys.argv.index(name) + 1]
run_dir = arg("--run-dir")
rep = Reporter(database_from_env(), arg("--job"), int(arg("--attempt")), Path(run_dir))
run = rep.run()
def emit(kind, **kw):
    rep.events.report({"type": kind, "ts": time.time(), **kw})
behaviour, attempt = run["spec"]["name"], run["attempt"]
def on_term(*_):
    emit("job_failed", category="cancelled", message="cancelled during write", phase="write"); sys.exit(130)
signal.signal(signal.SIGTERM, on_term if behaviour != "stubborn" else signal.SIG_IGN)
emit("job_started", job=behaviour, spec_hash="h", output="/o", parallelism=1, resumed_phases=[])
emit("phase", phase="write", state="started")
print("fake job", behaviour, "attempt", attempt, flush=True)
if behaviour in ("slow", "stubborn"):
    rep.events.flush(10)
    open(os.path.join(run_dir, "ready"), "w").close()
    time.sleep(60)
if behaviour == "crash" and attempt == 1:
    # stand-ins for a local Ray node, which outlives its driver: one in the job's group, one in a group of its
    # own (as Ray's workers are), and one that left the session (a cluster the job joined: not the job's to kill)
    import subprocess
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    kids = [subprocess.Popen(sleep), subprocess.Popen(sleep, process_group=0),
            subprocess.Popen(sleep, start_new_session=True)]
    open(os.path.join(run_dir, "children"), "w").write(" ".join(str(k.pid) for k in kids))
if behaviour == "crash" and attempt == 1 or behaviour == "always_crash":
    rep.events.flush(10)
    os.kill(os.getpid(), signal.SIGKILL)
if behaviour == "bad_input":
    emit("job_failed", category="input", message="no file matches", phase=None); sys.exit(2)
emit("shard_written", name="shards/shard-000000.tar", sha256="x", samples=8, tokens=100, writer="h:1",
     reused=attempt > 1)
emit("job_finished", output="/o", shards=1, samples=8, tokens=100, documents=5, seconds=0.1)
'''


@pytest.fixture
def supervised(tmp_path):
    """``(db, make_supervisor, submit)`` on SQLite, the job command being the stand-in script."""
    script = tmp_path / "fake_job.py"
    script.write_text(FAKE_JOB)
    db = Database(f"sqlite:///{tmp_path / 'sup.db'}")
    db.migrate()
    made: list[Supervisor] = []

    def make(**over) -> Supervisor:
        cfg = RunnerConfig(state_dir=tmp_path / "state", job_command=(sys.executable, str(script)), poll_s=0.05,
                           roots=Roots.of([tmp_path], [tmp_path]), **over)
        sup = Supervisor(db, cfg)
        made.append(sup)
        return sup

    def submit(behaviour: str, out: str | None = None) -> str:
        with db.session() as s:
            job, _ = repo.create_job(s, {"name": behaviour, "output": {"path": "/o"}}, name=behaviour,
                                     spec_hash="h" * 64, output_path=out or f"/o/{secrets.token_hex(4)}")
            return job.id

    yield db, make, submit
    for sup in made:
        sup.stop()
    for pid in _fake_pids(tmp_path):
        os.kill(pid, signal.SIGKILL)
    db.dispose()


def _fake_pids(tmp_path: Path) -> list[int]:
    import psutil

    script = str(tmp_path / "fake_job.py")
    return [p.pid for p in psutil.process_iter(["cmdline"]) if script in (p.info["cmdline"] or [])]


def _wait(pred, timeout: float = 20.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or pred}")


def _state(db: Database, job_id: str) -> str:
    with db.session() as s:
        return repo.get_job(s, job_id).state


def _attempts(db: Database, job_id: str) -> list[tuple[int, str | None, int | None]]:
    with db.session() as s:
        return [(a.number, a.outcome, a.exit_code) for a in repo.attempts_of(s, job_id)]


def test_the_queue_runs_in_order_within_the_limit(supervised):
    db, make, submit = supervised
    ids = [submit("ok") for _ in range(4)]
    peak = 0

    def done() -> bool:
        nonlocal peak
        with db.session() as s:
            peak = max(peak, len(repo.active_jobs(s)))
        return all(_state(db, j) == "SUCCEEDED" for j in ids)

    make(max_running=1).start()
    _wait(done, what="all jobs to succeed")
    assert peak == 1
    with db.session() as s:
        jobs = [repo.get_job(s, j) for j in ids]
        assert [j.started_at for j in jobs] == sorted(j.started_at for j in jobs)
        summary = jobs[0].summary
    assert summary["shards"] == {"written": 1, "reused": 0, "total": 1} and summary["documents"] == 5
    assert _attempts(db, ids[0]) == [(1, "succeeded", 0)]


def test_a_job_waits_while_another_holds_its_output(supervised, tmp_path):
    db, make, submit = supervised
    holder, same_output, other = submit("slow", out="/o/shared"), submit("ok", out="/o/shared"), submit("ok")
    make(max_running=3).start()
    _wait(lambda: _state(db, other) == "SUCCEEDED", what="the job with its own output")
    assert (_state(db, holder), _state(db, same_output)) == ("RUNNING", "QUEUED")
    with db.session() as s:
        repo.cancel_job(s, holder)
    _wait(lambda: _state(db, same_output) == "SUCCEEDED", what="the waiting job")
    assert _state(db, holder) == "CANCELLED"


def test_a_job_whose_process_dies_resumes_as_a_new_attempt_then_fails_after_max_lost(supervised, tmp_path):
    db, make, submit = supervised
    crash, doomed, bad = submit("crash"), submit("always_crash"), submit("bad_input")
    make(max_running=2, max_lost=2).start()
    _wait(lambda: all(_state(db, j) in ("SUCCEEDED", "FAILED") for j in (crash, doomed, bad)), what="outcomes")
    assert _state(db, crash) == "SUCCEEDED"
    assert _attempts(db, crash) == [(1, "lost", -signal.SIGKILL), (2, "succeeded", 0)]
    # what the lost job process started in its session was killed when the supervisor noticed; not the one outside
    with db.session() as s:
        lost_pid = repo.attempts_of(s, crash)[0].pid
    same_group, own_group, outside = map(int, (tmp_path / "state" / "jobs" / crash / "attempt-1" / "children")
                                         .read_text().split())
    try:
        _wait(lambda: not process.session_members(lost_pid), timeout=10, what="the lost attempt's session to end")
        assert process.session_of(same_group) is None and process.session_of(own_group) is None  # gone or zombies
        assert process.session_of(outside) == outside
    finally:
        os.kill(outside, signal.SIGKILL)
    with db.session() as s:
        job = repo.get_job(s, crash)
        assert job.summary["shards"]["reused"] == 1  # the second attempt kept the first one's shard
        states = [e.data["state"] for e in repo.events_after(s, crash) if e.type == "state"]
        assert states == ["QUEUED", "RUNNING", "QUEUED", "RUNNING", "SUCCEEDED"]
        failed = repo.get_job(s, doomed)
        assert (failed.state, failed.failure_category, failed.attempt) == ("FAILED", "infra", 2)
        assert "2 times in a row" in failed.error_message
        bad_job = repo.get_job(s, bad)
        assert (bad_job.failure_category, bad_job.error_message) == ("input", "no file matches")
    assert _attempts(db, bad) == [(1, "failed", 2)]


def test_cancel_sends_sigterm_and_a_stubborn_process_gets_sigkill(supervised, tmp_path):
    db, make, submit = supervised
    slow, stubborn = submit("slow"), submit("stubborn")
    make(max_running=2, cancel_grace_s=3).start()  # time to report the cancel to a busy SQLite
    runs = tmp_path / "state" / "jobs"
    _wait(lambda: all((runs / j / "attempt-1" / "ready").exists() for j in (slow, stubborn)), what="jobs to run")
    for job_id in (slow, stubborn):
        with db.session() as s:
            assert repo.cancel_job(s, job_id).state == "CANCELLING"
    _wait(lambda: all(_state(db, j) == "CANCELLED" for j in (slow, stubborn)), what="cancels")
    assert _attempts(db, slow) == [(1, "cancelled", 130)]
    assert _attempts(db, stubborn) == [(1, "lost", -signal.SIGKILL)]  # died without reporting: still CANCELLED


def test_a_restarted_supervisor_reattaches_to_a_live_job_process(supervised, tmp_path):
    db, make, submit = supervised
    job_id = submit("slow")
    first = make()
    first.start()
    _wait(lambda: (tmp_path / "state" / "jobs" / job_id / "attempt-1" / "ready").exists(), what="the job")
    first.stop()  # the service goes away; its job process does not
    with db.session() as s:
        pid = repo.current_attempt(s, repo.get_job(s, job_id)).pid
    assert process.is_alive(pid, process.start_time(pid), str(tmp_path / "state" / "jobs" / job_id / "attempt-1"))
    second = make()
    second.start()
    _wait(lambda: any(e.type == "log" for e in _events(db, job_id)), what="the re-attach note")
    assert _state(db, job_id) == "RUNNING" and _attempts(db, job_id) == [(1, None, None)]  # not started twice
    with db.session() as s:
        repo.cancel_job(s, job_id)
    _wait(lambda: _state(db, job_id) == "CANCELLED", what="the cancel")
    notes = [e.data["message"] for e in _events(db, job_id) if e.type == "log"]
    assert notes == [f"re-attached to the job process (pid {pid}) of attempt 1"]
    assert _attempts(db, job_id) == [(1, "cancelled", None)]  # not its parent: the outcome came from its events


def test_the_run_folder_holds_no_secret_and_the_job_process_reads_it_from_the_database(supervised, tmp_path,
                                                                                      monkeypatch):
    """Issue 37, then 41: the job process reads its run, secrets included, from its attempt's row (the database
    holds the spec anyway); nothing in its folder, its log or its events holds a secret; a retry's run gets the
    stored value again."""
    from service.runner import job_process

    db, make, _ = supervised
    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.jsonl").write_text('{"id": "a", "text": "mail me at a@example.com"}\n')
    spec = _pii_spec(root, name="bad_input")  # the stand-in job's behaviour: fails, to be retried
    with db.session() as s:
        job_id = repo.create_job(s, spec, name="bad_input", spec_hash="h" * 64, output_path=str(root / "out"))[0].id
    sup = make()
    sup.start()
    _wait(lambda: _state(db, job_id) == "FAILED", what="the first attempt")
    with db.session() as s:
        repo.retry_job(s, job_id)
    _wait(lambda: _state(db, job_id) == "FAILED" and len(_attempts(db, job_id)) == 2, what="the retry")
    sup.stop()

    class Engine:  # the engine where Ray would start: keeps the spec the job process hands it
        seen: list[JobSpec] = []

        def __init__(self, spec, on_event, log_path, **_):
            Engine.seen.append(spec)

        def cancel(self) -> None:
            pass

        def run(self) -> None:
            print("engine ran", flush=True)

    monkeypatch.setattr(job_process, "Job", Engine)
    for number in (1, 2):
        run_dir = tmp_path / "state" / "jobs" / job_id / f"attempt-{number}"
        assert job_process.run_attempt(Reporter(db, job_id, number, run_dir)) == 0
        assert Engine.seen[-1].stage_params(1).salt == SALT  # type: ignore[attr-defined]
        for path in run_dir.iterdir():
            assert SALT not in path.read_text(errors="replace"), path.name
    with db.read() as s:
        assert SALT not in json.dumps([e.data for e in repo.events_after(s, job_id)])
        assert SALT not in json.dumps([dict(r.data) for r in s.scalars(select(AttemptEvent))])
        assert SALT not in log_tail(s, job_id, 2, "job", 1 << 20).decode()


def _events(db: Database, job_id: str):
    with db.session() as s:
        return list(repo.events_after(s, job_id))


def test_processes_are_known_by_pid_start_time_and_run_folder(tmp_path):
    run_dir = str(tmp_path / "jobs" / "x" / "attempt-1")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--run-dir", run_dir])
    try:
        deadline = time.monotonic() + 20  # until the child has exec'd: before, its command line is pytest's
        while run_dir not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        started = process.start_time(proc.pid)
        assert process.is_alive(proc.pid, started, run_dir)
        assert not process.is_alive(proc.pid, started - 5, run_dir)  # the pid was reused by another process
        assert not process.is_alive(proc.pid, started, run_dir + "-other")
        assert process.find(run_dir) == process.ProcessRef(proc.pid, started)
        assert process.find(run_dir + "-other") is None
    finally:
        proc.kill()
        proc.wait()
    assert not process.is_alive(proc.pid, started, run_dir)


def test_the_job_process_checks_the_spec_again_and_always_reports_its_end(tmp_path, monkeypatch):
    """The real job process's entry point, with the engine stubbed out where Ray would start."""
    from service.runner import job_process

    root, outside = tmp_path / "data", tmp_path / "outside.jsonl"
    (root / "in").mkdir(parents=True)
    outside.write_text('{"text": "secret"}\n')
    spec = {"name": "j", "inputs": [{"path": str(root / "in" / "a.jsonl")}], "output": {"path": str(root / "out")}}
    roots = Roots.of([root], [root]).to_json()
    runs = iter(range(100))

    db = Database(f"sqlite:///{tmp_path / 'jobs.db'}")
    db.migrate()

    def attempt(spec: dict) -> tuple[int, dict]:
        run_dir = tmp_path / f"run-{next(runs)}"
        with db.session() as s:
            job, _ = repo.create_job(s, spec, name="j", spec_hash="h" * 64, output_path=str(run_dir))
            job, att = repo.start_attempt(s, job.id, run_dir=lambda j, n: str(run_dir), host="h")
            att.run = {"job_id": job.id, "attempt": 1, "spec": spec, "roots": roots}
        rc = job_process.run_attempt(Reporter(db, job.id, 1, run_dir))
        with db.read() as s:
            last = s.scalars(select(AttemptEvent).where(AttemptEvent.job_id == job.id)
                             .order_by(AttemptEvent.seq.desc()).limit(1)).one()
        return rc, dict(last.data)

    (root / "in" / "a.jsonl").symlink_to(outside)  # swapped in after the API accepted the spec
    rc, last = attempt(spec)
    assert (rc, last["type"], last["category"]) == (2, "job_failed", "validation") and "outside" in last["message"]
    (root / "in" / "a.jsonl").unlink()
    rc, last = attempt(spec)  # the input is gone
    assert (rc, last["category"]) == (2, "input") and last["message"].startswith("inputs.0.path:")
    (root / "in" / "a.jsonl").write_text('{"text": "hello"}\n')

    class Engine:  # what pipeline.job.engine.Job does at these points, without Ray
        raises: BaseException = SystemExit(signal.SIGTERM)

        def __init__(self, spec, on_event, log_path, **_):
            self.phase = None

        def cancel(self) -> None:
            pass

        def run(self):
            raise Engine.raises

    monkeypatch.setattr(job_process, "Job", Engine)
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL alone; an earlier test's ray.init may have left its own
    rc, last = attempt(spec)  # SIGTERM while ray.init had its own handler in place
    assert (rc, last["category"]) == (130, "cancelled")
    Engine.raises = RuntimeError("boom")
    rc, last = attempt(spec)
    assert (rc, last["category"], last["message"]) == (1, "app", "RuntimeError: boom")
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back
