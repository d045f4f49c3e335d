"""Helpers shared by the benchmarks: where the shared corpora are, reading JSONL.gz texts, and writing a
bench's result to its one file, ``bench/results/<bench>_<machine>.json`` (what ``bench/RESULTS.md`` is made from)."""

from __future__ import annotations

import datetime
import gzip
import json
import os
import platform
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPORA = REPO.parent / "shared" / "corpora"
RESULTS = REPO / "bench" / "results"
# What every result file records besides the bench's own figures (tests/test_bench_results_page.py).
RECORD_FIELDS = ("machine", "date", "command", "figures")
# Environment variables that change a bench's figures, so they belong in its recorded command.
COMMAND_ENV = ("OMP_NUM_THREADS",)


def read_texts(paths: list[Path], limit_bytes: int | None = None, field: str = "text") -> list[str]:
    texts, size = [], 0
    for path in paths:
        for rec in iter_jsonl(path):
            text = rec.get(field)
            if isinstance(text, str) and text.strip():
                texts.append(text)
                size += len(text)
                if limit_bytes and size >= limit_bytes:
                    return texts
    return texts


def iter_jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def default_paths(*relative: str) -> list[Path]:
    return [CORPORA / r for r in relative if (CORPORA / r).exists()]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(gpu: str | None = None) -> dict[str, Any]:
    """The machine a result was measured on: the cores this process may use, its memory, the CPU (and GPU)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    found: dict[str, Any] = {"cores": cores, "memory_gb": round(memory / 2**30, 1), "cpu": cpu_model()}
    if gpu:
        found["gpu"] = gpu
    return found


def machine_tag(found: dict[str, Any]) -> str:
    """The machine part of a result's file name: the GPU's model (``h200``) or the cores (``2cpu``)."""
    if found.get("gpu"):
        return str(found["gpu"]).split()[-1].lower()
    return f"{found['cores']}cpu"


def result_path(bench: str, tag: str) -> Path:
    """The one rule for a result's file: a rerun on the same kind of machine replaces it (history is in git)."""
    return RESULTS / f"{bench}_{tag}.json"


def command_line() -> str:
    """The command that is running, as it would be typed in the repository root."""
    def rel(path: str) -> str:
        full = Path(path).absolute()
        return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else path
    env = [f"{k}={os.environ[k]}" for k in COMMAND_ENV if k in os.environ]
    netns = ["scripts/netns.sh"] if os.environ.get("TOKENMILL_IN_NETNS") == "1" else []
    python = rel(sys.executable) if Path(sys.executable).absolute().is_relative_to(REPO) else "python"
    return shlex.join([*env, *netns, python, rel(sys.argv[0]), *sys.argv[1:]])


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """A result's figures when its bench names none: its scalars, and those one level down as ``key.sub``; a
    list of numbers (repeated runs) as its range."""
    skip = {"bench", "variants", "note", *RECORD_FIELDS}
    figures: dict[str, Any] = {}
    for key, value in result.items():
        if key in skip:
            continue
        items = {f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
        figures.update({k: _figure(v) for k, v in items.items() if _figure(v) is not _SKIP})
    return figures


_SKIP = object()


def _figure(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        return f"{min(value):,}-{max(value):,} over {len(value)} runs"
    return _SKIP


def record(result: dict[str, Any], figures: dict[str, Any] | None = None, gpu: str | None = None,
           command: str | None = None) -> dict[str, Any]:
    """``result`` with what makes it a record: the machine, today's date (UTC), the command and its figures."""
    meta = {"machine": machine(gpu), "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "command": command or command_line(), "figures": headline(result) if figures is None else figures}
    return {"bench": result["bench"], **meta, **{k: v for k, v in result.items() if k != "bench"}}


def write_record(rec: dict[str, Any], path: Path, variant: str | None = None) -> None:
    """Write ``rec`` as the file's headline run, or as its named variant (an A/B run, another setting), keeping
    the rest of what the file holds."""
    old = json.loads(path.read_text()) if path.exists() else {}
    if variant:
        new = old or {k: rec[k] for k in ("bench", *RECORD_FIELDS)}
        new.setdefault("variants", {})[variant] = {k: v for k, v in rec.items() if k != "bench"}
    else:
        new = {**rec, **({"variants": old["variants"]} if old.get("variants") else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(new, indent=1) + "\n")


def save_record(result: dict, path: Path | None = None, *, figures: dict[str, Any] | None = None,
                gpu: str | None = None, variant: str | None = None, command: str | None = None) -> Path:
    """``result`` as a record in its bench's one file, ``bench/results/<bench>_<machine>.json``, or in ``path``
    when given (a trial run; a folder: the file's name in it). ``command`` when the command that ran is not this
    process's (a shell script's). Returns the file."""
    rec = record(result, figures, gpu, command)
    target = result_path(result["bench"], machine_tag(rec["machine"]))
    target = path / target.name if path and path.is_dir() else path or target
    write_record(rec, target, variant)
    return target


def emit_json(result: dict, path: Path | None = None, **how: Any) -> Path:
    """A bench's result as its last stdout line (what scripts read), and saved as :func:`save_record` does."""
    target = save_record(result, path, **how)
    print(json.dumps(result))
    return target
