"""``tokenmill demo``: build a demo corpus from this machine's Python packages and run the default job on it."""

from __future__ import annotations

import argparse
from pathlib import Path

from service.commands.run import run_spec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill demo")
    p.add_argument("--output", default="demo_out")
    p.add_argument("--max-bytes", type=int, default=20_000_000)
    p.add_argument("--parallelism", type=int)
    p.add_argument("--verbose", action="store_true", help="show Ray's own logs (by default they go to the job's log)")
    return p


def run(args: argparse.Namespace) -> int:
    from pipeline.demo import demo_spec  # lazy: imports pipeline.spec (pydantic, pyarrow, yaml; 0.3 s)
    from service.progress import PREFIX  # lazy: pipeline.job.fold's pydantic adapters and rich (0.1 s), not for -h

    spec = demo_spec(Path(args.output), max_bytes=args.max_bytes, parallelism=args.parallelism)
    print(f"{PREFIX} demo corpus and spec written under {Path(args.output).resolve()}", flush=True)
    return run_spec(spec, verbose=args.verbose)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

