"""A Presidio NLP engine that needs no model: words split by a regex, lower-cased words as lemmas.

Presidio's default engine loads the spaCy model ``en_core_web_lg``, which is not installable here. Pattern
recognizers need no NLP, but their context words ("phone", "iban", "ssn" before a match raise its score)
are matched against the *lemmas* of the words around a match: a spaCy blank pipeline has no lemmatizer
(every ``lemma_`` is empty, so no context word would ever match) and Presidio's ``NoOpNlpEngine`` has no
words at all. This engine splits words with :data:`WORD` and uses each one lower-cased as its lemma;
Presidio matches context words as substrings, so "phones" still contains "phone".

Its tokens are plain strings, not a spaCy ``Doc``: Presidio's context enhancer reads only each token's
offset and length, and a spaCy vocabulary keeps every string it has seen, which over a corpus (every phone
number is a new word) grows without bound in a long-running worker. It finds no entities; named entities
come from an optional spaCy pipeline (:mod:`pipeline.pii.ner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import regex
from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngine

#: a word (letters and digits, joined by the in-word punctuation of "e-mail", "555-0100", "o'neil",
#: "x@example.com", "example.com/a") or one punctuation character
WORD = regex.compile(r"[\w]+(?:[-'’.@/:+][\w]+)*|[^\w\s]")
#: a line break or tab written as an escape (``\\n``: text double-escaped on its way through JSON or HTML)
#: separates words like the whitespace it stands for: "Phone:\\n555 0100" has the word "Phone"
_ESCAPED_BREAK = regex.compile(r"\\[nrt]")


class TokenNlpEngine(NlpEngine):
    """Words and lower-cased lemmas, the same rules for every language code in ``languages``."""

    def __init__(self, languages: Iterable[str]):
        self.languages = list(languages)

    def load(self) -> None:
        """Nothing to load."""

    def is_loaded(self) -> bool:
        return True

    def process_text(self, text: str, language: str) -> NlpArtifacts:
        self._check(language)
        words = list(WORD.finditer(_ESCAPED_BREAK.sub("  ", text)))
        tokens = [m.group() for m in words]
        return NlpArtifacts(
            entities=[], tokens=tokens, tokens_indices=[m.start() for m in words],  # type: ignore[arg-type]
            lemmas=[t.lower() for t in tokens], nlp_engine=self, language=language, scores=[],
        )

    def process_batch(
        self, texts: Iterable[str], language: str, batch_size: int = 1, n_process: int = 1, **kwargs: Any
    ) -> Iterator[tuple[str, NlpArtifacts]]:
        for text in texts:
            yield text, self.process_text(text, language)

    def is_stopword(self, word: str, language: str) -> bool:
        """No stop words: context words are nouns ("phone", "card"), never stop words."""
        return False

    def is_punct(self, word: str, language: str) -> bool:
        return not any(c.isalnum() for c in word)

    def get_supported_entities(self) -> list[str]:
        return []

    def get_supported_languages(self) -> list[str]:
        return list(self.languages)

    def _check(self, language: str) -> None:
        if language not in self.languages:
            raise ValueError(f"language {language!r} not configured (have {self.languages})")
