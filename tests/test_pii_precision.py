"""PII precision: what is not personal data gives no span, conflicts between readings go by validity.

The sentence frames and hard negatives are the ones ``bench/eval_pii.py`` measures with (generated there by a
seeded RNG); one stage with the default entity set serves every test.
"""

from __future__ import annotations

import random

import pytest

from bench.eval_pii import FRAMES, HARD_KINDS, fill, hard_negative, hard_set, make_ip
from pipeline.stages import stage_class
from pipeline.stages.base import StageContext, run_batch

CTX = StageContext(job_name="t", output_dir="out", stage_index=0, work_dir="work")


def make(**params):
    cls = stage_class("pii")
    return cls(cls.Params(**params), CTX)


@pytest.fixture(scope="module")
def stage():
    s = make(mode="annotate")
    s.setup()
    return s


def spans(stage, texts: list[str]) -> list[list[tuple[str, str]]]:
    """Per text, (value, type) of each span the stage reports."""
    docs = [{"id": str(i), "text": t, "source": "t", "ord": i, "meta": {}} for i, t in enumerate(texts)]
    out = run_batch(stage, docs).kept
    return [[(d["text"][s["start"]:s["end"]], s["type"]) for s in d["meta"]["pii"]] for d in out]


def test_an_ipv4_address_in_every_frame_is_an_ip_address(stage):
    rng = random.Random(5)
    ips = ["10.237.66.205", "192.168.120.17", "8.8.4.4"] + [make_ip(rng) for _ in range(3)]
    texts, values = [], []
    for frame in FRAMES:
        for ip in ips:
            if ":" in ip:
                continue
            (a, _), (b, _) = hard_negative(rng), hard_negative(rng)
            texts.append(fill(frame, ip, a, b)[0])
            values.append(ip)
    assert len(texts) >= 4 * len(FRAMES)
    for text, ip, found in zip(texts, values, spans(stage, texts), strict=True):
        assert found == [(ip, "IP_ADDRESS")], text


def test_an_ipv6_address_in_every_frame_is_an_ip_address(stage):
    rng = random.Random(6)
    texts, values = [], []
    for frame in FRAMES:
        ip = "2001:db8:85a3::8a2e:370:7334"
        (a, _), (b, _) = hard_negative(rng), hard_negative(rng)
        texts.append(fill(frame, ip, a, b)[0])
        values.append(ip)
    for text, ip, found in zip(texts, values, spans(stage, texts), strict=True):
        assert found == [(ip, "IP_ADDRESS")], text


@pytest.mark.parametrize("kind", sorted(HARD_KINDS))
def test_each_hard_negative_kind_gives_no_span(stage, kind):
    rng = random.Random(sorted(HARD_KINDS).index(kind))
    texts = []
    for i in range(80):
        value, _ = hard_negative(rng, kind)
        texts.append(f"see {value} here")  # alone
        labelled, _ = hard_negative(rng, labelled=True)  # the frame's {pii} slot: one that names its kind
        other, _ = hard_negative(rng)
        texts.append(fill(FRAMES[i % len(FRAMES)], labelled, value, other)[0])  # in every frame, with others
    flagged = [(t, s) for t, s in zip(texts, spans(stage, texts), strict=True) if s]
    assert flagged == []


def test_negative_documents_of_the_eval_give_no_span(stage):
    docs = hard_set(0, 600, seed=11)
    flagged = [(d["text"], s) for d, s in zip(docs, spans(stage, [d["text"] for d in docs]), strict=True) if s]
    assert flagged == []


def test_pii_right_next_to_hard_negatives_is_found_with_its_type(stage):
    docs = hard_set(600, 0, seed=12)
    found_by_type: dict[str, list[bool]] = {}
    wrong = []
    for d, found in zip(docs, spans(stage, [d["text"] for d in docs]), strict=True):
        (s, e, label), = d["gold"]
        found_by_type.setdefault(label, []).append(any(v == d["text"][s:e] and t == label for v, t in found))
        wrong += [(d["text"], v, t) for v, t in found if (v, t) != (d["text"][s:e], label)]
    assert wrong == []  # no other span, no other type
    recall = {label: sum(hits) / len(hits) for label, hits in found_by_type.items()}
    assert len(recall) == 6 and min(recall.values()) >= 0.98, recall


@pytest.mark.parametrize(("text", "expected"), [
    # a valid address is an IP address whatever the words around it ("hotel" holds the phone cue "tel")
    ("The hotel wifi logged a login from 10.237.66.205.", [("10.237.66.205", "IP_ADDRESS")]),
    ("call from 10.237.66.205: refused", [("10.237.66.205", "IP_ADDRESS")]),
    ("mobile client at 2001:db8::1: refused", [("2001:db8::1", "IP_ADDRESS")]),
    # numbers inside identifiers, times, ISBNs, quantities are not phone numbers, even valid-looking ones
    ("Order ORD-2021-004512 shipped, call us", []),
    ("Order 2125550199 and bug #2125550199 and invoice no. 2125550199", []),
    ("created 1638316800, ISBN 0-306-40615-2, sent 2147483648 bytes", []),
    ("Use the build number 1234567 with care", []),
    # a label of the phone's own keeps it a phone number
    ("Phone #212-555-0199", [("212-555-0199", "PHONE_NUMBER")]),
    ("Tel.030 1234567", [("030 1234567", "PHONE_NUMBER")]),
    ("call me at 2125550199", [("2125550199", "PHONE_NUMBER")]),
    ("+31(0)64-6943136-Office", [("+31(0)64-6943136", "PHONE_NUMBER")]),
    # 3-2-4 is the SSN's shape, also after a phone word; a number in international format is a phone number
    ("Mobile: 536-90-4399", [("536-90-4399", "US_SSN")]),
    ("for account +31 6 12094043 only", [("+31 6 12094043", "PHONE_NUMBER")]),
    # addresses of no one, versions and OIDs are no IP addresses; a bare dotted quad is one (README)
    ("bind 127.0.0.1 and 0.0.0.0, mask 255.255.255.0, multicast 224.0.0.251", []),
    ("version 1.2.3.4 and OID 1.3.6.1.4.1.311", []),
    ("upgrade to 1.2.3.4", [("1.2.3.4", "IP_ADDRESS")]),
    # an IBAN followed by a word, and one in lower case
    ("IBAN BE68 5390 0754 7034 about rent", [("BE68 5390 0754 7034", "IBAN_CODE")]),
    ("my iban is gb82west12345698765432", [("gb82west12345698765432", "IBAN_CODE")]),
])
def test_conflicts_are_resolved_by_validity(stage, text, expected):
    assert spans(stage, [text]) == [expected]


def test_generic_types_are_off_by_default_and_extra_entities_switches_them_on(stage):
    text = ("On 2021-12-01 the job a3f1c2e4-5b6d-4e7f-8a9b-0c1d2e3f4a5b read https://example.org/x from host "
            "aa:bb:cc:dd:ee:ff; mail ann@example.com")
    assert spans(stage, [text]) == [[("ann@example.com", "EMAIL_ADDRESS")]]
    extra = make(mode="annotate", extra_entities=["DATE_TIME", "UUID", "URL", "MAC_ADDRESS"])
    extra.setup()
    found = dict((t, v) for v, t in spans(extra, [text])[0])
    assert found == {"DATE_TIME": "2021-12-01", "UUID": "a3f1c2e4-5b6d-4e7f-8a9b-0c1d2e3f4a5b",
                     "URL": "https://example.org/x", "MAC_ADDRESS": "aa:bb:cc:dd:ee:ff",
                     "EMAIL_ADDRESS": "ann@example.com"}
    # with ``entities`` the extra types add to that set instead of the default one
    only = make(mode="annotate", entities=["EMAIL_ADDRESS"], extra_entities=["UUID"])
    only.setup()
    assert sorted(t for _, t in spans(only, [text + " call 2125550199"])[0]) == ["EMAIL_ADDRESS", "UUID"]
    with pytest.raises(ValueError, match="extra_entities"):
        stage_class("pii").Params(extra_entities=["DATE"])


def test_short_cues_count_as_whole_words_only():
    from pipeline.pii.analyzer import ShortCueContextEnhancer

    # a passport or driver's licence number is a bare run of digits that counts only after a context word;
    # "status" and "use" hold the passport cue "us", "public" the licence cue "lic"
    weak = make(mode="annotate", entities=["US_PASSPORT", "US_DRIVER_LICENSE"])
    weak.setup()
    assert spans(weak, ["status 123456789, use 987654321, public 12345678"]) == [[]]
    assert spans(weak, ["US 123456789, lic 12345678"]) == [[("123456789", "US_PASSPORT"),
                                                            ("12345678", "US_DRIVER_LICENSE")]]

    find = ShortCueContextEnhancer._find_supportive_word_in_context
    assert find(["status", "use", "bus"], ["us", "passport"]) == ""
    assert find(["us"], ["us", "passport"]) == "us"
    assert find(["hotel", "intel"], ["tel"]) == ""
    assert find(["tel-nr"], ["tel"]) == "tel" and find(["0301234567-fax"], ["fax"]) == "fax"
    assert find(["telefonnummer"], ["telefon"]) == "telefon"  # a longer word still counts inside a word


def test_validity_helpers():
    from pipeline.pii.validity import is_date, is_dotted_version, is_epoch, is_isbn

    assert is_epoch("1638316800") and is_epoch("1638316800123") and is_epoch("1638316800.5")
    assert not is_epoch("2125550199") and not is_epoch("163831680")
    assert is_isbn("978-3-16-148410-0") and is_isbn("9783161484100") and is_isbn("0-306-40615-2")
    assert not is_isbn("978-3-16-148410-1") and not is_isbn("0306406152")  # bad check digit; bare ISBN-10
    assert is_date("2021-12-01") and is_date("01.12.2021") and is_date("20211201")
    assert not is_date("2021-13-01") and not is_date("2125550199")
    assert is_dotted_version("1.3.6.1.4.1.311") and is_dotted_version("14.56.370")
    assert not is_dotted_version("01.44.98.69.09") and not is_dotted_version("212.555.0199")



def test_the_readme_examples_are_valid_stage_params():
    """The guide's PII page documents ``extra_entities`` with an example the spec accepts."""
    import re
    from pathlib import Path

    import yaml

    section = (Path(__file__).resolve().parents[1] / "docs" / "pii.md").read_text(encoding="utf-8")
    stages = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    params = [stage_class("pii").Params(**s["params"]) for s in stages if s["type"] == "pii"]
    assert any(p.extra_entities for p in params) and "extra_entities" in section
