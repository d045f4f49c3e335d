"""One attempt of an ablation job (``POST /v1/ablations``): the job process runs ``tokenmill ablate``'s steps
instead of the pipeline engine.

The ablation file is checked again as the API checked it (schema, the service's roots), then
:func:`service.ablation.whole.ablate` (what ``tokenmill ablate`` runs) runs the steps its step log
(``OUT/steps.jsonl``) does not record as done, so a resumed attempt (a lost process, a retry) skips what an
earlier one finished. The outcome reaches the supervisor as a job's does: ``job_finished`` or ``job_failed``
in the events file. SIGTERM (a cancel) stops it inside a step: the step's subprocesses are in the job
process's session, which the supervisor reaps.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from pipeline.error_line import error_line
from pipeline.job import events as ev
from pipeline.job.errors import JobError
from pipeline.problems import SpecError
from service.ablation.confine import problems as path_problems
from service.confine import Roots

Sink = Callable[[ev.Event], None]
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_ablation(run: dict[str, Any], sink: Sink) -> int:
    """Run the ablation of ``run`` (``run.json``); report its outcome to ``sink``. KeyboardInterrupt (SIGTERM
    or SIGINT) propagates: the job process reports it as a cancel."""
    from service.ablation.plan import make_plan
    from service.ablation.runner import StepFailed
    from service.ablation.spec import parse_ablation
    from service.ablation.whole import ablate

    signal.signal(signal.SIGTERM, _interrupt)
    start = time.monotonic()
    try:
        spec = parse_ablation(run["spec"])
        if run.get("roots") is not None:
            refused = path_problems(spec, Roots.from_json(run["roots"]))
            if refused:
                raise SpecError(refused)
        plan = make_plan(spec)
    except SpecError as exc:
        sink(ev.JobFailed(category="validation", message=str(exc)))
        return EXIT_USAGE
    try:
        ablate(plan)
    except (StepFailed, JobError, SpecError, OSError) as exc:
        category = getattr(exc, "category", "app")
        sink(ev.JobFailed(category="input" if category == "input" else "app", message=error_line(exc)))
        return EXIT_FAILURE
    sink(ev.JobFinished(output=str(plan.layout.out), shards=0, samples=0, tokens=0, documents=0,
                        seconds=time.monotonic() - start))
    return EXIT_OK
