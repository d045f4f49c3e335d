"""Starting or joining Ray has a deadline (issue 37): an address that accepts TCP and never answers (a socket
server here that accepts and stays silent; ``ray.init`` blocks in Ray's C++ core for minutes and no signal
interrupts it) ends the job FAILED ``infra`` in one line with a ``job_failed`` event, and nothing of the job is
left running.

- through the supervisor and a real job process (``--ray-start-timeout-s`` reaches it in its run);
- ``tokenmill run --address ... --ray-start-timeout-s``: one ``error:`` line, exit 1;
- the setting's plumbing: ``TOKENMILL_RAY_START_TIMEOUT_S``, ``serve --ray-start-timeout-s``, the runner's config.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from service.api.app import runner_config
from service.commands.serve import main as main_serve
from service.confine import Roots
from service.runner import process
from service.runner.supervisor import RunnerConfig, Supervisor
from service.settings import RAY_START_TIMEOUT_S, Settings
from service.store import repo
from service.store.db import Database
from tests.processes import kill_all, processes_naming

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 3


@pytest.fixture
def silent_address() -> Iterator[str]:
    """``127.0.0.1:PORT`` of a listener that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


def _data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.jsonl").write_text('{"id": "a", "text": "hello world"}\n')
    return root


def _left(run_dir: str, pid: int | None) -> list[int]:
    """Processes of the attempt still running: its job process, anything in its session, anything naming it."""
    found = set(processes_naming(run_dir))
    if pid is not None:
        found |= set(process.session_members(pid))
    return sorted(p for p in found if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE)


def test_a_ray_address_that_never_answers_fails_the_job_within_the_deadline(tmp_path, silent_address):
    root = _data(tmp_path)
    db = Database(f"sqlite:///{tmp_path / 'sup.db'}")
    db.migrate()
    spec = {"name": "silent", "inputs": [{"path": str(root / "in" / "*.jsonl")}],
            "output": {"path": str(root / "out")}, "execution": {"parallelism": 1}}
    with db.session() as s:
        job_id = repo.create_job(s, spec, name="silent", spec_hash="h" * 64, output_path=str(root / "out"))[0].id
    sup = Supervisor(db, RunnerConfig(state_dir=tmp_path / "state", ray_address=silent_address, poll_s=0.1,
                                      roots=Roots.of([root], [root]), ray_start_timeout_s=DEADLINE_S,
                                      env={"RAY_TMPDIR": str(tmp_path / "ray")}))
    sup.start()
    run_dir, pid = "", None
    try:
        t0, state = time.monotonic(), "QUEUED"
        while time.monotonic() - t0 < 60 and state not in ("FAILED", "SUCCEEDED", "CANCELLED"):
            time.sleep(0.2)
            with db.session() as s:
                job = repo.get_job(s, job_id)
                state, att = job.state, repo.current_attempt(s, job)
                if att is not None:
                    run_dir, pid = att.run_dir, att.pid
        with db.session() as s:
            job = repo.get_job(s, job_id)
            assert (job.state, job.failure_category) == ("FAILED", "infra"), (job.state, job.summary)
            assert job.error_message == f"could not start or join Ray at {silent_address} within {DEADLINE_S} s"
            types = [e.type for e in repo.events_after(s, job_id) if e.type not in ("state", "log")]
            failed = repo.last_event(s, job_id, job.attempt, ("job_failed",))
        assert types == ["ray_starting", "job_failed"]
        assert failed is not None and failed.data["category"] == "infra" and "\n" not in failed.data["message"]
        assert time.monotonic() - t0 < 45  # the deadline, the job process's start and a tick or two
        with db.read() as s:
            assert repo.get_attempt(s, job_id, 1).run["ray_start_timeout_s"] == DEADLINE_S
        assert _left(run_dir, pid) == []
    finally:
        sup.stop()
        if run_dir:
            kill_all(_left(run_dir, pid))
        db.dispose()


def test_tokenmill_run_with_an_address_that_never_answers_is_one_error_line(tmp_path, silent_address):
    root = _data(tmp_path)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "silent", "inputs": [{"path": str(root / "in" / "a.jsonl")}],
                                "output": {"path": str(root / "out")}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": str(tmp_path / "ray")}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "run", str(spec), "--address", silent_address,
                             "--ray-start-timeout-s", str(DEADLINE_S)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        kill_all([proc.pid])
    message = f"could not start or join Ray at {silent_address} within {DEADLINE_S} s"
    assert proc.returncode == 1 and err.splitlines() == [f"error: {message}"], err
    events = [json.loads(x) for x in (root / "out" / ".tokenmill" / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["ray_starting", "job_failed"]
    assert (events[-1]["category"], events[-1]["message"]) == ("infra", message)
    assert process.session_members(proc.pid) == []  # nothing of it left (its session: it led one)


def test_the_deadline_is_a_setting_of_serve_and_reaches_the_runner(tmp_path, capsys):
    assert Settings().ray_start_timeout_s == RAY_START_TIMEOUT_S
    settings = Settings.from_env({"TOKENMILL_RAY_START_TIMEOUT_S": "7.5"})
    assert settings.ray_start_timeout_s == 7.5 and runner_config(settings).ray_start_timeout_s == 7.5
    assert RunnerConfig(state_dir=tmp_path).ray_start_timeout_s == RAY_START_TIMEOUT_S
    assert main_serve(["--state-dir", str(tmp_path), "--ray-start-timeout-s", "0"]) == 2
    assert "ray_start_timeout_s" in capsys.readouterr().err
