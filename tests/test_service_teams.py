"""Principals, teams and roles (issue 37): every key an admin, member or reader of a team.

- Through the app (TestClient, SQLite and PostgreSQL): another team's job, schedule or mixture answers exactly
  as an unknown id (404, same body) on every route and is left out of lists; a role that may not do something
  gets 403 naming the role; admins see every team (and narrow with ``team=``); the audit holds every mutating
  request and every refusal, and a read writes nothing to it.
- The store: a database at revision 0004 with a key and a job upgrades to 0005 with the key an admin of the
  default team and the job the default team's.
- ``tokenmill apikey create --role --team`` and ``apikey list``.
- The two-team test over real HTTP (uvicorn on 127.0.0.1, no Ray): see :func:`test_two_teams_over_http`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from pipeline.output.layout import OutputError
from pipeline.output.local_store import OutputDir
from service import ownership
from service.api.app import create_app
from service.commands.apikey import main as main_apikey
from service.commands.audit import main as main_audit
from service.runner.job_process import AdmissionError
from service.runner.job_process import admit as job_admit
from service.settings import Settings, team_roots
from service.store import repo
from service.store.db import Database
from service.store.models import JobState
from tests.test_service_api import api  # noqa: F401 - a fixture
from tests.test_service_artifacts import _client, finished_job, publish_output, serve
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def teams(api):  # noqa: F811 - the fixture imported above
    """``(client, keys, root)``: the API tests' app (SQLite, PostgreSQL); ``keys[name]`` the headers of ``admin``
    (team a), ``a`` (member of a), ``b`` (member of b), ``reader`` (reader of b)."""
    client, _, root = api
    keys = {}
    with client.app.state.db.session() as s:
        for name, role, team in (("admin", "admin", "a"), ("a", "member", "a"), ("b", "member", "b"),
                                 ("reader", "reader", "b")):
            _, token = repo.create_key(s, name, role=role, team=team)
            keys[name] = {"Authorization": f"Bearer {token}"}
    return client, keys, root


def _inputs(root: Path) -> Path:
    """``root`` with the one input file the specs here read."""
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    return root


def _spec(root: Path, name: str, out: str, **extra) -> dict:
    return {"name": name, "inputs": [{"path": str(root / "in" / "*.jsonl")}], "output": {"path": str(root / out)},
            **extra}


def _schedule(root: Path, out: str) -> dict:
    return {"cron": "0 3 * * *", "paused": True,
            "spec": _spec(root, "nightly", out, stages=[{"type": "exact_dedup"}])}


def test_another_teams_work_is_an_unknown_id_and_a_role_gets_403_naming_it(teams):
    client, keys, root = teams
    job_a = client.post("/v1/jobs", json=_spec(root, "a-job", "out-a"), headers=keys["a"])
    job_b = client.post("/v1/jobs", json=_spec(root, "b-job", "out-b"), headers=keys["b"])
    assert (job_a.status_code, job_b.status_code) == (201, 201), (job_a.text, job_b.text)
    assert (job_a.json()["team"], job_b.json()["team"]) == ("a", "b")
    a, b = job_a.json()["id"], job_b.json()["id"]
    unknown = "0" * 16
    sched_a = client.post("/v1/schedules", json=_schedule(root, "sched-a"), headers=keys["a"])
    assert sched_a.status_code == 201, sched_a.text
    sa = sched_a.json()["id"]

    # B's member: A's job and schedule answer exactly as unknown ids, on every route
    for method, path, body in [("GET", "/v1/jobs/{}", None), ("POST", "/v1/jobs/{}/cancel", None),
                               ("POST", "/v1/jobs/{}/retry", None), ("GET", "/v1/jobs/{}/logs", None),
                               ("GET", "/v1/jobs/{}/events", None), ("GET", "/v1/jobs/{}/artifacts", None),
                               ("GET", "/v1/jobs/{}/artifacts/manifest.json", None)]:
        theirs = client.request(method, path.format(a), headers=keys["b"], json=body)
        none = client.request(method, path.format(unknown), headers=keys["b"], json=body)
        assert theirs.status_code == none.status_code == 404, (method, path, theirs.text)
        assert theirs.json() == {"detail": none.json()["detail"].replace(unknown, a)}, (method, path)
    for method, path, body in [("GET", "/v1/schedules/{}", None), ("PATCH", "/v1/schedules/{}", {"name": "x"}),
                               ("DELETE", "/v1/schedules/{}", None), ("POST", "/v1/schedules/{}/pause", None),
                               ("POST", "/v1/schedules/{}/resume", None), ("GET", "/v1/schedules/{}/runs", None),
                               ("GET", "/v1/schedules/{}/versions", None),
                               ("GET", "/v1/schedules/{}/versions/latest/artifacts", None)]:
        theirs = client.request(method, path.format(sa), headers=keys["b"], json=body)
        none = client.request(method, path.format(unknown), headers=keys["b"], json=body)
        assert theirs.status_code == none.status_code == 404, (method, path, theirs.text)
        assert theirs.json() == {"detail": none.json()["detail"].replace(unknown, sa)}, (method, path)
    assert client.get(f"/v1/jobs/{a}", headers=keys["a"]).json()["state"] == "QUEUED"  # nothing happened to it
    assert client.get(f"/v1/schedules/{sa}", headers=keys["a"]).json()["name"] == "nightly"
    nested = client.post("/v1/schedules", json=_schedule(root, "sched-a/inner"), headers=keys["b"])
    assert nested.status_code == 409 and "another team's schedule publishes" in nested.text and sa not in nested.text

    # lists: each team its own; the admin every team's, narrowed with team=; a member may not name another team
    def ids(path: str, who: str, **params) -> set[str]:
        r = client.get(path, headers=keys[who], params=params)
        assert r.status_code == 200, r.text
        return {item["id"] for item in r.json()["items"]}

    assert ids("/v1/jobs", "b") == ids("/v1/jobs", "reader") == {b}
    assert ids("/v1/jobs", "a") == {a} and ids("/v1/jobs", "admin") == {a, b}
    assert ids("/v1/jobs", "admin", team="b") == {b} and ids("/v1/jobs", "b", team="b") == {b}
    assert ids("/v1/schedules", "b") == set() and ids("/v1/schedules", "admin") == {sa}
    r = client.get("/v1/jobs", headers=keys["b"], params={"team": "a"})
    assert r.status_code == 403 and r.json()["detail"] == "role member may not list another team's work"
    # the admin acts on any team's
    assert client.get(f"/v1/jobs/{b}", headers=keys["admin"]).status_code == 200
    assert client.post(f"/v1/schedules/{sa}/pause", headers=keys["admin"]).status_code == 200

    # B's reader reads B's work, changes nothing: 403 naming the role, whatever the id
    assert client.get(f"/v1/jobs/{b}", headers=keys["reader"]).json()["state"] == "QUEUED"
    for method, path, body, action in [
            ("POST", "/v1/jobs", _spec(root, "r", "out-r"), "submit jobs"),
            ("POST", f"/v1/jobs/{b}/cancel", None, "cancel jobs"), ("POST", f"/v1/jobs/{a}/retry", None, "retry jobs"),
            ("POST", "/v1/schedules", _schedule(root, "sched-r"), "create schedules"),
            ("PATCH", f"/v1/schedules/{sa}", {"name": "x"}, "change schedules"),
            ("DELETE", f"/v1/schedules/{unknown}", None, "delete schedules"),
            ("POST", "/v1/mixtures", {"name": "m", "sources": [{"name": "s", "job": b}]}, "create mixtures"),
            ("GET", "/v1/audit", None, "read the audit")]:
        r = client.request(method, path, headers=keys["reader"], json=body)
        assert r.status_code == 403 and r.json() == {"detail": f"role reader may not {action}"}, (path, r.text)
    assert client.get("/v1/audit", headers=keys["b"]).json() == {"detail": "role member may not read the audit"}
    assert client.post(f"/v1/jobs/{b}/cancel", headers=keys["b"]).json()["state"] == "CANCELLED"

    # the audit: every mutating request and every refusal, each with who, what and how it ended
    entries = client.get("/v1/audit", headers=keys["admin"], params={"limit": 500}).json()["items"]
    by = {(e["key_name"], e["action"], e["target"]): e for e in entries}
    hidden = by[("b", "POST /v1/jobs/{job_id}/cancel", f"/v1/jobs/{a}/cancel")]
    assert (hidden["status"], hidden["outcome"], hidden["team"], hidden["role"]) == (404, "refused", "b", "member")
    assert by[("b", "GET /v1/jobs/{job_id}", f"/v1/jobs/{a}")]["status"] == 404  # a read hidden from B: audited
    assert ("b", "GET /v1/jobs/{job_id}", f"/v1/jobs/{unknown}") not in by  # an unknown id read: not a refusal
    denied = by[("reader", "POST /v1/jobs", "/v1/jobs")]
    assert (denied["status"], denied["detail"]) == (403, "role reader may not submit jobs")
    created = by[("a", "POST /v1/jobs", f"/v1/jobs/{a}")]  # a creation: its target is what it made
    assert (created["status"], created["outcome"]) == (201, "ok")
    assert by[("b", "POST /v1/jobs/{job_id}/cancel", f"/v1/jobs/{b}/cancel")]["outcome"] == "ok"
    assert by[("reader", "GET /v1/audit", "/v1/audit")]["status"] == 403
    assert not any(e["action"] == "GET /v1/jobs/{job_id}" and e["status"] == 200 for e in entries)  # reads: none
    refused = client.get("/v1/audit", headers=keys["admin"], params={"outcome": "refused", "team": "b"}).json()
    assert refused["items"] and all(e["outcome"] == "refused" and e["team"] == "b" for e in refused["items"])
    page = client.get("/v1/audit", headers=keys["admin"], params={"limit": 2}).json()
    older = client.get("/v1/audit", headers=keys["admin"], params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [e["id"] for e in page["items"]] > [e["id"] for e in older["items"]]


def test_an_unknown_key_is_audited_and_a_read_writes_nothing(teams):
    client, keys, root = teams
    job = client.post("/v1/jobs", json=_spec(root, "a-job", "out-a"), headers=keys["a"]).json()["id"]
    db = client.app.state.db

    def count() -> int:
        with db.read() as s:
            return len(repo.list_audit(s, limit=1000))

    before = count()
    for _ in range(5):
        assert client.get(f"/v1/jobs/{job}", headers=keys["a"]).status_code == 200
        assert client.get("/v1/jobs", headers=keys["reader"]).status_code == 200
    assert count() == before  # reads that succeed write no audit row
    stranger = "tm_0123456789ab_" + "x" * 43
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {stranger}"}).status_code == 401
    assert count() == before + 1
    entry = client.get("/v1/audit", headers=keys["admin"], params={"limit": 1}).json()["items"][0]
    assert (entry["key_id"], entry["key_name"], entry["status"], entry["outcome"]) == ("0123456789ab", None, 401,
                                                                                        "refused")


def test_mixtures_see_their_own_teams_sources_only(teams):
    client, keys, root = teams
    db = client.app.state.db
    publish_output(root / "mix" / "a", n=16, seed=1)
    publish_output(root / "mix" / "b", n=16, seed=2)
    job_a = finished_job(db, root / "mix" / "a", team="a")
    job_b = finished_job(db, root / "mix" / "b", team="b")
    spec = {"name": "blend", "seed": 1, "sources": [{"name": "a", "job": job_a, "weight": 1}]}
    r = client.post("/v1/mixtures", json=spec, headers=keys["b"])  # A's job as a source: as an unknown one
    unknown = "0" * 16
    none = client.post("/v1/mixtures", json={**spec, "sources": [{**spec["sources"][0], "job": unknown}]},
                       headers=keys["b"])
    assert r.status_code == none.status_code >= 400 and f"a: no job {job_a!r}" in r.text, r.text
    assert r.json() == json.loads(none.text.replace(unknown, job_a))
    spec["sources"] = [{"name": "b", "job": job_b, "weight": 1}]
    made = client.post("/v1/mixtures", json=spec, headers=keys["b"])
    assert made.status_code == 201 and made.json()["team"] == "b", made.text
    mid = made.json()["id"]
    assert client.get(f"/v1/mixtures/{mid}", headers=keys["reader"]).status_code == 200
    for path in (f"/v1/mixtures/{mid}", f"/v1/mixtures/{mid}/artifacts", f"/v1/mixtures/{mid}/artifacts/mixture.json"):
        r = client.get(path, headers=keys["a"])
        assert r.status_code == 404 and r.json() == {"detail": f"no mixture {mid!r}"}, path
    assert client.get("/v1/mixtures", headers=keys["a"]).json()["items"] == []
    assert [m["id"] for m in client.get("/v1/mixtures", headers=keys["admin"]).json()["items"]] == [mid]
    # the reader streams B's shards, not A's
    assert client.get(f"/v1/jobs/{job_b}/artifacts/manifest.json", headers=keys["reader"]).status_code == 200
    assert client.get(f"/v1/jobs/{job_a}/artifacts/manifest.json", headers=keys["reader"]).status_code == 404


def test_a_database_at_0004_upgrades_with_its_keys_admins_of_the_default_team(tmp_path, request):
    for url, schema in (("sqlite:///" + str(tmp_path / "old.db"), None),
                        (request.getfixturevalue("postgres_url"), f"tm_test_{secrets.token_hex(6)}")):
        db = Database(url, schema=schema)
        try:
            db.migrate("0004")
            with db.engine.begin() as conn:
                conn.execute(text("INSERT INTO api_keys (id, name, secret_hash, created_at) "
                                  "VALUES ('0123456789ab', 'old', :h, CURRENT_TIMESTAMP)"), {"h": "0" * 64})
                conn.execute(text(
                    "INSERT INTO jobs (id, name, state, spec, spec_hash, output_path, request_hash, attempt, "
                    "cancel_requested, summary, event_seq, created_at, updated_at, queued_at) VALUES ('j1', 'old', "
                    "'SUCCEEDED', '{}', 'h', '/out', 'r', 1, false, '{}', 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"))
            db.migrate()
            with db.read() as s:
                key = repo.find_key(s, "0123456789ab")
                assert key is not None and (key.role, key.team) == ("admin", "default")
                assert repo.get_job(s, "j1", "default").state == JobState.SUCCEEDED
                with pytest.raises(repo.NotFound):
                    repo.get_job(s, "j1", "other")
            with db.session() as s:  # a key made now names its role: the column has no default any more
                new, _ = repo.create_key(s, "new")
                assert (new.role, new.team) == ("member", "default")
        finally:
            db.drop_schema()
            db.dispose()


def test_apikey_create_with_a_role_and_a_team_and_list_shows_them(tmp_path, capsys):
    state = ["--state-dir", str(tmp_path / "svc")]
    assert main_apikey(["create", "--name", "loader", "--role", "reader", "--team", "vision", *state]) == 0
    token = capsys.readouterr().out.strip()
    assert main_apikey(["create", "--name", "dev", *state]) == 0
    assert main_apikey(["list", *state]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("reader" in line and "vision" in line and line.endswith("loader") for line in lines), lines
    assert any("member" in line and "default" in line and line.endswith("dev") for line in lines), lines
    assert main_apikey(["create", "--name", "x", "--team", "Bad Team", *state]) == 2
    assert "--team: team 'Bad Team'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main_apikey(["create", "--name", "x", "--role", "owner", *state])
    db = Database(f"sqlite:///{tmp_path / 'svc' / 'tokenmill.db'}")
    with db.read() as s:
        key = repo.find_key(s, token.split("_")[1])
    assert key is not None and (key.role, key.team) == ("reader", "vision")


def test_a_folder_records_the_team_whose_job_first_wrote_it_and_refuses_another(tmp_path):
    out = OutputDir(str(tmp_path / "out"))
    with out.lock():
        out.claim(False, owner="a")
    assert out.read_marker()["owner"] == "a"
    with out.lock():
        out.claim(True, owner="a")  # its own team: again, overwriting
        with pytest.raises(OutputError, match="belongs to another team"):
            out.claim(True, owner="b")
        out.claim(True)  # no team asked (tokenmill run): as before
    assert ownership.owner_of(str(tmp_path / "out" / "shards" / "x.tar")) == (str(tmp_path / "out"), "a")
    legacy = OutputDir(str(tmp_path / "old"))
    with legacy.lock():
        legacy.claim(False)
    assert "owner" not in legacy.read_marker()
    assert ownership.owner_of(str(tmp_path / "old")) == (str(tmp_path / "old"), "default")  # before teams


def _owned_output(folder: Path, team: str, seed: int) -> None:
    """A published output whose marker names ``team``, as its job's claim and commit leave it."""
    publish_output(folder, n=16, seed=seed)
    marker = folder / ".tokenmill" / "marker.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "owner": team}))


def test_two_teams_over_http(tmp_path, capsys):
    """Team B's member cannot see, cancel, retry, overwrite or dedup against team A's work (404 / 403); B's reader
    reads B's artifacts and shards but cannot submit; A's admin sees both teams; the audit lists each refusal."""
    root = _inputs(tmp_path / "data")
    settings = Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                        input_roots=(root,), output_roots=(root,), run_supervisor=False)
    app = create_app(settings)
    with serve(app) as url:
        db = app.state.db
        tokens = {}
        with db.session() as s:
            for name, role, team in (("admin-a", "admin", "a"), ("member-a", "member", "a"),
                                     ("member-b", "member", "b"), ("reader-b", "reader", "b")):
                tokens[name] = repo.create_key(s, name, role=role, team=team)[1]
        clients = {name: _client(url, token) for name, token in tokens.items()}
        a, b, admin, reader = (clients[n] for n in ("member-a", "member-b", "admin-a", "reader-b"))
        _owned_output(root / "a-out", "a", seed=1)
        done_a = finished_job(db, root / "a-out", team="a")
        failed_a = finished_job(db, root / "a-failed", state=JobState.FAILED, category="app", message="x", team="a")
        _owned_output(root / "b-out", "b", seed=2)
        done_b = finished_job(db, root / "b-out", team="b")
        queued_a = a.post("/v1/jobs", json=_spec(root, "a-next", "a-next"))
        assert queued_a.status_code == 201, queued_a.text
        queued_a = queued_a.json()["id"]

        # B's member: A's jobs are unknown ids, and A's folders are not B's to write or read
        assert b.get(f"/v1/jobs/{done_a}").json() == {"detail": f"no job {done_a!r}"}
        assert done_a not in {j["id"] for j in b.get("/v1/jobs").json()["items"]}
        assert b.post(f"/v1/jobs/{queued_a}/cancel").status_code == 404
        assert b.post(f"/v1/jobs/{failed_a}/retry").status_code == 404
        assert b.get(f"/v1/jobs/{done_a}/artifacts/manifest.json").status_code == 404
        overwrite = b.post("/v1/jobs", json=_spec(root, "b-over", "a-out", output={
            "path": str(root / "a-out"), "overwrite": True}))
        assert overwrite.status_code == 403, overwrite.text
        [problem] = overwrite.json()["detail"]
        assert problem["loc"] == ["body", "output", "path"] and "belongs to another team" in problem["msg"]
        dedup = b.post("/v1/jobs", json=_spec(root, "b-dedup", "b-dedup", stages=[
            {"type": "exact_dedup", "params": {"dedup_against": str(root / "a-out")}}]))
        assert dedup.status_code == 403, dedup.text
        assert dedup.json()["detail"][0]["loc"] == ["body", "stages", 0, "params", "dedup_against"]
        join = b.post("/v1/jobs", json=_spec(root, "b-join", "a-next"))  # A's job queued on it: not joinable
        assert join.status_code == 403 and "belongs to another team" in join.json()["detail"][0]["msg"], join.text
        assert a.get(f"/v1/jobs/{queued_a}").json()["state"] == "QUEUED"  # nothing B did touched A's work

        # B's reader: B's artifacts and shards, no submission
        listing = reader.get(f"/v1/jobs/{done_b}/artifacts")
        assert listing.status_code == 200, listing.text
        shard = next(f for f in listing.json()["files"] if f["name"].startswith("shards/"))
        body = reader.get(f"/v1/jobs/{done_b}/artifacts/{shard['name']}")
        assert body.status_code == 200 and hashlib.sha256(body.content).hexdigest() == shard["sha256"]
        denied = reader.post("/v1/jobs", json=_spec(root, "r", "r-out"))
        assert denied.status_code == 403 and denied.json() == {"detail": "role reader may not submit jobs"}
        assert reader.get(f"/v1/jobs/{done_a}/artifacts").status_code == 404

        # A's admin: both teams
        seen = {j["id"]: j["team"] for j in admin.get("/v1/jobs").json()["items"]}
        assert {done_a: "a", done_b: "b", queued_a: "a"}.items() <= seen.items()

        # the audit: each refusal, with who and what
        assert b.get("/v1/audit").status_code == 403
        entries = admin.get("/v1/audit", params={"outcome": "refused", "limit": 100}).json()["items"]
        refused = {(e["key_name"], e["target"], e["status"]) for e in entries}
        assert {("member-b", f"/v1/jobs/{done_a}", 404), ("member-b", f"/v1/jobs/{queued_a}/cancel", 404),
                ("member-b", f"/v1/jobs/{failed_a}/retry", 404),
                ("member-b", f"/v1/jobs/{done_a}/artifacts/manifest.json", 404), ("member-b", "/v1/jobs", 403),
                ("reader-b", "/v1/jobs", 403), ("reader-b", f"/v1/jobs/{done_a}/artifacts", 404),
                ("member-b", "/v1/audit", 403)} <= refused, refused
        assert sum(1 for e in entries if (e["key_name"], e["status"]) == ("member-b", 403)
                   and e["target"] == "/v1/jobs") == 3  # overwrite, dedup against, join
        for c in clients.values():
            c.close()
        assert main_audit(["--server", url, "--api-key", tokens["admin-a"], "--outcome", "refused"]) == 0
        printed = capsys.readouterr().out
        assert "role reader may not submit jobs" in printed and f"/v1/jobs/{queued_a}/cancel" in printed
        assert main_audit(["--server", url, "--api-key", tokens["member-b"]]) == 2
        assert "HTTP 403: role member may not read the audit" in capsys.readouterr().err


def test_the_job_process_checks_the_folders_owner_again(tmp_path):
    root = _inputs(tmp_path / "data")
    _owned_output(root / "a-out", "a", seed=1)
    spec = _spec(root, "late", "a-out", output={"path": str(root / "a-out"), "overwrite": True})
    with pytest.raises(AdmissionError, match="output.path: .* belongs to another team"):
        job_admit({"spec": spec, "team": "b"})
    assert job_admit({"spec": spec, "team": "a"}).output.path == str(root / "a-out")


def test_a_team_with_roots_of_its_own_writes_there_only(tmp_path):
    shared, vision = tmp_path / "shared", tmp_path / "vision"
    for root in (shared, vision):
        _inputs(root)
    settings = Settings.from_env({"TOKENMILL_ROOTS": f"{shared}:vision={vision}"}, state_dir=tmp_path / "state",
                                 run_supervisor=False)
    assert settings.team_roots == {"vision": (str(vision),)} and settings.input_roots == (str(shared),)
    assert team_roots(["/x", "vision=/y", "vision=s3://b/p", "Bad=/z"]) == {"vision": ("/y", "s3://b/p")}
    app = create_app(settings)
    with TestClient(app) as client:
        keys = {}
        with app.state.db.session() as s:
            for name, role, team in (("v", "member", "vision"), ("o", "member", "other"), ("admin", "admin", "x")):
                keys[name] = {"Authorization": f"Bearer {repo.create_key(s, name, role=role, team=team)[1]}"}

        def submit(who: str, root: Path, out: str) -> int:
            return client.post("/v1/jobs", json=_spec(root, out, out), headers=keys[who]).status_code

        assert submit("v", vision, "v1") == 201 and submit("v", shared, "v2") == 403  # its own roots only
        assert submit("o", shared, "o1") == 201 and submit("o", vision, "o2") == 403  # the shared ones
        assert submit("admin", vision, "x1") == 201 and submit("admin", shared, "x2") == 201  # every root
        r = client.post("/v1/jobs", json=_spec(shared, "v3", "v3"), headers=keys["v"])
        assert r.json()["detail"][0]["loc"][:2] == ["body", "inputs"] and str(vision) in r.json()["detail"][0]["msg"]


def test_serve_takes_a_teams_roots_as_team_equals_path(tmp_path, capsys):
    shared, vision = _inputs(tmp_path / "shared"), _inputs(tmp_path / "vision")
    state = ["--state-dir", str(tmp_path / "svc")]
    tokens = {}
    for name, team in (("v", "vision"), ("o", "other")):
        assert main_apikey(["create", "--name", name, "--team", team, *state]) == 0
        tokens[name] = capsys.readouterr().out.strip()
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", *state, "--port", "0", "--log-level",
                             "warning", "--root", str(shared), "--root", f"vision={vision}"],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        url = ready[0].removeprefix("ready on ").strip() if ready else ""
        assert url.startswith("http://"), ready
        for who, root, own in (("v", shared, vision), ("o", vision, shared)):  # each outside its own roots
            with _client(url, tokens[who]) as c:
                r = c.post("/v1/jobs", json=_spec(root, "x", "x"))
            assert r.status_code == 403, r.text
            assert all(str(own) in p["msg"] and str(root) not in p["msg"].split("(")[-1] for p in r.json()["detail"])
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
