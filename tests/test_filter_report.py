"""Annotate, report, then filter on the stored verdicts (issue 10, item 4), without Ray.

Two filters run in annotate mode; ``tokenmill report`` counts what each would drop alone and in pipeline
order; the ``stored_filters`` stage, reading the documents back with ``format: documents``, drops exactly the
documents and reasons the report predicted, and filter-mode runs of the same filters agree with both.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pipeline.documents import Drop
from pipeline.filters.report import build_report, main
from pipeline.filters.stored import StoredFilters
from pipeline.readers import read_file
from pipeline.spec import InputSpec
from pipeline.stages.base import FilterParams, FilterStage, StageContext, Verdict, run_batch
from pipeline.stages.length import LengthFilter


class DigitFilter(FilterStage):
    """Drops documents with more than ``max_digit_ratio`` digits (a second rule with a score)."""

    name = "digits"

    class Params(FilterParams):
        max_digit_ratio: float = 0.2

    def filter(self, doc):
        ratio = sum(c.isdigit() for c in doc["text"]) / max(1, len(doc["text"]))
        return Verdict(ratio <= self.params.max_digit_ratio, "digits:ratio", {"digit_ratio": ratio})


def _docs(n: int = 200) -> list[dict]:
    rng = random.Random(5)
    docs = []
    for i in range(n):
        size = rng.choice([10, 40, 120, 600])
        p_digit = rng.choice([0.0, 0.0, 0.1, 0.4])
        text = "".join(rng.choice("0123456789" if rng.random() < p_digit else "abcde ") for _ in range(size))
        docs.append({"id": f"d{i}", "text": text or "x", "source": "t", "ord": i, "meta": "{}", "segments": None})
    return docs


def _stages(mode: str) -> list[FilterStage]:
    length = LengthFilter(LengthFilter.Params(min_chars=30, max_chars=500, mode=mode), StageContext("t", "", 1, ""))
    digits = DigitFilter(DigitFilter.Params(mode=mode), StageContext("t", "", 2, ""))
    return [length, digits]


def _run(stages: list[FilterStage], docs: list[dict]) -> tuple[list[dict], list[Drop]]:
    drops: list[Drop] = []
    for stage in stages:
        result = run_batch(stage, docs)
        docs, drops = result.kept, drops + result.drops
    return docs, drops


def _write_jsonl(path: Path, docs: list[dict]) -> None:
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({**d, "meta": json.loads(d["meta"]) if isinstance(d["meta"], str) else d["meta"]})
                    + "\n")


def test_report_predicts_filter_mode_drops_and_stored_filters_reproduce_them(tmp_path, capsys):
    annotated, none_dropped = _run(_stages("annotate"), _docs())
    assert not none_dropped and len(annotated) == 200
    src = tmp_path / "annotated.jsonl"
    _write_jsonl(src, annotated)

    kept, drops = _run(_stages("filter"), _docs())  # what a filter-mode run of the same stages does
    truth = Counter(d.reason for d in drops)
    assert set(truth) == {"too_short", "too_long", "digits:ratio"}  # every rule fires: the test can fail

    report = build_report(str(src)).to_json()
    predicted = Counter()
    for fr in report["filters"].values():
        predicted.update({r: v["in_order"] for r, v in fr["reasons"].items() if v["in_order"]})
    assert predicted == truth
    assert report["kept_in_order"] == len(kept)
    # alone counts differ from in-order ones where a document fails both filters
    assert report["filters"]["digits"]["would_drop"] > report["filters"]["digits"]["in_order"]
    assert report["filters"]["length"]["at"] == 1 and report["filters"]["digits"]["at"] == 2
    hist = report["filters"]["digits"]["scores"]["digit_ratio"]
    assert hist["count"] == 200 and sum(hist["histogram"]["counts"]) == 200

    read_back = [d for d in read_file(0, str(src), InputSpec(path=str(src), format="documents"))]
    assert all(not isinstance(d, Drop) for d in read_back)
    assert [d["id"] for d in read_back] == [d["id"] for d in annotated]
    stored = StoredFilters(StoredFilters.Params(), StageContext("t2", "", 1, ""))
    result = run_batch(stored, read_back)
    assert Counter(d.reason for d in result.drops) == truth
    assert [d["id"] for d in result.kept] == [d["id"] for d in kept]

    assert main([str(src), "--json", "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "digits:ratio" in out and "in order" in out
    assert json.loads(out.strip().splitlines()[-1])["kept_in_order"] == len(kept)


def test_stored_filters_subset_and_rethresholded_score(tmp_path):
    annotated, _ = _run(_stages("annotate"), _docs())
    only_digits = run_batch(StoredFilters(StoredFilters.Params(filters=["digits"]), StageContext("t", "", 1, "")),
                            [dict(d) for d in annotated])
    assert {d.reason for d in only_digits.drops} == {"digits:ratio"}
    strict = StoredFilters(StoredFilters.Params(filters=[], rules=[
        {"filter": "digits", "score": "digit_ratio", "max": 0.05}]), StageContext("t", "", 1, ""))
    result = run_batch(strict, [dict(d) for d in annotated])
    expected = sum(1 for d in annotated if d["meta"]["filters"]["digits"]["scores"]["digit_ratio"] > 0.05)
    assert len(result.drops) == expected > len(only_digits.drops)
    assert {d.reason for d in result.drops} == {"digits:digit_ratio"}
    missing = run_batch(StoredFilters(StoredFilters.Params(filters=["lid"]), StageContext("t", "", 1, "")),
                        [dict(d) for d in annotated])
    assert not missing.drops and missing.metrics.counters["missing:lid"] == 200


def test_report_refuses_a_source_without_verdicts(tmp_path, capsys):
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "a", "text": "hello", "meta": {}}) + "\n")
    assert main([str(plain)]) == 2
    assert "no document carries stored verdicts" in capsys.readouterr().err
    assert main([str(tmp_path / "nope.jsonl")]) == 2


@pytest.mark.parametrize("bad", [{"filter": "x", "score": "y"}])
def test_a_rule_without_bounds_is_refused(bad):
    with pytest.raises(ValueError, match="min or max"):
        StoredFilters.Params(rules=[bad])
