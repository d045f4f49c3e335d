"""``tokenmill cancel JOB``: cancel a job (a running one stops within seconds; nothing is published)."""

from __future__ import annotations

import argparse
import sys

from service.commands.http_client import Api
from service.commands.http_command import JOB_ID_HELP, http_parser, print_state, run_requests


def build_parser() -> argparse.ArgumentParser:
    p = http_parser("cancel", "Cancel a job (a running one stops within seconds; nothing is published).")
    p.add_argument("job_id", help=JOB_ID_HELP)
    return p


def run(args: argparse.Namespace) -> int:
    return run_requests(lambda: print_state(Api(args.server, args.api_key).request(
        "POST", f"/v1/jobs/{args.job_id}/cancel").json()))


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
