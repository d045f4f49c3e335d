"""A job's state in its work folder: what a rerun of the same spec may skip.

``state.json`` holds the spec hash and the record of each finished phase (rewritten atomically when a
phase ends); ``ranges.jsonl`` and ``shards.jsonl`` get one line per packed range and per written
shard, appended and fsynced by the driver as each task reports, so a crash loses at most the work
that was in flight. A torn last line (the crash came mid-write) is ignored.

Only JSON lives here: the phases' typed records (:mod:`pipeline.job.records`) are turned into JSON and
back at these points alone.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO

from pipeline import storage

STATE = "state.json"
RANGES = "ranges.jsonl"
SHARDS = "shards.jsonl"
EVENTS = "events.jsonl"
LOG = "job.log"
STATE_FORMAT = 1

#: a JSON object as saved and read back (values of every JSON shape)
JsonObject = dict[str, Any]


class StateError(ValueError):
    """The work folder belongs to another spec, or cannot be read."""


def write_json_atomic(path: str, data: object) -> None:
    storage.write_bytes(os.fspath(path), json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))


def read_jsonl(path: str) -> list[JsonObject]:
    """Complete records of an append-only log; a torn last line is dropped."""
    try:
        text = storage.read_text(os.fspath(path))
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


class JsonlLog:
    """Append-only JSON lines. Locally each line is fsynced before ``append`` returns (``sync``). An object
    store cannot append: the whole log is rewritten, at once for a ``sync`` record (a range or a shard, a
    few hundred per job) and at most every ``REMOTE_FLUSH_S`` for the rest (progress events), and on close."""

    REMOTE_FLUSH_S = 5.0

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._remote = storage.is_remote(self.path)
        self._lines: list[str] = []
        self._flushed = 0.0
        self._f: TextIO | None = None
        if self._remote:
            self._lines = [json.dumps(r, sort_keys=True) + "\n" for r in read_jsonl(self.path)]
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._trim_torn_tail()
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the job

    def _trim_torn_tail(self) -> None:
        if not os.path.exists(self.path):
            return
        good = read_jsonl(self.path)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in good)
        with open(self.path, encoding="utf-8") as f:
            if f.read() != text:
                write_text_atomic(self.path, text)

    def append(self, record: JsonObject, sync: bool = True) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        if self._f is None:  # an object store
            self._lines.append(line)
            if sync or time.monotonic() - self._flushed >= self.REMOTE_FLUSH_S:
                self._flush_remote()
            return
        self._f.write(line)
        self._f.flush()
        if sync:
            os.fsync(self._f.fileno())

    def _flush_remote(self) -> None:
        storage.write_text(self.path, "".join(self._lines))
        self._flushed = time.monotonic()

    def close(self) -> None:
        if self._f is None:
            self._flush_remote()
        else:
            self._f.close()


def write_text_atomic(path: str, text: str) -> None:
    storage.write_text(os.fspath(path), text)


def clear(work: str) -> None:
    """Empty the work folder (a new job, or one that has been committed)."""
    storage.rmtree(work)
    storage.makedirs(work)


class WorkState:
    """The work folder of one spec: finished phases, each with its record (JSON) and its seconds."""

    def __init__(self, work: str, spec_hash: str):
        self.work = os.fspath(work)
        self.spec_hash = spec_hash
        self.phases: dict[str, JsonObject] = {}

    @classmethod
    def open(cls, work: str, spec_hash: str) -> WorkState:
        """The state a rerun continues from; StateError when it belongs to another spec."""
        state = cls(work, spec_hash)
        path = storage.join(state.work, STATE)
        try:
            data = json.loads(storage.read_text(path))
        except FileNotFoundError:
            return state
        except (OSError, json.JSONDecodeError) as exc:
            raise StateError(f"cannot read {path}: {exc}") from None
        if data.get("spec_hash") != spec_hash:
            raise StateError(
                f"output.path: {storage.parent(storage.parent(state.work))} holds an unfinished job of another spec "
                f"(spec hash {str(data.get('spec_hash'))[:12]}, this one {spec_hash[:12]}); rerun that spec to "
                "finish it, or pass --overwrite to start over"
            )
        if data.get("format") != STATE_FORMAT:
            raise StateError(f"{path}: unknown state format {data.get('format')!r}; pass --overwrite")
        state.phases = dict(data.get("phases") or {})
        return state

    @classmethod
    def for_job(cls, work: str, spec_hash: str, overwrite: bool) -> WorkState:
        """The work folder's state for a job's spec, saved: a rerun continues it; another spec's is refused
        (StateError) or, with ``overwrite``, removed."""
        try:
            state = cls.open(work, spec_hash)
        except StateError:
            if not overwrite:
                raise
            storage.rmtree(work)
            state = cls.open(work, spec_hash)
        if state.is_new():
            clear(work)
            state.save()
        return state

    def is_new(self) -> bool:
        return not storage.exists(storage.join(self.work, STATE))

    def done(self, phase: str) -> JsonObject | None:
        """The record ``phase`` finished with (its ``seconds`` included), or None if it has not."""
        return self.phases.get(phase)

    def seconds(self, phase: str) -> float:
        """How long a finished phase took (0 for one that has not finished)."""
        return float((self.phases.get(phase) or {}).get("seconds", 0.0))

    def finish(self, phase: str, record: JsonObject, seconds: float) -> None:
        self.phases[phase] = {**record, "seconds": seconds}
        self.save()

    def save(self) -> None:
        write_json_atomic(storage.join(self.work, STATE),
                          {"format": STATE_FORMAT, "spec_hash": self.spec_hash, "phases": self.phases})
