"""Tokenize, pack and write shards on Ray workers, with output independent of the worker count.

Two kinds of task, both fixed by the spec and the data alone:

1. **Pack a range.** The curated corpus (in ``ord`` order) is cut into ranges of ``range_docs``
   documents. A task tokenizes and packs its range on its own (best-fit restarts at every range
   boundary) and writes the packed sequences to ``ranges/range-NNNNNN.arrow``.
2. **Write a shard.** Once the sample counts of every range before it are known, shard ``s`` holds
   global samples ``[s * samples_per_shard, (s + 1) * samples_per_shard)``, read from the one or
   two range files that hold them; sample keys are global positions.

So shards keep equal sample counts (only the last is partial) and the shard contract and the loader
stay as they were; the driver handles only counts and file names.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from pipeline import storage
from pipeline.documents import text_bytes
from pipeline.output.curated import Part, read_rows, worker_name
from pipeline.output.shard_writer import write_shard
from pipeline.packing import PackedSequence, make_packer
from pipeline.shard_format import encode_sample

#: documents tokenized per encode call inside a range task
ENCODE_BATCH = 256
RANGE_SCHEMA = pa.schema([
    ("input_ids", pa.large_list(pa.int32())),
    ("doc_lens", pa.list_(pa.int32())),
    ("loss_mask", pa.large_list(pa.uint8())),
    ("doc_ids", pa.list_(pa.string())),
    ("ords", pa.list_(pa.int64())),
])

_ENCODERS: dict[str, Any] = {}


@dataclass(frozen=True)
class PackConfig:
    seq_len: int
    method: str
    max_open: int
    dtype: str
    samples_per_shard: int


def range_bounds(n_docs: int, range_docs: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + range_docs, n_docs)) for lo in range(0, n_docs, range_docs)]


#: a range estimated at this many times the median range goes first (a long-document outlier)
OUTLIER = 4.0


def schedule_order(todo: list[int], bounds: list[tuple[int, int]], parts: list[dict[str, Any]]) -> list[int]:
    """The order to launch range tasks in: outliers first (ranges estimated at >= :data:`OUTLIER` x the
    median range's text bytes, largest first), then the others in index order.

    Ranges hold a fixed number of documents, so a range of long documents can carry a third of the corpus
    (bench/e2e.py: 63 of 179 MB in one range of 45). Started late, it would leave the other workers idle
    for its whole run; started first, the small ranges fill in around it (longest-processing-time-first).
    Ranges of ordinary sizes keep index order, so shards still come out steadily as ranges finish (a shard
    waits for every range before it). The order decides when a range runs, never what it holds: the output
    does not change. Sizes are estimated from the curated parts' rows and bytes (documents of a part taken
    as equally long), which the driver already has.
    """
    ordered = sorted(parts, key=lambda p: int(p["first_ord"]))
    edges = np.concatenate([[0], np.cumsum([int(p["rows"]) for p in ordered])]).astype(np.float64)
    cum = np.concatenate([[0], np.cumsum([int(p.get("bytes", 0)) for p in ordered])]).astype(np.float64)
    if len(edges) < 2 or not bounds:
        return list(todo)
    at = np.interp(np.asarray(bounds, dtype=np.float64), edges, cum)
    size = at[:, 1] - at[:, 0]
    cut = OUTLIER * max(float(np.median(size)), 1.0)
    big = sorted((r for r in todo if size[r] >= cut), key=lambda r: (-size[r], r))
    return big + [r for r in todo if size[r] < cut]


def range_file(folder: str, r: int) -> str:
    return storage.join(os.fspath(folder), f"range-{r:06d}.arrow")


def _encoder(tok_json: str, info: Any, key: str) -> Any:
    """One parsed tokenizer per worker process (a task reuses it across ranges)."""
    enc = _ENCODERS.get(key)
    if enc is None:
        # Ray gave this task one CPU: tokenizers' own thread pool would take every core of the machine
        # and the job's workers would fight over them (read when the pool starts, on first use)
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        from tokenizers import Tokenizer

        from pipeline.tokenize import DocEncoder

        enc = _ENCODERS[key] = DocEncoder(Tokenizer.from_str(tok_json), info)
    return enc


def pack_range(r: int, lo: int, hi: int, curated: str, parts: list[Part], tok_json: str, info: Any,
               cfg: PackConfig, ranges_dir: str) -> dict[str, Any]:
    """Tokenize and pack documents ``[lo, hi)``; write the range file; return its record."""
    t0 = time.perf_counter()
    table = read_rows(curated, parts, lo, hi, columns=["id", "ord", "text", "segments"])
    encoder = _encoder(tok_json, info, info.sha256)
    packer = make_packer(cfg.method, cfg.seq_len, cfg.max_open)
    seqs: list[PackedSequence] = []
    ids_col, ord_col = table.column("id").to_pylist(), table.column("ord").to_pylist()
    t_tok = 0.0
    for b in range(0, table.num_rows, ENCODE_BATCH):
        chunk = table.slice(b, ENCODE_BATCH)
        t1 = time.perf_counter()
        encoded = encoder.encode(chunk.column("text").to_pylist(), chunk.column("segments").to_pylist())
        t_tok += time.perf_counter() - t1
        for j, (ids, mask) in enumerate(encoded):
            seqs.extend(packer.add(ids_col[b + j], ids, mask, ord_col[b + j]))
    seqs.extend(packer.flush())
    arrays = [s.arrays(np.dtype(np.int32)) for s in seqs]  # (ids, doc_lens, loss mask or None) per sample
    has_mask = any(a[2] is not None for a in arrays)
    out = pa.table({
        "input_ids": pa.array([a[0] for a in arrays], RANGE_SCHEMA.field("input_ids").type),
        "doc_lens": pa.array([a[1] for a in arrays], RANGE_SCHEMA.field("doc_lens").type),
        "loss_mask": pa.array([a[2] for a in arrays], RANGE_SCHEMA.field("loss_mask").type),
        "doc_ids": pa.array([[p.doc_id for p in s.pieces] for s in seqs], RANGE_SCHEMA.field("doc_ids").type),
        "ords": pa.array([[p.ord for p in s.pieces] for s in seqs], RANGE_SCHEMA.field("ords").type),
    }, schema=RANGE_SCHEMA)
    with storage.open_output(range_file(ranges_dir, r)) as sink, ipc.new_file(sink, RANGE_SCHEMA) as writer:
        writer.write_table(out)
    stats = packer.stats.as_dict()
    return {"range": r, "lo": lo, "hi": hi, "samples": len(seqs), "tokens": stats["tokens"], "has_mask": has_mask,
            "packing": stats, "bytes_in": text_bytes(table), "tokenize_seconds": round(t_tok, 3),
            "seconds": round(time.perf_counter() - t0, 3), "writer": worker_name()}


def shard_slices(s: int, samples_per_shard: int, range_samples: list[int]) -> list[tuple[int, int, int]]:
    """``(range, first, end)`` row slices of the range files that make up shard ``s``."""
    lo, hi = s * samples_per_shard, (s + 1) * samples_per_shard
    out, start = [], 0
    for r, n in enumerate(range_samples):
        end = start + n
        if end > lo and start < hi:
            out.append((r, max(lo, start) - start, min(hi, end) - start))
        start = end
        if start >= hi:
            break
    return out


def write_shard_task(s: int, slices: list[tuple[int, int, int]], ranges_dir: str, cfg: PackConfig, out_dir: str,
                     partial: bool) -> dict[str, Any]:
    """Write shard ``s`` from its range-file slices; return its manifest entry and who wrote it."""
    t0 = time.perf_counter()
    dtype = np.dtype(cfg.dtype)
    limit = np.iinfo(dtype).max
    samples, tokens, key = [], 0, s * cfg.samples_per_shard
    for r, a, b in slices:
        path = range_file(ranges_dir, r)
        with (storage.open_input(path) if storage.is_remote(path) else pa.memory_map(path)) as src:
            t = ipc.open_file(src).read_all().slice(a, b - a).combine_chunks()
        ids_col, mask_col = t.column("input_ids").chunk(0), t.column("loss_mask").chunk(0)
        offs, vals = ids_col.offsets.to_numpy(), ids_col.values.to_numpy()
        moffs, mvals = mask_col.offsets.to_numpy(), mask_col.values.to_numpy(zero_copy_only=False)
        lens, doc_ids, ords = (t.column(c).to_pylist() for c in ("doc_lens", "doc_ids", "ords"))
        valid = mask_col.is_valid().to_pylist()
        for i in range(t.num_rows):
            ids = vals[offs[i]:offs[i + 1]]
            if len(ids) and int(ids.max()) > limit:
                raise ValueError(f"token id {int(ids.max())} does not fit the shard dtype {dtype.name}")
            mask = mvals[moffs[i]:moffs[i + 1]] if valid[i] else None
            meta = {"doc_ids": doc_ids[i], "ords": ords[i]}
            samples.append(encode_sample(key, ids.astype(dtype), lens[i], mask, meta))
            tokens += len(ids)
            key += 1
    info = write_shard(out_dir, s, samples, tokens, partial)
    return {**info.__dict__, "writer": worker_name(), "seconds": round(time.perf_counter() - t0, 3)}


def merge_packing(records: list[dict[str, Any]], seq_len: int, method: str) -> dict[str, Any]:
    """Packing stats of the whole output from the per-range ones."""
    docs = sum(r["packing"]["docs"] for r in records)
    cut = sum(r["packing"]["docs_cut"] for r in records)
    seqs = sum(r["packing"]["sequences"] for r in records)
    tokens = sum(r["packing"]["tokens"] for r in records)
    return {"method": method, "seq_len": seq_len, "docs": docs, "docs_cut": cut,
            "cut_fraction": round(cut / docs, 6) if docs else 0.0, "sequences": seqs, "tokens": tokens,
            "utilization": round(tokens / (seqs * seq_len), 6) if seqs else 0.0, "ranges": len(records)}
