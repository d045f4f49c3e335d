"""The demo job: a corpus built on the spot from this machine's Python packages, and its spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.card.collect import CARD
from pipeline.demo_corpus import build_demo_corpus
from pipeline.preflight import load_checked
from pipeline.spec import JobSpec
from pipeline.stages import REGISTRY

#: the demo's output, relative to its folder (``--output``)
OUTPUT = "output"
#: the guide's first page, relative to the repository (``make demo`` runs there)
GUIDE = "docs/index.md"
DEMO_STAGES: list[dict[str, Any]] = [
    {"type": "normalize"},
    {"type": "length", "params": {"min_chars": 32}},
    {"type": "exact_dedup"},
    {"type": "near_dedup", "params": {"threshold": 0.8}},
]


def demo_spec(out_dir: Path, max_bytes: int = 20_000_000, parallelism: int | None = None) -> JobSpec:
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "corpus"
    build_demo_corpus(corpus, max_bytes=max_bytes)
    spec = {
        "name": "demo",
        "inputs": [{"path": "corpus/*.jsonl.gz", "format": "jsonl"}],
        "stages": [s for s in DEMO_STAGES if s["type"] in REGISTRY],
        "tokenizer": {"train": {"vocab_size": 8192}},
        "packing": {"seq_len": 1024, "method": "best_fit"},
        "output": {"path": OUTPUT, "samples_per_shard": 256, "overwrite": True},
        "execution": {"parallelism": parallelism},
    }
    path = out_dir / "demo.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_checked(path)


def next_steps(out_dir: Path, program: str = "tokenmill") -> str:
    """Where to look after the demo: its card, ``inspect`` on its shards (``program``: how the user calls
    tokenmill) and the guide; paths as the user gave them."""
    output = out_dir / OUTPUT
    rows = [("the dataset card", str(output / CARD)), ("what the shards hold", f"{program} inspect {output}"),
            ("the guide", GUIDE)]
    width = max(len(label) for label, _ in rows)
    return "next:\n" + "\n".join(f"  {label:<{width}}  {where}" for label, where in rows)
