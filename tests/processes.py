"""Finding and killing the processes a test started (a job's Ray, a service's job processes) by their command line."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def processes_naming(text: str) -> list[int]:
    """Pids of the processes (other than this one) whose command line contains ``text``."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            pids.append(int(pid))
    return pids


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_group(proc: subprocess.Popen) -> None:
    """Terminate the process group led by ``proc`` (a Ray node we started), then kill what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)
