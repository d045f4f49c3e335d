"""``tokenmill`` command line: run a job, run the demo, inspect a shard set, plan, train.

Errors a user can fix (an invalid spec, an existing output, bad input) print one line per problem and exit 2,
without a traceback; a failure of the program or the machine exits 1, a cancelled job (SIGINT, SIGTERM) 130.
Ray's own logs go to the job's log file unless ``--verbose``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.job.errors import JobCancelled, JobError
from pipeline.job.signals import cancel_on_signals
from pipeline.job.summary import format_summary

EXIT_USAGE = 2
#: a failure of the program or the machine (Ray lost a worker, a bug), not of what the user gave
EXIT_FAILURE = 1
#: like a shell's exit code for a process stopped by SIGINT
EXIT_CANCELLED = 130


def _err(msg: str, code: int = EXIT_USAGE) -> int:
    for line in msg.splitlines():
        print(f"error: {line}", file=sys.stderr, flush=True)
    return code


def _progress(msg: str) -> None:
    from service.progress import PREFIX  # lazy: pipeline.job.fold's pydantic adapters and rich (0.1 s), not for --help

    print(f"{PREFIX} {msg}", flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    # lazy: the spec's models pull pydantic, pyarrow and yaml (0.3 s): --help and the delegated commands need none
    from pipeline.preflight import load_checked
    from pipeline.spec import SpecError, parse_spec

    try:
        spec = load_checked(args.spec)
    except SpecError as exc:
        return _err(str(exc))
    data = spec.model_dump()
    if args.parallelism is not None:
        data["execution"]["parallelism"] = args.parallelism
    if args.address:
        data["execution"]["address"] = args.address
    if args.overwrite:
        data["output"]["overwrite"] = True
    try:  # validated again, so a flag gets the same checks as the spec field it overrides
        spec = parse_spec(data)
    except SpecError as exc:
        return _err(str(exc))
    timeout = args.ray_start_timeout_s
    if timeout is not None and not timeout > 0:
        return _err(f"--ray-start-timeout-s: {timeout:g} is not a positive number of seconds")
    return _run(spec, verbose=args.verbose, ray_start_timeout_s=timeout)


def _run(spec: Any, verbose: bool = False, ray_start_timeout_s: float | None = None) -> int:
    """Run ``spec`` with a live progress view; SIGINT/SIGTERM cancel it (exit 130), a second SIGINT exits at once.

    One line per failure: ``cancelled: ...`` (130), ``error: ...`` (2 for a bad spec or input, 1 for a
    failure of the program or the machine, ``app`` or ``infra``: a Ray that cannot start or be reached, a
    full disk); on success the summary table.
    """
    if verbose:  # read by pipeline.job.ray_env.init_ray, here and in anything this process starts
        os.environ["TOKENMILL_VERBOSE"] = "1"
    # lazy: the engine, the tokenizer and the live view pull tokenizers, pyarrow, pydantic and rich (0.4 s)
    from pipeline.job.engine import Job
    from service.progress import make_renderer

    renderer = make_renderer(verbose=verbose)
    job = Job(spec, on_event=renderer, ray_start_timeout_s=ray_start_timeout_s)
    try:
        with renderer, cancel_on_signals(job, renderer.cancelling):
            result = job.run()
    except JobCancelled as exc:
        print(f"cancelled: {exc}", file=sys.stderr, flush=True)
        return EXIT_CANCELLED
    except KeyboardInterrupt:  # the signal came after the job's own handling ended
        print("cancelled", file=sys.stderr, flush=True)
        return EXIT_CANCELLED
    except JobError as exc:  # every failure of the job (Ray that cannot start or be reached is infra: exit 1)
        if exc.category in ("validation", "input"):
            return _err(str(exc))
        ray_env = sys.modules.get("pipeline.job.ray_env")  # imported only if Ray was started
        log = ray_env.ray_log_path() if ray_env else None
        return _err(f"{exc} (Ray's log: {log})" if log else str(exc), EXIT_FAILURE)
    print(format_summary(result.stats, result.output_dir), flush=True)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.demo import demo_spec  # lazy: imports pipeline.spec (pydantic, pyarrow, yaml; 0.3 s)

    spec = demo_spec(Path(args.output), max_bytes=args.max_bytes, parallelism=args.parallelism)
    _progress(f"demo corpus and spec written under {Path(args.output).resolve()}")
    return _run(spec, verbose=args.verbose)


def cmd_inspect(args: argparse.Namespace) -> int:
    # lazy: numpy, tokenizers and pyarrow (0.2 s), not for --help or the other commands
    from pipeline.output.inspect import (
        Decoder,
        decode_documents,
        documents_index_name,
        iter_samples,
        split_documents,
        verify_shards,
    )
    from pipeline.shard_format import Manifest

    out = Path(args.output)
    if not (out / "manifest.json").exists() and documents_index_name(out) is not None:
        return _inspect_documents(out, args)
    try:
        manifest = Manifest.load(out)
    except (OSError, ValueError) as exc:
        return _err(f"{out}: no readable manifest.json ({exc})")
    print(f"shard set   {out}")
    print(f"samples     {manifest.total_samples} in {len(manifest.shards)} shard(s) of {manifest.samples_per_shard}")
    print(f"tokens      {manifest.total_tokens} (seq_len {manifest.seq_len}, dtype {manifest.dtype}, "
          f"vocab {manifest.vocab_size})")
    print(f"fill        {manifest.total_tokens / max(1, manifest.total_samples * manifest.seq_len):.2%}")
    print(f"bos/eos/pad {manifest.bos_id}/{manifest.eos_id}/{manifest.pad_id}   loss mask: {manifest.has_loss_mask}")
    print(f"spec        {manifest.spec_hash[:16]}   tokenizer {manifest.tokenizer_hash[:16]}")
    bad = 0 if args.no_verify else _report_checks(verify_shards(out, manifest))
    try:  # every read is bounded and checked: a bad shard set ends in one line naming the shard
        if args.decode:
            decoder = Decoder(out, manifest)
            for n, sample in enumerate(iter_samples(out, manifest)):
                if n >= args.decode:
                    break
                print(f"--- sample {sample.key}: {len(sample.input_ids)} tokens, {len(sample.doc_lens)} document(s)")
                for doc_id, ids in zip(sample.meta.get("doc_ids", []), split_documents(sample), strict=False):
                    text = decoder.decode(ids)
                    shown = text if args.full or len(text) <= 300 else text[:300] + f"... [{len(text)} chars]"
                    print(f"[{doc_id}] {shown}")
        if args.export_docs:
            docs = decode_documents(out)
            with open(args.export_docs, "w", encoding="utf-8") as f:
                for ord_, text in sorted(docs.items()):
                    f.write(json.dumps({"ord": ord_, "text": text}, ensure_ascii=False) + "\n")
            print(f"documents   {len(docs)} re-assembled and decoded to {args.export_docs}")
    except (OSError, ValueError) as exc:  # ShardFormatError is a ValueError
        return _err(f"{out}: {exc}")
    if args.json:
        print(json.dumps({"samples": manifest.total_samples, "tokens": manifest.total_tokens, "bad_shards": bad}))
    return 1 if bad else 0


def _report_checks(checks: list[Any]) -> int:
    """Print each failed checksum and the tally; returns how many failed."""
    bad = [c for c in checks if not c.ok]
    for check in bad:
        print(f"BAD {check.name}: {check.problem}")
    print(f"checksums   {len(checks) - len(bad)}/{len(checks)} OK")
    return len(bad)


def _inspect_documents(out: Path, args: argparse.Namespace) -> int:
    """A documents-only output (``tokenizer: null``): its listing, checksums, the first documents."""
    from pipeline.output.inspect import iter_documents, load_documents_index, verify_documents  # lazy: see cmd_inspect

    try:
        index = load_documents_index(out)
        print(f"documents   {out}: {index.rows} in {len(index.parts)} {index.format} part(s)")
        bad = 0 if args.no_verify else _report_checks(verify_documents(out, index))
        for n, doc in enumerate(iter_documents(out, index) if args.decode else ()):
            if n >= args.decode:
                break
            text = doc["text"] if args.full or len(doc["text"]) <= 300 else doc["text"][:300] + "..."
            print(f"[{doc['id']}] {text}")
    except (OSError, ValueError) as exc:
        return _err(f"{out}: {exc}")
    if args.json:
        print(json.dumps({"documents": index.rows, "parts": len(index.parts), "bad_parts": bad}))
    return 1 if bad else 0


def cmd_delegate(module: str, argv: list[str]) -> int:
    return importlib.import_module(module).main(argv)


def version() -> str:
    """The installed package's version (its metadata), ``unknown`` when run from a tree that is not installed."""
    from importlib import metadata

    try:
        return metadata.version("tokenmill")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill", description="Curate, tokenize and pack corpora into shards.")
    p.add_argument("--version", action="version", version=f"tokenmill {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of (each has its own -h):")

    r = sub.add_parser("run", help="run a job spec (YAML or JSON)")
    r.add_argument("spec", help="the job spec file, YAML or JSON (relative paths in it are relative to its folder)")
    r.add_argument("--parallelism", type=int, help="workers per stage (overrides the spec)")
    r.add_argument("--address", help="Ray address of an existing cluster (overrides the spec)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing shard set")
    r.add_argument("--ray-start-timeout-s", type=float, metavar="S",
                   help="seconds to start or join Ray, else the job fails (infra, exit 1; default 120)")
    r.add_argument("--verbose", action="store_true", help="show Ray's own logs (by default they go to the job's log)")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="build a demo corpus from this machine's Python packages and run it")
    d.add_argument("--output", default="demo_out")
    d.add_argument("--max-bytes", type=int, default=20_000_000)
    d.add_argument("--parallelism", type=int)
    d.add_argument("--verbose", action="store_true", help="show Ray's own logs (by default they go to the job's log)")
    d.set_defaults(func=cmd_demo)

    i = sub.add_parser("inspect", help="summarize a shard set, verify checksums, decode samples")
    i.add_argument("output", help="a job's output folder (a shard set, or a documents-only output)")
    i.add_argument("--decode", type=int, default=0, metavar="N", help="decode the first N samples to text")
    i.add_argument("--full", action="store_true", help="print decoded documents whole")
    i.add_argument("--no-verify", action="store_true")
    i.add_argument("--export-docs", metavar="FILE", help="write every document, re-assembled and decoded, as JSONL")
    i.add_argument("--json", action="store_true", help="end with one JSON line")
    i.set_defaults(func=cmd_inspect)

    for name, (_, help_) in DELEGATES.items():
        sub.add_parser(name, help=f"{help_} (see `tokenmill {name} -h`)", add_help=False)
    return p


#: commands whose module parses its own arguments: name -> (module with ``main(argv) -> int``, help)
DELEGATES: dict[str, tuple[str, str]] = {
    "plan": ("training.plan", "compute-optimal sizes, memory and cost"),
    "train": ("training.train", "train on a shard set"),
    "mix": ("service.commands.mix", "blend shard sets by weight or token budget into a mixture"),
    "report": ("pipeline.filters.report", "what each filter would drop, from an annotate-mode output"),
    "train-classifier": ("pipeline.filters.train_classifier", "train a fastText quality or language classifier"),
    "contamination-report": ("pipeline.decontam.report", "check a corpus or a shard set against benchmarks"),
    "card": ("pipeline.card.cli", "(re)build an output's dataset card: CARD.md and its figures"),
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATES:
        return cmd_delegate(DELEGATES[argv[0]][0], argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
