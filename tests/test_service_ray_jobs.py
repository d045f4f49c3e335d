"""Jobs submitted through Ray's Jobs API (service.runner.ray_jobs): the driver runs on the cluster.

The supervisor's decisions with a stand-in Jobs API client (fast): submission by a derived id, outcome from the events
the driver reports to the database, re-attach after a restart, cancel as ``stop_job``, FAILED without a result resumed,
STOPPED from outside CANCELLED, no decision while the Jobs API does not answer.

End to end (ray, slow): a Ray head with its dashboard (the Jobs API) is started as a separate ``ray start --head
--block`` process, with token auth, stopped by its process group id. The service (the app in this process, its
supervisor thread) has ``ray_jobs_url`` set; the driver reports to the service's database (its SQLite file, which the
head on this machine reaches), not through the state folder. One job is submitted through the REST API and followed to
SUCCEEDED: the Jobs API lists its submission as SUCCEEDED, the manifest is published, the job's log is the driver's. A
second job is cancelled while it runs: ``stop_job``, the job's own SIGTERM handling reports the cancel, the job ends
CANCELLED with nothing published, the submission STOPPED.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.corpus_fixtures import make_text, write_jsonl
from tests.ports import free_port
from tests.processes import kill_all, processes_naming, stop_group

REPO = Path(__file__).resolve().parent.parent


class FakeJobs:
    """Stands in for ``JobSubmissionClient``: submissions in a class-wide table (one cluster), statuses set
    by the test."""

    table: dict[str, dict] = {}
    stopped: list[str] = []
    down = False

    def __init__(self, url: str, headers: dict | None = None):
        if FakeJobs.down:
            raise ConnectionError("no answer")

    def submit_job(self, *, entrypoint: str, submission_id: str, runtime_env: dict, metadata: dict) -> str:
        assert submission_id not in FakeJobs.table
        FakeJobs.table[submission_id] = {"entrypoint": entrypoint, "env": runtime_env["env_vars"], "status": "PENDING"}
        return submission_id

    def get_job_info(self, sid: str) -> SimpleNamespace:
        if FakeJobs.down:
            raise ConnectionError("no answer")
        if sid not in FakeJobs.table:
            raise RuntimeError("Request failed with status code 404: Job not found.")
        row = FakeJobs.table[sid]
        return SimpleNamespace(status=SimpleNamespace(value=row["status"]), message=row.get("message"),
                               driver_exit_code=row.get("code"))

    def stop_job(self, sid: str) -> bool:
        FakeJobs.stopped.append(sid)
        return True


def _emit(box, *records: dict) -> None:
    """Report ``records`` as the driver would (``box``: its :class:`service.runner.report.EventOutbox`)."""
    for rec in records:
        box.report({"ts": time.time(), **rec})
    assert box.flush(10)


def test_the_supervisor_follows_submissions_by_their_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.runner import ray_jobs
    from service.runner.report import EventOutbox
    from service.runner.supervisor import RunnerConfig, Supervisor
    from service.store import repo
    from service.store.db import Database

    monkeypatch.setattr(ray_jobs, "_client_class", lambda: FakeJobs)
    monkeypatch.setattr(FakeJobs, "table", {})
    monkeypatch.setattr(FakeJobs, "stopped", [])
    db = Database(f"sqlite:///{tmp_path / 'jobs.db'}")
    db.migrate()
    config = RunnerConfig(state_dir=tmp_path / "state", ray_jobs_url="http://head:8265", max_running=3,
                          cancel_grace_s=7, poll_s=0.05)

    def submit(name: str) -> str:
        with db.session() as s:
            job, _ = repo.create_job(s, {"name": name, "output": {"path": "/o"}}, name=name, spec_hash="h" * 64,
                                     output_path=f"/o/{name}")
            return job.id

    def state(job_id: str) -> str:
        with db.session() as s:
            return repo.get_job(s, job_id).state

    def run_dir(job_id: str, n: int = 1) -> str:
        return config.run_dir(job_id, n)

    ok, cancelled, lost, stopped = (submit(n) for n in ("ok", "cancelled", "lost", "stopped"))
    sup = Supervisor(db, config)
    sup.tick()
    sids = {j: ray_jobs.submission_id(j, 1) for j in (ok, cancelled, lost)}
    assert set(FakeJobs.table) == set(sids.values())  # three at once, the fourth queued
    row = FakeJobs.table[sids[ok]]
    assert row["entrypoint"].endswith(f"-m service.runner.job_process --job {ok} --attempt 1 "
                                      f"--run-dir {run_dir(ok)} --log-output")
    assert row["env"]["RAY_JOB_STOP_WAIT_TIME_S"] == "7"
    assert row["env"]["TOKENMILL_DATABASE_URL"] == f"sqlite:///{tmp_path / 'jobs.db'}"  # where the driver reports
    with db.read() as s:
        assert repo.get_attempt(s, ok, 1).run["spec"]["execution"]["address"] is None
    boxes = {j: EventOutbox(db, j, 1) for j in (ok, cancelled)}

    for sid in sids.values():
        FakeJobs.table[sid]["status"] = "RUNNING"
    _emit(boxes[ok], {"type": "job_started", "job": "ok"}, {"type": "job_finished", "shards": 1})
    FakeJobs.table[sids[ok]].update(status="SUCCEEDED", code=0)
    FakeJobs.down = True  # no answer: nothing is decided
    try:
        sup.tick()
        assert state(ok) == "RUNNING"
    finally:
        FakeJobs.down = False
    sup.tick()
    assert state(ok) == "SUCCEEDED"
    with db.session() as s:
        assert [(a.outcome, a.exit_code) for a in repo.attempts_of(s, ok)] == [("succeeded", 0)]

    sup = Supervisor(db, config)  # a restarted service: re-attaches by the derived ids
    with db.session() as s:
        repo.cancel_job(s, cancelled)
    sup.tick()
    assert FakeJobs.stopped == [sids[cancelled]] and state(cancelled) == "CANCELLING"
    with db.session() as s:
        notes = [e.data.get("message", "") for e in repo.events_after(s, cancelled, 0)]
    assert any(f"re-attached to the Ray job submission {sids[cancelled]}" in m for m in notes), notes
    _emit(boxes[cancelled], {"type": "job_failed", "category": "cancelled", "message": "cancelled"})
    FakeJobs.table[sids[cancelled]]["status"] = "STOPPED"
    FakeJobs.table[sids[lost]].update(status="FAILED", message="Job supervisor actor died", code=None)
    sup.tick()
    assert state(cancelled) == "CANCELLED"
    with db.session() as s:
        notes = [e.data.get("message") or "" for e in repo.events_after(s, lost, 0)]
    assert any(m.startswith("attempt 1 ended without a result (the Ray Jobs API reports FAILED for "
                            f"{sids[lost]}: Job supervisor actor died); resuming") for m in notes), notes
    sup.tick()
    assert ray_jobs.submission_id(lost, 2) in FakeJobs.table and state(lost) == "RUNNING"

    sid = ray_jobs.submission_id(stopped, 1)  # stopped from outside the service (the Ray dashboard)
    assert sid in FakeJobs.table
    FakeJobs.table[sid]["status"] = "STOPPED"
    sup.tick()
    assert state(stopped) == "CANCELLED"
    with db.session() as s:
        assert [a.outcome for a in repo.attempts_of(s, stopped)] == ["cancelled"]
    for box in boxes.values():
        box.close()
    db.dispose()


def _spec(root: Path, out: str, docs: str = "in") -> dict:
    return {
        "name": f"ray-jobs-{out}",
        "inputs": [{"path": str(root / docs / "*.jsonl")}],
        "stages": [{"type": "normalize"}],
        "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 200}},
        "packing": {"seq_len": 64, "range_docs": 100},
        "output": {"path": str(root / out), "samples_per_shard": 64},
        "execution": {"parallelism": 1, "batch_size": 64},
    }


def _wait(pred, what: str, timeout: float, head: subprocess.Popen, log: Path):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert head.poll() is None, f"the Ray head exited: {log.read_text()[-2000:]}"
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.ray
@pytest.mark.slow
def test_a_job_runs_and_cancels_through_the_ray_jobs_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.dashboard.modules.job.sdk", reason="the Jobs API needs ray[default] (service extra)")
    pytest.importorskip("aiohttp", reason="the Jobs API needs ray[default] (service extra)")
    from fastapi.testclient import TestClient
    from ray.job_submission import JobSubmissionClient

    from service.api.app import create_app
    from service.runner.ray_jobs import submission_id
    from service.settings import Settings
    from service.store import repo

    root = tmp_path / "data"
    rng = random.Random(5)
    write_jsonl(root / "in" / "a.jsonl", [{"id": f"d{i}", "text": make_text(rng, 40)} for i in range(200)])
    # the job to cancel: big enough to still be running when the cancel comes
    write_jsonl(root / "big" / "a.jsonl", [{"id": f"d{i}", "text": make_text(rng, 60)} for i in range(5000)])

    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    for k, v in auth.items():
        monkeypatch.setenv(k, v)  # for the Jobs API client in this process
    temp = tempfile.mkdtemp(prefix="tmrj-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dash = free_port(), free_port()
    env = {**os.environ, **auth, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO),
           # the entrypoint's ``python`` is this interpreter (tokenmill installed), as in the cluster's image
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    head_log = tmp_path / "head.log"
    with open(head_log, "wb") as out:
        head = subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--disable-usage-stats",
             f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={temp}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        def jobs_api() -> JobSubmissionClient | None:
            try:
                return JobSubmissionClient(url, headers={"Authorization": f"Bearer {token.read_text()}"})
            except Exception:  # noqa: BLE001 - not up yet
                return None

        jobs = _wait(jobs_api, "the Jobs API", 90, head, head_log)
        settings = Settings(state_dir=tmp_path / "state", input_roots=(root,), output_roots=(root,),
                            ray_jobs_url=url, poll_s=0.2, cancel_grace_s=20)
        app = create_app(settings)
        with TestClient(app) as client:
            with app.state.db.session() as s:
                _, key = repo.create_key(s, "test")
            headers = {"Authorization": f"Bearer {key}"}

            def state(job_id: str):
                job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
                return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

            r = client.post("/v1/jobs", json=_spec(root, "out"), headers=headers)
            assert r.status_code == 201, r.text
            ok = r.json()["id"]
            done = _wait(lambda: state(ok), "the first job", 120, head, head_log)
            assert done["state"] == "SUCCEEDED", (done, client.get(f"/v1/jobs/{ok}/logs", headers=headers).text)
            assert (root / "out" / "manifest.json").is_file()
            listed = {j.submission_id: str(j.status.value) for j in jobs.list_jobs()}
            assert listed.get(submission_id(ok, 1)) == "SUCCEEDED", listed
            log = client.get(f"/v1/jobs/{ok}/logs", headers=headers).text
            assert f"tokenmill job {ok} attempt 1" in log  # the driver's own output, through the database

            r = client.post("/v1/jobs", json=_spec(root, "out2", docs="big"), headers=headers)
            assert r.status_code == 201, r.text
            cancel = r.json()["id"]

            def curating() -> bool:
                with app.state.db.session() as s:
                    return repo.last_event(s, cancel, 1, ("phase",)) is not None

            _wait(curating, "the second job to start a phase", 90, head, head_log)
            assert client.post(f"/v1/jobs/{cancel}/cancel", headers=headers).status_code == 202
            ended = _wait(lambda: state(cancel), "the cancelled job", 60, head, head_log)
            assert ended["state"] == "CANCELLED", ended
            with app.state.db.session() as s:  # reported by the driver's own SIGTERM handling
                assert repo.last_event(s, cancel, 1, ("job_failed",)).data["category"] == "cancelled"
            assert not (root / "out2" / "manifest.json").exists()
            status = _wait(lambda: str(jobs.get_job_info(submission_id(cancel, 1)).status.value) == "STOPPED"
                           and "STOPPED", "the submission STOPPED", 30, head, head_log)
            assert status == "STOPPED"
    finally:
        stop_group(head)
        kill_all(processes_naming(temp))  # workers and drivers re-parented out of the head's group
        kill_all(processes_naming(str(tmp_path / "state")))
        shutil.rmtree(temp, ignore_errors=True)
