"""``tokenmill demo``: build a demo corpus from this machine's Python packages and run the default job on it."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from service.commands.exits import EXIT_OK
from service.commands.run import run_spec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill demo")
    p.add_argument("--output", default="demo_out")
    p.add_argument("--max-bytes", type=int, default=20_000_000)
    p.add_argument("--parallelism", type=int)
    p.add_argument("--verbose", action="store_true", help="show Ray's own logs (by default they go to the job's log)")
    return p


def run(args: argparse.Namespace) -> int:
    from pipeline.demo import demo_spec, next_steps  # lazy: imports pipeline.spec (pydantic, pyarrow, yaml)
    from service.progress import PREFIX  # lazy: pipeline.job.fold's pydantic adapters and rich, not for -h

    spec = demo_spec(Path(args.output), max_bytes=args.max_bytes, parallelism=args.parallelism)
    print(f"{PREFIX} demo corpus and spec written under {Path(args.output).resolve()}", flush=True)
    code = run_spec(spec, verbose=args.verbose)
    if code == EXIT_OK:
        print(next_steps(Path(args.output), _program()), flush=True)
    return code


def _program() -> str:
    """How to call this tokenmill from here: ``tokenmill`` when it is the one on ``PATH``, else the path of the
    script next to this Python (``.venv/bin/tokenmill`` after ``make demo``)."""
    script = Path(sys.executable).parent / "tokenmill"
    found = shutil.which("tokenmill")
    if found and Path(found).resolve() == script.resolve():
        return "tokenmill"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

