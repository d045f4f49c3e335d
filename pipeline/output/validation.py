"""The validation split (``output.validation``): which curated documents are held out, and their files.

A document's side is decided by a 64-bit hash of a key of its own, never by its position, so the split is the
same on every run and at any parallelism; what it depends on is the document and the corpus' size.

- With a ``near_dedup`` stage in the job, the key is the document's id: that stage keeps one document per
  near-duplicate cluster (Jaccard at or above its threshold, verified, within LSH's recall), so each kept
  document is its own cluster and any split of them keeps clusters on one side.
- Without it, each document is signed with the near_dedup stage's own kernel and default parameters
  (:class:`~pipeline.dedup.near_config.NearConfig`: 5-word shingles, 128 permutations, LSH bands for Jaccard
  0.8). The key is the first band's key, so exact duplicates and most near duplicates are held out together;
  then every training document that shares *any* LSH band with a validation document is dropped from training
  (counted, ``near_validation``). A pair at Jaccard J shares a band with the probability near_dedup finds it
  with (about 0.87 at J = 0.8, 0.999 at J = 0.9), so no pair that near_dedup would catch crosses the split.

``share``: a document is held out when its hash is below ``share`` of the hash range (at least one document is).
``documents: N``: the N smallest hashes are held out (more only when documents share the N-th key).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kernels.minhash import band_keys, fmix64
from pipeline import storage
from pipeline.dedup.near_config import NAME, NearConfig, NearDedupParams
from pipeline.documents import text_bytes
from pipeline.output.curated import Part, parquet_file, worker_name, write_parquet

#: the folder of the validation shard set in the output, and the name nothing else may take there
VALIDATION = "validation"
#: ``OUT/validation/documents.jsonl``: each held-out document's id and text, in corpus order
DOCUMENTS_JSONL = "documents.jsonl"
_SALT = np.uint64(0x76616C69646174)  # "validat": the split's hashes are not the dedup keys themselves
_U64_RANGE = 1 << 64


@dataclass(frozen=True)
class KeyConfig:
    """How documents are keyed (picklable): by id (``near`` None) or by MinHash-LSH bands."""

    near: NearConfig | None

    @property
    def kind(self) -> str:
        return "id" if self.near is None else "minhash_bands"


def key_config(stage_types: list[str]) -> KeyConfig:
    """By id when a ``near_dedup`` stage is in the job, else by the default near_dedup signing."""
    if NAME in stage_types:
        return KeyConfig(None)
    return KeyConfig(NearConfig.from_params(NearDedupParams()))


def _hash_bytes(values: list[bytes]) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.blake2b(v, digest_size=8).digest(), "little") for v in values],
                    dtype=np.uint64)


def document_keys(ids: list[str], texts: list[str], cfg: KeyConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per document, its selection hash (uint64) and its LSH band keys (``(n, bands)`` uint64; ``(n, 0)`` when
    keyed by id). A document without a shingle (no word) is keyed by its text's hash in every band."""
    if cfg.near is None:
        return fmix64(_hash_bytes([i.encode() for i in ids]) ^ _SALT), np.zeros((len(ids), 0), np.uint64)
    near = cfg.near
    sigs, counts = near.sign(texts)
    keys = band_keys(sigs, near.bands, near.rows) if len(texts) else np.zeros((0, near.bands), np.uint64)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        keys[empty] = _hash_bytes([texts[i].encode() for i in empty])[:, None]
    return fmix64(keys[:, 0] ^ _SALT), keys


def smallest(sel: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` smallest selection hashes (what the threshold needs of one part)."""
    return np.sort(sel)[:n]


def threshold(share: float | None, documents: int | None, lows: list[np.ndarray]) -> int:
    """The largest selection hash held out, from every part's smallest hashes (:func:`smallest`)."""
    low = np.sort(np.concatenate(lows)) if lows else np.zeros(0, np.uint64)
    if not len(low):
        return -1
    if documents is not None:
        return int(low[min(documents, len(low)) - 1])
    return max(int(float(share or 0.0) * _U64_RANGE) - 1, int(low[0]))


def split_masks(sel: np.ndarray, bands: np.ndarray, cut: int, held_bands: np.ndarray) -> tuple[np.ndarray,
                                                                                               np.ndarray]:
    """``(validation, dropped)``: held out (hash at most ``cut``), and training documents dropped for sharing a
    band key with a held-out document (``held_bands``: every held-out document's keys)."""
    held = sel <= np.uint64(max(cut, 0)) if cut >= 0 else np.zeros(len(sel), bool)
    near = np.isin(bands, held_bands).any(axis=1) if bands.shape[1] and len(held_bands) else np.zeros(len(sel), bool)
    return held, near & ~held


def split_documents(ids: list[str], texts: list[str], cfg: KeyConfig, share: float | None = None,
                    documents: int | None = None) -> tuple[set[str], set[str]]:
    """The split of a whole corpus in one process: ``(validation ids, ids dropped from training)``; a job
    computes the same per part (:func:`key_part`, :func:`held_bands`, :func:`split_part`)."""
    sel, bands = document_keys(ids, texts, cfg)
    cut = threshold(share, documents, [smallest(sel, documents or 1)])
    held = sel <= np.uint64(cut)
    held_keys = np.unique(bands[held].ravel())
    val, dropped = split_masks(sel, bands, cut, held_keys)
    return ({i for i, v in zip(ids, val, strict=True) if v}, {i for i, d in zip(ids, dropped, strict=True) if d})


# ---- per curated part, in Ray tasks (pipeline/job/validation.py runs them) ---------------------------------


def _keys_file(keys_dir: str, part: Part) -> str:
    return storage.join(keys_dir, part.name.replace(".parquet", ".npz"))


def key_part(folder: str, part: Part, cfg: KeyConfig, keys_dir: str, n: int) -> np.ndarray:
    """Key the documents of one curated part, keep the keys beside it, return its ``n`` smallest hashes."""
    table = parquet_file(storage.join(folder, part.name)).read(columns=["id", "text"])
    sel, bands = document_keys(table.column("id").to_pylist(), table.column("text").to_pylist(), cfg)
    buf = io.BytesIO()
    np.savez(buf, sel=sel, bands=bands)
    storage.write_bytes(_keys_file(keys_dir, part), buf.getvalue())
    return smallest(sel, n)


def _read_keys(keys_dir: str, part: Part) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(storage.read_bytes(_keys_file(keys_dir, part)))) as data:
        return data["sel"], data["bands"]


def held_bands(keys_dir: str, part: Part, cut: int) -> np.ndarray:
    """The band keys of the part's held-out documents (distinct)."""
    sel, bands = _read_keys(keys_dir, part)
    return np.unique(bands[sel <= np.uint64(cut)].ravel()) if cut >= 0 else np.zeros(0, np.uint64)


@dataclass(frozen=True)
class PartSplit:
    """One curated part split: its training part, its validation part (None when empty), documents dropped."""

    train: Part | None
    validation: Part | None
    dropped: int


def split_part(folder: str, part: Part, keys_dir: str, cut: int, held: np.ndarray, train_dir: str,
               val_dir: str) -> PartSplit:
    """Write one curated part's training and validation rows as parts of their own (order kept)."""
    table = parquet_file(storage.join(folder, part.name)).read()
    sel, bands = _read_keys(keys_dir, part)
    val, dropped = split_masks(sel, bands, cut, held)
    return PartSplit(_write_rows(table, ~val & ~dropped, train_dir), _write_rows(table, val, val_dir),
                     int(dropped.sum()))


def _write_rows(table: pa.Table, mask: np.ndarray, dest: str) -> Part | None:
    if not mask.any():
        return None
    sub = table.filter(pa.array(mask))
    first = int(sub.column("ord")[0].as_py())
    name = f"part-{first:020d}.parquet"
    write_parquet(sub, storage.join(dest, name))
    return Part(name, sub.num_rows, first, text_bytes(sub), worker_name())


def write_documents_jsonl(folder: str, parts: list[Part], path: str) -> int:
    """``OUT/validation/documents.jsonl``: ``{"id", "text"}`` per held-out document in corpus order; returns bytes."""
    size = 0
    with storage.open_output(path) as out:
        for part in parts:
            table = parquet_file(storage.join(folder, part.name)).read(columns=["id", "text"])
            for row in table.to_pylist():
                line = (json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False) + "\n").encode()
                out.write(line)
                size += len(line)
    return size
