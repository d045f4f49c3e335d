"""Find PII spans in a batch of texts: Presidio's recognizers on the prefilter's windows, plus optional NER.

One :class:`PiiDetector` per worker (it holds the recognizers and a Presidio ``AnalyzerEngine``, built
once). It does what ``AnalyzerEngine.analyze`` does, in the same order and with Presidio's own parts, but
never on text that cannot hold a match:

1. each recognizer runs only on the windows of its gate (:mod:`pipeline.pii.prefilter`), not on the
   whole document, many windows per call (:meth:`PiiDetector._run`); phone numbers last, skipping digits
   already inside a checksum-validated match;
2. Presidio's ``LemmaContextAwareEnhancer`` (short context words as whole words only:
   :class:`~pipeline.pii.analyzer.ShortCueContextEnhancer`) raises the scores of matches with a context word
   among the 5 words before them. Only the words it can look at are split into words
   (:func:`~pipeline.pii.prefilter.context_start`; words never cross whitespace, so they are those of the
   whole text), and only where it can change the score;
3. matches under the score threshold go, then Presidio's ``remove_duplicates``;
4. :func:`resolve` drops the matches that are not of their type (:mod:`pipeline.pii.validity`: an IP
   address is never a phone number, nor an order number, a Unix time or an ISBN), then leaves one entity
   per character, so what is annotated is exactly what is replaced.

``bench/eval_pii.py`` checks that this gives the same spans as ``AnalyzerEngine.analyze`` on whole documents.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Sequence

import regex
from presidio_analyzer import EntityRecognizer, Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.predefined_recognizers import PhoneRecognizer

from pipeline.pii.analyzer import LANGUAGE, PHONE_REGIONS, SHORT_CUE, build_analyzer, build_recognizers
from pipeline.pii.entity import Entity
from pipeline.pii.ner import SpacyNer
from pipeline.pii.prefilter import ESCAPED_BREAK, GATES, STRONG_GATES, Prefilter, Rule, Window, context_start
from pipeline.pii.recognizers import RUN, RUN_PAD
from pipeline.pii.validity import arbitrate

#: between windows read in one recognizer call: a line break (no pattern spans one; the phone matcher's
#: punctuation has none) and an empty line
JOIN = "\n\n"
#: characters of windows per recognizer call (python-phonenumbers' matcher gives up after 65,535 tries)
CALL_CHARS = 64_000
#: Presidio's ``LemmaContextAwareEnhancer.min_score_with_context_similarity`` (0.4) and
#: ``PhoneRecognizer.SCORE`` (0.4): a weak pattern (a bare 9-digit number as US_SSN scores 0.05, a 6-14 digit
#: run as US_DRIVER_LICENSE 0.01) counts only with a context word next to it, a valid phone number always.
#: Presidio's own default, 0, keeps every weak match: on ``bench/eval_pii.py`` precision falls from 0.99 to
#: 0.85 (min recall of the six goal types 0.98 -> 0.99).
SCORE_THRESHOLD = 0.4


class PiiDetector:
    """Pattern recognizers for ``entities`` (None: all defaults) and, given the path of a spaCy pipeline,
    its named entities of the types ``ner_entities``."""

    def __init__(
        self,
        entities: Sequence[str] | None = None,
        score_threshold: float = SCORE_THRESHOLD,
        phone_regions: Sequence[str] = PHONE_REGIONS,
        spacy_model: str | None = None,
        ner_entities: Sequence[str] = ("PERSON", "LOCATION"),
    ):
        self.recognizers = build_recognizers(entities, phone_regions)
        #: the same recognizers in a plain Presidio engine: its NLP engine and context enhancer serve here too
        self.analyzer = build_analyzer(self.recognizers)
        self.entities = sorted({e for r in self.recognizers for e in r.supported_entities})
        self.score_threshold = score_threshold
        #: per recognizer id: a fast regex finding any of its context words, and the exact one (absent: none)
        self._cue_res = {r.id: (re.compile(_cue_regex(r.context)), regex.compile(_exact_cue_regex(r.context)))
                         for r in self.recognizers if r.context}
        rules = self._rules()
        self.prefilter = Prefilter(rules, sorted(set(self.entities) - {r.entity for r in rules}))
        self._by_entity: dict[str, list[EntityRecognizer]] = {}
        for rec in self.recognizers:
            for e in rec.supported_entities:
                self._by_entity.setdefault(e, []).append(rec)
        self.ner = None
        if spacy_model:
            self.ner = SpacyNer(spacy_model, ner_entities)
        #: characters inside some window in the last :meth:`detect` call (what the prefilter let through)
        self.chars_analysed = 0

    def detect(self, texts: Sequence[str]) -> list[list[Entity]]:
        """Non-overlapping entities of each text, in text order."""
        texts = list(texts)
        windows = self.prefilter.windows(texts)
        self.chars_analysed = sum(e - s for ws in windows for s, e in _union(sorted((w.start, w.end) for w in ws)))
        raw: list[list[RecognizerResult]] = [[] for _ in texts]
        jobs: dict[tuple[str, ...], list[tuple[int, Window]]] = {}
        for i, ws in enumerate(windows):
            for w in ws:
                jobs.setdefault(w.entities, []).append((i, w))
        phone_jobs = []
        for entities, items in jobs.items():
            for rec in self._recognizers_for(entities):
                if isinstance(rec[0], PhoneRecognizer):
                    phone_jobs.append((rec, items))
                else:
                    self._run(rec, texts, items, raw)
        # python-phonenumbers is the slow part: it runs last and skips a window whose runs of digits all lie
        # inside a match at score 1.0 (a checksum-validated card or IBAN, an e-mail address): a phone number
        # there would overlap it and lose to it anyway (:func:`resolve` keeps the higher score)
        certain = [_union(sorted((r.start, r.end) for r in rs if r.score >= 1.0)) for rs in raw]
        for rec, items in phone_jobs:
            todo = [(i, w) for i, w in items if not certain[i] or not all(
                _inside(m.start(), m.end(), certain[i]) for m in RUN.finditer(texts[i], w.start, w.end))]
            self._run(rec, texts, todo, raw)
        found = []
        for text, rs in zip(texts, raw, strict=True):
            kept = [r for r in self._with_context(text, rs) if r.score >= self.score_threshold]
            found.append([Entity(r.start, r.end, r.entity_type, r.score)
                          for r in EntityRecognizer.remove_duplicates(kept)])
        if self.ner is not None:
            for spans, ner_spans in zip(found, self.ner.find(texts), strict=True):
                spans.extend(ner_spans)
        return [resolve(spans, text) for text, spans in zip(texts, found, strict=True)]

    def _rules(self) -> list[Rule]:
        """The prefilter's rules: each entity type's gate, narrowed by context words where the threshold allows.

        A pattern recognizer without validation whose best pattern scores under the threshold counts only
        where Presidio's context enhancer lifts a match (to at least 0.4), so only near a context word: its
        gate gets a cue. A recognizer with a few such weak patterns (:data:`STRONG_GATES`) gets the narrower
        gate of its strong patterns, plus its whole gate with a cue.
        """
        rules = []
        for rec in self.recognizers:
            cue = _cue_regex(rec.context) if rec.context else None
            # Presidio's PatternRecognizer.patterns has no declared type
            patterns: list[Pattern] = getattr(rec, "patterns", []) if isinstance(rec, PatternRecognizer) else []
            plain = (isinstance(rec, PatternRecognizer) and bool(patterns)
                     and type(rec).validate_result is PatternRecognizer.validate_result
                     and type(rec).analyze is PatternRecognizer.analyze)
            for e in rec.supported_entities:
                if e == "PHONE_NUMBER":
                    rules.append(Rule(e, RUN.pattern, reach=RUN_PAD))
                elif e not in GATES:
                    continue
                elif plain and cue and max(p.score for p in patterns) < self.score_threshold:
                    rules.append(Rule(e, GATES[e], cue, exact=_exact_cue_regex(rec.context)))
                elif plain and cue and e in STRONG_GATES and STRONG_GATES[e][2] < self.score_threshold:
                    rules += [Rule(e, STRONG_GATES[e][0]), Rule(e, GATES[e], cue, exact=_exact_cue_regex(rec.context))]
                else:
                    rules.append(Rule(e, GATES[e]))
        return rules

    @functools.cache  # noqa: B019 (one detector per worker, a handful of entity tuples)
    def _recognizers_for(self, entities: tuple[str, ...]) -> list[tuple[EntityRecognizer, list[str]]]:
        """The recognizers of ``entities``, each with the entity types asked of it."""
        recs = {id(r): r for e in entities for r in self._by_entity[e]}.values()
        return [(r, [e for e in r.supported_entities if e in entities]) for r in recs]

    def _run(self, rec: tuple[EntityRecognizer, list[str]], texts: list[str], items: list[tuple[int, Window]],
             raw: list[list[RecognizerResult]]) -> None:
        """A recognizer on windows of several texts, appending its results to ``raw[text]`` in text offsets.

        Windows are joined by :data:`JOIN` and read in one call per :data:`CALL_CHARS` characters: Presidio
        spends more on each call than on the regexes of a short window. A window starts and ends next to
        whitespace, and no pattern matches across a line break, so the join changes no match.
        """
        recognizer, entities = rec
        start = 0
        while start < len(items):
            stop, size = start, 0
            while stop < len(items) and (stop == start or size < CALL_CHARS):
                size += items[stop][1].end - items[stop][1].start + len(JOIN)
                stop += 1
            chunk = items[start:stop]
            pieces = [texts[i][w.start : w.end] for i, w in chunk]
            offsets = list(itertools.accumulate((len(p) + len(JOIN) for p in pieces[:-1]), initial=0))
            # no NLP artifacts: these are pattern recognizers, which take None (Presidio's annotation omits it)
            joined = JOIN.join(pieces)
            for r in recognizer.analyze(text=joined, entities=entities, nlp_artifacts=None) or []:  # type: ignore[arg-type]
                k = bisect.bisect_right(offsets, r.start) - 1
                i, w = chunk[k]
                if r.end - offsets[k] > w.end - w.start:  # across a join: impossible for these patterns
                    continue
                r.start, r.end = w.start + r.start - offsets[k], w.start + r.end - offsets[k]
                (r.recognition_metadata or {}).setdefault(RecognizerResult.RECOGNIZER_IDENTIFIER_KEY, recognizer.id)
                raw[i].append(r)
            start = stop

    def _with_context(self, text: str, results: list[RecognizerResult]) -> list[RecognizerResult]:
        """Presidio's context enhancer on the results, tokenizing only the words it can look at.

        Skipped, with the same outcome, where it cannot change a score: a score already at 1.0, or no
        context word of the recognizer in those words (Presidio matches context words as substrings of the
        lower-cased words, so a word absent from the lower-cased text matches nothing). Results whose
        texts overlap share one tokenization.
        """
        out: list[RecognizerResult] = []
        todo: list[tuple[int, int, RecognizerResult]] = []
        for r in results:
            cues = self._cue_res.get(r.recognition_metadata.get(RecognizerResult.RECOGNIZER_IDENTIFIER_KEY))
            if r.score < 1.0 and cues is not None:
                # whole words: the word a match ends in is one of the words searched ("...-Fax")
                lo, hi = context_start(text, r.start), self.prefilter.snap_right(text, r.end)
                low = text[lo:hi].lower()
                if cues[0].search(low) and cues[1].search(ESCAPED_BREAK.sub("  ", low)):
                    todo.append((lo, hi, r))
                    continue
            out.append(r)
        todo.sort(key=lambda t: t[0])
        i = 0
        while i < len(todo):  # runs of overlapping texts: one tokenization each
            lo, hi = todo[i][0], todo[i][1]
            j = i + 1
            while j < len(todo) and todo[j][0] < hi:
                hi = max(hi, todo[j][1])
                j += 1
            group = [r for _, _, r in todo[i:j]]
            for r in group:
                r.start, r.end = r.start - lo, r.end - lo
            snippet = text[lo:hi]
            enhanced = self.analyzer.context_aware_enhancer.enhance_using_context(
                text=snippet, raw_results=group, nlp_artifacts=self.analyzer.nlp_engine.process_text(snippet, LANGUAGE),
                recognizers=self.recognizers,
            )
            for r in enhanced:
                r.start, r.end = r.start + lo, r.end + lo
            out.extend(enhanced)
            i = j
        return out


def _inside(start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    """Whether ``[start, end)`` lies wholly inside one of ``spans`` (sorted, disjoint)."""
    i = bisect.bisect_right(spans, (start, float("inf"))) - 1
    return i >= 0 and end <= spans[i][1]


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans merged where they overlap."""
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _cue_regex(words: list[str]) -> str:
    """A regex finding any of the context ``words`` in lower-cased text, also inside a word: a superset of
    where the context enhancer counts one, and fast (literal alternatives)."""
    return "|".join(re.escape(w.lower()) for w in words)


def _exact_cue_regex(words: list[str]) -> str:
    """A regex (``regex`` module) finding the context ``words`` in lower-cased text where the context enhancer
    (:class:`~pipeline.pii.analyzer.ShortCueContextEnhancer`) can count one: a word of at most
    :data:`~pipeline.pii.analyzer.SHORT_CUE` characters only between non-letters ("tel" in "tel.:", not in
    "hotel"), a longer one anywhere. Slower than :func:`_cue_regex`: for short texts only."""
    return "|".join(re.escape(w.lower()) if len(w) > SHORT_CUE else rf"(?<!\p{{L}}){re.escape(w.lower())}(?!\p{{L}})"
                    for w in words)


def resolve(spans: list[Entity], text: str | None = None) -> list[Entity]:
    """Drop overlaps: a higher score wins, then a longer span, then the earlier one; result in text order.
    Given the ``text``, first drop the spans that are not of their type (:func:`~pipeline.pii.validity.arbitrate`):
    validity decides between readings, the score only between valid ones.

    Presidio only removes a match contained in another of the same type, so a number can come back as both
    PHONE_NUMBER and US_BANK_NUMBER; one entity per character keeps replacement and annotation unambiguous.
    """
    if text is not None:
        spans = arbitrate(text, spans)
    starts: list[int] = []  # the kept spans, sorted by start; they never overlap, so neighbours decide
    kept: list[Entity] = []
    for e in sorted(spans, key=lambda e: (-e.score, -(e.end - e.start), e.start, e.type)):
        if e.end <= e.start:
            continue
        i = bisect.bisect_left(starts, e.start)
        if (i > 0 and kept[i - 1].end > e.start) or (i < len(kept) and kept[i].start < e.end):
            continue
        starts.insert(i, e.start)
        kept.insert(i, e)
    return kept
