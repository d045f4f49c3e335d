"""Which benchmark items a document contains: the document side of the n-gram index.

A document matches an item when one of the item's texts (a field, or the whole item: see
:mod:`pipeline.decontam.index`) is found by one of three rules, reported as the match's ``rule``:

- ``overlap``: the fraction of the text's n-grams found in the document reaches ``min_overlap`` (PaLM's
  70 %). Measured on the item, not the document: a book that quotes one question is contaminated, a page
  sharing one stock phrase ("which of the following statements is true") with a long item is not.
- ``span``: the document holds one piece of the text, a run of its consecutive n-grams, of ``min_span``
  words (16), or of at least ``ngram`` words that is ``min_span_share`` (0.4) of the text: half of an
  item, its last lines. An n-gram found in ``common_items`` or more items is a stock phrase and never
  part of a span. Consecutive item n-grams found anywhere in the document count as one piece: two windows
  that share ``ngram - 1`` words are, in practice, next to each other.
- ``whole``: a text shorter than ``ngram`` words is found whole (overlap 1).

An item is **exact** when a whole text of it occurs contiguously in the document. ``span`` is the
longest piece found, in words; ``field`` names the text that matched.
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
    #: the fraction of the unit's windows found in the document (1 for a short unit found whole)
    overlap: float
    exact: bool
    #: words of the item's text that matched: among equal overlaps the longer is the more specific match
    words: int = 0
    #: the longest run of the unit's words found in one piece (its consecutive windows), in words
    span: int = 0
    #: the unit that matched: a field of the benchmark record, or ``item`` (its fields end to end)
    field: str = "text"
    #: why it matched: ``whole`` (a short unit found whole), ``overlap`` (>= min_overlap of its windows) or
    #: ``span`` (a piece of at least min_span words, or min_span_share of the unit)
    rule: str = "overlap"

    def as_dict(self) -> dict[str, object]:
        return {"benchmark": self.benchmark, "item": self.item, "overlap": round(self.overlap, 4),
                "exact": self.exact, "span": self.span, "field": self.field, "rule": self.rule}


def _rule(overlap: float, short: bool, min_overlap: float) -> str:
    if short:
        return "whole"
    return "overlap" if overlap >= min_overlap else "span"


#: a piece of an item this long (in words: 4 consecutive 13-grams, none a stock phrase) is a copy whatever
#: the item's length. On 21,660 clean documents of ../shared/corpora (prose, docs, man pages, code, books)
#: two share 13 or more words with a benchmark item (a Hamlet line an MMLU question quotes, 22 words), so
#: the bar is set by phrases, not by measured noise: a 15-word idiom inside a long item is no copy
DEFAULT_MIN_SPAN = 16
#: ... and so is a piece of at least ``ngram`` words that holds this share of the unit's words: half of a
#: 30-word item is 15 words (``bench/eval_decontam.py``: 0.993 recall on half items at 16 / 0.4)
DEFAULT_MIN_SPAN_SHARE = 0.4

#: log2 of the bit filter's size: 2**25 bits = 4 MB per worker, ~1.6 % false hits for 545k keys
FILTER_BITS = 25


@dataclass(frozen=True)
class _Batch:
    """A batch of texts hashed together: their word ids end to end, an unknown word (-1) after each."""

    #: positions in all, separators included
    n: int
    #: the unknown words (separators included) before each position: a window holds none when equal at both ends
    unknown: np.ndarray
    prefix: Prefix
    #: each text's positions, separator included, its first position, and each position's text
    lens: np.ndarray
    doc_start: np.ndarray
    doc_of: np.ndarray


#: matches found in a batch: (document * texts + text, overlap, exact, span in words), one array each
_Found = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class Matcher:
    """Matches documents against one :class:`BenchmarkIndex` (build once per worker: it holds a dict)."""

    def __init__(self, index: BenchmarkIndex, min_overlap: float, min_span: int = DEFAULT_MIN_SPAN,
                 min_span_share: float = DEFAULT_MIN_SPAN_SHARE):
        self.index = index
        self.min_overlap = min_overlap
        self.min_span = min_span
        self.min_span_share = min_span_share
        self.word_id = {w: i for i, w in enumerate(index.vocab) if w}
        self.values = word_values(np.arange(len(index.vocab)))
        # a 4 MB bit filter on the keys' top bits: a binary search in the sorted keys misses the cache at every
        # step, for every window; the filter lets through the keys and ~2 % of the other windows
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
        batch = self._batch(texts)
        pos, start = self._found_windows(batch)
        if not len(pos):
            return out
        doc = batch.doc_of[start]
        found = [self._long_texts(batch, doc, pos), self._short_texts(batch, doc, pos, start)]
        code, overlap, exact, span = (np.concatenate([f[k] for f in found]).tolist() for k in range(4))
        n_texts = len(idx.text_item)
        for c, o, e, w in zip(code, overlap, exact, span, strict=True):
            d_c, t = divmod(c, n_texts)
            i = int(idx.text_item[t])
            out[d_c].append(Match(idx.benchmarks[idx.item_bench[i]], idx.item_ids[i], o, e,
                                  int(idx.text_words[t]), w, idx.fields[idx.text_field[t]],
                                  _rule(o, int(idx.text_words[t]) < idx.ngram, self.min_overlap)))
        return [_best_first(in_doc) for in_doc in out]

    def _batch(self, texts: list[str]) -> _Batch:
        get = self.word_id.get
        per_doc = [list(map(get, words(t), repeat(-1))) for t in texts]
        lens = np.array([len(x) + 1 for x in per_doc], dtype=np.int64)  # + the separator
        ids = np.fromiter(chain.from_iterable(x + [-1] for x in per_doc), dtype=np.int64, count=int(lens.sum()))
        return _Batch(n=len(ids), unknown=np.concatenate(([0], np.cumsum(ids < 0))), prefix=Prefix(self.values[ids]),
                      lens=lens, doc_of=np.repeat(np.arange(len(texts)), lens), doc_start=np.cumsum(lens) - lens)

    def _found_windows(self, batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
        """The windows of n-gram and of head length, less those holding an unknown word (or a separator), whose
        key is in the index: (the key's number in the index, the window's start in the batch)."""
        idx, n, unknown = self.index, batch.n, batch.unknown
        keys_at, starts_at = [], []
        for size in sorted({idx.ngram, idx.min_words}):
            if size <= n:
                ok = np.flatnonzero(unknown[size:] == unknown[: n + 1 - size])
                keys_at.append(batch.prefix.all_windows(size)[ok])
                starts_at.append(ok)
        keys, start = np.concatenate(keys_at), np.concatenate(starts_at)
        slots = keys >> np.uint64(64 - FILTER_BITS)
        maybe = np.flatnonzero((self.bits[slots >> np.uint64(3)] >> (slots & np.uint64(7)).astype(np.uint8)) & 1)
        keys, start = keys[maybe], start[maybe]
        pos = np.searchsorted(idx.keys, keys)
        hit = pos < len(idx.keys)
        hit[hit] = idx.keys[pos[hit]] == keys[hit]
        return pos[hit], start[hit]

    def _long_texts(self, batch: _Batch, doc: np.ndarray, pos: np.ndarray) -> _Found:
        """Long texts: the text's windows found (overlap), and its longest run of consecutive windows found
        with no stock phrase among them (a span of the item, in words)."""
        idx = self.index
        n_texts = len(idx.text_item)
        pair = np.unique(doc * len(idx.keys) + pos)
        key = pair % len(idx.keys)
        d, text, gram, key_common = self._owners(pair // len(idx.keys), key, idx.common[key], with_pos=True)
        long = idx.text_words[text] >= idx.ngram
        stride = int(idx.text_grams.max()) + 2 if n_texts else 2  # a gap between two texts' positions
        # (document, text, window position), each once, in order
        at, first = np.unique((d[long] * n_texts + text[long]) * stride + gram[long], return_index=True)
        key_common = key_common[long][first]
        code, hits = np.unique(at // stride, return_counts=True)
        ratio = hits / idx.text_grams[code % n_texts]
        longest = np.zeros(len(code), dtype=np.int64)
        rare = at[~key_common]
        if len(rare):
            brk = np.flatnonzero(np.diff(rare) != 1) + 1
            run_start = np.concatenate(([0], brk))
            run_len = np.diff(np.append(run_start, len(rare)))
            owner = np.searchsorted(code, rare[run_start] // stride)
            np.maximum.at(longest, owner, run_len)
        span_words = np.where(longest > 0, longest + idx.ngram - 1, 0)
        keep = (ratio >= self.min_overlap) | (span_words >= self.min_span) | (
            (span_words >= idx.ngram) & (span_words >= self.min_span_share * idx.text_words[code % n_texts]))
        found, overlap, exact = code[keep], ratio[keep], np.zeros(keep.sum(), dtype=bool)
        for j in np.flatnonzero(overlap >= 1.0):  # every n-gram found: in one piece?
            d_j, t_j = divmod(int(found[j]), n_texts)
            size, lo = int(idx.text_words[t_j]), int(batch.doc_start[d_j])
            starts = np.arange(lo, lo + batch.lens[d_j] - size)
            starts = starts[batch.unknown[starts + size] == batch.unknown[starts]]
            exact[j] = idx.text_full[t_j] in batch.prefix.windows(starts, size)
        return found, overlap, exact, span_words[keep]

    def _short_texts(self, batch: _Batch, doc: np.ndarray, pos: np.ndarray, start: np.ndarray) -> _Found:
        """Short texts: the head was found; the whole text must follow it."""
        idx = self.index
        n_texts = len(idx.text_item)
        d, text, at = self._owners(doc, pos, start)
        short = idx.text_words[text] < idx.ngram
        d, text, at = d[short], text[short], at[short]
        end = at + idx.text_words[text]
        fits = end <= batch.n
        fits[fits] = batch.unknown[end[fits]] == batch.unknown[at[fits]]
        d, text, at = d[fits], text[fits], at[fits]
        whole = batch.prefix.windows(at, idx.text_words[text]) == idx.text_full[text]
        code = np.unique(d[whole] * n_texts + text[whole])
        return code, np.ones(len(code)), np.ones(len(code), dtype=bool), idx.text_words[code % n_texts].astype(np.int64)

    def _owners(self, doc: np.ndarray, pos: np.ndarray, *extra: np.ndarray, with_pos: bool = False
                ) -> tuple[np.ndarray, ...]:
        """Each (doc, key number, extra...) repeated once per place the key sits: (doc, text, [window's
        position in the text,] extra...)."""
        idx = self.index
        lo, k = idx.offsets[pos], idx.offsets[pos + 1] - idx.offsets[pos]
        at = np.repeat(lo, k) + np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k)
        where = (idx.owner_pos[at].astype(np.int64),) if with_pos else ()
        return (np.repeat(doc, k), idx.owners[at].astype(np.int64), *where, *(np.repeat(x, k) for x in extra))


def _best_first(matches: list[Match]) -> list[Match]:
    """Sorted best first; an item found through two of its texts (its question, its whole text) once."""
    matches.sort(key=lambda m: (-m.overlap, not m.exact, -m.words, m.benchmark, m.item))
    best: dict[tuple[str, str], Match] = {}
    for m in matches:
        best.setdefault((m.benchmark, m.item), m)
    return list(best.values())
