"""Exact dedup: one document per normalized text, across every input file, on Ray.

The text is normalized (NFC, whitespace runs collapsed to one space, optionally case-folded) and
hashed to 128 bits (BLAKE2b). Hash rows (hash, ord, id) are hash-partitioned across Ray tasks; in
each partition the copy with the smallest ``ord`` (the earliest in input order) is kept, the others
are dropped with reason ``exact_duplicate`` and the kept copy's id as ``kept_id``. The kept hashes are written
to ``{output_dir}/index/exact_dedup/`` so a later job given ``dedup_against`` drops documents
already published (``exact_duplicate_of_published``).
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pipeline.stages.base import DatasetStage

HASH_NAME = "blake2b-128(nfc, collapsed whitespace)"


class ExactDedupParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    casefold: bool = False
    #: earlier output dir(s) whose published documents new ones must not repeat
    dedup_against: str | list[str] | None = None
    #: hash partitions (Ray tasks) of the exchange; default: the earlier index's, else 2 x CPUs
    partitions: int | None = Field(None, ge=1, le=4096)
    write_index: bool = True


def normalized_hash(texts: list[str], casefold: bool) -> np.ndarray:
    """(n, 2) uint64: 128-bit hash of each text after NFC and whitespace collapsing."""
    digests = []
    for text in texts:
        norm = " ".join(unicodedata.normalize("NFC", text).split())
        if casefold:
            norm = norm.casefold()
        digests.append(hashlib.blake2b(norm.encode("utf-8", "surrogatepass"), digest_size=16).digest())
    return np.frombuffer(b"".join(digests), dtype="<u8").reshape(-1, 2).astype(np.uint64)


class ExactDedup(DatasetStage):
    name = "exact_dedup"
    Params = ExactDedupParams
    reorders = False  # documents are removed in place: blocks keep their order
    path_params = ("dedup_against",)

    def index_params(self) -> dict[str, Any]:
        return {"casefold": self.params.casefold, "hash": HASH_NAME}

    def preflight(self) -> None:
        from pipeline.dedup.index import open_sources

        open_sources(self.params.dedup_against, self.name, self.index_params())

    def apply(self, ds: Any, recorder: Any) -> Any:
        from pipeline.dedup.exact_tasks import exact_dedup

        return exact_dedup(self, ds, recorder)

