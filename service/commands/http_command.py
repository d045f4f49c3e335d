"""What the commands that talk to a server share: the ``--server`` and ``--api-key`` options, a run that turns a
:class:`~service.commands.http_client.ClientError` into its ``error:`` lines and exit code, and the one line a
job's new state is printed as."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from service.commands.exits import EXIT_CANCELLED, EXIT_OK, error
from service.commands.http_client import DEFAULT_SERVER, ClientError

#: what every command taking a job's id says of it
JOB_ID_HELP = "the job's id, as `tokenmill submit` printed it"


def http_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command's parser with ``--server`` (default ``$TOKENMILL_SERVER``, else ``http://127.0.0.1:8000``) and
    ``--api-key`` (default ``$TOKENMILL_API_KEY``)."""
    p = argparse.ArgumentParser(prog=f"tokenmill {prog}", description=description)
    p.add_argument("--server", default=os.environ.get("TOKENMILL_SERVER", DEFAULT_SERVER))
    p.add_argument("--api-key", default=os.environ.get("TOKENMILL_API_KEY"), help="default: $TOKENMILL_API_KEY")
    return p


def job_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """:func:`http_parser` with the job's id, the positional argument of the commands acting on one job."""
    p = http_parser(prog, description)
    p.add_argument("job_id", help=JOB_ID_HELP)
    return p


def run_requests(fn: Callable[[], int]) -> int:
    """``fn()``'s exit code; a refusal or a server that does not answer is its ``error:`` lines, Ctrl-C 130."""
    try:
        return fn()
    except ClientError as exc:
        return error(exc, exc.code)
    except KeyboardInterrupt:
        return EXIT_CANCELLED


def print_state(job: dict[str, Any]) -> int:
    print(f"{job['id']} {job['state']}", flush=True)
    return EXIT_OK
