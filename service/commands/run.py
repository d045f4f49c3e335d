"""``tokenmill run SPEC``: run a job spec on Ray with a live progress view, then print its summary.

One line per failure: ``cancelled: ...`` (130), ``error: ...`` (2 for a bad spec or input, 1 for a failure of
the program or the machine, ``app`` or ``infra``: a Ray that cannot start or be reached, a full disk); on
success the summary table. Ray's own logs go to the job's log file unless ``--verbose``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from service.commands.exits import EXIT_CANCELLED, EXIT_FAILURE, EXIT_OK, error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill run")
    p.add_argument("spec", help="the job spec file, YAML or JSON (relative paths in it are relative to its folder)")
    p.add_argument("--parallelism", type=int, help="workers per stage (overrides the spec)")
    p.add_argument("--address", help="Ray address of an existing cluster (overrides the spec)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing shard set")
    p.add_argument("--ray-start-timeout-s", type=float, metavar="S",
                   help="seconds to start or join Ray, else the job fails (infra, exit 1; default 120)")
    p.add_argument("--verbose", action="store_true", help="show Ray's own logs (by default they go to the job's log)")
    return p


def run(args: argparse.Namespace) -> int:
    # lazy: the spec's models pull pydantic, pyarrow and yaml (0.3 s): not for -h
    from pipeline.preflight import load_checked
    from pipeline.spec import SpecError, parse_spec

    try:
        spec = load_checked(args.spec)
    except SpecError as exc:
        return error(exc)
    data = spec.model_dump()
    if args.parallelism is not None:
        data["execution"]["parallelism"] = args.parallelism
    if args.address:
        data["execution"]["address"] = args.address
    if args.overwrite:
        data["output"]["overwrite"] = True
    try:  # validated again, so a flag gets the same checks as the spec field it overrides
        spec = parse_spec(data)
    except SpecError as exc:
        return error(exc)
    timeout = args.ray_start_timeout_s
    if timeout is not None and not timeout > 0:
        return error(f"--ray-start-timeout-s: {timeout:g} is not a positive number of seconds")
    return run_spec(spec, verbose=args.verbose, ray_start_timeout_s=timeout)


def run_spec(spec: Any, verbose: bool = False, ray_start_timeout_s: float | None = None) -> int:
    """Run ``spec`` with a live progress view; SIGINT/SIGTERM cancel it (exit 130), a second SIGINT exits at once.
    ``tokenmill run`` and ``tokenmill demo`` both end here."""
    if verbose:  # read by pipeline.job.ray_env.init_ray, here and in anything this process starts
        os.environ["TOKENMILL_VERBOSE"] = "1"
    # lazy: the engine, the tokenizer and the live view pull tokenizers, pyarrow, pydantic and rich (0.4 s)
    from pipeline.job.engine import Job
    from pipeline.job.errors import JobCancelled, JobError
    from pipeline.job.signals import cancel_on_signals
    from pipeline.job.summary import format_summary
    from service.progress import make_renderer

    renderer = make_renderer(verbose=verbose)
    job = Job(spec, on_event=renderer, ray_start_timeout_s=ray_start_timeout_s)
    try:
        with renderer, cancel_on_signals(job, renderer.cancelling):
            result = job.run()
    except JobCancelled as exc:
        print(f"cancelled: {exc}", file=sys.stderr, flush=True)
        return EXIT_CANCELLED
    except KeyboardInterrupt:  # the signal came after the job's own handling ended
        print("cancelled", file=sys.stderr, flush=True)
        return EXIT_CANCELLED
    except JobError as exc:  # every failure of the job (Ray that cannot start or be reached is infra: exit 1)
        if exc.category in ("validation", "input"):
            return error(exc)
        ray_env = sys.modules.get("pipeline.job.ray_env")  # imported only if Ray was started
        log = ray_env.ray_log_path() if ray_env else None
        return error(f"{exc} (Ray's log: {log})" if log else str(exc), EXIT_FAILURE)
    print(format_summary(result.stats, result.output_dir), flush=True)
    return EXIT_OK


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

