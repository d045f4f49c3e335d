"""Several ``tokenmill serve`` replicas on one PostgreSQL schema and a local Ray head with its Jobs API, all real
processes: what tests/test_ha_failover.py and bench/ha.py run (issue 41).

- :class:`RayHead` (:func:`ray_head`): ``ray start --head --block`` with token auth and its dashboard (the Jobs
  API), in a process group of its own, started first so the replicas start while it comes up, and stopped with
  everything it started (drivers and workers re-parented out of its group are found by its temp folder).
- :class:`Replica`: ``tokenmill serve --port 0`` (the kernel picks the port; the ``ready on URL`` line says
  which) with its own state folder, SIGKILLed as a lost node would be, or started again on the same port.
- :func:`pg_schema`: a fresh private schema, migrated once before any replica starts, with an API key.

Everything binds 127.0.0.1, so it runs inside the suite's network namespace (scripts/netns.sh).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

from service.store import repo
from service.store.db import Database
from tests.ports import free_port
from tests.processes import kill_all, processes_naming, stop_group

BIN = Path(sys.executable).parent
#: ``tokenmill`` as installed beside this interpreter, else the same CLI through the module
TOKENMILL = [str(BIN / "tokenmill")] if (BIN / "tokenmill").exists() else [sys.executable, "-m", "service.cli"]
REPO = Path(__file__).resolve().parent.parent


class Unavailable(RuntimeError):
    """Ray's Jobs API could not be started here (the reason, with the head's log)."""


class RayHead:
    """``ray start --head --block`` with token auth and its Jobs API at ``url`` (known at once, up after
    :meth:`wait`): started first, so that the replicas start while it comes up."""

    def __init__(self, tmp: Path, num_cpus: int = 1):
        token = tmp / "ray-token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        #: what a Jobs API client (a replica, this process) needs: the token auth variables
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self.headers = {"Authorization": f"Bearer {token.read_text()}"}
        self.temp = tempfile.mkdtemp(prefix="tmha-", dir="/tmp")  # short: Ray's socket paths have a length limit
        port, dash = free_port(), free_port()
        self.url = f"http://127.0.0.1:{dash}"
        self.log = tmp / "ray-head.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats", f"--port={port}",
                 "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}", "--include-dashboard=true",
                 "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={self.temp}"],
                env={**base_env(), **self.auth}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout_s: float = 90) -> Any:
        """A Jobs API client once it answers; :class:`Unavailable` when the head exits or never answers."""
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise Unavailable(f"the Ray head exited: {self.log.read_text()[-2000:]}")
            try:
                return JobSubmissionClient(self.url, headers=self.headers)
            except Exception as exc:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise Unavailable(f"the Jobs API did not answer in {timeout_s:g} s ({exc}): "
                                      f"{self.log.read_text()[-2000:]}") from exc
                time.sleep(0.3)

    def stop(self) -> None:
        stop_group(self.proc)
        kill_all(processes_naming(self.temp))  # workers and drivers re-parented out of the head's group
        shutil.rmtree(self.temp, ignore_errors=True)


def base_env() -> dict[str, str]:
    """This environment with the repository importable and this interpreter's ``python`` first on the PATH (the
    Jobs API runs the entrypoint's ``python`` with the head's PATH, as a cluster's image would)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    return env


@contextmanager
def ray_head(tmp: Path, num_cpus: int = 1) -> Iterator[RayHead]:
    """A :class:`RayHead`, stopped with everything it started on the way out (not yet waited for)."""
    head = RayHead(tmp, num_cpus)
    try:
        yield head
    finally:
        head.stop()


@contextmanager
def pg_schema(url: str, key_name: str = "ha") -> Iterator[tuple[str, str]]:
    """A fresh schema on ``url``, migrated (so no two replicas race to), and an admin key: ``(schema, token)``."""
    schema = f"tm_test_{secrets.token_hex(6)}"
    db = Database(url, schema=schema)
    db.migrate()
    with db.session() as s:
        _, token = repo.create_key(s, key_name, role="admin")
    try:
        yield schema, token
    finally:
        db.drop_schema()
        db.dispose()


class Replica:
    """One ``tokenmill serve`` process; ``args`` are its options beyond the host, port and state folder."""

    def __init__(self, name: str, tmp: Path, args: list[str], env: dict[str, str]):
        self.name, self.tmp, self.args, self.env = name, tmp, args, env
        self.state = tmp / f"state-{name}"
        self.port = 0  # the first start lets the kernel pick; a restart takes the same port again
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.tmp / f"serve-{self.name}-{self.starts}.log"

    def start(self, timeout_s: float = 60) -> None:
        """Start it and wait for its ``ready on URL`` line."""
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        self.starts += 1
        log = open(self.log, "wb")  # noqa: SIM115 - the reader thread holds it
        self.proc = subprocess.Popen(
            [*TOKENMILL, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--state-dir", str(self.state),
             "--log-level", "warning", *self.args],
            cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        self._ready = threading.Event()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout, log, self._ready), daemon=True).start()

    def wait_ready(self, timeout_s: float = 60) -> None:
        if not self._ready.wait(timeout_s) or not self.alive:
            self.kill()
            raise AssertionError(f"replica {self.name} did not start:\n{self.log.read_text()[-3000:]}")

    def _read(self, out: IO[bytes], log: IO[bytes], ready: threading.Event) -> None:
        with log:
            for line in out:
                text = line.decode(errors="replace").strip()
                if text.startswith("ready on "):
                    self.url = text.removeprefix("ready on ")
                    self.port = int(self.url.rsplit(":", 1)[1])
                    ready.set()
                log.write(line)
                log.flush()
        ready.set()  # it exited

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def leads(self, timeout_s: float = 2.0) -> bool | None:
        """Whether ``GET /readyz`` says this replica leads the supervisor (None: no answer)."""
        try:
            return bool(httpx.get(f"{self.url}/readyz", timeout=timeout_s).json()["leader"]["supervisor"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def kill(self) -> None:
        """SIGKILL, as a lost node: nothing released, no lease handed over."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def serve_args(database_url: str, schema: str, roots: list[Path], ray_jobs_url: str | None,
               lease_s: float | None) -> list[str]:
    """A replica's options: the shared database, the roots, the Jobs API, the lease (None: the default)."""
    args = ["--database-url", database_url, "--database-schema", schema]
    for root in roots:
        args += ["--root", str(root)]
    if ray_jobs_url:
        args += ["--ray-jobs-url", ray_jobs_url]
    if lease_s is not None:
        args += ["--lease-s", f"{lease_s:g}"]
    return args


def wait_for(what: str, cond, timeout_s: float, every_s: float = 0.1):  # type: ignore[no-untyped-def]
    """``cond()``'s first true value, polled every ``every_s``; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)
