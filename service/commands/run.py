"""``tokenmill run SPEC``: run a job spec on Ray with a live progress view, then print its summary.

One line per failure: ``cancelled: ...`` (130), ``error: ...`` (2 for a bad spec or input, 1 for a failure of
the program or the machine, ``app`` or ``infra``: a Ray that cannot start or be reached, a full disk); on
success the summary table. Ray's own logs go to the job's log file unless ``--verbose``.

``--set key.path=value`` changes a spec field before validation (:mod:`pipeline.overrides`); ``--dry-run`` prints
what the job would read, do and ask of Ray, and starts and writes nothing (:mod:`pipeline.job.plan_view`);
``--limit N`` runs on each input's first N documents into ``OUTPUT.limit-N``, a scratch output beside the real one.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from service.commands.exits import EXIT_CANCELLED, EXIT_FAILURE, EXIT_OK, error

#: ``--set``'s help, for ``run`` and ``submit``
SET_HELP = ("set a spec field before validation, e.g. stages.1.params.min_chars=64 or execution.parallelism=4 "
            "(repeatable; the value is read as YAML: 3, true, [a, b]; part of the spec hash like the file's fields)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill run")
    p.add_argument("spec", help="the job spec file, YAML or JSON (relative paths in it are relative to its folder)")
    p.add_argument("--parallelism", type=int, help="workers per stage (overrides the spec)")
    p.add_argument("--address", help="Ray address of an existing cluster (overrides the spec)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing shard set")
    p.add_argument("--ray-start-timeout-s", type=float, metavar="S",
                   help="seconds to start or join Ray, else the job fails (infra, exit 1; default 120)")
    p.add_argument("--verbose", action="store_true", help="show Ray's own logs (by default they go to the job's log)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", dest="sets", help=SET_HELP)
    p.add_argument("--dry-run", action="store_true",
                   help="validate, list the files each input matches and the stage plan with the Ray workers it "
                        "would ask for; start nothing, write nothing")
    p.add_argument("--limit", type=int, metavar="N",
                   help="a quick look: the first N documents of each input, into OUTPUT.limit-N beside the output "
                        "(replaced on each run; the output itself is not touched)")
    return p


def run(args: argparse.Namespace) -> int:
    # lazy: the spec's models pull pydantic, pyarrow and yaml (0.3 s): not for -h
    from pipeline.overrides import load_spec_with, quick_look
    from pipeline.spec import SpecError, parse_spec

    if args.limit is not None and args.limit < 1:
        return error(f"--limit: {args.limit} is not a positive number of documents")
    try:
        spec = load_spec_with(args.spec, args.sets)
    except SpecError as exc:
        return error(exc)
    data = spec.model_dump()
    if args.parallelism is not None:
        data["execution"]["parallelism"] = args.parallelism
    if args.address:
        data["execution"]["address"] = args.address
    if args.overwrite:
        data["output"]["overwrite"] = True
    if args.limit is not None:
        quick_look(data, args.limit)
    try:  # validated again, so a flag gets the same checks as the spec field it overrides
        spec = parse_spec(data)
    except SpecError as exc:
        return error(exc)
    timeout = args.ray_start_timeout_s
    if timeout is not None and not timeout > 0:
        return error(f"--ray-start-timeout-s: {timeout:g} is not a positive number of seconds")
    if args.dry_run:
        from pipeline.job.plan_view import render

        print(render(spec), flush=True)
        return EXIT_OK
    code = run_spec(spec, verbose=args.verbose, ray_start_timeout_s=timeout)
    if args.limit is not None and code == EXIT_OK:
        print(f"--limit {args.limit}: a quick look, in {spec.output.path} (replaced by the next --limit "
              f"{args.limit}); the output itself was not touched", flush=True)
    return code


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

