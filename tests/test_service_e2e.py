"""The control plane end to end (issue 12): ``tokenmill serve`` in a subprocess on 127.0.0.1, real job
processes with a local Ray each, driven over HTTP.

- Submit a small job, follow its server-sent events to SUCCEEDED, check ``GET /v1/jobs/{id}``'s figures
  against the published manifest and stats; ``tokenmill follow`` and ``status`` agree. This run is the
  reference (uninterrupted) shard set.
- One job interrupted every way, in order (each job process starts a Ray node, the costly part, so one
  job takes them all):
  0. its job process SIGKILLed mid-curation: the job resumes as a new attempt, and no process of the lost
     one's session (its local Ray node, whose agents outlive their driver by minutes) survives the loss;
  1. cancelled mid-write: CANCELLED, nothing published;
  2. retried: the new attempt skips the finished phases and keeps the shards already written (same
     files: inode and mtime), reported ``reused`` by the engine;
  3. the service SIGKILLed mid-job (the job process frozen with SIGSTOP meanwhile, so it cannot finish
     before the service is back) and started again: it re-attaches to that process, which is not
     started twice, and the job ends SUCCEEDED, byte-identical to the reference.
  Deaths in a row up to ``max_lost`` are tested with a stand-in process in tests/test_service_api.py; the
  engine's resume after a SIGKILL in tests/test_job_engine.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from pipeline.shard_format import sha256_file
from pipeline.stages import stage_class
from pipeline.stages.base import StageContext, run_batch
from service.runner import process
from service.store import repo
from service.store.db import Database
from tests.corpus_fixtures import make_text, write_jsonl
from tests.ports import free_port
from tests.processes import kill_all, processes_naming

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def _corpus(folder: Path, n_docs: int = 1000) -> None:
    rng = random.Random(7)
    docs = [{"id": f"d{i}", "text": make_text(rng, rng.choice([8, 30, 90, 200]))} for i in range(n_docs)]
    for i in range(0, n_docs, EMAIL_EVERY):  # PII for the pii stage to hash with the secret salt
        docs[i]["text"] += f" Write to {_email(i)} today."
    docs += [dict(docs[i], id=f"copy{i}") for i in range(0, n_docs, 50)]  # 20 exact duplicates
    write_jsonl(folder / "a.jsonl", docs[: len(docs) // 2])
    write_jsonl(folder / "b.jsonl", docs[len(docs) // 2:])


#: the pii stage's secret (issue 37): used for the hashes, never shown nor written outside the service's store
SALT = "e2e-salt-7f3a9c0b1d2e4f56"
EMAIL_EVERY = 100


def _email(i: int) -> str:
    return f"user{i}@example.com"


def _spec(root: Path, out: str) -> dict:
    return {
        "name": "service-e2e",
        "inputs": [{"path": str(root / "in" / "*.jsonl")}],
        "stages": [{"type": "normalize"},
                   {"type": "pii", "params": {"salt": SALT, "actions": {"EMAIL_ADDRESS": "hash"}}},
                   {"type": "exact_dedup"}],
        "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 500}},
        "packing": {"seq_len": 128, "range_docs": 100},
        "output": {"path": str(root / out), "samples_per_shard": 16, "documents": "jsonl"},
        "execution": {"parallelism": 1, "batch_size": 64},
    }


class Service:
    """``tokenmill serve`` as a subprocess; ``kill()`` is a SIGKILL, as a crash would do."""

    def __init__(self, tmp: Path, root: Path, ray_tmp: str):
        self.tmp, self.root, self.ray_tmp = tmp, root, ray_tmp
        self.state = tmp / "state"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = {**os.environ, "RAY_TMPDIR": self.ray_tmp, "PYTHONPATH": str(ROOT), "TOKENMILL_TEST_CPUS": "2"}
        log = open(self.tmp / f"serve-{self.starts}.log", "wb")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--state-dir", str(self.state), "--root", str(self.root), "--job-cpus", "2", "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 90
        while time.monotonic() < end:
            assert self.proc.poll() is None, (self.tmp / f"serve-{self.starts}.log").read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("the service did not become ready")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    root = tmp / "data"
    _corpus(root / "in")
    ray_tmp = tempfile.mkdtemp(prefix="tms", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    svc = Service(tmp, root, ray_tmp)
    db = Database(f"sqlite:///{svc.state / 'tokenmill.db'}")
    svc.state.mkdir(parents=True)
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, "e2e")
    db.dispose()
    svc.start()
    client = httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    yield svc, client, token
    client.close()
    if svc.proc and svc.proc.poll() is None:
        svc.kill()
    kill_all(processes_naming(str(svc.state)))  # job processes
    kill_all(processes_naming(ray_tmp))  # and their Ray
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _salt_hashes(emails: list[str]) -> set[str]:
    """The tokens the pii stage writes for ``emails`` with the real salt (computed here, not by the job)."""
    cls = stage_class("pii")
    stage = cls(cls.Params(salt=SALT, actions={"EMAIL_ADDRESS": "hash"}), StageContext("t", "out", 0, "work"))
    docs = [{"id": str(i), "text": f"Write to {e} today.", "meta": {}} for i, e in enumerate(emails)]
    return {re.search(r"<EMAIL_ADDRESS:[0-9a-f]+>", d["text"]).group(0) for d in run_batch(stage, docs).kept}


def _no_salt_in_clear(svc: Service, ray_tmp: str) -> None:
    """The salt is in no file the service, its jobs or their Ray wrote (logs, run folders, outputs, cards, stats)
    but the database, which only the service's user may read; nor in the logs and events the database stores."""
    for top in (svc.tmp, Path(ray_tmp)):
        for path in top.rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            if not path.name.startswith("tokenmill.db"):
                assert SALT.encode() not in path.read_bytes(), path


def _tree(out: Path) -> dict[str, str]:
    names = ["manifest.json", "tokenizer.json", *sorted(p.relative_to(out).as_posix()
                                                        for p in (out / "shards").iterdir())]
    return {n: sha256_file(out / n) for n in names}


def _sse(client: httpx.Client, job_id: str, after: int = 0, until=None) -> list[dict]:
    """The events after ``after`` until the server ends the stream (the job is finished), or up to the
    first one for which ``until`` is true."""
    events, fields = [], {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": str(after)},
                       timeout=httpx.Timeout(30, read=600)) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line:
                if fields:
                    events.append({"id": int(fields["id"]), "event": fields["event"], **json.loads(fields["data"])})
                    if until is not None and until(events[-1]):
                        return events
                fields = {}
            elif not line.startswith(":"):
                k, _, v = line.partition(": ")
                fields[k] = v
    assert until is None, "the stream ended first"
    return events


def _wait_job(client: httpx.Client, job_id: str, pred, what: str, timeout: float = 300) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if pred(job):
            return job
        assert job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED") or what.startswith("state"), job
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {client.get(f'/v1/jobs/{job_id}').json()}")


@pytest.fixture(scope="module")
def reference(service):
    """Submit, follow to the end over server-sent events: the uninterrupted run."""
    svc, client, _ = service
    r = client.post("/v1/jobs", json=_spec(svc.root, "reference"), headers={"Idempotency-Key": "ref"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    events = _sse(client, job_id)
    return job_id, events, client.get(f"/v1/jobs/{job_id}").json()


def test_submit_and_follow_to_success_with_the_jobs_figures(service, reference):
    svc, client, token = service
    job_id, events, job = reference
    kinds = [e["event"] for e in events]
    states = [e["state"] for e in events if e["event"] == "state"]
    assert states == ["QUEUED", "RUNNING", "SUCCEEDED"], states
    assert kinds.index("job_started") < kinds.index("job_finished") < len(kinds) - 1
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert {e["phase"] for e in events if e["event"] == "phase"} == {"curate", "tokenizer", "write", "finalize"}

    out = svc.root / "reference"
    manifest = json.loads((out / "manifest.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    assert job["state"] == "SUCCEEDED" and job["error"] is None and job["attempt"] == 1
    assert job["shards"] == {"done": len(manifest["shards"]), "written": len(manifest["shards"]), "reused": 0,
                             "total": len(manifest["shards"])}
    assert job["tokens"] == sum(s["tokens"] for s in manifest["shards"]) > 0
    assert job["samples"] == sum(s["samples"] for s in manifest["shards"])
    assert job["documents"] == 1000  # 1020 read, the 20 exact copies set aside
    stages = {s["stage"]: s for s in job["stages"]}
    dedup = next(s for name, s in stages.items() if name.endswith("exact_dedup"))
    assert (dedup["docs_in"], dedup["docs_out"], sum(dedup["dropped"].values())) == (1020, 1000, 20)
    assert [s["stage"] for s in job["stages"]] == [s["stage"] for s in stats["stages"]]
    assert job["throughput"] == stats["throughput"] and job["throughput"]["docs_per_s"] > 0
    assert job["timings"]["total"] == stats["seconds"]["total"] > 0
    assert [(a["number"], a["outcome"], a["exit_code"]) for a in job["attempts"]] == [(1, "succeeded", 0)]
    assert "attempt 1" in client.get(f"/v1/jobs/{job_id}/logs").text  # the job process's own log

    # the salt (issue 37): hashed with its real value, shown nowhere (responses, events, logs, files)
    assert job["spec"]["stages"][1]["params"]["salt"] == "<redacted>"
    texts = "\n".join(json.loads(line)["text"] for part in sorted((out / "documents").glob("*.jsonl"))
                      for line in part.read_text().splitlines())
    assert "@example.com" not in texts
    assert set(re.findall(r"<EMAIL_ADDRESS:[0-9a-f]+>", texts)) == _salt_hashes(
        [_email(i) for i in range(0, 1000, EMAIL_EVERY)])
    for text in (json.dumps(events), client.get(f"/v1/jobs/{job_id}/logs").text, json.dumps(job),
                 client.get("/v1/jobs").text):
        assert SALT not in text
    _no_salt_in_clear(svc, svc.ray_tmp)
    again = client.post("/v1/jobs", json=_spec(svc.root, "reference"), headers={"Idempotency-Key": "ref"})
    assert (again.status_code, again.json()["id"]) == (200, job_id)

    env = {**os.environ, "TOKENMILL_API_KEY": token, "PYTHONPATH": str(ROOT)}
    follow = subprocess.run([sys.executable, "-m", "service.cli", "follow", job_id, "--server", svc.url],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert follow.returncode == 0, follow.stderr
    assert f"job {job_id}: SUCCEEDED" in follow.stderr
    assert "docs in" in follow.stdout and "written to" in follow.stdout  # the summary `tokenmill run` prints
    status = subprocess.run([sys.executable, "-m", "service.cli", "status", job_id, "--server", svc.url],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout, status.stderr


def test_cancel_retry_and_a_service_sigkill_end_byte_identical(service, reference):
    svc, client, _ = service
    ref_tree = _tree(svc.root / "reference")
    out = svc.root / "interrupted"
    job_id = client.post("/v1/jobs", json=_spec(svc.root, "interrupted")).json()["id"]
    work = out / ".tokenmill" / "work"

    # 0. the job process SIGKILLed mid-curation: resumed as attempt 2, and what it left of its local Ray (its
    #    session: GCS, raylet, workers, the agents that would outlive it by minutes) killed once the loss is noticed
    job = _wait_job(client, job_id, lambda j: j["phase"] == "curate" and j["attempts"][-1]["pid"], "curation")
    lost = job["attempts"][-1]["pid"]
    assert len(process.session_members(lost)) >= 4  # the job process and its Ray node
    os.kill(lost, signal.SIGKILL)
    _wait_job(client, job_id, lambda j: j["attempts"][0]["outcome"] == "lost", "the loss noticed", timeout=60)
    end = time.monotonic() + 10
    while process.session_members(lost) and time.monotonic() < end:
        time.sleep(0.1)
    assert process.session_members(lost) == []

    # 1. cancel mid-write
    _wait_job(client, job_id, lambda j: j["attempt"] == 2 and j["shards"]["written"] >= 2, "two shards")
    assert client.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "CANCELLING"
    job = _wait_job(client, job_id, lambda j: j["state"] == "CANCELLED", "state CANCELLED", timeout=120)
    assert job["error"]["category"] == "cancelled" and not (out / "manifest.json").exists()
    # "lost": Ray's core worker sometimes aborts while the engine force-cancels its tasks (a failed check in
    # task_manager.cc, exit 1) before the engine reports; the job is CANCELLED all the same
    assert [(a["outcome"], a["exit_code"]) for a in job["attempts"][1:]] in ([("cancelled", 130)], [("lost", 1)])
    kept = [json.loads(line)["name"] for line in (work / "shards.jsonl").read_text().splitlines()]
    assert len(kept) >= 2
    before = {name: (work / "stage" / name).stat() for name in kept}

    # 2. retry: attempt 3 resumes; wait until its write phase has taken the shards already written (it reports
    # them first), while most of its own are still to come: frozen there, it cannot have finished
    assert client.post(f"/v1/jobs/{job_id}/retry").json()["state"] == "QUEUED"
    job = _wait_job(client, job_id, lambda j: j["attempt"] == 3 and j["shards"]["reused"] >= len(kept),
                    "the kept shards reused", timeout=300)
    assert job["resumed_phases"] == ["curate", "tokenizer"] and job["shards"]["reused"] >= len(kept)

    # 3. the service dies; its job process lives on (frozen, so it cannot finish meanwhile) and is re-attached
    pid = job["attempts"][-1]["pid"]
    os.kill(pid, signal.SIGSTOP)
    svc.kill()
    try:
        svc.start()
        _sse(client, job_id, until=lambda e: e["event"] == "log" and e.get("source") == "service")
        written = client.get(f"/v1/jobs/{job_id}").json()["shards"]["written"]
    finally:
        os.kill(pid, signal.SIGCONT)
    events = _sse(client, job_id)  # to the end
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "SUCCEEDED", job
    assert job["shards"]["written"] > written  # it went on after the re-attach
    attached = next(e["id"] for e in events if e["event"] == "log" and e.get("source") == "service")
    assert next(e["id"] for e in events if e["event"] == "job_finished") > attached  # and finished under it
    assert [(a["number"], a["pid"], a["outcome"]) for a in job["attempts"][2:]] == [(3, pid, "succeeded")]
    assert _tree(out) == ref_tree  # manifest, tokenizer and every shard: byte-identical

    notes = [e["message"] for e in events if e["event"] == "log" and e.get("source") == "service"]
    assert notes == [f"re-attached to the job process (pid {pid}) of attempt 3"]
    second = [e for e in events if e["attempt"] == 3]
    reused = {e["name"] for e in second if e["event"] == "shard_written" and e["reused"]}
    rewritten = {e["name"] for e in second if e["event"] == "shard_written" and not e["reused"]}
    assert set(kept) <= reused and not set(kept) & rewritten  # the retry skipped the shards already written
    for name, st in before.items():  # and left their files as they were (moved into place by the commit)
        now = (out / name).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), name
    assert next(e for e in second if e["event"] == "job_started")["resumed_phases"] == ["curate", "tokenizer"]
    states = [e["state"] for e in events if e["event"] == "state"]
    assert states == ["QUEUED", "RUNNING", "QUEUED", "RUNNING", "CANCELLING", "CANCELLED", "QUEUED", "RUNNING",
                      "SUCCEEDED"], states
    # every attempt had the real salt (the same shards as the reference), none wrote it in clear (issue 37)
    assert SALT not in json.dumps(events) and SALT not in client.get(f"/v1/jobs/{job_id}").text
    _no_salt_in_clear(svc, svc.ray_tmp)
