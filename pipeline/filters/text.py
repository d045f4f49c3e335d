"""Text helpers shared by the heuristic filters (Gopher, C4, FineWeb): words, sentences, stop words, duplicates.

**Words.** The rules count words, average their length and build n-grams of them, so where punctuation splits
off ("don't" -> "do" "n't", "(see" -> "(" "see") moves every ratio. datatrove, the reference implementation
of these rules, splits words with spaCy's rule-based tokenizer of the language (rules only: no model, nothing
downloaded), so tokenmill uses the same rules, from the same library, and its decisions agree with datatrove's.
spaCy decides every whitespace-separated chunk on its own, so :class:`WordSplitter` asks it once per distinct
chunk, in one batched call per document, and caches the answer: a corpus repeats the same chunks, and most
chunks get spaCy's tokens without asking spaCy at all, by one of the routes declared, with the condition under
which each steps aside, in :mod:`pipeline.fast.word_chain`.

**Languages written without spaces** (Chinese, Japanese, Thai, Lao, Khmer, Burmese, Tibetan): each character of
those scripts, with its combining marks, is one word; the rest of the text is split by spaCy's multi-language
rules. This is spaCy's default for Chinese (segmenter ``char``). datatrove segments these languages with
dictionaries (jieba, SudachiPy, PyThaiNLP) that tokenmill does not install, so its word counts there differ.

**Stop words** (Gopher's "at least two of the, be, to, of, and, that, have, with") exist per language in
:data:`STOP_WORDS`; a language without a list skips that rule.

spaCy is imported on first use (a worker's ``setup``), never when a spec is validated: it imports thinc and, if
installed, torch (seconds).
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
import unicodedata
import weakref
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import chain, filterfalse
from typing import Any, cast

import regex

from kernels import text_chunks
from pipeline.fast.word_chain import NO_SPACE_LANGS, WordChain
from pipeline.stages.base import Verdict

#: The default language of a document without ``meta["lang"]`` (the published rules are for English).
DEFAULT_LANG = "en"

_WHITESPACE_RUNS = re.compile(r"(\s+)")

#: ISO 639-3 (and GlotLID's ``xxx_Script``) codes of the languages this module knows, to their ISO 639-1 code.
_ISO3 = {
    "eng": "en", "deu": "de", "fra": "fr", "spa": "es", "ita": "it", "por": "pt", "nld": "nl", "rus": "ru",
    "pol": "pl", "swe": "sv", "zho": "zh", "cmn": "zh", "jpn": "ja", "tha": "th", "lao": "lo", "khm": "km",
    "mya": "my", "bod": "bo", "kor": "ko",
}

#: Gopher's stop words (Rae et al. 2021, appendix A: "at least two of the following English words: the, be,
#: to, of, and, that, have, with"), and for other languages the same kinds of words (articles, the copula,
#: "to", "of", "and", "that", "have", "with"), the most frequent function words of each language; matched
#: case-sensitively against whole words, as datatrove does. Zh/ja: the most frequent single-character particles
#: (words there are characters, see above).
STOP_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("the", "be", "to", "of", "and", "that", "have", "with"),
    "de": ("der", "die", "das", "und", "zu", "von", "mit", "ist", "sein", "dass", "haben"),
    "fr": ("le", "la", "les", "de", "et", "à", "que", "avec", "être", "est", "avoir"),
    "es": ("el", "la", "los", "de", "y", "a", "que", "con", "ser", "es", "haber"),
    "it": ("il", "la", "di", "e", "a", "che", "con", "essere", "è", "avere"),
    "pt": ("o", "a", "os", "de", "e", "que", "com", "ser", "é", "ter"),
    "nl": ("de", "het", "een", "en", "van", "te", "dat", "met", "zijn", "is", "hebben"),
    "sv": ("och", "att", "det", "som", "en", "av", "med", "är", "vara", "ha"),
    "pl": ("i", "w", "z", "na", "że", "do", "się", "jest", "być", "mieć"),
    "ru": ("и", "в", "не", "на", "что", "с", "быть", "это", "к", "по"),
    "zh": ("的", "了", "是", "在", "和", "有", "不", "这"),
    "ja": ("の", "に", "は", "を", "た", "が", "で", "と"),
}

#: datatrove's ``PUNCTUATION`` (``datatrove/utils/text.py``): the characters a "symbol" word is made of,
#: control characters included; kept verbatim so that "symbol words" are the same words as datatrove's.
PUNCTUATION = (
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    + "".join(map(chr, (x for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b))))
)


@lru_cache(maxsize=1)
def terminal_punctuation() -> frozenset[str]:
    """The Unicode property Sentence_Terminal plus Khmer ៖ ៙ ៚: datatrove's ``TERMINAL_PUNCTUATION`` (which
    was taken from an older Unicode version; the ~16 rare characters added since then are the difference).
    Computed on first use (a scan of all code points), not when a spec is validated."""
    every = "".join(map(chr, range(0x110000)))
    return frozenset("".join(regex.findall(r"\p{Sentence_Terminal}", every)) + "៖៙៚")


@lru_cache(maxsize=1)
def symbol_chars() -> frozenset[str]:
    """Characters a "symbol" (not a word) is made of only: datatrove's ``PUNCTUATION_SET``."""
    return frozenset(PUNCTUATION) | terminal_punctuation()


def normalize_lang(value: Any, default: str = DEFAULT_LANG) -> str:
    """An ISO 639-1 code from what LID wrote (``en``, ``__label__en``, ``eng_Latn``, ``zh-Hans``); ``default``
    when there is none."""
    if not isinstance(value, str) or not value.strip():
        return default
    code = value.strip().lower().removeprefix("__label__")
    code = re.split(r"[-_]", code, maxsplit=1)[0]
    return _ISO3.get(code, code)


def doc_lang(doc: Mapping[str, Any], default: str = DEFAULT_LANG) -> str:
    """The document's language: ``meta["lang"]`` as the ``lid`` stage set it, else ``default``."""
    meta = doc.get("meta")
    if isinstance(meta, str):  # an Arrow row's meta is JSON text
        try:
            meta = json.loads(meta) if meta else None
        except ValueError:
            meta = None
    return normalize_lang(meta.get("lang") if isinstance(meta, dict) else None, default)


def stop_words(lang: str, override: dict[str, list[str]] | None = None) -> frozenset[str] | None:
    """The stop words of ``lang`` (``override`` first), None when there is no list for it."""
    if override and lang in override:
        return frozenset(override[lang])
    words = STOP_WORDS.get(lang)
    return frozenset(words) if words is not None else None


def find_duplicates(items: Iterable[str]) -> tuple[int, int]:
    """(number of items that repeat an earlier one, their characters): Gopher's duplicate line/paragraph counts.

    The same totals as datatrove's first-seen scan, from a C-level Counter.
    """
    dup_items = dup_chars = 0
    for item, n in Counter(items).items():
        if n > 1:
            dup_items += n - 1
            dup_chars += (n - 1) * len(item)
    return dup_items, dup_chars


class CacheBudget:
    """How many entries the word splitters of a process may put in their chunk caches, counted together.

    Each splitter caches its language's chunks in two generations. Every language's *current* generation counts
    against one shared limit: once their sum passes it, every splitter's current generation becomes its previous
    one and the one before is dropped (a chunk found in the previous generation moves back on use, so the
    frequent chunks are never asked again). So a process's caches hold at most twice ``entries`` entries (plus
    one call's chunks), however many languages and however much text it sees. With a limit per language, a
    worker that met twenty languages held twenty caches, and its memory grew with the input until each was full
    (bench/scale.py, ``max_rss_growth``).

    The splitters sharing a budget share its ``lock`` too, so that one of them can turn every cache over.
    """

    def __init__(self, entries: int):
        self.entries = entries
        self.generation = 0
        self.lock = threading.Lock()
        self._spent = 0
        self._due = False
        self._splitters: weakref.WeakSet[WordSplitter] = weakref.WeakSet()

    def join(self, splitter: WordSplitter) -> None:
        with self.lock:
            self._splitters.add(splitter)

    def spend(self, n: int) -> None:
        """``n`` entries were added to a current generation; past the limit, the next call turns the caches over.
        Call with ``lock`` held."""
        self._spent += n
        if self._spent > self.entries:
            self._due = True

    def turn_if_due(self) -> None:
        """Start a new generation in every splitter, when due; call with ``lock`` held, before a cache is read."""
        if self._due:
            for s in list(self._splitters):
                s._turn()
            self._spent, self._due = 0, False
            self.generation += 1


class WordMemo:
    """The word lists of the last texts split, ``(language, text) -> words``, up to ``words`` words in all: one
    batch's worth and more. Filters run batch by batch, one after the other, so the filters of one worker split
    a document once. Shared by every language: one limit for the process, not one per language."""

    def __init__(self, words: int):
        self.limit = words
        self._memo: OrderedDict[tuple[str, str], list[str]] = OrderedDict()
        self._words = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> list[str] | None:
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
            return hit

    def put(self, key: tuple[str, str], words: list[str]) -> None:
        with self._lock:
            old = self._memo.pop(key, None)
            if old is not None:
                self._words -= len(old)
            self._memo[key] = words
            self._words += len(words)
            while self._words > self.limit and len(self._memo) > 1:
                self._words -= len(self._memo.popitem(last=False)[1])


#: chunk-cache entries of a process's splitters (both generations: about twice this); ~450 bytes an entry
CACHE_ENTRIES = 600_000
#: words memoized per process (about 50 MB)
MEMO_WORDS = 2_000_000
_BUDGET = CacheBudget(CACHE_ENTRIES)
_MEMO = WordMemo(MEMO_WORDS)


class WordSplitter:
    """Words of a text as spaCy's rules for ``lang`` split them (datatrove's ``split_into_words``), fast.

    ``words(text)`` returns the tokens without whitespace tokens; ``sentences(lines)`` counts sentences as spaCy's
    sentencizer does (datatrove's ``split_into_sentences``). Results per chunk are cached in two generations under
    a :class:`CacheBudget` shared with the process's other splitters, so memory stays bounded and the frequent
    chunks are kept; the word lists of the last texts are memoized (:class:`WordMemo`, shared too), so that the
    filters of one worker split a document once. Do not modify the lists it returns.
    """

    def __init__(self, lang: str, budget: CacheBudget | None = None, memo: WordMemo | None = None):
        self.lang = lang
        #: how a chunk's tokens are found: the declared routes, spaCy last (:mod:`pipeline.fast.word_chain`)
        self.chain = WordChain(lang)
        self._punct_chars = self.chain.punct_chars
        self._memo = memo or _MEMO
        self._cache: dict[str, tuple[str, ...]] = {}
        self._old: dict[str, tuple[str, ...]] = {}  # the previous generation of the cache
        self._kind: dict[str, int] = {}  # token -> 1 sentence-ending char, 2 other punctuation, 0 else
        self._sig: dict[str, str] = {}  # chunk -> its signature (:meth:`sentences`)
        self._budget = budget or _BUDGET
        self._lock = self._budget.lock  # Ray may run batches of one actor in threads
        self._budget.join(self)

    def words(self, text: str) -> list[str]:
        """The words (tokens) of ``text``, in order."""
        key = (self.lang, text)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        chunks = text.split()
        with self._lock:
            self._ensure(chunks)
            out = list(chain.from_iterable(map(self._cache.__getitem__, chunks)))
        self._memo.put(key, out)
        return out

    def words_many(self, texts: list[str]) -> list[list[str]]:
        """``[self.words(t) for t in texts]``, faster for a batch: with the C kernel (:mod:`kernels.text_chunks`),
        the texts not memoized are split together, the chunk cache is probed once per distinct chunk of the
        batch, and each word list is built in C."""
        if not text_chunks.native():
            return [self.words(t) for t in texts]
        out: list[list[str] | None] = [self._memo.get((self.lang, t)) for t in texts]
        todo = [i for i, w in enumerate(out) if w is None]
        if not todo:
            return cast("list[list[str]]", out)
        distinct, ids, ends = text_chunks.split_texts([texts[i] for i in todo])
        with self._lock:
            self._ensure(distinct)
            parts = list(map(self._cache.__getitem__, distinct))
        for i, words in zip(todo, text_chunks.assemble(parts, ids, ends), strict=True):
            out[i] = words
            self._memo.put((self.lang, texts[i]), words)
        return cast("list[list[str]]", out)

    def count(self, text: str) -> int:
        """``len(self.words(text))`` without building the list or memoizing it (FineWeb counts the words of the
        text C4 rewrote, which no filter splits again)."""
        hit = self._memo.get((self.lang, text))
        if hit is not None:
            return len(hit)
        chunks = text.split()
        with self._lock:
            self._ensure(chunks)
            return sum(map(len, map(self._cache.__getitem__, chunks)))

    def sentences(self, lines: Sequence[str]) -> int:
        """How many sentences spaCy's sentencizer finds in ``lines``, each line on its own (0 for an empty line).

        A sentence ends at a token that is one of the sentencizer's punctuation characters ("." "!" "?" ...) and
        the next sentence starts at the first following token that is not punctuation. spaCy also makes a token
        of each run of whitespace other than one space; such a token can start a sentence, so it is kept here.

        Counted without a Python step per token: each chunk's tokens become a signature, ``1`` for a sentence end
        and ``0`` for a token that is not punctuation (other punctuation changes nothing, so it is left out); a
        line's signature is its chunks' joined, and every ``10`` in it is a sentence start after an end.
        """
        split = [_WHITESPACE_RUNS.split(line) for line in lines if line]
        if not split:
            return 0
        total = 0
        with self._lock:
            self._budget.turn_if_due()  # before the signatures are read: a turn replaces them
            sig = self._sig
            new = set(filterfalse(sig.__contains__, chain.from_iterable(split)))  # the rest are known
            if new:
                self._ensure(piece for piece in new if piece and not piece.isspace())
                for piece in new:
                    sig[piece] = self._signature(piece)
            for pieces in split:
                total += 1 + "".join(map(sig.__getitem__, pieces)).count("10")
        return total

    def _signature(self, piece: str) -> str:
        """A piece's part of a line's signature (:meth:`sentences`): per token ``1`` (a sentence end), ``0`` (not
        punctuation) or nothing (other punctuation); a whitespace run other than one space is a token (``0``)."""
        if not piece or piece == " ":
            return ""
        if piece.isspace():
            return "0"
        kind, ends = self._kind, self._punct_chars
        out = []
        for tok in self._cache[piece]:
            k = kind.get(tok)
            if k is None:
                k = kind[tok] = 1 if tok in ends else 2 if _is_punct(tok) else 0
            if k != 2:
                out.append("1" if k == 1 else "0")
        return "".join(out)

    def _ensure(self, chunks: Iterable[str]) -> None:
        """Put every chunk in the cache (the chain's routes, one spaCy call for those they leave); call with the
        lock held."""
        self._budget.turn_if_due()  # a new generation: memory stays bounded (CacheBudget)
        cache = self._cache
        missing = set(filterfalse(cache.__contains__, chunks))  # no bytecode per chunk
        if not missing:
            return
        before = len(cache)
        old = self._old
        if old:  # what the previous generation knew moves over: the frequent chunks are never asked again
            known = set(filter(old.__contains__, missing))  # not missing & old: that would walk all of old
            if known:
                cache.update((c, old[c]) for c in known)
                missing -= known
        cache.update(self.chain.tokens(missing, cache))
        self._budget.spend(len(cache) - before)

    def _turn(self) -> None:
        """The current generation becomes the previous one (:meth:`CacheBudget.turn_if_due`, lock held)."""
        self._old, self._cache, self._kind, self._sig = self._cache, {}, {}, {}

def _is_punct(token: str) -> bool:
    """spaCy's ``is_punct``: every character is Unicode punctuation (category P*)."""
    return bool(token) and all(_unicode_category(c).startswith("P") for c in token)


@lru_cache(maxsize=4096)
def _unicode_category(char: str) -> str:
    return unicodedata.category(char)


_SPLITTERS: dict[str, WordSplitter] = {}
_SPLITTERS_LOCK = threading.Lock()


def splitter(lang: str) -> WordSplitter:
    """The process-wide :class:`WordSplitter` of ``lang`` (shared by every filter stage in a worker); languages
    spaCy does not know share the multi-language (``xx``) one."""
    lang = _spacy_lang(lang)
    s = _SPLITTERS.get(lang)
    if s is None:
        with _SPLITTERS_LOCK:
            s = _SPLITTERS.get(lang)
            if s is None:
                s = _SPLITTERS[lang] = WordSplitter(lang)
    return s


def reset_splitters() -> None:
    """Forget every splitter, its caches and the memo: the next filter starts cold (``bench/filters.py`` times
    each filter as a fresh worker runs it)."""
    global _BUDGET, _MEMO
    with _SPLITTERS_LOCK:
        _SPLITTERS.clear()
        _BUDGET, _MEMO = CacheBudget(CACHE_ENTRIES), WordMemo(MEMO_WORDS)


@lru_cache(maxsize=256)
def _spacy_lang(lang: str) -> str:
    """``lang`` when spaCy has rules for it (or it is written without spaces), else ``xx``."""
    if lang in NO_SPACE_LANGS:
        return lang
    if lang.isidentifier() and lang.islower() and importlib.util.find_spec(f"spacy.lang.{lang}") is not None:
        return lang
    return "xx"


class RuleCheck:
    """Scores and the first failing rule of one document, in the rules' order.

    ``check(failed, rule)`` records a failure (the first one names the verdict's reason) and returns True when
    the filter should stop: in ``filter`` mode at the first failure (later rules cannot change a drop, and their
    cost is saved, as datatrove does), in ``annotate`` mode never, so that every score is recorded.
    """

    __slots__ = ("stage", "all_scores", "scores", "reason")

    def __init__(self, stage: str, all_scores: bool):
        self.stage = stage
        self.all_scores = all_scores
        self.scores: dict[str, float] = {}
        self.reason: str | None = None

    def check(self, failed: bool, rule: str) -> bool:
        if failed and self.reason is None:
            self.reason = f"{self.stage}:{rule}"
        return self.reason is not None and not self.all_scores

    def verdict(self) -> Verdict:
        return Verdict(self.reason is None, self.reason, self.scores)
