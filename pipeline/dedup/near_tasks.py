"""Ray tasks of near dedup (:mod:`pipeline.dedup.near` is the stage; this module is imported only
when it runs, so validating a spec never imports Ray).

Each task that feeds an exchange declares its result as a dataclass of runs of objects (one per
partition or group) and single objects; the driver starts it with :func:`pipeline.dedup.distributed.start`
and reads the references by name (see "named task results" there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

import numpy as np
import pyarrow as pa
import ray

from kernels.minhash import band_keys
from pipeline.dedup import distributed as dr
from pipeline.dedup import graph as g
from pipeline.dedup.distributed import Pairs, T, returns, start
from pipeline.dedup.index import IndexSource, index_dir, open_sources, write_meta
from pipeline.dedup.near_config import NAME, NearConfig, NearDedupParams
from pipeline.stages.base import StageContext
from pipeline.stages.recorder import Recorder

if TYPE_CHECKING:
    from ray.data import Dataset

BAND_SCHEMA = pa.schema([("key", pa.uint64()), ("node", pa.int64())])
DOC_SCHEMA = pa.schema([("node", pa.int64()), ("id", pa.string()), ("sig", pa.list_(pa.uint32()))])
LABEL_SCHEMA = pa.schema([("v", pa.int64()), ("root", pa.int64())])
#: the index tables, in the order :meth:`_Indexer.pieces` lists their pieces
INDEX_TABLES = (("bands", BAND_SCHEMA), ("docs", DOC_SCHEMA))


def _published_node(old: np.ndarray, source: int, nsources: int) -> np.ndarray:
    """Published documents become negative nodes: they sort before every new document."""
    if len(old) and int(old.max()) >= (1 << 62) // nsources:
        raise ValueError("published ord too large to encode")
    return -1 - (old.astype(np.int64) * nsources + source)


def _decode_published(node: np.ndarray, nsources: int) -> tuple[np.ndarray, np.ndarray]:
    x = -1 - node
    return x % nsources, x // nsources


# ---- what the tasks return ----------------------------------------------------------------------


@dataclass(frozen=True)
class BandRows(Generic[T]):
    """One block's band rows (key, ord) by key partition, and the signatures ``(ords, sigs)`` of its
    documents that have one (the index reuses them rather than signing again)."""

    bands: list[T]
    sigs: T


@dataclass(frozen=True)
class Candidates(Generic[T]):
    """One key partition's candidate pairs: with verification, by the group of the block that holds the
    pair's new document that the first hop reads (``to_verify``; none in ``edges``); without, the pairs are
    the edges of the graph, by partition (none in ``to_verify``)."""

    to_verify: list[T]
    edges: list[T]

    @staticmethod
    def runs(verify: bool, groups: int, parts: int) -> dict[str, int]:
        return {"to_verify": groups, "edges": 0} if verify else {"to_verify": 0, "edges": parts}


@dataclass(frozen=True)
class FirstHop(Generic[T]):
    """One group's first verification hop: pairs with the shingle sets of their first documents, by the
    group of the second (``to_second``), and the pairs with a published document already checked, as
    edges by partition."""

    to_second: list[T]
    edges: list[T]


@dataclass(frozen=True)
class RoutedLabels(Generic[T]):
    """One partition's labels (v, root) by where the root's id lives: the group of a new root, or the
    source of a published one."""

    to_groups: list[T]
    to_sources: list[T]


@dataclass(frozen=True)
class Drops(Generic[T]):
    """Drop tables (ord, reason, detail), by the group that holds the dropped document."""

    by_group: list[T]


# ---- tasks --------------------------------------------------------------------------------------


@ray.remote(num_cpus=1)
def _band_map(table: pa.Table, cfg: NearConfig, parts: int, recorder: Recorder) -> Any:
    """The band rows and signatures of one block (:class:`BandRows`)."""
    t0 = time.perf_counter()
    sigs, counts = cfg.sign(table.column("text").to_pylist())
    ords = table.column("ord").to_numpy().astype(np.int64)
    has = counts > 0  # a document without any word has no signature to match on
    keys = band_keys(sigs[has], cfg.bands, cfg.rows)
    rows = np.stack([keys.ravel().view(np.int64), np.repeat(ords[has], cfg.bands)], axis=1)
    pieces = [x[0] for x in g.split_by(g.partition_of(keys.ravel(), parts), parts, rows)]
    recorder.counts(seconds=time.perf_counter() - t0)
    return returns(BandRows(pieces, (ords[has], sigs[has])))


@ray.remote(num_cpus=1)
@dr.timed
def _band_reduce(part: int, parts: int, bounds: np.ndarray, sources: list[IndexSource], verify: bool,
                 max_bucket: int, *pieces: np.ndarray) -> Any:
    """Candidate pairs from the band rows of one key partition and of the published index (:class:`Candidates`)."""
    rows = [p for p in pieces if len(p)]
    for s, src in enumerate(sources):
        pub = src.read_partition("bands", part, parts, "key")
        if pub.num_rows:
            node = _published_node(pub.column("node").to_numpy(), s, len(sources))
            rows.append(np.stack([pub.column("key").to_numpy().view(np.int64), node], axis=1))
    allrows = np.concatenate(rows) if rows else g.EMPTY_PAIRS
    pairs = g.bucket_pairs(allrows[:, 0].view(np.uint64), allrows[:, 1], max_bucket)
    pairs = pairs[pairs[:, 1] >= 0]  # a pair of two published documents tells nothing new
    if not verify:
        return returns(Candidates([], dr.partition_pairs(pairs, parts)))
    # x < y: a pair (x, y) with a published x is checked where its new y lives, a new pair where x does
    first_new = np.where(pairs[:, 0] >= 0, pairs[:, 0], pairs[:, 1])
    return returns(Candidates(_route_pairs(pairs, first_new, bounds), []))


def _route_pairs(pairs: np.ndarray, ords: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """``pairs`` split by the group that holds ``ords`` (one per pair)."""
    return [x[0] for x in g.split_by(dr.group_of(ords, bounds), len(bounds), pairs)]


def _fetch(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, ords: np.ndarray,
           columns: list[str]) -> pa.Table:
    """The rows (ord + columns) of the given ords from a group's blocks, one block in memory at a time."""
    ords = np.unique(ords)
    tables = []
    for ref, a, b in zip(block_refs, lo, hi, strict=True):
        want = ords[(ords >= a) & (ords <= b)]
        if len(want) == 0:
            continue
        t = ray.get(ref).select(["ord", *columns])
        tables.append(t.filter(pa.array(np.isin(t.column("ord").to_numpy(), want))))
    schema = pa.schema([("ord", pa.int64())] + [(c, pa.string()) for c in columns])
    return dr.concat(tables, schema).sort_by("ord")


def _pack_sets(sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sets], out=offsets[1:])
    return (np.concatenate(sets) if sets else np.zeros(0, np.uint64)), offsets


@ray.remote(num_cpus=1)
@dr.timed
def _verify_hop1(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, cfg: NearConfig,
                 bounds: np.ndarray, parts: int, sources: list[IndexSource], *pieces: np.ndarray) -> Any:
    """At the group holding each pair's first new document: ship its shingle set towards the second;
    check pairs with a published document against the published signature (:class:`FirstHop`)."""
    pairs = np.concatenate(pieces) if pieces else g.EMPTY_PAIRS
    new, pub = g.unique_pairs(pairs[pairs[:, 0] >= 0]), g.unique_pairs(pairs[pairs[:, 0] < 0])
    out: list[Any] = []
    # new-new pairs: (x, y, set of x) grouped by the group of y
    xs = np.unique(new[:, 0])
    docs = _fetch(block_refs, lo, hi, xs, ["text"])
    d_ord = docs.column("ord").to_numpy()
    sets = cfg.shingle_sets(docs.column("text").to_pylist())
    pos = {int(o): k for k, o in enumerate(d_ord)}
    for chunk in _route_pairs(new, new[:, 1], bounds):
        needed = np.unique(chunk[:, 0])
        flat, offsets = _pack_sets([sets[pos[int(x)]] for x in needed])
        out.append((chunk, needed, flat, offsets))
    # published pairs (p, y): estimated Jaccard of the signatures
    edges = g.EMPTY_PAIRS
    if len(pub):
        ys = np.unique(pub[:, 1])
        ydocs = _fetch(block_refs, lo, hi, ys, ["text"])
        ysig, _ = cfg.sign(ydocs.column("text").to_pylist())
        ypos = np.searchsorted(ydocs.column("ord").to_numpy(), pub[:, 1])
        psig = _published_sigs(sources, pub[:, 0], cfg.num_perm)
        est = (ysig[ypos] == psig).mean(axis=1)
        edges = pub[est >= cfg.threshold]
    return returns(FirstHop(out, dr.partition_pairs(edges, parts)))


def _published_sigs(sources: list[IndexSource], nodes: np.ndarray, num_perm: int) -> np.ndarray:
    out = np.zeros((len(nodes), num_perm), dtype=np.uint32)
    src, old = _decode_published(nodes, len(sources))
    for s, source in enumerate(sources):
        sel = np.flatnonzero(src == s)
        if len(sel) == 0:
            continue
        t = source.lookup("docs", "node", np.unique(old[sel]), ["sig"])
        t_node = t.column("node").to_numpy()
        order = np.argsort(t_node)
        sig = np.asarray(t.column("sig").combine_chunks().flatten().to_numpy()).reshape(-1, num_perm)
        out[sel] = sig[order[np.searchsorted(t_node[order], old[sel])]]
    return out


@ray.remote(num_cpus=1)
@dr.timed
def _verify_hop2(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, cfg: NearConfig,
                 parts: int, *pieces: tuple) -> Any:
    """At the group holding each pair's second document: exact Jaccard, keep pairs >= threshold (:class:`Pairs`)."""
    pieces = tuple(p for p in pieces if len(p[0]))
    if not pieces:
        return returns(Pairs(dr.partition_pairs(g.EMPTY_PAIRS, parts)))
    ys = np.unique(np.concatenate([p[0][:, 1] for p in pieces]))
    docs = _fetch(block_refs, lo, hi, ys, ["text"])
    ysets = cfg.shingle_sets(docs.column("text").to_pylist())
    ypos = {int(o): k for k, o in enumerate(docs.column("ord").to_numpy())}
    kept = []
    for pairs, needed, flat, offsets in pieces:
        xpos = {int(x): k for k, x in enumerate(needed)}
        for x, y in pairs:
            k = xpos[int(x)]
            if g.jaccard_sorted(flat[offsets[k] : offsets[k + 1]], ysets[ypos[int(y)]]) >= cfg.threshold:
                kept.append((x, y))
    edges = np.array(kept, dtype=np.int64).reshape(-1, 2)
    return returns(Pairs(dr.partition_pairs(edges, parts)))


@ray.remote(num_cpus=1)  # whole CPUs: a fractional task would start extra worker processes
@dr.timed
def _route_labels(bounds: np.ndarray, nsources: int, labels: np.ndarray) -> Any:
    """Labels (v, root) of new documents by where the root's id lives (:class:`RoutedLabels`)."""
    labels = labels[labels[:, 0] >= 0]
    new, pub = labels[labels[:, 1] >= 0], labels[labels[:, 1] < 0]
    to_sources: list[np.ndarray] = []
    if nsources:
        src, _ = _decode_published(pub[:, 1], nsources)
        to_sources = [x[0] for x in g.split_by(src, nsources, pub)]
    return returns(RoutedLabels(_route_pairs(new, new[:, 1], bounds), to_sources))


@ray.remote(num_cpus=1)
@dr.timed
def _root_ids_new(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, bounds: np.ndarray,
                  *pieces: np.ndarray) -> Any:
    labels = np.concatenate(pieces) if pieces else g.EMPTY_PAIRS
    docs = _fetch(block_refs, lo, hi, labels[:, 1], ["id"])
    ids = dict(zip(docs.column("ord").to_pylist(), docs.column("id").to_pylist(), strict=True))
    drops = dr.drop_table(labels[:, 0], "near_duplicate", [{"kept_id": ids[int(r)]} for r in labels[:, 1]])
    return returns(Drops(dr.route_table(drops, "ord", bounds)))


@ray.remote(num_cpus=1)
@dr.timed
def _root_ids_published(source: IndexSource, s: int, nsources: int, bounds: np.ndarray,
                        *pieces: np.ndarray) -> Any:
    labels = np.concatenate(pieces) if pieces else g.EMPTY_PAIRS
    ids: dict[int, str] = {}
    if len(labels):
        _, old = _decode_published(labels[:, 1], nsources)
        t = source.lookup("docs", "node", np.unique(old), ["id"])
        ids = dict(zip(t.column("node").to_pylist(), t.column("id").to_pylist(), strict=True))
        ids = {int(_published_node(np.array([k]), s, nsources)[0]): v for k, v in ids.items()}
    drops = dr.drop_table(labels[:, 0], "near_duplicate_of_published",
                          [{"kept_id": ids.get(int(r))} for r in labels[:, 1]])
    return returns(Drops(dr.route_table(drops, "ord", bounds)))


@dataclass(frozen=True)
class _Indexer:
    """Index rows of the documents a block keeps: band keys and signatures (by partition).

    The signatures are those :func:`_band_map` computed for the block (``sigs[i]``: ``(ords, sigs)`` of the
    block whose ords are ``lo[i]..hi[i]``), looked up by ord: MinHash is not computed twice.
    """

    cfg: NearConfig
    parts: int
    sigs: tuple[ray.ObjectRef, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]

    def _signatures(self, kept: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """(rows of ``kept`` that have a signature, their signatures)."""
        if kept.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros((0, self.cfg.num_perm), np.uint32)
        ords = kept.column("ord").to_numpy().astype(np.int64)
        first = int(ords.min())
        block = next(i for i, (a, b) in enumerate(zip(self.lo, self.hi, strict=True)) if a <= first <= b)
        sig_ords, sigs = ray.get(self.sigs[block])
        order = np.argsort(sig_ords, kind="stable")
        pos = np.minimum(np.searchsorted(sig_ords[order], ords), max(len(order) - 1, 0))
        has = sig_ords[order[pos]] == ords if len(order) else np.zeros(len(ords), bool)
        return np.flatnonzero(has), sigs[order[pos[has]]]

    def pieces(self, kept: pa.Table) -> list[pa.Table]:
        """The index rows of ``kept``, one piece per (table of :data:`INDEX_TABLES`, partition), table by table."""
        rows, sigs = self._signatures(kept)
        ords = kept.column("ord").to_numpy().astype(np.int64)[rows] if kept.num_rows else np.zeros(0, np.int64)
        ids = np.array(kept.column("id").to_pylist(), dtype=object)[rows] if kept.num_rows else np.zeros(0, object)
        keys = band_keys(sigs, self.cfg.bands, self.cfg.rows).ravel()
        bands = pa.table({"key": keys, "node": np.repeat(ords, self.cfg.bands)}, schema=BAND_SCHEMA)
        kp = g.partition_of(keys, self.parts)
        np_ = g.partition_of(ords, self.parts)
        # one list<uint32> of num_perm values per document, built from the flat matrix (not row by row)
        sig = pa.ListArray.from_arrays(pa.array(np.arange(len(sigs) + 1, dtype=np.int32) * sigs.shape[1]),
                                       pa.array(np.ascontiguousarray(sigs, dtype=np.uint32).ravel()))
        docs = pa.table({"node": ords, "id": pa.array(list(ids), pa.string()), "sig": sig}, schema=DOC_SCHEMA)
        return [*dr.split_table(bands, kp, self.parts), *dr.split_table(docs, np_, self.parts)]



# ---- the stage ------------------------------------------------------------------------------------


def near_dedup(p: NearDedupParams, ctx: StageContext, ds: Dataset, recorder: Recorder) -> Dataset:
    """The stage's work: see the module docstring of :mod:`pipeline.dedup.near`."""
    cfg = NearConfig.from_params(p)
    sources = open_sources(p.dedup_against, NAME, cfg.index_params())
    parts = p.partitions or (sources[0].partitions if sources else dr.default_partitions())
    blocks = dr.DocBlocks.from_dataset(ds, recorder)
    folder = index_dir(ctx.output_dir, NAME) if (p.write_index and ctx.output_dir) else None
    live = [i for i, n in enumerate(blocks.rows) if n > 0]
    if not live:
        if folder is not None:
            write_meta(folder, NAME, parts, cfg.index_params(), {"bands": 0, "docs": 0})
        recorder.counts(docs_in=0, docs_out=0)
        return dr.to_dataset(blocks.refs) if blocks.refs else ds
    gpu = {"num_gpus": 1} if p.device == "cuda" else {}
    maps = [start(_band_map, BandRows, {"bands": parts}, blocks.refs[i], cfg, parts, recorder, **gpu) for i in live]
    per_part = dr.transpose([m.bands for m in maps])
    runs = Candidates.runs(p.verify, blocks.groups, parts)
    candidates = [start(_band_reduce, Candidates, runs, recorder, j, parts, blocks.bounds, sources, p.verify,
                        p.max_bucket, *per_part[j]) for j in range(parts)]
    edges = _verify(blocks, cfg, parts, sources, candidates, recorder) if p.verify \
        else [Pairs(c.edges) for c in candidates]
    labels, _rounds = dr.connected_components(edges, parts, recorder=recorder)
    drops = _drops(blocks, sources, labels, recorder)
    indexer = _Indexer(cfg, parts, tuple(m.sigs for m in maps), tuple(int(blocks.lo[i]) for i in live),
                       tuple(int(blocks.hi[i]) for i in live)) if folder is not None else None
    n_index = len(INDEX_TABLES) * parts if indexer else 0
    out, index_pieces = dr.apply_drops(blocks, drops, recorder, indexer, n_index)
    result = dr.to_dataset(out)
    if folder is not None:
        by_piece = dr.transpose(index_pieces)
        written = {table: [dr.write_part.remote(recorder, str(folder), table, j, schema, *by_piece[t * parts + j])
                           for j in range(parts)]
                   for t, (table, schema) in enumerate(INDEX_TABLES)}
        counts = {table: int(sum(ray.get(refs))) for table, refs in written.items()}
        write_meta(folder, NAME, parts, cfg.index_params(), counts)
    return result


def _group_args(blocks: dr.DocBlocks, k: int) -> tuple[list[ray.ObjectRef], np.ndarray, np.ndarray]:
    idx = blocks.blocks_of_group(k)
    return [blocks.refs[i] for i in idx], blocks.lo[idx], blocks.hi[idx]


def _verify(blocks: dr.DocBlocks, cfg: NearConfig, parts: int, sources: list[IndexSource],
            candidates: list[Candidates[ray.ObjectRef]], recorder: Recorder) -> list[Pairs[ray.ObjectRef]]:
    """The verified edges: two hops through the groups (see the module docstring of :mod:`pipeline.dedup.near`)."""
    G = blocks.groups
    by_group = dr.transpose([c.to_verify for c in candidates])
    hop1 = []
    for k in range(G):
        refs, lo, hi = _group_args(blocks, k)
        hop1.append(start(_verify_hop1, FirstHop, {"to_second": G, "edges": parts}, recorder, refs, lo, hi, cfg,
                          blocks.bounds, parts, sources, *by_group[k]))
    to_hop2 = dr.transpose([h.to_second for h in hop1])
    edges = [Pairs(h.edges) for h in hop1]
    for k in range(G):
        refs, lo, hi = _group_args(blocks, k)
        edges.append(start(_verify_hop2, Pairs, {"pairs": parts}, recorder, refs, lo, hi, cfg, parts,
                           *to_hop2[k]))
    return edges


def _drops(blocks: dr.DocBlocks, sources: list[IndexSource], labels: list[ray.ObjectRef], recorder: Recorder
           ) -> list[list[ray.ObjectRef]]:
    """Per group, the drop tables of its documents, from the labels of every partition."""
    G, K = blocks.groups, len(sources)
    routed = [start(_route_labels, RoutedLabels, {"to_groups": G, "to_sources": K}, recorder, blocks.bounds, K,
                    lab)
              for lab in labels]
    to_group = dr.transpose([r.to_groups for r in routed])
    to_source = dr.transpose([r.to_sources for r in routed])
    drops = []
    for k in range(G):
        refs, lo, hi = _group_args(blocks, k)
        drops.append(start(_root_ids_new, Drops, {"by_group": G}, recorder, refs, lo, hi, blocks.bounds,
                           *to_group[k]))
    for s, src in enumerate(sources):
        drops.append(start(_root_ids_published, Drops, {"by_group": G}, recorder, src, s, K, blocks.bounds,
                           *to_source[s]))
    return dr.transpose([d.by_group for d in drops])
