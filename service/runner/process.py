"""Job processes as the supervisor sees them: start one, tell whether it still runs, signal it.

A process is known by its pid *and* its start time (as the kernel reports it, through psutil), so after
a service restart a pid that the system has since given to another program is never taken for the job;
its command line must also name the attempt's folder. Each job process leads its own session (and
process group), so a restart or a crash of the service does not take it down; what it starts (its local
Ray node) stays in that session, so when the attempt ends, however it ends, or a forced stop, the
supervisor kills whatever is left of the session (:func:`kill_session`).

The supervisor sees them through an :class:`Executor`: :class:`LocalProcesses` here (the default), or
:class:`service.runner.ray_jobs.RayJobs` (each attempt a Ray Jobs API submission, its driver on the cluster).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

#: two readings of one process's start time differ by less than this (psutil derives it from clock ticks)
START_TIME_TOLERANCE_S = 0.05
RUN_DIR_FLAG = "--run-dir"


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    started: float


def start(command: Sequence[str], run_dir: Path, log_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``command --run-dir RUN_DIR`` in a new session, output appended to ``log_path``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen([*command, RUN_DIR_FLAG, str(run_dir)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=dict(env), close_fds=True)


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _names_run_dir(proc: psutil.Process, run_dir: str) -> bool:
    try:
        cmd = proc.cmdline()
    except psutil.AccessDenied:
        return True  # cannot read it: pid and start time decide
    except psutil.NoSuchProcess:
        return False
    return any(a == RUN_DIR_FLAG and b == run_dir for a, b in zip(cmd, cmd[1:], strict=False))


def is_alive(pid: int, started: float | None, run_dir: str) -> bool:
    """Whether the job process ``(pid, started)`` of ``run_dir`` still runs (a zombie does not)."""
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > START_TIME_TOLERANCE_S:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return _names_run_dir(proc, run_dir)


def find(run_dir: str) -> ProcessRef | None:
    """The live job process of ``run_dir``: for an attempt whose pid was never recorded (the service died
    between starting the process and saving its pid)."""
    for proc in psutil.process_iter(["cmdline", "create_time", "status"]):
        try:
            cmd = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or RUN_DIR_FLAG not in cmd:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if _names_run_dir(proc, run_dir):
            return ProcessRef(proc.pid, proc.info["create_time"])
    return None


def terminate(pid: int) -> None:
    """SIGTERM to the job process only: it cancels its job and stops its own Ray."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def session_of(pid: int) -> int | None:
    """The session id of process ``pid`` (``/proc/PID/stat``); None when it is gone, a zombie, or there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)", which may hold spaces: state ppid pgrp session
    return None if fields[0] in ("Z", "X") else int(fields[3])


def session_members(sid: int) -> list[int]:
    """The live processes of session ``sid``."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    return [p for p in pids if session_of(p) == sid]


def kill_session(pid: int, started: float | None, sweeps: int = 3) -> list[int]:
    """SIGKILL every process left in the session that the job process ``(pid, started)`` leads or led; the
    pids killed.

    That is what the attempt started: a local Ray node's GCS, raylet, log monitor, workers (in process groups
    of their own, so a group kill misses them) and its dashboard and runtime-env agents, which outlive a lost
    job process by minutes. Found by session, never by name; nothing when the session's leader is another
    process than the job's (its pid reused), nor a process started before the job. A Ray cluster the job only
    joined (``execution.address``) runs in sessions of its own and is never touched."""
    if not started or started < psutil.boot_time():
        return []  # unknown, or from before a reboot: whatever has that session id now is not the job's
    leader = start_time(pid)
    if leader is not None and abs(leader - started) > START_TIME_TOLERANCE_S:
        return []
    killed: list[int] = []
    for _ in range(sweeps):  # a raylet may start a worker while the sweep runs
        found = [m for m in session_members(pid) if (start_time(m) or 0.0) >= started - START_TIME_TOLERANCE_S]
        if not found:
            break
        for member in found:
            try:
                os.kill(member, signal.SIGKILL)
                killed.append(member)
            except ProcessLookupError:
                pass
    return killed


# ---- the supervisor's view: one executor per service (this one, or service.runner.ray_jobs.RayJobs) ---------


@dataclass(frozen=True)
class Ended:
    """How an attempt's process ended, as far as its executor can tell (its outcome is its events file's)."""

    exit_code: int | None
    #: for a message: "exit code 1", "no result", what the Ray Jobs API said
    how: str
    #: stopped from outside the service (the Ray Jobs API's STOPPED): a cancel, not a loss
    stopped: bool = False


class Executor(Protocol):
    """Where the supervisor's job processes run. An attempt is known by what the database keeps of it
    (job id, number, folder, pid and start time), so a restarted service finds its processes again."""

    def launch(self, job_id: str, number: int, run_dir: Path) -> ProcessRef | None:
        """Start the attempt whose ``run.json`` is in ``run_dir``; the pid to record, if any. Raises OSError."""

    def alive(self, att: Any) -> bool:
        """Whether the attempt's process still runs (it may fill in ``att.pid``/``att.proc_started``)."""

    def started_here(self, att: Any) -> bool:
        """Whether this executor started it (else the supervisor notes a re-attach)."""

    def name(self, att: Any) -> str:
        """The attempt's process, for the job's log ("the job process (pid 12)")."""

    def cancel(self, att: Any, force: bool) -> None:
        """Ask it to stop (the job's SIGTERM handling cancels); ``force``: the grace is over."""

    def ended(self, att: Any) -> Ended:
        """How it ended, once ``alive`` said it no longer runs."""

    def folder_here(self, att: Any) -> str | None:
        """The attempt's folder when it is on this machine (the supervisor ships the logs a killed process could
        not: :func:`service.runner.report.ship_rest`), else None."""


class LocalProcesses:
    """Each attempt a child process of this machine, in its own session (the default)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], log_file: str):
        self.command, self.env, self.log_file = tuple(command), dict(env), log_file
        self.host = socket.gethostname()
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # the processes this service started

    def launch(self, job_id: str, number: int, run_dir: Path) -> ProcessRef:
        command = (*self.command, "--job", job_id, "--attempt", str(number))
        child = start(command, run_dir, run_dir / self.log_file, {**os.environ, **self.env})
        self._children[child.pid] = child
        return ProcessRef(child.pid, start_time(child.pid) or 0.0)

    def alive(self, att: Any) -> bool:
        if self.folder_here(att) is None:  # another replica's host, whose processes cannot be seen from here: lost
            return False
        if att.pid is None:  # the service died between starting the process and recording it
            ref = find(att.run_dir)
            if ref is not None:
                att.pid, att.proc_started = ref.pid, ref.started
        if att.pid is None:
            return False
        child = self._children.get(att.pid)
        if child is not None:
            return child.poll() is None
        return is_alive(att.pid, att.proc_started, att.run_dir)

    def started_here(self, att: Any) -> bool:
        return att.pid in self._children

    def name(self, att: Any) -> str:
        return f"the job process (pid {att.pid})"

    def cancel(self, att: Any, force: bool) -> None:
        if att.pid is None:
            return
        if force:
            self.reap(att)
        else:
            terminate(att.pid)

    def ended(self, att: Any) -> Ended:
        child = self._children.pop(att.pid, None) if att.pid is not None else None
        code = child.returncode if child is not None else None
        self.reap(att)  # a lost job process (SIGKILL, a crash) leaves its Ray node behind
        return Ended(code, f"exit code {code}" if code is not None else "no result")

    def folder_here(self, att: Any) -> str | None:
        return att.run_dir if (getattr(att, "host", None) or self.host) == self.host else None

    def reap(self, att: Any) -> list[int]:
        """Kill what is left of the attempt's session (:func:`kill_session`); only on the host that started it."""
        if att.pid is None or (getattr(att, "host", None) or self.host) != self.host:
            return []
        return kill_session(att.pid, att.proc_started)
