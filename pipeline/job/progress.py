"""Periodic progress lines while Ray works: per-stage counts read from the stats actor."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ray


class StageProgress:
    """A daemon thread that prints what every stage has done so far, every ``every`` seconds."""

    def __init__(self, stats_actor: Any, say: Callable[[str], None], every: float = 10.0):
        self.stats_actor = stats_actor
        self.say = say
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenmill-progress", daemon=True)

    def __enter__(self) -> StageProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every)

    def _run(self) -> None:
        last = None
        while not self._stop.wait(self.every):
            try:
                snap = ray.get(self.stats_actor.snapshot.remote(), timeout=self.every)
            except Exception:  # progress is best effort: never let it disturb the job
                continue
            line = "  ".join(f"{k}: {v['docs_in']}->{v['docs_out']}" for k, v in sorted(snap.items()))
            if line and line != last:
                self.say(f"progress  {line}")
                last = line
