"""Scheduled corpus refreshes (issue 12, part 6).

Without Ray (the scheduler driven tick by tick with an injectable clock; a job's outcome played by hand, as
the supervisor would record it; on SQLite and PostgreSQL):

- cron expressions and IANA zones validated (422 naming the field), next fire times, daylight saving;
- ``/v1/schedules`` CRUD, pause/resume, run history, versions; the spec's folders checked (roots 403, a
  dedup stage, an output outside the inputs, one schedule per folder);
- a run reads only the new or changed input files (fingerprints: size, mtime, sha256; a touched file with the
  same bytes is not read again), dedups against every published version, loads the first version's
  tokenizer, publishes ``v00000N`` and ``latest``; a failed run leaves its files to the next one; overlap
  ``skip`` and ``buffer_one``; missed slots coalesce;
- a schedule created again on a deleted one's folder adopts the versions its jobs published (409 for a version
  no job wrote, or a job still writing there); a CPU ask above the service's cap is a 422.

With Ray, one test: a schedule fires twice through the real supervisor and job processes; the second run
reads only the new file, drops the documents version 1 already published, and publishes version 2 while a
trainer's loader pinned to version 1 still reads version 1 over HTTP. Then it is deleted and created again:
the third run reads every file and publishes only the new documents, with the first version's tokenizer.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi.testclient import TestClient

from pipeline.readers.paths import expand_path, source_name
from pipeline.shard_format import Manifest, sha256_file
from pipeline.spec import InputSpec
from service.api.app import create_app, runner_config
from service.runner.supervisor import Supervisor
from service.schedules import fingerprints, versions
from service.schedules.cron import check_cron, check_timezone, fire_times, next_fire, upcoming
from service.schedules.scheduler import NOTHING_SURVIVED, Scheduler
from service.settings import Settings
from service.store import repo
from service.store.models import Base, JobState
from tests.corpus_fixtures import make_text, write_jsonl
from tests.test_service_artifacts import publish_output, serve
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture
from training.data import ShardLoader

PARIS = "Europe/Paris"


class Clock:
    """The scheduler's injectable clock: set ``now`` and tick."""

    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _docs(prefix: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"{prefix}{i}", "text": make_text(rng, rng.choice([20, 40, 80]))} for i in range(n)]


def _spec(root: Path, **extra) -> dict:
    return {"name": "nightly", "inputs": [{"path": str(root / "in" / "**" / "*.jsonl")}],
            "stages": [{"type": "exact_dedup"}], "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 200}},
            "packing": {"seq_len": 64, "range_docs": 100},
            "output": {"path": str(root / "out" / "nightly"), "samples_per_shard": 8},
            "execution": {"parallelism": 1, "batch_size": 64}, **extra}


@pytest.fixture(params=["sqlite", "postgresql"])
def api(request, tmp_path):
    """``(client, headers, root, app)``: the API without a supervisor; tests run the scheduler themselves."""
    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'api.db'}"
    else:
        url, schema = request.getfixturevalue("postgres_url"), f"tm_test_{secrets.token_hex(6)}"
    settings = Settings(state_dir=tmp_path / "state", database_url=url, database_schema=schema, input_roots=(root,),
                        output_roots=(root,), run_supervisor=False)
    app = create_app(settings)
    with TestClient(app) as client:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "test")
        yield client, {"Authorization": f"Bearer {token}"}, root, app
        app.state.db.drop_schema()


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _runs(client, headers, sid: str) -> list[dict]:
    return client.get(f"/v1/schedules/{sid}/runs", headers=headers).json()["items"]


def _end_job(app, job_id: str, state: JobState, *, category: str | None = None, message: str | None = None,
             publish: Path | None = None) -> None:
    """Play the job's outcome as the supervisor records it (and write its output, as the job would)."""
    if publish is not None:
        publish_output(publish, seed=len(str(publish)))
    with app.state.db.session() as s:
        job = repo.lock_job(s, job_id)
        repo.transition(s, job, JobState.RUNNING)
        repo.transition(s, job, state, category=category, message=message)
        if state == JobState.SUCCEEDED:
            job.summary = {"documents": 40, "samples": 40, "tokens": 2400, "shards": {"total": 5}}


# ---- cron and zones ---------------------------------------------------------------------------------------


def test_cron_and_zone_checks_and_daylight_saving():
    assert check_cron(" 30  2 * * * ") == "30 2 * * *" and check_cron("@Daily") == "@daily"
    for bad in ("61 * * * *", "* * * * * *", "* * *", "@reboot", "0 0 30 2 *", "every day"):
        with pytest.raises(ValueError):
            check_cron(bad)
    assert check_timezone(PARIS) == PARIS
    for bad in ("Mars/Olympus", "", "../etc/passwd", "europe/paris"):
        with pytest.raises(ValueError):
            check_timezone(bad)
    # 02:30 does not exist in Paris on 2025-03-30: it fires at 03:00 local (01:00 UTC), as cron does
    assert next_fire("30 2 * * *", PARIS, datetime(2025, 3, 29, 12, tzinfo=UTC)) == datetime(2025, 3, 30, 1,
                                                                                          tzinfo=UTC)
    # 02:30 happens twice on 2025-10-26: a fixed-hour job runs once, an hourly one on both passes
    daily = upcoming("30 2 * * *", PARIS, next_fire("30 2 * * *", PARIS, datetime(2025, 10, 25, 12, tzinfo=UTC)), 2)
    assert daily == [datetime(2025, 10, 26, 0, 30, tzinfo=UTC), datetime(2025, 10, 27, 1, 30, tzinfo=UTC)]
    hourly = fire_times("30 * * * *", PARIS, datetime(2025, 10, 25, 23, 45, tzinfo=UTC))
    assert [next(hourly) for _ in range(3)] == [datetime(2025, 10, 26, h, 30, tzinfo=UTC) for h in (0, 1, 2)]
    assert next_fire("0 9 * * 1", "America/New_York", datetime(2025, 7, 1, tzinfo=UTC)) == datetime(
        2025, 7, 7, 13, tzinfo=UTC)  # Monday 09:00 EDT


# ---- the API ----------------------------------------------------------------------------------------------


def test_create_validates_the_schedule_and_its_folders(api, tmp_path):
    client, headers, root, _ = api

    def post(**body):
        return client.post("/v1/schedules", json={"cron": "0 3 * * *", "spec": _spec(root), **body}, headers=headers)

    def locs(r):
        return {tuple(p["loc"]) for p in r.json()["detail"]}

    r = post(cron="61 * * * *", timezone="Mars/Olympus")
    assert r.status_code == 422 and locs(r) == {("body", "cron"), ("body", "timezone")}
    assert post(overlap="allow_all").status_code == 422
    r = post(spec=_spec(root, stages=[{"type": "normalize"}]))
    assert r.status_code == 422 and locs(r) == {("body", "spec", "stages")}
    r = post(spec=_spec(root, stages=[{"type": "nope"}, {"type": "exact_dedup"}]))
    assert r.status_code == 422 and ("body", "spec", "stages", 0, "type") in locs(r)
    outside = _spec(root)
    outside["output"]["path"] = str(tmp_path / "elsewhere" / "out")
    r = post(spec=outside)
    assert r.status_code == 403 and locs(r) == {("body", "spec", "output", "path")}
    inside = _spec(root)
    inside["output"]["path"] = str(root / "in" / "versions")
    r = post(spec=inside)
    assert r.status_code == 422 and locs(r) == {("body", "spec", "output", "path")}
    cap = client.app.state.settings.job_cpu_cap
    r = post(spec=_spec(root, execution={"num_cpus": cap + 1}))
    assert r.status_code == 422 and locs(r) == {("body", "spec", "execution", "num_cpus")}

    at_cap = _spec(root, execution={"num_cpus": cap, "parallelism": cap})
    r = post(timezone=PARIS, spec=at_cap)  # no input file yet: fine, each run checks what it reads
    assert r.status_code == 201, r.text
    body = r.json()
    assert r.headers["location"] == f"/v1/schedules/{body['id']}" and body["name"] == "nightly"
    times = [_at(t) for t in body["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times) and times[0] == _at(body["next_fire_at"])
    assert all(t.astimezone(ZoneInfo(PARIS)).hour == 3 for t in times)
    assert body["latest_version"] is None and body["last_run"] is None

    nested = _spec(root)
    nested["output"]["path"] = str(root / "out" / "nightly" / "inner")
    assert post(spec=nested).status_code == 409
    assert post().status_code == 409  # the same folder
    (root / "out" / "taken").mkdir(parents=True)
    (root / "out" / "taken" / "notes.txt").write_text("mine")
    taken = _spec(root)
    taken["output"]["path"] = str(root / "out" / "taken")
    r = post(spec=taken)
    assert r.status_code == 409 and "notes.txt" in r.json()["detail"]
    listed = client.get("/v1/schedules", headers=headers).json()["items"]
    assert [s["id"] for s in listed] == [body["id"]]
    for method, path in (("GET", "/v1/schedules"), ("POST", "/v1/schedules"), ("GET", f"/v1/schedules/{body['id']}"),
                         ("PATCH", f"/v1/schedules/{body['id']}"), ("DELETE", f"/v1/schedules/{body['id']}"),
                         ("POST", f"/v1/schedules/{body['id']}/pause"), ("GET", f"/v1/schedules/{body['id']}/runs"),
                         ("GET", f"/v1/schedules/{body['id']}/versions")):
        assert client.request(method, path, json={}).status_code == 401, (method, path)


def test_pause_resume_update_and_delete(api):
    client, headers, root, app = api
    (root / "in" / "a.jsonl").write_text('{"text": "hello there"}\n')
    sid = client.post("/v1/schedules", json={"cron": "*/5 * * * *", "spec": _spec(root)}, headers=headers).json()["id"]
    r = client.post(f"/v1/schedules/{sid}/pause", headers=headers).json()
    assert r["paused"] and r["next_fire_at"] is None and r["next_fire_times"] == []
    scheduler = Scheduler(app.state.db, app.state.settings, clock=Clock(datetime.now(UTC) + timedelta(days=30)))
    scheduler.tick()
    assert _runs(client, headers, sid) == []  # paused: nothing fires
    r = client.post(f"/v1/schedules/{sid}/resume", headers=headers).json()
    assert not r["paused"] and _at(r["next_fire_at"]) > datetime.now(UTC)
    assert _at(r["next_fire_at"]).minute % 5 == 0

    r = client.patch(f"/v1/schedules/{sid}", json={"cron": "15 4 * * *", "timezone": PARIS, "overlap": "buffer_one"},
                     headers=headers)
    assert r.status_code == 200 and r.json()["overlap"] == "buffer_one"
    assert {(_at(t).astimezone(ZoneInfo(PARIS)).hour, _at(t).minute)
            for t in r.json()["next_fire_times"]} == {(4, 15)}
    moved = _spec(root)
    moved["output"]["path"] = str(root / "out" / "other")
    r = client.patch(f"/v1/schedules/{sid}", json={"spec": moved}, headers=headers)
    # another folder than the schedule's: the request does not fit the schedule (its versions live there), not
    # the body's schema
    assert r.status_code == 409 and r.json()["detail"].startswith("spec.output.path:"), r.text
    assert client.patch(f"/v1/schedules/{sid}", json={"cron": "nope"}, headers=headers).status_code == 422

    with app.state.db.session() as s:  # a run going: delete is refused
        sched = repo.lock_schedule(s, sid)
        repo.add_run(s, sched, fire_at=datetime(2030, 1, 1, tzinfo=UTC), state="running", job_id="j")
    assert client.delete(f"/v1/schedules/{sid}", headers=headers).status_code == 409
    with app.state.db.session() as s:
        repo.running_runs(s)[0].state = "failed"
    assert client.delete(f"/v1/schedules/{sid}", headers=headers).status_code == 204
    assert client.get(f"/v1/schedules/{sid}", headers=headers).status_code == 404
    assert client.get(f"/v1/schedules/{sid}/runs", headers=headers).status_code == 404


def test_a_schedules_secret_is_redacted_kept_across_a_patch_and_used_by_its_runs(api):
    """Issue 37: the PII salt is ``<redacted>`` in every schedule response; a PATCH that sends the spec back with
    ``<redacted>`` keeps the stored salt, one with a new salt replaces it; a run's job gets the real one."""
    client, headers, root, app = api
    write_jsonl(root / "in" / "a.jsonl", _docs("a", 3, 0))
    salt, new_salt = "schedule-salt-0123456789", "another-salt-9876543210"
    spec = _spec(root, stages=[{"type": "pii", "params": {"salt": salt, "actions": {"EMAIL_ADDRESS": "hash"}}},
                               {"type": "exact_dedup"}])

    def stored() -> str:
        with app.state.db.read() as s:
            return repo.get_schedule(s, sid).spec["stages"][0]["params"]["salt"]

    r = client.post("/v1/schedules", json={"cron": "0 3 * * *", "spec": spec}, headers=headers)
    assert r.status_code == 201 and salt not in r.text
    sid = r.json()["id"]
    got = client.get(f"/v1/schedules/{sid}", headers=headers)
    assert got.json()["spec"]["stages"][0]["params"]["salt"] == "<redacted>" and salt not in got.text
    assert salt not in client.get("/v1/schedules", headers=headers).text
    assert stored() == salt

    sent = got.json()["spec"] | {"packing": {"seq_len": 32, "range_docs": 100}}  # GET, change, PATCH
    r = client.patch(f"/v1/schedules/{sid}", json={"spec": sent}, headers=headers)
    assert r.status_code == 200, r.text
    shown = r.json()["spec"]
    assert shown["stages"][0]["params"]["salt"] == "<redacted>" and shown["packing"]["seq_len"] == 32
    assert stored() == salt
    moved = json.loads(json.dumps(sent))
    moved["stages"] = moved["stages"][::-1]  # the placeholder where no salt is stored: nothing to keep
    r = client.patch(f"/v1/schedules/{sid}", json={"spec": moved}, headers=headers)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "spec", "stages", 1, "params", "salt"]
    for bad in ({"cron": "0 3 * * *", "spec": sent}, {"cron": "0 3 * * *", "spec": spec | {"stages": [
            {"type": "pii", "params": {"salt": "short", "actions": {"EMAIL_ADDRESS": "hash"}}}]}}):
        r = client.post("/v1/schedules", json=bad, headers=headers)  # nothing stored to keep; a refused one not echoed
        assert r.status_code == 422 and "short" not in r.text, r.text
    sent["stages"][0]["params"]["salt"] = new_salt
    r = client.patch(f"/v1/schedules/{sid}", json={"spec": sent}, headers=headers)
    assert r.status_code == 200 and new_salt not in r.text and stored() == new_salt

    clock = Clock(_at(r.json()["next_fire_times"][0]) + timedelta(seconds=2))
    Scheduler(app.state.db, app.state.settings, clock=clock).tick()
    run = _runs(client, headers, sid)[0]
    assert run["state"] == "running" and new_salt not in json.dumps(run)
    job = client.get(f"/v1/jobs/{run['job_id']}", headers=headers)
    assert job.json()["spec"]["stages"][0]["params"]["salt"] == "<redacted>" and new_salt not in job.text
    with app.state.db.read() as s:
        assert repo.get_job(s, run["job_id"]).spec["stages"][0]["params"]["salt"] == new_salt  # what the run uses


# ---- fingerprints and the run's spec ----------------------------------------------------------------------


def test_fingerprints_find_new_and_changed_files_and_hash_only_those(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    write_jsonl(folder / "a.jsonl", _docs("a", 3, 0))
    write_jsonl(folder / "sub" / "b.jsonl", _docs("b", 3, 1))
    inputs = [InputSpec(path=str(folder / "**" / "*.jsonl"))]
    hashed = []
    real = fingerprints.sha256_of
    monkeypatch.setattr(fingerprints, "sha256_of", lambda p: hashed.append(Path(p).name) or real(p))
    old = time.time_ns() - 10 * 10**9  # written "long ago": not racy
    for p in (folder / "a.jsonl", folder / "sub" / "b.jsonl"):
        os.utime(p, ns=(old, old))

    first = fingerprints.scan(inputs, {})
    assert [Path(p).name for _, p in first.new] == ["a.jsonl", "b.jsonl"] and not first.changed
    assert first.snapshot[str(folder / "a.jsonl")]["sha256"] == sha256_file(folder / "a.jsonl")
    hashed.clear()
    again = fingerprints.scan(inputs, first.snapshot)
    assert again.to_read == [] and again.unchanged == 2 and hashed == []  # stat only: nothing read

    os.utime(folder / "a.jsonl", ns=(old + 5 * 10**9, old + 5 * 10**9))  # touched, same bytes
    write_jsonl(folder / "c.jsonl", _docs("c", 2, 2))
    os.utime(folder / "c.jsonl", ns=(old, old))
    third = fingerprints.scan(inputs, again.snapshot)
    assert [Path(p).name for _, p in third.new] == ["c.jsonl"] and third.changed == []
    assert sorted(hashed) == ["a.jsonl", "c.jsonl"]  # only files whose stat moved were read

    b = folder / "sub" / "b.jsonl"  # same size and mtime, other bytes: only a racy fingerprint catches it
    data = b.read_bytes()
    b.write_bytes(data.replace(b"b0", b"B0"))
    os.utime(b, ns=(old, old))
    assert fingerprints.scan(inputs, third.snapshot).to_read == []  # stat says unchanged: trusted
    racy = {k: dict(v, racy=True) if k == str(b) else v for k, v in third.snapshot.items()}
    assert [Path(p).name for _, p in fingerprints.scan(inputs, racy).changed] == ["b.jsonl"]
    fresh = fingerprints.scan(inputs, {})
    assert not any(v["racy"] for v in fresh.snapshot.values())
    (folder / "a.jsonl").unlink()
    assert str(folder / "a.jsonl") not in fingerprints.scan(inputs, fresh.snapshot).snapshot


def test_a_run_spec_reads_the_files_under_their_own_ids_and_dedups_against_every_version(tmp_path):
    folder = tmp_path / "in"
    for rel in ("a.jsonl", "sub/b.jsonl", "sub/deeper/c.jsonl", "[odd].jsonl"):
        write_jsonl(folder / rel, _docs("x", 1, 0))
    pattern = str(folder / "**" / "*.jsonl")
    for rel in ("a.jsonl", "sub/b.jsonl", "sub/deeper/c.jsonl", "[odd].jsonl"):
        path = str(folder / rel)
        one = versions.single_file_input(pattern, path)
        assert expand_path(one) == [path] and source_name(one, path) == source_name(pattern, path) == rel
    assert versions.single_file_input(str(folder), str(folder / "sub" / "b.jsonl")) != str(folder / "sub" / "b.jsonl")
    assert versions.single_file_input(str(folder / "a.jsonl"), str(folder / "a.jsonl")) == str(folder / "a.jsonl")

    out = tmp_path / "out"
    publish_output(out / "v000001")
    template = _spec(tmp_path, stages=[{"type": "normalize"}, {"type": "exact_dedup", "params": {
        "dedup_against": "/data/old"}}, {"type": "near_dedup"}])
    spec = versions.refresh_spec(template, [(0, str(folder / "sub" / "b.jsonl"))], str(out), 3,
                                 [str(out / "v000001"), str(out / "v000002")])
    assert [i["path"] for i in spec["inputs"]] == [str(folder / "[s]ub" / "b.jsonl")]
    assert spec["stages"][1]["params"]["dedup_against"] == ["/data/old", str(out / "v000001"), str(out / "v000002")]
    assert spec["stages"][2]["params"]["dedup_against"] == [str(out / "v000001"), str(out / "v000002")]
    assert "dedup_against" not in spec["stages"][0].get("params", {})
    assert spec["tokenizer"]["path"] == str(out / "v000001" / "tokenizer.json")
    assert spec["output"]["path"] == str(out / "v000003") and spec["name"] == "nightly-v000003"
    assert spec["output"]["card_compare"] == [str(out / "v000001"), str(out / "v000002")]  # its card's history
    assert template["inputs"][0]["path"] == str(tmp_path / "in" / "**" / "*.jsonl")  # the template is untouched
    assert versions.highest_on_disk(out) == 1 and versions.read_latest(out) is None
    versions.write_latest(out, 7)
    assert (out / "latest").read_text() == "v000007\n" and versions.read_latest(out) == 7


def test_migration_matches_the_models(api):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    _, _, _, app = api
    with app.state.db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


# ---- the scheduler, tick by tick -------------------------------------------------------------------------


def test_runs_read_only_new_files_publish_versions_and_leave_failures_to_the_next_run(api):
    client, headers, root, app = api
    write_jsonl(root / "in" / "a.jsonl", _docs("a", 5, 0))
    write_jsonl(root / "in" / "sub" / "b.jsonl", _docs("b", 5, 1))
    body = client.post("/v1/schedules", json={"cron": "0 3 * * *", "timezone": PARIS, "spec": _spec(root)},
                       headers=headers).json()
    sid, out = body["id"], Path(body["output_path"])
    slots = [_at(t) for t in body["next_fire_times"]]
    clock = Clock(slots[0] - timedelta(seconds=1))
    woken = []
    scheduler = Scheduler(app.state.db, app.state.settings, clock=clock, wake_jobs=lambda: woken.append(1))

    def at(i: int) -> list[dict]:
        clock.now = slots[i] + timedelta(seconds=2)
        scheduler.tick()
        return _runs(client, headers, sid)

    scheduler.tick()
    assert _runs(client, headers, sid) == []  # not yet
    run = at(0)[0]
    assert run["state"] == "running" and run["version"] == 1 and woken == [1]
    assert run["inputs"]["new"] == [str(root / "in" / "a.jsonl"), str(root / "in" / "sub" / "b.jsonl")]
    job = client.get(f"/v1/jobs/{run['job_id']}", headers=headers).json()
    assert job["state"] == "QUEUED" and job["output_path"] == str(out / "v000001")
    assert [i["path"] for i in job["spec"]["inputs"]] == [str(root / "in" / "[a].jsonl"),
                                                            str(root / "in" / "[s]ub" / "b.jsonl")]
    assert "dedup_against" not in job["spec"]["stages"][0]["params"] and job["spec"]["tokenizer"]["path"] is None
    assert _at(client.get(f"/v1/schedules/{sid}", headers=headers).json()["next_fire_at"]) == slots[1]

    runs = at(1)  # the first run is still going: skipped
    assert runs[0]["state"] == "skipped" and "still going" in runs[0]["message"] and runs[0]["job_id"] is None
    _end_job(app, run["job_id"], JobState.SUCCEEDED, publish=out / "v000001")
    scheduler.tick()
    runs = _runs(client, headers, sid)
    assert runs[1]["state"] == "succeeded" and runs[1]["message"].startswith("published version 1")
    assert versions.read_latest(out) == 1
    listed = client.get(f"/v1/schedules/{sid}/versions", headers=headers).json()
    assert listed["latest"] == 1 and listed["items"][0]["artifacts"] == f"/v1/schedules/{sid}/versions/1/artifacts"
    assert listed["items"][0]["samples"] == 40 and listed["items"][0]["shards"] == 5

    os.utime(root / "in" / "a.jsonl")  # touched, same bytes
    write_jsonl(root / "in" / "c.jsonl.next", _docs("c", 5, 2))  # a copy in progress: starts no run
    runs = at(2)
    assert runs[0]["state"] == "unchanged" and runs[0]["inputs"]["unchanged"] == 2 and runs[0]["job_id"] is None

    (root / "in" / "c.jsonl.next").rename(root / "in" / "c.jsonl")  # the copy is done
    run = at(3)[0]
    assert run["state"] == "running" and run["inputs"] == {"new": [str(root / "in" / "c.jsonl")], "changed": [],
                                                           "unchanged": 2, "skipped": 0}
    spec = client.get(f"/v1/jobs/{run['job_id']}", headers=headers).json()["spec"]
    assert [i["path"] for i in spec["inputs"]] == [str(root / "in" / "[c].jsonl")]
    assert spec["stages"][0]["params"]["dedup_against"] == [str(out / "v000001")]
    assert spec["tokenizer"]["path"] == str(out / "v000001" / "tokenizer.json")
    assert spec["output"]["path"] == str(out / "v000002")
    _end_job(app, run["job_id"], JobState.FAILED, category="infra", message="the machine went away")
    scheduler.tick()
    failed = _runs(client, headers, sid)[0]
    assert failed["state"] == "failed" and "the machine went away" in failed["message"]
    assert versions.read_latest(out) == 1

    run = at(4)[0]  # the failed run's file is read again; its version number is not reused
    assert run["inputs"]["new"] == [str(root / "in" / "c.jsonl")] and run["version"] == 3
    _end_job(app, run["job_id"], JobState.FAILED, category="input", message=f"{NOTHING_SURVIVED}: nothing to write")
    scheduler.tick()
    assert _runs(client, headers, sid)[0]["state"] == "empty"  # every document was already published
    clock.now = slots[4] + timedelta(days=1, seconds=2)
    scheduler.tick()
    assert _runs(client, headers, sid)[0]["state"] == "unchanged"  # the empty run consumed c.jsonl
    assert [r["state"] for r in _runs(client, headers, sid)] == ["unchanged", "empty", "failed", "unchanged",
                                                                 "skipped", "succeeded"]
    with app.state.db.session() as s:  # only the baseline keeps its snapshot (one entry per input file)
        assert [len(r.fingerprints) for r in repo.runs_of(s, sid)] == [3, 0, 0, 0, 0, 0]
    page = client.get(f"/v1/schedules/{sid}/runs?limit=4", headers=headers).json()
    assert [r["number"] for r in page["items"]] == [6, 5, 4, 3] and page["next_cursor"] == 3
    older = client.get(f"/v1/schedules/{sid}/runs?limit=4&before=3", headers=headers).json()
    assert [r["number"] for r in older["items"]] == [2, 1] and older["next_cursor"] is None


def test_buffer_one_runs_the_waiting_slot_when_the_run_ends_and_missed_slots_coalesce(api):
    client, headers, root, app = api
    write_jsonl(root / "in" / "a.jsonl", _docs("a", 5, 0))
    body = client.post("/v1/schedules", json={"cron": "*/10 * * * *", "overlap": "buffer_one", "spec": _spec(root)},
                       headers=headers).json()
    sid, out = body["id"], Path(body["output_path"])
    slots = [_at(t) for t in body["next_fire_times"]]
    clock = Clock(slots[0])
    scheduler = Scheduler(app.state.db, app.state.settings, clock=clock)
    scheduler.tick()
    first = _runs(client, headers, sid)[0]
    clock.now = slots[1]
    scheduler.tick()
    sched = client.get(f"/v1/schedules/{sid}", headers=headers).json()
    assert _at(sched["pending_fire_at"]) == slots[1] and len(_runs(client, headers, sid)) == 1  # waiting
    clock.now = slots[2]
    scheduler.tick()
    runs = _runs(client, headers, sid)
    assert runs[0]["state"] == "skipped" and "already waiting" in runs[0]["message"]
    write_jsonl(root / "in" / "b.jsonl", _docs("b", 5, 1))
    _end_job(app, first["job_id"], JobState.SUCCEEDED, publish=out / "v000001")
    scheduler.tick()  # settles run 1, then fires the buffered slot at once
    runs = _runs(client, headers, sid)
    assert [r["state"] for r in runs] == ["running", "skipped", "succeeded"] and _at(runs[0]["fire_at"]) == slots[1]
    assert runs[0]["inputs"]["new"] == [str(root / "in" / "b.jsonl")]
    assert client.get(f"/v1/schedules/{sid}", headers=headers).json()["pending_fire_at"] is None

    _end_job(app, runs[0]["job_id"], JobState.CANCELLED, message="cancelled by hand")
    clock.now = slots[2] + timedelta(days=3)  # the service was down for three days: one run, not 432
    scheduler.tick()
    runs = _runs(client, headers, sid)
    assert [r["state"] for r in runs] == ["running", "failed", "skipped", "succeeded"]
    assert runs[0]["inputs"]["new"] == [str(root / "in" / "b.jsonl")]  # the cancelled run consumed nothing
    assert _at(client.get(f"/v1/schedules/{sid}", headers=headers).json()["next_fire_at"]) > clock.now


def test_a_schedule_created_again_on_its_folder_adopts_the_versions_its_jobs_published(api):
    client, headers, root, app = api
    write_jsonl(root / "in" / "a.jsonl", _docs("a", 5, 0))

    def create() -> httpx.Response:
        return client.post("/v1/schedules", json={"cron": "0 3 * * *", "spec": _spec(root)}, headers=headers)

    def fire(body: dict) -> dict:
        scheduler = Scheduler(app.state.db, app.state.settings, clock=Clock(_at(body["next_fire_at"])))
        scheduler.tick()
        return _runs(client, headers, body["id"])[0]

    def delete(sid: str) -> None:
        with app.state.db.session() as s:  # a run the history says ended while its job goes on
            for run in repo.running_runs(s):
                run.state = "failed"
        assert client.delete(f"/v1/schedules/{sid}", headers=headers).status_code == 204

    first = create().json()
    out = Path(first["output_path"])
    run1 = fire(first)
    _end_job(app, run1["job_id"], JobState.SUCCEEDED, publish=out / "v000001")
    Scheduler(app.state.db, app.state.settings).settle()
    write_jsonl(root / "in" / "b.jsonl", _docs("b", 5, 1))
    run2 = fire(client.get(f"/v1/schedules/{first['id']}", headers=headers).json())
    assert run2["version"] == 2 and run2["inputs"]["new"] == [str(root / "in" / "b.jsonl")]
    delete(first["id"])
    r = create()  # v000002's job is still queued: no one would publish it
    assert r.status_code == 409 and "v000002 (job " in r.json()["detail"]
    assert "still being written" in r.json()["detail"]
    _end_job(app, run2["job_id"], JobState.FAILED, category="infra", message="lost")
    (out / "v000002").mkdir()  # the failed run's folder, as its job leaves it

    again = create()
    assert again.status_code == 201, again.text
    body = again.json()
    assert body["id"] != first["id"] and body["latest_version"] == 1
    listed = client.get(f"/v1/schedules/{body['id']}/versions", headers=headers).json()
    assert [(v["number"], v["job_id"], v["run"], v["samples"]) for v in listed["items"]] == [
        (1, run1["job_id"], 0, 40)] and listed["latest"] == 1
    write_jsonl(root / "in" / "c.jsonl", _docs("c", 5, 2))
    run = fire(body)
    # no fingerprints survived the delete: every file is read, and dedup against v000001 drops what it published
    assert run["version"] == 3 and run["inputs"]["new"] == [str(root / "in" / n) for n in ("a.jsonl", "b.jsonl",
                                                                                            "c.jsonl")]
    spec = client.get(f"/v1/jobs/{run['job_id']}", headers=headers).json()["spec"]
    assert spec["stages"][0]["params"]["dedup_against"] == [str(out / "v000001")]
    assert spec["tokenizer"]["path"] == str(out / "v000001" / "tokenizer.json")

    copied = _spec(root)  # control: the same version copied elsewhere was written by no job of this service
    copied["output"]["path"] = str(root / "out" / "copied")
    shutil.copytree(out / "v000001", root / "out" / "copied" / "v000001")
    r = client.post("/v1/schedules", json={"cron": "0 3 * * *", "spec": copied}, headers=headers)
    assert r.status_code == 409 and "v000001: no job of this service wrote them" in r.json()["detail"]
    assert [s["id"] for s in client.get("/v1/schedules", headers=headers).json()["items"]] == [body["id"]]


# ---- end to end, with Ray ---------------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_a_schedule_fires_twice_and_version_1_stays_readable_while_version_2_publishes(tmp_path, monkeypatch):
    from tests.processes import kill_all, processes_naming

    root = tmp_path / "data"
    first = _docs("a", 120, 0)
    write_jsonl(root / "in" / "a.jsonl", first)
    write_jsonl(root / "in" / "b.jsonl", _docs("b", 120, 1))
    ray_tmp = tempfile.mkdtemp(prefix="tms", dir="/tmp")  # Ray's socket paths must stay short
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    settings = Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                        input_roots=(root,), output_roots=(root,), run_supervisor=False, job_cpus=2)
    app = create_app(settings)
    try:
        with serve(app) as url:
            db = app.state.db
            with db.session() as s:
                _, token = repo.create_key(s, "e2e")
            client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            spec = _spec(root, inputs=[{"path": str(root / "in" / "*.jsonl")}])
            body = client.post("/v1/schedules", json={"cron": "0 * * * *", "spec": spec}).json()
            sid, out = body["id"], Path(body["output_path"])
            slots = [_at(t) for t in body["next_fire_times"]]
            clock = Clock(slots[0])
            supervisor = Supervisor(db, runner_config(settings))
            scheduler = Scheduler(db, settings, clock=clock, wake_jobs=supervisor.wake)

            def settle(timeout: float = 240) -> dict:
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    supervisor.tick()
                    scheduler.tick()
                    run = client.get(f"/v1/schedules/{sid}/runs").json()["items"][0]
                    if run["state"] != "running":
                        return run
                    time.sleep(0.3)
                raise AssertionError(f"the run did not end: {run}")

            scheduler.tick()
            run1 = settle()
            assert run1["state"] == "succeeded", client.get(f"/v1/jobs/{run1['job_id']}").json()
            v1 = out / "v000001"
            v1_files = {p.name: sha256_file(p) for p in (v1 / "shards").iterdir()}
            pinned = ShardLoader(f"{url}/v1/schedules/{sid}/versions/1/artifacts", 4, num_workers=0,
                                 bearer_token=token, shuffle=False)
            reading = pinned.epoch_batches()
            before = [next(reading)["keys"]]  # a trainer is part-way through version 1

            copies = [{"id": f"copy{i}", "text": first[i]["text"]} for i in range(0, 40, 2)]
            write_jsonl(root / "in" / "c.jsonl", _docs("c", 60, 2) + copies)
            clock.now = slots[1]
            run2 = settle()
            assert run2["state"] == "succeeded" and run2["version"] == 2
            assert run2["inputs"] == {"new": [str(root / "in" / "c.jsonl")], "changed": [], "unchanged": 2,
                                      "skipped": 0}
            job2 = client.get(f"/v1/jobs/{run2['job_id']}").json()
            stages = {st["stage"].split("-", 1)[-1]: st for st in job2["stages"]}
            assert stages["exact_dedup"]["docs_in"] == 80  # only c.jsonl was read
            assert stages["exact_dedup"]["dropped"] == {"exact_duplicate_of_published": 20}
            assert job2["documents"] == 60
            assert (out / "latest").read_text() == "v000002\n"
            versions_listed = client.get(f"/v1/schedules/{sid}/versions").json()
            assert [v["number"] for v in versions_listed["items"]] == [1, 2] and versions_listed["latest"] == 2
            # version 2's dataset card, served with it, compares it with version 1 (fewer documents: 60 now)
            card = client.get(f"/v1/schedules/{sid}/versions/2/artifacts/README.md").text
            kept = next(line for line in card.splitlines() if line.startswith("| documents kept |")).split("|")
            assert "## Compared with v000001" in card and kept[3].strip() == "60" and kept[4].strip().startswith("-")
            assert "card/versions.svg" in card
            assert client.get(f"/v1/schedules/{sid}/versions/2/artifacts/card/versions.svg").status_code == 200

            rest = [b["keys"] for b in reading]  # the pinned trainer goes on with version 1, untouched
            assert before + rest == [b["keys"] for b in ShardLoader(str(v1), 4, num_workers=0,
                                                                    shuffle=False).epoch_batches()]
            assert {p.name: sha256_file(p) for p in (v1 / "shards").iterdir()} == v1_files
            latest = ShardLoader(f"{url}/v1/schedules/{sid}/versions/latest/artifacts", 4, num_workers=0,
                                 bearer_token=token)
            assert latest.manifest == Manifest.load(out / "v000002")
            assert latest.manifest.tokenizer_hash == pinned.manifest.tokenizer_hash  # one tokenizer for all
            clock.now = slots[2]
            scheduler.tick()
            assert client.get(f"/v1/schedules/{sid}/runs").json()["items"][0]["state"] == "unchanged"

            # deleted by mistake, created again on its folder: it adopts v1 and v2, and run 3 reads every file
            # (the fingerprints went with the history) but publishes only the new documents, with v1's tokenizer
            assert client.delete(f"/v1/schedules/{sid}").status_code == 204
            body = client.post("/v1/schedules", json={"cron": "0 * * * *", "spec": spec}).json()
            sid = body["id"]
            assert body["latest_version"] == 2
            seen = [{"id": f"again{i}", "text": d["text"]} for i, d in enumerate(_docs("b", 120, 1)[:10])]
            write_jsonl(root / "in" / "d.jsonl", _docs("d", 30, 3) + seen)
            clock.now = slots[3]
            run3 = settle()
            assert run3["state"] == "succeeded" and run3["version"] == 3
            assert run3["inputs"]["new"] == [str(root / "in" / f"{n}.jsonl") for n in "abcd"]
            job3 = client.get(f"/v1/jobs/{run3['job_id']}").json()
            stages = {st["stage"].split("-", 1)[-1]: st for st in job3["stages"]}
            assert stages["exact_dedup"]["docs_in"] == 360
            assert stages["exact_dedup"]["dropped"] == {"exact_duplicate_of_published": 330}
            assert job3["documents"] == 30
            assert [v["number"] for v in client.get(f"/v1/schedules/{sid}/versions").json()["items"]] == [1, 2, 3]
            assert Manifest.load(out / "v000003").tokenizer_hash == pinned.manifest.tokenizer_hash
            assert (out / "latest").read_text() == "v000003\n"
            adopted = ShardLoader(f"{url}/v1/schedules/{sid}/versions/1/artifacts", 4, num_workers=0,
                                  bearer_token=token, shuffle=False)
            assert [b["keys"] for b in adopted.epoch_batches()] == before + rest  # v1, served again
            client.close()
            supervisor.stop()
    finally:
        kill_all(processes_naming(str(settings.state_dir)))
        kill_all(processes_naming(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)
