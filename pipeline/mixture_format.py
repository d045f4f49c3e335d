"""The mixture contract shared by ``tokenmill mix`` (the writer), the control plane and the trainer's loader.

A mixture is a manifest over shard sets, not a copy: ``mixture.json`` lists each source (where its shard
set is, the sha256 of the ``manifest.json`` it was planned from, how many samples the mixture draws from
it) and the seed; the sample schedule is not stored but computed, by the algorithm named in the file
(:data:`ALGORITHM`), identically by every reader:

* **Interleave (stratified, not i.i.d.)**: source ``i`` contributes ``c_i`` of the ``T`` samples; its
  ``k``-th sample is due at time ``floor((2k + 1) T / (2 c_i))`` and the mixture is every source's samples
  in order of (due time, tie rank), the tie ranks a permutation of the sources drawn from the seed. So any
  prefix holds within one sample of ``c_i / T`` of each source per source, and any window of 1,000 samples
  within a few samples of its target (no drift, no runs).
* **Within a source**: draw ``k`` is sample ``k mod N_i`` of the source's epoch ``k // N_i``; an epoch reads
  the source's shards in an order drawn from ``(seed, source index, epoch)``, each shard's samples in order
  (the loader then shuffles within windows, as it does for a shard set).

Everything is integer arithmetic (exact on every machine); :class:`Schedule` gives the draws of any range
of positions without generating the ones before it. This module imports only the shard contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.shard_format import (  # the manifest's own field checks and file form: one schema style
    TOTALS,
    ShardFormatError,
    _int,
    _keys,
    check_totals,
    counted_json,
    entries,
    json_object,
    parse_counted,
)

MIXTURE = "mixture.json"
FORMAT = "tokenmill-mixture"
FORMAT_VERSION = 1
ALGORITHM = "stratified-v1"
MAX_MIXTURE_BYTES = 16 << 20
MAX_SOURCES = 256
#: keeps ``(2k + 1) * T`` inside int64 for every draw
MAX_TOTAL_SAMPLES = 1 << 31
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class MixtureFormatError(ShardFormatError):
    """A mixture file that breaks the contract: the message names the field and why."""


@dataclass
class MixtureSource:
    """One source as planned: ``samples`` drawn from the ``available_samples`` of its shard set."""

    name: str
    location: str
    manifest_sha256: str
    target_share: float  # of the mixture's non-padding tokens
    samples: int
    available_samples: int
    tokens: int  # planned non-padding tokens: samples x the source's mean tokens per sample
    epochs: float
    pinned: dict[str, Any] = field(default_factory=dict)  # e.g. {"schedule": id, "version": 3}


@dataclass
class Mixture:
    seed: int
    seq_len: int
    dtype: str
    vocab_size: int
    tokenizer_hash: str
    pad_id: int
    sources: list[MixtureSource]
    spec: dict[str, Any] = field(default_factory=dict)  # the spec it was made from, as given
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    algorithm: str = ALGORITHM

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.sources)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.sources)

    def schedule(self) -> Schedule:
        return Schedule([s.samples for s in self.sources], self.seed)

    def validate(self) -> Mixture:
        """Raises MixtureFormatError naming the first field that breaks the contract."""
        if self.format != FORMAT:
            raise MixtureFormatError(f"format: must be {FORMAT!r}")
        _int(self.format_version, "format_version", FORMAT_VERSION, FORMAT_VERSION)
        if self.algorithm != ALGORITHM:
            raise MixtureFormatError(f"algorithm: unknown (this reader knows {ALGORITHM!r})")
        _int(self.seed, "seed", 0, (1 << 63) - 1)
        _int(self.seq_len, "seq_len", 1, 1 << 22)
        _int(self.vocab_size, "vocab_size", 1, 1 << 32)
        _int(self.pad_id, "pad_id", 0, self.vocab_size - 1)
        for key in ("dtype", "tokenizer_hash"):
            if type(getattr(self, key)) is not str:
                raise MixtureFormatError(f"{key}: must be a string")
        if not isinstance(self.spec, dict):
            raise MixtureFormatError("spec: must be an object")
        if not isinstance(self.sources, list) or not 1 <= len(self.sources) <= MAX_SOURCES:
            raise MixtureFormatError(f"sources: must list 1 to {MAX_SOURCES} sources")
        names: set[str] = set()
        for i, s in enumerate(self.sources):
            where = f"sources.{i}"
            if not isinstance(s, MixtureSource):
                raise MixtureFormatError(f"{where}: must be a source entry")
            if type(s.name) is not str or not _NAME.fullmatch(s.name):
                raise MixtureFormatError(f"{where}.name: letters, digits, '_', '.', '-' (at most 64)")
            if s.name in names:
                raise MixtureFormatError(f"{where}.name: {s.name} is listed twice")
            names.add(s.name)
            where = f"sources.{i} ({s.name})"
            if type(s.location) is not str or not s.location or len(s.location) > 4096:
                raise MixtureFormatError(f"{where}.location: must be a non-empty string")
            if type(s.manifest_sha256) is not str or not _HEX64.fullmatch(s.manifest_sha256):
                raise MixtureFormatError(f"{where}.manifest_sha256: must be 64 lowercase hex digits")
            _int(s.available_samples, f"{where}.available_samples", 1, MAX_TOTAL_SAMPLES)
            _int(s.samples, f"{where}.samples", 1, MAX_TOTAL_SAMPLES)
            _int(s.tokens, f"{where}.tokens", s.samples, s.samples * self.seq_len)
            for key in ("target_share", "epochs"):
                value = getattr(s, key)
                if type(value) not in (int, float) or not 0 <= value < 1e12:
                    raise MixtureFormatError(f"{where}.{key}: must be a non-negative number")
            if not isinstance(s.pinned, dict):
                raise MixtureFormatError(f"{where}.pinned: must be an object")
        if self.total_samples > MAX_TOTAL_SAMPLES:
            raise MixtureFormatError(f"sources: {self.total_samples} samples in all, more than {MAX_TOTAL_SAMPLES}")
        return self

    def to_json(self) -> str:
        return counted_json(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Mixture:
        """Parse and validate; every failure is a MixtureFormatError 'malformed mixture: FIELD: why'."""
        return parse_counted(cls._parse, text, "mixture", MixtureFormatError)

    @classmethod
    def _parse(cls, text: str | bytes) -> Mixture:
        not_mixture = f"format: not a {FORMAT} file"
        data = json_object(text, MAX_MIXTURE_BYTES, not_mixture)
        if data.get("format") != FORMAT:
            raise MixtureFormatError(not_mixture)
        totals = {k: data.pop(k, None) for k in TOTALS}
        _keys(data, set(cls.__dataclass_fields__), {"spec", "format_version", "algorithm"}, "")
        data["sources"] = entries(data["sources"], "sources", MixtureSource,
                                  set(MixtureSource.__dataclass_fields__), {"pinned"})
        mixture = cls(**data).validate()
        check_totals(mixture, totals, "sources")
        return mixture


# ------------------------------------------------------------------------------------------ schedule


class Schedule:
    """The stratified interleave of ``counts`` (samples per source), position by position."""

    def __init__(self, counts: list[int], seed: int) -> None:
        if not counts or any(c < 1 for c in counts):
            raise ValueError("every source needs at least one sample")
        self.counts = [int(c) for c in counts]
        self.total = sum(self.counts)
        if self.total > MAX_TOTAL_SAMPLES:
            raise ValueError(f"{self.total} samples: more than {MAX_TOTAL_SAMPLES}")
        #: tie rank of each source (who goes first when two are due at the same time)
        self.rank = np.argsort(np.random.default_rng([seed, 0x6D6978]).permutation(len(counts))).tolist()
        self.seed = seed

    def _due_before(self, x: int) -> list[int]:
        """Per source: how many of its samples are due strictly before time ``x``."""
        t = self.total
        return [min(c, max(0, -(-2 * c * x // t) // 2)) for c in self.counts]

    def state_at(self, position: int) -> list[int]:
        """Per source: how many of its samples come before ``position``."""
        if position <= 0:
            return [0] * len(self.counts)
        if position >= self.total:
            return list(self.counts)
        lo, hi = 0, self.total  # _due_before(lo) sums to <= position < the sum at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if sum(self._due_before(mid)) <= position:
                lo = mid
            else:
                hi = mid
        base = self._due_before(lo)
        at = [b - a for a, b in zip(base, self._due_before(lo + 1), strict=True)]
        need = position - sum(base)
        for i in sorted(range(len(at)), key=self.rank.__getitem__):
            if need and at[i]:
                base[i] += 1
                need -= 1
        return base

    def draws(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, draw index within that source) of every position in ``[lo, hi)``."""
        lo, hi = max(0, lo), min(hi, self.total)
        if hi <= lo:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        start = self.state_at(lo)
        src, ks, due = [], [], []
        for i, c in enumerate(self.counts):
            k = np.arange(start[i], min(c, start[i] + hi - lo), dtype=np.int64)
            src.append(np.full(len(k), i, np.int64))
            ks.append(k)
            due.append((2 * k + 1) * self.total // (2 * c))
        s, k, d = np.concatenate(src), np.concatenate(ks), np.concatenate(due)
        order = np.lexsort((np.asarray(self.rank, np.int64)[s], d))[: hi - lo]
        return s[order], k[order]


def source_shard_order(seed: int, source: int, epoch: int, nshards: int) -> np.ndarray:
    """The order a source's shards are read in during its ``epoch`` within the mixture."""
    return np.random.default_rng([seed, 0x737263, source, epoch]).permutation(nshards)


def source_runs(seed: int, source: int, shard_counts: list[int], draws: np.ndarray) -> list[tuple[int, int, int]]:
    """Consecutive draws of one source as runs ``(shard index, first offset, end offset)`` in read order."""
    counts = np.asarray(shard_counts, np.int64)
    n = int(counts.sum())
    draws = np.asarray(draws, np.int64)
    if not len(draws):
        return []
    epochs, rest = np.divmod(draws, n)
    shard = np.empty(len(draws), np.int64)
    off = np.empty(len(draws), np.int64)
    for epoch in np.unique(epochs).tolist():
        sel = epochs == epoch
        order = source_shard_order(seed, source, int(epoch), len(counts))
        starts = np.concatenate([[0], np.cumsum(counts[order])])
        j = np.searchsorted(starts, rest[sel], side="right") - 1
        shard[sel] = order[j]
        off[sel] = rest[sel] - starts[j]
    breaks = np.flatnonzero((shard[1:] != shard[:-1]) | (off[1:] != off[:-1] + 1)) + 1
    firsts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(draws)]])
    return [(int(shard[a]), int(off[a]), int(off[b - 1]) + 1)
            for a, b in zip(firsts.tolist(), ends.tolist(), strict=True)]
