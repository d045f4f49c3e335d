"""The trainer part of bench/gpu_session.sh as one result: tokens/s and MFU of the real trainer's 10-step windows.

gpu_session.sh runs this last, on the metrics.jsonl files the trainer wrote (``OUT/metrics_<size>.jsonl``), and
it writes ``OUT/gpu_session_<gpu>.json``: copy that file into bench/results/ and run
``python -m bench.results_page``. The first window after each start (the run's, and the resume's after a stop)
holds compilation: windows under half the run's median tokens/s are left out of the ranges.

    python3 -m bench.gpu_session OUT --gpu "NVIDIA H200" --command "bench/gpu_session.sh SHARDS"
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.common import emit_json


def windows(path: Path) -> list[dict[str, Any]]:
    """The logged windows of a trainer's metrics.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "step" in r and "tokens_per_s" in r]


def span(values: list[float], digits: int) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}" if values else "n/a"


def figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size, rows in runs.items():
        middle = statistics.median(r["tokens_per_s"] for r in rows)
        warm = [r for r in rows if r["tokens_per_s"] >= middle / 2]
        out[f"{size} tokens_per_s (k, per 10-step window)"] = span([r["tokens_per_s"] / 1e3 for r in warm], 0)
        out[f"{size} processed_tokens_per_s (k)"] = span([r["processed_tokens_per_s"] / 1e3 for r in warm], 0)
        out[f"{size} mfu"] = span([r["mfu"] for r in warm], 3)
        out[f"{size} loss_last"] = round(rows[-1]["loss"], 3)
        out[f"{size} mem_alloc_gb"] = round(rows[-1]["mem_alloc_gb"], 1)
        out[f"{size} steps"] = rows[-1]["step"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="gpu_session.sh's output folder (metrics_<size>.jsonl)")
    ap.add_argument("--gpu", required=True, help="the GPU's name, as nvidia-smi gives it")
    ap.add_argument("--command", required=True, help="the gpu_session.sh command that ran")
    args = ap.parse_args()
    runs = {p.stem.removeprefix("metrics_"): windows(p) for p in sorted(args.out.glob("metrics_*.jsonl"))}
    runs = {size: rows for size, rows in runs.items() if rows}
    if not runs:
        raise SystemExit(f"no trainer metrics in {args.out}")
    result = {"bench": "gpu_session", "windows": runs}
    emit_json(result, args.out, figures=figures(runs), gpu=args.gpu, command=args.command)


if __name__ == "__main__":
    main()
