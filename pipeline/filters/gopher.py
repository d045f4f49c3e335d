"""Gopher's quality and repetition rules (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", appendix A.1.1 and table A1), with datatrove's reading of them.

Words are spaCy's tokens of the document's language (:mod:`pipeline.filters.text`), punctuation tokens
included, as in datatrove's ``GopherQualityFilter`` / ``GopherRepetitionFilter``; rules run in datatrove's order,
so the reason is the same one datatrove gives. Where datatrove reads the paper in a particular way, tokenmill
does the same, and says so on the parameter.

Repetition is the expensive rule set (datatrove joins every n-gram into a string, n = 2..10). Here each word
becomes a 64-bit hash, an n-gram a polynomial hash of its words', computed for all positions at once with numpy;
counting is a sort of only the positions where an n-gram can repeat (:class:`NGrams`). The greedy scan of the
"duplicate n-gram" rule visits only positions whose n-gram repeats.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
from pydantic import Field

from pipeline.documents import Doc
from pipeline.filters.text import (
    NO_SPACE_LANGS,
    RuleCheck,
    doc_lang,
    find_duplicates,
    splitter,
    stop_words,
    symbol_chars,
)
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

    def __init__(self, params: GopherQualityParams, ctx: StageContext):
        super().__init__(params, ctx)
        self._word_kind: dict[str, int] = {}  # token -> bit 1: not only symbols, bit 2: has a letter

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
        counts = Counter(words)
        n_words = len_words = n_alpha = 0
        kinds, symbols = self._word_kind, symbol_chars()
        if len(kinds) > 1_000_000:
            kinds.clear()
        for w, n in counts.items():
            k = kinds.get(w)
            if k is None:
                k = kinds[w] = (0 if symbols.issuperset(w) else 1) | (2 if any(c.isalpha() for c in w) else 0)
            if k & 1:
                n_words += n
                len_words += n * len(w)
            if k & 2:
                n_alpha += n
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
            found = s["stop_words"] = len(stops.intersection(counts))
            if r.check(p.min_stop_words is not None and found < p.min_stop_words, "stop_words"):
                return r.verdict()
        return r.verdict()


def _ngram_table() -> dict[int, float]:
    # Rae et al. 2021, table A1: "top 2-gram character fraction 0.20, top 3-gram 0.18, top 4-gram 0.16"
    return {2: 0.20, 3: 0.18, 4: 0.16}


def _dup_ngram_table() -> dict[int, float]:
    # Rae et al. 2021, table A1: "duplicate 5-gram character fraction 0.15" ... "duplicate 10-gram ... 0.10"
    return {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


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
    top_ngram_char_ratio: dict[int, float] = Field(default_factory=_ngram_table)
    #: n -> limit on the characters of n-grams that repeat an earlier one (a greedy scan that skips a repeated
    #: n-gram whole, as datatrove's ``find_all_duplicate``; lengths without spaces, as there)
    dup_ngram_char_ratio: dict[int, float] = Field(default_factory=_dup_ngram_table)
    #: the language of a document without ``meta["lang"]``
    language: str = "en"


class GopherRepetition(FilterStage):
    """Drop repetitive documents (Gopher); reasons ``gopher_repetition:<rule>``."""

    name = "gopher_repetition"
    Params = GopherRepetitionParams

    def setup(self) -> None:
        splitter(self.params.language)

    def filter(self, doc: Doc) -> Verdict:
        p = self.params
        text = doc["text"]
        r = RuleCheck(self.name, p.mode == "annotate")
        if not text:
            r.check(True, "empty")
            return r.verdict()
        s = r.scores
        size = len(text)
        paragraphs = _PARAGRAPHS.split(text.strip())
        dup, chars = find_duplicates(paragraphs)
        s["dup_para_ratio"] = dup / len(paragraphs)
        if r.check(_over(s["dup_para_ratio"], p.max_dup_para_ratio), "dup_para_ratio"):
            return r.verdict()
        s["dup_para_char_ratio"] = chars / size
        if r.check(_over(s["dup_para_char_ratio"], p.max_dup_para_char_ratio), "dup_para_char_ratio"):
            return r.verdict()
        lines = _LINES.split(text)
        dup, chars = find_duplicates(lines)
        s["dup_line_ratio"] = dup / len(lines)
        if r.check(_over(s["dup_line_ratio"], p.max_dup_line_ratio), "dup_line_ratio"):
            return r.verdict()
        s["dup_line_char_ratio"] = chars / size
        if r.check(_over(s["dup_line_char_ratio"], p.max_dup_line_char_ratio), "dup_line_char_ratio"):
            return r.verdict()
        grams = NGrams(splitter(doc_lang(doc, p.language)).words(text))
        for n, limit in sorted(p.top_ngram_char_ratio.items()):
            if grams.count < n:
                continue  # datatrove skips a rule with no n-gram
            ratio = s[f"top_{n}gram_char_ratio"] = grams.top_chars(n) / size
            if r.check(ratio > limit, f"top_{n}gram_char_ratio"):
                return r.verdict()
        for n, limit in sorted(p.dup_ngram_char_ratio.items()):
            ratio = s[f"dup_{n}gram_char_ratio"] = grams.dup_chars(n) / size
            if r.check(ratio > limit, f"dup_{n}gram_char_ratio"):
                return r.verdict()
        return r.verdict()


def _over(value: float, limit: float | None) -> bool:
    return limit is not None and value > limit


class NGrams:
    """Word n-gram statistics of one document, from 64-bit hashes of the n-grams (numpy, no n-gram strings).

    Only n-grams that can repeat are looked at: the n-gram at ``i`` occurs twice only if the (n-1)-grams at
    ``i`` and ``i + 1`` both do, so the positions examined for n are those two masks' intersection, usually a
    small share of the document (common phrases), and the sort that finds repeats sorts only them. Counts
    among these positions are exact for every repeated n-gram (all its occurrences are candidates).

    Two different n-grams get the same hash with probability ~2^-64 per pair: a document of a million words
    has ~5e-8 chance of one false match. Words hash with Python's string hash (cached on the string objects
    the word splitter returns; salted per process, so only that chance, never a decision, varies).
    """

    _MULT = np.uint64(0x9E3779B97F4A7C15)
    def __init__(self, words: list[str]):
        self.count = len(words)
        self._h1 = _mix64(np.fromiter(map(hash, words), dtype=np.int64, count=self.count).view(np.uint64))
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=self.count)
        self._ends = np.concatenate(([0], np.cumsum(lengths)))  # characters of words[:i] = _ends[i]
        self._n = 0  # the n of the arrays below
        self._h = self._h1  # hash of the n-gram at every start position
        self._rep = np.ones(self.count + 1, dtype=bool)  # n-gram at i occurs twice or more (n = 0: all)
        self._top: tuple[int, int] = (0, 0)  # (count, first position) of the most frequent n-gram

    def _advance(self, n: int) -> None:
        """Move the arrays to ``n`` (from 1 again when asked for a smaller n than the last)."""
        if n < self._n or self._n == 0:
            self._n, self._h, self._rep = 0, self._h1, np.ones(self.count + 1, dtype=bool)
        while self._n < n:
            m = self._n + 1
            size = self.count - m + 1
            if m > 1:
                with np.errstate(over="ignore"):
                    self._h = self._h[:size] * self._MULT + self._h1[m - 1 :]
            cand = np.flatnonzero(self._rep[:size] & self._rep[1 : size + 1])
            rep = np.zeros(size + 1, dtype=bool)  # one more: the shifted view of the next n stays in range
            top = (1, 0)
            if cand.size > 1:
                values = self._h[cand]
                order = np.argsort(values)
                ordered = values[order]
                same = ordered[1:] == ordered[:-1]
                if same.any():
                    starts = np.flatnonzero(np.concatenate(([True], ~same)))
                    counts = np.diff(np.append(starts, ordered.size))
                    firsts = np.minimum.reduceat(cand[order], starts)
                    best = int(counts.max())
                    top = (best, int(firsts[counts == best].min()))
                    repeated = np.repeat(counts > 1, counts)
                    rep[cand[order[repeated]]] = True
            self._n, self._rep, self._top = m, rep, top

    def top_chars(self, n: int) -> int:
        """Characters covered by the most frequent n-gram: its length (words joined by spaces) times its count;
        among equally frequent ones the first to occur (``Counter.most_common``)."""
        self._advance(n)
        top, i = self._top
        return (int(self._ends[i + n] - self._ends[i]) + n - 1) * top

    def dup_chars(self, n: int) -> int:
        """Characters of n-grams equal to an earlier, visited one; after such a match the scan jumps past it."""
        if self.count < n:
            return 0
        self._advance(n)
        hashes, repeats = self._h, self._rep
        repeated = np.flatnonzero(repeats[: self.count - n + 1])
        if repeated.size == 0:
            return 0
        chars = (self._ends[repeated + n] - self._ends[repeated]).tolist()
        total, nxt, seen = 0, 0, set()
        for pos, value, c in zip(repeated.tolist(), hashes[repeated].tolist(), chars, strict=True):
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

