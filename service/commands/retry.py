"""``tokenmill retry JOB``: queue a FAILED or CANCELLED job again; it resumes where it stopped."""

from __future__ import annotations

import argparse

from service.commands.exits import EXIT_OK
from service.commands.follow import follow_job
from service.commands.http_client import Api
from service.commands.http_command import job_parser, print_state, run_requests


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("retry", "Queue a FAILED or CANCELLED job again; it resumes where it stopped.")
    p.add_argument("--follow", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        api = Api(args.server, args.api_key)
        print_state(api.request("POST", f"/v1/jobs/{args.job_id}/retry").json())
        return follow_job(api, args.job_id) if args.follow else EXIT_OK

    return run_requests(go)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

