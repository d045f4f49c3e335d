"""``tokenmill train-classifier`` on two synthetic classes, its held-out report and user errors, and the
``quality_classifier`` stage using the model it wrote."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.filters import train_classifier
from pipeline.filters.quality_classifier import QualityClassifier
from pipeline.stages.base import StageContext, run_batch

CTX = StageContext("t", "", 1, "")

# two distinguishable classes sharing some words: edited prose vs. keyword spam
PROSE = ("the committee reviewed evidence from several studies and concluded that careful measurement matters "
         "because results depend on method history shows researchers often revise their conclusions").split()
SPAM = ("click here buy now free cheap best deal offer winner casino bonus limited sale discount subscribe "
        "the and now best").split()


def texts(words: list[str], n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(12, 30))) for _ in range(n)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


FAST = ["--dim", "10", "--epoch", "15", "--lr", "0.5", "--bucket", "20000", "--threads", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict, str]:
    tmp = tmp_path_factory.mktemp("qc")
    rng = random.Random(3)
    pos = write_jsonl(tmp / "good.jsonl.gz", [{"text": t} for t in texts(PROSE, 200, rng)])
    neg = write_jsonl(tmp / "spam.jsonl", [{"text": t} for t in texts(SPAM, 200, rng)] + [{"text": "  "}])
    model = tmp / "out" / "quality.bin"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = train_classifier.main(["--positive", str(pos), "--negative", str(neg), "--output", str(model),
                                    "--holdout", "0.2", "--seed", "1", *FAST])
    assert rc == 0
    report = json.loads((tmp / "out" / "quality.report.json").read_text())
    return model, report, buf.getvalue()


def test_train_classifier_separates_held_out_examples(trained):
    model, report, printed = trained
    assert model.is_file()
    assert report["labels"] == ["hq", "lq"]
    assert report["n_holdout"] == 80 and report["n_train"] == 320
    assert report["skipped"] == {"no_text": 1}
    assert report["accuracy"] >= 0.95
    for label in ("hq", "lq"):
        m = report["per_label"][label]
        assert m["n"] == 40 and m["precision"] >= 0.9 and m["recall"] >= 0.9 and m["f1"] >= 0.9
    # printed: a table, then the same report as one JSON line
    assert "held-out accuracy" in printed
    assert json.loads(printed.strip().splitlines()[-1])["accuracy"] == report["accuracy"]


def quality(**params) -> QualityClassifier:
    return QualityClassifier(QualityClassifier.Params(**params), CTX)


def docs(*texts_: str) -> list[dict]:
    return [{"id": str(i), "text": t, "source": "s", "ord": i, "meta": {}, "segments": ""}
            for i, t in enumerate(texts_)]


def test_stage_keeps_by_the_probability_of_the_label(trained):
    model, _, _ = trained
    rng = random.Random(99)  # fresh documents, not the training ones
    good, spam = texts(PROSE, 20, rng), texts(SPAM, 20, rng)
    stage = quality(model=str(model), label="hq", min_score=0.5)
    stage.preflight()
    stage.setup()
    out = run_batch(stage, docs(*good, *spam))
    kept = {d["text"] for d in out.kept}
    assert len(kept & set(good)) >= 19 and len(kept & set(spam)) <= 1
    assert {d.reason for d in out.drops} == {"quality_classifier:low_score"}
    assert all(d.doc["meta"]["quality_score"] < 0.5 for d in out.drops)
    assert all(d["meta"]["quality_score"] >= 0.5 for d in out.kept)
    assert out.metrics.scores["quality_score"].count == 40

    # the other label, given with its fastText prefix, keeps the other class
    kept = {d["text"] for d in run_batch(quality(model=str(model), label="__label__lq"), docs(*good, *spam)).kept}
    assert len(kept & set(spam)) >= 19 and len(kept & set(good)) <= 1


def test_annotate_mode_and_threshold(trained):
    model, _, _ = trained
    rng = random.Random(5)
    batch = docs(*texts(PROSE, 3, rng), *texts(SPAM, 3, rng))
    out = run_batch(quality(model=str(model), mode="annotate"), batch)
    assert len(out.kept) == 6 and not out.drops
    assert [d["meta"]["filters"]["quality_classifier"]["keep"] for d in out.kept] == [True] * 3 + [False] * 3
    assert out.metrics.counters["would_drop:quality_classifier:low_score"] == 3
    # min_score 1.0 keeps only what the model is certain of; 0 keeps everything
    scores = [d["meta"]["quality_score"] for d in out.kept]
    none_dropped = run_batch(quality(model=str(model), min_score=0.0), [dict(d, meta={}) for d in batch])
    assert len(none_dropped.kept) == 6
    strict = run_batch(quality(model=str(model), min_score=1.0), [dict(d, meta={}) for d in batch])
    assert len(strict.kept) == sum(s >= 1.0 for s in scores)


def test_stage_refuses_a_missing_model_or_label(trained, tmp_path):
    model, _, _ = trained
    with pytest.raises(ValidationError):
        QualityClassifier.Params()  # model is required
    with pytest.raises(ValueError, match=r"^model: no such model file"):
        quality(model=str(tmp_path / "nope.bin")).preflight()
    with pytest.raises(ValueError, match=r"^label: 'good' is not a label"):
        quality(model=str(model), label="good").setup()


def test_input_mode_with_fields_exclusion_and_quantize(tmp_path, capsys):
    rng = random.Random(11)
    records = [{"body": t, "y": "keep"} for t in texts(PROSE, 120, rng)]
    records += [{"body": t, "y": "drop"} for t in texts(SPAM, 120, rng)]
    records += [{"body": t, "y": "leak", "held": True} for t in texts(PROSE, 10, rng)]  # excluded
    data = write_jsonl(tmp_path / "labelled.jsonl", records)
    rc = train_classifier.main(["--input", str(data), "--text-field", "body", "--label-field", "y",
                                "--exclude-field", "held", "--output", str(tmp_path / "m.bin"), "--quantize",
                                "--json", *FAST, "--bucket", "2000"])  # quantizing runs k-means over every row
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"].endswith("m.ftz") and (tmp_path / "m.ftz").is_file() and not (tmp_path / "m.bin").exists()
    assert report["labels"] == ["drop", "keep"] and report["skipped"] == {"excluded": 10}
    assert report["accuracy"] >= 0.9
    out = run_batch(quality(model=str(tmp_path / "m.ftz"), label="keep"), docs(*texts(PROSE, 5, rng)))
    assert len(out.kept) == 5


@pytest.mark.parametrize("argv, message", [
    ([], "give --input FILE"),
    (["--input", "missing.jsonl"], "--input: no such file: missing.jsonl"),
    (["--positive", "p.jsonl"], "give --input FILE"),
    (["--input", "one_label.jsonl"], "need at least two labels"),
    (["--input", "one_label.jsonl", "--holdout", "1.5"], "--holdout must be in [0, 1)"),
    (["--input", "bad.jsonl"], "bad.jsonl:2: not a JSON line"),
    (["--input", "one_label.jsonl", "--label-field", "nothing"], "no usable record"),
    (["--input", "one_label.jsonl", "--epochs", "3"], "unrecognized arguments: --epochs 3"),
])
def test_user_errors_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "one_label.jsonl", [{"text": "a b c", "label": "x"}] * 5)
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": "x"}\nnot json\n')
    assert train_classifier.main([*argv, "--output", "m.bin"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "m.bin").exists()
