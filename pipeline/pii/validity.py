"""What a candidate span *is*, decided from its text and the text around it before overlaps go by score.

Presidio resolves a conflict between recognizers by score: "10.237.66.205" after the word "hotel" (it
contains the phone cue "tel") scores 0.65 as a phone number and 0.6 as an IP address, so the address came
back as PHONE_NUMBER. python-phonenumbers finds a possible number in any run of 7 digits or more, and the
weak US patterns (a bank account is 8-17 digits) take any number near a context word, so order numbers,
Unix times and bug ids became phone numbers and bank accounts. A score says how sure one recognizer is,
not which reading is right; here validity decides first (:func:`arbitrate`), the score only between valid
readings:

- a string that is a valid IPv4/IPv6 address (stdlib :mod:`ipaddress`) is never a phone number;
- a number (:data:`NUMBER_TYPES`: phone, SSN, ITIN, bank account, passport, driver licence, DEA number) is
  none of these when it is part of an identifier: inside a word, glued to an alphanumeric by ``-``, ``_``,
  ``/``, ``.``, ``=`` (``ORD-2021-004512``, ``CVE-2021-44228``, the last group of a UUID, ``ISBN
  362-74-9114-9``), after ``#`` or a colon that follows no word (``#1234567``, ``:8080``), or right after an
  identifier word (:data:`ID_WORDS`: ``bug 1234567``, ``Invoice No. 88213457``); nor when it is a Unix time
  (:func:`is_epoch`), an ISBN-13 or hyphenated ISBN-10 with a valid check digit (:func:`is_isbn`), a
  calendar date (:func:`is_date`), a dotted version or OID (:func:`is_dotted_version`), a quantity (a unit
  after it: ``2147483648 bytes``) or an amount (a currency sign before it). A match that joins two things
  across ``/``, ``,`` or a spaced dash is judged piece by piece. A label word of a type right before the
  number (:data:`LABEL_WORDS`: ``Tel.030 1234567``, ``Phone #212-555-0199``) lifts the identifier rules
  that look before it, not the others;
- a phone number is not written 3-2-4 (``536-90-4399``, the SSN's shape) nor 5-3 (a Brazilian postcode):
  no region of the default list groups its numbers so;
- between two number readings of the same digits, one that holds the other and more wins ("+31 6
  12094043" over its "12094043" as a bank account), then the one a label right before names;
- a card, IBAN or other pattern match that starts or ends inside a word or an identifier (a DEA number
  ``AB1234563`` inside a hash, a Luhn-valid UUID group) is a piece of something else, and a card number
  right after an identifier word (``commit 581185966388``) is that identifier;
- an IP_ADDRESS candidate is no address when it is a version (``version 1.2.3.4``) or one part of a longer
  dotted number (an SNMP OID ``1.3.6.1.4.1``); addresses that reach no person (loopback, unspecified,
  multicast, reserved) are left out by :class:`~pipeline.pii.recognizers.PersonalIpRecognizer`.

A plain dotted quad stays an IP address: ``1.2.3.4`` without a version word is indistinguishable from an
address, and leaving an address in training data costs more than masking a version string. A bare 10-digit
number that passes an ISBN-10 checksum stays a phone number unless an ``ISBN`` label precedes it (one
number in eleven passes). Rules only remove readings; what is left is resolved by score (``resolve``).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable

import regex

from pipeline.pii.entity import Entity
from pipeline.pii.prefilter import ESCAPED_BREAK

#: types whose value is a run of digits (with separators) that a recognizer takes by its shape: an
#: identifier, a time or a quantity is none of them
NUMBER_TYPES = frozenset({"PHONE_NUMBER", "US_SSN", "US_ITIN", "US_BANK_NUMBER", "US_PASSPORT", "US_DRIVER_LICENSE",
                          "MEDICAL_LICENSE", "IT_DRIVER_LICENSE", "IT_IDENTITY_CARD", "IT_PASSPORT", "IT_VAT_CODE",
                          "UK_NHS", "PL_PESEL"})
#: types matched by a pattern of their own whose text may touch anything (an e-mail address after "mailto:",
#: a URL's path), generic identifiers, and named entities; every other pattern type must not start or end
#: inside a word or an identifier
FREE_TYPES = frozenset({"EMAIL_ADDRESS", "URL", "PERSON", "LOCATION", "ORGANIZATION", "NRP", "DATE_TIME", "UUID",
                        "MAC_ADDRESS"})

#: words that label what follows as an identifier or a measure (lower case; English first, then the other
#: languages of the corpus). "id" counts too: "Order ID 2125550199".
ID_WORDS = frozenset({
    "order", "orders", "ord", "invoice", "inv", "bug", "bugs", "issue", "issues", "ticket", "tickets", "case",
    "incident", "pr", "mr", "pull", "commit", "rev", "revision", "changeset", "build", "version", "ver",
    "release", "patch", "isbn", "issn", "doi", "pmid", "cve", "cwe", "ghsa", "kb", "job", "task", "transaction",
    "txn", "tracking", "shipment", "parcel", "receipt", "po", "sku", "item", "part", "serial", "sn", "ref",
    "reference", "confirmation", "booking", "reservation", "id", "uid", "pid", "gid", "ticketid", "orderid",
    "sha", "md5", "hash", "checksum", "crc", "uuid", "guid", "seed", "ts", "timestamp", "epoch", "unixtime",
    "mtime", "ctime", "atime", "size", "length", "offset", "count", "port", "inode", "lba", "sector", "kernel",
    "firmware", "bestellung", "bestellnummer", "rechnung", "rechnungsnummer", "auftrag", "commande", "facture",
    "pedido", "factura", "ordine", "fattura", "bestelling", "factuur", "zamówienie", "faktura", "encomenda", "fatura",
})
#: words between a label and its number ("Invoice No. 88213457", "Phone number is 030 ...")
FILLER_WORDS = frozenset({"n", "no", "nr", "num", "number", "nummer", "numéro", "número", "numero",
                          "is", "was", "ist", "est", "es", "è", "e"})
#: words that label a number as one of the type right before it (whole words, lower case); they override
#: the identifier rules ("Phone #212-555-0199", "Tel.030 1234567"). Nouns only: "call #5554656615" is a
#: ticket.
LABEL_WORDS: dict[str, frozenset[str]] = {
    "PHONE_NUMBER": frozenset({
        "phone", "telephone", "tel", "tele", "fax", "mobile", "mob", "cell", "cellphone", "handy",
        "mobil", "telefon", "téléphone", "telefono", "teléfono", "telefone", "telefoon", "portable",
        "cellulare", "móvil", "celular", "mobiel", "komórka", "rufnummer", "whatsapp", "sms"}),
    "US_SSN": frozenset({"ssn", "ssns", "social", "security"}),
    "US_ITIN": frozenset({"itin", "tin", "taxpayer"}),
    "US_BANK_NUMBER": frozenset({"account", "acct", "bank", "konto", "kontonummer"}),
    "US_PASSPORT": frozenset({"passport"}),
    "US_DRIVER_LICENSE": frozenset({"license", "licence", "lic", "dl", "driver"}),
    "MEDICAL_LICENSE": frozenset({"dea"}),
    "CREDIT_CARD": frozenset({"card", "cc", "visa", "mastercard", "amex", "karte", "carte", "tarjeta", "carta"}),
}
#: a word right after a number that makes it a quantity (lower case)
UNITS = frozenset({
    "b", "byte", "bytes", "kb", "kib", "mb", "mib", "gb", "gib", "tb", "tib", "bit", "bits", "kbit", "mbit",
    "ms", "ns", "us", "µs", "s", "sec", "secs", "second", "seconds", "min", "mins", "minutes", "hours",
    "rows", "records", "tokens", "items", "lines", "words", "chars", "characters", "px", "hz", "khz", "mhz",
    "ghz", "users", "requests", "entries", "files", "pages", "steps", "samples", "parameters", "params",
    "times", "cycles", "blocks", "sectors", "packets", "iterations", "downloads", "views",
})
#: words before a dotted quad that make it a version number, not an address
VERSION_WORDS = frozenset({"version", "versions", "ver", "v", "release", "build", "rev", "revision", "patch",
                           "firmware", "kernel"})

#: glue between an identifier's parts ("ORD-2021", "id=12", "issue#1", "/orders/12", "x.1234567")
_GLUE = "#-_/.="
_CURRENCY = "$€£¥₹"
_NEXT_WORD = regex.compile(r"[ \t]*([\p{L}µ]+)")
#: the rest of a token after a number ("-rc.3", "-Office"): stops at whitespace and at a backslash escape
_TOKEN_REST = regex.compile(r"[\w.#=/-]*")
#: a token that ends in a word: letters, then at most a "-13" and punctuation ("ISBN-13:", "Nr.", "Tel./Fax")
_LABEL = regex.compile(r"([\p{L}\p{M}]+)(?:-\d{1,2})?[\W_]*$")
#: where a match may join two things: a slash, a dash between spaces ("22:56:49 / 9784932705660")
_JOIN = regex.compile(r"\s*/\s*|\s+-\s+|[,;]\s*")
_SPACED_JOIN = regex.compile(r"\s/\s|\s-\s|[,;]")
#: a line break or tab written as an escape (text double-escaped through JSON): whitespace between words
_IP_CHARS = frozenset("0123456789abcdefABCDEF:.%")
_IP_RUN = regex.compile(r"[0-9A-Fa-f:.%]+")
_DATES = (
    regex.compile(r"(?P<y>\d{4})(?P<s>[-/.])(?P<m>\d{1,2})(?P=s)(?P<d>\d{1,2})"),
    regex.compile(r"(?P<d>\d{1,2})(?P<s>[-/.])(?P<m>\d{1,2})(?P=s)(?P<y>\d{4})"),
    regex.compile(r"(?P<m>\d{1,2})(?P<s>[-/.])(?P<d>\d{1,2})(?P=s)(?P<y>\d{4})"),
    regex.compile(r"(?P<y>(?:19|20)\d\d)(?P<m>\d\d)(?P<d>\d\d)"),
)
_EPOCH = regex.compile(r"1\d{9}(?:\d{3}|\d{6}|\d{9})?(?:\.\d+)?")
_SSN_SHAPE = regex.compile(r"\d{3}([-. ])\d\d\1\d{4}")
#: a Brazilian postcode (CEP, "09061-981"); Brazilian phone numbers are written 4-4 or 5-4
_CEP = regex.compile(r"\d{5}-\d{3}")
#: how far back the words before a number are read
_LOOK_BACK = 48


def arbitrate(text: str, spans: Iterable[Entity]) -> list[Entity]:
    """``spans`` less those whose text is not of their type here (:func:`why_not`), then less the numbers that
    another reading of the same digits wins (:func:`_other_reading`); overlaps are left to ``resolve``."""
    valid = [e for e in spans if why_not(text, e.start, e.end, e.type) is None]
    numbers = [e for e in valid if e.type in NUMBER_TYPES]
    if len(numbers) < 2:
        return valid
    return [e for e in valid if e.type not in NUMBER_TYPES or not _other_reading(text, e, numbers)]


def _other_reading(text: str, e: Entity, numbers: list[Entity]) -> bool:
    """Whether a number of another type reads the digits of ``e`` better: one that holds ``e`` and more
    ("+31 6 12094043" over its "12094043" as a bank account), or one of the type that a label right before
    ``e`` names ("driver's license number is 2270-66-1551": a driver licence, not a phone number)."""
    others = [o for o in numbers if o.type != e.type and o.start < e.end and e.start < o.end]
    if any(o.start <= e.start and e.end <= o.end and o.end - o.start > e.end - e.start for o in others):
        return True
    label = _label(_words_before(text, e.start))
    return label not in (None, e.type) and any(o.type == label and o.end - o.start >= e.end - e.start
                                               for o in others)


def why_not(text: str, start: int, end: int, entity_type: str) -> str | None:
    """Why ``text[start:end]`` is no ``entity_type`` here (a short reason), or None when nothing says so."""
    if entity_type == "IP_ADDRESS":
        return not_ip(text, start, end)
    if entity_type in NUMBER_TYPES:
        return not_number(text, start, end, entity_type)
    if entity_type in FREE_TYPES:
        return None
    if _inside_word(text, start, end) or _glued_after(text, end) or _glued_before(text, start, strict=False):
        return "identifier"
    if entity_type == "CREDIT_CARD":
        words = _words_before(text, start)
        if _id_word(words) and _label(words) != entity_type:
            return "identifier"  # "commit 581185966388" passes Luhn
    return None


def not_number(text: str, start: int, end: int, entity_type: str = "PHONE_NUMBER") -> str | None:
    """Why ``text[start:end]`` is no number of ``entity_type`` ("ip", "identifier", "epoch", "isbn", "date",
    "version", "ssn shape", "quantity", "amount"), or None."""
    if _ip_overlaps(text, start, end):
        return "ip"
    if _inside_word(text, start, end) or _glued_after(text, end):
        return "identifier"
    words = _words_before(text, start)
    if _label(words) is None and (_glued_before(text, start) or _id_word(words)):
        return "identifier"
    if is_isbn(_isbn_token(text, start, end)):
        return "isbn"
    value = text[start:end].strip()
    pieces = _JOIN.split(value)
    if len(pieces) > 1:  # a match across a join: each side must be a number of its own
        for piece in pieces:
            if why := _not_number_value(piece, entity_type):
                return why
            if sum(c.isdigit() for c in piece) < 3 and _SPACED_JOIN.search(value):
                return "fragment"
    if why := _not_number_value(value, entity_type):
        return why
    if _unit_after(text, end):
        return "quantity"
    if _currency_before(text, start):
        return "amount"
    return None


def _not_number_value(value: str, entity_type: str) -> str | None:
    """What ``value`` alone says it is instead: "identifier", "epoch", "isbn", "date", "version", "ssn shape",
    or None."""
    if value.startswith("#"):
        return "identifier"
    if is_epoch(value):
        return "epoch"
    if is_isbn(value):
        return "isbn"
    if is_date(value):
        return "date"
    if is_dotted_version(value):
        return "version"
    if entity_type == "PHONE_NUMBER" and _SSN_SHAPE.fullmatch(value):
        return "ssn shape"
    if entity_type == "PHONE_NUMBER" and _CEP.fullmatch(value):
        return "postcode"
    return None


def not_ip(text: str, start: int, end: int) -> str | None:
    """Why ``text[start:end]`` (an address by its form) is no IP address here ("version", "dotted number"),
    or None."""
    if (start >= 2 and text[start - 1] == "." and text[start - 2].isdigit()) or (
            end + 1 < len(text) and text[end] == "." and text[end + 1].isdigit()):
        return "dotted number"
    words = _words_before(text, start)
    if words and words[-1] in VERSION_WORDS:
        return "version"
    return None


def ip_at(text: str, start: int, end: int) -> bool:
    """Whether the characters of an address around ``text[start:end]`` form a valid IPv4 or IPv6 address
    (a trailing sentence dot or colon and a ``:port`` after an IPv4 address allowed)."""
    lo, hi = start, end
    while lo > 0 and text[lo - 1] in _IP_CHARS:
        lo -= 1
    while hi < len(text) and text[hi] in _IP_CHARS:
        hi += 1
    return _is_ip(text[lo:hi])


def _ip_overlaps(text: str, start: int, end: int) -> bool:
    """Whether a valid IP address (:func:`ip_at`) overlaps ``text[start:end]`` ("10.237.66.205", or the
    "165.63.246.42" of "165.63.246.42 / 14")."""
    if not any(c in ".:" for c in text[start:end]):
        return False
    lo, hi = start, end
    while lo > 0 and text[lo - 1] in _IP_CHARS:
        lo -= 1
    while hi < len(text) and text[hi] in _IP_CHARS:
        hi += 1
    return any(_is_ip(m.group()) for m in _IP_RUN.finditer(text, lo, hi))


def _is_ip(token: str) -> bool:
    token = token.strip(".:")
    candidates = [token]
    if token.count(":") == 1:  # IPv4:port
        candidates.append(token.split(":")[0])
    for c in candidates:
        if any(x in c for x in ".:"):
            try:
                ipaddress.ip_address(c)
            except ValueError:
                continue
            return True
    return False


def is_epoch(value: str) -> bool:
    """A Unix time from 2001-09-09 to 2033-05-18 written as one run of digits: seconds (10 digits),
    milliseconds, microseconds or nanoseconds (13, 16, 19), or seconds with a fraction. No NANP number starts
    with 1; of the default phone regions only Brazil (area codes 11-19) writes 10-digit numbers starting
    with 1, and those are found when written with any separator ("(16) 3831-6800")."""
    return bool(_EPOCH.fullmatch(value))


def is_isbn(token: str) -> bool:
    """An ISBN-13 (978/979, check digit valid; hyphens or spaces optional) or a hyphenated ISBN-10 (four
    groups, the last the check character) with a valid check digit."""
    digits = token.replace("-", "").replace(" ", "")
    if len(digits) == 13 and digits.isdigit() and digits.startswith(("978", "979")):
        return sum(int(c) * (3 if i % 2 else 1) for i, c in enumerate(digits)) % 10 == 0
    groups = token.split("-")
    if len(digits) == 10 and len(groups) == 4 and len(groups[-1]) == 1 and digits[:9].isdigit():
        check = 10 if digits[9] in "xX" else int(digits[9]) if digits[9].isdigit() else -1
        return check >= 0 and (sum(int(c) * (10 - i) for i, c in enumerate(digits[:9])) + check) % 11 == 0
    return False


def is_date(value: str) -> bool:
    """A calendar date written with digits: y-m-d, d.m.y, m/d/y (one separator throughout), or yyyymmdd."""
    for pattern in _DATES:
        m = pattern.fullmatch(value)
        if m is None:
            continue
        try:
            datetime.date(int(m["y"]), int(m["m"]), int(m["d"]))
        except ValueError:
            continue
        return True
    return False


def is_dotted_version(value: str) -> bool:
    """Numbers joined by dots only that read as a version or an OID: three groups of at most 8 digits in all,
    the first not starting with 0 ("14.56.370"), or six groups or more, or two of one digit ("1.3.6.1.4.1.311",
    "4.1.0.12"). A phone number written with dots starts with its trunk prefix 0 ("030.1234.567") or has
    more digits ("212.555.0199"), at most five groups and at most one of one digit ("01.44.98.69.09",
    "1.800.555.0199")."""
    groups = value.split(".")
    if len(groups) < 3 or not all(g.isdigit() for g in groups):
        return False
    if len(groups) == 3:
        return not groups[0].startswith("0") and len(value) - 2 <= 8
    return len(groups) >= 6 or sum(len(g) == 1 for g in groups) >= 2


def _words_before(text: str, start: int) -> list[str]:
    """The whitespace-separated tokens in the :data:`_LOOK_BACK` characters before ``start``, lower case, each
    as the word it ends in (:data:`_LABEL`: "ISBN-13:" -> "isbn", "Tel./Fax" -> "fax"); one that ends in a
    value as "" ("CWE-175": labels stop there); one of punctuation only is skipped ("|", "—", "#")."""
    lo = max(0, start - _LOOK_BACK)
    tokens = ESCAPED_BREAK.sub("  ", text[lo:start]).split()
    if tokens and lo > 0 and not text[lo - 1].isspace():
        tokens = tokens[1:]  # cut by the look-back: not a whole token
    out = []
    for t in tokens:
        m = _LABEL.search(t)
        if m:
            out.append(m.group(1).lower())
        elif any(c.isalnum() for c in t):  # a value ("CWE-175", "2021"): labels stop there
            out.append("")
    return out


def _id_word(words: list[str]) -> bool:
    """Whether the last word before the number, after at most two :data:`FILLER_WORDS`, is an ID word."""
    for w in reversed(words[-3:]):
        if w in ID_WORDS:
            return True
        if w not in FILLER_WORDS:
            return False
    return False


def _label(words: list[str]) -> str | None:
    """The type whose label word (:data:`LABEL_WORDS`) comes right before the number, after at most two filler
    words ("Phone #", "Tel. Nr.", "card number is"), or None."""
    for w in reversed(words[-3:]):
        for entity_type, labels in LABEL_WORDS.items():
            if w in labels:
                return entity_type
        if w.startswith(("telefon", "phone")):
            return "PHONE_NUMBER"
        if w not in FILLER_WORDS:
            return None
    return None


def _inside_word(text: str, start: int, end: int) -> bool:
    """An ASCII letter or digit right before or after the span ("abc8005001234", "AB1234563" in a hash); the
    letter that ends a backslash escape (the ``n`` of a literal ``\\n``) is a separator. Other scripts are
    not checked: Chinese and Japanese write numbers right after words."""
    before = start > 0 and text[start - 1].isascii() and text[start - 1].isalnum()
    if before and start > 1 and text[start - 2] == "\\" and text[start - 1] in "nrt":
        before = False
    after = end < len(text) and text[end].isascii() and text[end].isalnum()
    return before or after


def _glued_before(text: str, start: int, strict: bool = True) -> bool:
    """An identifier's glue right before the number with a letter or digit beyond it ("ORD-", "id=",
    "/orders/"); ``strict`` also ``#`` ("#1234567") and a colon not after a word (a port ":8080", the seconds
    of "22:56:49"; not "Fax:")."""
    if start >= 2 and text[start - 1] in _GLUE and text[start - 2].isalnum():
        return True
    if strict and start >= 1 and text[start - 1] == "#":
        return True
    return strict and start >= 1 and text[start - 1] == ":" and (start < 2 or not text[start - 2].isalpha())


def _glued_after(text: str, end: int) -> bool:
    """Glue right after the number followed by the rest of a token that holds a digit ("-rc.3", "-7",
    "-c3f1-..."), not a label ("-Office")."""
    if end + 1 < len(text) and text[end] in _GLUE and text[end + 1].isalnum():
        rest = _TOKEN_REST.match(text, end).group()
        return any(c.isdigit() for c in rest)
    return False


def _isbn_token(text: str, start: int, end: int) -> str:
    """The run of digits and hyphens around the span, with a trailing ISBN check character ``X``."""
    lo, hi = start, end
    while lo > 0 and (text[lo - 1].isdigit() or text[lo - 1] == "-"):
        lo -= 1
    while hi < len(text) and (text[hi].isdigit() or text[hi] == "-"):
        hi += 1
    if hi < len(text) and text[hi] in "xX" and text[hi - 1] == "-":
        hi += 1
    return text[lo:hi].strip("-")


def _unit_after(text: str, end: int) -> bool:
    m = _NEXT_WORD.match(text, end)
    return bool(m) and m.group(1).lower() in UNITS


def _currency_before(text: str, start: int) -> bool:
    i = start - 1
    while i >= 0 and text[i] == " ":
        i -= 1
    return i >= 0 and text[i] in _CURRENCY
