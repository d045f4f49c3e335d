"""``tokenmill ablate ABLATION.yaml``: run pipeline variants of one raw input, train a proxy model per variant and
seed, evaluate each on a common validation set, and write ``OUT/ablation.json`` and ``OUT/REPORT.md``.

Resumable: every finished step is recorded in ``OUT/steps.jsonl`` and skipped by a rerun of the same file
(:mod:`service.ablation.steps`). Exit codes: 0 done, 2 a bad ablation file or input, 1 a failed step, 130
interrupted (a rerun continues).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from service.commands.exits import EXIT_CANCELLED, EXIT_FAILURE, EXIT_OK, error

if TYPE_CHECKING:
    from service.ablation.plan import Plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill ablate", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("ablation", help="the ablation file, YAML or JSON (relative paths in it: against its folder)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, print the plan (variants, seeds, steps of the budget, what is done); run nothing")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop after N steps have run (a rerun continues from there)")
    return p


def run(args: argparse.Namespace) -> int:
    from pipeline.job.errors import JobError
    from pipeline.problems import SpecError
    from service.ablation.plan import make_plan
    from service.ablation.runner import Interrupted, StepFailed
    from service.ablation.whole import ablate

    if args.stop_after is not None and args.stop_after < 1:
        return error(f"--stop-after: {args.stop_after} is not a positive number of steps")
    try:
        from service.ablation.spec import load_ablation

        plan = make_plan(load_ablation(args.ablation))
    except SpecError as exc:
        return error(exc)
    if args.dry_run:
        print(describe(plan), flush=True)
        return EXIT_OK
    try:
        ablate(plan, args.stop_after)
        return EXIT_OK
    except SpecError as exc:
        return error(exc)
    except (Interrupted, KeyboardInterrupt) as exc:
        print(f"interrupted: {exc or 'by a signal'}; rerun to continue", file=sys.stderr, flush=True)
        return EXIT_CANCELLED
    except JobError as exc:
        return error(exc) if exc.category in ("validation", "input") else error(exc, EXIT_FAILURE)
    except StepFailed as exc:
        return error(exc, EXIT_FAILURE)


def describe(plan: Plan) -> str:
    """``--dry-run``: the plan and, per step, whether an earlier run finished it."""
    from service.ablation.runner import plan_steps
    from service.ablation.steps import StepLog

    log = StepLog(plan.layout.steps)
    head = (f"{len(plan.spec.variants)} variant(s) x {len(plan.spec.seeds)} seed(s); {plan.max_steps} steps of "
            f"{plan.tokens_per_step} tokens each (budget {plan.spec.budget.tokens}); out: {plan.layout.out}")
    rows = [f"  {'done' if log.is_done(s.key, s.digest) else 'todo'}  {s.key}" for s in plan_steps(plan, print)]
    return "\n".join([head, *rows])


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))
