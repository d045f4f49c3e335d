"""Typed events a job emits: what the CLI renders and the control plane stores and streams.

Every event is a small frozen dataclass with a ``type`` string; :func:`to_dict` / :func:`from_dict`
give the JSON form (``{"type": ..., "ts": ..., **fields}``) that goes to ``events.jsonl`` in the
job's work folder and, later, over server-sent events. Events are facts, not text: a renderer
decides how to show them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

#: phases in the order a job runs them
PHASES = ("curate", "tokenizer", "write", "finalize")
Phase = Literal["curate", "tokenizer", "write", "finalize"]
#: why a job failed: bad spec, bad input, a bug or a refused state, the machine or cluster, a cancel
FailureCategory = Literal["validation", "input", "app", "infra", "cancelled"]


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = "event"
    ts: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class JobStarted(Event):
    type: ClassVar[str] = "job_started"
    job: str
    spec_hash: str
    output: str
    parallelism: int
    #: phases already finished by an earlier attempt (a resume), in order
    resumed_phases: tuple[str, ...] = ()


@dataclass(frozen=True)
class PhaseChanged(Event):
    type: ClassVar[str] = "phase"
    phase: Phase
    state: Literal["started", "finished", "skipped"]
    seconds: float = 0.0


@dataclass(frozen=True)
class PhaseProgress(Event):
    """Work done in a phase so far (``total`` None when unknown): renderers derive rates and ETAs."""

    type: ClassVar[str] = "progress"
    phase: Phase
    done: int
    total: int | None
    unit: str


@dataclass(frozen=True)
class StageCounters(Event):
    """Running counters of every stage: ``{stage: {docs_in, docs_out, dropped, bytes_in, ...}}``."""

    type: ClassVar[str] = "stage_counters"
    stages: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class ShardWritten(Event):
    type: ClassVar[str] = "shard_written"
    name: str
    sha256: str
    samples: int
    tokens: int
    #: who wrote it: ``host:pid`` of the Ray worker process
    writer: str
    #: True when an earlier attempt wrote it and this one kept it as it was
    reused: bool = False


@dataclass(frozen=True)
class JobFinished(Event):
    type: ClassVar[str] = "job_finished"
    output: str
    shards: int
    samples: int
    tokens: int
    documents: int
    seconds: float


@dataclass(frozen=True)
class JobFailed(Event):
    type: ClassVar[str] = "job_failed"
    category: FailureCategory
    message: str
    phase: str | None = None


@dataclass(frozen=True)
class LogLine(Event):
    """A line meant for a person (a warning, a note on what was reused)."""

    type: ClassVar[str] = "log"
    level: Literal["info", "warning", "error"]
    message: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (JobStarted, PhaseChanged, PhaseProgress, StageCounters, ShardWritten, JobFinished, JobFailed,
                LogLine)
}


def to_dict(event: Event) -> dict[str, Any]:
    data = dataclasses.asdict(event)
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    return {"type": event.type, **data}


def from_dict(data: dict[str, Any]) -> Event:
    """The event a :func:`to_dict` dict came from; ValueError for an unknown type."""
    data = dict(data)
    cls = EVENT_TYPES.get(data.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown event type in {data!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: (tuple(v) if isinstance(v, list) and k == "resumed_phases" else v)
              for k, v in data.items() if k in names}
    return cls(**kwargs)
