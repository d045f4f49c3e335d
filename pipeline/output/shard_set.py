"""Write a shard set: WebDataset shards with fixed tar metadata and checksums, then the manifest; every file through
the one atomic write (:func:`pipeline.storage.write_bytes`: temp name, fsync, rename; one PUT on a store).

The one writer of shard sets. :class:`ShardSetWriter` streams samples into consecutive shards: shard ``i`` holds the
samples ``[i * samples_per_shard, (i + 1) * samples_per_shard)``, keyed by their position, the last one shorter and
declared ``partial``. The job's Ray tasks each write one shard with it, starting at that shard's index
(:func:`pipeline.job.write.write_shard_task`); a mixture's ``--materialize`` (:mod:`pipeline.output.materialize`),
the benchmarks and the tests write a whole set in one process (:func:`write_shard_set`). :func:`write_manifest`
goes last: its presence means every shard it lists is complete.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from pipeline import storage
from pipeline.packing import PackedSequence
from pipeline.shard_format import (
    MANIFEST,
    Manifest,
    ShardInfo,
    encode_sample,
    sha256_bytes,
    shard_name,
    tar_bytes,
    token_dtype,
)

#: one sample to write: input_ids, doc_lens, loss_mask (None: every token carries loss)
Packed = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def write_shard(out_dir: str | os.PathLike[str], index: int, samples: list[dict[str, bytes | str]], tokens: int,
                partial: bool) -> ShardInfo:
    """Write shard ``index`` of encoded ``samples`` under ``out_dir`` and describe it: the one place a shard file
    is made."""
    data = tar_bytes(samples)
    name = shard_name(index)
    storage.write_bytes(storage.join(os.fspath(out_dir), name), data)
    return ShardInfo(name=name, samples=len(samples), tokens=tokens, sha256=sha256_bytes(data), bytes=len(data),
                     partial=partial)


class ShardSetWriter:
    """Samples in, full shards out as they fill; :meth:`close` writes the last, shorter one.

    ``first_shard`` starts the set at that shard (its first sample's key is ``first_shard * samples_per_shard``):
    a job's task writes its one shard so, and the bytes are those a whole-set writer would have made."""

    def __init__(self, out_dir: str | os.PathLike[str], samples_per_shard: int, dtype: np.dtype,
                 first_shard: int = 0) -> None:
        self.out_dir = os.fspath(out_dir)
        self.samples_per_shard = samples_per_shard
        self.dtype = dtype
        self.shards: list[ShardInfo] = []
        self.has_mask = False
        self._first = first_shard
        self._pending: list[dict[str, bytes | str]] = []
        self._pending_tokens = 0
        self._key = first_shard * samples_per_shard

    def add_sample(self, input_ids: np.ndarray, doc_lens: Any, loss_mask: np.ndarray | None,
                   meta: dict[str, Any]) -> ShardInfo | None:
        """Queue one sample (``input_ids`` already in :attr:`dtype`); returns the shard it completed, if any."""
        self._pending.append(encode_sample(self._key, input_ids, doc_lens, loss_mask, meta))
        self._pending_tokens += len(input_ids)
        self.has_mask = self.has_mask or loss_mask is not None
        self._key += 1
        if len(self._pending) == self.samples_per_shard:
            return self._write(partial=False)
        return None

    def add(self, seq: PackedSequence) -> ShardInfo | None:
        """A packed sequence, with its documents' ids and ``ord`` s as its meta (as the job writes them)."""
        ids, lens, mask = seq.arrays(self.dtype)
        meta = {"doc_ids": [p.doc_id for p in seq.pieces], "ords": [p.ord for p in seq.pieces]}
        return self.add_sample(ids, lens, mask, meta)

    def close(self) -> ShardInfo | None:
        """Write the last, shorter shard (declared ``partial``) if samples remain."""
        return self._write(partial=True) if self._pending else None

    def _write(self, partial: bool) -> ShardInfo:
        info = write_shard(self.out_dir, self._first + len(self.shards), self._pending, self._pending_tokens, partial)
        self.shards.append(info)
        self._pending, self._pending_tokens = [], 0
        return info


def write_manifest(out_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """The manifest goes last: its presence means every shard it lists is complete."""
    storage.write_bytes(storage.join(os.fspath(out_dir), MANIFEST), manifest.to_json().encode())


def write_shard_set(out_dir: str | os.PathLike[str], sequences: Iterable[Packed], *, seq_len: int, vocab_size: int,
                    samples_per_shard: int, pad_id: int = 0, eos_id: int | None = None, bos_id: int | None = None,
                    spec_hash: str, tokenizer_hash: str, meta: dict[str, Any] | None = None) -> Manifest:
    """Write ``sequences`` as a whole shard set in ``out_dir``, the manifest last; ``meta`` is every sample's
    ``meta.json`` (``{}`` by default). Tokens are stored in the smallest dtype that holds ``vocab_size``."""
    dtype = token_dtype(vocab_size)
    writer = ShardSetWriter(out_dir, samples_per_shard, dtype)
    for ids, lens, mask in sequences:
        if len(ids) > seq_len:
            raise ValueError(f"sequence of {len(ids)} tokens exceeds seq_len {seq_len}")
        writer.add_sample(np.asarray(ids, dtype=dtype), lens, mask, meta if meta is not None else {})
    writer.close()
    manifest = Manifest(spec_hash=spec_hash, tokenizer_hash=tokenizer_hash, seq_len=seq_len, dtype=dtype.name,
                        vocab_size=vocab_size, samples_per_shard=samples_per_shard, bos_id=bos_id, eos_id=eos_id,
                        pad_id=pad_id, has_loss_mask=writer.has_mask, shards=writer.shards)
    write_manifest(out_dir, manifest)
    return manifest
