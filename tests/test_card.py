"""Dataset cards from recorded stats (no Ray): the Hub's loader, languages, figures, determinism, comparison.

The card of a real job (lid, gopher_quality, pii, decontaminate) is checked in tests/test_readme.py (the README's
own job) and its determinism across two runs of one spec in tests/test_job.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from pipeline.card.build import write_card
from pipeline.card.cli import main as card_main
from pipeline.card.collect import collect, spec_for_card
from pipeline.card.markdown import size_category
from pipeline.card.profile import KeptProfile, log2_bin, merge_profiles

SPEC = {"name": "cardtest", "inputs": [{"path": "/data/web/*.jsonl", "format": "auto"}],
        "stages": [{"type": "normalize"}, {"type": "lid", "params": {"languages": ["en", "de"]}},
                   {"type": "gopher_quality"},
                   {"type": "pii", "params": {"salt": "s" * 20, "actions": {"EMAIL_ADDRESS": "hash"}}},
                   {"type": "decontaminate", "params": {"benchmarks": ["/b/*.jsonl"]}}],
        "output": {"path": "/somewhere/out", "documents": "parquet", "card_compare": ["/x"]}}


def _profile() -> dict:
    p = KeptProfile((0,))
    for i, (text, lang) in enumerate([("hello world " * 20, "en"), ("guten tag " * 50, "de"), ("hi there", "en")]):
        p.add(i * 8, text, len(text) // 4, json.dumps({"lang": lang}))
    return p.to_json()


def _stats(docs_out: int = 3, lang_de: int = 1) -> dict:
    return {
        "job": "cardtest",
        "packing": {"method": "best_fit", "seq_len": 128, "docs": docs_out, "docs_cut": 0, "cut_fraction": 0.0,
                    "sequences": 2, "tokens": 200, "utilization": 0.78, "ranges": 1},
        "stages": [
            {"stage": "00-read", "docs_in": 10, "docs_out": 10, "dropped": {}, "bytes_in": 0, "bytes_out": 900},
            {"stage": "01-normalize", "docs_in": 10, "docs_out": 10, "dropped": {}},
            {"stage": "02-lid", "docs_in": 10, "docs_out": 8, "dropped": {"lid:language": 2},
             "counters": {"lang:en": 7, "lang:de": lang_de, "lang:fr": 2}},
            {"stage": "03-gopher_quality", "docs_in": 8, "docs_out": 5, "dropped": {"gopher_quality:min_words": 3}},
            {"stage": "04-pii", "docs_in": 5, "docs_out": 5, "dropped": {},
             "counters": {"entity:EMAIL_ADDRESS": 2, "entity:PHONE_NUMBER": 1, "docs_with_pii": 2}},
            {"stage": "05-decontaminate", "docs_in": 5, "docs_out": docs_out, "dropped": {"decontaminate:arith": 2},
             "counters": {"docs:arith": 2, "matches:arith": 2, "exact_docs:arith": 1, "rule:arith:span": 2,
                          "item:arith:q1": 2}},
            {"stage": "90-tokenize", "docs_in": docs_out, "docs_out": docs_out, "dropped": {}},
        ],
        "output": {"shards": 1, "samples": 2, "tokens": 200},
        "documents": {"format": "parquet", "parts": 1, "rows": docs_out},
        "inputs": [{"path": "/data/web/*.jsonl", "format": "auto", "files": 1, "bytes": 1234, "sha256": "ab" * 32}],
        "profile": _profile(),
    }


def _output(folder: Path, **kw) -> Path:
    folder.mkdir(parents=True)
    (folder / "stats.json").write_text(json.dumps(_stats(**kw)))
    (folder / "manifest.json").write_text(json.dumps({"spec_hash": "cd" * 32, "tokenizer_hash": "ef" * 32,
                                                      "vocab_size": 400}))
    (folder / "documents.json").write_text(json.dumps({"documents": "parquet", "rows": kw.get("docs_out", 3)}))
    (folder / "documents").mkdir()
    (folder / "documents" / "part-000000.parquet").write_bytes(b"")
    rejected = folder / "rejected" / "03-gopher_quality"
    rejected.mkdir(parents=True)
    (rejected / "part-a1-x.jsonl").write_text("".join(json.dumps({"text": "short " * n}) + "\n" for n in (1, 3, 9)))
    return folder


def _figures(card: str) -> list[str]:
    return re.findall(r"\]\((card/[a-z]+\.(?:svg|png))\)", card)


def test_the_card_loads_as_a_hub_dataset_card_with_the_kept_languages(tmp_path):
    from huggingface_hub import DatasetCard

    out = _output(tmp_path / "out")
    names = write_card(str(out), spec_json=SPEC)
    assert names[0] == "README.md" and not (out / "CARD.md").exists()
    card = DatasetCard.load(out / "README.md")
    data = card.data.to_dict()
    stats = json.loads((out / "stats.json").read_text())
    # the kept documents' languages, not every one lid saw (fr: counted, all dropped); those are a table
    assert data["language"] == sorted(stats["profile"]["languages"]) == ["de", "en"]
    assert "| fr | 2 | 20.0 % | - |" in card.text
    assert data["size_categories"] == ["n<1K"] and data["task_categories"] == ["text-generation"]
    assert data["configs"][0]["data_files"][0]["path"] == "documents/*.parquet"
    assert list(out.glob(data["configs"][0]["data_files"][0]["path"]))
    assert data["tokenmill"]["spec_hash"] == "cd" * 32 and data["tokenmill"]["inputs"][0]["sha256"] == "ab" * 32
    assert data["tokenmill"]["inputs"][0]["path"] == "*.jsonl"  # /data/web shares no folder with /somewhere/out
    assert set(data["tokenmill"]["versions"]) == {"tokenmill", "ray", "tokenizers"}
    for section in ("## Sources", "## Pipeline", "## Funnel", "## Languages", "## Document lengths", "## PII",
                    "## Benchmark contamination", "## Tokenizer", "## Rebuild"):
        assert section in card.text, section
    assert "| EMAIL_ADDRESS | 2 | hash |" in card.text and "| PHONE_NUMBER | 1 | placeholder |" in card.text
    assert "| arith | 2 | 1 | span: 2 | 1 | q1 |" in card.text
    assert "gopher_quality:min_words" in card.text and "s" * 20 not in card.text  # the salt never published
    referenced = _figures(card.text)
    assert {f"card/{n}.svg" for n in ("funnel", "drops", "languages", "sources", "lengths")} <= set(referenced)
    assert set(referenced) <= set(names)
    for name in referenced:
        data_ = (out / name).read_bytes()
        if name.endswith(".svg"):
            assert ET.fromstring(data_).tag.endswith("svg")
        else:
            from PIL import Image

            assert Image.open(io.BytesIO(data_)).format == "PNG"


def test_the_same_data_gives_the_same_bytes_wherever_it_lies(tmp_path):
    a, b = _output(tmp_path / "a"), _output(tmp_path / "b")
    names = write_card(str(a), spec_json=SPEC)
    assert write_card(str(b), spec_json=SPEC) == names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    svg = (a / "card" / "funnel.svg").read_text()
    assert "<dc:date>" not in svg and "Matplotlib v" not in svg


def test_the_published_spec_is_redacted_and_rebuilds_beside_the_card():
    spec = spec_for_card(SPEC)
    assert spec["stages"][3]["params"]["salt"] == "<redacted>"
    assert spec["output"]["path"] == "rebuilt" and "card_compare" not in spec["output"]
    assert SPEC["output"]["path"] == "/somewhere/out"  # the job's spec is not changed


def test_a_version_card_compares_with_its_predecessor(tmp_path):
    v1 = _output(tmp_path / "v000001", docs_out=3, lang_de=1)
    v2 = _output(tmp_path / "v000002", docs_out=2, lang_de=4)
    names = write_card(str(v2), compare=[str(v1)])
    text = (v2 / "README.md").read_text()
    assert "## Compared with v000001" in text
    assert "| documents kept | 3 | 2 | -1 |" in text and "| language de (lid) | 1 | 4 | +3 |" in text
    assert "card/versions.svg" in names and "card/versions.svg" in text


def test_tokenmill_card_rebuilds_and_refuses_a_folder_without_stats(tmp_path, capsys):
    out = _output(tmp_path / "out")
    assert card_main([str(out)]) == 0 and (out / "README.md").exists()
    assert card_main([str(tmp_path / "nothing")]) == 2
    assert "no stats.json" in capsys.readouterr().err
    assert "predates `card/spec.yaml`" in (out / "README.md").read_text()


def test_profiles_merge_exactly_and_sample_words_by_position():
    p = _profile()
    assert p["languages"]["en"]["docs"] == 2 and p["languages"]["en"]["sample_docs"] == 2
    merged = merge_profiles([p, p, None])
    assert merged is not None
    assert merged["languages"]["de"]["tokens"] == 2 * p["languages"]["de"]["tokens"]
    assert sum(merged["chars"].values()) == 6 and merged["sources"]["0"]["docs"] == 6
    assert merge_profiles([None]) is None
    assert [log2_bin(n) for n in (0, 1, 2, 3, 4, 1023, 1024)] == [0, 0, 1, 1, 2, 9, 10]


def test_size_categories_follow_the_hub():
    assert [size_category(n) for n in (0, 999, 1000, 5_000_000)] == ["n<1K", "n<1K", "1K<n<10K", "1M<n<10M"]


def test_a_folder_without_stats_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no stats.json"):
        collect(str(tmp_path))


def test_the_front_matter_is_plain_yaml(tmp_path):
    out = _output(tmp_path / "out")
    write_card(str(out), spec_json=SPEC)
    front = (out / "README.md").read_text().split("---\n")[1]
    assert yaml.safe_load(front)["pretty_name"] == "cardtest"


def test_tokenmill_card_lists_a_rebuilt_card_in_the_marker_of_an_older_output(tmp_path):
    """An output finished before cards were its README (its card in CARD.md): the card written afterwards is
    README.md, listed so it is served and replaced, and CARD.md is gone from the folder and the marker."""
    out = _output(tmp_path / "out")
    (out / ".tokenmill").mkdir()
    (out / "CARD.md").write_text("---\npretty_name: old\n---\n")
    files = ["stats.json", "manifest.json", "documents.json", "documents/part-000000.parquet",
             "rejected/03-gopher_quality/part-a1-x.jsonl"]
    (out / ".tokenmill" / "marker.json").write_text(json.dumps(
        {"tool": "tokenmill", "format": 1, "created": "x", "files": [*files, "CARD.md"]}))
    assert card_main([str(out)]) == 0
    listed = json.loads((out / ".tokenmill" / "marker.json").read_text())["files"]
    assert listed[:len(files)] == files and {"README.md", "card/funnel.svg", "card/funnel.png"} <= set(listed)
    assert "CARD.md" not in listed and not (out / "CARD.md").exists()
    assert all((out / name).is_file() for name in listed)


def test_a_card_that_cannot_be_made_is_a_warning_event_not_a_failed_job(tmp_path):
    """finalize stages the card; when it fails (here: no stats.json staged) the job goes on, with a warning."""
    from types import SimpleNamespace

    from pipeline.job import events as ev
    from pipeline.job.finalize import _stage_card
    from pipeline.spec import parse_spec

    stage = tmp_path / "stage"
    stage.mkdir()
    events: list[ev.Event] = []
    spec = parse_spec({**SPEC, "output": {"path": str(tmp_path / "out")}})
    _stage_card(SimpleNamespace(stage=str(stage), spec=spec, emit=events.append))
    assert [type(e).__name__ for e in events] == ["LogLine"]
    assert events[0].level == "warning" and "card: not written" in events[0].message and "no stats.json" in \
        events[0].message
    assert not (stage / "card").exists() and not (stage / "README.md").exists()


def test_tokenmill_card_compares_with_another_output(tmp_path):
    a, b = _output(tmp_path / "a", docs_out=3), _output(tmp_path / "b", docs_out=2)
    assert card_main([str(b), "--compare", str(a)]) == 0
    text = (b / "README.md").read_text()
    assert "## Compared with a" in text and "| documents kept | 3 | 2 | -1 |" in text
    assert card_main([str(b), "--compare", str(tmp_path / "missing")]) == 2


@pytest.mark.parametrize("meta", ["struct", "json", "jsonl"])
def test_a_job_without_a_profile_lists_its_documents_languages(tmp_path, meta):
    """A job that only curated has no profile: ``language`` is read from the documents' ``meta.lang``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from huggingface_hub import DatasetCard

    out = _output(tmp_path / "out")
    stats = json.loads((out / "stats.json").read_text())
    del stats["profile"]
    (out / "stats.json").write_text(json.dumps(stats))
    metas = [{"lang": "en"}, {"lang": "de"}, {"lang": "en"}, {}]
    (out / "documents" / "part-000000.parquet").unlink()
    if meta == "jsonl":
        (out / "documents.json").write_text(json.dumps({"documents": "jsonl", "rows": 4}))
        (out / "documents" / "part-000000.jsonl").write_text("".join(
            json.dumps({"id": str(i), "text": "x", "meta": m}) + "\n" for i, m in enumerate(metas)))
    else:
        column = [json.dumps(m) for m in metas] if meta == "json" else metas[:3] + [{"lang": None}]
        pq.write_table(pa.table({"id": ["0", "1", "2", "3"], "meta": column}),
                       out / "documents" / "part-000000.parquet")
    write_card(str(out), spec_json=SPEC)
    assert DatasetCard.load(out / "README.md").data.language == ["de", "en"]  # lid counted fr as well


def test_no_local_path_in_the_card_or_its_spec(tmp_path):
    """Every path of the spec and of stats.json's inputs: relative to the deepest folder they share (a spec put
    there reads them again), else its name; with a fingerprint, listed; the same card wherever the output lies."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "arith.jsonl").write_text('{"q": 1}\n')
    digest = hashlib.sha256(b'{"q": 1}\n').hexdigest()[:16]
    spec = json.loads(json.dumps(SPEC))
    spec["inputs"][0]["path"] = str(tmp_path / "data" / "*.jsonl")
    spec["stages"][4]["params"]["benchmarks"] = [str(tmp_path / "bench" / "arith.jsonl")]
    spec["tokenizer"] = {"path": "s3://bucket/tokenizer.json"}
    for model, bench, inputs in ((None, "bench/arith.jsonl", "data/*.jsonl"),
                                 ("file:///elsewhere/lid.bin", "arith.jsonl", "*.jsonl")):  # sharing only /
        spec["stages"][1]["params"]["model"] = model
        cards = []
        for where in ("a", "b/deeper"):
            out = _output(tmp_path / where / "out")
            stats = json.loads((out / "stats.json").read_text())
            stats["inputs"][0]["path"] = spec["inputs"][0]["path"]
            (out / "stats.json").write_text(json.dumps(stats))
            write_card(str(out), spec_json={**spec, "output": {"path": str(out)}})
            cards.append([(out / n).read_text() for n in ("README.md", "card/spec.yaml", "card/redacted.json")])
            shutil.rmtree(tmp_path / where)
        assert cards[0] == cards[1]
        text, published, _ = cards[0]
        for t in (text, published):
            assert str(tmp_path) not in t and "/elsewhere" not in t and "file:" not in t
        written = yaml.safe_load(published)
        assert written["tokenizer"]["path"] == "s3://bucket/tokenizer.json"  # a URI names no local folder
        assert (written["stages"][4]["params"]["benchmarks"][0], written["inputs"][0]["path"]) == (bench, inputs)
        assert re.search(r"inputs:\n- path: \S*\*\.jsonl", text)  # the front matter's inputs too
        assert f"| stages\\[4\\].params.benchmarks\\[0\\] | {bench} | {digest} |" in text
        assert f"| inputs\\[0\\].path | {inputs.replace('*', chr(92) + '*')} | {'ab' * 8} |" in text
        if model:
            assert written["stages"][1]["params"]["model"] == "lid.bin"
            assert "| stages\\[1\\].params.model | lid.bin | - |" in text  # no such file here: no fingerprint


def test_tokenmill_card_takes_the_paths_out_of_an_older_spec_and_keeps_the_list(tmp_path):
    out = _output(tmp_path / "out")
    stats = json.loads((out / "stats.json").read_text())
    stats["inputs"][0]["path"] = "/home/me/web.jsonl"
    (out / "stats.json").write_text(json.dumps(stats))
    (out / "card").mkdir()
    (out / "card" / "spec.yaml").write_text(yaml.safe_dump({**SPEC, "inputs": [{"path": "/home/me/web.jsonl"}]}))
    assert card_main([str(out)]) == 0
    assert "/home/me" not in (out / "card" / "spec.yaml").read_text() + (out / "README.md").read_text()
    assert card_main([str(out)]) == 0  # built again from the spec as published: the list stays
    assert "| inputs\\[0\\].path | web.jsonl |" in (out / "README.md").read_text()


def test_an_output_without_documents_loads_its_token_shards(tmp_path):
    from pipeline.card.markdown import dataset_configs

    out = _output(tmp_path / "out")
    (out / "documents.json").unlink()
    d = collect(str(out))
    assert dataset_configs(d) == [{"config_name": "default", "data_files": [{"split": "train",
                                                                             "path": "shards/*.tar"}]}]
    d.stats["groups"] = {"en": {}, "de": {}}
    assert [(c["config_name"], c["data_files"][0]["path"], c.get("default")) for c in dataset_configs(d)] == \
        [("de", "de/shards/*.tar", True), ("en", "en/shards/*.tar", None)]
