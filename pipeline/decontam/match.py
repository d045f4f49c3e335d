"""Which benchmark items a document contains: the document side of the n-gram index.

**Overlap** of an item with a document = the fraction of the item's distinct grams found in the document
(a short item, of fewer than ``ngram`` words, is found whole or not at all: overlap 1 or 0; see
:mod:`pipeline.decontam.index`). Measuring it on the item, not the document, is
what makes a book that quotes one question contaminated while a page that shares one stock phrase
("which of the following statements is true") with a long item is not. An item is **exact** when its
whole normalized word sequence occurs contiguously in the document.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np

from pipeline.decontam.index import BenchmarkIndex
from pipeline.decontam.ngrams import Prefix, word_values, words


@dataclass(frozen=True)
class Match:
    benchmark: str
    item: str
    overlap: float
    exact: bool
    #: words of the item's text that matched: among equal overlaps the longer is the more specific match
    words: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"benchmark": self.benchmark, "item": self.item, "overlap": round(self.overlap, 4),
                "exact": self.exact}


#: log2 of the bit filter's size: 2**25 bits = 4 MB per worker, ~1.6 % false hits for 545k keys
FILTER_BITS = 25


class Matcher:
    """Matches documents against one :class:`BenchmarkIndex` (build once per worker: it holds a dict)."""

    def __init__(self, index: BenchmarkIndex, min_overlap: float):
        self.index = index
        self.min_overlap = min_overlap
        self.word_id = {w: i for i, w in enumerate(index.vocab) if w}
        self.values = word_values(np.arange(len(index.vocab)))
        # a 4 MB bit filter on the keys' top bits: a binary search in the sorted keys costs ~1 us per window
        # (cache misses); the filter lets through the keys and ~2 % of the other windows
        self.bits = np.zeros(1 << (FILTER_BITS - 3), dtype=np.uint8)
        slots = index.keys >> np.uint64(64 - FILTER_BITS)
        np.bitwise_or.at(self.bits, (slots >> np.uint64(3)).astype(np.int64),
                         np.left_shift(1, (slots & np.uint64(7)).astype(np.uint8)).astype(np.uint8))

    def match(self, text: str) -> list[Match]:
        """:meth:`match_batch` of one text."""
        return self.match_batch([text])[0]

    def match_batch(self, texts: list[str]) -> list[list[Match]]:
        """For each text, the items whose overlap with it reaches ``min_overlap``: highest overlap first,
        exact first among equals, then the longest item (a short question that is part of a longer one
        is found with it), then by benchmark and id (a stable order for reports and tests).

        The texts are hashed together, their words laid end to end with an unknown word between two
        texts (no window spans it), so the numpy work is per batch, not per document.
        """
        idx = self.index
        out: list[list[Match]] = [[] for _ in texts]
        if not len(idx.keys) or not texts:
            return out
        get = self.word_id.get
        per_doc = [list(map(get, words(t), repeat(-1))) for t in texts]
        lens = np.array([len(x) + 1 for x in per_doc], dtype=np.int64)  # + the separator
        ids = np.fromiter(chain.from_iterable(x + [-1] for x in per_doc), dtype=np.int64, count=int(lens.sum()))
        n = len(ids)
        unknown = np.concatenate(([0], np.cumsum(ids < 0)))
        prefix = Prefix(self.values[ids])
        doc_of = np.repeat(np.arange(len(texts)), lens)
        doc_start = np.cumsum(lens) - lens

        # the windows of n-gram and of head length, less those holding an unknown word (or a separator)
        keys_at, starts_at = [], []
        for size in sorted({idx.ngram, idx.min_words}):
            if size <= n:
                ok = np.flatnonzero(unknown[size:] == unknown[: n + 1 - size])
                keys_at.append(prefix.all_windows(size)[ok])
                starts_at.append(ok)
        keys, start = np.concatenate(keys_at), np.concatenate(starts_at)
        slots = keys >> np.uint64(64 - FILTER_BITS)
        maybe = np.flatnonzero((self.bits[slots >> np.uint64(3)] >> (slots & np.uint64(7)).astype(np.uint8)) & 1)
        keys, start = keys[maybe], start[maybe]
        pos = np.searchsorted(idx.keys, keys)
        hit = pos < len(idx.keys)
        hit[hit] = idx.keys[pos[hit]] == keys[hit]
        pos, start = pos[hit], start[hit]
        if not len(pos):
            return out
        doc = doc_of[start]
        n_texts = len(idx.text_item)
        found, overlap, exact = [], [], []

        # long texts: distinct n-grams found per (document, text), over the text's n-grams
        pair = np.unique(doc * len(idx.keys) + pos)
        d, text = self._owners(pair // len(idx.keys), pair % len(idx.keys))
        long = idx.text_words[text] >= idx.ngram
        code, hits = np.unique(d[long] * n_texts + text[long], return_counts=True)
        ratio = hits / idx.text_grams[code % n_texts]
        keep = ratio >= self.min_overlap
        found.append(code[keep])
        overlap.append(ratio[keep])
        exact.append(np.zeros(keep.sum(), dtype=bool))
        for j in np.flatnonzero(ratio[keep] >= 1.0):  # every n-gram found: in one piece?
            d_j, t_j = divmod(int(found[0][j]), n_texts)
            size, lo = int(idx.text_words[t_j]), int(doc_start[d_j])
            starts = np.arange(lo, lo + lens[d_j] - size)
            starts = starts[unknown[starts + size] == unknown[starts]]
            exact[0][j] = idx.text_full[t_j] in prefix.windows(starts, size)

        # short texts: the head was found; the whole text must follow it
        d, text, at = self._owners(doc, pos, start)
        short = idx.text_words[text] < idx.ngram
        d, text, at = d[short], text[short], at[short]
        end = at + idx.text_words[text]
        fits = end <= n
        fits[fits] = unknown[end[fits]] == unknown[at[fits]]
        d, text, at = d[fits], text[fits], at[fits]
        whole = prefix.windows(at, idx.text_words[text]) == idx.text_full[text]
        code = np.unique(d[whole] * n_texts + text[whole])
        found.append(code)
        overlap.append(np.ones(len(code)))
        exact.append(np.ones(len(code), dtype=bool))

        for c, o, e in zip(np.concatenate(found).tolist(), np.concatenate(overlap).tolist(),
                           np.concatenate(exact).tolist(), strict=True):
            d_c, t = divmod(c, n_texts)
            i = int(idx.text_item[t])
            out[d_c].append(Match(idx.benchmarks[idx.item_bench[i]], idx.item_ids[i], o, e, int(idx.text_words[t])))
        return [_best_first(in_doc) for in_doc in out]

    def _owners(self, doc: np.ndarray, pos: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each (doc, key position, extra...) repeated once per text owning the key: (doc, text, extra...)."""
        idx = self.index
        lo, k = idx.offsets[pos], idx.offsets[pos + 1] - idx.offsets[pos]
        at = np.repeat(lo, k) + np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k)
        return (np.repeat(doc, k), idx.owners[at].astype(np.int64), *(np.repeat(x, k) for x in extra))


def _best_first(matches: list[Match]) -> list[Match]:
    """Sorted best first; an item found through two of its texts (its question, its whole text) once."""
    matches.sort(key=lambda m: (-m.overlap, not m.exact, -m.words, m.benchmark, m.item))
    best: dict[tuple[str, str], Match] = {}
    for m in matches:
        best.setdefault((m.benchmark, m.item), m)
    return list(best.values())
