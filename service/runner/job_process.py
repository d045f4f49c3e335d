"""One attempt of one job, in its own process: ``python -m service.runner.job_process --run-dir DIR``.

The supervisor starts it in a new session with stdout and stderr going to ``DIR/job.log``; it never
touches the database. It reads ``DIR/run.json`` (the spec, with the service's Ray address, and the roots
its paths must stay in; the spec's secrets from ``DIR/secrets.json``, only the service's user's: :func:`write_run`),
checks the spec again (the files may have changed since it was accepted), runs
the job engine (which starts a local Ray, or joins the configured cluster, writes its own lines to the same
log and routes Ray's output to ``DIR/ray.log``) and appends every engine event to ``DIR/events.jsonl``, the
terminal one fsynced, so the supervisor (this service or a restarted one) learns the outcome from the file,
even when it is not this process's parent and cannot read its exit code.

SIGTERM (the supervisor's cancel) or SIGINT cancels: the engine cancels its Ray work, publishes nothing
and reports ``job_failed`` with category ``cancelled``; a second signal exits at once. Before it publishes, the
job process asks the supervisor (:mod:`service.runner.publish`): cancel and publish are one decision, the
database's; once granted, a signal no longer cancels. Exit codes follow
``tokenmill run``: 0 done, 1 a failure of the program or the machine, 2 a bad spec or input, 130 cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from pipeline import secret_fields
from pipeline.error_line import error_line
from pipeline.job import events as ev
from pipeline.job.engine import Job
from pipeline.job.errors import JobCancelled, JobError
from pipeline.job.signals import cancel_on_signals
from pipeline.job.state import JsonlLog
from pipeline.preflight import problems as preflight_problems
from pipeline.spec import SpecError, parse_spec
from service import ownership
from service.confine import Roots
from service.confine import problems as path_problems
from service.runner import publish
from service.runner.ablation_attempt import run_ablation
from service.store.models import ABLATION

RUN_FILE = "run.json"
#: the values of the spec's secrets, which ``run.json`` shows as ``<redacted>`` (:func:`write_run`)
SECRETS_FILE = "secrets.json"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "job.log"
#: Ray's own output (its core's lines, its loggers, Ray Data's): beside LOG_FILE, never in it
RAY_LOG_FILE = "ray.log"  # pipeline.job.tasks.RAY_LOG (not imported: it imports Ray, and the API imports this)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
TERMINAL_EVENTS = frozenset({ev.JobFinished.type, ev.JobFailed.type})


class EventFile:
    """The engine's event sink: one JSON line per event; the terminal event is fsynced before the exit."""

    def __init__(self, path: Path):
        self._log = JsonlLog(path)
        self.terminal: str | None = None

    def __call__(self, event: ev.Event) -> None:
        final = event.type in TERMINAL_EVENTS
        self._log.append(ev.to_dict(event), sync=final)
        if final:
            self.terminal = event.type

    def close(self) -> None:
        self._log.close()


def write_run(run_dir: Path, run: dict[str, Any]) -> None:
    """Write the attempt's ``run.json``, its spec's secrets (the PII ``salt``) ``<redacted>``, and their values
    in ``secrets.json``, created with mode 0600 (``O_CREAT | O_EXCL``: never readable by others, not even
    between a write and a chmod), which :func:`read_run` puts back. The service's user, who runs the job
    process (and, through the Ray Jobs API, the driver on the shared folder: the same uid in both images),
    is the only one who reads them; ``run.json`` stays as readable as the attempt's log, for whoever looks into
    what an attempt ran. The database keeps the real spec: every attempt (a retry, a resume) writes its own."""
    values = secret_fields.secrets_of(run["spec"])
    if values:
        path = run_dir / SECRETS_FILE
        path.unlink(missing_ok=True)  # a file left there (by anyone) is never reused: ours is created 0600
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            json.dump(secret_fields.to_json(values), f)
    shown = {**run, "spec": secret_fields.redact(run["spec"])}
    (run_dir / RUN_FILE).write_text(json.dumps(shown, indent=1), encoding="utf-8")


def read_run(run_dir: Path) -> dict[str, Any]:
    """``run.json`` with its spec's secrets put back from ``secrets.json`` (:func:`write_run`)."""
    run: dict[str, Any] = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    path = run_dir / SECRETS_FILE
    if path.exists():
        values = secret_fields.from_json(json.loads(path.read_text(encoding="utf-8")))
        run["spec"] = secret_fields.restore(run["spec"], values)
    return run


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


def run_attempt(run_dir: Path) -> int:
    sink = EventFile(run_dir / EVENTS_FILE)
    try:
        run = read_run(run_dir)
        print(f"tokenmill job {run.get('job_id')} attempt {run.get('attempt')}: pid {os.getpid()}", flush=True)
        if run.get("kind") == ABLATION:  # tokenmill ablate's steps, not the engine (POST /v1/ablations)
            return run_ablation(run, sink)
        try:
            spec = admit(run)
        except AdmissionError as exc:
            sink(ev.JobFailed(category=exc.category, message=str(exc)))  # type: ignore[arg-type]
            return EXIT_USAGE
        job = Job(spec, on_event=sink, log_path=str(run_dir / LOG_FILE),  # Ray's: RAY_LOG_FILE beside it
                  ray_start_timeout_s=run.get("ray_start_timeout_s"), owner=run.get("team"),
                  may_publish=lambda: publish.ask(run_dir))  # the supervisor decides: service.runner.publish
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
    except Exception as exc:  # noqa: BLE001 - whatever it is, the outcome must reach the events file
        traceback.print_exc()
        if sink.terminal is None:
            sink(ev.JobFailed(category="app", message=error_line(exc)))
        return EXIT_FAILURE
    finally:
        sink.close()


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
    p.add_argument("--run-dir", required=True,
                   help="the attempt's folder (run.json in, events.jsonl, job.log and ray.log out)")
    p.add_argument("--log-output", action="store_true",
                   help="append this process's stdout and stderr to RUN_DIR/job.log (a Ray Jobs API entrypoint: "
                        "the local mode's supervisor redirects them itself)")
    args = p.parse_args(argv)
    if args.log_output:
        _output_to(Path(args.run_dir) / LOG_FILE)
    return run_attempt(Path(args.run_dir))


if __name__ == "__main__":
    sys.exit(main())
