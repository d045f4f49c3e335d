"""A job's state in its work folder: what a rerun of the same spec may skip.

``state.json`` holds the spec hash and the record of each finished phase (rewritten atomically when a
phase ends); ``ranges.jsonl`` and ``shards.jsonl`` get one line per packed range and per written
shard, appended and fsynced by the driver as each task reports, so a crash loses at most the work
that was in flight. A torn last line (the crash came mid-write) is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE = "state.json"
RANGES = "ranges.jsonl"
SHARDS = "shards.jsonl"
EVENTS = "events.jsonl"
LOG = "job.log"
STATE_FORMAT = 1


class StateError(ValueError):
    """The work folder belongs to another spec, or cannot be read."""


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete records of an append-only log; a torn last line is dropped."""
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


class JsonlLog:
    """Append-only JSON lines, each fsynced before ``append`` returns."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._trim_torn_tail()
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the job

    def _trim_torn_tail(self) -> None:
        if not self.path.exists():
            return
        good = read_jsonl(self.path)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in good)
        if self.path.read_text(encoding="utf-8") != text:
            write_text_atomic(self.path, text)

    def append(self, record: dict[str, Any], sync: bool = True) -> None:
        self._f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        self._f.flush()
        if sync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class WorkState:
    """The work folder of one spec: finished phases and their records."""

    def __init__(self, work: Path, spec_hash: str):
        self.work = work
        self.spec_hash = spec_hash
        self.phases: dict[str, dict[str, Any]] = {}

    @classmethod
    def open(cls, work: Path, spec_hash: str) -> WorkState:
        """The state a rerun continues from; StateError when it belongs to another spec."""
        state = cls(work, spec_hash)
        path = work / STATE
        if not path.exists():
            return state
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StateError(f"cannot read {path}: {exc}") from None
        if data.get("spec_hash") != spec_hash:
            raise StateError(
                f"output.path: {work.parent.parent} holds an unfinished job of another spec "
                f"(spec hash {str(data.get('spec_hash'))[:12]}, this one {spec_hash[:12]}); rerun that spec to "
                "finish it, or pass --overwrite to start over"
            )
        if data.get("format") != STATE_FORMAT:
            raise StateError(f"{path}: unknown state format {data.get('format')!r}; pass --overwrite")
        state.phases = dict(data.get("phases") or {})
        return state

    def is_new(self) -> bool:
        return not (self.work / STATE).exists()

    def done(self, phase: str) -> dict[str, Any] | None:
        return self.phases.get(phase)

    def finish(self, phase: str, record: dict[str, Any]) -> None:
        self.phases[phase] = record
        self.save()

    def save(self) -> None:
        write_json_atomic(self.work / STATE,
                          {"format": STATE_FORMAT, "spec_hash": self.spec_hash, "phases": self.phases})
