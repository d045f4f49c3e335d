"""One attempt of one job, in its own process:
``python -m service.runner.job_process --job ID --attempt N --run-dir DIR``.

The supervisor starts it in a new session with stdout and stderr going to ``DIR/job.log`` (a Ray Jobs API
driver: ``--log-output``). It talks to the service only through the database (:mod:`service.runner.report`):
it reads its run (the spec, with the service's Ray address, and the roots its paths must stay in) from its
attempt's row, checks the spec again (the files may have changed since it was accepted), runs the job engine
(which starts a local Ray, or joins the configured cluster, writes its own lines to ``DIR/job.log`` and routes
Ray's output to ``DIR/ray.log``), reports every engine event, the terminal one before it exits, and ships both
logs, so the supervisor (this service, a restarted one, another replica) learns the outcome from the database,
even when it is not this process's parent and cannot read its exit code. ``DIR`` is this process's own
folder, on the machine where it runs: nothing the service reads.

SIGTERM (the supervisor's cancel) or SIGINT cancels: the engine cancels its Ray work, publishes nothing
and reports ``job_failed`` with category ``cancelled``; a second signal exits at once. Before it publishes, the
job process asks the supervisor (:mod:`service.runner.publish`): cancel and publish are one decision, the
database's; once granted, a signal no longer cancels. Exit codes follow
``tokenmill run``: 0 done, 1 a failure of the program or the machine, 2 a bad spec or input, 130 cancelled.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from pipeline.error_line import error_line
from pipeline.job import events as ev
from pipeline.job.engine import Job
from pipeline.job.errors import JobCancelled, JobError
from pipeline.job.signals import cancel_on_signals
from pipeline.preflight import problems as preflight_problems
from pipeline.spec import SpecError, parse_spec
from service import ownership
from service.confine import Roots
from service.confine import problems as path_problems
from service.runner import publish
from service.runner.ablation_attempt import run_ablation
from service.runner.report import LOG_FILE, Reporter, database_from_env
from service.store.models import ABLATION

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130


def admit(run: dict[str, Any]) -> Any:
    """The run's spec, checked as the API checked it: schema, roots, files. Raises ``AdmissionError``."""
    try:
        spec = parse_spec(run["spec"])
    except SpecError as exc:
        raise AdmissionError(str(exc), "validation") from None
    if run.get("roots") is not None:
        refused = path_problems(spec, Roots.from_json(run["roots"]))
        if refused:
            raise AdmissionError("\n".join(str(p) for p in refused), "validation")
    if run.get("team") is not None:  # its output folder is still its team's (the engine's claim checks again)
        foreign = ownership.problems(spec, writer=run["team"], reader=None)
        if foreign:
            raise AdmissionError("\n".join(map(str, foreign)), "validation")
    found = preflight_problems(spec)
    if found:
        raise AdmissionError("\n".join(map(str, found)), "input")
    return spec


class AdmissionError(ValueError):
    def __init__(self, message: str, category: str):
        super().__init__(message)
        self.category = category


def run_attempt(reporter: Reporter) -> int:
    """Run the attempt; its outcome is reported to the database whatever happens (then the reporter is closed)."""
    sink, run_dir = reporter.events, reporter.folder
    try:
        run = reporter.run()
        print(f"tokenmill job {reporter.job_id} attempt {reporter.attempt}: pid {os.getpid()}", flush=True)
        if run.get("kind") == ABLATION:  # tokenmill ablate's steps, not the engine (POST /v1/ablations)
            return run_ablation(run, sink)
        try:
            spec = admit(run)
        except AdmissionError as exc:
            sink(ev.JobFailed(category=exc.category, message=str(exc)))  # type: ignore[arg-type]
            return EXIT_USAGE
        job = Job(spec, on_event=sink, log_path=str(run_dir / LOG_FILE),  # Ray's: report.RAY_LOG_FILE beside it
                  ray_start_timeout_s=run.get("ray_start_timeout_s"), owner=run.get("team"),
                  # the supervisor decides: service.runner.publish
                  may_publish=lambda: publish.ask(reporter.db, reporter.job_id, reporter.attempt))
        with cancel_on_signals(job):
            try:
                job.run()
                return EXIT_OK
            except JobCancelled:
                return EXIT_CANCELLED
            except JobError as exc:  # the engine has reported it (job_failed) already
                return EXIT_USAGE if exc.category in ("validation", "input") else EXIT_FAILURE
    except KeyboardInterrupt:  # a signal outside the engine's own handling
        if sink.terminal is None:
            sink(ev.JobFailed(category="cancelled", message="cancelled"))
        return EXIT_CANCELLED
    except SystemExit as exc:
        # ray.init installs its own SIGTERM handler (sys.exit(signum)) while it starts the node: a cancel then
        if exc.code not in (signal.SIGTERM, signal.SIGINT):
            raise
        if sink.terminal is None:
            sink(ev.JobFailed(category="cancelled", message="cancelled while Ray was starting"))
        return EXIT_CANCELLED
    except Exception as exc:  # noqa: BLE001 - whatever it is, the outcome must reach the database
        traceback.print_exc()
        if sink.terminal is None:
            sink(ev.JobFailed(category="app", message=error_line(exc)))
        return EXIT_FAILURE
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        reporter.close()


def _output_to(path: Path) -> None:
    """Point file descriptors 1 and 2 at ``path`` (appended), for this process and what it starts."""
    print(f"tokenmill job process {os.getpid()}: output in {path}", flush=True)
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m service.runner.job_process", description=__doc__.splitlines()[0])
    p.add_argument("--job", required=True, help="the job's id")
    p.add_argument("--attempt", required=True, type=int, help="the attempt's number")
    p.add_argument("--run-dir", required=True,
                   help="this process's own folder (job.log and ray.log, shipped to the database), created if missing")
    p.add_argument("--log-output", action="store_true",
                   help="append this process's stdout and stderr to RUN_DIR/job.log (a Ray Jobs API entrypoint: "
                        "the local mode's supervisor redirects them itself)")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.log_output:
        _output_to(run_dir / LOG_FILE)
    return run_attempt(Reporter(database_from_env(), args.job, args.attempt, run_dir))


if __name__ == "__main__":
    sys.exit(main())
