"""``tokenmill status [JOB]``: a job's state and figures; without a job id, the latest jobs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from service.commands.exits import EXIT_OK
from service.commands.http_client import Api
from service.commands.http_command import http_parser, run_requests


def build_parser() -> argparse.ArgumentParser:
    p = http_parser("status", "A job's state and figures; without a job id, the latest jobs.")
    p.add_argument("job_id", nargs="?", help="the job's id, as `tokenmill submit` printed it (default: the "
                                             "latest jobs)")
    p.add_argument("--state", action="append", default=[], help="only jobs in this state (repeat)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        api = Api(args.server, args.api_key)
        if args.job_id:
            job = api.request("GET", f"/v1/jobs/{args.job_id}").json()
            print(json.dumps(job, indent=2) if args.json else describe(job))
            return EXIT_OK
        page = api.request("GET", "/v1/jobs", params={"state": args.state, "limit": args.limit}).json()
        if args.json:
            print(json.dumps(page, indent=2))
        for job in [] if args.json else page["items"]:
            err = f"  {job['error']['category']}: {job['error']['message']}" if job.get("error") else ""
            print(f"{job['id']}  {job['state']:<10} attempt {job['attempt']}  {job['created_at'][:19]}  "
                  f"{job['name']}{err}")
        return EXIT_OK

    return run_requests(go)


def describe(job: dict[str, Any]) -> str:
    """A job as ``tokenmill status JOB`` prints it: state, output, shards, tokens, throughput, stages, timings."""
    lines = [f"job        {job['id']} ({job['name']})", f"state      {job['state']}  attempt {job['attempt']}"]
    if job.get("error"):
        lines.append(f"error      {job['error']['category']}: {job['error']['message']}")
    lines.append(f"output     {job['output_path']}")
    if job.get("phase"):
        lines.append(f"phase      {job['phase']}")
    sh = job.get("shards") or {}
    lines.append(f"shards     {sh.get('done', 0)} done ({sh.get('reused', 0)} kept from an earlier attempt)"
                 f" of {sh.get('total') if sh.get('total') is not None else '?'}")
    if job.get("tokens") is not None:
        lines.append(f"tokens     {job['tokens']:,}  samples {job.get('samples') or 0:,}  "
                     f"documents {job.get('documents') if job.get('documents') is not None else '?'}")
    tp = job.get("throughput") or {}
    if tp.get("docs_per_s") or tp.get("tokens_per_s"):
        lines.append(f"throughput {tp.get('docs_per_s') or 0:,.1f} docs/s  {tp.get('tokens_per_s') or 0:,.1f} tokens/s")
    for st in job.get("stages") or []:
        dropped = ", ".join(f"{k} {v}" for k, v in (st.get("dropped") or {}).items())
        lines.append(f"  {st['stage']:<24} in {st['docs_in']:>9,}  out {st['docs_out']:>9,}"
                     + (f"  dropped: {dropped}" if dropped else ""))
    if job.get("timings"):
        lines.append("seconds    " + "  ".join(f"{k} {v:.1f}" for k, v in job["timings"].items()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

