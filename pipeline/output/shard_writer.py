"""Write packed sequences as a WebDataset shard set: equal-size shards, checksums, manifest last.

Tar members get fixed metadata (mtime 0, fixed owner) so the same samples give the same bytes.
Each shard is written under a temporary name and renamed into place once its sha256 is known.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import webdataset as wds

from pipeline.packing import PackedSequence
from pipeline.shard_format import (
    MANIFEST,
    Manifest,
    ShardInfo,
    atomic_write_bytes,
    encode_sample,
    sha256_file,
    shard_name,
)


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
        ids, lens, mask = seq.arrays(self.dtype)
        meta = {"doc_ids": [p.doc_id for p in seq.pieces], "ords": [p.ord for p in seq.pieces]}
        self._pending.append(encode_sample(self._index, ids, lens, mask, meta))
        self._pending_tokens += len(ids)
        self._index += 1
        if len(self._pending) == self.samples_per_shard:
            return self._write(partial=False)
        return None

    def close(self) -> ShardInfo | None:
        """Write the last, shorter shard (declared ``partial``) if samples remain."""
        if self._pending:
            return self._write(partial=True)
        return None

    def _write(self, partial: bool) -> ShardInfo:
        name = shard_name(len(self.shards))
        path = self.out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            writer = wds.TarWriter(f, user="tokenmill", group="tokenmill", mode=0o444, encoder=False, mtime=0)
            for sample in self._pending:
                writer.write(sample)
            writer.close()
            f.flush()
            os.fsync(f.fileno())
        info = ShardInfo(
            name=name,
            samples=len(self._pending),
            tokens=self._pending_tokens,
            sha256=sha256_file(tmp),
            bytes=tmp.stat().st_size,
            partial=partial,
        )
        os.replace(tmp, path)
        self.shards.append(info)
        self._pending, self._pending_tokens = [], 0
        return info


def write_manifest(out_dir: str | os.PathLike, manifest: Manifest) -> None:
    """The manifest goes last: its presence means every shard it lists is complete."""
    atomic_write_bytes(Path(out_dir) / MANIFEST, manifest.to_json().encode())
