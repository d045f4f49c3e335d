"""Named entities (PERSON, LOCATION, ...) from a spaCy pipeline the user supplies by path.

No spaCy English model is on the package registry and nothing may be downloaded at run time, so this mode
runs only when ``spacy_model`` names a pipeline directory (``nlp.to_disk``), e.g. a trained
``en_core_web_*`` unpacked locally or a rule-based ``entity_ruler`` pipeline. Names have no cheap
"gate" like digits or ``@``, so the pipeline reads the whole text: this is the slow part when enabled.
Labels map to Presidio's names with Presidio's own table (PER/PERSON -> PERSON, GPE/LOC -> LOCATION,
ORG -> ORGANIZATION, NORP -> NRP, DATE/TIME -> DATE_TIME); each entity scores 0.85, the default strength
of Presidio's ``SpacyRecognizer``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import spacy
from presidio_analyzer.nlp_engine.ner_model_configuration import MODEL_TO_PRESIDIO_ENTITY_MAPPING

from pipeline.pii.entity import Entity
from pipeline.pii.spacy_path import check_pipeline

#: Presidio's ``SpacyRecognizer`` default ``ner_strength``
NER_SCORE = 0.85
#: texts are cut into pieces of at most this many characters (at whitespace) before spaCy sees them:
#: spaCy refuses texts over ``nlp.max_length`` (1,000,000) and a parser's memory grows with text length
PIECE_CHARS = 100_000


class SpacyNer:
    """A spaCy pipeline loaded once; :meth:`find` gives the entities of the wanted Presidio types."""

    def __init__(self, path: str | Path, entities: Sequence[str]):
        check_pipeline(path)
        self.nlp = spacy.load(path)
        self.entities = set(entities)

    def find(self, texts: Sequence[str]) -> list[list[Entity]]:
        pieces = [(i, offset, piece) for i, t in enumerate(texts) for offset, piece in _pieces(t)]
        out: list[list[Entity]] = [[] for _ in texts]
        # strings spaCy interns while processing are freed when the zone closes: a long-running worker
        # would otherwise keep every word it has seen
        with self.nlp.memory_zone():
            for (i, offset, _), doc in zip(pieces, self.nlp.pipe(p for _, _, p in pieces), strict=True):
                for ent in doc.ents:
                    label = MODEL_TO_PRESIDIO_ENTITY_MAPPING.get(ent.label_, ent.label_)
                    if label in self.entities:
                        out[i].append(Entity(offset + ent.start_char, offset + ent.end_char, label, NER_SCORE))
        return out


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    start = 0
    while len(text) - start > PIECE_CHARS:
        cut = text.rfind(" ", start + PIECE_CHARS // 2, start + PIECE_CHARS)
        cut = cut + 1 if cut > 0 else start + PIECE_CHARS
        yield start, text[start:cut]
        start = cut
    if start < len(text) or not text:
        yield start, text[start:]
