"""``tokenmill train-classifier``: train a fastText supervised classifier (quality or language) from JSONL.

Two ways to give data: labelled records (``--input FILES``, label in ``--label-field``), or two corpora
(``--positive FILES --negative FILES``, labelled ``--positive-label hq`` / ``--negative-label lq``). Files are
JSONL, plain, gzip or zstd. ``--exclude-field in_dev`` skips records whose field is true (the LID training set
marks its dev paragraphs that way), so the same command trains the ``quality_classifier`` model and a ``lid``
model.

Presets (:data:`PRESETS`) are the hyper-parameter defaults; a flag given on the command line always wins.
``none``: fastText's supervised defaults, word bigrams as in its tutorial. ``lid``: the language-ID recipe
(label field ``lang``; chosen by default when ``--label-field lang`` is given): character 2-4-grams as lid.176,
word unigrams, words seen twice, 16 dimensions, 200k hash buckets, lr 0.5, at most 6,000 examples per language.
Why (measured with bench/eval_lid.py on lid_train -> lid_dev, 2 cores): fastText's defaults (2M buckets x 100
dimensions, word bigrams, lr 0.1) train for 2 minutes at 2.5 GB, write a 1 GB model and under-train the small
languages of an unbalanced corpus (macro 0.88, Swedish 0.12); lr 0.5 alone lifts macro from 0.92 to 0.99; the
preset scores ~0.99 macro, trains in ~15-25 s at ~370 MB and writes 24 MB. Not quantized by default:
``--quantize`` (5.5 MB, same accuracy) takes longer than the training itself. ``--min-per-label`` (repeat a
small label's examples) is off: it teaches Romanian and Danish (35 and 128 paragraphs, all man pages) but
costs Bokmal, and the macro over the large languages.

A stratified fraction (``--holdout``, drawn with ``--seed``) of every label is held out; the model written
(``--output``, or its ``.ftz`` with ``--quantize``) is evaluated on it and the report (accuracy, macro F1,
precision / recall / F1 and n per label) is printed and written next to the model as ``<name>.report.json``.

Records are held in memory: fastText reads its training file in order, so the lines must be shuffled, and a
file of one corpus after the other would train on one label, then the other. ``--max-per-label`` caps a
dominant label (a random sample of it) for speed and balance.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from pipeline.filters.fasttext_model import LABEL_PREFIX, FastTextModel, model_text
from pipeline.readers.compression import open_binary

Example = tuple[str, str]  # (label, text)


class UserError(Exception):
    """A problem with the command line or the data: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


#: fastText's supervised defaults (word bigrams as in its tutorial): the ``none`` preset
FASTTEXT_DEFAULTS: dict[str, Any] = {
    "label_field": "label", "epoch": 5, "lr": 0.1, "word_ngrams": 2, "dim": 100, "min_count": 1, "minn": 0,
    "maxn": 0, "bucket": 2_000_000, "loss": "softmax", "max_per_label": None, "min_per_label": 0, "holdout": 0.1,
    "quantize": False, "cutoff": 0,
}
#: what each preset changes from FASTTEXT_DEFAULTS (measured on lid_train -> lid_dev: see bench/eval_lid.py)
PRESETS: dict[str, dict[str, Any]] = {
    "none": {},
    "lid": {
        "label_field": "lang",
        "minn": 2, "maxn": 4,  # character n-grams, as lid.176: they carry a language's spelling
        "word_ngrams": 1, "min_count": 2,  # word bigrams and hapaxes add rows, not accuracy
        # the size bound: 4 bytes x dim x (words + buckets), 16 x (134k + 200k) on lid_train: 24 MB, not 1 GB
        "dim": 16, "bucket": 200_000,
        "lr": 0.5,  # fastText's 0.1 under-trains the small languages in 5 epochs
        "max_per_label": 6000,  # lid_train holds 22k German paragraphs and 35 Romanian ones
        "holdout": 0.05,
    },
}
#: the label field that selects the ``lid`` preset when no ``--preset`` is given
LID_LABEL_FIELD = "lang"


def _shown(value: Any) -> Any:
    """A default as ``--help`` says it: ``--quantize`` on/off, no ``--max-per-label`` cap 0."""
    return {True: "on", False: "off"}[value] if isinstance(value, bool) else 0 if value is None else value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokenmill train-classifier", description=__doc__.split("\n\n")[0])

    def default(name: str) -> str:
        base, lid = FASTTEXT_DEFAULTS[name], PRESETS["lid"].get(name, FASTTEXT_DEFAULTS[name])
        return f"default {_shown(base)}" + (f", lid preset {_shown(lid)}" if lid != base else "")

    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help=f"hyper-parameter defaults; flags given here win (default: lid with --label-field "
                        f"{LID_LABEL_FIELD}, else none = fastText's)")
    data = p.add_argument_group("data")
    data.add_argument("--input", nargs="+", metavar="FILE", help="labelled JSONL(.gz) records")
    data.add_argument("--positive", nargs="+", metavar="FILE", help="JSONL(.gz) of the positive class")
    data.add_argument("--negative", nargs="+", metavar="FILE", help="JSONL(.gz) of the negative class")
    data.add_argument("--positive-label", default="hq", help="default hq")
    data.add_argument("--negative-label", default="lq", help="default lq")
    data.add_argument("--text-field", default="text", help="default text")
    data.add_argument("--label-field", help=f"with --input ({default('label_field')})")
    data.add_argument("--exclude-field", action="append", default=[], metavar="FIELD",
                      help="skip records where FIELD is true (repeatable), e.g. in_dev")
    data.add_argument("--max-per-label", type=int, metavar="N",
                      help=f"a random sample of at most N per label (0: all; {default('max_per_label')})")
    data.add_argument("--min-per-label", type=int, metavar="N",
                      help=f"repeat a smaller label's training examples up to N (never the held-out ones; "
                           f"{default('min_per_label')})")
    data.add_argument("--holdout", type=float,
                      help=f"fraction of each label held out for the report ({default('holdout')})")
    data.add_argument("--seed", type=int, default=0, help="holdout, sampling, shuffle and fastText's own seed")
    out = p.add_argument_group("output")
    out.add_argument("--output", required=True, metavar="MODEL", help="model file (e.g. model.bin)")
    out.add_argument("--quantize", action=argparse.BooleanOptionalAction,
                     help=f"write a quantized model, MODEL with suffix .ftz ({default('quantize')})")
    out.add_argument("--cutoff", type=int,
                     help=f"with --quantize: keep the N most useful rows and retrain (0: all; {default('cutoff')})")
    out.add_argument("--json", action="store_true", help="print only the report, as one JSON line")
    hp = p.add_argument_group("fastText")
    hp.add_argument("--epoch", type=int, help=default("epoch"))
    hp.add_argument("--lr", type=float, help=default("lr"))
    hp.add_argument("--word-ngrams", type=int, help=default("word_ngrams"))
    hp.add_argument("--dim", type=int, help=default("dim"))
    hp.add_argument("--min-count", type=int, help=default("min_count"))
    hp.add_argument("--minn", type=int, help=f"min character n-gram ({default('minn')})")
    hp.add_argument("--maxn", type=int, help=f"max character n-gram ({default('maxn')})")
    hp.add_argument("--bucket", type=int, help=f"hash buckets of n-grams ({default('bucket')})")
    hp.add_argument("--loss", choices=["softmax", "hs", "ova", "ns"], help=default("loss"))
    hp.add_argument("--threads", type=int, default=_cores(),
                    help=f"training threads (1 to this machine's cores, default {_cores()}; 1 makes a run "
                         "reproducible)")
    hp.add_argument("--verbose", action="store_true", help="show fastText's training progress")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` and fill every option not given from the preset (``args.preset`` says which ran)."""
    args = build_parser().parse_args(argv)
    if args.preset is None:
        args.preset = "lid" if args.label_field == LID_LABEL_FIELD else "none"
    values = FASTTEXT_DEFAULTS | PRESETS[args.preset]
    for name, value in values.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        report = train(args)
    except UserError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if not args.json:
        print(render(report))
    print(json.dumps(report, ensure_ascii=False))
    return 0


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Read, split, train, (quantize), save, evaluate; returns the report (also written next to the model)."""
    _check_args(args)
    examples, skipped = load_examples(args)
    labels = Counter(label for label, _ in examples)
    if len(labels) < 2:
        raise UserError(f"need at least two labels to train a classifier, found {sorted(labels)} "
                        f"in {len(examples)} usable records")
    rng = random.Random(args.seed)
    if args.max_per_label:
        examples = cap_per_label(examples, args.max_per_label, rng)
    train_set, holdout = split(examples, args.holdout, rng)
    n_train_per_label = Counter(lab for lab, _ in train_set)
    if args.min_per_label:
        train_set = oversample(train_set, args.min_per_label, rng)
    rng.shuffle(train_set)

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    model_path = output.with_suffix(".ftz") if args.quantize else output
    params = {"epoch": args.epoch, "lr": args.lr, "wordNgrams": args.word_ngrams, "dim": args.dim,
              "minCount": args.min_count, "minn": args.minn, "maxn": args.maxn, "bucket": args.bucket,
              "loss": args.loss, "thread": args.threads, "seed": args.seed}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".train-classifier-") as tmp:
        train_file = Path(tmp) / "train.txt"
        write_fasttext_file(train_file, train_set)
        import fasttext  # native extension: only once the training set is written (``--help`` stays fast)

        try:
            with zero_filled_malloc():
                model = fasttext.train_supervised(input=str(train_file), verbose=2 if args.verbose else 0, **params)
                if args.quantize:
                    model.quantize(input=str(train_file), qnorm=True, retrain=args.cutoff > 0, cutoff=args.cutoff,
                                   thread=args.threads, verbose=2 if args.verbose else 0)
        except (RuntimeError, ValueError) as exc:  # fastText's own refusals ("Empty vocabulary", divergence)
            hint = " (training diverged: lower --lr)" if "NaN" in str(exc) else ""
            raise UserError(f"fastText: {exc}{hint}") from None
        model.save_model(str(model_path))
    seconds = time.perf_counter() - t0

    report: dict[str, Any] = {
        "model": str(model_path),
        "labels": sorted(labels),
        "n_train": sum(n_train_per_label.values()),
        "n_train_lines": len(train_set),
        "n_holdout": len(holdout),
        "n_train_per_label": dict(sorted(n_train_per_label.items())),
        "skipped": skipped,
        "train_seconds": round(seconds, 2),
        "model_mb": round(model_path.stat().st_size / 1e6, 2),
        "preset": args.preset,
        "params": params | {"holdout": args.holdout, "max_per_label": args.max_per_label,
                            "min_per_label": args.min_per_label, "quantize": args.quantize, "cutoff": args.cutoff},
    }
    report |= evaluate(FastTextModel(model_path), holdout)
    report_path = model_path.with_suffix(".report.json")
    report["report"] = str(report_path)
    report_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report


@contextmanager
def zero_filled_malloc() -> Iterator[bool]:
    """Make every malloc return zeroed memory while fastText trains (glibc; elsewhere a no-op, yields False).

    Why: fastText initialises only ``thread / 10`` of its input matrix (``DenseMatrix::uniform`` splits it in
    10 blocks, one per thread: fastText issue #1061); upstream the rest is zero, but in this wheel it is
    whatever the heap held before, so with fewer than 10 threads a model trained in a busy process starts from
    garbage and, now and then, dies with "Encountered NaN." (seen 2 times in 25 runs of the same command).
    glibc's ``M_PERTURB`` fills each allocation with ``byte ^ 0xff``: 0xff gives zeros, the upstream behaviour.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        yield False
        return
    m_perturb = -6  # M_PERTURB in glibc's malloc.h
    if mallopt(m_perturb, 0xFF) != 1:
        yield False
        return
    try:
        yield True
    finally:
        mallopt(m_perturb, 0)


def _check_args(args: argparse.Namespace) -> None:
    if args.input and (args.positive or args.negative):
        raise UserError("give --input, or --positive and --negative, not both")
    if not args.input and not (args.positive and args.negative):
        raise UserError("give --input FILE... (labelled records) or --positive FILE... --negative FILE...")
    if not 0.0 <= args.holdout < 1.0:
        raise UserError(f"--holdout must be in [0, 1), got {args.holdout}")
    if args.threads < 1 or args.threads > _cores():
        raise UserError(f"--threads must be 1 to {_cores()} (this machine's cores), got {args.threads}")
    for name in ("epoch", "dim", "word_ngrams", "min_count", "bucket"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.lr > 0:
        raise UserError(f"--lr must be above 0, got {args.lr}")
    if args.minn < 0 or args.maxn < 0 or (args.maxn and args.maxn < args.minn):
        raise UserError(f"--minn and --maxn must be 0 (no character n-grams) or 1 <= minn <= maxn, "
                        f"got {args.minn} and {args.maxn}")
    if args.cutoff < 0:
        raise UserError(f"--cutoff must be at least 0, got {args.cutoff}")
    if args.cutoff and not args.quantize:
        raise UserError(f"--cutoff {args.cutoff} needs --quantize (it prunes the quantized model's rows)")
    if args.max_per_label is not None and args.max_per_label < 0:
        raise UserError(f"--max-per-label must be at least 0 (0: no cap), got {args.max_per_label}")
    if args.min_per_label < 0:
        raise UserError(f"--min-per-label must be at least 0 (0: no repeats), got {args.min_per_label}")
    if args.max_per_label and args.min_per_label > args.max_per_label:
        raise UserError(f"--min-per-label {args.min_per_label} is above --max-per-label {args.max_per_label}")
    for option, label in (("--positive-label", args.positive_label), ("--negative-label", args.negative_label)):
        _check_label(label, option)
    for files, option in ((args.input, "--input"), (args.positive, "--positive"), (args.negative, "--negative")):
        for f in files or ():
            if not Path(f).is_file():
                raise UserError(f"{option}: no such file: {f}")


def _check_label(label: str, where: str) -> str:
    if not label or any(c.isspace() for c in label):
        raise UserError(f"{where}: a label must be non-empty and without spaces, got {label!r}")
    return label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else label


def load_examples(args: argparse.Namespace) -> tuple[list[Example], dict[str, int]]:
    """``(label, text)`` of every usable record, and how many were skipped, by why."""
    skipped: Counter[str] = Counter()
    examples: list[Example] = []
    if args.input:
        sources = [(f, None) for f in args.input]
    else:
        sources = [(f, args.positive_label) for f in args.positive] + [(f, args.negative_label) for f in args.negative]
    for path, fixed_label in sources:
        for where, rec in iter_records(path):
            if any(rec.get(f) for f in args.exclude_field):
                skipped["excluded"] += 1
                continue
            text = rec.get(args.text_field)
            if not isinstance(text, str) or not text.strip():
                skipped["no_text"] += 1
                continue
            raw = fixed_label if fixed_label is not None else rec.get(args.label_field)
            if raw is None or raw == "":
                skipped["no_label"] += 1
                continue
            examples.append((_check_label(str(raw), where), text))
    if not examples:
        fields = f"'{args.text_field}'" + ("" if args.positive else f" and '{args.label_field}'")
        raise UserError(f"no usable record (with a non-empty {fields}) in the input files; skipped: {dict(skipped)}")
    return examples, dict(sorted(skipped.items()))


def iter_records(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("file:line", record)`` for each JSON object of a JSONL file (plain, gzip or zstd)."""
    with open_binary(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path}:{n}: not a JSON line ({exc})") from None
            if not isinstance(rec, dict):
                raise UserError(f"{path}:{n}: not a JSON object")
            yield f"{path}:{n}", rec


def by_label(examples: list[Example]) -> list[list[Example]]:
    """The examples grouped by label, labels in sorted order (so a seeded sample is reproducible)."""
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        groups[ex[0]].append(ex)
    return [groups[label] for label in sorted(groups)]


def cap_per_label(examples: list[Example], cap: int, rng: random.Random) -> list[Example]:
    """At most ``cap`` examples per label, a random sample of the larger labels."""
    out: list[Example] = []
    for group in by_label(examples):
        out.extend(group if len(group) <= cap else rng.sample(group, cap))
    return out


def oversample(examples: list[Example], floor: int, rng: random.Random) -> list[Example]:
    """Every label with fewer than ``floor`` examples repeated up to ``floor`` (whole copies, then a random
    part): fastText has no class weights, and a label seen 35 times in 70,000 lines is never predicted."""
    out: list[Example] = []
    for group in by_label(examples):
        if len(group) >= floor:
            out.extend(group)
            continue
        copies, rest = divmod(floor, len(group))
        out.extend(group * copies + rng.sample(group, rest))
    return out


def split(examples: list[Example], fraction: float, rng: random.Random) -> tuple[list[Example], list[Example]]:
    """Stratified holdout: ``fraction`` of every label (at least one of a label with two or more examples,
    never all of it), so a small label is also evaluated."""
    train_set: list[Example] = []
    holdout: list[Example] = []
    for group in by_label(examples):
        rng.shuffle(group)
        n = round(fraction * len(group))
        if fraction > 0 and len(group) >= 2:
            n = min(max(n, 1), len(group) - 1)
        holdout.extend(group[:n])
        train_set.extend(group[n:])
    return train_set, holdout


def write_fasttext_file(path: Path, examples: list[Example]) -> None:
    with path.open("w", encoding="utf-8", errors="replace") as f:
        for label, text in examples:
            # a word starting with the label prefix would be read as one more label of this line
            f.write(f"{LABEL_PREFIX}{label} {model_text(text).replace(LABEL_PREFIX, '__label_')}\n")


def evaluate(model: FastTextModel, holdout: list[Example], batch: int = 4096) -> dict[str, Any]:
    """Accuracy, macro F1 and per-label precision / recall / F1 / n of the top-1 prediction on ``holdout``."""
    if not holdout:
        return {"accuracy": None, "macro_f1": None, "per_label": {}}
    true_pos: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    actual: Counter[str] = Counter()
    for start in range(0, len(holdout), batch):
        chunk = holdout[start:start + batch]
        for (label, _), pred in zip(chunk, model.predict([t for _, t in chunk], k=1), strict=True):
            guess = pred[0][0] if pred else ""
            actual[label] += 1
            predicted[guess] += 1
            true_pos[guess] += guess == label
    per_label = {}
    for label in sorted(actual):
        p = true_pos[label] / predicted[label] if predicted[label] else 0.0
        r = true_pos[label] / actual[label]
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        per_label[label] = {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f1, 4), "n": actual[label]}
    return {
        "accuracy": round(sum(true_pos.values()) / len(holdout), 4),
        "macro_f1": round(math.fsum(v["f1"] for v in per_label.values()) / len(per_label), 4),
        "per_label": per_label,
    }


def render(report: dict[str, Any]) -> str:
    rows = [f"{'label':<16} {'precision':>9} {'recall':>7} {'f1':>7} {'n':>7} {'n_train':>8}"]
    for label, m in report["per_label"].items():
        rows.append(f"{label:<16} {m['precision']:>9.4f} {m['recall']:>7.4f} {m['f1']:>7.4f} {m['n']:>7} "
                    f"{report['n_train_per_label'].get(label, 0):>8}")
    acc = "n/a (no holdout)" if report["accuracy"] is None else f"{report['accuracy']:.4f}"
    rows.append(f"held-out accuracy {acc}, macro F1 {report['macro_f1']}, {report['n_holdout']} held out, "
                f"{report['n_train']} trained in {report['train_seconds']} s")
    rows.append(f"model: {report['model']} ({report['model_mb']} MB, preset {report['preset']})\n"
                f"report: {report['report']}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
