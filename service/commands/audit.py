"""``tokenmill audit``: the audit trail, newest first: every mutating request and every refusal (an admin
key's)."""

from __future__ import annotations

import argparse
import json

from service.commands.exits import EXIT_OK
from service.commands.http_client import Api
from service.commands.http_command import http_parser, run_requests


def build_parser() -> argparse.ArgumentParser:
    p = http_parser("audit", "The audit trail, newest first: every mutating request and every refusal "
                             "(an admin key's).")
    p.add_argument("--team", help="only this team's keys")
    p.add_argument("--key-id", help="only this key's")
    p.add_argument("--outcome", choices=("ok", "refused"))
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        params = {k: v for k, v in (("team", args.team), ("key_id", args.key_id), ("outcome", args.outcome),
                                    ("limit", args.limit)) if v is not None}
        page = Api(args.server, args.api_key).request("GET", "/v1/audit", params=params).json()
        if args.json:
            print(json.dumps(page, indent=2))
            return EXIT_OK
        for e in page["items"]:
            who = f"{e['key_id'] or '-'} ({e['key_name'] or '?'}, {e['role'] or '-'} of {e['team'] or '-'})"
            why = f"  {e['detail']}" if e.get("detail") else ""
            print(f"{e['at'][:19]}  {e['outcome']:<7} {e['status']}  {who}  {e['action']}  {e['target']}{why}")
        return EXIT_OK

    return run_requests(go)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

