"""Presidio's AnalyzerEngine built offline: its pattern recognizers, one language code for all text.

Presidio's default ``AnalyzerEngine()`` loads the spaCy model ``en_core_web_lg`` (not installable here)
and its e-mail recognizer's tldextract downloads the public-suffix list at first use. This module builds
the engine from Presidio's own recognizer list (``presidio_analyzer/conf/default_recognizers.yaml``: the
recognizers it enables by default, NLP-based ones left out), with :class:`~pipeline.pii.nlp.TokenNlpEngine`
(no model) and an e-mail recognizer that reads tldextract's bundled suffix-list snapshot.

**Languages.** Presidio files each recognizer under one ``supported_language`` and ``analyze(language=)``
runs only those; its default list has credit cards for en/es/it/pl only and phone numbers for en only, so a
German document analysed as ``de`` would find nothing. A pattern (a Luhn-checked card number, an IBAN
checksum, a phone number parsed by python-phonenumbers for a list of regions) does not depend on the language
of the words around it, and a corpus does not come labelled with one. So every recognizer is registered once
under the single code :data:`LANGUAGE` and every document is analysed with it: one pass per document
instead of one per language, no language detection needed, and the context words of all languages (Presidio's
own per-language lists plus :data:`EXTRA_CONTEXT`) apply everywhere. A national-format phone number counts as
valid when it is valid in one of :data:`PHONE_REGIONS`, whatever the text's language.

Four of Presidio's recognizers are widened where they miss real formats (:mod:`pipeline.pii.recognizers`:
cards, phone numbers, URLs, IBANs followed by a word) and the IP recognizer skips loopback and other
addresses of no one; ``build_recognizers(widen=False)`` gives Presidio's own, for comparison. Short context
words count only as whole words (:class:`ShortCueContextEnhancer`).

**Default types** (:data:`DEFAULT_ENTITIES`): what identifies or reaches a person, the point of scrubbing
training data. Generic identifiers that Presidio also finds (DATE_TIME, UUID, MAC_ADDRESS, URL) are off:
dates, UUIDs and URLs fill documentation and code, are almost never personal, and masking them takes
content from the model and, on text with order numbers, versions and timestamps, made most of the false
positives. They stay available through the stage's ``entities`` / ``extra_entities``.
"""

from __future__ import annotations

import os

# torch is installed (for training) and Presidio imports it at import time to pick a device, creating a
# CUDA context on a GPU machine, for transformer models this module never loads: pin it to the CPU first
os.environ.setdefault("PRESIDIO_DEVICE", "cpu")

from collections.abc import Iterable, Sequence  # noqa: E402

import regex  # noqa: E402
from presidio_analyzer import AnalyzerEngine, EntityRecognizer, RecognizerRegistry  # noqa: E402
from presidio_analyzer.context_aware_enhancers import LemmaContextAwareEnhancer  # noqa: E402
from presidio_analyzer.predefined_recognizers import (  # noqa: E402
    CreditCardRecognizer,
    EmailRecognizer,
    IbanRecognizer,
    IpRecognizer,
    PhoneRecognizer,
    SpacyRecognizer,
    UrlRecognizer,
)
from presidio_analyzer.recognizer_registry.recognizers_loader_utils import (  # noqa: E402
    RecognizerConfigurationLoader,
    RecognizerListLoader,
)

from pipeline.pii.nlp import TokenNlpEngine  # noqa: E402
from pipeline.pii.recognizers import (  # noqa: E402
    OFFLINE_TLD,
    CardRecognizer,
    HostUrlRecognizer,
    IbanGroupsRecognizer,
    LenientPhoneRecognizer,
    PersonalIpRecognizer,
)

#: the one language code every recognizer is registered under (spaCy's code for "multi-language")
LANGUAGE = "xx"

#: Presidio's ``PhoneRecognizer.DEFAULT_SUPPORTED_REGIONS`` (US GB DE FR IL IN CA BR) plus the other
#: locales of the evaluation corpus (ES IT NL PL PT): a number in national format ("030 1234567") counts
#: as valid when it is valid in one of them
PHONE_REGIONS: tuple[str, ...] = ("US", "GB", "DE", "FR", "IL", "IN", "CA", "BR", "ES", "IT", "NL", "PL", "PT")

#: context words in the other languages of the corpus (de, fr, es, it, nl, pl, pt), added to Presidio's
#: (English, and Spanish for cards); single words, matched like Presidio's own as substrings of the
#: lower-cased words before an entity ("tel" is the "Tel.:" label of German and French addresses)
EXTRA_CONTEXT: dict[str, list[str]] = {
    "PHONE_NUMBER": ["tel", "telefon", "téléphone", "telefono", "teléfono", "telefone", "telefoon", "handy",
                     "mobil", "portable", "cellulare", "móvil", "celular", "mobiel", "komórka", "rufnummer",
                     "numéro", "número", "nummer", "fax"],
    "IBAN_CODE": ["konto", "bankverbindung", "compte", "cuenta", "conto", "rekening", "rachunek"],
    "CREDIT_CARD": ["karte", "kreditkarte", "carte", "carta", "cartão", "kaart", "karta"],
    "EMAIL_ADDRESS": ["e-mail", "mail", "courriel", "correo", "posta"],
}


#: What tokenmill detects unless a spec says otherwise: the types that identify or reach a person.
#: Contact (e-mail, phone), money (card, IBAN, US bank account, crypto wallet), the connection (IP address),
#: national and professional ids (US SSN, ITIN, passport, driver licence; DEA number; Spanish NIF/NIE;
#: Italian fiscal code, identity card, passport, driver licence). Left out: generic identifiers (DATE_TIME,
#: UUID, MAC_ADDRESS, URL: see the module doc) and ids checked only by a checksum over a bare run of digits,
#: which one random number in ten or eleven passes (UK_NHS, PL_PESEL, IT_VAT_CODE: on ``bench/eval_pii.py``
#: every UK_NHS span was a phone number, US numbers being written 3-3-4 like NHS numbers).
DEFAULT_ENTITIES: tuple[str, ...] = (
    "EMAIL_ADDRESS", "PHONE_NUMBER",
    "CREDIT_CARD", "IBAN_CODE", "US_BANK_NUMBER", "CRYPTO",
    "IP_ADDRESS",
    "US_SSN", "US_ITIN", "US_PASSPORT", "US_DRIVER_LICENSE", "MEDICAL_LICENSE",
    "ES_NIF", "ES_NIE", "IT_FISCAL_CODE", "IT_IDENTITY_CARD", "IT_PASSPORT", "IT_DRIVER_LICENSE",
)
#: context words this short must be a whole word, or a whole part of one between non-letters ("tel-nr",
#: "ip-adresse", "0301234567-fax"); Presidio matches every context word as a substring, so "us" (passport)
#: was found in "use" and "status", "lic" (driver licence) in "public", "tel" (phone) in "hotel", "tin"
#: (ITIN) in "setting", "cie" (Italian identity card) in "science". Longer words keep substring matching:
#: German compounds ("Telefonnummer", "Kontonummer") hold their cue inside.
SHORT_CUE = 3
_NOT_LETTERS = regex.compile(r"[^\p{L}]+")


class ShortCueContextEnhancer(LemmaContextAwareEnhancer):
    """Presidio's context enhancer; a context word of at most :data:`SHORT_CUE` characters counts only as a
    whole word or word part (Presidio's ``whole_word`` mode, per part), a longer one also inside a word (its
    ``substring`` mode)."""

    @staticmethod
    def _find_supportive_word_in_context(context_list: list[str], recognizer_context_list: list[str],
                                         matching_mode: str = "substring") -> str:
        words = [w.lower() for w in context_list or ()]
        for cue in recognizer_context_list or ():
            c = cue.lower()
            for w in words:
                if c in w and (len(c) > SHORT_CUE or c in _NOT_LETTERS.split(w)):
                    return cue
        return ""


def presidio_recognizers() -> list[tuple[EntityRecognizer, frozenset[str]]]:
    """One instance of each recognizer Presidio enables by default (NLP-based ones excluded), with the
    languages Presidio's configuration registers it for."""
    conf = RecognizerConfigurationLoader.get()
    languages: set[str] = set()
    for rec in conf["recognizers"]:
        if isinstance(rec, dict) and rec.get("enabled", True):
            languages.update(x if isinstance(x, str) else x["language"] for x in rec.get("supported_languages") or [])
    loaded = RecognizerListLoader.get(conf["recognizers"], sorted(languages), conf["global_regex_flags"])
    by_class: dict[type, EntityRecognizer] = {}
    contexts: dict[type, list[str]] = {}
    langs: dict[type, set[str]] = {}
    for rec in loaded:
        if isinstance(rec, SpacyRecognizer):
            continue
        by_class.setdefault(type(rec), rec)
        langs.setdefault(type(rec), set()).add(rec.supported_language)
        ctx = contexts.setdefault(type(rec), [])
        ctx.extend(w.strip() for w in rec.context or [] if w.strip() and w.strip() not in ctx)
    for cls, rec in by_class.items():
        rec.context = contexts[cls]
    return [(rec, frozenset(langs[cls])) for cls, rec in by_class.items()]


def default_entities() -> list[str]:
    """What tokenmill detects unless told otherwise: :data:`DEFAULT_ENTITIES`, sorted."""
    return sorted(DEFAULT_ENTITIES)


def presidio_default_entities(recognizers: list[tuple[EntityRecognizer, frozenset[str]]] | None = None
                              ) -> list[str]:
    """What plain Presidio detects in English text: the entity types of its recognizers for English (the
    language-agnostic ones included). For comparison in ``bench/eval_pii.py``."""
    recognizers = presidio_recognizers() if recognizers is None else recognizers
    return sorted({e for rec, langs in recognizers if "en" in langs for e in rec.supported_entities})


def all_entities() -> list[str]:
    """Every entity type a pattern recognizer of Presidio's default list can detect (``entities`` choices)."""
    return sorted({e for rec, _ in presidio_recognizers() for e in rec.supported_entities})


def build_recognizers(entities: Iterable[str] | None = None, phone_regions: Sequence[str] = PHONE_REGIONS,
                      widen: bool = True) -> list[EntityRecognizer]:
    """Presidio's pattern recognizers for ``entities`` (None: :func:`default_entities`) under
    :data:`LANGUAGE`, offline.

    ``widen``: credit cards, phone numbers, URLs and IP addresses by :mod:`pipeline.pii.recognizers`
    (default), else by Presidio's own recognizers with their default settings (for comparison;
    ``phone_regions`` unused).
    """
    presidio = presidio_recognizers()
    wanted = set(default_entities() if entities is None else entities)
    out = []
    for rec, _ in presidio:
        if not wanted.intersection(rec.supported_entities):
            continue
        if isinstance(rec, EmailRecognizer):
            rec = OfflineEmailRecognizer(supported_language=LANGUAGE, context=rec.context)
        elif widen and isinstance(rec, CreditCardRecognizer):
            rec = CardRecognizer(supported_language=LANGUAGE, context=rec.context)
        elif widen and isinstance(rec, IpRecognizer):
            rec = PersonalIpRecognizer(supported_language=LANGUAGE, context=rec.context)
        elif widen and isinstance(rec, IbanRecognizer):
            rec = IbanGroupsRecognizer(supported_language=LANGUAGE, context=rec.context,
                                       regex_flags=rec.global_regex_flags or 0)
        elif widen and isinstance(rec, UrlRecognizer):
            rec = HostUrlRecognizer(supported_language=LANGUAGE, context=rec.context)
        elif widen and isinstance(rec, PhoneRecognizer):
            rec = LenientPhoneRecognizer(supported_language=LANGUAGE, context=rec.context,
                                         supported_regions=tuple(phone_regions))
        rec.supported_language = LANGUAGE
        extra = [w for e in rec.supported_entities for w in EXTRA_CONTEXT.get(e, []) if w not in (rec.context or [])]
        rec.context = list(rec.context or []) + extra
        out.append(rec)
    missing = wanted - {e for r in out for e in r.supported_entities}
    if missing:
        known = sorted({e for rec, _ in presidio for e in rec.supported_entities})
        raise ValueError(f"no Presidio pattern recognizer for {sorted(missing)} (known: {', '.join(known)})")
    return out


def build_analyzer(recognizers: list[EntityRecognizer] | None = None, short_cues: bool = True) -> AnalyzerEngine:
    """A Presidio ``AnalyzerEngine`` on ``recognizers`` (default: :func:`build_recognizers`), no model, offline;
    ``short_cues``: short context words must be whole words (:class:`ShortCueContextEnhancer`), else
    Presidio's own enhancer (for comparison)."""
    recognizers = build_recognizers() if recognizers is None else recognizers
    registry = RecognizerRegistry(recognizers=recognizers, supported_languages=[LANGUAGE])
    enhancer = ShortCueContextEnhancer() if short_cues else LemmaContextAwareEnhancer()
    return AnalyzerEngine(registry=registry, nlp_engine=TokenNlpEngine([LANGUAGE]), supported_languages=[LANGUAGE],
                          context_aware_enhancer=enhancer)


class OfflineEmailRecognizer(EmailRecognizer):
    """Presidio's e-mail recognizer; the domain check reads tldextract's bundled public-suffix snapshot.

    Presidio calls the module-level ``tldextract.extract``, which fetches the list from publicsuffix.org at
    first use (a network call in every fresh worker, a delay and a traceback offline).
    """

    _extract = OFFLINE_TLD

    def validate_result(self, pattern_text: str) -> bool:
        return self._extract(pattern_text).fqdn != ""
