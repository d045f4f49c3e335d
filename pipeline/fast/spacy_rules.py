"""spaCy's tokenizer algorithm on one whitespace-free chunk, in Python: the same tokens, without a ``Doc``.

**Must equal** spaCy's ``Tokenizer`` (``spacy>=3.8,<3.9``) with the same rules. **Fallback**: spaCy itself, the
word chain's last route (:meth:`pipeline.fast.word_chain.WordChain.spacy_tokens`). **Steps aside** (None) where
a run of the tokens found spells a special case that would change them. **Difference test**:
``tests/test_filters_heuristic.py`` (``test_the_rules_port_gives_spacys_tokens_or_steps_aside``), and
``bench/fast_paths.py`` (``words``) on the shared corpora.

Why: the word splitter (:class:`pipeline.filters.text.WordSplitter`) asks spaCy only for chunks it has not seen,
but a web corpus keeps bringing new ones (URLs, code, numbers, words in quotes and brackets), and for each spaCy
builds, around its rules (a handful of regex searches), a ``Doc`` and a lexeme per new string.
:meth:`ChunkRules.split` runs ``Tokenizer._split_affixes`` and ``_attach_tokens`` (spaCy 3.8's
``spacy/tokenizer.pyx``) line for line with the tokenizer's own ``prefix_search``, ``suffix_search``,
``infix_finditer``, ``token_match``, ``url_match`` and special cases, and nothing around them.

What it does not port is spaCy's last pass, ``_apply_special_cases``: a matcher that re-joins tokens which together
spell a special case containing punctuation (``:)``, ``a.m.``); hence the step aside above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Search = Callable[[str], Any]


class ChunkRules:
    """A tokenizer's rules, applied to one chunk at a time."""

    def __init__(self, tokenizer: Any, specials: Mapping[str, tuple[str, ...]]):
        self.prefix_search: Search | None = tokenizer.prefix_search
        self.suffix_search: Search | None = tokenizer.suffix_search
        self.infix_finditer: Search | None = tokenizer.infix_finditer
        self.token_match: Search | None = tokenizer.token_match
        self.url_match: Search | None = tokenizer.url_match
        self.specials = specials
        self.longest_special = max(map(len, specials), default=0)

    def split(self, chunk: str) -> tuple[str, ...] | None:
        """spaCy's tokens of ``chunk`` (no whitespace in it), or None where its special-case matcher could
        change them: ``Tokenizer._split_affixes`` here (``find_prefix`` and ``find_suffix`` are the match's
        length, 0 without one), then :meth:`_attach` on what is left between the affixes."""
        specials = self.specials
        token_match = self.token_match
        prefix_search = self.prefix_search
        suffix_search = self.suffix_search
        string = chunk
        prefixes: list[str] = []
        suffixes: list[str] = []
        last_size = 0
        while string and len(string) != last_size:
            if token_match and token_match(string):
                break
            if string in specials:
                break
            last_size = len(string)
            match = prefix_search(string) if prefix_search else None
            pre_len = match.end() - match.start() if match is not None else 0
            if pre_len:
                prefix = string[:pre_len]
                minus_pre = string[pre_len:]
                if minus_pre and minus_pre in specials:
                    string = minus_pre
                    prefixes.append(prefix)
                    break
            match = suffix_search(string[pre_len:] if pre_len else string) if suffix_search else None
            suf_len = match.end() - match.start() if match is not None else 0
            if suf_len:
                suffix = string[-suf_len:]
                minus_suf = string[:-suf_len]
                if minus_suf and minus_suf in specials:
                    string = minus_suf
                    suffixes.append(suffix)
                    break
            if pre_len and suf_len and pre_len + suf_len <= len(string):
                string = string[pre_len:-suf_len]
                prefixes.append(prefix)
                suffixes.append(suffix)
            elif pre_len:
                string = minus_pre
                prefixes.append(prefix)
            elif suf_len:
                string = minus_suf
                suffixes.append(suffix)
        tokens = prefixes
        if string:
            tokens.extend(self._attach(string))
        tokens.extend(reversed(suffixes))
        if len(tokens) == 1:  # the chunk itself: a special case was handled above, the matcher has no run
            return (tokens[0],)
        return None if self._matcher_may_change(tokens) else tuple(tokens)

    def _attach(self, string: str) -> list[str]:
        """``Tokenizer._attach_tokens`` on what is left between the affixes (not empty): a special case's tokens,
        the string whole (a token or URL match), or its pieces between and at its infixes."""
        special = self.specials.get(string)
        if special is not None:
            return list(special)
        if (self.token_match and self.token_match(string)) or (self.url_match and self.url_match(string)):
            return [string]
        matches = list(self.infix_finditer(string)) if self.infix_finditer else []
        if not matches:
            return [string]
        tokens: list[str] = []
        start = 0
        for match in matches:
            infix_start, infix_end = match.start(), match.end()
            if infix_start == 0:  # start_before_infixes
                continue
            if infix_start != start:
                tokens.append(string[start:infix_start])
            if infix_start != infix_end:
                tokens.append(string[infix_start:infix_end])
            start = infix_end
        if string[start:]:
            tokens.append(string[start:])
        return tokens

    def _matcher_may_change(self, tokens: list[str]) -> bool:
        """Whether spaCy's matcher could change ``tokens``: some run of them (one token or more) spells a special
        case whose own tokens are not that run.

        The matcher replaces a run that spells a special case with the special case's tokens. Where those are the
        run's tokens already (``Bill`` ``'s``: ``'s`` is a special case of one token, ``'s``; ``does`` ``n't`` of
        ``doesn't``), the replacement changes no token, whichever of overlapping matches it picks, so the port's
        answer stands: before, every such chunk (a tenth of the misses, a possessive most often) went to spaCy,
        the costliest path."""
        specials, longest = self.specials, self.longest_special
        for i in range(len(tokens)):
            text = tokens[i]
            special = specials.get(text)
            if special is not None and special != (text,):
                return True
            for j in range(i + 1, len(tokens)):
                text += tokens[j]
                if len(text) > longest:
                    break
                special = specials.get(text)
                if special is not None and special != tuple(tokens[i : j + 1]):
                    return True
        return False
