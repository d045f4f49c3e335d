"""Where an ablation submitted to the control plane may read and write: the service's roots, as for a job spec
(:mod:`service.confine`). Its own paths (raw, tokenizer, proxy config, tasks, out) are checked before the plan
is made (the plan reads the proxy config); each variant's job spec, with everything ablate sets in it, after.

A proxy config may also be one of the trainer configs shipped with tokenmill (``training/configs``): those are
part of the program, not of anyone's data.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.problems import Problem
from service.ablation.plan import Plan
from service.ablation.spec import AblationSpec
from service.confine import Roots, check_read, check_write
from service.confine import problems as job_problems

#: the trainer configs shipped with tokenmill
SHIPPED_CONFIGS = Path(__file__).resolve().parents[2] / "training" / "configs"


def problems(spec: AblationSpec, roots: Roots) -> list[Problem]:
    """Each of the ablation file's own paths that falls outside ``roots``, at its field."""
    found = check_read(("raw", "path"), spec.raw.path, roots, expand=True)
    if spec.tokenizer.path:
        found += check_read(("tokenizer", "path"), spec.tokenizer.path, roots, expand=False)
    if Path(spec.proxy.config).parent != SHIPPED_CONFIGS:
        found += check_read(("proxy", "config"), spec.proxy.config, roots, expand=False)
    for i, task in enumerate(spec.tasks):
        _, sep, path = task.partition(":")
        if sep and path:
            found += check_read(("tasks", i), path, roots, expand=False)
    found += check_write(("out",), spec.out, roots)
    return [Problem(p.loc, p.msg, "path") for p in found]


def plan_problems(plan: Plan, roots: Roots) -> list[Problem]:
    """Each path of a variant's job spec (a stage's params, the card's comparisons) outside ``roots``."""
    return [Problem(("variants", name, *p.loc), p.msg, "path")
            for name, job in plan.jobs.items() for p in job_problems(job, roots)]
