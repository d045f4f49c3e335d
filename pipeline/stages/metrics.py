"""Stage-defined counters and per-document score summaries, mergeable across batches and workers.

A stage records into a :class:`StageMetrics` (``Stage.count`` / ``Stage.observe``); the batch runner
hands each batch's metrics to the stats actor, which merges them and summarises every score in
``stats.json``. No Ray here: stage modules import this at spec-validation time.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ddsketch import DDSketch

#: quantiles of every score summary: deciles plus the tails a threshold is usually picked from
QUANTILES = (0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99)
#: relative error of a reported quantile (DDSketch's guarantee); count, min, max and mean are exact
RELATIVE_ACCURACY = 0.01


class ScoreSketch:
    """Distribution of one score: exact count/min/max/sum plus a DDSketch for quantiles.

    DDSketch merges exactly (bin counts add up), so merging per-batch sketches from many workers in
    any order gives the same summary as one sketch over all values. ``add`` only appends: values reach the
    sketch in bulk, each distinct value once with its count (a filter observes a dozen scores per document,
    and one DDSketch insert per value was a tenth of a cheap filter's time; most scores repeat: 0.0, counts).
    """

    def __init__(self) -> None:
        self._count = 0
        self._min = math.inf
        self._max = -math.inf
        self._sum = 0.0
        self._sketch = DDSketch(RELATIVE_ACCURACY)
        self._pending: list[float] = []

    def add(self, value: float) -> None:
        """Record one value; NaN and infinities are ignored (they have no place in a quantile)."""
        self._pending.append(value)
        if len(self._pending) >= 8192:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        values = np.asarray(self._pending, dtype=np.float64)
        self._pending = []
        values = values[np.isfinite(values)]
        if not values.size:
            return
        self._count += int(values.size)
        self._sum += float(values.sum())
        self._min = min(self._min, float(values.min()))
        self._max = max(self._max, float(values.max()))
        distinct, counts = np.unique(values, return_counts=True)
        for value, n in zip(distinct.tolist(), counts.tolist(), strict=True):
            self._sketch.add(value, n)

    count = property(lambda self: self._flushed("_count"), doc="values recorded (finite ones)")
    min = property(lambda self: self._flushed("_min"))
    max = property(lambda self: self._flushed("_max"))
    sum = property(lambda self: self._flushed("_sum"))

    def _flushed(self, name: str) -> Any:
        self._flush()
        return getattr(self, name)

    def merge(self, other: ScoreSketch) -> None:
        if other.count == 0:
            return
        self._flush()
        self._count += other._count
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)
        self._sketch.merge(other._sketch)

    def __getstate__(self) -> dict[str, Any]:
        self._flush()  # a batch's metrics travel to the stats actor: send the sketch, not the values
        return self.__dict__

    def summary(self) -> dict[str, Any]:
        """``{count, min, max, mean, p01, p10, ..., p90, p99}``, quantiles clamped into [min, max]."""
        if self.count == 0:
            return {"count": 0}
        out: dict[str, Any] = {"count": self.count, "min": _num(self.min), "max": _num(self.max),
                               "mean": _num(self.sum / self.count)}
        for q in QUANTILES:
            value = min(max(self._sketch.get_quantile_value(q), self.min), self.max)
            out[f"p{round(q * 100):02d}"] = _num(value)
        return out


@dataclass
class StageMetrics:
    """What one stage recorded: named counters and one :class:`ScoreSketch` per score name."""

    counters: Counter[str] = field(default_factory=Counter)
    scores: dict[str, ScoreSketch] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def observe(self, name: str, value: float) -> None:
        sketch = self.scores.get(name)
        if sketch is None:
            sketch = self.scores[name] = ScoreSketch()
        sketch.add(value)

    def merge(self, other: StageMetrics) -> None:
        self.counters.update(other.counters)
        for name, sketch in other.scores.items():
            self.scores.setdefault(name, ScoreSketch()).merge(sketch)

    def __bool__(self) -> bool:
        return bool(self.counters) or bool(self.scores)


def _num(value: float) -> float | int:
    """Integral values as int (counts of characters stay readable); others to 6 significant digits."""
    if float(value).is_integer():
        return int(value)
    return float(f"{value:.6g}")
