"""The word splitter's routes: how the tokens of one whitespace-free chunk are found, in one ordered chain.

**Must equal** spaCy's rule-based tokenizer of the language (``spacy.blank(lang).tokenizer``; ``spacy>=3.8,<3.9``),
the word splitter datatrove's filters use: the same tokens for every chunk, whichever route answers it.

**Routes**, tried in the order of :data:`ROUTES`; each gives spaCy's tokens for the chunks it answers and steps
aside (None) for the others, which go to the next route:

1. ``plain``: a chunk of letters only is one word (most chunks of prose).
2. ``one_mark``: a word and one punctuation mark (``word,`` ``(word`` ``word.``), the commonest chunks after
   plain words, where the language splits affixes by spaCy's base rules.
3. ``chunk_rules``: spaCy's affix and infix algorithm ported to Python (:mod:`pipeline.fast.spacy_rules`), for
   any chunk spaCy's special-case matcher would not change.
4. the **fallback**, spaCy itself (:meth:`WordChain.spacy_tokens`), one call for every chunk of a batch the routes
   above stepped aside for; it never steps aside. Its prefix and suffix searches are the faster equivalent ones of
   :mod:`pipeline.fast.affix_search`.

Before the chain, in a language written without spaces (:data:`NO_SPACE_LANGS`), each character of those
scripts with its combining marks is one word (spaCy's default for Chinese, segmenter ``char``) and the rest of
the chunk goes to spaCy: tokenmill's rule, not a fast path.

**Difference tests**: ``tests/test_filters_heuristic.py`` (each route against spaCy's own tokenizer, on
generated and corpus chunks, and the whole splitter against ``spacy.blank``); ``bench/fast_paths.py``
(``words``) on the shared corpora.

spaCy is imported when a chain is built (a worker's ``setup``), never when a spec is validated.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import regex

from pipeline.fast.affix_search import prefix_matcher, suffix_searcher
from pipeline.fast.spacy_rules import ChunkRules

Tokens = tuple[str, ...]
#: one route: a chunk's tokens, or None where the route steps aside
ChunkSplit = Callable[[str], Tokens | None]

#: Languages written without spaces between words: each character of these scripts is a word.
NO_SPACE_LANGS = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})
_NO_SPACE_CHAR = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}]\p{M}*")
_NO_SPACE_SPLIT = regex.compile(f"({_NO_SPACE_CHAR.pattern})")
#: punctuation spaCy's base rules split off the end of any word (the ``one_mark`` route)
_SPLIT_SUFFIXES = frozenset(",;:!?)")
_ASCII_UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def spacy_tokenizer(lang: str) -> tuple[Any, frozenset[str], frozenset[str]]:
    """spaCy's rule-based tokenizer of ``lang`` (``xx``, multi-language, for a language spaCy lacks), the keys of
    its special cases, and the sentencizer's punctuation. Built like ``spacy.blank(lang).tokenizer`` without
    loading a pipeline and its registry, with equivalent prefix and suffix searches that
    scan less (:mod:`pipeline.fast.affix_search`); spaCy's own regexes where those step aside."""
    # spaCy imports thinc (seconds): only in a worker that splits words, never to validate a spec
    from spacy.pipeline import Sentencizer
    from spacy.tokenizer import Tokenizer
    from spacy.util import compile_infix_regex, compile_prefix_regex, compile_suffix_regex
    from spacy.vocab import Vocab

    defaults = _defaults(lang)
    tok = Tokenizer(
        Vocab(),
        rules=defaults.tokenizer_exceptions,
        prefix_search=(prefix_matcher(defaults.prefixes) or compile_prefix_regex(defaults.prefixes).search)
        if defaults.prefixes else None,
        suffix_search=(suffix_searcher(defaults.suffixes) or compile_suffix_regex(defaults.suffixes).search)
        if defaults.suffixes else None,
        infix_finditer=compile_infix_regex(defaults.infixes).finditer if defaults.infixes else None,
        token_match=defaults.token_match,
        url_match=defaults.url_match,
    )
    return tok, frozenset(defaults.tokenizer_exceptions), frozenset(Sentencizer.default_punct_chars)


def _defaults(lang: str) -> Any:
    """spaCy's ``Language.Defaults`` of ``lang``, the multi-language ones for a language spaCy lacks."""
    from spacy.util import get_lang_class  # spaCy: see spacy_tokenizer

    try:
        return get_lang_class(lang).Defaults
    except Exception:  # spaCy raises ImportError (E048) for a language it does not have
        return get_lang_class("xx").Defaults


def special_tokens(tok: Any) -> dict[str, Tokens]:
    """The tokenizer's special cases: each string and the tokens it becomes."""
    from spacy.attrs import ORTH  # spaCy: see spacy_tokenizer

    return {key: tuple(t[ORTH] for t in tokens) for key, tokens in tok.rules.items()}


def base_affixes(lang: str) -> bool:
    """True when ``lang``'s tokenizer splits prefixes and suffixes by spaCy's base punctuation rules (``en``,
    ``xx`` and about fifty others) and has no ``token_match``: the ``one_mark`` route assumes them."""
    from spacy.lang.punctuation import TOKENIZER_PREFIXES, TOKENIZER_SUFFIXES  # spaCy: see spacy_tokenizer

    defaults = _defaults(lang)
    return (defaults.prefixes == TOKENIZER_PREFIXES and defaults.suffixes == TOKENIZER_SUFFIXES
            and defaults.token_match is None)


def one_mark(chunk: str, special: Collection[str]) -> tuple[str, str] | None:
    """spaCy's tokens of a word and one punctuation mark (``word,`` ``word;`` ``word)`` ``(word``, and ``word.``
    after a lowercase ASCII letter), without spaCy; None for any other chunk.

    Why these are exact under spaCy's base rules: the chunk and its word are no special case (checked), a word of
    letters matches no URL, infix or further affix rule, and ``, ; : ! ? ( )`` are split off unconditionally
    (``LIST_PUNCT``), a period only after a lowercase letter or two capitals (a lone capital's ``A.`` stays whole,
    ``xA.`` too)."""
    if len(chunk) < 2 or chunk in special:
        return None
    head, tail = chunk[0], chunk[-1]
    if head == "(":
        word, out = chunk[1:], (head, chunk[1:])
    elif tail in _SPLIT_SUFFIXES or (tail == "." and ("a" <= chunk[-2] <= "z"
                                                    or (len(chunk) > 2 and _ASCII_UPPER.issuperset(chunk[-3:-1])))):
        word, out = chunk[:-1], (chunk[:-1], tail)
    else:
        return None
    return out if word.isalpha() and word not in special else None


class WordChain:
    """The routes of one language, built once per word splitter; :meth:`tokens` runs them over a batch of chunks.

    ``lang`` is spaCy's language; a language written without spaces uses the multi-language rules (``xx``) for
    the text between its script's characters.
    """

    def __init__(self, lang: str):
        self.lang = lang
        self.no_space = lang in NO_SPACE_LANGS
        self.tok, self.special, self.punct_chars = spacy_tokenizer("xx" if self.no_space else lang)
        self.rules = ChunkRules(self.tok, special_tokens(self.tok))
        self.base_affixes = not self.no_space and base_affixes(lang)
        #: the routes that apply to this language, in order: (name, split)
        self.routes: tuple[tuple[str, ChunkSplit], ...] = tuple(
            (r.name, split) for r in ROUTES if (split := r.build(self)) is not None)
        self._splits = tuple(split for _, split in self.routes)

    def split(self, chunk: str) -> Tokens | None:
        """The tokens of ``chunk`` from the first route that answers; None where every route steps aside."""
        for split in self._splits:
            tokens = split(chunk)
            if tokens is not None:
                return tokens
        return None

    def tokens(self, chunks: Collection[str], known: Mapping[str, Tokens]) -> dict[str, Tokens]:
        """The tokens of each of ``chunks`` (distinct): the first route's that answers, spaCy's (one call) for the
        rest. ``known`` holds tokens found before (a chunk's text between script characters is looked up there
        first); the result may hold such pieces too, to be cached with the chunks."""
        out: dict[str, Tokens] = {}
        ask: list[str] = []
        scripts: list[tuple[str, list[str]]] = []
        for chunk in chunks:
            if self.no_space and _NO_SPACE_CHAR.search(chunk):
                parts = [p for p in _NO_SPACE_SPLIT.split(chunk) if p]
                scripts.append((chunk, parts))
                ask.extend(p for p in parts if not _NO_SPACE_CHAR.fullmatch(p) and p not in known and p not in out)
            elif (found := self.split(chunk)) is not None:
                out[chunk] = found
            else:
                ask.append(chunk)
        if ask:
            ask = list(dict.fromkeys(ask))
            out.update(zip(ask, self.spacy_tokens(ask), strict=True))
        for chunk, parts in scripts:  # one word per character of the script, the rest by spaCy's rules
            out[chunk] = tuple(chain.from_iterable(
                (p,) if _NO_SPACE_CHAR.fullmatch(p) else out[p] if p in out else known[p] for p in parts
            ))
        return out

    def spacy_tokens(self, chunks: Sequence[str]) -> list[Tokens]:
        """spaCy's tokens of each chunk (the chain's fallback), from one call on the chunks joined by spaces.

        Chunks hold no whitespace, so a token belongs to the chunk its offset falls in. Where a chunk ends or the
        next one starts with a character that is not a letter or digit, they are joined by two spaces: the second
        makes a whitespace token (dropped here) that keeps spaCy's pass over special cases spanning tokens
        (``:(``, ``):``) from letting a chunk's neighbour change its tokens (``a) :(`` gives ``:`` ``(``, ``:(``
        alone ``:(``), so that a chunk's words never depend on the batch it was asked in. One space elsewhere: a
        whitespace token costs spaCy as much as a word.
        """
        from spacy.attrs import IDX, LENGTH  # spaCy: see spacy_tokenizer

        parts: list[str] = []
        starts_list: list[int] = []
        pos, prev_alnum = 0, True
        for chunk in chunks:
            if parts:
                sep = " " if prev_alnum and chunk[0].isalnum() else "  "
                parts.append(sep)
                pos += len(sep)
            starts_list.append(pos)
            parts.append(chunk)
            pos += len(chunk)
            prev_alnum = chunk[-1].isalnum()
        joined = "".join(parts)
        starts = np.array(starts_list, dtype=np.int64)
        lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
        with self.tok.vocab.memory_zone():  # free spaCy's strings of this call: a worker lives long
            spans = self.tok(joined).to_array([IDX, LENGTH])
        owner = np.searchsorted(starts, spans[:, 0], side="right") - 1  # the chunk at or before each token
        spans = spans[spans[:, 0] - starts[owner] < lengths[owner]]  # the separators' whitespace tokens out
        tokens = [joined[a : a + n] for a, n in spans.tolist()]
        first = np.searchsorted(spans[:, 0], starts).tolist() + [len(tokens)]  # first token of each chunk
        return [tuple(tokens[first[i] : first[i + 1]]) for i in range(len(chunks))]


def _plain(c: WordChain) -> ChunkSplit:
    special = c.special

    def plain(chunk: str) -> Tokens | None:
        return (chunk,) if chunk.isalpha() and chunk not in special else None

    return plain


def _one_mark(c: WordChain) -> ChunkSplit | None:
    if not c.base_affixes:
        return None
    special = c.special

    def split(chunk: str) -> Tokens | None:
        return one_mark(chunk, special)

    return split


def _chunk_rules(c: WordChain) -> ChunkSplit:
    return c.rules.split


@dataclass(frozen=True)
class Route:
    """One route of the chain: its name, when it steps aside, and how a chain builds it for its language (None:
    the route does not apply to the language)."""

    name: str
    steps_aside: str
    build: Callable[[WordChain], ChunkSplit | None]


#: the chain, in order: the first route that answers a chunk gives its tokens
ROUTES: tuple[Route, ...] = (
    Route("plain", "a character that is not a letter, or a special case of the language (English ``cannot``)",
          _plain),
    Route("one_mark", "a language whose affix rules are not spaCy's base ones or that has a token_match (de, fr, "
          "ja...); any chunk other than a word of letters and one mark; a special case", _one_mark),
    Route("chunk_rules", "a run of the chunk's tokens spells a special case that would change them (spaCy's "
          "special-case matcher: ``:)``, ``a.m.``)", _chunk_rules),
)
