"""Pack tokenized documents into fixed-length sequences that keep document boundaries.

Best-fit (the default): each document goes into the open sequence whose free space fits it most
tightly, so short documents fill the gaps long ones leave; a document longer than ``seq_len`` is cut
into full sequences plus a remainder that is packed like any other document. Open sequences are
bounded (``max_open``): when one more would be opened, the fullest is emitted. Concat-and-chunk is
the usual baseline: one token stream cut every ``seq_len`` tokens, cutting most documents it meets.

Both are streaming and deterministic: the output depends only on the order of the input.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Piece:
    """A document, or the part of one, that lands in one sequence."""

    doc_id: str
    ids: np.ndarray
    mask: np.ndarray | None = None
    ord: int = -1


@dataclass
class PackedSequence:
    pieces: list[Piece]

    @property
    def tokens(self) -> int:
        return sum(len(p.ids) for p in self.pieces)

    def arrays(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        ids = np.concatenate([p.ids for p in self.pieces])
        if len(ids) and int(ids.max()) > np.iinfo(dtype).max:
            raise ValueError(f"token id {int(ids.max())} does not fit the shard dtype {np.dtype(dtype).name}")
        ids = ids.astype(dtype, copy=False)
        lens = np.array([len(p.ids) for p in self.pieces], dtype=np.int32)
        if all(p.mask is None for p in self.pieces):
            return ids, lens, None
        mask = np.concatenate(
            [p.mask if p.mask is not None else np.ones(len(p.ids), np.uint8) for p in self.pieces]
        ).astype(np.uint8, copy=False)
        return ids, lens, mask


@dataclass
class PackStats:
    docs: int = 0
    docs_cut: int = 0
    sequences: int = 0
    tokens: int = 0
    seq_len: int = 0
    method: str = ""
    _cut_ids: set[str] = field(default_factory=set, repr=False)

    @property
    def utilization(self) -> float:
        return self.tokens / (self.sequences * self.seq_len) if self.sequences else 0.0

    @property
    def cut_fraction(self) -> float:
        return self.docs_cut / self.docs if self.docs else 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "method": self.method, "seq_len": self.seq_len, "docs": self.docs, "docs_cut": self.docs_cut,
            "cut_fraction": round(self.cut_fraction, 6), "sequences": self.sequences, "tokens": self.tokens,
            "utilization": round(self.utilization, 6),
        }


Doc = tuple[str, np.ndarray, "np.ndarray | None"]


class Packer:
    """What both packers share: ``add`` one document (empty ones are skipped), ``flush`` at the end."""

    stats: PackStats

    def add(
        self, doc_id: str, ids: np.ndarray, mask: np.ndarray | None = None, ord: int = -1
    ) -> Iterator[PackedSequence]:
        if len(ids) == 0:
            return iter(())
        self.stats.docs += 1
        return self._add(doc_id, ids, mask, ord)

    def _add(self, doc_id: str, ids: np.ndarray, mask: np.ndarray | None, ord: int) -> Iterator[PackedSequence]:
        raise NotImplementedError

    def flush(self) -> Iterator[PackedSequence]:
        raise NotImplementedError


class BestFitPacker(Packer):
    def __init__(self, seq_len: int, max_open: int = 1024):
        self.seq_len = seq_len
        self.max_open = max_open
        self.stats = PackStats(seq_len=seq_len, method="best_fit")
        # open sequences, kept sorted by (free space, creation number) for bisect lookups
        self._free: list[tuple[int, int]] = []
        self._open: dict[int, PackedSequence] = {}
        self._counter = 0

    def _add(self, doc_id: str, ids: np.ndarray, mask: np.ndarray | None, ord: int) -> Iterator[PackedSequence]:
        n = len(ids)
        L = self.seq_len
        start = 0
        if n > L:
            self.stats.docs_cut += 1
            while n - start >= L:  # whole sequences straight out
                yield self._emit(PackedSequence([_piece(doc_id, ids, mask, start, start + L, ord)]))
                start += L
            if start == n:
                return
        yield from self._place(_piece(doc_id, ids, mask, start, n, ord))

    def _place(self, piece: Piece) -> Iterator[PackedSequence]:
        n = len(piece.ids)
        if n == self.seq_len:
            yield self._emit(PackedSequence([piece]))
            return
        i = bisect.bisect_left(self._free, (n, -1))
        if i < len(self._free):
            free, key = self._free.pop(i)
            seq = self._open[key]
            seq.pieces.append(piece)
            if free - n == 0:
                del self._open[key]
                yield self._emit(seq)
            else:
                bisect.insort(self._free, (free - n, key))
            return
        if len(self._open) >= self.max_open:
            free, key = self._free.pop(0)  # the fullest open sequence
            yield self._emit(self._open.pop(key))
        key = self._counter
        self._counter += 1
        self._open[key] = PackedSequence([piece])
        bisect.insort(self._free, (self.seq_len - n, key))

    def _emit(self, seq: PackedSequence) -> PackedSequence:
        self.stats.sequences += 1
        self.stats.tokens += seq.tokens
        return seq

    def flush(self) -> Iterator[PackedSequence]:
        for key in sorted(self._open):
            yield self._emit(self._open[key])
        self._open.clear()
        self._free.clear()


class ConcatPacker(Packer):
    """The baseline: concatenate and cut every ``seq_len`` tokens."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len
        self.stats = PackStats(seq_len=seq_len, method="concat")
        self._pieces: list[Piece] = []
        self._fill = 0

    def _add(self, doc_id: str, ids: np.ndarray, mask: np.ndarray | None, ord: int) -> Iterator[PackedSequence]:
        n = len(ids)
        start = 0
        cut = False
        while start < n:
            take = min(self.seq_len - self._fill, n - start)
            self._pieces.append(_piece(doc_id, ids, mask, start, start + take, ord))
            self._fill += take
            start += take
            if self._fill == self.seq_len:
                if start < n:
                    cut = True
                yield self._emit()
        self.stats.docs_cut += cut

    def _emit(self) -> PackedSequence:
        seq = PackedSequence(self._pieces)
        self._pieces, self._fill = [], 0
        self.stats.sequences += 1
        self.stats.tokens += seq.tokens
        return seq

    def flush(self) -> Iterator[PackedSequence]:
        if self._pieces:
            yield self._emit()


def _piece(doc_id: str, ids: np.ndarray, mask: np.ndarray | None, a: int, b: int, ord: int) -> Piece:
    return Piece(doc_id, ids[a:b], None if mask is None else mask[a:b], ord)


def make_packer(method: str, seq_len: int, max_open: int = 1024) -> Packer:
    if method == "best_fit":
        return BestFitPacker(seq_len, max_open)
    if method == "concat":
        return ConcatPacker(seq_len)
    raise ValueError(f"unknown packing method {method!r}")


def pack_all(docs: Iterable[Doc], method: str, seq_len: int, max_open: int = 1024) -> tuple[
    list[PackedSequence], PackStats
]:
    """Pack a whole iterable (tests, benchmarks); the runner streams with ``add``/``flush`` instead."""
    packer = make_packer(method, seq_len, max_open)
    out: list[PackedSequence] = []
    for doc_id, ids, mask in docs:
        out.extend(packer.add(doc_id, ids, mask))
    out.extend(packer.flush())
    return out, packer.stats
