"""``--tasks``: what each task names (``[NAME=]KIND:PATH``), and running one over its items.

Kinds: ``bpb`` (held-out text: :mod:`.heldout`), ``mmlu`` and ``truthfulqa`` (accuracy: :mod:`.choice`),
``gsm8k`` and ``humaneval`` (bits per byte of the reference answer: :mod:`.answer`). A task is reported under
its NAME, else its kind, else (two of a kind) ``KIND:PATH``.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from training.evaluate.answer import answer_results
from training.evaluate.bench import ANSWER_FORMATS, CHOICE_FORMATS, read_records
from training.evaluate.choice import choice_results
from training.evaluate.contamination import split
from training.evaluate.heldout import heldout_results
from training.evaluate.results import ItemResult, Metric, summarize
from training.evaluate.scorer import EvalError, Scorer

KINDS = ("bpb", *CHOICE_FORMATS, *ANSWER_FORMATS)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str
    path: str

    @property
    def metric(self) -> Metric:
        return "accuracy" if self.kind in CHOICE_FORMATS else "bpb"


def _one(part: str) -> tuple[str | None, str, str]:
    head = part.split(":", 1)[0]
    name = None
    if "=" in head:
        name, _, part = part.partition("=")
    kind, sep, path = part.partition(":")
    if not sep or not path or kind not in KINDS:
        why = f"unknown kind {kind!r}" if sep and kind not in KINDS else "a task is [NAME=]KIND:PATH"
        raise EvalError(f"--tasks {part}: {why} (KIND: {', '.join(KINDS)})")
    if "://" not in path and not os.path.exists(path):
        raise EvalError(f"--tasks {part}: {path}: no such file or folder")
    return name, kind, path


def parse_tasks(text: str) -> list[TaskSpec]:
    """The tasks of ``--tasks`` (comma-separated), each checked for its kind and its path."""
    parts = [_one(p.strip()) for p in text.split(",") if p.strip()]
    if not parts:
        raise EvalError("--tasks: name at least one task, e.g. mmlu:PATH")
    kinds = Counter(kind for name, kind, _ in parts if name is None)
    specs = [TaskSpec(name or (kind if kinds[kind] == 1 else f"{kind}:{path}"), kind, path)
             for name, kind, path in parts]
    twice = [n for n, c in Counter(s.name for s in specs).items() if c > 1]
    if twice:
        raise EvalError(f"--tasks: the task {twice[0]!r} is named twice")
    return specs


def task_results(scorer: Scorer, spec: TaskSpec, limit: int | None) -> list[ItemResult]:
    """Every item's result (the whole file is read and checked before the first item is scored)."""
    if spec.kind == "bpb":
        return heldout_results(scorer, spec.path, limit)
    if spec.kind in CHOICE_FORMATS:
        return choice_results(scorer, [CHOICE_FORMATS[spec.kind](r) for r in read_records(spec.path, limit)])
    return answer_results(scorer, [ANSWER_FORMATS[spec.kind](r) for r in read_records(spec.path, limit)])


def task_report(spec: TaskSpec, results: list[ItemResult], found: set[tuple[str, str]] | None) -> dict[str, Any]:
    """The task's entry of the report: its metric over all items and, given the job's found items (a benchmark
    task), over the clean ones, with how many were found."""
    out: dict[str, Any] = {"metric": spec.metric, **summarize(spec.metric, results), "path": spec.path}
    if found is not None and spec.kind != "bpb":
        clean, hit = split(results, found)
        out["clean"] = summarize(spec.metric, clean)
        out["found"] = len(hit)
    return out


def evaluate(scorer: Scorer, specs: list[TaskSpec], limit: int | None,
             found: set[tuple[str, str]] | None = None) -> dict[str, dict[str, Any]]:
    return {spec.name: task_report(spec, task_results(scorer, spec, limit), found) for spec in specs}
