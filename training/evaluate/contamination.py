"""The benchmark items a job found in its data, from its ``stats.json``, and a task's items split by them.

The decontaminate stage counts every (document, item) match as ``item:<benchmark>:<item id>`` in its stage
record's ``counters`` (what the dataset card lists as the items found); an item found by any decontaminate stage
of the job is ``found``, every other item of the task is ``clean``. Ids are the stage's own
(:mod:`training.evaluate.bench` names items the same way), so the same file gives the same ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pipeline import storage
from training.evaluate.results import ItemResult
from training.evaluate.scorer import EvalError

STAGE = "decontaminate"
ITEM = "item:"


def _stats(job: str) -> dict[str, Any]:
    path = storage.join(job, "stats.json")
    try:
        data = json.loads(storage.read_text(path))
    except FileNotFoundError:
        raise EvalError(f"--job {job}: no stats.json (not a finished tokenmill output)") from None
    except (OSError, ValueError) as exc:
        raise EvalError(f"--job {job}: cannot read stats.json: {exc}") from None
    if not isinstance(data, dict):
        raise EvalError(f"--job {job}: stats.json is not a JSON object")
    return data


def found_items(job: str) -> set[tuple[str, str]]:
    """``(benchmark, item id)`` of every item the job's decontaminate stages found."""
    stages = [s for s in _stats(job).get("stages") or []
              if isinstance(s, dict) and re.sub(r"^[0-9]+-", "", str(s.get("stage", ""))) == STAGE]
    if not stages:
        raise EvalError(f"--job {job}: its stats.json has no {STAGE} stage: the job did not look for benchmark items")
    found = set()
    for stage in stages:
        for key in stage.get("counters") or {}:
            if key.startswith(ITEM):
                bench, _, item = key[len(ITEM):].partition(":")
                found.add((bench, item))
    return found


def split(results: Sequence[ItemResult], found: set[tuple[str, str]]) -> tuple[list[ItemResult], list[ItemResult]]:
    """(clean, found): the results of items the job did not find, and of those it found."""
    clean = [r for r in results if (r.benchmark, r.id) not in found]
    hit = [r for r in results if (r.benchmark, r.id) in found]
    return clean, hit
