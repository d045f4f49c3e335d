"""Faster, exactly equivalent prefix and suffix searches for spaCy's rule-based tokenizer.

**Must equal** the ``search`` of spaCy's ``compile_prefix_regex`` / ``compile_suffix_regex`` (``spacy>=3.8,<3.9``),
match for match. **Fallback**: those regexes themselves (:func:`pipeline.fast.word_chain.spacy_tokenizer` uses them
where these return None). **Steps aside** for a rule set with a piece that has a top-level ``|`` or is not a
string pattern. **Difference test**: ``tests/test_filters_heuristic.py``
(``test_affix_searches_return_what_spacys_regexes_return``).

spaCy builds its prefix regex as ``^p1|^p2|...`` and its suffix regex as ``s1$|s2$|...`` and calls
``.search`` on every chunk it splits. ``re.search`` tries every start position, and at each one all of the
~12,000-character alternation: the suffix search alone was a large part of the word splitter's time in spaCy. Both
searches can stop early without changing a single match:

- every prefix alternative starts with ``^``, which (without MULTILINE) matches only at the string's start, so
  ``match`` (position 0 only) returns the same match as ``search``;
- every suffix alternative ends with ``$`` and, apart from the ellipsis (``\\.\\.+``), matches at most ``W``
  characters (5 for spaCy's base rules, read from the pattern with the ``re`` parser), so every match of the
  bounded alternatives starts in the last ``W`` characters. ``search(s, len(s) - W)`` scans only those, and its
  lookbehinds still see the characters before (``pos`` is not a slice). The unbounded alternatives get their own
  small search first: only when one of them starts before that window is the full search run (a chunk ending
  in a long run of dots).

A piece with a top-level ``|`` would leave one of its branches unanchored; such rules are not sped up
(:func:`prefix_matcher` / :func:`suffix_searcher` return None and spaCy's own regex is used).
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # the stdlib's own parser: the width of a pattern, as the engine sees it
from collections.abc import Callable, Sequence
from typing import Any

Search = Callable[[str], Any]


def _pieces(entries: Sequence[Any]) -> list[str] | None:
    """The entries as spaCy joins them (strings, ``piece.strip()`` non-empty), None if any has a top-level
    ``|`` or is not a string pattern."""
    out = []
    for e in entries:
        piece = e if isinstance(e, str) else getattr(e, "pattern", None)
        if not isinstance(piece, str):
            return None
        if piece.strip():
            if _top_level_bar(piece):
                return None
            out.append(piece)
    return out


def _top_level_bar(pattern: str) -> bool:
    """Whether ``pattern`` has a ``|`` outside every group and character class."""
    depth, i, in_class = 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a literal ] first in a class
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def prefix_matcher(entries: Sequence[Any]) -> Search | None:
    """``match`` of spaCy's prefix regex (``compile_prefix_regex(entries)``): the same result as its
    ``search``, tried at position 0 only."""
    pieces = _pieces(entries)
    if pieces is None:
        return None
    return re.compile("|".join("^" + p for p in pieces)).match


def suffix_searcher(entries: Sequence[Any]) -> Search | None:
    """A function returning what ``compile_suffix_regex(entries).search`` returns, scanning only the last
    characters of the string (see the module docstring)."""
    pieces = _pieces(entries)
    if pieces is None:
        return None
    full = re.compile("|".join(p + "$" for p in pieces))
    widths = [sre_parse.parse(p).getwidth()[1] for p in pieces]
    bounded = [w for w in widths if w < sre_parse.MAXREPEAT]
    window = max(bounded, default=0)
    unbounded = [p for p, w in zip(pieces, widths, strict=True) if w >= sre_parse.MAXREPEAT]
    tail = re.compile("|".join(p + "$" for p in unbounded)).search if unbounded else None
    full_search = full.search

    def search(text: str) -> Any:
        start = len(text) - window
        if start <= 0:
            return full_search(text)
        if tail is not None:
            m = tail(text)
            if m is not None and m.start() < start:
                return full_search(text)
        return full_search(text, start)

    return search
