"""``tokenmill follow JOB``: follow a job's events to its end (the same display as ``tokenmill run``, and the same
summary table once it has SUCCEEDED, from the output's ``stats.json``); exits with its outcome: 0 SUCCEEDED,
130 CANCELLED, 2 FAILED for a bad spec or input, 1 else."""

from __future__ import annotations

import argparse
import sys
import time

import httpx

from pipeline.job import events as ev
from service.commands.exits import EXIT_CANCELLED, EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from service.commands.http_client import Api, ClientError
from service.commands.http_command import job_parser, run_requests

#: seconds between reconnections after the stream broke (the server restarting)
RECONNECT_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("follow", "Follow a job's events to its end; exits with its outcome.")
    p.add_argument("--verbose", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    return run_requests(lambda: follow_job(Api(args.server, args.api_key), args.job_id, args.verbose))


def follow_job(api: Api, job_id: str, verbose: bool = False) -> int:
    """Render the job's events until it ends (also ``submit --follow``, ``retry --follow``); reconnects with
    Last-Event-ID when the stream breaks (a server restart)."""
    from service.progress import PREFIX, make_renderer  # lazy: pipeline.job.fold's pydantic adapters, rich (0.08 s)

    renderer = make_renderer(verbose=verbose)
    last, final = 0, None
    with renderer:
        while final is None:
            try:
                for seq, kind, data in api.events(job_id, last):
                    last = seq
                    if kind == "state":
                        msg = f" ({data['message']})" if data.get("message") else ""
                        print(f"{PREFIX} job {job_id}: {data['state']}, attempt {data.get('attempt')}{msg}",
                              file=sys.stderr, flush=True)
                        final = data if data["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None
                    elif kind in ev.EVENT_TYPES:
                        renderer(ev.from_dict(data))
            except httpx.TransportError as exc:
                print(f"{PREFIX} stream interrupted ({exc}); reconnecting", file=sys.stderr, flush=True)
                time.sleep(RECONNECT_S)
                continue
            if final is None:  # the server ended the stream without a final state: ask again
                time.sleep(RECONNECT_S)
    if final["state"] == "SUCCEEDED":
        print_summary(api, job_id)
        return EXIT_OK
    if final["state"] == "CANCELLED":
        return EXIT_CANCELLED
    return EXIT_USAGE if final.get("category") in ("validation", "input") else EXIT_FAILURE


def print_summary(api: Api, job_id: str) -> None:
    """What ``tokenmill run`` prints at the end (:func:`pipeline.job.summary.format_summary`), from the job's
    output folder and its published ``stats.json``; a note on stderr when the server cannot serve it (a later
    job replaced the output), since the job itself succeeded."""
    from pipeline.job.summary import format_summary
    from service.progress import PREFIX

    try:
        output = api.request("GET", f"/v1/jobs/{job_id}").json()["output_path"]
        stats = api.request("GET", f"/v1/jobs/{job_id}/artifacts/stats.json").json()
    except ClientError as exc:
        print(f"{PREFIX} no summary: {exc}", file=sys.stderr, flush=True)
        return
    print(format_summary(stats, output), flush=True)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

