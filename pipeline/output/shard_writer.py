"""Write packed sequences as WebDataset shards: fixed tar metadata, checksums, and every file through the
one atomic write (:func:`pipeline.storage.write_bytes`: temp name, fsync, rename; one PUT on a store).

:func:`write_shard` is the one place a shard file is made (the job's Ray tasks call it);
:class:`ShardSetWriter` streams sequences into consecutive shards in one process (benchmarks, tools).
"""

from __future__ import annotations

import os
from pathlib import Path

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
)


def write_shard(out_dir: str | os.PathLike, index: int, samples: list[dict], tokens: int, partial: bool) -> ShardInfo:
    """Write shard ``index`` under ``out_dir`` (temp name, fsync, rename) and describe it."""
    data = tar_bytes(samples)
    name = shard_name(index)
    storage.write_bytes(storage.join(os.fspath(out_dir), name), data)
    return ShardInfo(name=name, samples=len(samples), tokens=tokens, sha256=sha256_bytes(data), bytes=len(data),
                     partial=partial)


def sequence_sample(index: int, seq: PackedSequence, dtype: np.dtype) -> dict:
    """The tar members of packed sequence number ``index``."""
    ids, lens, mask = seq.arrays(dtype)
    meta = {"doc_ids": [p.doc_id for p in seq.pieces], "ords": [p.ord for p in seq.pieces]}
    return encode_sample(index, ids, lens, mask, meta)


class ShardSetWriter:
    def __init__(self, out_dir: str | os.PathLike, samples_per_shard: int, dtype: np.dtype):
        self.out_dir = Path(out_dir)
        self.samples_per_shard = samples_per_shard
        self.dtype = dtype
        self.shards: list[ShardInfo] = []
        self._pending: list[dict] = []
        self._pending_tokens = 0
        self._index = 0

    def add(self, seq: PackedSequence) -> ShardInfo | None:
        """Queue one sample; returns the shard it completed, if any."""
        self._pending.append(sequence_sample(self._index, seq, self.dtype))
        self._pending_tokens += seq.tokens
        self._index += 1
        if len(self._pending) == self.samples_per_shard:
            return self._write(partial=False)
        return None

    def close(self) -> ShardInfo | None:
        """Write the last, shorter shard (declared ``partial``) if samples remain."""
        return self._write(partial=True) if self._pending else None

    def _write(self, partial: bool) -> ShardInfo:
        info = write_shard(self.out_dir, len(self.shards), self._pending, self._pending_tokens, partial)
        self.shards.append(info)
        self._pending, self._pending_tokens = [], 0
        return info


def write_manifest(out_dir: str | os.PathLike, manifest: Manifest) -> None:
    """The manifest goes last: its presence means every shard it lists is complete."""
    storage.write_bytes(storage.join(os.fspath(out_dir), MANIFEST), manifest.to_json().encode())
