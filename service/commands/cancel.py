"""``tokenmill cancel JOB``: cancel a job (a running one stops within seconds; nothing is published)."""

from __future__ import annotations

import argparse

from service.commands.http_client import Api
from service.commands.http_command import job_parser, print_state, run_requests


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("cancel", "Cancel a job (a running one stops within seconds; nothing is published).")
    return p


def run(args: argparse.Namespace) -> int:
    return run_requests(lambda: print_state(Api(args.server, args.api_key).request(
        "POST", f"/v1/jobs/{args.job_id}/cancel").json()))


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

