"""The ``pii`` stage: find PII with Presidio's recognizers, then replace it, annotate it, or drop the document.

``mode: redact`` (default) rewrites the text (each entity by its type's action: ``placeholder``
``<EMAIL_ADDRESS>``, ``hash`` ``<EMAIL_ADDRESS:3fa2c1d9>``, ``keep``; see :mod:`pipeline.pii.actions`);
``mode: annotate`` leaves the text alone. Both write ``meta["pii"] = [{start, end, type, score}]``, offsets
into the text as it entered the stage. ``max_entities: N`` drops a document with more than N entities
(``pii:max_entities``; its copy in ``rejected/`` is redacted too; in annotate mode it is kept and counted as
``would_drop:pii:max_entities``).

Counters: ``entity:<TYPE>`` per entity, ``docs_with_pii``, ``chars_analysed`` (characters inside the
prefilter's candidate windows, all the recognizers read; compare with the characters in); score
``entities`` per document. An SFT document's prompt and
response segments are handled one by one, so the split survives redaction.

Detection (:mod:`pipeline.pii.detector`) runs Presidio's pattern recognizers on candidate windows only, all
text under one language code (:mod:`pipeline.pii.analyzer` says why); ``spacy_model`` adds PERSON/LOCATION
from a spaCy pipeline given by path. Presidio is imported in ``setup``, once per worker.

Default types: those that identify or reach a person (``pipeline.pii.analyzer.DEFAULT_ENTITIES``);
``extra_entities: [DATE_TIME, UUID, URL, MAC_ADDRESS]`` adds generic ones to them, ``entities`` replaces
the whole set.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

import phonenumbers
from pydantic import Field, model_validator

from pipeline.documents import Doc, Drop
from pipeline.pii.prefilter import GATES
from pipeline.pii.spacy_path import check_pipeline
from pipeline.problems import ACROSS_PARAMS, ParamError
from pipeline.secret_fields import REDACTED, Secret
from pipeline.stages.base import Stage, StageParams

Action = Literal["placeholder", "hash", "keep"]
#: entity types a pattern recognizer can find (``pipeline.pii.analyzer.all_entities()``; a test keeps
#: them equal); the names Presidio gives them
PATTERN_ENTITIES = frozenset(GATES) | {"PHONE_NUMBER"}
#: one of :data:`PATTERN_ENTITIES`, listed in the JSON schema (what :meth:`PiiParams._known` accepts)
PatternEntity = Annotated[str, Field(json_schema_extra={"enum": sorted(PATTERN_ENTITIES)})]
#: a region phonenumbers knows, listed in the JSON schema (what :meth:`PiiStage.preflight` accepts)
PhoneRegion = Annotated[str, Field(json_schema_extra={"enum": sorted(phonenumbers.SUPPORTED_REGIONS)})]


class PiiParams(StageParams):
    #: ``redact``: rewrite the text; ``annotate``: only ``meta["pii"]``
    mode: Literal["redact", "annotate"] = "redact"
    #: pattern entity types to find; None: ``pipeline.pii.analyzer.DEFAULT_ENTITIES`` (the types that identify
    #: or reach a person; DATE_TIME, UUID, URL, MAC_ADDRESS, UK_NHS, PL_PESEL, IT_VAT_CODE left out)
    entities: list[PatternEntity] | None = Field(None, min_length=1)
    #: types added to ``entities`` (or to the default set): ``[DATE_TIME, UUID]`` switches those back on
    extra_entities: list[PatternEntity] = Field(default_factory=list)
    #: action per entity type; types not listed get ``default_action``
    actions: dict[str, Action] = Field(default_factory=dict)
    default_action: Action = "placeholder"
    #: secret for ``hash`` (at least 16 bytes, Presidio's rule for its hash operator); never shown
    #: (:mod:`pipeline.secret_fields`)
    salt: Secret = ""
    #: hex digits of the hash kept in the token (8 = 32 bits: a first collision expected after about 90,000
    #: distinct values of one type)
    hash_chars: int = Field(8, ge=4, le=64)
    #: drop a document with more entities than this; None: never
    max_entities: int | None = Field(None, ge=0)
    #: 0.4: Presidio's score for a phone number and its floor for a match with a context word
    #: (``pipeline.pii.detector.SCORE_THRESHOLD``); 0 keeps Presidio's weakest patterns
    score_threshold: float = Field(0.4, ge=0.0, le=1.0)
    #: regions whose national number formats count as valid phone numbers; None: the defaults
    #: (``pipeline.pii.analyzer.PHONE_REGIONS``)
    phone_regions: list[PhoneRegion] | None = Field(None, min_length=1)
    #: a spaCy pipeline directory for named entities (optional; nothing is downloaded)
    spacy_model: str | None = None
    #: Presidio entity types taken from ``spacy_model``
    ner_entities: list[str] = Field(default_factory=lambda: ["PERSON", "LOCATION"], min_length=1)

    @model_validator(mode="after")
    def _known(self) -> PiiParams:
        for field in ("entities", "extra_entities"):
            unknown = sorted(set(getattr(self, field) or ()) - PATTERN_ENTITIES)
            if unknown:
                raise ParamError(field, f"unknown {unknown} (known: {', '.join(sorted(PATTERN_ENTITIES))})")
        known = PATTERN_ENTITIES | set(self.ner_entities)
        if unknown := sorted(set(self.actions) - known):
            raise ParamError("actions", f"unknown entity types {unknown}", ACROSS_PARAMS)  # ner_entities too
        uses_hash = self.default_action == "hash" or "hash" in self.actions.values()
        # REDACTED: a spec sent back as a response showed it, for the stored value (secret_fields.keep_stored)
        if uses_hash and self.salt != REDACTED and len(self.salt.encode()) < 16:
            raise ParamError("salt", "the hash action needs a secret salt of at least 16 bytes", ACROSS_PARAMS)
        return self


class PiiStage(Stage):
    name = "pii"
    Params = PiiParams
    params: PiiParams
    path_params: ClassVar[tuple[str, ...]] = ("spacy_model",)

    _detector: Any = None
    _redactor: Any = None

    def preflight(self) -> None:
        if self.params.phone_regions:
            unknown = sorted(set(self.params.phone_regions) - phonenumbers.SUPPORTED_REGIONS)
            if unknown:
                raise ParamError("phone_regions", f"unknown regions {unknown} (ISO 3166 codes: US, DE, FR, ...)")
        if self.params.spacy_model:
            check_pipeline(self.params.spacy_model)

    def setup(self) -> None:
        # these import Presidio (seconds): once per worker, never to validate a spec
        from pipeline.pii.actions import Redactor
        from pipeline.pii.analyzer import PHONE_REGIONS, default_entities
        from pipeline.pii.detector import PiiDetector

        p = self.params
        entities = p.entities
        if p.extra_entities:
            entities = sorted(set(entities or default_entities()) | set(p.extra_entities))
        self._detector = PiiDetector(
            entities=entities, score_threshold=p.score_threshold, phone_regions=p.phone_regions or PHONE_REGIONS,
            spacy_model=p.spacy_model, ner_entities=p.ner_entities,
        )
        self._redactor = Redactor(p.actions, p.default_action, p.salt, p.hash_chars)

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        if self._detector is None:  # run_batch in a notebook or a test without setup()
            self.setup()
        parts = [_parts(doc) for doc in docs]
        flat = [text for ps in parts for text in ps]
        found = iter(self._detector.detect(flat))
        self.count("chars_analysed", self._detector.chars_analysed)
        for doc, ps in zip(docs, parts, strict=True):
            entities = [next(found) for _ in ps]
            yield self._apply(doc, ps, entities)

    def _apply(self, doc: Doc, parts: list[str], entities: list[list[Any]]) -> Doc | Drop:
        spans, offset = [], 0
        for text, found in zip(parts, entities, strict=True):
            spans += [dict(e.as_meta(), start=e.start + offset, end=e.end + offset) for e in found]
            offset += len(text)
        for s in spans:
            self.count(f"entity:{s['type']}")
        self.observe("entities", float(len(spans)))
        if spans:
            self.count("docs_with_pii")
        meta = doc.get("meta")
        if not isinstance(meta, dict):
            meta = json.loads(meta) if meta else {}
            doc["meta"] = meta
        meta["pii"] = spans
        too_many = self.params.max_entities is not None and len(spans) > self.params.max_entities
        if self.params.mode == "annotate":
            if too_many:
                self.count("would_drop:pii:max_entities")
            return doc
        new = [self._redactor.redact(text, found) for text, found in zip(parts, entities, strict=True)]
        segments = doc.get("segments")
        if segments:
            doc["segments"] = json.dumps([[t, train] for t, (_, train) in zip(new, json.loads(segments), strict=True)],
                                         ensure_ascii=False)
        doc["text"] = "".join(new)
        if too_many:  # redacted first: the copy in rejected/ holds no PII either
            return Drop(doc, "pii:max_entities", {"entities": len(spans)})
        return doc


def _parts(doc: Doc) -> list[str]:
    """The texts to scan: an SFT document's segments one by one (their join is the text), else the text."""
    segments = doc.get("segments")
    if segments:
        return [t for t, _ in json.loads(segments)]
    return [doc["text"]]
