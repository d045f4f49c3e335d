"""Ray plumbing shared by the dedup stages: document blocks, hash exchanges, components, filtering.

Why Ray core tasks rather than Ray Data's groupby/join for the shuffles: the exchanged data are a few
int64/uint64 columns (hashes, band keys, ords, pairs), and Ray Data's hash shuffle costs seconds per
operation even on small inputs (its join also needs polars); numpy partitioning inside plain Ray tasks
keeps every exchange to milliseconds while staying on Ray's scheduler and object store, across nodes.

The documents never move: the input Dataset is materialized once, its blocks stay in the object
store, and only small tables of drop decisions are routed to the block that holds each document
(blocks cover disjoint ``ord`` ranges). The driver holds object references and per-block metadata,
never documents, hashes or edges.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from pipeline import storage
from pipeline.dedup import graph as g
from pipeline.dedup.index import write_table_atomic
from pipeline.documents import reject_row, text_bytes
from pipeline.stages.recorder import Recorder, RejectRow
from pipeline.worker_start import process_start_seconds

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from ray.data import Dataset

#: target text bytes handled by one group task (verification, id look-ups)
GROUP_BYTES = 128 << 20
DROP_SCHEMA = pa.schema([("ord", pa.int64()), ("reason", pa.string()), ("detail", pa.string())])

#: what a named result holds: the values inside the task, their object references at the caller
T = TypeVar("T")
R = TypeVar("R", bound="DataclassInstance")


def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a task body that takes the stage's recorder first and reports its seconds to it, so that a
    dedup stage's ``seconds`` in ``stats.json`` count every task it ran (bands, verification, components,
    routing), not only the ones that touch documents, and the start of a worker process the task is the first in
    (:func:`pipeline.worker_start.process_start_seconds`). A None recorder reports nothing."""

    def run(recorder: Recorder | None, *args: Any) -> Any:
        t0 = time.perf_counter() - process_start_seconds(getattr(recorder, "phase_started", None))
        try:
            return fn(*args)
        finally:
            if recorder is not None:
                recorder.counts(seconds=time.perf_counter() - t0)

    # not functools.wraps: Ray reads the signature, and __wrapped__ would show fn's (without the recorder)
    run.__name__, run.__qualname__, run.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return run


def call(fn: Any, n_out: int, *args: Any, **options: Any) -> list[ray.ObjectRef]:
    """Start a task that returns ``n_out`` objects; always a list of references."""
    refs = fn.options(num_returns=n_out, **options).remote(*args)
    return [refs] if n_out == 1 else list(refs)


# ---- named task results ---------------------------------------------------------------------------
# A task that feeds an exchange returns many objects, one per destination, so that each consumer fetches
# only its own piece. Its result is declared as a dataclass, generic in what it holds: a ``list`` field is a
# run of objects (one per partition or group), any other field one object. The task returns
# ``returns(Result(...values...))``; the caller gets ``Result[ray.ObjectRef]`` from ``start``.


def returns(result: Any) -> Any:
    """A named result as Ray's flat return value: the fields in order, each list field spread into its
    items (one object alone is returned as is, as Ray expects with ``num_returns=1``)."""
    flat: list[Any] = []
    for f in fields(result):
        value = getattr(result, f.name)
        if isinstance(value, list):
            flat.extend(value)
        else:
            flat.append(value)
    return flat[0] if len(flat) == 1 else tuple(flat)


def start(fn: Any, shape: type[R], runs: Mapping[str, int], *args: Any, **options: Any) -> R:
    """Start task ``fn`` and name its object references as ``shape``: each list field named in ``runs`` holds
    that many references (the task must return that many items there), every other field one."""
    names = [f.name for f in fields(shape)]
    if not set(runs) <= set(names):
        raise TypeError(f"{shape.__name__} has no field {sorted(set(runs) - set(names))}")
    refs = call(fn, sum(runs.get(n, 1) for n in names), *args, **options)
    named: dict[str, Any] = {}
    at = 0
    for n in names:
        if n in runs:
            named[n], at = refs[at : at + runs[n]], at + runs[n]
        else:
            named[n], at = refs[at], at + 1
    return shape(**named)


@dataclass(frozen=True)
class Pairs(Generic[T]):
    """(n, 2) int64 pairs, one piece per hash partition of their first node (connected components' input)."""

    pairs: list[T]


def transpose(outputs: list[list[ray.ObjectRef]]) -> list[list[ray.ObjectRef]]:
    """outputs[source][dest] -> per destination, the references from every source."""
    if not outputs:
        return []
    return [list(col) for col in zip(*outputs, strict=True)]


def cluster_cpus() -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def default_partitions() -> int:
    return int(min(256, max(4, 2 * cluster_cpus())))


# ---- document blocks ----------------------------------------------------------------------------

@ray.remote(num_cpus=1)  # whole CPUs: fractional tasks would start extra worker processes
@timed
def _block_stats(table: pa.Table) -> tuple[int, int, int, int, bool]:
    """(rows, min ord, max ord, text bytes, ords sorted) of one block."""
    if table.num_rows == 0:
        return 0, 0, -1, 0, True
    ords = table.column("ord").to_numpy()
    nbytes = int(pc.sum(pc.binary_length(table.column("text").cast(pa.binary()))).as_py() or 0)
    return table.num_rows, int(ords.min()), int(ords.max()), nbytes, bool(np.all(ords[1:] >= ords[:-1]))


@dataclass
class DocBlocks:
    """A materialized dataset's blocks, their ``ord`` ranges and their grouping into ranges of work.

    ``bounds[k]`` is the smallest ord of group k; ``group[i]`` is block i's group (-1 when empty).
    """

    refs: list[ray.ObjectRef]
    rows: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    group: np.ndarray
    bounds: np.ndarray

    @property
    def groups(self) -> int:
        return len(self.bounds)

    @classmethod
    def from_dataset(cls, ds: Dataset, recorder: Recorder | None = None, _sorted: bool = False) -> DocBlocks:
        """Materialize ``ds``; when its blocks' ord ranges overlap, sort it by ord first (a shuffle)."""
        refs = ds.materialize().to_arrow_refs()
        gap = getattr(recorder, "driver_gap", None)  # a StageRecorder: workers wait for the driver here
        if gap is not None:
            gap("materialize")  # from the last batch of the graph to here
        stats = ray.get([_block_stats.remote(recorder, r) for r in refs]) if refs else []
        rows = np.array([s[0] for s in stats], dtype=np.int64)
        lo = np.array([s[1] for s in stats], dtype=np.int64)
        hi = np.array([s[2] for s in stats], dtype=np.int64)
        nbytes = np.array([s[3] for s in stats], dtype=np.int64)
        live = np.flatnonzero(rows > 0)
        order = live[np.argsort(lo[live], kind="stable")]
        if len(order) > 1 and np.any(lo[order[1:]] <= hi[order[:-1]]):
            if _sorted:
                raise ValueError("dedup needs unique 'ord' values: blocks overlap even after sorting by ord")
            return cls.from_dataset(ds.sort("ord"), recorder, _sorted=True)
        want = max(cluster_cpus(), int(np.ceil(nbytes.sum() / GROUP_BYTES)))
        ngroups = max(1, min(len(order), want))
        group = np.full(len(refs), -1, dtype=np.int64)
        bounds = np.zeros(0, dtype=np.int64)
        if len(order):  # contiguous runs of blocks holding about equal text bytes
            size = nbytes[order] + 1
            before = np.cumsum(size) - size
            gid = np.minimum(before * ngroups // int(size.sum()), ngroups - 1)
            _, first, gid = np.unique(gid, return_index=True, return_inverse=True)
            group[order] = gid
            bounds = lo[order][first]
        if gap is not None:
            gap("materialize")  # from the last block's statistics to the stage's first task
        return cls(refs=refs, rows=rows, lo=lo, hi=hi, group=group, bounds=bounds)

    def blocks_of_group(self, k: int) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.group == k)]


def group_of(ords: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The group whose ord range holds each ord (bounds: sorted group lower bounds)."""
    return np.maximum(np.searchsorted(bounds, ords, side="right") - 1, 0)


def split_table(table: pa.Table, part: np.ndarray, parts: int) -> list[pa.Table]:
    """Rows of ``table`` grouped by their partition number, one table per partition (stable)."""
    order = np.argsort(part, kind="stable")
    table = table.take(pa.array(order))
    cuts = np.searchsorted(part[order], np.arange(parts + 1))
    return [table.slice(cuts[k], cuts[k + 1] - cuts[k]) for k in range(parts)]


def route_table(table: pa.Table, column: str, bounds: np.ndarray) -> list[pa.Table]:
    """Split a table into one piece per group by the ord in ``column``."""
    if len(bounds) == 0:
        return []
    if table.num_rows == 0:
        return [table] * len(bounds)
    grp = group_of(table.column(column).to_numpy(), bounds)
    order = np.argsort(grp, kind="stable")
    table = table.take(pa.array(order))
    cuts = np.searchsorted(grp[order], np.arange(len(bounds) + 1))
    return [table.slice(cuts[k], cuts[k + 1] - cuts[k]) for k in range(len(bounds))]


def in_range(table: pa.Table, column: str, lo: int, hi: int) -> pa.Table:
    if table.num_rows == 0:
        return table
    ords = table.column(column).to_numpy()
    return table.filter(pa.array((ords >= lo) & (ords <= hi)))


def concat(tables: list[pa.Table] | tuple[pa.Table, ...], schema: pa.Schema | None = None) -> pa.Table:
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return schema.empty_table() if schema is not None else pa.table({})
    return pa.concat_tables(tables, promote_options="default")


# ---- connected components over hash-partitioned pairs ---------------------------------------------

@dataclass(frozen=True)
class LargeStar(Generic[T]):
    """One partition's large-star step: the new pairs by partition, its labels (node, root) and the
    fingerprint of its pairs (a fixed point when the fingerprints of all partitions repeat)."""

    pairs: list[T]
    labels: T
    fingerprint: T


@ray.remote(num_cpus=1)
@timed
def _large_star_task(parts: int, *pieces: np.ndarray) -> Any:
    pairs = np.concatenate([p for p in pieces if len(p)]) if any(len(p) for p in pieces) else g.EMPTY_PAIRS
    new, labels, fp = g.large_star(pairs)
    out = [x[0] for x in g.split_by(g.partition_of(new[:, 0], parts), parts, new)] if len(new) \
        else [g.EMPTY_PAIRS] * parts
    return returns(LargeStar(out, labels, fp))


@ray.remote(num_cpus=1)
@timed
def _small_star_task(parts: int, *pieces: np.ndarray) -> Any:
    pairs = np.concatenate([p for p in pieces if len(p)]) if any(len(p) for p in pieces) else g.EMPTY_PAIRS
    new = g.symmetrize(g.small_star(pairs))
    out = [x[0] for x in g.split_by(g.partition_of(new[:, 0], parts), parts, new)] if len(new) \
        else [g.EMPTY_PAIRS] * parts
    return returns(Pairs(out))


def partition_pairs(pairs: np.ndarray, parts: int) -> list[np.ndarray]:
    """Both orientations of undirected pairs, split by the first node's partition (CC input)."""
    sym = g.symmetrize(pairs)
    if len(sym) == 0:
        return [g.EMPTY_PAIRS] * parts
    return [x[0] for x in g.split_by(g.partition_of(sym[:, 0], parts), parts, sym)]


def connected_components(inputs: list[Pairs[ray.ObjectRef]], parts: int, max_rounds: int = 100,
                         recorder: Recorder | None = None) -> tuple[list[ray.ObjectRef], int]:
    """Distributed components of pairs from many sources, each split by partition (as
    :func:`partition_pairs` does). Returns per partition a reference to an (n, 2) array of
    (node, smallest node of its component) for every non-smallest node, and the rounds used."""
    current = transpose([i.pairs for i in inputs])
    previous = None
    for rnd in range(1, max_rounds + 1):
        outs = [start(_large_star_task, LargeStar, {"pairs": parts}, recorder, parts, *current[j])
                for j in range(parts)]
        fps = ray.get([o.fingerprint for o in outs])
        fingerprint = (sum(f[0] for f in fps), sum(f[1] for f in fps) % (1 << 64))
        if fingerprint == previous:
            return [o.labels for o in outs], rnd
        previous = fingerprint
        small_in = transpose([o.pairs for o in outs])
        small = [start(_small_star_task, Pairs, {"pairs": parts}, recorder, parts, *small_in[j]) for j in range(parts)]
        current = transpose([o.pairs for o in small])
    raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")


@ray.remote(num_cpus=1)
@timed
def write_part(folder: str, table_name: str, part: int, schema: pa.Schema, *pieces: pa.Table) -> int:
    """Write partition ``part`` of one index table from the pieces every task produced for it."""
    tables = [p for p in pieces if p.num_rows]
    table = pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()
    write_table_atomic(table, storage.join(folder, table_name, f"part-{part:05d}.parquet"))
    return table.num_rows


# ---- dropping documents in place --------------------------------------------------------------------

@dataclass(frozen=True)
class Filtered(Generic[T]):
    """A block without its dropped documents, and the index pieces of the documents it keeps (as the
    indexer's ``pieces`` lists them; none without an indexer)."""

    kept: T
    index: list[T]


@ray.remote(num_cpus=1)
def _filter_block(table: pa.Table, recorder: Recorder, indexer: Any, n_index: int, *drops: pa.Table) -> Any:
    """Remove the block's documents named in ``drops`` (ord, reason, detail JSON, ``kept_id`` in it where
    a document was kept in their place); record and set aside.

    With an ``indexer``, also returns ``n_index`` pieces of index rows for the documents kept.
    """
    t0 = time.perf_counter()
    n_in = table.num_rows
    ords = table.column("ord").to_numpy() if n_in else np.zeros(0, np.int64)
    dropped: Counter[str] = Counter()
    kept = table
    if n_in:
        d = concat([in_range(x, "ord", int(ords.min()), int(ords.max())) for x in drops], DROP_SCHEMA)
        if d.num_rows:
            d_ord = d.column("ord").to_numpy()
            order = np.argsort(d_ord, kind="stable")
            d_ord = d_ord[order]
            pos = np.minimum(np.searchsorted(d_ord, ords), len(d_ord) - 1)
            hit = d_ord[pos] == ords
            if hit.any():
                reasons = d.column("reason").to_pylist()
                details = d.column("detail").to_pylist()
                rows: list[RejectRow] = []
                for doc, p in zip(table.filter(pa.array(hit)).to_pylist(), pos[hit], strict=True):
                    k = int(order[p])
                    rows.append(reject_row(doc, reasons[k], json.loads(details[k]) if details[k] else {}))
                    dropped[reasons[k]] += 1
                recorder.rejects(rows)
                kept = table.filter(pa.array(~hit))
    index_pieces = indexer.pieces(kept) if indexer is not None else []
    recorder.counts(
        docs_in=n_in, docs_out=kept.num_rows, dropped=dict(dropped),
        bytes_in=text_bytes(table), bytes_out=text_bytes(kept), seconds=time.perf_counter() - t0,
    )
    return returns(Filtered(kept, index_pieces))


def apply_drops(
    blocks: DocBlocks, drops_by_group: list[list[ray.ObjectRef]], recorder: Recorder,
    indexer: Any = None, n_index: int = 0,
) -> tuple[list[ray.ObjectRef], list[list[ray.ObjectRef]]]:
    """Filter every block with the drop tables of its group; returns the kept blocks (in the input
    order) and, with an indexer, ``index_pieces[block][partition]``."""
    out, index = [], []
    for i, ref in enumerate(blocks.refs):
        k = int(blocks.group[i])
        pieces = drops_by_group[k] if k >= 0 else []
        res = start(_filter_block, Filtered, {"index": n_index}, ref, recorder, indexer, n_index, *pieces)
        out.append(res.kept)
        index.append(res.index)
    return out, index


def to_dataset(refs: list[ray.ObjectRef]) -> Dataset:
    """The blocks as a Dataset again (what the stage hands on)."""
    # Ray annotates from_arrow_refs with ray.types.ObjectRef, a placeholder class for its documentation, not the
    # ray.ObjectRef its tasks return
    return ray.data.from_arrow_refs(refs)  # type: ignore[arg-type]


def drop_table(ords: np.ndarray, reason: str | list[str], details: list[dict[str, Any]]) -> pa.Table:
    reasons = [reason] * len(ords) if isinstance(reason, str) else reason
    return pa.table(
        {"ord": pa.array(ords, pa.int64()), "reason": pa.array(reasons, pa.string()),
         "detail": pa.array([json.dumps(d, sort_keys=True) for d in details], pa.string())},
        schema=DROP_SCHEMA,
    )
