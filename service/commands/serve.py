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

#: the options that set the settings field of their name (``--max-running`` sets ``max_running``): flag, type, help;
#: one not given leaves the field to its ``TOKENMILL_*`` variable, else its default
_RUNNER_OPTIONS: tuple[tuple[str, type, str | None], ...] = (
    ("--max-running", int, "jobs at once (default 1)"),
    ("--ray-address", str, "run every job on this Ray cluster (default: a local Ray per job)"),
    ("--ray-jobs-url", str, "submit every job to this Ray Jobs API, e.g. http://head:8265 "
                            "($TOKENMILL_RAY_JOBS_URL; the state dir must be shared with the head)"),
    ("--ray-start-timeout-s", float, "seconds a job has to start or join Ray, else it ends FAILED infra "
                                     "(default 120; $TOKENMILL_RAY_START_TIMEOUT_S)"),
    ("--job-cpus", int, "CPUs of each job's local Ray when its spec leaves execution.num_cpus out (default: all)"),
    ("--max-job-cpus", int, "the most CPUs a spec may ask (execution.num_cpus, execution.parallelism; more gets "
                            "422); default: a local Ray, this machine's CPUs or --job-cpus if more; a cluster, "
                            "no limit ($TOKENMILL_MAX_JOB_CPUS)"),
    ("--max-body-bytes", int, None),
    ("--lease-s", float, "PostgreSQL: seconds before another replica takes over the jobs and schedules of one "
                         "that died (default 10; $TOKENMILL_LEASE_S)"),
)
_EDGE_OPTIONS: tuple[tuple[str, type, str | None], ...] = (
    ("--head-timeout-s", float, "seconds a connection has for a request's line and headers, else 408 and closed "
                                "(default 10; $TOKENMILL_HEAD_TIMEOUT_S)"),
    ("--body-timeout-s", float, "seconds a request has for its body after the headers, else 408 and closed "
                                "(default 10; $TOKENMILL_BODY_TIMEOUT_S)"),
    ("--keepalive-s", int, "seconds an idle connection stays open between requests (default 5; "
                           "$TOKENMILL_KEEPALIVE_S)"),
    ("--max-connections", int, "connections and requests in flight per process; more get 503 (default 1000; "
                               "$TOKENMILL_MAX_CONNECTIONS)"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill serve", description="Run the control plane (REST API + job runner).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--state-dir",
                   help="the default SQLite file, the lock, the folders of the jobs run here ($TOKENMILL_STATE_DIR)")
    add_database_options(p)
    p.add_argument("--root", action="append", default=[], metavar="[TEAM=]DIR",
                   help="a folder jobs may read and write (repeat; $TOKENMILL_ROOTS); TEAM=DIR: one of that team's "
                        "own roots, which its jobs use instead of the others")
    p.add_argument("--input-root", action="append", default=[], metavar="DIR", help="a folder jobs may only read")
    p.add_argument("--output-root", action="append", default=[], metavar="DIR", help="a folder jobs may write")
    for flag, kind, help_ in _RUNNER_OPTIONS:
        p.add_argument(flag, type=kind, help=help_)
    p.add_argument("--public-docs", action="store_true", help="serve /docs and /openapi.json without a key")
    for flag, kind, help_ in _EDGE_OPTIONS:
        p.add_argument(flag, type=kind, help=help_)
    p.add_argument("--log-level", default="info")
    p.add_argument("--workers", type=int, default=1, help="API processes on the port (default 1); one of them "
                   "runs the jobs and the schedules (a lock in the state folder decides which with SQLite, a lease "
                   "in the database with PostgreSQL)")
    return p


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
    fields = {flag[2:].replace("-", "_") for flag, _, _ in (*_RUNNER_OPTIONS, *_EDGE_OPTIONS)}
    return settings_of(args, input_roots=tuple(shared + args.input_root) or None,
                       output_roots=tuple(shared + args.output_root) or None,
                       team_roots=team_roots(args.root) or None, public_docs=args.public_docs or None,
                       freeze_gc=True, **{name: getattr(args, name) for name in sorted(fields)})


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

