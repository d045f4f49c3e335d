"""Read a finished shard set back: verify checksums, iterate samples, decode documents to text."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pipeline.shard_format import TOKENIZER, Manifest, Sample, iter_tar_samples, sha256_file


@dataclass
class ShardCheck:
    name: str
    ok: bool
    problem: str = ""


def verify_shards(out_dir: str | Path, manifest: Manifest | None = None) -> list[ShardCheck]:
    out_dir = Path(out_dir)
    manifest = manifest or Manifest.load(out_dir)
    checks = []
    for shard in manifest.shards:
        path = out_dir / shard.name
        if not path.exists():
            checks.append(ShardCheck(shard.name, False, "missing"))
            continue
        digest = sha256_file(path)
        if digest != shard.sha256:
            checks.append(ShardCheck(shard.name, False, f"sha256 {digest[:12]}... != manifest {shard.sha256[:12]}..."))
        else:
            checks.append(ShardCheck(shard.name, True))
    return checks


def iter_samples(out_dir: str | Path, manifest: Manifest | None = None) -> Iterator[Sample]:
    out_dir = Path(out_dir)
    manifest = manifest or Manifest.load(out_dir)
    for shard in manifest.shards:
        with open(out_dir / shard.name, "rb") as f:
            yield from iter_tar_samples(f)


def split_documents(sample: Sample) -> list[np.ndarray]:
    bounds = np.cumsum(sample.doc_lens)[:-1]
    return np.split(sample.input_ids, bounds)


class Decoder:
    """Token ids back to text, dropping the BOS/EOS the job added."""

    def __init__(self, out_dir: str | Path, manifest: Manifest | None = None):
        out_dir = Path(out_dir)
        self.manifest = manifest or Manifest.load(out_dir)
        self.tok = Tokenizer.from_file(str(out_dir / TOKENIZER))
        self.special = {t for t in (self.manifest.bos_id, self.manifest.eos_id) if t is not None}

    def decode(self, ids: np.ndarray) -> str:
        keep = [int(t) for t in ids if int(t) not in self.special]
        return self.tok.decode(keep, skip_special_tokens=False)


def decode_documents(out_dir: str | Path) -> dict[int, str]:
    """Every document of the shard set, re-assembled across the sequences it was cut into, keyed by
    ``ord``: the whole-corpus round trip that proves nothing was lost or altered."""
    decoder = Decoder(out_dir)
    pieces: dict[int, list[np.ndarray]] = {}
    for sample in iter_samples(out_dir, decoder.manifest):
        for ord_, ids in zip(sample.meta["ords"], split_documents(sample), strict=True):
            pieces.setdefault(ord_, []).append(ids)
    return {o: decoder.decode(np.concatenate(p)) for o, p in pieces.items()}
