"""Near dedup: MinHash-LSH on Ray, connected components, one document kept per component.

1. Per block of documents, MinHash signatures (kernels.minhash) and one key per LSH band.
2. Band rows (key, ord) are hash-partitioned by key; each partition turns shared keys into candidate
   pairs (all pairs of a bucket up to ``max_bucket`` documents, a star beyond).
3. With ``verify`` (default), each pair's exact Jaccard on the shingle hashes is checked in two hops
   through the blocks that hold its two documents (texts never move; one document's shingle set
   travels to the other's block), and pairs below ``threshold`` are dropped.
4. Connected components of the kept pairs, distributed (large-star / small-star, pipeline.dedup_graph).
5. In every component the document with the smallest ``ord`` is kept; the others are dropped with
   reason ``near_duplicate`` and ``{"cluster": id of the kept document}``.

The band keys, signatures and ids of the kept documents are written to
``{output_dir}/index/near_dedup/``; a later job with ``dedup_against`` adds those published documents
to the graph as nodes that sort first, so new documents in their component are dropped with
``near_duplicate_of_published`` (verified against the stored signatures: estimated Jaccard).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import ray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernels.minhash import MinHasher, band_keys, optimal_param
from pipeline import dedup_graph as g
from pipeline import dedup_ray as dr
from pipeline.dedup_index import IndexSource, index_dir, open_sources, write_meta, write_part
from pipeline.stages.base import DatasetStage

#: kernel batch: documents signed per call (bounds the kernel's working memory)
SIGN_BATCH = 512
BAND_SCHEMA = pa.schema([("key", pa.uint64()), ("node", pa.int64())])
DOC_SCHEMA = pa.schema([("node", pa.int64()), ("id", pa.string()), ("sig", pa.list_(pa.uint32()))])
LABEL_SCHEMA = pa.schema([("v", pa.int64()), ("root", pa.int64())])


class NearDedupParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: float = Field(0.8, gt=0.0, lt=1.0)
    num_perm: int = Field(128, ge=2, le=1024)
    #: LSH bands x rows; default: datasketch's optimum for the threshold (weighted towards recall
    #: when verify is on, since verification removes the false positives)
    bands: int | None = Field(None, ge=1)
    rows: int | None = Field(None, ge=1)
    ngram: int = Field(5, ge=1, le=64)
    shingle: Literal["word", "char"] = "word"
    seed: int = 1
    hashfunc: Literal["fast", "sha1"] = "fast"
    verify: bool = True
    max_bucket: int = Field(64, ge=2, le=4096)
    dedup_against: str | list[str] | None = None
    partitions: int | None = Field(None, ge=1, le=4096)
    #: where signatures are permuted: numpy, or torch on CUDA ("cuda": signature tasks ask Ray for a GPU)
    device: Literal["cpu", "auto", "cuda"] = "cpu"
    write_index: bool = True

    @model_validator(mode="after")
    def _check_bands(self) -> NearDedupParams:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        return self


@dataclass(frozen=True)
class NearConfig:
    """What every task needs to sign documents the same way (picklable)."""

    num_perm: int
    bands: int
    rows: int
    ngram: int
    shingle: str
    seed: int
    hashfunc: str
    device: str
    threshold: float

    @classmethod
    def from_params(cls, p: NearDedupParams) -> NearConfig:
        if p.bands is not None:
            bands, rows = p.bands, p.rows
        else:
            wfn = 0.85 if p.verify else 0.5
            bands, rows = optimal_param(p.threshold, p.num_perm, 1.0 - wfn, wfn)
        return cls(p.num_perm, bands, rows, p.ngram, p.shingle, p.seed, p.hashfunc, p.device, p.threshold)

    def hasher(self) -> MinHasher:
        # "cuda": the signature tasks ask Ray for a GPU; a task given none (index rows, verification)
        # falls back to numpy rather than failing
        device = "auto" if self.device == "cuda" else self.device
        return MinHasher(self.num_perm, self.seed, self.ngram, self.shingle, self.hashfunc, device=device)

    def index_params(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("device")
        d.pop("threshold")
        return d

    def sign(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Signatures and shingle counts of texts, in kernel-sized batches."""
        mh = self.hasher()
        sigs, counts = [], []
        for i in range(0, len(texts), SIGN_BATCH):
            h, off = mh.shingle_hashes32(texts[i : i + SIGN_BATCH])
            sigs.append(mh.signatures_from_hashes(h, off))
            counts.append(np.diff(off))
        if not sigs:
            return np.zeros((0, self.num_perm), np.uint32), np.zeros(0, np.int64)
        return np.concatenate(sigs), np.concatenate(counts)

    def shingle_sets(self, texts: list[str]) -> list[np.ndarray]:
        """Sorted distinct 64-bit shingle hashes per text (what verification compares)."""
        mh = self.hasher()
        out = []
        for i in range(0, len(texts), SIGN_BATCH):
            h, off = mh.shingle_hashes64(texts[i : i + SIGN_BATCH])
            out.extend(np.unique(h[off[k] : off[k + 1]]) for k in range(len(off) - 1))
        return out


def _published_node(old: np.ndarray, source: int, nsources: int) -> np.ndarray:
    """Published documents become negative nodes: they sort before every new document."""
    if len(old) and int(old.max()) >= (1 << 62) // nsources:
        raise ValueError("published ord too large to encode")
    return -1 - (old.astype(np.int64) * nsources + source)


def _decode_published(node: np.ndarray, nsources: int) -> tuple[np.ndarray, np.ndarray]:
    x = -1 - node
    return x % nsources, x // nsources


# ---- tasks --------------------------------------------------------------------------------------

def _pairs_to_parts(pairs: np.ndarray, parts: int) -> tuple:
    out = dr.partition_pairs(pairs, parts)
    return tuple(out) if parts > 1 else out[0]


@ray.remote(num_cpus=1)
def _band_map(table: pa.Table, cfg: NearConfig, parts: int, recorder: Any) -> tuple:
    """Band rows (key, ord) of one block, split by key partition."""
    t0 = time.perf_counter()
    sigs, counts = cfg.sign(table.column("text").to_pylist())
    ords = table.column("ord").to_numpy().astype(np.int64)
    has = counts > 0  # a document without any word has no signature to match on
    keys = band_keys(sigs[has], cfg.bands, cfg.rows)
    rows = np.stack([keys.ravel().view(np.int64), np.repeat(ords[has], cfg.bands)], axis=1)
    pieces = [x[0] for x in g.split_by(g.partition_of(keys.ravel(), parts), parts, rows)]
    recorder.counts(seconds=time.perf_counter() - t0)
    return tuple(pieces) if parts > 1 else pieces[0]


@ray.remote(num_cpus=1)
def _band_reduce(part: int, parts: int, bounds: np.ndarray, sources: list[IndexSource], verify: bool,
                 max_bucket: int, *pieces: np.ndarray) -> tuple:
    """Candidate pairs from the band rows of one key partition (and of the published index)."""
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
        return _pairs_to_parts(pairs, parts)
    new, pub = pairs[pairs[:, 0] >= 0], pairs[pairs[:, 0] < 0]
    return (*_route_pairs(new, 0, bounds), *_route_pairs(pub, 1, bounds))


def _route_pairs(pairs: np.ndarray, col: int, bounds: np.ndarray) -> list[np.ndarray]:
    grp = dr.group_of(pairs[:, col], bounds)
    return [x[0] for x in g.split_by(grp, len(bounds), pairs)]


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
def _verify_hop1(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, cfg: NearConfig,
                 bounds: np.ndarray, parts: int, nreduce: int, sources: list[IndexSource],
                 *pieces: np.ndarray) -> tuple:
    """At the group holding each pair's first document: ship its shingle set towards the second;
    check pairs with a published document against the published signature."""
    new = np.concatenate(pieces[:nreduce]) if nreduce else g.EMPTY_PAIRS
    pub = np.concatenate(pieces[nreduce:]) if nreduce else g.EMPTY_PAIRS
    new, pub = g.unique_pairs(new), g.unique_pairs(pub)
    out: list[Any] = []
    # new-new pairs: (x, y, set of x) grouped by the group of y
    xs = np.unique(new[:, 0])
    docs = _fetch(block_refs, lo, hi, xs, ["text"])
    d_ord = docs.column("ord").to_numpy()
    sets = cfg.shingle_sets(docs.column("text").to_pylist())
    pos = {int(o): k for k, o in enumerate(d_ord)}
    for chunk in _route_pairs(new, 1, bounds):
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
    return (*out, *dr.partition_pairs(edges, parts))


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
def _verify_hop2(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, cfg: NearConfig,
                 parts: int, *pieces: tuple) -> tuple:
    """At the group holding each pair's second document: exact Jaccard, keep pairs >= threshold."""
    pieces = [p for p in pieces if len(p[0])]
    if not pieces:
        return _pairs_to_parts(g.EMPTY_PAIRS, parts)
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
    return _pairs_to_parts(edges, parts)


@ray.remote(num_cpus=0.5)
def _route_labels(bounds: np.ndarray, nsources: int, labels: np.ndarray) -> tuple:
    """Labels (v, root) of new documents, split by where the root's id lives: the group of a new
    root, or the source of a published one."""
    labels = labels[labels[:, 0] >= 0]
    new, pub = labels[labels[:, 1] >= 0], labels[labels[:, 1] < 0]
    out = _route_pairs(new, 1, bounds)
    if nsources:
        src, _ = _decode_published(pub[:, 1], nsources)
        out += [x[0] for x in g.split_by(src, nsources, pub)]
    return tuple(out) if len(out) > 1 else out[0]


@ray.remote(num_cpus=0.5)
def _root_ids_new(block_refs: list[ray.ObjectRef], lo: np.ndarray, hi: np.ndarray, bounds: np.ndarray,
                  *pieces: np.ndarray) -> tuple:
    labels = np.concatenate(pieces) if pieces else g.EMPTY_PAIRS
    docs = _fetch(block_refs, lo, hi, labels[:, 1], ["id"])
    ids = dict(zip(docs.column("ord").to_pylist(), docs.column("id").to_pylist(), strict=True))
    drops = dr.drop_table(labels[:, 0], "near_duplicate", [{"cluster": ids[int(r)]} for r in labels[:, 1]])
    out = dr.route_table(drops, "ord", bounds)
    return tuple(out) if len(out) > 1 else out[0]


@ray.remote(num_cpus=0.5)
def _root_ids_published(source: IndexSource, s: int, nsources: int, bounds: np.ndarray,
                        *pieces: np.ndarray) -> tuple:
    labels = np.concatenate(pieces) if pieces else g.EMPTY_PAIRS
    ids: dict[int, str] = {}
    if len(labels):
        _, old = _decode_published(labels[:, 1], nsources)
        t = source.lookup("docs", "node", np.unique(old), ["id"])
        ids = dict(zip(t.column("node").to_pylist(), t.column("id").to_pylist(), strict=True))
        ids = {int(_published_node(np.array([k]), s, nsources)[0]): v for k, v in ids.items()}
    drops = dr.drop_table(labels[:, 0], "near_duplicate_of_published",
                          [{"cluster": ids.get(int(r))} for r in labels[:, 1]])
    out = dr.route_table(drops, "ord", bounds)
    return tuple(out) if len(out) > 1 else out[0]


@dataclass(frozen=True)
class _Indexer:
    """Index rows of the documents a block keeps: band keys and signatures (by partition)."""

    cfg: NearConfig
    parts: int

    def pieces(self, kept: pa.Table) -> list[pa.Table]:
        sigs, counts = self.cfg.sign(kept.column("text").to_pylist()) if kept.num_rows else (
            np.zeros((0, self.cfg.num_perm), np.uint32), np.zeros(0, np.int64))
        has = counts > 0
        ords = kept.column("ord").to_numpy().astype(np.int64)[has] if kept.num_rows else np.zeros(0, np.int64)
        ids = np.array(kept.column("id").to_pylist(), dtype=object)[has] if kept.num_rows else np.zeros(0, object)
        sigs = sigs[has]
        keys = band_keys(sigs, self.cfg.bands, self.cfg.rows).ravel()
        bands = pa.table({"key": keys, "node": np.repeat(ords, self.cfg.bands)}, schema=BAND_SCHEMA)
        kp = g.partition_of(keys, self.parts)
        np_ = g.partition_of(ords, self.parts)
        docs = pa.table({"node": ords, "id": pa.array(list(ids), pa.string()),
                         "sig": pa.array(list(sigs), pa.list_(pa.uint32()))}, schema=DOC_SCHEMA)
        return [*_split_table(bands, kp, self.parts), *_split_table(docs, np_, self.parts)]


def _split_table(table: pa.Table, part: np.ndarray, parts: int) -> list[pa.Table]:
    order = np.argsort(part, kind="stable")
    table = table.take(pa.array(order))
    cuts = np.searchsorted(part[order], np.arange(parts + 1))
    return [table.slice(cuts[k], cuts[k + 1] - cuts[k]) for k in range(parts)]


# ---- the stage ------------------------------------------------------------------------------------

class NearDedup(DatasetStage):
    name = "near_dedup"
    Params = NearDedupParams
    reorders = False  # documents are removed in place: blocks keep their order
    path_params = ("dedup_against",)

    def preflight(self) -> None:
        open_sources(self.params.dedup_against, self.name, NearConfig.from_params(self.params).index_params())

    def apply(self, ds: Any, recorder: Any) -> Any:
        p = self.params
        cfg = NearConfig.from_params(p)
        sources = open_sources(p.dedup_against, self.name, cfg.index_params())
        parts = p.partitions or (sources[0].partitions if sources else dr.default_partitions())
        blocks = dr.DocBlocks.from_dataset(ds)
        folder = index_dir(self.ctx.output_dir, self.name) if (p.write_index and self.ctx.output_dir) else None
        live = [ref for ref, n in zip(blocks.refs, blocks.rows, strict=True) if n > 0]
        if not live:
            if folder is not None:
                write_meta(folder, self.name, parts, cfg.index_params(), {"bands": 0, "docs": 0})
            recorder.counts(docs_in=0, docs_out=0)
            return ray.data.from_arrow_refs(blocks.refs) if blocks.refs else ds
        G = blocks.groups
        gpu = {"num_gpus": 1} if p.device == "cuda" else {}
        maps = [dr.call(_band_map, parts, ref, cfg, parts, recorder, **gpu) for ref in live]
        per_part = dr.transpose(maps)
        if p.verify:
            red = [dr.call(_band_reduce, 2 * G, j, parts, blocks.bounds, sources, True, p.max_bucket,
                           *per_part[j]) for j in range(parts)]
            edges = self._verify(blocks, cfg, parts, sources, red)
        else:
            edges = [dr.call(_band_reduce, parts, j, parts, blocks.bounds, sources, False, p.max_bucket,
                             *per_part[j]) for j in range(parts)]
        labels, _rounds = dr.connected_components(edges, parts)
        drops = self._drops(blocks, sources, labels)
        indexer = _Indexer(cfg, parts) if folder is not None else None
        out, index_pieces = dr.apply_drops(blocks, drops, recorder, indexer, 2 * parts if indexer else 0)
        result = ray.data.from_arrow_refs(out)
        if folder is not None:
            by_part = dr.transpose(index_pieces)
            counts = ray.get(
                [write_part.remote(str(folder), "bands", j, BAND_SCHEMA, *by_part[j]) for j in range(parts)]
                + [write_part.remote(str(folder), "docs", j, DOC_SCHEMA, *by_part[parts + j])
                   for j in range(parts)]
            )
            write_meta(folder, self.name, parts, cfg.index_params(),
                       {"bands": int(sum(counts[:parts])), "docs": int(sum(counts[parts:]))})
        return result

    @staticmethod
    def _group_args(blocks: dr.DocBlocks, k: int) -> tuple[list[ray.ObjectRef], np.ndarray, np.ndarray]:
        idx = blocks.blocks_of_group(k)
        return [blocks.refs[i] for i in idx], blocks.lo[idx], blocks.hi[idx]

    def _verify(self, blocks: dr.DocBlocks, cfg: NearConfig, parts: int, sources: list[IndexSource],
                red: list[list[ray.ObjectRef]]) -> list[list[ray.ObjectRef]]:
        G = blocks.groups
        new_by_group = dr.transpose([r[:G] for r in red])
        pub_by_group = dr.transpose([r[G:] for r in red])
        hop1 = []
        for k in range(G):
            refs, lo, hi = self._group_args(blocks, k)
            hop1.append(dr.call(_verify_hop1, G + parts, refs, lo, hi, cfg, blocks.bounds, parts, len(red),
                                sources, *new_by_group[k], *pub_by_group[k]))
        to_hop2 = dr.transpose([h[:G] for h in hop1])
        edges = [h[G:] for h in hop1]
        for k in range(G):
            refs, lo, hi = self._group_args(blocks, k)
            edges.append(dr.call(_verify_hop2, parts, refs, lo, hi, cfg, parts, *to_hop2[k]))
        return edges

    def _drops(self, blocks: dr.DocBlocks, sources: list[IndexSource], labels: list[ray.ObjectRef]
               ) -> list[list[ray.ObjectRef]]:
        G, K = blocks.groups, len(sources)
        routed = [dr.call(_route_labels, G + K, blocks.bounds, K, lab) for lab in labels]
        by_dest = dr.transpose(routed)
        drops = []
        for k in range(G):
            refs, lo, hi = self._group_args(blocks, k)
            drops.append(dr.call(_root_ids_new, G, refs, lo, hi, blocks.bounds, *by_dest[k]))
        for s, src in enumerate(sources):
            drops.append(dr.call(_root_ids_published, G, src, s, K, blocks.bounds, *by_dest[G + s]))
        return dr.transpose(drops)
