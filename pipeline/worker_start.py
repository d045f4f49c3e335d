"""How long a worker process took to start, counted once, so that a phase's stats explain its time.

A phase's wall time on ``parallelism`` workers is mostly the stages' own work, but a worker process that Ray
starts for the phase spends seconds booting, importing and unpickling before its first task: on a small job, a
fifth of the phase. Each stage counts that start in its seconds (``stats.json``), once per process.
"""

from __future__ import annotations

import os
import time

#: whether this process's start was counted already (:func:`process_start_seconds`)
_START_COUNTED = False


def process_start_seconds(since: float | None) -> float:
    """How long this worker process took to start, from its creation to now (its first task or actor: Ray's
    worker boot, imports, unpickling the function), once per process: the worker-seconds a phase spent starting
    the processes it runs on, counted in the seconds of the stage that first ran in it. 0 for a process created
    before ``since`` (the phase's start, wall clock: its start belongs to Ray's own start or an earlier phase),
    after the first call, and where ``/proc`` is missing; and for a ``since`` of None (no phase to count in)."""
    global _START_COUNTED
    if _START_COUNTED or since is None:
        return 0.0
    _START_COUNTED = True
    try:  # the kernel's clock since boot, at 10 ms: starttime (field 22 of /proc/self/stat) against /proc/uptime
        with open("/proc/self/stat", "rb") as f:
            started = int(f.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", "rb") as f:
            age = float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return 0.0
    return age if time.time() - age >= since and age > 0 else 0.0
