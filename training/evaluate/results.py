"""Per-item results and what a task reports over a set of them (all items, or the clean ones)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Metric = Literal["bpb", "accuracy"]


@dataclass(frozen=True)
class ItemResult:
    """One scored item: a choice item's verdicts, or an item's target NLL (nats) and bytes."""

    benchmark: str
    id: str
    correct: bool = False
    #: the choice of the highest log-likelihood per byte was the right one
    correct_norm: bool = False
    nll: float = 0.0
    bytes: int = 0


def summarize(metric: Metric, items: Sequence[ItemResult]) -> dict[str, Any]:
    """``value`` and ``items`` over ``items``: accuracy (and ``acc_norm``), or bits per byte over all their bytes
    together (``bytes``); ``value`` is None over no item (or no byte)."""
    n = len(items)
    if metric == "accuracy":
        return {"value": sum(i.correct for i in items) / n if n else None, "items": n,
                "acc_norm": sum(i.correct_norm for i in items) / n if n else None}
    nbytes = sum(i.bytes for i in items)
    value = sum(i.nll for i in items) / math.log(2) / nbytes if nbytes else None
    return {"value": value, "items": n, "bytes": nbytes}
