"""Curated documents split by a ``meta`` field (``output.split_by: lang``): one shard set per value.

After curation each Parquet part is split on a worker into ``work/groups/<value>/part-<first ord>.parquet``,
order kept, so every group is a curated corpus of its own that the write phase packs exactly as it packs a
whole one: shards and manifests are byte-identical for any parallelism, and resume works per group.
A value that is missing, not a short name, or one of the output folder's own names goes to ``_unknown``
(counted), so a document is never lost and no group can overwrite ``documents/`` or ``rejected/``.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from pipeline import storage
from pipeline.documents import text_bytes
from pipeline.output.curated import Part, parquet_file, worker_name, write_parquet

UNKNOWN = "_unknown"
#: names the output folder uses itself (see "What a job writes")
RESERVED = frozenset({"shards", "documents", "rejected", "index", "manifest.json", "stats.json", "tokenizer.json",
                      "README.md", "CARD.md", "card", "validation"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def group_name(meta: str | dict | None, key: str) -> str:
    """The group of a document: its ``meta[key]`` when that is a safe folder name, else ``_unknown``."""
    if isinstance(meta, str):
        try:
            meta = json.loads(meta) if meta else {}
        except ValueError:
            return UNKNOWN
    value = meta.get(key) if isinstance(meta, dict) else None
    if isinstance(value, str) and _NAME.fullmatch(value) and value not in RESERVED and ".." not in value:
        return value
    return UNKNOWN


def split_part(folder: str, part: Part, key: str, dest: str) -> list[tuple[str, Part]]:
    """Ray task: write the rows of one curated part into one part per group; return each group's new part."""
    table = parquet_file(storage.join(folder, part.name)).read()
    names = [group_name(m, key) for m in table.column("meta").to_pylist()]
    rows: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        rows.setdefault(name, []).append(i)
    out = []
    for name, idx in sorted(rows.items()):
        sub = table.take(pa.array(idx, type=pa.int64()))
        first = int(sub.column("ord")[0].as_py())
        fname = f"part-{first:020d}.parquet"
        write_parquet(sub, storage.join(dest, name, fname))
        out.append((name, Part(fname, sub.num_rows, first, text_bytes(sub), worker_name())))
    return out


def collect_groups(split: list[list[tuple[str, Part]]]) -> dict[str, list[Part]]:
    """``{group: parts}``, groups by name, from what every split task returned (parts in task order)."""
    groups: dict[str, list[Part]] = {}
    for name, part in (p for parts in split for p in parts):
        groups.setdefault(name, []).append(part)
    return dict(sorted(groups.items()))
