"""Per-stage counters and the ``rejected/`` side output.

Workers report to one Ray actor (:class:`StatsActor`, pinned to the driver's node so it does not die
with a worker node); a :class:`StageRecorder` is the small, picklable handle a stage carries into Ray
tasks. Rejected documents are written by the worker that dropped them, one JSONL file per batch, so no
document is shipped to the driver.

**Counting is idempotent.** Ray re-runs work lost with a node: a task or actor task is retried, and a
block lost from the object store is rebuilt by re-running the tasks that made it. Each re-run reports
its batch again. Every report therefore carries a key naming the batch it counts (the batch's
documents, else the Ray task and the report's position in it, both the same in every re-run); the
first report of a key counts and a repeat is ignored, and the batch's ``rejected/`` file is named by
the same key, so a re-run overwrites it instead of adding a second copy. That file is written with
:func:`pipeline.storage.write_bytes` (the one atomic write), so a reader never sees half of it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline import storage
from pipeline.documents import reject_row
from pipeline.stages.metrics import StageMetrics

#: a document or rejected row as the stages hand it over: a JSON-like record of any field types
Row = dict[str, Any]
#: one stage's report of one batch: ``(stage key, keyword arguments of StageTotals.add)``
Report = tuple[str, dict[str, Any]]
#: the stats actor's handle: Ray's types cannot express a call of an actor's method (``actor.add.remote``)
StatsHandle = Any


@dataclass
class StageSums:
    """One stage's counts, summed over the batches it reported."""

    docs_in: int = 0
    docs_out: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        """The shape ``stats.json`` has always had (dropped reasons sorted, seconds to the millisecond)."""
        return {"docs_in": self.docs_in, "docs_out": self.docs_out, "dropped": dict(sorted(self.dropped.items())),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "seconds": round(self.seconds, 3)}


class StageTotals:
    """What the stats actor holds: every stage's sums, each batch counted once (pure logic, no Ray)."""

    def __init__(self) -> None:
        self.stages: dict[str, StageSums] = {}
        self.metrics: dict[str, StageMetrics] = {}
        #: per stage, the keys of the batches already counted
        self.seen: dict[str, set[str]] = {}
        #: per stage, how many reports repeated a batch already counted (and were ignored)
        self.repeats: Counter[str] = Counter()
        #: seconds of the phase's own steps outside every stage (``write_parts``), each batch counted once
        self.overhead: dict[str, float] = {}
        #: wall clock of the last report (when the last batch or task that reported ended, or a worker started), or
        #: of the end of the last driver gap counted (:meth:`driver_gap`), whichever is later
        self.last_report = 0.0
        #: when some task of the phase was running, or a driver gap was counted: (start, end) wall-clock intervals
        self.busy = Timeline()
        #: the latest end of a worker's wait for its start (``start_workers``): from then on every worker has started
        self.all_started = 0.0

    def add(
        self,
        stage: str,
        docs_in: int = 0,
        docs_out: int = 0,
        dropped: dict[str, int] | None = None,
        bytes_in: int = 0,
        bytes_out: int = 0,
        seconds: float = 0.0,
        metrics: StageMetrics | None = None,
        key: str | None = None,
        at: float | None = None,
    ) -> bool:
        """Add one report; returns False (and counts nothing) when ``key`` was counted before for this
        stage. A report without a key (one made outside any Ray task, e.g. on the driver) always adds. ``at``: when
        the reported work ended (wall clock), so that its ``seconds`` before it count as a busy interval."""
        if at is not None and seconds > 0:
            self.busy.add(at - seconds, at)  # a repeat's work ran too, though its counts are not counted again
        if key is not None:
            seen = self.seen.setdefault(stage, set())
            if key in seen:
                self.repeats[stage] += 1
                return False
            seen.add(key)
        self.last_report = time.time()
        s = self.stages.setdefault(stage, StageSums())
        s.docs_in += docs_in
        s.docs_out += docs_out
        s.dropped.update(dropped or {})
        s.bytes_in += bytes_in
        s.bytes_out += bytes_out
        s.seconds += seconds
        if metrics:
            self.metrics.setdefault(stage, StageMetrics()).merge(metrics)
        return True

    def add_many(self, reports: list[Report]) -> None:
        """Several reports in one call, each ``(stage, keyword arguments of add)`` and counted as :meth:`add`
        counts it: a chain of stages reports a batch once for all its stages, not once per stage."""
        for stage, kwargs in reports:
            self.add(stage, **kwargs)

    def add_overhead(self, step: str, seconds: float, key: str, at: float | None = None) -> None:
        """Seconds of a step of the phase that belongs to no stage; a repeat of ``key`` is ignored. ``at``: as in
        :meth:`add` for a step a worker was busy with; a worker's wait for its start (``start_workers``) is no
        busy time, and the latest one's end is where :meth:`overheads` starts to look for ``between_tasks``."""
        self.last_report = time.time()
        seen = self.seen.setdefault(f"overhead:{step}", set())
        if key not in seen:
            seen.add(key)
            self.overhead[step] = self.overhead.get(step, 0.0) + seconds
            if at is not None and step == "start_workers":
                self.all_started = max(self.all_started, at)
            elif at is not None and seconds > 0:
                self.busy.add(at - seconds, at)

    def driver_gap(self, step: str, workers: int) -> None:
        """The driver says every task so far has ended and it has started none since: the seconds from the last
        report (or the last gap) to now, times ``workers``, are ``overhead`` ``step``: workers waiting for it."""
        now = time.time()
        if self.last_report:
            self.overhead[step] = self.overhead.get(step, 0.0) + max(0.0, now - self.last_report) * workers
            self.busy.add(self.last_report, now)  # counted here: not again in between_tasks
        self.last_report = now

    def overheads(self, workers: int | None = None) -> dict[str, float]:
        """Every overhead step's seconds. With ``workers`` (the phase's), also ``between_tasks``: the stretches,
        from the moment every worker had started to the last report, when no task of the phase ran anywhere and no
        driver gap was counted (Ray Data starting an operator, the driver between a dedup stage's rounds), times
        ``workers``: what every worker waited then."""
        out = dict(self.overhead)
        if workers:
            out["between_tasks"] = self.busy.gaps(self.all_started) * workers
        return {k: round(v, 3) for k, v in sorted(out.items())}

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Every stage's counts; ``counters`` and ``scores`` (summaries) where the stage recorded any."""
        out = {}
        for k, v in self.stages.items():
            entry = v.to_json()
            m = self.metrics.get(k)
            if m and m.counters:
                entry["counters"] = dict(sorted(m.counters.items()))
            if m and m.scores:
                entry["scores"] = {name: m.scores[name].summary() for name in sorted(m.scores)}
            out[k] = entry
        return out

    def repeated(self) -> dict[str, int]:
        """Per stage, the reports ignored as repeats of a batch already counted (work Ray re-ran)."""
        return dict(sorted(self.repeats.items()))


class Timeline:
    """A union of wall-clock intervals, merged as it grows (memory stays small however many reports come)."""

    MERGE_AT = 50_000

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []
        self._merged = 0  # how many of the spans, from the start, are merged already

    def add(self, start: float, end: float) -> None:
        if end > start:
            self._spans.append((start, end))
            if len(self._spans) - self._merged > self.MERGE_AT:
                self._merge()

    def _merge(self) -> None:
        out: list[tuple[float, float]] = []
        for a, b in sorted(self._spans):
            if out and a <= out[-1][1]:
                if b > out[-1][1]:
                    out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        self._spans, self._merged = out, len(out)

    def gaps(self, since: float = 0.0) -> float:
        """Seconds from ``since`` (or the first interval's start, whichever is later) to the last interval's end
        that no interval covers."""
        self._merge()
        total, covered_to = 0.0, None
        for a, b in self._spans:
            if covered_to is None:
                covered_to = max(a, since)
            elif a > covered_to:
                total += a - covered_to
            covered_to = max(covered_to, b)
        return total


#: the Ray actor around :class:`StageTotals`; start it with :func:`start_stats_actor`
StatsActor = ray.remote(num_cpus=0)(StageTotals)


def start_stats_actor() -> StatsHandle:
    """A stats actor on this (the driver's) node: no CPU of its own, and it lives as long as the driver
    does rather than dying with a worker node and taking the counts of finished batches with it."""
    try:
        node = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a driver that cannot tell its node: anywhere will do
        return StatsActor.remote()
    return StatsActor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()


def batch_key(ords: npt.ArrayLike) -> str:
    """A key for a batch of documents: a digest of its ``ord`` values (unique per document)."""
    data = np.ascontiguousarray(np.asarray(ords, dtype=np.int64)).tobytes()
    return "ords:" + hashlib.blake2b(data, digest_size=12).hexdigest()


#: per (task, stage, kind), the reports made so far in this process (a few recent tasks only)
_SEQ: OrderedDict[tuple[str, str, str], int] = OrderedDict()
_SEQ_KEEP = 4096


def task_key(stage: str, kind: str) -> str | None:
    """``task:<Ray task id>:<n>``: the n-th report of this kind for ``stage`` in the running Ray task;
    a retried or re-executed task has the same id and makes its reports in the same order. None outside
    a Ray task (the driver, a test without Ray)."""
    worker = ray._private.worker.global_worker
    if not ray.is_initialized() or worker.mode != ray._private.worker.WORKER_MODE:
        return None
    task = ray.get_runtime_context().get_task_id()
    if not task:
        return None
    k = (task, stage, kind)
    n = _SEQ.pop(k, 0)
    _SEQ[k] = n + 1
    while len(_SEQ) > _SEQ_KEEP:
        _SEQ.popitem(last=False)
    return f"task:{task}:{n}"


def reject_file_tag(attempt: int) -> str:
    """How the names of the ``rejected/`` files of curate attempt ``attempt`` start."""
    return f"part-a{attempt}-"


@dataclass
class StageRecorder:
    """What a stage's Ray tasks use to count and to set documents aside."""

    stage: str
    actor: StatsHandle
    rejected_dir: str | None
    #: the curate attempt this recorder belongs to (its ``rejected/`` file names carry it)
    attempt: int = 1
    #: when the phase started (wall clock): a worker process started after it counts its start
    #: (:func:`pipeline.worker_start.process_start_seconds`) in the seconds of the first stage that runs in it
    phase_started: float | None = None
    #: the phase's workers (``execution.parallelism``): the worker-seconds a wait of every worker costs
    parallelism: int = 1
    #: ``output.rejected_sample``: the share of drops :meth:`rejects` writes (:func:`in_reject_sample`)
    sample: float = 1.0

    def waited_for_workers(self, step: str, actor_id: str, counted: float) -> None:
        """In a worker's constructor: the seconds from the phase's start to this worker's start, less its process's
        start (``counted`` in the stage already): Ray Data's planning and placement, the driver's ``prepare``
        steps, while no worker has work. Counted once per actor, as ``overhead`` ``step``."""
        if self.phase_started is None:
            return
        now = time.time()
        waited = now - self.phase_started - counted
        if waited > 0:
            ray.get(self.actor.add_overhead.remote(step, waited, f"{step}:{actor_id}", at=now - counted))

    def driver_gap(self, step: str) -> None:
        """On the driver, at a point where every task before it has ended and none after it has started (a
        dataset just materialized, a barrier passed): the seconds since the last batch or task reported, times
        the phase's workers, count as ``overhead`` ``step`` (:meth:`StageTotals.driver_gap`)."""
        ray.get(self.actor.driver_gap.remote(step, self.parallelism))

    def counts(self, key: str | None = None, *, docs_in: int = 0, docs_out: int = 0,
               dropped: dict[str, int] | None = None, bytes_in: int = 0, bytes_out: int = 0, seconds: float = 0.0,
               metrics: StageMetrics | None = None) -> None:
        """Report one batch's counts (:meth:`StageTotals.add`). ``key`` names the batch (see :func:`batch_key`);
        without one, the running Ray task names it (:func:`task_key`). A repeat of a key already counted is
        ignored."""
        stage, kwargs = self.report(key, docs_in=docs_in, docs_out=docs_out, dropped=dropped, bytes_in=bytes_in,
                                    bytes_out=bytes_out, seconds=seconds, metrics=metrics)
        ray.get(self.actor.add.remote(stage, **kwargs))

    def report(self, key: str | None = None, **counts: Any) -> Report:
        """One batch's counts as :meth:`counts` would send them, to send later with others (:func:`send_reports`:
        one call to the stats actor for every stage a batch went through)."""
        if key is None:
            key = task_key(self.stage, "counts")
        return self.stage, {**counts, "key": key, "at": time.time()}

    def rejects(self, rows: list[Row], key: str | None = None, *, sampled: bool = True) -> None:
        """Write dropped documents as one JSONL file, each in the one rejected-record schema
        (:func:`pipeline.documents.reject_row`) with this stage's type name (``exact_dedup`` for the
        stage folder ``03-exact_dedup``), whatever shape the stage handed them in. The file is named by
        the batch's key (as :meth:`counts`), so the same batch written twice is one file. With a
        :attr:`sample` below 1, only the rows whose id is in the sample are written, unless not ``sampled``
        (the reader's malformed records: always written)."""
        if not self.rejected_dir:  # write_rejected: false: nothing to hash or write
            return
        if sampled and self.sample < 1.0:
            rows = [row for row in rows if in_reject_sample(row.get("id"), self.sample)]
        if not rows:
            return
        if key is None:
            key = task_key(self.stage, "rejects")
        stage = re.sub(r"^[0-9]+-", "", self.stage)
        name = hashlib.blake2b(key.encode(), digest_size=16).hexdigest() if key else uuid.uuid4().hex
        # orjson: dropped duplicates carry their whole text, and json.dumps took seconds on a batch of them
        # a row always carries its reason: a stage's drop, or reject_row's own output
        data = b"".join(_reject_line(reject_row(row, cast(str, row.get("reason")), row.get("detail"), stage))
                        for row in rows)
        path = storage.join(self.rejected_dir, self.stage, f"{reject_file_tag(self.attempt)}{name}.jsonl")
        storage.write_bytes(path, data)


def in_reject_sample(doc_id: object, share: float) -> bool:
    """Whether ``output.rejected_sample`` = ``share`` writes the drop of document ``doc_id``: a hash of the id,
    so the choice is the same on every run, at any parallelism and batch size, and ``share`` 0.01 keeps a
    subset of what 0.1 keeps."""
    digest = hashlib.blake2b(str(doc_id).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < share * 2.0**64


def send_reports(actor: StatsHandle, reports: list[Report]) -> None:
    """Count ``reports`` (:meth:`StageRecorder.report`) in one call to the stats actor; each is still counted, or
    ignored as a repeat, on its own key."""
    if reports:
        ray.get(actor.add_many.remote(reports))


def _reject_line(row: Row) -> bytes:
    try:
        return orjson.dumps(row, default=_jsonable, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an int over 64 bits in a detail: json writes it
        return (json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n").encode("utf-8")


def _jsonable(value: object) -> object:
    """What orjson and json cannot write themselves: numpy values as lists/numbers, bytes as text, else str."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
