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

from ddsketch import DDSketch

#: quantiles of every score summary: deciles plus the tails a threshold is usually picked from
QUANTILES = (0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99)
#: relative error of a reported quantile (DDSketch's guarantee); count, min, max and mean are exact
RELATIVE_ACCURACY = 0.01


class ScoreSketch:
    """Distribution of one score: exact count/min/max/sum plus a DDSketch for quantiles.

    DDSketch merges exactly (bin counts add up), so merging per-batch sketches from many workers in
    any order gives the same summary as one sketch over all values.
    """

    def __init__(self) -> None:
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.sum = 0.0
        self._sketch = DDSketch(RELATIVE_ACCURACY)

    def add(self, value: float) -> None:
        """Record one value; NaN and infinities are ignored (they have no place in a quantile)."""
        value = float(value)
        if not math.isfinite(value):
            return
        self.count += 1
        self.sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        self._sketch.add(value)

    def merge(self, other: ScoreSketch) -> None:
        if other.count == 0:
            return
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self._sketch.merge(other._sketch)

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
