"""Gopher's quality and repetition rules (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", appendix A.1.1 and table A1), with datatrove's reading of them.

Words are spaCy's tokens of the document's language (:mod:`pipeline.filters.text`), punctuation tokens
included, as in datatrove's ``GopherQualityFilter`` / ``GopherRepetitionFilter``; rules run in datatrove's order,
so the reason is the same one datatrove gives. Where datatrove reads the paper in a particular way, tokenmill
does the same, and says so on the parameter.

Repetition is the expensive rule set (datatrove joins every n-gram into a string, n = 2..10). Here each word
becomes a 64-bit hash, an n-gram a polynomial hash of its words', computed for all positions of a whole batch at
once with numpy; counting is a sort of only the positions where an n-gram can repeat (:class:`BatchNGrams`). The
greedy scan of the "duplicate n-gram" rule visits only positions whose n-gram repeats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, filterfalse
from typing import Annotated

import numpy as np
from pydantic import Field, WithJsonSchema

from kernels import word_classes
from pipeline.documents import Doc, Drop
from pipeline.fast.word_chain import NO_SPACE_LANGS
from pipeline.filters.text import RuleCheck, doc_lang, find_duplicates, splitter, stop_words, symbol_chars
from pipeline.stages.base import FilterParams, FilterStage, StageContext, Verdict

_BULLETS = ("•", "-")
_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")
_ELLIPSES = ("...", "…")


class GopherQualityParams(FilterParams):
    """Defaults: Rae et al. 2021, appendix A.1.1 ("Quality filters"), quoted per rule."""

    #: "any doc that does not contain between 50 and 100,000 words"; words = tokens with a character that is
    #: not punctuation (datatrove's count, so "--" or "." is not a word)
    min_words: int | None = Field(50, ge=0)
    max_words: int | None = Field(100_000, ge=1)
    #: "mean word length is outside the range of 3 to 10 characters" (over the same words)
    min_avg_word_length: float | None = Field(3, ge=0)
    max_avg_word_length: float | None = Field(10, ge=0)
    #: "symbol-to-word ratio greater than 0.1 for either the hash symbol or the ellipsis": ``#`` and ``...``/``…``
    #: occurrences in the text per token (all tokens, as datatrove)
    max_symbol_word_ratio: float | None = Field(0.1, ge=0)
    #: "more than 90% of lines starting with a bullet point" (``•`` or ``-`` after indentation, as datatrove)
    max_bullet_lines_ratio: float | None = Field(0.9, ge=0, le=1)
    #: "or more than 30% ending with an ellipsis"
    max_ellipsis_lines_ratio: float | None = Field(0.3, ge=0, le=1)
    #: "80% of words in a document contain at least one alphabetic character" (of all tokens, as datatrove)
    min_alpha_words_ratio: float | None = Field(0.8, ge=0, le=1)
    #: "at least two of the following English words: the, be, to, of, and, that, have, with"; other languages:
    #: :data:`pipeline.filters.text.STOP_WORDS`, a language without a list skips the rule
    min_stop_words: int | None = Field(2, ge=0)
    #: stop words per language (``{de: [der, die, ...]}``), replacing the built-in list of that language
    stop_words: dict[str, list[str]] | None = None
    #: the language of a document without ``meta["lang"]``
    language: str = "en"
    #: languages whose words are single characters (written without spaces): the word-length rule, made for
    #: English words, is skipped for them (its score is still recorded)
    skip_word_length: list[str] = Field(default_factory=lambda: sorted(NO_SPACE_LANGS))


class GopherQuality(FilterStage):
    """Drop documents that fail one of Gopher's quality rules; reasons ``gopher_quality:<rule>``."""

    name = "gopher_quality"
    Params = GopherQualityParams
    params: GopherQualityParams

    def __init__(self, params: GopherQualityParams, ctx: StageContext):
        super().__init__(params, ctx)
        #: token -> its length << 2 | 1 when it is a word (not only symbols) | 2 when it has a letter (the Python
        #: path, where the C kernel is not built)
        self._codes: dict[str, int] = {}
        self._symbol_bits: bytes | None = None

    def setup(self) -> None:
        symbol_chars()
        splitter(self.params.language)

    def filter(self, doc: Doc) -> Verdict:
        p = self.params
        text = doc["text"]
        lang = doc_lang(doc, p.language)
        words = splitter(lang).words(text)
        r = RuleCheck(self.name, p.mode == "annotate")
        n_tokens = len(words)
        n_words, len_words, n_alpha = self._word_sums(words)
        s = r.scores
        s["words"] = n_words
        if r.check(p.min_words is not None and n_words < p.min_words, "min_words"):
            return r.verdict()
        if r.check(p.max_words is not None and n_words > p.max_words, "max_words"):
            return r.verdict()
        if n_words:
            avg = s["avg_word_length"] = len_words / n_words
            judged = lang not in p.skip_word_length
            if r.check(judged and p.min_avg_word_length is not None and avg < p.min_avg_word_length,
                       "min_avg_word_length"):
                return r.verdict()
            if r.check(judged and p.max_avg_word_length is not None and avg > p.max_avg_word_length,
                       "max_avg_word_length"):
                return r.verdict()
        per = n_tokens or 1  # ratios per token, divided as datatrove divides (the same float at a threshold)
        hashes = s["hash_word_ratio"] = text.count("#") / per
        ellipses = s["ellipsis_word_ratio"] = (text.count("...") + text.count("…")) / per
        limit = p.max_symbol_word_ratio
        if r.check(limit is not None and (hashes > limit or ellipses > limit), "symbol_word_ratio"):
            return r.verdict()
        lines = text.splitlines() or [""]
        bullets = s["bullet_lines_ratio"] = sum(1 for x in lines if x.lstrip().startswith(_BULLETS)) / len(lines)
        if r.check(p.max_bullet_lines_ratio is not None and bullets > p.max_bullet_lines_ratio, "bullet_lines_ratio"):
            return r.verdict()
        ends = s["ellipsis_lines_ratio"] = sum(1 for x in lines if x.rstrip().endswith(_ELLIPSES)) / len(lines)
        if r.check(p.max_ellipsis_lines_ratio is not None and ends > p.max_ellipsis_lines_ratio,
                   "ellipsis_lines_ratio"):
            return r.verdict()
        alpha = s["alpha_words_ratio"] = n_alpha / per
        if r.check(p.min_alpha_words_ratio is not None and alpha < p.min_alpha_words_ratio, "alpha_words_ratio"):
            return r.verdict()
        stops = stop_words(lang, p.stop_words)
        if stops is not None:
            found = s["stop_words"] = len(stops.intersection(words))
            if r.check(p.min_stop_words is not None and found < p.min_stop_words, "stop_words"):
                return r.verdict()
        return r.verdict()

    def _word_sums(self, words: list[str]) -> tuple[int, int, int]:
        """(words, their characters, tokens with a letter) among ``words``: in C (:mod:`kernels.word_classes`)
        where it is built; else one code per distinct token, kept across documents (a corpus repeats its tokens),
        summed with numpy rather than a Python loop per token."""
        if word_classes.native():
            if self._symbol_bits is None:
                self._symbol_bits = word_classes.symbol_bitmap(symbol_chars())
            return word_classes.word_sums(words, self._symbol_bits)
        codes = self._codes
        if len(codes) > 1_000_000:
            codes.clear()
        new = set(filterfalse(codes.__contains__, words))  # most documents bring a new token: look first
        if new:
            symbols = symbol_chars()
            for w in new:
                codes[w] = len(w) << 2 | (0 if symbols.issuperset(w) else 1) | (2 if any(c.isalpha() for c in w) else 0)
        arr = np.fromiter(map(codes.__getitem__, words), dtype=np.int64, count=len(words))
        word = (arr & 1).astype(bool)
        return int(np.count_nonzero(word)), int((arr[word] >> 2).sum()), int(np.count_nonzero(arr & 2))


def _ngram_table() -> dict[int, float]:
    # Rae et al. 2021, table A1: "top 2-gram character fraction 0.20, top 3-gram 0.18, top 4-gram 0.16"
    return {2: 0.20, 3: 0.18, 4: 0.16}


def _dup_ngram_table() -> dict[int, float]:
    # Rae et al. 2021, table A1: "duplicate 5-gram character fraction 0.15" ... "duplicate 10-gram ... 0.10"
    return {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


#: n -> a limit, n an n-gram's size: in JSON a key of digits (pydantic reads it as an int), so the schema says
NGramLimits = Annotated[dict[int, float], WithJsonSchema({
    "type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": {"type": "number"}})]


class GopherRepetitionParams(FilterParams):
    """Defaults: Rae et al. 2021, table A1 ("Thresholds for repetitious text"). Every fraction is of the
    document's characters; rules run in datatrove's order (paragraphs, lines, top n-grams, duplicate n-grams)."""

    #: "duplicate paragraph fraction 0.30"; paragraphs are separated by two or more line breaks
    max_dup_para_ratio: float | None = Field(0.30, ge=0, le=1)
    #: "duplicate paragraph character fraction 0.20"
    max_dup_para_char_ratio: float | None = Field(0.20, ge=0, le=1)
    #: "duplicate line fraction 0.30"
    max_dup_line_ratio: float | None = Field(0.30, ge=0, le=1)
    #: "duplicate line character fraction 0.20"
    max_dup_line_char_ratio: float | None = Field(0.20, ge=0, le=1)
    #: n -> limit on the characters covered by the most frequent n-gram (its length with spaces x its count)
    top_ngram_char_ratio: NGramLimits = Field(default_factory=_ngram_table)
    #: n -> limit on the characters of n-grams that repeat an earlier one (a greedy scan that skips a repeated
    #: n-gram whole, as datatrove's ``find_all_duplicate``; lengths without spaces, as there)
    dup_ngram_char_ratio: NGramLimits = Field(default_factory=_dup_ngram_table)
    #: the language of a document without ``meta["lang"]``
    language: str = "en"


class GopherRepetition(FilterStage):
    """Drop repetitive documents (Gopher); reasons ``gopher_repetition:<rule>``.

    A batch's n-gram rules are computed for all its documents at once (:class:`BatchNGrams`): per document, numpy's
    call overhead, not the work, was most of the filter's cost (documents of a few hundred words)."""

    name = "gopher_repetition"
    Params = GopherRepetitionParams
    params: GopherRepetitionParams

    def setup(self) -> None:
        splitter(self.params.language)

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        checks = [self._text_rules(doc) for doc in docs]
        pending = [k for k, (_, done) in enumerate(checks) if not done]
        words = self._words([docs[k] for k in pending])
        for run in _runs([len(w) for w in words], BATCH_WORDS):  # memory: bounded per run
            batch = BatchNGrams([words[j] for j in run])
            for i, j in enumerate(run):
                k = pending[j]
                self._ngram_rules(checks[k][0], batch.doc(i), len(docs[k]["text"]))
        for doc, (r, _) in zip(docs, checks, strict=True):
            yield self.judge(doc, r.verdict())

    def _words(self, docs: list[Doc]) -> list[list[str]]:
        """Each document's words, split a language at a time (:meth:`WordSplitter.words_many`)."""
        by_lang: dict[str, list[int]] = {}
        for i, doc in enumerate(docs):
            by_lang.setdefault(doc_lang(doc, self.params.language), []).append(i)
        out: list[list[str]] = [[] for _ in docs]
        for lang, at in by_lang.items():
            for i, words in zip(at, splitter(lang).words_many([docs[i]["text"] for i in at]), strict=True):
                out[i] = words
        return out

    def filter(self, doc: Doc) -> Verdict:
        r, done = self._text_rules(doc)
        if not done:
            words = splitter(doc_lang(doc, self.params.language)).words(doc["text"])
            self._ngram_rules(r, NGrams(words), len(doc["text"]))
        return r.verdict()

    def _text_rules(self, doc: Doc) -> tuple[RuleCheck, bool]:
        """The paragraph and line rules; True when the verdict is decided without n-grams."""
        p = self.params
        text = doc["text"]
        r = RuleCheck(self.name, p.mode == "annotate")
        if not text:
            r.check(True, "empty")
            return r, True
        s = r.scores
        size = len(text)
        paragraphs = _PARAGRAPHS.split(text.strip())
        dup, chars = find_duplicates(paragraphs)
        s["dup_para_ratio"] = dup / len(paragraphs)
        if r.check(_over(s["dup_para_ratio"], p.max_dup_para_ratio), "dup_para_ratio"):
            return r, True
        s["dup_para_char_ratio"] = chars / size
        if r.check(_over(s["dup_para_char_ratio"], p.max_dup_para_char_ratio), "dup_para_char_ratio"):
            return r, True
        lines = _LINES.split(text)
        dup, chars = find_duplicates(lines)
        s["dup_line_ratio"] = dup / len(lines)
        if r.check(_over(s["dup_line_ratio"], p.max_dup_line_ratio), "dup_line_ratio"):
            return r, True
        s["dup_line_char_ratio"] = chars / size
        if r.check(_over(s["dup_line_char_ratio"], p.max_dup_line_char_ratio), "dup_line_char_ratio"):
            return r, True
        return r, False

    def _ngram_rules(self, r: RuleCheck, grams: NGrams, size: int) -> None:
        p, s = self.params, r.scores
        for n, limit in sorted(p.top_ngram_char_ratio.items()):
            if grams.count < n:
                continue  # datatrove skips a rule with no n-gram
            ratio = s[f"top_{n}gram_char_ratio"] = grams.top_chars(n) / size
            if r.check(ratio > limit, f"top_{n}gram_char_ratio"):
                return
        for n, limit in sorted(p.dup_ngram_char_ratio.items()):
            ratio = s[f"dup_{n}gram_char_ratio"] = grams.dup_chars(n) / size
            if r.check(ratio > limit, f"dup_{n}gram_char_ratio"):
                return


def _over(value: float, limit: float | None) -> bool:
    return limit is not None and value > limit


#: words of the documents whose n-grams are counted together (:class:`BatchNGrams` keeps four arrays per word and
#: a hash and a flag per word and n: ~130 bytes a word for n up to 10, so ~65 MB); a longer document is counted alone
BATCH_WORDS = 500_000


def _runs(sizes: list[int], limit: int) -> Iterator[list[int]]:
    """Consecutive indexes of ``sizes`` in runs of at most ``limit`` in total (a larger item alone)."""
    run: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if run and total + n > limit:
            yield run
            run, total = [], 0
        run.append(i)
        total += n
    if run:
        yield run


_MULT = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class _Level:
    """The n-grams of one n across a batch, at every global start position ``i`` (``i + n`` may cross into the
    next document: such positions are never candidates)."""

    hashes: np.ndarray  # uint64 hash of the n-gram starting at i
    rep: np.ndarray  # bool, one longer: the n-gram at i occurs twice or more in its document
    #: the repeated n-grams: first position, count, document (for the top n-gram, computed when first asked)
    groups: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    _top: tuple[np.ndarray, np.ndarray] | None = None
    _rep_pos: np.ndarray | None = None
    _rep_bounds: np.ndarray | None = None

    def top(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per document, the count of its most frequent n-gram and where it first occurs (global position); no
        repeat: the first n-gram, once (``Counter.most_common``)."""
        if self._top is None:
            count = np.ones(len(starts) - 1, dtype=np.int64)
            pos = starts[:-1].copy()
            if self.groups is not None:
                g_first, g_count, g_doc = self.groups
                best = np.lexsort((g_first, -g_count, g_doc))  # per document: most frequent, then first to occur
                g_doc = g_doc[best]
                lead = np.concatenate(([True], g_doc[1:] != g_doc[:-1]))
                count[g_doc[lead]] = g_count[best][lead]
                pos[g_doc[lead]] = g_first[best][lead]
            self._top = count, pos
        return self._top

    def repeated_in(self, starts: np.ndarray, d: int) -> np.ndarray:
        """Global positions of document ``d`` whose n-gram repeats, in order."""
        if self._rep_pos is None:
            self._rep_pos = np.flatnonzero(self.rep[:-1])
            self._rep_bounds = np.searchsorted(self._rep_pos, starts)
        assert self._rep_bounds is not None
        return self._rep_pos[self._rep_bounds[d] : self._rep_bounds[d + 1]]


class BatchNGrams:
    """Word n-gram statistics of a batch of documents, from 64-bit hashes of the n-grams (numpy, no n-gram strings).

    The documents' words lie end to end in one array; each n is one pass over it (a multiply-add of the (n-1)-gram
    hashes and the next word's), and counting is one sort of the positions where an n-gram can repeat: the n-gram
    at ``i`` occurs twice only if the (n-1)-grams at ``i`` and ``i + 1`` both do, usually a small share of the text
    (common phrases). Counts are per document: the sort key is the n-gram's hash plus a 64-bit salt of its document,
    and equal keys count together only within one document. Counts among the candidates are exact for every
    repeated n-gram (all its occurrences are candidates). Levels are computed on first use, for the whole batch.

    Two different n-grams get the same key with probability ~2^-64 per pair: a batch of a million words has ~5e-8
    chance of one false match. Words hash with Python's string hash (cached on the string objects the word splitter
    returns; salted per process, so only that chance, never a decision, varies).
    """

    def __init__(self, docs: Sequence[list[str]]):
        self.counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        self.starts = np.concatenate(([0], np.cumsum(self.counts))).astype(np.int64)  # doc d: starts[d]..starts[d+1]
        total = int(self.starts[-1])
        words = list(chain.from_iterable(docs))
        self._h1 = _mix64(np.fromiter(map(hash, words), dtype=np.int64, count=total).view(np.uint64))
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=total)
        self._ends = np.concatenate(([0], np.cumsum(lengths)))  # characters of words[:i] = _ends[i]
        self._doc = np.repeat(np.arange(len(docs), dtype=np.int64), self.counts)
        #: per position: words from it to its document's end (an n-gram starts only where n fit)
        self._left = np.repeat(self.starts[1:], self.counts) - np.arange(total, dtype=np.int64)
        with np.errstate(over="ignore"):
            self._salt = _mix64(np.arange(len(docs), dtype=np.uint64) + np.uint64(0x2545F4914F6CDD1D))
        self._levels: list[_Level] = []

    def doc(self, d: int) -> NGrams:
        return NGrams(batch=self, index=d)

    def level(self, n: int) -> _Level:
        while len(self._levels) < n:
            self._levels.append(self._next())
        return self._levels[n - 1]

    def _next(self) -> _Level:
        m = len(self._levels) + 1
        total = len(self._h1)
        size = max(0, total - m + 1)
        if m == 1:
            hashes, prev = self._h1, np.ones(total + 1, dtype=bool)
        else:
            with np.errstate(over="ignore"):
                hashes = self._levels[-1].hashes[:size] * _MULT + self._h1[m - 1 :]
            prev = self._levels[-1].rep
        cand = np.flatnonzero((self._left[:size] >= m) & prev[:size] & prev[1 : size + 1])
        rep = np.zeros(size + 1, dtype=bool)  # one more: the shifted view of the next n stays in range
        groups = None
        if cand.size > 1:
            cdoc = self._doc[cand]
            with np.errstate(over="ignore"):
                keys = hashes[cand] + self._salt[cdoc]
            order = np.argsort(keys)
            okeys, odoc = keys[order], cdoc[order]
            same = (okeys[1:] == okeys[:-1]) & (odoc[1:] == odoc[:-1])
            if same.any():
                first = np.flatnonzero(np.concatenate(([True], ~same)))
                counts = np.diff(np.append(first, okeys.size))
                multi = counts > 1
                ocand = cand[order]
                rep[ocand[np.repeat(multi, counts)]] = True
                groups = (np.minimum.reduceat(ocand, first)[multi], counts[multi], odoc[first][multi])
        return _Level(hashes, rep, groups)


class NGrams:
    """One document's n-gram statistics: a view of its :class:`BatchNGrams` (a batch of its own when made from
    a word list)."""

    def __init__(self, words: list[str] | None = None, *, batch: BatchNGrams | None = None, index: int = 0):
        if batch is None:
            batch, index = BatchNGrams([words or []]), 0
        self._batch, self._d = batch, index
        self.count = int(batch.counts[index])

    def top_chars(self, n: int) -> int:
        """Characters covered by the most frequent n-gram: its length (words joined by spaces) times its count;
        among equally frequent ones the first to occur (``Counter.most_common``)."""
        counts, positions = self._batch.level(n).top(self._batch.starts)
        i, top = int(positions[self._d]), int(counts[self._d])
        ends = self._batch._ends
        return (int(ends[i + n] - ends[i]) + n - 1) * top

    def dup_chars(self, n: int) -> int:
        """Characters of n-grams equal to an earlier, visited one; after such a match the scan jumps past it."""
        if self.count < n:
            return 0
        level = self._batch.level(n)
        repeated = level.repeated_in(self._batch.starts, self._d)
        if repeated.size == 0:
            return 0
        ends = self._batch._ends
        chars = (ends[repeated + n] - ends[repeated]).tolist()
        total, nxt, seen = 0, 0, set()
        for pos, value, c in zip(repeated.tolist(), level.hashes[repeated].tolist(), chars, strict=True):
            if pos < nxt:
                continue  # inside a duplicate just counted
            if value in seen:
                total += c
                nxt = pos + n
            else:
                seen.add(value)
                nxt = pos + 1
        return total


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: word ids to well-spread 64-bit values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

