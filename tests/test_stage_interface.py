"""The stage interface: verdicts with scores, annotate/filter mode, stage counters and score summaries
in stats.json, the driver-side prepare() hook, and spec validation that never imports Ray."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pipeline.documents import docs_to_table
from pipeline.spec import SpecError, parse_spec
from pipeline.stages import REGISTRY, FilterParams, FilterStage, Stage, StageContext, Verdict, stage_class
from pipeline.stages.base import StageParams, run_batch
from pipeline.stages.length import LengthFilter, LengthParams
from pipeline.stages.metrics import QUANTILES, RELATIVE_ACCURACY, ScoreSketch, StageMetrics
from tests.corpus_fixtures import write_jsonl
from tests.stage_probes import PREPARED

CTX = StageContext(job_name="t", output_dir="/nonexistent", stage_index=1, work_dir="")


def docs(*texts: str) -> list[dict[str, Any]]:
    return [{"id": f"d{i}", "text": t, "source": "s", "ord": i, "meta": {"tag": i}, "segments": ""}
            for i, t in enumerate(texts)]


def length(**params: Any) -> LengthFilter:
    return LengthFilter(LengthParams(**params), CTX)


# ---- verdicts and modes (no Ray) --------------------------------------------------------------------

class Forms(FilterStage):
    """Returns each form a filter may return, chosen by the document's text."""

    name = "forms"

    def filter(self, doc):
        return {"true": True, "false": False, "reason": "bad_word",
                "keep": Verdict(True, scores={"s": 1.0}), "drop": Verdict(False, "rule:x", {"s": 2.0}),
                "drop_unnamed": Verdict(False)}[doc["text"]]


def test_filter_may_return_true_a_reason_or_a_verdict():
    out = run_batch(Forms(FilterParams(), CTX), docs("true", "false", "reason", "keep", "drop", "drop_unnamed"))
    assert [d["text"] for d in out.kept] == ["true", "keep"]
    assert [(d.reason, d.detail) for d in out.drops] == [
        ("forms", {}), ("bad_word", {}), ("rule:x", {"scores": {"s": 2.0}}), ("forms", {})]
    assert out.metrics.scores["s"].count == 2  # scores of kept and dropped documents alike


def test_filter_returning_anything_else_is_a_clear_error():
    with pytest.raises(TypeError, match=r"Forms.filter returned None"):
        Forms(FilterParams(), CTX).judge(docs("x")[0], None)


def test_length_filter_mode_drops_with_its_score_in_the_reject_detail():
    out = run_batch(length(min_chars=3, max_chars=5), docs("ab", "abcd", "abcdefgh"))
    assert [d["text"] for d in out.kept] == ["abcd"]
    assert out.kept[0]["meta"] == {"tag": 1}  # filter mode leaves kept documents as they were
    assert [(d.reason, d.detail) for d in out.drops] == [("too_short", {"scores": {"chars": 2}}),
                                                           ("too_long", {"scores": {"chars": 8}})]
    assert out.metrics.scores["chars"].summary()["max"] == 8 and not out.metrics.counters


def test_annotate_mode_keeps_everything_and_writes_the_verdict_to_meta():
    batch = docs("ab", "abcd", "abcdefgh")
    batch[1]["meta"] = json.dumps({"tag": 1})  # a stage may also see meta still as JSON (from Arrow)
    out = run_batch(length(min_chars=3, max_chars=5, mode="annotate"), batch)
    assert out.drops == [] and [d["text"] for d in out.kept] == ["ab", "abcd", "abcdefgh"]
    assert [d["meta"] for d in out.kept] == [
        {"tag": 0, "filters": {"length": {"keep": False, "reason": "too_short", "scores": {"chars": 2}, "at": 1}}},
        {"tag": 1, "filters": {"length": {"keep": True, "reason": None, "scores": {"chars": 4}, "at": 1}}},
        {"tag": 2, "filters": {"length": {"keep": False, "reason": "too_long", "scores": {"chars": 8}, "at": 1}}},
    ]
    assert out.metrics.counters == {"would_drop:too_short": 1, "would_drop:too_long": 1}


def test_a_filter_whose_params_lack_mode_is_refused_at_definition():
    with pytest.raises(TypeError, match="Params must inherit .*FilterParams"):
        class NoMode(FilterStage):  # noqa: F841 - defining it is the test
            Params = StageParams


def test_every_registered_filter_has_mode_and_forbids_unknown_params():
    for name in REGISTRY:
        cls = stage_class(name)
        assert cls.Params.model_config.get("extra") == "forbid", name
        if issubclass(cls, FilterStage):
            assert cls.Params.model_fields["mode"].default == "filter", name


def test_every_registered_stage_declares_the_type_of_its_params():
    """``params: XParams`` next to ``Params = XParams``: mypy then checks each read of ``self.params`` (the
    base classes declare only ``BaseModel``). Read from the annotations, as written (nothing is resolved)."""
    for name in REGISTRY:
        cls = stage_class(name)
        declared = next(k.__dict__["__annotations__"]["params"] for k in cls.__mro__
                        if "params" in k.__dict__.get("__annotations__", {}))
        declared = getattr(declared, "__name__", declared)  # a string under `from __future__ import annotations`
        assert declared == cls.Params.__name__, f"{name}: params is declared {declared}, Params is {cls.Params}"


@pytest.mark.parametrize("params, field", [({"mode": "drop"}, "stages.0.params.mode"),
                                           ({"min_chars": 1, "bogus": 2}, "stages.0.params.bogus")])
def test_bad_filter_params_name_the_field(params, field):
    spec = {"name": "t", "inputs": [{"path": "x"}], "stages": [{"type": "length", "params": params}],
            "output": {"path": "o"}}
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert str(err.value).startswith(field + ":") and len(str(err.value).splitlines()) == 1, str(err.value)


# ---- counters and score summaries (no Ray) ----------------------------------------------------------

class Counting(Stage):
    name = "counting"

    def process(self, docs):
        for doc in docs:
            self.count("lines", doc["text"].count("\n") + 1)
            self.observe("words", len(doc["text"].split()))
            yield doc


def test_counters_are_handed_over_per_batch_and_reset():
    stage = Counting(StageParams(), CTX)
    a = run_batch(stage, docs("one\ntwo", "three"))
    b = run_batch(stage, docs("x y z"))
    assert a.metrics.counters == {"lines": 3} and a.metrics.scores["words"].count == 2
    assert b.metrics.counters == {"lines": 1} and b.metrics.scores["words"].summary()["min"] == 3
    assert not stage.take_metrics()


def test_score_sketches_merge_in_any_order_to_the_summary_of_all_values():
    rng = random.Random(7)
    values = [rng.lognormvariate(5, 1.5) for _ in range(5000)] + [0.0, -3.5]
    whole = ScoreSketch()
    for v in values:
        whole.add(v)
    parts = [ScoreSketch() for _ in range(4)]
    for i, v in enumerate(values):
        parts[i % 4].add(v)
    forward, backward = ScoreSketch(), ScoreSketch()
    for p in parts:
        forward.merge(p)
    for p in reversed(parts):
        backward.merge(p)
    s = whole.summary()
    assert forward.summary() == backward.summary() == s
    assert (s["count"], s["min"], s["max"]) == (len(values), -3.5, float(f"{max(values):.6g}"))
    assert s["mean"] == pytest.approx(sum(values) / len(values), rel=1e-5)
    ordered = sorted(values)
    for q in QUANTILES:
        exact = ordered[int(q * (len(values) - 1))]
        assert s[f"p{round(q * 100):02d}"] == pytest.approx(exact, rel=RELATIVE_ACCURACY * 1.01), q


def test_non_finite_scores_are_left_out():
    m = StageMetrics()
    for v in (1.0, float("nan"), float("inf"), 3.0):
        m.observe("x", v)
    s = m.scores["x"].summary()
    assert (s["count"], s["min"], s["max"], s["mean"]) == (2, 1, 3, 2)
    assert ScoreSketch().summary() == {"count": 0}


class FakeRecorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.rejected: list[dict[str, Any]] = []

    def counts(self, key: str | None = None, **kw: Any) -> None:
        self.calls.append(kw)

    def rejects(self, rows: list[dict[str, Any]], key: str | None = None) -> None:
        self.rejected.extend(rows)


def test_batch_runner_without_prepare_is_built_as_before_and_reports_metrics():
    from pipeline.job.udfs import BatchStageRunner

    rec = FakeRecorder()
    params = LengthParams(min_chars=3)
    # the argument list the graph builder used before prepare() existed still works
    runner = BatchStageRunner(LengthFilter, params.model_dump_json(), CTX, rec)
    assert runner.stage.prepared is None
    assert BatchStageRunner.constructor_args(LengthFilter, params, CTX, rec)[-1] == (None,)  # no ray.put
    out = runner(docs_to_table(docs("ab", "abcd", "abcdefgh")))
    assert out.num_rows == 2 and isinstance(out, pa.Table)
    setup, call = rec.calls  # the worker's setup is counted in the stage's seconds, then each batch
    assert setup.get("docs_in", 0) == 0 and setup["seconds"] >= 0
    assert (call["docs_in"], call["docs_out"], call["dropped"]) == (3, 2, {"too_short": 1})
    assert call["metrics"].scores["chars"].summary()["count"] == 3
    assert rec.rejected[0]["reason"] == "too_short" and rec.rejected[0]["detail"] == {"scores": {"chars": 2}}


# ---- validation stays light -------------------------------------------------------------------------

def test_parsing_a_spec_with_every_registered_stage_imports_no_ray(tmp_path):
    code = f"""
import json, sys
from pipeline.spec import parse_spec
from pipeline.stages import REGISTRY, stage_class
required = {{"quality_classifier": {{"model": "m.bin"}}}}  # a param without a default
spec = parse_spec({{"name": "t", "inputs": [{{"path": "x"}}], "output": {{"path": {str(tmp_path)!r}}},
                   "stages": [{{"type": t, "params": required.get(t, {{}})}} for t in REGISTRY]}})
assert [s.type for s in spec.stages] == list(REGISTRY)
for t in REGISTRY:
    stage_class(t)
heavy = ("ray", "torch", "fasttext", "presidio_analyzer", "spacy")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


# ---- on a real Ray ----------------------------------------------------------------------------------

def test_stats_actor_merges_counters_and_scores_from_many_workers(ray_local):
    from pipeline.job.stats import StatsActor

    actor = StatsActor.remote()
    whole = StageMetrics()
    for part in range(3):
        m = StageMetrics()
        for v in range(part * 10, part * 10 + 10):
            m.observe("v", v)
            whole.observe("v", v)
        m.count("c", part + 1)
        ray_local.get(actor.add.remote("02-x", docs_in=10, docs_out=9, dropped={"r": 1}, metrics=m))
    ray_local.get(actor.add.remote("01-plain", docs_in=5, docs_out=5))
    snap = ray_local.get(actor.snapshot.remote())
    assert snap["02-x"]["counters"] == {"c": 6}
    assert snap["02-x"]["scores"] == {"v": whole.scores["v"].summary()}
    assert snap["02-x"]["scores"]["v"]["count"] == 30 and snap["02-x"]["docs_in"] == 30
    assert snap["01-plain"] == {"docs_in": 5, "docs_out": 5, "dropped": {}, "bytes_in": 0, "bytes_out": 0,
                                "seconds": 0.0}  # a stage that recorded nothing: the same keys as before


def _lengths() -> list[int]:
    """30 too short (< 50 chars), 20 too long (> 500), 70 within."""
    rng = random.Random(3)
    return [rng.randint(5, 49) for _ in range(30)] + [rng.randint(501, 900) for _ in range(20)] + \
        [rng.randint(50, 500) for _ in range(70)]


def _job(tmp_path: Path, name: str, stages: list[dict[str, Any]]) -> tuple[Path, dict[str, Any], list[dict]]:
    from pipeline.job.engine import run_job

    lengths = _lengths()
    src = tmp_path / "in"
    if not src.exists():  # four files: the batch stages run in the readers' pool of two workers
        docs = [{"id": f"d{i}", "text": "x" * n, "tag": i} for i, n in enumerate(lengths)]
        for k in range(4):
            write_jsonl(src / f"docs-{k}.jsonl", docs[k * 30:(k + 1) * 30])
    out = tmp_path / name
    run_job(parse_spec({
        "name": name, "inputs": [{"path": str(src / "*.jsonl")}], "stages": stages, "tokenizer": None,
        "output": {"path": str(out), "documents": "jsonl"}, "execution": {"batch_size": 16, "parallelism": 2},
    }))
    stats = json.loads((out / "stats.json").read_text())
    kept = [json.loads(line) for f in sorted(glob.glob(str(out / "documents" / "*.jsonl"))) for line in open(f)]
    return out, {s["stage"]: s for s in stats["stages"]}, kept


def test_filter_mode_job_writes_counters_scores_and_scored_rejects(ray_local, tmp_path, monkeypatch):
    from ray.data import DataContext

    monkeypatch.setitem(REGISTRY, "prepare_probe", "tests.stage_probes:PrepareProbe")
    # both workers of the pool start before any work (else a fast first worker may finish the job alone)
    monkeypatch.setattr(DataContext.get_current(), "wait_for_min_actors_s", 120)
    logs = tmp_path / "logs"
    logs.mkdir()
    lengths = _lengths()
    out, stages, kept = _job(tmp_path, "filter", [
        {"type": "prepare_probe", "params": {"log_dir": str(logs)}},
        {"type": "length", "params": {"min_chars": 50, "max_chars": 500}},
    ])
    # prepare(): once per job, on the driver; every worker got its value from the object store
    assert (logs / "prepare.log").read_text().split() == [str(os.getpid())]
    setups = [json.loads(line) for line in (logs / "setup.log").read_text().splitlines()]
    assert all(s["pid"] != os.getpid() and s["prepared"] == PREPARED for s in setups)
    assert len({s["pid"] for s in setups}) >= 2  # two workers (parallelism 2) set up, one prepare() between them
    assert stages["01-prepare_probe"]["counters"] == {"saw_prepared": 120}
    assert {d["meta"]["probe"] for d in kept} == {"tok-42"}
    # a stage without prepare() (length) works as before: the same keys, drops per reason
    ln = stages["02-length"]
    assert {"docs_in", "docs_out", "dropped", "bytes_in", "bytes_out", "seconds"} <= set(ln)
    assert (ln["docs_in"], ln["docs_out"], ln["dropped"]) == (120, 70, {"too_long": 20, "too_short": 30})
    chars = ln["scores"]["chars"]
    assert (chars["count"], chars["min"], chars["max"]) == (120, min(lengths), max(lengths))
    assert chars["mean"] == pytest.approx(sum(lengths) / 120, rel=1e-5)
    assert chars["min"] <= chars["p10"] <= chars["p50"] <= chars["p90"] <= chars["max"]
    assert "counters" not in ln  # filter mode counts drops under `dropped` only
    assert len(kept) == 70 and all("filters" not in d["meta"] for d in kept)
    rejects = [json.loads(line) for f in glob.glob(str(out / "rejected" / "02-length" / "*.jsonl")) for line in open(f)]
    assert len(rejects) == 50
    assert all(r["detail"] == {"scores": {"chars": len(r["text"])}} for r in rejects)


def test_annotate_mode_job_keeps_every_document_and_counts_would_be_drops(ray_local, tmp_path):
    lengths = _lengths()
    out, stages, kept = _job(tmp_path, "annotate", [
        {"type": "length", "params": {"min_chars": 50, "max_chars": 500, "mode": "annotate"}}])
    ln = stages["01-length"]
    assert (ln["docs_in"], ln["docs_out"], ln["dropped"]) == (120, 120, {})
    assert ln["counters"] == {"would_drop:too_long": 20, "would_drop:too_short": 30}
    assert ln["scores"]["chars"]["count"] == 120
    assert not (out / "rejected" / "01-length").exists()
    assert len(kept) == 120
    for d in kept:
        n = lengths[d["meta"]["tag"]]
        reason = "too_short" if n < 50 else "too_long" if n > 500 else None
        assert d["meta"]["filters"] == {"length": {"keep": reason is None, "reason": reason, "scores": {"chars": n},
                                                   "at": 1}}

