"""An unknown key in a spec (issue 39's first-hour edges): the closest key the model has at that place, found by
walking the spec's models along the error's path, instead of pydantic's "Extra inputs are not permitted"; a stage's
``params`` by the stage's own ``Params``."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.mixture_spec import parse_mixture_spec
from pipeline.problems import SpecError
from pipeline.spec import parse_spec


def _problems(**over: Any) -> list[str]:
    data = {"name": "x", "inputs": [{"path": "a.jsonl"}], "output": {"path": "out"}, **over}
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return [str(p) for p in info.value.problems]


def test_a_typo_names_the_key_it_likely_meant_at_every_depth():
    assert _problems(stagess=[]) == ["stagess: unknown key; did you mean 'stages'?"]
    assert _problems(inputs=[{"path": "a.jsonl"}, {"path": "b.jsonl", "text_feild": "body"}]) == [
        "inputs.1.text_feild: unknown key; did you mean 'text_field'?"]
    assert _problems(output={"path": "out", "overwrit": True}, packing={"seq_lne": 8}) == [
        "packing.seq_lne: unknown key; did you mean 'seq_len'?",
        "output.overwrit: unknown key; did you mean 'overwrite'?"]
    assert _problems(stages=[{"type": "normalize"}, {"type": "gopher_quality", "params": {"min_wrods": 3}}]) == [
        "stages.1.params.min_wrods: unknown key; did you mean 'min_words'?"]
    # a model inside a stage's params: stored_filters' rules
    rules = [{"filter": "lid", "score": "lang_score", "min": 0.5, "maxx": 1.0}]
    assert _problems(stages=[{"type": "stored_filters", "params": {"rules": rules}}]) == [
        "stages.0.params.rules.0.maxx: unknown key; did you mean 'max'?"]


def test_a_key_like_none_lists_the_keys_there_are():
    [problem] = _problems(execution={"zzzz": 1})
    assert problem.startswith("execution.zzzz: unknown key (known: ") and "parallelism" in problem
    assert "did you mean" not in problem and "Extra inputs" not in problem


def test_a_mixture_spec_too():
    with pytest.raises(SpecError) as info:
        parse_mixture_spec({"seq_len": 8, "sourcs": []})
    assert "sourcs: unknown key; did you mean 'sources'?" in str(info.value)
