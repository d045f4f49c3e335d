"""The end-of-job table (issue 39's first-hour edges): an annotate-mode stage drops nothing, so its column shows
what it would have dropped (its ``would_drop:`` counters), labelled as such, instead of ``-``."""

from __future__ import annotations

from pipeline.job.summary import dropped_text, format_summary


def _stage(stage: str, docs_in: int, docs_out: int, dropped: dict[str, int], counters: dict[str, int] | None = None
           ) -> dict[str, object]:
    entry: dict[str, object] = {"stage": stage, "docs_in": docs_in, "docs_out": docs_out, "dropped": dropped,
                                "bytes_in": 1_000_000, "bytes_out": 900_000, "seconds": 1.5}
    if counters is not None:
        entry["counters"] = counters
    return entry


STATS = {
    "job": "annotated", "seconds": {"total": 4.0}, "parallelism": 2,
    "stages": [
        _stage("00-read", 100, 100, {}),
        _stage("01-gopher_quality", 100, 100, {}, {"would_drop:gopher_quality:too_short": 7,
                                                   "would_drop:gopher_quality:symbol_ratio": 2, "lines_cut": 4}),
        _stage("02-lid", 100, 100, {}, {"would_drop:lid:language": 5}),
        _stage("03-exact_dedup", 100, 90, {"duplicate": 10}, {"groups": 3}),
    ],
    "output": {"tokens": 0, "samples": 0, "shards": 0}, "throughput": {"docs_per_s": 25.0, "tokens_per_s": 0.0},
}


def test_annotate_mode_shows_the_would_drops_labelled():
    rows = {line.split()[0]: line for line in format_summary(STATS, "out").splitlines()[3:7]}
    assert rows["00-read"].endswith("  -")
    assert rows["01-gopher_quality"].endswith("  would-drop: gopher_quality:too_short=7, gopher_quality:symbol_ratio=2")
    assert rows["02-lid"].endswith("  would-drop: lid:language=5")
    assert rows["03-exact_dedup"].endswith("  duplicate=10")  # other counters are not drops


def test_a_stage_with_drops_and_would_drops_shows_both():
    stage = _stage("01-pii", 10, 9, {"pii:max_entities": 1}, {"would_drop:pii:max_entities": 2})
    assert dropped_text(stage) == "pii:max_entities=1; would-drop: pii:max_entities=2"
