"""Run an ablation's steps in order, each once: the split, the shared tokenizer, then per variant its job and
per seed a proxy run and its evaluation (a variant finishes before the next starts, so an interruption loses
at most the step it was in). A step recorded done with the same digest is skipped (:mod:`.steps`).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.spec import TokenizerSpec
from service.ablation.plan import Plan, Run
from service.ablation.split import input_files, raw_records, split_raw
from service.ablation.steps import (
    StepLog,
    digest,
    eval_command,
    eval_tasks,
    final_checkpoint,
    subprocess_env,
    train_command,
)

Say = Callable[[str], None]


class StepFailed(RuntimeError):
    """A step's subprocess failed: its command and the last lines it printed."""


class Interrupted(RuntimeError):
    """``stop_after`` steps ran (how a test interrupts an ablation between two steps)."""


@dataclass(frozen=True)
class Step:
    key: str
    digest: str
    action: Callable[[], dict[str, Any]]
    #: what an attempt of another digest left that this one must not continue (a proxy run's checkpoints)
    stale: Path | None = None


def plan_steps(plan: Plan, say: Say) -> list[Step]:
    """Every step of ``plan`` in the order it runs, each with the digest of what it depends on."""
    spec = plan.spec
    split_d = digest(spec.raw.model_dump(), spec.validation.model_dump(), input_files(spec.raw))
    tok_d = digest(split_d, spec.tokenizer.model_dump(), spec.base.get("tokenizer"))
    steps = [Step("split", split_d, lambda: split_raw(spec.raw, spec.validation, plan.layout).to_json())]
    if spec.tokenizer.path is None:
        steps.append(Step("tokenizer", tok_d, lambda: train_tokenizer(plan)))
    proxy_d = digest(Path(spec.proxy.config).read_text(), spec.proxy.model_dump(), plan.max_steps)
    for name, job in plan.jobs.items():
        job_d = digest(tok_d, job.content_hash())
        steps.append(Step(f"job:{name}", job_d, lambda name=name: run_job(plan, name)))  # type: ignore[misc]
        for seed in spec.seeds:
            run = Run(name, seed)
            train_d = digest(job_d, proxy_d, seed)
            eval_d = digest(train_d, spec.tasks, spec.eval.model_dump())
            steps.append(Step(f"train:{name}:{seed}", train_d, lambda run=run: train(plan, run, say),  # type: ignore[misc]
                              plan.layout.run(run)))
            steps.append(Step(f"eval:{name}:{seed}", eval_d,
                              lambda run=run: evaluate(plan, run, say)))  # type: ignore[misc]
    return steps


def run_steps(plan: Plan, say: Say = print, stop_after: int | None = None) -> StepLog:
    """Run every step not done yet; :class:`Interrupted` after ``stop_after`` steps ran in this call."""
    log = StepLog(plan.layout.steps)
    ran = 0
    for step in plan_steps(plan, say):
        if log.is_done(step.key, step.digest):
            say(f"{step.key}: done before, skipped")
            continue
        say(f"{step.key}: running")
        if step.stale is not None and log.started.get(step.key, step.digest) != step.digest:
            shutil.rmtree(step.stale, ignore_errors=True)  # a run of other settings: start over, not resume it
        log.write(step.key, "started", step.digest)
        info = step.action()
        log.write(step.key, "done", step.digest, **info)
        ran += 1
        if stop_after is not None and ran >= stop_after:
            raise Interrupted(f"stopped after {ran} step(s), at {step.key}")
    return log


def train_tokenizer(plan: Plan) -> dict[str, Any]:
    """The shared tokenizer, trained once on the first documents the variants read (not the validation set)."""
    from pipeline.tokenize import special_tokens, train_bpe

    want = plan.spec.tokenizer
    base = TokenizerSpec.model_validate({k: v for k, v in (plan.spec.base.get("tokenizer") or {}).items()
                                         if k not in ("path", "train")})
    texts = (r["text"] for r in itertools.islice(_train_records(plan), want.sample_docs))
    tok = train_bpe(texts, want.vocab_size, want.min_frequency, special_tokens(base))
    tmp = plan.layout.tokenizer.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.replace(plan.layout.tokenizer)
    return {"vocab_size": tok.get_vocab_size()}


def _train_records(plan: Plan) -> Any:
    from pipeline.spec import InputSpec

    return raw_records(InputSpec(path=str(plan.layout.raw), format="jsonl"))


def run_job(plan: Plan, name: str) -> dict[str, Any]:
    """Variant ``name``'s pipeline job, in this process on the Ray it uses (``overwrite``: an unfinished job of
    this spec resumes, a finished one of another spec is replaced)."""
    from pipeline.job.engine import Job

    spec = plan.jobs[name].model_copy(deep=True)
    spec.output.overwrite = True
    result = Job(spec).run()
    stages = result.stats.get("stages") or [{}]
    return {"documents": stages[-1].get("docs_out"), "tokens": (result.stats.get("output") or {}).get("tokens")}


def train(plan: Plan, run: Run, say: Say) -> dict[str, Any]:
    cmd = train_command(plan, run)
    plan.layout.run(run).mkdir(parents=True, exist_ok=True)
    _call(cmd, plan.layout.run(run) / "train.log", say)
    if not final_checkpoint(plan, run).is_dir():
        raise StepFailed(f"train {run.variant} seed {run.seed}: no final checkpoint {final_checkpoint(plan, run)}")
    return {"checkpoint": str(final_checkpoint(plan, run))}


def evaluate(plan: Plan, run: Run, say: Say) -> dict[str, Any]:
    tasks = eval_tasks(plan, run)
    _call(eval_command(plan, run, tasks), plan.layout.run(run) / "eval.log", say)
    result = json.loads(plan.layout.eval_json(run).read_text())
    result["ablation_tasks"] = tasks  # which eval task each of ablation.json's names is
    plan.layout.eval_json(run).write_text(json.dumps(result, indent=1) + "\n")
    return {"tasks": sorted(tasks)}


def _call(cmd: list[str], log: Path, say: Say) -> None:
    """Run ``cmd``, its output appended to ``log``; :class:`StepFailed` with the log's last lines when it fails."""
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=subprocess_env(),
                               stdin=subprocess.DEVNULL)
    if code != 0:
        tail = log.read_text().strip().splitlines()[-4:]
        raise StepFailed(f"{log.stem} exited {code} (log: {log}):\n  " + "\n  ".join(tail))
    say(f"  log: {log}")


def pending_jobs(plan: Plan) -> bool:
    """Whether a variant's job still has to run (and so Ray is needed)."""
    log = StepLog(plan.layout.steps)
    return any(s.key.startswith("job:") and not log.is_done(s.key, s.digest) for s in plan_steps(plan, print))
