"""The step log of an ablation (``OUT/steps.jsonl``) and the commands its steps run as subprocesses.

A step (the split, the tokenizer, a variant's job, a proxy run, its evaluation) is recorded ``started`` and then
``done`` with the digest of what it was given; a rerun skips every step recorded done with the same digest, so an
interrupted ablation continues where it stopped and a changed setting redoes only what it touches.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from service.ablation.plan import Plan, Run

#: the repository root, on the subprocesses' PYTHONPATH: training is imported there, never here
ROOT = Path(__file__).resolve().parents[2]


def digest(*parts: Any) -> str:
    """A short hash of ``parts`` (JSON)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class StepLog:
    """Append-only JSON lines: ``{"step", "event": "started"|"done", "digest", "time", ...}``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[str, dict[str, Any]] = {}
        self.started: dict[str, str] = {}  #: each step's digest when it last started
        if path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.strip() else {}
                if record.get("event") == "done":
                    self.done[record["step"]] = record
                elif record.get("event") == "started":
                    self.started[record["step"]] = record["digest"]

    def is_done(self, step: str, step_digest: str) -> bool:
        return self.done.get(step, {}).get("digest") == step_digest

    def write(self, step: str, event: str, step_digest: str, **info: Any) -> None:
        record = {"step": step, "event": event, "digest": step_digest, "time": round(time.time(), 3), **info}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if event == "done":
            self.done[step] = record
        else:
            self.started[step] = step_digest


def subprocess_env() -> dict[str, str]:
    """This process's environment with the repository root first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def train_command(plan: Plan, run: Run) -> list[str]:
    """``python -m training.train`` (or torchrun with ``proxy.nproc`` processes) for one proxy run; the run
    folder's latest checkpoint resumes it (the trainer's ``--resume auto``)."""
    proxy = plan.spec.proxy
    torchrun = proxy.launcher == "torchrun" or (proxy.launcher == "auto" and proxy.nproc > 1)
    head = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={proxy.nproc}"]
            if torchrun else [sys.executable])
    sets = [f"{key}={json.dumps(value)}" for key, value in proxy.set.items()]
    sets += [f"seed={run.seed}", f"data.seed={run.seed}"]
    return [*head, "-m", "training.train", "--config", proxy.config, "--data", str(plan.layout.data(run.variant)),
            "--out", str(plan.layout.run(run)), "--max-steps", str(plan.max_steps),
            *[arg for s in sets for arg in ("--set", s)]]


def final_checkpoint(plan: Plan, run: Run) -> Path:
    """The checkpoint a finished proxy run ends with (training/checkpoint.py's layout)."""
    return plan.layout.run(run) / "checkpoints" / f"step-{plan.max_steps:08d}"


def eval_tasks(plan: Plan, run: Run) -> dict[str, str]:
    """``tokenmill eval`` tasks of one run (``KIND:PATH``) by the name each gets there and in ablation.json:
    ``common`` (and ``common.VALUE`` per ``validation.by`` value), ``own`` (the variant's own validation split,
    when its job wrote one) and each benchmark task by its name (``NAME=`` as given, else its kind)."""
    layout = plan.layout
    tasks = {"common": f"bpb:{layout.common}"}
    if plan.spec.validation.by is not None:
        folder = layout.common_part("x").parent
        for part in sorted(folder.glob("*.jsonl")) if folder.exists() else []:
            tasks[f"common.{part.stem}"] = f"bpb:{part}"
    own = layout.data(run.variant) / "validation"
    if (own / "manifest.json").exists():
        tasks["own"] = f"bpb:{own}"
    for task in plan.spec.tasks:
        tasks.update([task_name(task)])
    return tasks


def task_name(task: str) -> tuple[str, str]:
    """``(NAME, KIND:PATH)`` of a task as the ablation file gives it (``[NAME=]KIND:PATH``)."""
    head, sep, _ = task.partition(":")
    if "=" in head:
        name, _, rest = task.partition("=")
        return name, rest
    return head, task


def eval_command(plan: Plan, run: Run, tasks: dict[str, str]) -> list[str]:
    """``python -m training.evaluate.cli`` (``tokenmill eval``) on the run's final checkpoint, JSON beside it; with
    ``--job`` (scores on the items the job did not find too) when the variant's job decontaminated."""
    data = plan.layout.data(run.variant)
    cmd = [sys.executable, "-m", "training.evaluate.cli", "--model", str(final_checkpoint(plan, run)),
           "--tasks", ",".join(f"{n}={t}" for n, t in tasks.items()), "--json", str(plan.layout.eval_json(run))]
    if looked_for_benchmarks(data):
        cmd += ["--job", str(data)]
    if plan.spec.eval.limit is not None:
        cmd += ["--limit", str(plan.spec.eval.limit)]
    return cmd


def looked_for_benchmarks(data: Path) -> bool:
    """Whether the job that wrote ``data`` ran a decontaminate stage (its ``stats.json``)."""
    try:
        stats = json.loads((data / "stats.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(s.get("stage", "")).endswith("decontaminate") for s in stats.get("stages") or [])
