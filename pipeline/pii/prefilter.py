"""Candidate windows: the only parts of a document Presidio has to read, and which recognizers read them.

Every recognizer has a cheap *gate*, a regex that each of its matches must contain: an e-mail contains
``@``; a credit card 12 digits with at most one ``-`` or space between; an IBAN a country code and two check
digits; a phone number 7 digits with at most four punctuation characters between two (the detector passes
:data:`pipeline.pii.recognizers.RUN`). :data:`GATES` names, for each entity type, the part of Presidio's
pattern it is read from. A gate is a necessary condition, so text where no gate matches cannot hold a
match, and skipping it loses nothing.

Each gate match becomes a window reaching :data:`REACH` characters to either side (the longest entity
part that can lie outside its gate and across spaces: an IBAN written in groups of four is 42 characters
long and its gate is its first four), widened to the next whitespace so no word is cut, at most
:data:`MAX_SNAP` characters further. Overlapping windows of the same gate merge. Only the recognizers of
the gate run on its windows: a sentence with an e-mail address never reaches the phone-number parser.

A recognizer whose patterns all score under the threshold counts only next to one of its context words,
so its gate also needs a *cue* (:class:`Rule`); one with a few such weak patterns gets a narrower gate for
its strong ones (:data:`STRONG_GATES`) and the cue for the rest. The detector sets these rules up.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable
from typing import NamedTuple

import regex

#: characters an entity may extend beyond its gate match (IBAN: 42 characters, gate = first 4)
REACH = 48
#: Presidio's context enhancer looks at the token a match starts with and the 5 words before it
#: (``context_prefix_count``; 6 when that token is punctuation, like the "+" of "+49 ..."). Each
#: whitespace-separated word with a letter or digit gives it at least one word, so 6 of those before the
#: match's own hold all it can look at (:func:`context_start`).
CONTEXT_WORDS = 6
#: at most this many characters back, whatever the words (a run of punctuation-only "words" in a table)
CONTEXT_LIMIT = 1000
#: between texts scanned together: no gate crosses five line breaks (the loosest, the phone gate, allows
#: four punctuation characters between digits)
SEPARATOR = "\n" * 5
#: how far a window edge may move to reach whitespace (a URL with a long path is one "word")
MAX_SNAP = 2048

#: gate per entity type (matched case-insensitively, like Presidio's patterns); each is a part of every
#: alternative of the recognizer's pattern(s), see the comment on each line
GATES: dict[str, str] = {
    "EMAIL_ADDRESS": r"@",  # local[@]domain
    "URL": r"\.[a-z]{2}",  # [a-z0-9.-]{1,253}[.](tld): every tld has two letters or more
    "CREDIT_CARD": r"\d(?:[- ]?\d){11}",  # 12 to 19 digits, [- ]? between groups
    "US_SSN": r"\d{5}-\d{4}|\d{3}-\d{6}|\d{3}[- .]\d\d[- .]\d{4}|\d{9}",  # 5-4, 3-6, 3-2-4, 9 digits
    "IBAN_CODE": r"(?<=[a-z]{2})\d{2}",  # country code + check digits
    "IP_ADDRESS": r"\d\.\d|:[0-9a-f:]",  # dotted IPv4; IPv6 "h:h", "h::", "::"
    # d/d/d, d-d-d, d.d.d (a 1-2 digit middle part), dd-MMM, MMM-yy, mm/yy
    "DATE_TIME": r"\d[/.\-]\d\d?[/.\-]\d|\d-[a-z]{3}|(?<=[a-z]{3})-\d|\d/\d\d",
    "MAC_ADDRESS": r"(?<=[0-9a-f]{2})[:-][0-9a-f]{2}[:-]|(?<=[0-9a-f]{4})\.[0-9a-f]{4}\.",
    "UUID": r"(?<=[0-9a-f]{8})-[0-9a-f]{4}-",
    "CRYPTO": r"[13][a-z0-9]{25}",  # (bc1|[13]) + 25-59 characters
    "US_BANK_NUMBER": r"\d{8}",  # 8-17 digits
    "US_PASSPORT": r"\d{8}",  # 9 digits, or a letter and 8
    "US_ITIN": r"9\d\d[- ]?\d\d",  # 9xx[- ]?(5x|...)[- ]?xxxx
    # every alternative has a letter next to a digit or 6 digits in a row ("A-Z]" is a typo in Presidio's)
    "US_DRIVER_LICENSE": r"\d(?:[a-z]|\d{5})|(?<=[a-z\]])\d",
    "MEDICAL_LICENSE": r"(?<=[a-z][a-z9])\d{7}",  # DEA: 2 letters (or a letter and 9) and 7 digits
    "UK_NHS": r"\d{3}[- ]?\d{3}[- ]?\d{4}",
    "ES_NIF": r"\d{7}-?[a-z]",
    "ES_NIE": r"\d{7}-?[a-z]",
    # 6 letters, the year and the day (digits, or letters for omocodia) around the month letter, the first
    # letter of the place code: a shorter gate opened a window on every long English word
    "IT_FISCAL_CODE": r"[a-z]{6}[0-9lmnp-v]{2}[a-ehlmpr-t][0-9lmnp-v]{2}[a-mz]",
    "IT_DRIVER_LICENSE": r"(?<=[a-z]{2})\d{7}|u1[0-9a-z]{7}",
    "IT_VAT_CODE": r"\d(?:[ _]?\d){10}",
    "IT_IDENTITY_CARD": r"(?<=[a-z]{2}\s?)\d{5}|\d{7}[a-z]",
    "IT_PASSPORT": r"(?<=[a-z]{2})\d{7}",
    "PL_PESEL": r"\d{11}",
}
#: Gates of only the patterns that score at least the second value; the patterns they miss score at most
#: the third, under the stage's threshold, and count only with a context word: where none occurs, the
#: narrower gate suffices (e.g. a 9-digit run is a US_SSN at 0.05; without "ssn" nearby only the 3-2-4
#: pattern at 0.5 can reach the threshold).
STRONG_GATES: dict[str, tuple[str, float, float]] = {
    "US_SSN": (r"\d{3}[- .]\d\d[- .]\d{4}", 0.5, 0.05),
    "US_ITIN": (r"9\d\d[- ]\d\d[- ]\d{4}", 0.5, 0.3),
    "DATE_TIME": (r"\d[/.\-]\d\d?[/.\-]\d|\d-[a-z]{3}|(?<=[a-z]{3})-\d", 0.6, 0.2),  # not mm/yy, mm/yyyy
}
_FLAGS = regex.IGNORECASE | regex.UNICODE | regex.VERSION0


class Window(NamedTuple):
    """``text[start:end]`` may hold matches of the recognizers for ``entities``; both ends at whitespace."""

    start: int
    end: int
    entities: tuple[str, ...]


class Rule(NamedTuple):
    """Open windows for ``entity`` around matches of ``gate``, ``reach`` characters before and after; with a
    ``cue`` (a regex of lower-case context words), only windows where it occurs, in them or in the words
    before them that Presidio's context enhancer can look at (:func:`context_start`); ``exact``, when given,
    is the stricter form of ``cue`` checked there (a short word only between non-letters), ``cue`` the fast
    one that finds the texts to scan."""

    entity: str
    gate: str
    cue: str | None = None
    reach: tuple[int, int] = (REACH, REACH)
    exact: str | None = None


class Prefilter:
    """Rules for a set of entity types; :meth:`windows` cuts texts into what the recognizers must read.
    Entity types in ``ungated`` (a custom recognizer, no known gate) get the whole text as their window."""

    def __init__(self, rules: Iterable[Rule], ungated: Iterable[str] = ()):
        by_key: dict[tuple[str, str | None, tuple[int, int], str | None], list[str]] = {}
        for rule in rules:
            by_key.setdefault((rule.gate, rule.cue, rule.reach, rule.exact), []).append(rule.entity)
        #: (gate, cue or None, reach, the entity types they open, the exact cue), one per distinct rule
        self.groups = [(regex.compile(g, _FLAGS), re.compile(c) if c else None, reach, tuple(es),
                        regex.compile(x) if x else re.compile(c) if c else None)
                       for (g, c, reach, x), es in by_key.items()]
        self.ungated = tuple(ungated)

    def windows(self, texts: list[str]) -> list[list[Window]]:
        """Per text, its windows in order of start (windows of different gates may overlap).

        A gate scans all texts joined by :data:`SEPARATOR` at once (one regex call per gate and batch); a
        gate with a cue scans only the texts where the cue occurs at all (found in the lower-cased texts
        joined, one search per text that has it).
        """
        joined = SEPARATOR.join(texts)
        offsets = list(itertools.accumulate((len(t) + len(SEPARATOR) for t in texts), initial=0))
        out: list[list[Window]] = [[Window(0, len(t), self.ungated)] if self.ungated and t else [] for t in texts]
        lowered: tuple[str, list[int]] | None = None
        for gate, cue, reach, entities, exact in self.groups:
            if cue is None:
                matches = ((m.start(), m.end()) for m in gate.finditer(joined))
            else:
                lowered = lowered or _lowered(texts)
                matches = ((offsets[i] + m.start(), offsets[i] + m.end())
                           for i in _texts_with(cue, *lowered) for m in gate.finditer(texts[i]))
            for text, found, windows in zip(texts, self._windows(texts, offsets, matches, reach, entities), out,
                                            strict=True):
                windows.extend(w for w in found if exact is None or exact.search(
                    ESCAPED_BREAK.sub("  ", text[context_start(text, w.start) : w.end].lower())))
        return [sorted(ws) for ws in out]

    def _windows(self, texts: list[str], offsets: list[int], matches: Iterable[tuple[int, int]],
                 reach: tuple[int, int], entities: tuple[str, ...]) -> list[list[Window]]:
        """Per text, the windows around ``matches`` (offsets in the joined texts, in order)."""
        out: list[list[Window]] = [[] for _ in texts]
        doc, end = 0, -1
        for m_start, m_end in matches:
            if m_start >= offsets[doc + 1]:
                doc = bisect.bisect_right(offsets, m_start) - 1
                end = -1
            text, base, windows = texts[doc], offsets[doc], out[doc]
            start, stop = m_start - base, m_end - base
            if start < end:  # inside the last window: extend it if this match reaches further
                if stop + reach[1] > end:
                    end = self.snap_right(text, min(stop + reach[1], len(text)))
                    windows[-1] = Window(windows[-1].start, end, entities)
                continue
            lo = self.snap_left(text, max(start - reach[0], 0))
            end = self.snap_right(text, min(stop + reach[1], len(text)))
            if windows and lo <= windows[-1].end:
                lo = windows.pop().start
            windows.append(Window(lo, end, entities))
        return out

    def snap_left(self, text: str, pos: int) -> int:
        """``pos``, or the start of the word it falls in (at most :data:`MAX_SNAP` back)."""
        lo = max(pos - MAX_SNAP, 0)
        while pos > lo and not text[pos - 1].isspace():
            pos -= 1
        return pos

    def snap_right(self, text: str, pos: int) -> int:
        """``pos``, or the end of the word it falls in (at most :data:`MAX_SNAP` on)."""
        hi = min(pos + MAX_SNAP, len(text))
        while pos < hi and not text[pos].isspace():
            pos += 1
        return pos


#: a line break or tab written as an escape: the NLP engine reads it as whitespace (:mod:`pipeline.pii.nlp`)
ESCAPED_BREAK = re.compile(r"\\[nrt]")


def _lowered(texts: list[str]) -> tuple[str, list[int]]:
    """The lower-cased texts joined by :data:`SEPARATOR` and where each starts (lower-casing may change a
    text's length, so these offsets are their own)."""
    low = [t.lower() for t in texts]
    return SEPARATOR.join(low), list(itertools.accumulate((len(t) + len(SEPARATOR) for t in low), initial=0))


def _texts_with(cue: re.Pattern[str], joined: str, offsets: list[int]) -> list[int]:
    """The indices of the texts in which ``cue`` occurs, by one search per such text over ``joined``."""
    found, pos = [], 0
    while (m := cue.search(joined, pos)) is not None:
        i = bisect.bisect_right(offsets, m.start()) - 1
        found.append(i)
        pos = offsets[i + 1]
    return found


def context_start(text: str, pos: int) -> int:
    """Where the text that Presidio's context enhancer can read for a match at ``pos`` begins: the start of
    the word ``pos`` is in, moved back over :data:`CONTEXT_WORDS` whitespace-separated words that have a
    letter or digit (at most :data:`CONTEXT_LIMIT` characters back)."""
    lo = max(pos - CONTEXT_LIMIT, 0)
    start = pos
    while start > lo and not text[start - 1].isspace():
        start -= 1
    words = 0
    while words < CONTEXT_WORDS and start > lo:
        end = start
        while end > lo and text[end - 1].isspace():
            end -= 1
        start = end
        while start > lo and not text[start - 1].isspace():
            start -= 1
        words += any(c.isalnum() for c in text[start:end])
    return start
