"""Dataset-card generation time on `make demo`'s output (goal: under 2 s).

Reads a finished output (default `demo_out/output`, what `make demo` writes; `--data OUT` for another) and
rebuilds its card `--runs` times into a copy of the files the card reads, so the output itself is not touched:
collect (stats, manifest, a sample of `rejected/` tokenized with the job's tokenizer), figures (matplotlib, SVG
+ PNG) and the Markdown. Prints a table of the phases and one JSON line with the median.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `pipeline` and `bench` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import shutil
import statistics
import tempfile
import time

from bench.common import emit_json  # noqa: E402
from pipeline.card import figures  # noqa: E402
from pipeline.card.build import card_figures, write_card  # noqa: E402
from pipeline.card.collect import collect  # noqa: E402

GOAL_S = 2.0
#: what the card reads; shards are not among them
READS = ("stats.json", "manifest.json", "tokenizer.json", "documents.json", "card", "rejected")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("demo_out/output"), help="a finished output folder")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if not (args.data / "stats.json").exists():
        sys.exit(f"{args.data}: no stats.json; run `make demo` first (or give --data OUT)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "out"
        work.mkdir()
        for name in READS:
            src = args.data / name
            if src.is_dir():
                shutil.copytree(src, work / name)
            elif src.exists():
                shutil.copy2(src, work / name)
        write_card(str(work))  # warm: matplotlib's font cache, imports
        rows = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            d = collect(str(work))
            t1 = time.perf_counter()
            for fig in card_figures(d, []).values():
                figures.render(fig)  # type: ignore[arg-type]
            t2 = time.perf_counter()
            write_card(str(work))
            t3 = time.perf_counter()
            rows.append((t1 - t0, t2 - t1, t3 - t2))
    print(f"{'run':>4}{'collect s':>11}{'figures s':>11}{'whole card s':>14}")
    for i, (a, b, c) in enumerate(rows):
        print(f"{i:>4}{a:>11.3f}{b:>11.3f}{c:>14.3f}")
    stats = json.loads((args.data / "stats.json").read_text())
    kept = next((s["docs_out"] for s in stats["stages"] if s["stage"] == "90-tokenize"), None)
    median = statistics.median(r[2] for r in rows)
    print(f"{kept} documents kept; card in {median:.3f} s (median of {len(rows)}), goal < {GOAL_S} s")
    emit_json({"bench": "card", "card_s": round(median, 3), "max_s": round(max(r[2] for r in rows), 3),
               "documents": kept, "runs": len(rows), "goal_s": GOAL_S})


if __name__ == "__main__":
    main()
