"""``tokenmill`` command line: ``tokenmill COMMAND ARGS`` runs ``main(ARGS)`` of the one module
:data:`COMMANDS` names for it, and nothing else.

Each command's module parses its own arguments (its ``build_parser``; ``tokenmill COMMAND -h``) and runs it (its
``run``); it is imported only when its command runs, so ``tokenmill -h`` and each command pay for their own
imports alone. ``python -m service.cli COMMAND ARGS`` is the same without the installed entry point. Exit codes
(:mod:`service.commands.exits`): 0 done, 2 what the user gave cannot be used (one ``error:`` line per problem, no
traceback), 1 a failure of the program, the machine or a server, 130 a cancelled job.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from service.commands.exits import EXIT_PIPE_CLOSED, EXIT_USAGE, error

#: every command: name -> (its module, with ``main(argv) -> int``; the help line ``tokenmill -h`` shows)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("service.commands.run", "run a job spec (YAML or JSON)"),
    "demo": ("service.commands.demo", "build a demo corpus from this machine's Python packages and run it"),
    "inspect": ("service.commands.inspect", "summarize a shard set, verify checksums, decode samples"),
    "plan": ("training.plan", "compute-optimal sizes, memory and cost"),
    "train": ("training.train", "train on a shard set"),
    "eval": ("training.evaluate.cli", "score a checkpoint: bits per byte of held-out text, benchmark tasks"),
    "ablate": ("service.commands.ablate", "train proxy models on pipeline variants and compare them"),
    "mix": ("service.commands.mix", "blend shard sets by weight or token budget into a mixture"),
    "report": ("pipeline.filters.report", "what each filter would drop, from an annotate-mode output"),
    "train-classifier": ("pipeline.filters.train_classifier", "train a fastText quality or language classifier"),
    "contamination-report": ("pipeline.decontam.report", "check a corpus or a shard set against benchmarks"),
    "card": ("pipeline.card.cli", "(re)build an output's dataset card: README.md and its figures"),
    "serve": ("service.commands.serve", "run the control plane: REST API and job runner"),
    "submit": ("service.commands.submit", "submit a job spec to a tokenmill server"),
    "status": ("service.commands.status", "a job's state and figures, or the latest jobs"),
    "follow": ("service.commands.follow", "follow a job's events to its end"),
    "logs": ("service.commands.logs", "a job's log"),
    "cancel": ("service.commands.cancel", "cancel a job"),
    "retry": ("service.commands.retry", "resume a failed or cancelled job"),
    "apikey": ("service.commands.apikey", "create, list or revoke API keys"),
    "audit": ("service.commands.audit", "who did what: every mutating request and refusal (admins)"),
}


def version() -> str:
    """The installed package's version (its metadata), ``unknown`` when run from a tree that is not installed."""
    from importlib import metadata

    try:
        return metadata.version("tokenmill")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """``tokenmill``'s own parser: ``--version``, ``-h`` and the list of commands (each parses its own options)."""
    p = argparse.ArgumentParser(prog="tokenmill", description="Curate, tokenize and pack corpora into shards.")
    p.add_argument("--version", action="version", version=f"tokenmill {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of (each has its own -h):")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=f"{help_} (see `tokenmill {name} -h`)", add_help=False)
    return p


def command_main(name: str) -> Callable[[list[str]], int]:
    """The ``main(argv) -> int`` of the command ``name``: its module is imported now."""
    run: Callable[[list[str]], int] = importlib.import_module(COMMANDS[name][0]).main
    return run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        try:
            return command_main(argv[0])(argv[1:])
        except BrokenPipeError:
            return _pipe_closed()
        except ModuleNotFoundError as exc:
            return _missing_extra(argv[0], exc)
    build_parser().parse_args(argv)  # -h, --version, no command or an unknown one: argparse says so and exits
    return 2


def _missing_extra(command: str, exc: ModuleNotFoundError) -> int:
    """A module of an optional extra is not installed: one line naming the extra to install (exit 2); any other
    missing module is a bug of ours and keeps its traceback."""
    from kernels.extras import missing_extra_message

    message = missing_extra_message(f"tokenmill {command}", exc)
    if message is None:
        raise exc
    return error(message, EXIT_USAGE)


def _pipe_closed() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as a Unix tool does. stdout goes to /dev/null so
    that the interpreter's last flush at exit does not fail again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
