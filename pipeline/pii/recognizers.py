"""Presidio recognizers widened where Presidio's own miss real formats; their validation stays.

On ``shared/corpora/pii`` (``bench/eval_pii.py``) Presidio's own recognizers find 74 % of the credit cards
and 73 % of the phone numbers, and a third of their URLs are not URLs. The misses are formats:

- **Cards.** ``CreditCardRecognizer``'s pattern wants a 1/3/4/5/6 prefix and 13 to 17 digits: it misses
  Mastercard's 2-series (2221-2720, issued since 2017), 19-digit Visa, 15-digit JCB (2131, 1800) and
  12-digit Maestro. :class:`CardRecognizer` adds one pattern for 12 to 19 digits behind a card-network
  prefix (ISO/IEC 7812 issuer ranges); every match must still pass Presidio's Luhn check.
- **Phones.** Presidio accepts a number only when python-phonenumbers calls it *valid* (its digits fall in
  a range the region has assigned) and it is not glued to a letter. Numbers outside today's assigned ranges
  (all of the corpus' Faker numbers, and any number a newer numbering plan added) are missed, and so is a
  number after a literal ``\\n`` escape (``Phone:\\n571 597 466``). :class:`LenientPhoneRecognizer` finds
  *possible* numbers (a length the region allows) of at least :data:`MIN_PHONE_DIGITS` digits. A number
  valid in one of its regions, or written in international format ("+" or "00" and a country code), gets
  Presidio's score (0.4); any other :data:`POSSIBLE_SCORE`, under the stage's threshold: it counts only
  with a phone context word before it, the way Presidio treats every weak pattern.
- **URLs.** Presidio's pattern stops at the first top-level domain it knows: "citadel.biz" gives
  "citadel.bi", the abbreviation "Univ.Prof." gives the URL "Univ.Pro". :class:`HostUrlRecognizer`
  matches to the end of the host name and drops scheme-less matches that read as abbreviations.
- **IBANs.** Under the configuration's case-insensitive matching the IBAN pattern runs on into the next word
  and the checksum of the longer match fails: :class:`IbanGroupsRecognizer`.
- **IP addresses.** :class:`PersonalIpRecognizer` leaves out loopback, unspecified, multicast and reserved
  addresses, and finds an IPv6 address before a clause-ending colon.
"""

from __future__ import annotations

import functools
import ipaddress
import re

import phonenumbers
import regex
import tldextract
from phonenumbers import PhoneMetadata
from presidio_analyzer import EntityRecognizer, Pattern, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    IbanRecognizer,
    IpRecognizer,
    PhoneRecognizer,
    UrlRecognizer,
)

#: 12-19 digits (ISO/IEC 7812 card lengths) starting with an issuer prefix (Visa 4, Mastercard 51-55 and
#: 2221-2720, Amex 34/37, Diners 30/36/38, Discover 6011/644-649/65, JCB 35 and 2131/1800, Maestro 50/56-69,
#: UnionPay 62), written in one block or in groups of four (a short last group for 13-19 digits); Presidio's
#: own pattern keeps covering its 4-3/4-3/4-3/5 groupings. Looser groupings ("55 27 1144-6948") are phone
#: numbers far more often than cards, and so is anything after a "+".
CARD_PATTERN = (r"(?<!\+)\b(?:[456]\d{3}|2[2-7]\d\d|3[0-8]\d\d|1800|2131)"
                r"(?:\d{8,15}|(?:[- ]\d{4}){2,3}(?:[- ]\d{1,3})?)\b")

#: The fewest digits of a phone number: shorter runs (house numbers, postcodes, years) are possible numbers
#: in some regions (python-phonenumbers allows 4-digit German numbers) and rarely phones in running text;
#: a number written with its area code has 7 digits or more (US 3+7, DE 0+2+5, FR 10, GB 10-11).
MIN_PHONE_DIGITS = 7
#: below the stage's 0.4 threshold; Presidio's context enhancer lifts it to at least 0.4 when a phone
#: context word ("phone", "tel", "call", "fax", ...) precedes the number
POSSIBLE_SCORE = 0.3
#: the region whose rules find the candidates: Germany's numbers may have 4 to 15 digits (the ITU E.164
#: maximum), so python-phonenumbers' POSSIBLE test for it accepts any plausible length in national format;
#: "+" numbers are parsed by their own country code whatever the region
MATCH_REGION = "DE"
#: :data:`MIN_PHONE_DIGITS` digits or more, at most four of python-phonenumbers' punctuation characters
#: (``_PUNCTUATION_LIMIT``; all ``\\W`` or ``x``) between two: every match contains such a run
RUN = regex.compile(r"\d(?:[\W_x]{0,4}\d){" + str(MIN_PHONE_DIGITS - 1) + ",}", regex.IGNORECASE)
#: characters around a run the matcher must see, before and after: lead characters ("+", "("), an
#: extension ("ext. 1234" after a space), the ":00" that tells it a timestamp is no phone number
RUN_PAD = (8, 16)


#: tldextract reading only the Public Suffix List snapshot inside its wheel: no suffix-list URLs, no cache
#: (its module-level ``extract``, which Presidio's e-mail recognizer calls, downloads the list at first use)
OFFLINE_TLD = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=(), fallback_to_snapshot=True)


class CardRecognizer(CreditCardRecognizer):
    """Presidio's credit-card recognizer plus :data:`CARD_PATTERN`; Luhn-validated like Presidio's."""

    PATTERNS = [*CreditCardRecognizer.PATTERNS, Pattern("Card (12-19 digits, network prefix)", CARD_PATTERN, 0.3)]

    def validate_result(self, pattern_text: str) -> bool:
        digits = EntityRecognizer.sanitize_value(pattern_text, self.replacement_pairs)
        return 12 <= len(digits) <= 19 and super().validate_result(pattern_text)


#: one group of four of an IBAN: glued to the one before, or after a space or hyphen holding a digit or in
#: upper case ("WEST" in "GB82 WEST 1234"): not a lower-case word ("about")
_IBAN_GROUP = r"(?:[A-Z0-9]{4}|[ -](?:(?-i:[A-Z]{4})|(?=[A-Z0-9]{0,3}\d)[A-Z0-9]{4}))"


class IbanGroupsRecognizer(IbanRecognizer):
    """Presidio's IBAN recognizer and checksum; a spaced group of four must not be a lower-case word.

    Presidio's configuration runs every pattern case-insensitively (which finds "gb42nawi0445..."); its IBAN
    pattern, written for upper case, then takes the next word as one more group ("DE89 3704 0044 0532 0130 00
    about" ends in "abou") and the checksum of that fails, so an IBAN followed by a word was missed."""

    PATTERNS = [Pattern(p.name, p.regex.replace(r"(?:[ -]?[A-Z0-9]{4})", _IBAN_GROUP), p.score)
                for p in IbanRecognizer.PATTERNS]
    assert all(_IBAN_GROUP in p.regex for p in PATTERNS), "Presidio's IBAN regex changed"


def _colon_after(pattern: Pattern) -> Pattern:
    """Presidio's IPv6 pattern, also before a colon that ends a clause ("from 2001:db8::1: refused"); its
    lookahead refuses any ":" after the address."""
    tail = r"(?![\w:]|\.\d)"
    if not pattern.regex.endswith(tail):
        return pattern
    return Pattern(pattern.name, pattern.regex[: -len(tail)] + r"(?:" + tail + r"|(?=:(?:\s|$)))", pattern.score)


class PersonalIpRecognizer(IpRecognizer):
    """Presidio's IP recognizer (its patterns, its ``ipaddress`` check) less the addresses that reach no person
    or host of one: loopback (``127.0.0.1``, ``::1``), unspecified (``0.0.0.0``), multicast, and IPv4's
    reserved 240/4, which holds the broadcast address and the netmasks ``255.255.255.0``. Documentation and
    configuration text is full of these; scrubbing them removes content and protects no one. An IPv6 address
    before a clause-ending colon is found too (:func:`_colon_after`)."""

    PATTERNS = [_colon_after(p) for p in IpRecognizer.PATTERNS]
    assert any(p is not q for p, q in zip(PATTERNS, IpRecognizer.PATTERNS, strict=True)), "IPv6 regex changed"

    def invalidate_result(self, pattern_text: str) -> bool:
        if super().invalidate_result(pattern_text):
            return True
        ip = ipaddress.ip_interface(pattern_text).ip
        return ip.is_loopback or ip.is_unspecified or ip.is_multicast or (ip.version == 4 and ip.is_reserved)


def _whole_label(pattern: str) -> str:
    """Presidio's URL regex with the match running to the end of the host's last label: the pattern stops
    at the first top-level domain of its list, so "citadel.biz" gives "citadel.bi" and "Univ.Prof."
    gives "Univ.Pro"."""
    base = UrlRecognizer.BASE_URL_REGEX
    tail = r"(?:/[^\s()<>\"']*)?)"
    assert base.endswith(tail), "Presidio's URL regex changed"
    return pattern.replace(base, base[: -len(tail)] + r"[a-z0-9\-]*" + tail)


class HostUrlRecognizer(UrlRecognizer):
    """Presidio's URL recognizer, its matches running to the end of the host name. A match without scheme or
    ``www.`` must end in a public suffix (tldextract's bundled Public Suffix List: "citadel.biz" yes,
    "sources.list" and "mdadm.conf" no) and is dropped when it reads as an abbreviation: a title-case
    top-level domain ("Univ.Prof.", "S.Com.", "B.Sc."; hosts are written in lower or upper case) or, without
    a path, one letter before it."""

    PATTERNS = [Pattern(p.name, _whole_label(p.regex), p.score) for p in UrlRecognizer.PATTERNS]

    def invalidate_result(self, pattern_text: str) -> bool:
        url = pattern_text.strip("\"'")
        if "://" in url or url.lower().startswith("www"):
            return False
        host, slash, _ = url.partition("/")
        labels = host.split(".")
        if labels[-1].istitle() or (not slash and len(labels) == 2 and len(labels[0]) == 1):
            return True
        return OFFLINE_TLD(host).suffix == ""


class LenientPhoneRecognizer(PhoneRecognizer):
    """Phone numbers at python-phonenumbers' POSSIBLE leniency, scored by validity in ``supported_regions``.

    Presidio's recognizer runs python-phonenumbers' matcher once per region, parsing every run of digits
    each time. This one runs it once, with :data:`MATCH_REGION`'s rules, and checks each national-format
    match region by region. (The ``pii`` stage gives it only the text around :data:`RUN`.)
    """

    def analyze(self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
                ) -> list[RecognizerResult]:
        results = []
        for match in phonenumbers.PhoneNumberMatcher(text, MATCH_REGION, leniency=phonenumbers.Leniency.POSSIBLE):
            raw = match.raw_string
            if sum(c.isdigit() for c in raw) < MIN_PHONE_DIGITS or _glued_to_letter(text, match.start, match.end):
                continue
            if _international(raw):  # "+" or "00", a country code, a length it allows: a phone number
                region, score = phonenumbers.region_code_for_number(match.number), self.SCORE
            else:
                region = self._valid_region(raw)
                score = self.SCORE if region else POSSIBLE_SCORE
            result = self._get_recognizer_result(match, text, region or MATCH_REGION, nlp_artifacts)
            result.score = score
            results.append(result)
        return EntityRecognizer.remove_duplicates(results)

    def _valid_region(self, raw: str) -> str | None:
        """The first of ``supported_regions`` in which Presidio's own recognizer (python-phonenumbers at VALID
        leniency: an assigned number range, the national prefix where the region requires one) takes ``raw``
        whole. A region is skipped without parsing when the digits cannot be one of its numbers
        (:func:`_may_be_valid`), else a plain parse must say valid, with the national prefix the region
        writes (:func:`_prefix_missing`), before the matcher runs."""
        digits = phonenumbers.normalize_digits_only(raw) if _PLAIN_NUMBER.fullmatch(raw) else None
        for region in self.supported_regions:
            if digits is not None and not _may_be_valid(digits, region):
                continue
            try:
                number = phonenumbers.parse(raw, region)
            except phonenumbers.NumberParseException:
                continue
            if not phonenumbers.is_valid_number(number) or (digits is not None and _prefix_missing(number, digits)):
                continue
            for m in phonenumbers.PhoneNumberMatcher(raw, region, leniency=phonenumbers.Leniency.VALID):
                if m.start == 0 and m.end == len(raw):
                    return region
        return None


#: digits and the separators python-phonenumbers ignores, no extension, no letters
_PLAIN_NUMBER = regex.compile(r"[\d\s().\-/]+")


@functools.cache
def _region_shape(region: str) -> tuple[re.Pattern[str], tuple[str, ...]] | None:
    """The pattern every national number of ``region`` matches and the national prefixes parsing strips,
    when those are plain digit strings ("0", or "0|180020" for GB); None when the region's rules are richer."""
    md = PhoneMetadata.metadata_for_region(region)
    if md is None or md.national_prefix_transform_rule:
        return None
    general = md.general_desc.national_number_pattern if md.general_desc is not None else None
    if general is None:  # no general pattern to check against: as richer rules
        return None
    prefixes = tuple(p for p in (md.national_prefix_for_parsing or "").split("|") if p)
    if not all(p.isdigit() for p in prefixes):
        return None
    return re.compile(general), prefixes


def _prefix_missing(number: phonenumbers.PhoneNumber, digits: str) -> bool:
    """True when the region writes ``number`` with its national prefix ("030 ..." in Germany) and the
    digits as written lack it: VALID leniency rejects that. False when in doubt (a region where some
    formats make the prefix optional)."""
    if number.country_code is None:
        return False
    md = PhoneMetadata.metadata_for_region(phonenumbers.region_code_for_country_code(number.country_code))
    prefix = md.national_prefix if md else None
    if md is None or not prefix or any(f.national_prefix_optional_when_formatting for f in md.number_format):
        return False
    national = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
    return phonenumbers.normalize_digits_only(national).startswith(prefix) and not digits.startswith(prefix)


def _may_be_valid(digits: str, region: str) -> bool:
    """False only when ``digits`` (a number in national format) cannot be valid in ``region``: a valid
    number's national part, with or without a national prefix, matches the region's general pattern."""
    shape = _region_shape(region)
    if shape is None:
        return True
    pattern, prefixes = shape
    return bool(pattern.fullmatch(digits)) or any(
        digits.startswith(p) and pattern.fullmatch(digits[len(p):]) for p in prefixes)


def _international(raw: str) -> bool:
    """Written in international format: "+" or the "00" international prefix (ITU-T E.123) first."""
    head = raw.lstrip("([ ")
    return head.startswith(("+", "\uff0b")) or (head.startswith("00") and not head.startswith("000"))


def _glued_to_letter(text: str, start: int, end: int) -> bool:
    """A Latin letter right before or after the number ("abc8005001234"), as at phonenumbers' VALID
    leniency; a letter that ends a backslash escape (the ``n`` of a literal ``\\n``) is a separator."""
    before = start > 0 and text[start - 1].isascii() and text[start - 1].isalpha()
    if before and start > 1 and text[start - 2] == "\\":
        before = False
    after = end < len(text) and text[end].isascii() and text[end].isalpha()
    return before or after
