"""Ray tasks of exact dedup (:mod:`pipeline.dedup.exact` is the stage; imported only when it runs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

import numpy as np
import pyarrow as pa
import ray

from pipeline import storage
from pipeline.dedup import distributed as dr
from pipeline.dedup.distributed import T, returns, start
from pipeline.dedup.exact_config import NAME, ExactDedupParams, normalized_hash
from pipeline.dedup.graph import partition_of
from pipeline.dedup.index import IndexSource, index_dir, open_sources, write_meta, write_table_atomic
from pipeline.stages.base import StageContext
from pipeline.stages.recorder import Recorder

if TYPE_CHECKING:
    from ray.data import Dataset

HASH_SCHEMA = pa.schema([("h1", pa.uint64()), ("h2", pa.uint64()), ("ord", pa.int64()), ("id", pa.string())])
INDEX_SCHEMA = pa.schema([("h1", pa.uint64()), ("h2", pa.uint64()), ("id", pa.string())])


@dataclass(frozen=True)
class HashRows(Generic[T]):
    """One block's hash rows (h1, h2, ord, id), by hash partition."""

    by_part: list[T]


@dataclass(frozen=True)
class ExactDrops(Generic[T]):
    """One hash partition's drop tables by the group that holds the dropped document, and how many hashes
    it wrote to the index."""

    by_group: list[T]
    written: T


@ray.remote(num_cpus=1)
def _hash_map(table: pa.Table, casefold: bool, parts: int, recorder: Recorder) -> Any:
    t0 = time.perf_counter()
    h = normalized_hash(table.column("text").to_pylist(), casefold)
    rows = pa.table({"h1": h[:, 0], "h2": h[:, 1], "ord": table.column("ord").cast(pa.int64()),
                     "id": table.column("id").cast(pa.string())}, schema=HASH_SCHEMA)
    pieces = dr.split_table(rows, partition_of(h[:, 0], parts), parts)
    recorder.counts(seconds=time.perf_counter() - t0)
    return returns(HashRows(pieces))


@ray.remote(num_cpus=1)
@dr.timed
def _exact_reduce(part: int, parts: int, bounds: np.ndarray, sources: list[IndexSource],
                  index_folder: str | None, *pieces: pa.Table) -> Any:
    """Keep the smallest ord per hash; drop the rest and everything already published (:class:`ExactDrops`)."""
    t = dr.concat(pieces, HASH_SCHEMA)
    h1, h2 = t.column("h1").to_numpy(), t.column("h2").to_numpy()
    ords, ids = t.column("ord").to_numpy(), t.column("id").to_pylist()
    order = np.lexsort((ords, h2, h1))
    h1, h2, ords = h1[order], h2[order], ords[order]
    start = np.r_[True, (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])] if len(h1) else np.zeros(0, bool)
    first = np.maximum.accumulate(np.where(start, np.arange(len(h1)), 0)) if len(h1) else np.zeros(0, int)
    pub_id = _published_ids(sources, part, parts, h1, h2)
    drop_ords, reasons, details = [], [], []
    for i in np.flatnonzero(~start | (pub_id[first] != None)):  # noqa: E711 - object array
        pid = pub_id[first[i]]
        drop_ords.append(ords[i])
        reasons.append("exact_duplicate_of_published" if pid is not None else "exact_duplicate")
        details.append({"kept_id": pid if pid is not None else ids[order[first[i]]]})
    drops = dr.drop_table(np.array(drop_ords, dtype=np.int64), reasons, details)
    written = 0
    if index_folder is not None:
        keep = start & (pub_id == None)  # noqa: E711
        kept = pa.table({"h1": h1[keep], "h2": h2[keep], "id": [ids[k] for k in order[keep]]}, schema=INDEX_SCHEMA)
        write_table_atomic(kept, storage.join(index_folder, "hashes", f"part-{part:05d}.parquet"))
        written = kept.num_rows
    return returns(ExactDrops(dr.route_table(drops, "ord", bounds), written))


def _published_ids(sources: list[IndexSource], part: int, parts: int, h1: np.ndarray, h2: np.ndarray
                   ) -> np.ndarray:
    """Per row, the id of a published document with the same hash, else None."""
    out = np.full(len(h1), None, dtype=object)
    for src in sources:
        pub = src.read_partition("hashes", part, parts, "h1")
        if pub.num_rows == 0 or len(h1) == 0:
            continue
        p1, p2 = pub.column("h1").to_numpy(), pub.column("h2").to_numpy()
        order = np.argsort(p1, kind="stable")
        p1, p2 = p1[order], p2[order]
        pos = np.minimum(np.searchsorted(p1, h1), len(p1) - 1)
        hit = (p1[pos] == h1) & (p2[pos] == h2) & (out == None)  # noqa: E711
        if hit.any():
            pids = pub.column("id").to_pylist()
            out[hit] = [pids[order[p]] for p in pos[hit]]
    return out


def exact_dedup(p: ExactDedupParams, ctx: StageContext, ds: Dataset, recorder: Recorder) -> Dataset:
    """The stage's work: see the module docstring of :mod:`pipeline.dedup.exact`."""
    sources = open_sources(p.dedup_against, NAME, p.index_params())
    parts = p.partitions or (sources[0].partitions if sources else dr.default_partitions())
    blocks = dr.DocBlocks.from_dataset(ds, recorder)
    live = [ref for ref, n in zip(blocks.refs, blocks.rows, strict=True) if n > 0]
    folder = index_dir(ctx.output_dir, NAME) if (p.write_index and ctx.output_dir) else None
    if not live:
        if folder is not None:
            write_meta(folder, NAME, parts, p.index_params(), {"hashes": 0})
        recorder.counts(docs_in=0, docs_out=0)
        return dr.to_dataset(blocks.refs) if blocks.refs else ds
    maps = [start(_hash_map, HashRows, {"by_part": parts}, ref, p.casefold, parts, recorder) for ref in live]
    per_part = dr.transpose([m.by_part for m in maps])
    reduced = [
        start(_exact_reduce, ExactDrops, {"by_group": blocks.groups}, recorder, j, parts, blocks.bounds, sources,
              str(folder) if folder else None, *per_part[j])
        for j in range(parts)
    ]
    out, _ = dr.apply_drops(blocks, dr.transpose([r.by_group for r in reduced]), recorder)
    result = dr.to_dataset(out)
    if folder is not None:
        written = sum(ray.get([r.written for r in reduced]))
        write_meta(folder, NAME, parts, p.index_params(), {"hashes": int(written)})
    return result
