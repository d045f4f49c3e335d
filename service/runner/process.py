"""Job processes as the supervisor sees them: start one, tell whether it still runs, signal it.

A process is known by its pid *and* its start time (as the kernel reports it, through psutil), so after
a service restart a pid that the system has since given to another program is never taken for the job;
its command line must also name the attempt's folder. Each job process leads its own session (and
process group), so a restart or a crash of the service does not take it down, and a forced stop reaches
everything it started in that group.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def kill_group(pid: int) -> None:
    """SIGKILL to the job process's whole group (it leads its session, so its group id is its pid)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
