"""``tokenmill eval --model CKPT --tasks TASK[,TASK...]``: score a checkpoint on held-out text and benchmarks.

Prints one Markdown table (``--json``/``--markdown`` write the report to files too). With ``--job OUT``, each
benchmark task is also scored on the items the job that made the training data did not find in it. On CPU, in
one process, deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.evaluate.bench import BenchError
from training.evaluate.contamination import found_items
from training.evaluate.report import markdown
from training.evaluate.scorer import EvalError, checkpoint_folder, load_scorer
from training.evaluate.tasks import KINDS, evaluate, parse_tasks


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of items >= 1 is needed, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill eval", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True,
                   help="a checkpoint folder (RUN/checkpoints/step-N) or a run's output folder (its latest checkpoint)")
    p.add_argument("--tasks", required=True,
                   help=f"comma-separated [NAME=]KIND:PATH; KIND: {', '.join(KINDS)} (bpb: a shard set folder or "
                        "a JSONL of {text}; the others: the benchmark JSONL files the decontaminate stage reads)")
    p.add_argument("--job", help="the output folder of the job that made the training data: benchmark scores are "
                                 "also given on the items its decontaminate stage did not find")
    p.add_argument("--json", help="write the report as JSON to this file")
    p.add_argument("--markdown", help="write the table as Markdown to this file")
    p.add_argument("--limit", type=_positive, help="score only the first N items (sequences, documents) of each task")
    p.add_argument("--tokenizer", help="the tokenizer.json to use (default: the run's data's)")
    return p


def run(args: argparse.Namespace) -> dict:
    specs = parse_tasks(args.tasks)
    found = found_items(args.job) if args.job else None
    scorer = load_scorer(args.model, args.tokenizer)
    return {"model": str(checkpoint_folder(args.model)), "tasks": evaluate(scorer, specs, args.limit, found)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = run(args)
    except (EvalError, BenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = markdown(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
