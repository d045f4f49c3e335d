"""What a dedup stage leaves for later jobs: an index of the documents it kept, as Parquet.

Layout under ``{output_dir}/index/{stage}/``: ``meta.json`` (written last: a folder without it is
not an index) and one or more tables, each split into ``part-NNNNN.parquet`` files by a hash
partition of its key column, so that a later job's reducer ``j`` reads only partition ``j``.
A refresh (``dedup_against``) reads these files and never touches the earlier corpus itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import storage
from pipeline.dedup.graph import partition_of
from pipeline.problems import ParamError

INDEX_VERSION = 1


class DedupIndexError(ParamError):
    """An earlier output cannot be deduplicated against: missing, or built with other parameters."""

    def __init__(self, msg: str):
        super().__init__("dedup_against", msg)


def index_dir(output_dir: str, stage: str) -> str:
    return storage.join(os.fspath(output_dir), "index", stage)


def write_table_atomic(table: pa.Table, path: str) -> None:
    with storage.open_output(os.fspath(path)) as f:
        pq.write_table(table, f)


def _read(path: str, columns: list[str] | None = None) -> pa.Table:
    with storage.open_input(path) as f:
        return pq.read_table(f, columns=columns)


def write_meta(folder: str, stage: str, partitions: int, params: dict[str, Any], rows: dict[str, int]) -> None:
    meta = {"version": INDEX_VERSION, "stage": stage, "partitions": partitions, "params": params,
            "rows": rows}
    storage.write_text(storage.join(os.fspath(folder), "meta.json"), json.dumps(meta, indent=2, sort_keys=True))


@dataclass(frozen=True)
class IndexSource:
    """One earlier output's index for a stage (picklable: travels into Ray tasks)."""

    folder: str
    partitions: int
    params: dict[str, Any]

    def read_partition(self, table_name: str, part: int, parts: int, key: str) -> pa.Table:
        """Rows of ``table_name`` whose ``key`` falls in partition ``part`` of ``parts``.

        Reads one file when the earlier job used the same partition count, else filters all files.
        """
        base = storage.join(self.folder, table_name)
        if parts == self.partitions:
            return _read(storage.join(base, f"part-{part:05d}.parquet"))
        tables = []
        for j in range(self.partitions):
            t = _read(storage.join(base, f"part-{j:05d}.parquet"))
            if t.num_rows:
                col = t.column(key).to_numpy()
                tables.append(t.filter(pa.array(partition_of(col, parts) == part)))
        return pa.concat_tables(tables) if tables else _read(storage.join(base, "part-00000.parquet")).slice(0, 0)

    def lookup(self, table_name: str, key: str, values: np.ndarray, columns: list[str]) -> pa.Table:
        """Rows whose ``key`` is in ``values``, reading only the partitions those values live in."""
        base = storage.join(self.folder, table_name)
        parts = partition_of(values, self.partitions)
        tables = [_read(storage.join(base, "part-00000.parquet"), [key, *columns]).slice(0, 0)]
        for j in np.unique(parts):
            t = _read(storage.join(base, f"part-{int(j):05d}.parquet"), [key, *columns])
            want = values[parts == j]
            tables.append(t.filter(pa.array(np.isin(t.column(key).to_numpy(), want))))
        return pa.concat_tables(tables)


def open_sources(paths: str | list[str] | None, stage: str, params: dict[str, Any]) -> list[IndexSource]:
    """The indexes of ``stage`` under each earlier output dir, checked against this job's params."""
    if not paths:
        return []
    out = []
    for p in [paths] if isinstance(paths, str) else paths:
        folder = index_dir(p, stage)
        meta_path = storage.join(folder, "meta.json")
        if not storage.is_file(meta_path):
            raise DedupIndexError(
                f"{p!r} has no {stage} index ({meta_path} is missing); "
                f"was it written by a tokenmill job that ran the {stage!r} stage?"
            )
        try:
            meta = json.loads(storage.read_text(meta_path))
        except (OSError, json.JSONDecodeError) as exc:
            raise DedupIndexError(f"cannot read {meta_path}: {exc}") from None
        if meta.get("version") != INDEX_VERSION or meta.get("stage") != stage:
            raise DedupIndexError(f"{meta_path} is not a version-{INDEX_VERSION} {stage} index")
        theirs = meta.get("params", {})
        diff = {k: (theirs.get(k), v) for k, v in params.items() if theirs.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: index has {a!r}, this job {b!r}" for k, (a, b) in sorted(diff.items()))
            raise DedupIndexError(f"{p!r} was indexed with other {stage} parameters ({detail})")
        out.append(IndexSource(str(folder), int(meta["partitions"]), theirs))
    return out
