"""``tokenmill logs JOB``: a job process's log (its output and Ray's)."""

from __future__ import annotations

import argparse
import sys

from service.commands.exits import EXIT_OK
from service.commands.http_client import Api
from service.commands.http_command import job_parser, run_requests


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("logs", "A job process's log (its output and Ray's).")
    p.add_argument("--attempt", type=int, help="default: the latest")
    p.add_argument("--tail-bytes", type=int)
    return p


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        params = {k: v for k, v in (("attempt", args.attempt), ("tail_bytes", args.tail_bytes)) if v is not None}
        sys.stdout.write(Api(args.server, args.api_key).request("GET", f"/v1/jobs/{args.job_id}/logs",
                                                                params=params).text)
        sys.stdout.flush()
        return EXIT_OK

    return run_requests(go)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

