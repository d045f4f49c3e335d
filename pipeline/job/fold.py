"""One fold of a job's events into its figures: what the CLI's progress display and ``GET /v1/jobs/{id}`` show.

:class:`JobSummary` takes the typed events of :mod:`pipeline.job.events` one at a time (:meth:`JobSummary.apply`
dispatches on the event's class). It is a pure function of the events: every rate comes from their timestamps,
never from a clock, so the CLI, the service and a test replaying a recorded ``events.jsonl`` get the same
figures. Each ``job_started`` begins a new attempt's figures (a resumed attempt re-reports the shards it keeps,
with ``reused``); only the attempt number and its Ray's figures carry over. While the job starts its Ray
(``ray_starting``, before ``job_started``) ``phase`` is ``ray``: what a display shows as "starting Ray".

:meth:`JobSummary.to_dict` is the JSON the service stores as a job's summary (the API's job detail is made
from it) and :meth:`JobSummary.from_dict` reads it back, so the supervisor folds each new chunk of events into
the stored figures without reading the old events again. Until an attempt's ``job_started`` the dict holds only
the attempt (its Ray, its phase ``ray``, and a failure, for a job refused before it started).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from pipeline.job import events as ev

#: points kept per throughput series; past that every other point is dropped (the whole span, coarser)
SERIES_POINTS = 200


@dataclass
class PhaseFigures:
    state: str  # started | finished | skipped
    seconds: float = 0.0
    #: event time of the phase's start (None for a phase skipped, or finished without a start this attempt)
    started_ts: float | None = None


@dataclass
class ProgressFigures:
    done: int
    total: int | None
    unit: str
    #: units per second since the phase started
    per_s: float | None = None


@dataclass
class ShardCounts:
    written: int = 0
    #: kept from an earlier attempt, not recomputed
    reused: int = 0
    #: known once the job has finished
    total: int | None = None


@dataclass
class Throughput:
    #: documents read per second of curate so far (the job's ``stats.json`` figure once it has finished)
    docs_per_s: float | None = None
    #: tokens of the shards this attempt wrote per second of the write phase so far
    tokens_per_s: float | None = None


@dataclass
class Failure:
    category: str
    message: str | None = None
    phase: str | None = None


@dataclass
class RayFigures:
    """The attempt's Ray: ``starting`` from ``ray_starting``, ``ready`` from ``ray_started``."""

    state: str
    #: ``local`` or the cluster's address while starting; its GCS address once ready
    address: str
    #: CPUs asked of a local node (None: every CPU, or a cluster's own)
    num_cpus: int | None = None
    #: CPUs Ray reports, once ready
    cpus: int | None = None
    seconds: float | None = None
    dashboard: str | None = None
    own: bool | None = None
    #: event time of ``ray_starting``
    started_ts: float | None = None


@dataclass
class Series:
    """Cumulative figures over time as ``(seconds since the attempt started, total so far)`` points: documents
    read in curate, tokens of the shards this attempt wrote. A chart draws rates between consecutive points."""

    docs: list[tuple[float, int]] = field(default_factory=list)
    tokens: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class JobSummary:
    """What the events have said so far about one job's latest attempt."""

    attempt: int | None = None
    #: event time of the attempt's ``job_started`` (None before it)
    started_ts: float | None = None
    #: the phase started last (None once the job has finished)
    phase: str | None = None
    phases: dict[str, PhaseFigures] = field(default_factory=dict)
    progress: dict[str, ProgressFigures] = field(default_factory=dict)
    stages: ev.Stages = field(default_factory=dict)
    shards: ShardCounts = field(default_factory=ShardCounts)
    samples: int = 0
    tokens: int = 0
    documents: int | None = None
    throughput: Throughput = field(default_factory=Throughput)
    #: seconds per finished or skipped phase, and ``total`` once the job has finished
    seconds: dict[str, float] = field(default_factory=dict)
    #: phases an earlier attempt finished (this one skips them)
    resumed_phases: list[str] = field(default_factory=list)
    parallelism: int | None = None
    #: tokens of the shards this attempt wrote (not those kept from an earlier one): for tokens/s
    new_tokens: int = 0
    error: Failure | None = None
    #: ``host:pid`` of every process that wrote a shard
    writers: set[str] = field(default_factory=set)
    series: Series = field(default_factory=Series)
    finished: bool = False
    ray: RayFigures | None = None

    # ---- the fold ------------------------------------------------------------------------------------------

    @functools.singledispatchmethod
    def apply(self, event: ev.Event) -> None:
        """Fold one event in. An event of no figure (a log line) changes nothing."""

    @apply.register
    def _started(self, event: ev.JobStarted) -> None:
        fresh = JobSummary(attempt=self.attempt, started_ts=event.ts, resumed_phases=list(event.resumed_phases),
                           parallelism=event.parallelism, ray=self.ray)
        for f in dataclasses.fields(self):  # in place: a display holds on to this object
            setattr(self, f.name, getattr(fresh, f.name))

    @apply.register
    def _ray_starting(self, event: ev.RayStarting) -> None:
        self.ray = RayFigures("starting", event.address, event.num_cpus, started_ts=event.ts)
        self.phase = "ray"

    @apply.register
    def _ray_started(self, event: ev.RayStarted) -> None:
        before = self.ray
        self.ray = RayFigures("ready", event.address, before.num_cpus if before else None, event.cpus, event.seconds,
                              event.dashboard, event.own, before.started_ts if before else None)
        if self.phase == "ray":
            self.phase = None

    @apply.register
    def _state(self, event: ev.StateChanged) -> None:
        self.attempt = event.attempt

    @apply.register
    def _phase(self, event: ev.PhaseChanged) -> None:
        before = self.phases.get(event.phase)
        started_ts = event.ts if event.state == "started" else before.started_ts if before else None
        self.phases[event.phase] = PhaseFigures(event.state, event.seconds, started_ts)
        if event.state == "started":
            self.phase = event.phase
        else:
            self.seconds[event.phase] = event.seconds

    @apply.register
    def _progress(self, event: ev.PhaseProgress) -> None:
        started = self.phase_started(event.phase)
        per_s = round(event.done / (event.ts - started), 1) if started is not None and event.ts > started else None
        self.progress[event.phase] = ProgressFigures(event.done, event.total, event.unit, per_s)
        if event.phase == "curate":
            self.throughput.docs_per_s = per_s
            self._point(self.series.docs, event.ts, event.done)

    @apply.register
    def _counters(self, event: ev.StageCounters) -> None:
        self.stages = dict(event.stages)

    @apply.register
    def _shard(self, event: ev.ShardWritten) -> None:
        self.samples += event.samples
        self.tokens += event.tokens
        if event.writer:
            self.writers.add(event.writer)
        if event.reused:
            self.shards.reused += 1
            return
        self.shards.written += 1
        self.new_tokens += event.tokens
        started = self.phase_started("write")
        if started is not None and event.ts > started:
            self.throughput.tokens_per_s = round(self.new_tokens / (event.ts - started), 1)
        self._point(self.series.tokens, event.ts, self.new_tokens)

    @apply.register
    def _finished(self, event: ev.JobFinished) -> None:
        self.phase = None
        self.finished = True
        self.shards.total = event.shards
        self.samples, self.tokens, self.documents = event.samples, event.tokens, event.documents
        self.seconds["total"] = event.seconds

    @apply.register
    def _failed(self, event: ev.JobFailed) -> None:
        self.error = Failure(event.category, event.message, event.phase)

    # ---- reading it ----------------------------------------------------------------------------------------

    def phase_started(self, phase: str) -> float | None:
        figures = self.phases.get(phase)
        return figures.started_ts if figures else None

    def _point(self, points: list[tuple[float, int]], ts: float, total: int) -> None:
        if self.started_ts is None:
            return
        points.append((round(ts - self.started_ts, 3), total))
        if len(points) > SERIES_POINTS:
            points[:] = [*points[:-1:2], points[-1]]

    def to_dict(self) -> dict[str, object]:
        """The JSON form: the figures once the attempt has started, the attempt (and a failure) before."""
        error = {"error": dataclasses.asdict(self.error)} if self.error else {}
        if self.started_ts is None:
            ray = {"ray": dataclasses.asdict(self.ray), "phase": self.phase} if self.ray else {}
            return {"attempt": self.attempt, **ray, **error}
        data = dataclasses.asdict(self)
        data["phases"] = {name: {k: v for k, v in p.items() if k != "started_ts" or v is not None}
                          for name, p in data["phases"].items()}
        data["series"] = {lane: [list(p) for p in points] for lane, points in data["series"].items()}
        data["writers"] = sorted(self.writers)
        del data["error"]
        return {**data, **error}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> JobSummary:
        """The summary a :meth:`to_dict` dict came from; ValueError for a dict that is not one."""
        return _ADAPTER.validate_python(dict(data))


_ADAPTER = TypeAdapter(JobSummary)
