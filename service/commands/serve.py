"""``tokenmill serve``: run the control plane (REST API, dashboard, job runner) until SIGINT or SIGTERM.

The flags make the service's settings (:mod:`service.settings`; each also a ``TOKENMILL_*`` variable); starting
uvicorn, with one process or ``--workers N``, and the ``ready on URL`` line is :mod:`service.api.startup`.
Exit 2 for settings that cannot be used, 1 when the server could not start (the port taken, the database).
"""

from __future__ import annotations

import argparse
from typing import Any

from service.commands.exits import error
from service.commands.store_options import add_database_options, settings_of


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill serve", description="Run the control plane (REST API + job runner).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--state-dir", help="jobs' logs and events, the default SQLite file ($TOKENMILL_STATE_DIR)")
    add_database_options(p)
    _add_root_options(p)
    _add_runner_options(p)
    _add_edge_options(p)
    p.add_argument("--log-level", default="info")
    p.add_argument("--workers", type=int, default=1, help="API processes on the port (default 1); one of them "
                   "runs the jobs and the schedules (a lock in the state folder decides which)")
    return p


def _add_root_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", action="append", default=[], metavar="[TEAM=]DIR",
                   help="a folder jobs may read and write (repeat; $TOKENMILL_ROOTS); TEAM=DIR: one of that team's "
                        "own roots, which its jobs use instead of the others")
    p.add_argument("--input-root", action="append", default=[], metavar="DIR", help="a folder jobs may only read")
    p.add_argument("--output-root", action="append", default=[], metavar="DIR", help="a folder jobs may write")


def _add_runner_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-running", type=int, help="jobs at once (default 1)")
    p.add_argument("--ray-address", help="run every job on this Ray cluster (default: a local Ray per job)")
    p.add_argument("--ray-jobs-url", help="submit every job to this Ray Jobs API, e.g. http://head:8265 "
                   "($TOKENMILL_RAY_JOBS_URL; the state dir must be shared with the head)")
    p.add_argument("--ray-start-timeout-s", type=float, help="seconds a job has to start or join Ray, else it "
                   "ends FAILED infra (default 120; $TOKENMILL_RAY_START_TIMEOUT_S)")
    p.add_argument("--job-cpus", type=int, help="CPUs of each job's local Ray when its spec leaves "
                   "execution.num_cpus out (default: all)")
    p.add_argument("--max-job-cpus", type=int, help="the most CPUs a spec may ask (execution.num_cpus, "
                   "execution.parallelism; more gets 422); default: a local Ray, this machine's CPUs or "
                   "--job-cpus if more; a cluster, no limit ($TOKENMILL_MAX_JOB_CPUS)")


def _add_edge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-body-bytes", type=int)
    p.add_argument("--public-docs", action="store_true", help="serve /docs and /openapi.json without a key")
    p.add_argument("--head-timeout-s", type=float, help="seconds a connection has for a request's line and "
                   "headers, else 408 and closed (default 10; $TOKENMILL_HEAD_TIMEOUT_S)")
    p.add_argument("--body-timeout-s", type=float, help="seconds a request has for its body after the headers, "
                   "else 408 and closed (default 10; $TOKENMILL_BODY_TIMEOUT_S)")
    p.add_argument("--keepalive-s", type=int, help="seconds an idle connection stays open between requests "
                   "(default 5; $TOKENMILL_KEEPALIVE_S)")
    p.add_argument("--max-connections", type=int, help="connections and requests in flight per process; more get "
                   "503 (default 1000; $TOKENMILL_MAX_CONNECTIONS)")


def run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        return error("--workers: at least 1")
    from service.api.startup import serve  # lazy: fastapi, sqlalchemy, uvicorn and the routers (1 s), only to serve

    try:
        settings = _settings(args)
    except ValueError as exc:
        return error(exc)
    return serve(settings, host=args.host, port=args.port, log_level=args.log_level, workers=args.workers)


def _settings(args: argparse.Namespace) -> Any:
    """The settings the flags give (a flag not given: its ``TOKENMILL_*`` variable, else the default)."""
    from service.settings import team_root, team_roots  # lazy: see store_options.settings_of

    shared = [r for r in args.root if team_root(r) is None]
    return settings_of(args, input_roots=tuple(shared + args.input_root) or None,
                       output_roots=tuple(shared + args.output_root) or None,
                       team_roots=team_roots(args.root) or None,
                       max_running=args.max_running, ray_address=args.ray_address,
                       ray_jobs_url=args.ray_jobs_url, ray_start_timeout_s=args.ray_start_timeout_s,
                       job_cpus=args.job_cpus, max_job_cpus=args.max_job_cpus,
                       max_body_bytes=args.max_body_bytes, public_docs=args.public_docs or None,
                       head_timeout_s=args.head_timeout_s, body_timeout_s=args.body_timeout_s,
                       keepalive_s=args.keepalive_s, max_connections=args.max_connections,
                       freeze_gc=True)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

