"""``tokenmill ablate`` (issue 40): the ablation file's checks, the plan, the common validation split, and one tiny
ablation interrupted after its first variant and resumed without repeating a finished step.

One test uses Ray (``ray_shared``) and the trainer and ``tokenmill eval`` (subprocesses, a
model of a few thousand parameters for a few steps); the rest are pure functions, well under a second each.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.problems import SpecError
from service.ablation import results
from service.ablation.plan import Layout, Run, make_plan
from service.ablation.runner import Interrupted, run_steps
from service.ablation.spec import CommonValidation, parse_ablation
from service.ablation.split import split_raw
from tests.corpus_fixtures import make_text

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "training" / "configs" / "tiny.yaml")


def _ablation(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t", "raw": {"path": str(tmp_path / "raw.jsonl"), "format": "jsonl"},
        "base": {"packing": {"seq_len": 32}, "output": {"samples_per_shard": 64}, "execution": {"parallelism": 1}},
        "variants": {"plain": {"stages": [{"type": "normalize"}]},
                     "long": {"stages": [{"type": "normalize"}, {"type": "length", "params": {"min_chars": 400}}]}},
        "tokenizer": {"vocab_size": 300},
        "budget": {"tokens": 192},
        "proxy": {"config": TINY, "set": {"parallel.precision": "fp32", "data.num_workers": 0,
                                          "data.batch_size": 2, "log.tensorboard": False}},
        "seeds": [0], "validation": {"share": 0.2}, "out": str(tmp_path / "out")}
    data.update(extra)
    return data


def _raw(path: Path, n: int = 80) -> Path:
    rng = random.Random(0)
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": make_text(rng, rng.randint(20, 120)),
                                        "kind": "a" if i % 2 else "b"}) + "\n" for i in range(n)))
    return path


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as err:
        make_plan(parse_ablation(data))
    return [str(p) for p in err.value.problems]


@pytest.mark.parametrize(("change", "expected"), [
    ({"seeds": [0, 0]}, "seeds: [0, 0] repeats a seed"),
    ({"budgett": {"tokens": 1}}, "budgett: unknown key; did you mean 'budget'?"),
    ({"variants": {"x": {"stages": [], "set": {"packing.seq_len": 64}}}}, "variants.x: give exactly one"),
    ({"variants": {"x": {"stages": [{"type": "length", "params": {"min_chars": -1}}]}}},
     "variants.x.stages.0.params.min_chars: Input should be greater than or equal to 0"),
    ({"variants": {"x": {"set": {"packing.seq_len": "long"}}}}, "variants.x.set.packing.seq_len: Input should be"),
    ({"base": {"inputs": []}}, "base: inputs: set by ablate"),
    ({"validation": {"share": 0.1, "documents": 3}}, "validation: give exactly one of share"),
    ({"proxy": {"config": TINY, "set": {"data.batch_size": 0}}}, "proxy.set.data.batch_size: data.batch_size: 0"),
])
def test_a_bad_field_is_refused_by_its_name(tmp_path, change, expected):
    problems = _problems(_ablation(tmp_path, **change))
    assert any(p.startswith(expected) for p in problems), problems


def test_the_plan_is_variants_by_seeds_at_one_token_budget(tmp_path):
    plan = make_plan(parse_ablation(_ablation(tmp_path, seeds=[0, 1, 2], budget={"tokens": 10_000}, proxy={
        "config": TINY, "set": {"data.batch_size": 4, "optim.grad_accum": 2}})))
    assert plan.runs == [Run(v, s) for v in ("plain", "long") for s in (0, 1, 2)]
    assert plan.tokens_per_step == 4 * 2 * 32 and plan.max_steps == 40  # ceil(10000 / 256)
    job = plan.jobs["long"]
    assert [i.path for i in job.inputs] == [str(plan.layout.raw)]  # every variant reads the split's training part
    assert job.tokenizer is not None and job.tokenizer.path == str(plan.layout.tokenizer)  # one tokenizer
    assert job.output.path == str(plan.layout.data("long")) and [s.type for s in job.stages] == ["normalize", "length"]
    over = make_plan(parse_ablation(_ablation(tmp_path, variants={"s": {"set": {"packing.seq_len": 32,
                                                                                 "stages": [{"type": "normalize"}]}}})))
    assert [s.type for s in over.jobs["s"].stages] == ["normalize"]


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_the_common_split_is_deterministic_and_disjoint_from_what_variants_read(tmp_path):
    raw = _raw(tmp_path / "raw.jsonl", 400)
    lines = raw.read_text().splitlines(keepends=True)
    random.Random(1).shuffle(lines)
    (tmp_path / "shuffled.jsonl").write_text("".join(lines))
    spec = parse_ablation(_ablation(tmp_path))
    split = {}
    for name in ("raw", "shuffled"):
        layout = Layout(tmp_path / f"out-{name}")
        counts = split_raw(spec.raw.model_copy(update={"path": str(tmp_path / f"{name}.jsonl")}),
                           CommonValidation(share=0.2, by="kind"), layout)
        held, train = set(_ids(layout.common)), set(_ids(layout.raw))
        assert not held & train and len(held | train) == 400 == counts.train + counts.validation
        assert set(_ids(layout.common_part("a"))) | set(_ids(layout.common_part("b"))) == held
        split[name] = held
    assert split["raw"] == split["shuffled"] and 50 < len(split["raw"]) < 110  # by id, not by position
    layout = Layout(tmp_path / "out-n")
    split_raw(spec.raw, CommonValidation(documents=7), layout)
    assert len(_ids(layout.common)) == 7


def test_an_interrupted_ablation_resumes_without_repeating_finished_steps(tmp_path, ray_shared):
    _raw(tmp_path / "raw.jsonl")
    plan = make_plan(parse_ablation(_ablation(tmp_path)))
    with pytest.raises(Interrupted):  # split, tokenizer, then all of the first variant: job, train, eval
        run_steps(plan, say=lambda _: None, stop_after=5)
    first = [json.loads(line) for line in plan.layout.steps.read_text().splitlines()]
    assert [r["step"] for r in first if r["event"] == "done"][-1] == "eval:plain:0"
    run_steps(plan, say=lambda _: None)
    records = [json.loads(line) for line in plan.layout.steps.read_text().splitlines()]
    started = Counter(r["step"] for r in records if r["event"] == "started")
    assert set(started.values()) == {1}, started  # nothing ran twice
    assert set(started) == {"split", "tokenizer", "job:plain", "train:plain:0", "eval:plain:0", "job:long",
                            "train:long:0", "eval:long:0"}
    data = results.write(plan)
    assert data["complete"]
    for name in ("plain", "long"):
        run = data["variants"][name]["runs"]["0"]
        assert run["scores"]["common"] > 0 and run["curve"][-1]["step"] == plan.max_steps
    long_data = data["variants"]["long"]["data"]
    assert long_data["kept"] < data["variants"]["plain"]["data"]["kept"] == long_data["read"]
    assert "common" in data["gaps"]["plain-long"]


def test_the_command_names_a_bad_field_with_its_line_and_dry_runs_a_good_file(tmp_path, capsys):
    import yaml

    from service.commands.ablate import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_ablation(tmp_path, seeds=[1, 1]), sort_keys=False))
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: seeds (line ") and "repeats a seed" in err[0], err
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_ablation(tmp_path, seeds=[0, 1], out="out"), sort_keys=False))
    assert main([str(good), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 variant(s) x 2 seed(s); 3 steps of 64 tokens" in out and "todo  eval:long:1" in out
    assert not (tmp_path / "out").exists()  # relative to the file's folder, and nothing written
