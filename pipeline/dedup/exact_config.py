"""What exact dedup is asked to do and the hash it keys documents by: shared by the stage
(:mod:`pipeline.dedup.exact`) and its Ray tasks (:mod:`pipeline.dedup.exact_tasks`), which import this
module rather than each other.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

#: the stage's name: in specs, in its index folder and in the index's meta
NAME = "exact_dedup"
HASH_NAME = "blake2b-128(nfc, collapsed whitespace)"


class ExactDedupParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    casefold: bool = False
    #: earlier output dir(s) whose published documents new ones must not repeat
    dedup_against: str | list[str] | None = None
    #: hash partitions (Ray tasks) of the exchange; default: the earlier index's, else 2 x CPUs
    partitions: int | None = Field(None, ge=1, le=4096)
    write_index: bool = True

    def index_params(self) -> dict[str, Any]:
        """What an index must have been built with to be deduplicated against (its meta's parameters)."""
        return {"casefold": self.casefold, "hash": HASH_NAME}


def normalized_hash(texts: list[str], casefold: bool) -> np.ndarray:
    """(n, 2) uint64: 128-bit hash of each text after NFC and whitespace collapsing."""
    digests = []
    for text in texts:
        norm = " ".join(unicodedata.normalize("NFC", text).split())
        if casefold:
            norm = norm.casefold()
        digests.append(hashlib.blake2b(norm.encode("utf-8", "surrogatepass"), digest_size=16).digest())
    return np.frombuffer(b"".join(digests), dtype="<u8").reshape(-1, 2).astype(np.uint64)
