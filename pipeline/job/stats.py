"""Per-stage counters and the ``rejected/`` side output.

Workers report to one named Ray actor (:class:`StatsActor`); a :class:`StageRecorder` is the small,
picklable handle a stage carries into Ray tasks. Rejected documents are written by the worker that
dropped them, one JSONL file per batch, so no document is shipped to the driver.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import ray

from pipeline.documents import reject_row
from pipeline.stages.metrics import StageMetrics


@ray.remote(num_cpus=0)
class StatsActor:
    def __init__(self) -> None:
        self.stages: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.metrics: dict[str, StageMetrics] = {}

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
    ) -> None:
        if stage not in self.stages:
            self.order.append(stage)
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


@dataclass
class StageRecorder:
    """What a stage's Ray tasks use to count and to set documents aside."""

    stage: str
    actor: Any
    rejected_dir: str | None

    def counts(self, **kw: Any) -> None:
        ray.get(self.actor.add.remote(self.stage, **kw))

    def rejects(self, rows: list[dict[str, Any]]) -> None:
        """Write dropped documents as one JSONL file, each in the one rejected-record schema
        (:func:`pipeline.documents.reject_row`) with this stage's type name (``exact_dedup`` for the
        stage folder ``03-exact_dedup``), whatever shape the stage handed them in."""
        if not rows or not self.rejected_dir:
            return
        stage = re.sub(r"^[0-9]+-", "", self.stage)
        folder = os.path.join(self.rejected_dir, self.stage)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"part-{uuid.uuid4().hex}.jsonl")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for row in rows:
                row = reject_row(row, row.get("reason"), row.get("detail"), stage)
                f.write(json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n")
        os.replace(path + ".tmp", path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
