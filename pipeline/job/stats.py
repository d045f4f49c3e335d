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
the same key, so a re-run overwrites it instead of adding a second copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
import ray

from pipeline import storage
from pipeline.documents import reject_row
from pipeline.stages.metrics import StageMetrics


class StageTotals:
    """What the stats actor holds: every stage's sums, each batch counted once (pure logic, no Ray)."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, Any]] = {}
        self.metrics: dict[str, StageMetrics] = {}
        #: per stage, the keys of the batches already counted
        self.seen: dict[str, set[str]] = {}
        #: per stage, how many reports repeated a batch already counted (and were ignored)
        self.repeats: Counter[str] = Counter()

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
    ) -> bool:
        """Add one report; returns False (and counts nothing) when ``key`` was counted before for this
        stage. A report without a key (one made outside any Ray task, e.g. on the driver) always adds."""
        if key is not None:
            seen = self.seen.setdefault(stage, set())
            if key in seen:
                self.repeats[stage] += 1
                return False
            seen.add(key)
        if stage not in self.stages:
            self.stages[stage] = {
                "docs_in": 0, "docs_out": 0, "dropped": Counter(), "bytes_in": 0, "bytes_out": 0,
                "seconds": 0.0,
            }
        s = self.stages[stage]
        s["docs_in"] += docs_in
        s["docs_out"] += docs_out
        s["dropped"].update(dropped or {})
        s["bytes_in"] += bytes_in
        s["bytes_out"] += bytes_out
        s["seconds"] += seconds
        if metrics:
            self.metrics.setdefault(stage, StageMetrics()).merge(metrics)
        return True

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every stage's counts; ``counters`` and ``scores`` (summaries) where the stage recorded any."""
        out = {}
        for k, v in self.stages.items():
            entry = {**v, "dropped": dict(sorted(v["dropped"].items())), "seconds": round(v["seconds"], 3)}
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


#: the Ray actor around :class:`StageTotals`; start it with :func:`start_stats_actor`
StatsActor = ray.remote(num_cpus=0)(StageTotals)


def start_stats_actor() -> Any:
    """A stats actor on this (the driver's) node: no CPU of its own, and it lives as long as the driver
    does rather than dying with a worker node and taking the counts of finished batches with it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        node = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a driver that cannot tell its node: anywhere will do
        return StatsActor.remote()
    return StatsActor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()


def batch_key(ords: Any) -> str:
    """A key for a batch of documents: a digest of its ``ord`` values (unique per document)."""
    import numpy as np

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
    actor: Any
    rejected_dir: str | None
    #: the curate attempt this recorder belongs to (its ``rejected/`` file names carry it)
    attempt: int = 1

    def counts(self, key: str | None = None, **kw: Any) -> None:
        """Report one batch's counts. ``key`` names the batch (see :func:`batch_key`); without one, the
        running Ray task names it (:func:`task_key`). A repeat of a key already counted is ignored."""
        if key is None:
            key = task_key(self.stage, "counts")
        ray.get(self.actor.add.remote(self.stage, key=key, **kw))

    def rejects(self, rows: list[dict[str, Any]], key: str | None = None) -> None:
        """Write dropped documents as one JSONL file, each in the one rejected-record schema
        (:func:`pipeline.documents.reject_row`) with this stage's type name (``exact_dedup`` for the
        stage folder ``03-exact_dedup``), whatever shape the stage handed them in. The file is named by
        the batch's key (as :meth:`counts`), so the same batch written twice is one file."""
        if not rows or not self.rejected_dir:
            return
        if key is None:
            key = task_key(self.stage, "rejects")
        stage = re.sub(r"^[0-9]+-", "", self.stage)
        name = hashlib.blake2b(key.encode(), digest_size=16).hexdigest() if key else uuid.uuid4().hex
        # orjson: dropped duplicates carry their whole text, and json.dumps took seconds on a batch of them
        data = b"".join(_reject_line(reject_row(row, row.get("reason"), row.get("detail"), stage)) for row in rows)
        path = storage.join(self.rejected_dir, self.stage, f"{reject_file_tag(self.attempt)}{name}.jsonl")
        if storage.is_remote(path):
            storage.write_bytes(path, data)  # one whole-object PUT
            return
        # locally a rename without fsync: a job that crashes redoes its curate phase, rejected/ with it
        path = storage.local_path(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def _reject_line(row: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(row, default=_jsonable, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an int over 64 bits in a detail: json writes it
        return (json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n").encode("utf-8")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
