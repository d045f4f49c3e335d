"""What near dedup is asked to do and how every task signs documents: the stage's parameters and the
picklable signing config derived from them.

A module of its own so that the stage (:mod:`pipeline.dedup.near`, imported to validate a spec) and its Ray
tasks (:mod:`pipeline.dedup.near_tasks`, imported when it runs) both import it rather than each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernels.minhash import MinHasher, optimal_param
from pipeline.problems import across_params

#: the stage's name: in specs, in its index folder and in the index's meta
NAME = "near_dedup"
#: kernel batch: documents signed per call (bounds the kernel's working memory)
SIGN_BATCH = 512


def _bands_and_rows(schema: dict[str, Any]) -> None:
    """:meth:`NearDedupParams._check_bands`' both-or-neither in the JSON schema (its product with ``num_perm``
    is not a JSON schema's to state)."""
    schema["anyOf"] = [{"required": ["bands", "rows"], "properties": {"bands": {"type": "integer"},
                                                                         "rows": {"type": "integer"}}},
                       {"properties": {"bands": {"type": "null"}, "rows": {"type": "null"}}}]


class NearDedupParams(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_bands_and_rows)
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
        if self.bands is not None and self.rows is not None and self.bands * self.rows > self.num_perm:
            raise across_params(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
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
        if p.bands is not None and p.rows is not None:  # both or neither (the params' validator)
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
        out: list[np.ndarray] = []
        for i in range(0, len(texts), SIGN_BATCH):
            h, off = mh.shingle_hashes64(texts[i : i + SIGN_BATCH])
            out.extend(_sorted_distinct(h[off[k] : off[k + 1]]) for k in range(len(off) - 1))
        return out


def _sorted_distinct(h: np.ndarray) -> np.ndarray:
    """``np.unique(h)``, by a sort (twice as fast as numpy's hash-based unique on these arrays)."""
    h = np.sort(h)
    return h[np.r_[True, h[1:] != h[:-1]]] if len(h) else h
