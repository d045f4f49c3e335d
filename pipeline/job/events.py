"""Typed events a job emits: what the CLI renders and the control plane stores and streams.

Every event is a small frozen dataclass with a ``type`` string; :func:`to_dict` / :func:`from_dict`
give the JSON form (``{"type": ..., "ts": ..., **fields}``) that goes to ``events.jsonl`` in the
job's work folder and, later, over server-sent events. Events are facts, not text: a renderer
decides how to show them, and :class:`pipeline.job.fold.JobSummary` folds them into a job's figures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, dataclass_transform

#: phases in the order a job runs them
PHASES = ("curate", "tokenizer", "write", "finalize")
Phase = Literal["curate", "tokenizer", "write", "finalize"]
#: why a job failed: bad spec, bad input, a bug or a refused state, the machine or cluster, a cancel
FailureCategory = Literal["validation", "input", "app", "infra", "cancelled"]
#: every stage's running counters, ``{stage: {docs_in, docs_out, dropped, bytes_in, ...}}``: JSON values of
#: several shapes (counts, a dict of drops per reason, score summaries), so a reader checks what it takes
Stages = dict[str, dict[str, object]]


@dataclass_transform(frozen_default=True, kw_only_default=False, field_specifiers=(field,))
class _EventBase:
    """Makes every subclass a frozen dataclass with its ``type`` given in the class statement
    (``class ShardWritten(Event, type="shard_written")``): one line per event says what it is."""

    type: ClassVar[str] = "event"

    def __init_subclass__(cls, type: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if type is not None:
            cls.type = type
        dataclass(frozen=True)(cls)


class Event(_EventBase):
    ts: float = field(default_factory=time.time, kw_only=True)


#: seconds a job has to start or join Ray (``ray_starting`` to ``ray_started``), else it fails ``infra``: a healthy
#: start takes seconds (a local node on a loaded 2-core machine, under 30); an address that accepts and never
#: answers would hold ``ray.init`` for minutes. ``tokenmill run/serve --ray-start-timeout-s``
RAY_START_TIMEOUT_S = 120.0


class RayStarting(Event, type="ray_starting"):
    """The job starts its Ray (a local node takes seconds) or joins a cluster: the wait before ``job_started``."""

    #: ``local`` for a new local node, else the cluster's address (the spec's or RAY_ADDRESS, or the Ray this
    #: process already runs)
    address: str
    #: CPUs asked of a local node (None: every CPU of the machine, or a cluster's own)
    num_cpus: int | None = None


class RayStarted(Event, type="ray_started"):
    """Ray is up: how long it took and what it offers."""

    seconds: float
    #: CPUs Ray reports (the whole cluster's)
    cpus: int
    #: its GCS address
    address: str
    #: the dashboard's URL when it runs one (a local node does not)
    dashboard: str | None = None
    #: True when this job started it (and stops it at the end), False when it joined a running one
    own: bool = True


class JobStarted(Event, type="job_started"):
    job: str
    #: :meth:`pipeline.spec.JobSpec.content_hash` of the spec it runs
    spec_hash: str
    output: str
    #: Ray workers (the spec's ``execution.parallelism`` or what the cluster gives)
    parallelism: int
    #: phases already finished by an earlier attempt (a resume), in order
    resumed_phases: tuple[str, ...] = ()
    #: the curation stages' counter keys in spec order (``01-normalize``, ...): a display knows a stage that has
    #: not reported yet, so documents still ahead of it are not counted as done
    stages: tuple[str, ...] = ()


class PhaseChanged(Event, type="phase"):
    phase: Phase
    state: Literal["started", "finished", "skipped"]
    seconds: float = 0.0


class PhaseProgress(Event, type="progress"):
    """Work done in a phase so far (``total`` None when unknown): renderers derive rates and ETAs."""

    phase: Phase
    done: int
    total: int | None
    unit: str


class StageCounters(Event, type="stage_counters"):
    """Running counters of every stage: ``{stage: {docs_in, docs_out, dropped, bytes_in, ...}}``."""

    stages: Stages


class ShardWritten(Event, type="shard_written"):
    """A shard of the output is in place (written now, or kept from an earlier attempt)."""

    #: path inside the output, ``shards/shard-000003.tar``
    name: str
    sha256: str
    #: packed sequences in it, and their tokens
    samples: int
    tokens: int
    #: who wrote it: ``host:pid`` of the Ray worker process
    writer: str
    #: True when an earlier attempt wrote it and this one kept it as it was
    reused: bool = False


class JobFinished(Event, type="job_finished"):
    """The output is published: its totals, the same as its ``stats.json``."""

    output: str
    shards: int
    samples: int
    tokens: int
    #: curated documents (those the stages kept)
    documents: int
    #: the whole job, every phase
    seconds: float


class JobFailed(Event, type="job_failed"):
    """The job stopped without an output; ``category`` says whose the fault is (:data:`FailureCategory`)."""

    category: FailureCategory
    message: str
    #: the phase it stopped in (None before the first)
    phase: str | None = None


class LogLine(Event, type="log"):
    """A line meant for a person (a warning, a note on what was reused)."""

    level: Literal["info", "warning", "error"]
    message: str


class StateChanged(Event, type="state"):
    """The control plane's lifecycle step of a job (``QUEUED``, ``RUNNING``, ``SUCCEEDED``, ...). The engine never
    emits it; the service stores and streams it beside the engine's events, so one parser reads them all."""

    state: str
    #: the attempt the job is on (0 before its first)
    attempt: int
    category: str | None = None
    message: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (RayStarting, RayStarted, JobStarted, PhaseChanged, PhaseProgress, StageCounters, ShardWritten,
                JobFinished, JobFailed, LogLine, StateChanged)
}


def to_dict(event: Event) -> dict[str, object]:
    data = dataclasses.asdict(event)
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    return {"type": event.type, **data}


def from_dict(data: Mapping[str, object]) -> Event:
    """The event a :func:`to_dict` dict came from (keys it does not know, such as the service's ``attempt``,
    are left out); ValueError for an unknown type, TypeError for a missing field."""
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown event type in {dict(data)!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    # JSON has no tuples: a list field (``resumed_phases``) comes back as the tuple the frozen event holds
    kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
    return cls(**kwargs)
