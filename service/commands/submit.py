"""``tokenmill submit SPEC``: submit a job spec to a tokenmill server and print the job's id (or, with
``--follow``, follow it to its end as ``tokenmill follow``). Exit 2 for a spec the server refused."""

from __future__ import annotations

import argparse
import json

from service.commands.exits import EXIT_OK, error
from service.commands.follow import follow_job
from service.commands.http_client import Api
from service.commands.http_command import http_parser, run_requests
from service.commands.run import SET_HELP


def build_parser() -> argparse.ArgumentParser:
    p = http_parser("submit", "Submit a job spec (YAML or JSON; relative paths resolve against its folder). "
                              "Prints the job's id.")
    p.add_argument("spec", help="the job spec file, YAML or JSON; its paths are sent absolute, relative ones "
                                "resolved against its folder (URIs such as s3://... as they are)")
    p.add_argument("--idempotency-key", help="submitting again with this key returns the same job")
    p.add_argument("--follow", action="store_true", help="then follow it to the end (as `tokenmill follow`)")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", dest="sets", help=SET_HELP)
    return p


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        # lazy: pydantic models, pyarrow and yaml (0.3 s)
        from pipeline.overrides import load_spec_with
        from pipeline.spec import SpecError

        try:  # the server checks the files: they are where it runs
            spec = load_spec_with(args.spec, args.sets, check_files=False)
        except SpecError as exc:
            return error(exc)
        api = Api(args.server, args.api_key)
        headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
        job = api.request("POST", "/v1/jobs", json=spec.model_dump(mode="json"), headers=headers).json()
        print(json.dumps(job, indent=2) if args.json else job["id"], flush=True)
        return follow_job(api, job["id"]) if args.follow else EXIT_OK

    return run_requests(go)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

