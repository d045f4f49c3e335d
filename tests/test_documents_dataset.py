"""``OUT/documents/`` is a dataset folder (issue 22): it holds only its parts (the index is ``OUT/documents.json``),
and Parquet ``meta`` is a struct every part shares, so pandas, pyarrow, DuckDB, polars and HF datasets read
every document with ``meta.<field>`` addressable, and ``format: documents`` gives the same meta back.

The job test compares each reader's values with the JSONL documents output of the same job (meta as JSON
objects, a path that never goes through a struct). The unit tests run the export functions on curated parts
without Ray: the fallbacks to JSON text (a type conflict, a key null in some documents and absent in others,
a value the struct cannot hold exactly, every meta empty) and an older output (``index.json``, JSON meta).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.documents import Drop, docs_to_table
from pipeline.job.engine import run_job
from pipeline.output.curated import Part, export_documents, profile_documents, write_part
from pipeline.output.documents_meta import (
    EMPTY_FIELD,
    MetaRules,
    decode_meta,
    encode_meta,
    profile_meta,
    unify_meta,
)
from pipeline.output.inspect import documents_index_name, iter_documents, load_documents_index
from pipeline.readers import expand_inputs, read_file
from pipeline.spec import InputSpec, parse_spec
from tests.corpus_fixtures import make_text, write_jsonl

GERMAN = "der die das und ist nicht ein eine mit auf für von zu den dem im sich auch es wird Haus Stadt Zeit".split()
N_DOCS = 60


def _records() -> list[dict[str, Any]]:
    """Records whose own fields land in meta, differing per document: a list of structs on some, a dict
    whose keys vary, an always-null field, a number that is an int in some documents and a fraction in others."""
    rng = random.Random(7)
    out = []
    for i in range(N_DOCS):
        text = " ".join(rng.choice(GERMAN) for _ in range(80)) if i % 5 == 0 else make_text(rng, 80)
        rec: dict[str, Any] = {"id": f"d{i}", "text": text, "url": f"https://example.org/{i}", "note": None,
                               "info": {"n": i, f"k{i % 3}": i % 2 == 0}, "weight": i if i % 2 else i + 0.5}
        if i % 4 == 0:
            rec["spans"] = [{"start": 0, "end": 4, "type": "EMAIL", "score": 0.5}] * (i % 8 // 4 + 1)
        elif i % 4 == 1:
            rec["spans"] = []
        out.append(rec)
    return out


def _job(tmp: Path, name: str, fmt: str, parallelism: int) -> Path:
    out = tmp / name
    stages = [{"type": "lid", "params": {"mode": "annotate", "languages": ["en"]}},
              {"type": "gopher_quality", "params": {"mode": "annotate"}}]
    run_job(parse_spec({
        "name": name, "inputs": [{"path": str(tmp / "in.jsonl")}], "stages": stages, "tokenizer": None,
        "packing": {"range_docs": 16},
        "output": {"path": str(out), "documents": fmt}, "execution": {"batch_size": 8, "parallelism": parallelism},
    }))
    return out / "documents"


@pytest.fixture(scope="module")
def outputs(ray_shared, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    write_jsonl(tmp / "in.jsonl", _records())
    jsonl = _job(tmp, "jsonl", "jsonl", 2)
    want = {r["id"]: r["meta"] for p in sorted(jsonl.glob("part-*.jsonl"))
            for r in map(json.loads, p.read_text().splitlines())}
    return tmp, _job(tmp, "parquet", "parquet", 2), want


@pytest.mark.ray
def test_jsonl_documents_keep_meta_as_objects(outputs):
    _, _, want = outputs
    assert len(want) == N_DOCS
    assert all(isinstance(m, dict) and m["lang"] and m["filters"]["gopher_quality"]["keep"] in (True, False)
               for m in want.values())
    assert {m["lang"] for m in want.values()} >= {"en", "de"}  # lid ran: values differ per document


@pytest.mark.ray
def test_the_folder_is_a_dataset_with_a_struct_meta(outputs):
    _, docs, want = outputs
    index = json.loads((docs.parent / "documents.json").read_text())
    assert index["meta"] == "struct" and index["rows"] == N_DOCS
    assert sorted(p.name for p in docs.iterdir()) == [p["name"].split("/")[1] for p in index["parts"]]  # parts only
    parts = sorted(docs.glob("part-*.parquet"))
    assert len(parts) == len(index["parts"]) == 4  # 60 documents, 16 a part
    schemas = {pq.read_schema(p) for p in parts}
    assert len(schemas) == 1 and pa.types.is_struct(schemas.pop().field("meta").type)
    assert load_documents_index(docs.parent).meta == "struct"
    assert documents_index_name(docs.parent) == "documents.json"
    # what the pipeline wrote, decoded back: the same dicts as the JSONL output's objects
    assert {d["id"]: d["meta"] for d in iter_documents(docs.parent, load_documents_index(docs.parent))} == want


@pytest.mark.ray
def test_pandas_and_pyarrow_read_every_document(outputs):
    import pandas as pd
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    _, docs, want = outputs
    df = pd.read_parquet(docs)
    assert sorted(df["id"]) == sorted(want)
    assert {i: m["lang"] for i, m in zip(df["id"], df["meta"], strict=True)} == {i: m["lang"] for i, m in want.items()}
    arrow_df = pd.read_parquet(docs, dtype_backend="pyarrow")
    langs = arrow_df["meta"].struct.field("lang")
    assert dict(zip(arrow_df["id"], langs, strict=True)) == {i: m["lang"] for i, m in want.items()}

    table = ds.dataset(docs, format="parquet").to_table()
    assert table.num_rows == N_DOCS
    keep = pc.struct_field(pc.struct_field(pc.struct_field(table["meta"], "filters"), "gopher_quality"), "keep")
    got = dict(zip(table["id"].to_pylist(), keep.to_pylist(), strict=True))
    assert got == {i: m["filters"]["gopher_quality"]["keep"] for i, m in want.items()}
    weights = dict(zip(table["id"].to_pylist(), pc.struct_field(table["meta"], "weight").to_pylist(), strict=True))
    assert weights == {i: m["weight"] for i, m in want.items()}  # ints and fractions: one double field


@pytest.mark.ray
def test_duckdb_and_polars_address_meta_fields(outputs):
    import duckdb
    import polars as pl

    _, docs, want = outputs
    rows = duckdb.sql(f"SELECT id, meta.lang, meta.url, meta.spans FROM read_parquet('{docs}/*.parquet')").fetchall()
    assert len(rows) == N_DOCS
    assert {r[0]: (r[1], r[2]) for r in rows} == {i: (m["lang"], m["url"]) for i, m in want.items()}
    # a list of structs: the documents without the key read as NULL, the others as they were
    assert {r[0]: r[3] for r in rows} == {i: m.get("spans") for i, m in want.items()}

    for df in (pl.read_parquet(str(docs)), pl.read_parquet(str(docs / "*.parquet"))):  # the folder, or a glob
        assert df.height == N_DOCS
        got = dict(zip(df["id"], df.select(pl.col("meta").struct.field("lang"))["lang"], strict=True))
        assert got == {i: m["lang"] for i, m in want.items()}


@pytest.mark.ray
def test_hf_datasets_reads_every_document(outputs, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    import datasets

    _, docs, want = outputs
    for ds in (datasets.load_dataset(str(docs), split="train", cache_dir=str(tmp_path / "a")),
               datasets.load_dataset("parquet", data_dir=str(docs), split="train", cache_dir=str(tmp_path / "b")),
               datasets.load_dataset("parquet", data_files=str(docs / "*.parquet"), split="train",
                                     cache_dir=str(tmp_path / "c"))):
        assert ds.num_rows == N_DOCS
        assert {row["id"]: row["meta"]["lang"] for row in ds} == {i: m["lang"] for i, m in want.items()}
        assert {row["id"]: row["meta"]["info"]["n"] for row in ds} == {i: m["info"]["n"] for i, m in want.items()}


@pytest.mark.ray
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_the_output_is_a_hub_dataset_its_card_the_readme(outputs, tmp_path, monkeypatch, fmt):
    """Issue 39: ``load_dataset(OUT)`` reads the documents alone (the card's ``configs``; without them every file
    of the folder, ``stats.json`` and ``rejected/`` included, and a CastError), the Hub's loader reads the card,
    whose ``language`` is the kept documents', and neither the card nor its spec holds the machine's paths."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    import datasets
    from huggingface_hub import DatasetCard

    tmp, _, want = outputs
    out = tmp / fmt
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "a"))
    assert {row["id"] for row in ds} == set(want) and "text" in ds.column_names
    card = DatasetCard.load(out / "README.md")
    assert card.data.language == sorted({row["meta"]["lang"] for row in ds})
    assert not (out / "CARD.md").exists()
    for name in ("README.md", "card/spec.yaml"):
        assert str(tmp) not in (out / name).read_text(), name
    assert yaml.safe_load((out / "card" / "spec.yaml").read_text())["inputs"][0]["path"] == "in.jsonl"


@pytest.mark.ray
def test_format_documents_reads_the_output_back_exactly(outputs):
    _, docs, want = outputs
    for path in (str(docs), str(docs / "*.parquet")):  # the folder or the parts
        spec = InputSpec(path=path, format="documents")
        items = [it for i, s, f in expand_inputs([spec]) for it in read_file(i, f, s)]
        assert not [it for it in items if isinstance(it, Drop)]
        assert {d["id"]: json.loads(d["meta"]) for d in items} == want


@pytest.mark.ray
def test_parts_are_the_same_bytes_at_any_parallelism(outputs):
    tmp, docs, _ = outputs
    other = _job(tmp, "parquet-1", "parquet", 1)
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in docs.glob("part-*")}
    assert digest == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in other.glob("part-*")}
    assert (docs.parent / "documents.json").read_text() == (other.parent / "documents.json").read_text()


# ---- the export functions on curated parts, without Ray ----------------------------------------------------

def _curated(tmp: Path, metas: list[Any], per_part: int = 2) -> tuple[str, list[Part]]:
    folder = tmp / "curated"
    folder.mkdir()
    parts = []
    for lo in range(0, len(metas), per_part):
        docs = [{"id": f"d{i}", "text": f"text {i}", "source": "s", "ord": i, "meta": m}
                for i, m in enumerate(metas[lo:lo + per_part], start=lo)]
        row = write_part(docs_to_table(docs), str(folder)).to_pylist()[0]
        parts.append(Part.from_json(row))
    return str(folder), parts


def _export(tmp: Path, metas: list[Any]) -> tuple[dict[str, str], list[Any]]:
    """The documents export as the finalize phase runs it (ranges of 2), then read back with ``format: documents``."""
    folder, parts = _curated(tmp, metas)
    bounds = [(lo, min(lo + 2, len(metas))) for lo in range(0, len(metas), 2)]
    plan = unify_meta([profile_documents(folder, parts, lo, hi) for lo, hi in bounds])
    dest = tmp / "out" / "documents"
    dest.mkdir(parents=True)
    listing = [export_documents(folder, parts, k, lo, hi, str(dest), "parquet", plan)
               for k, (lo, hi) in enumerate(bounds)]
    assert all(entry is not None for entry in listing)
    spec = InputSpec(path=str(dest), format="documents")
    back = [json.loads(d["meta"]) for i, s, f in expand_inputs([spec]) for d in read_file(i, f, s)]
    return plan.to_json(), back


def test_a_type_conflict_stores_every_part_as_json_text(tmp_path):
    metas = [{"user": "a", "lang": "en"}, {"user": "b"}, {"user": 3, "lang": "de"}, {"lang": "fr"}]
    index, back = _export(tmp_path, metas)
    assert index["meta"] == "json" and "meta" in index["meta_fallback"]
    assert back == metas
    for p in sorted((tmp_path / "out" / "documents").glob("*.parquet")):
        assert pq.read_schema(p).field("meta").type == pa.string()


def test_every_meta_empty_is_json_text(tmp_path):
    index, back = _export(tmp_path, [{}, {}, {}])
    assert index == {"meta": "json", "meta_fallback": "every meta is empty"}
    assert back == [{}, {}, {}]
    table = pq.read_table(sorted((tmp_path / "out" / "documents").glob("*.parquet"))[0])
    assert table["meta"].to_pylist() == ["{}", "{}"]


def test_null_and_absent_for_one_key_fall_back_but_each_alone_is_a_struct(tmp_path):
    conflict = [{"url": None, "a": 1}, {"a": 2}]
    assert unify_meta([profile_meta(conflict)]).reason == "meta.url is null in some documents and absent in others"
    metas = [{"reason": None, "scores": {"x": 0.5}, "e": {}, "pii": [{"start": 0, "end": 2}]},
             {"reason": "r", "scores": {"y": 1.5}, "pii": []},
             {"reason": None, "scores": {}, "e": {}, "l": [{}, None]}]
    index, back = _export(tmp_path, metas)
    assert index == {"meta": "struct"} and back == metas
    plan = unify_meta([profile_meta(metas)])
    assert plan.rules == MetaRules(frozenset({("reason",)}), frozenset({("e",), ("l", None)}))
    assert plan.type.field("e").type == pa.struct([(EMPTY_FIELD, pa.null())])  # no Parquet struct without fields


def test_a_value_the_struct_cannot_hold_exactly_is_refused(tmp_path):
    """An int past 2**53 in a field that also holds fractions: the double would change it, so the part is
    not written (the finalize phase then writes every part as JSON text)."""
    metas = [{"n": 2**60 + 1}, {"n": 0.5}]
    plan = unify_meta([profile_meta(metas[:1]), profile_meta(metas[1:])])
    assert plan.mode == "struct" and encode_meta(metas[1:], plan) is not None
    assert encode_meta(metas[:1], plan) is None
    folder, parts = _curated(tmp_path, metas, per_part=1)
    assert export_documents(folder, parts, 0, 0, 1, str(tmp_path), "parquet", plan) is None
    assert not list(tmp_path.glob("part-*"))


def test_an_old_output_with_index_json_and_json_meta_still_reads(tmp_path):
    docs = tmp_path / "old" / "documents"
    docs.mkdir(parents=True)
    metas = [{"lang": "en", "filters": {"f": {"keep": True, "reason": None}}}, {"lang": "de", "x": [1, 2]}]
    table = docs_to_table([{"id": f"d{i}", "text": f"t{i}", "source": "s", "ord": i, "meta": m}
                           for i, m in enumerate(metas)])
    pq.write_table(table, docs / "part-000000.parquet")
    data = (docs / "part-000000.parquet").read_bytes()
    (docs / "index.json").write_text(json.dumps({"format": 1, "documents": "parquet", "rows": 2, "parts": [
        {"name": "documents/part-000000.parquet", "rows": 2, "first_row": 0,
         "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}]}))
    assert documents_index_name(docs.parent) == "documents/index.json"
    index = load_documents_index(docs.parent)
    assert index.meta == "json" and [d["meta"] for d in iter_documents(docs.parent, index)] == metas
    spec = InputSpec(path=str(docs), format="documents")
    items = [it for i, s, f in expand_inputs([spec]) for it in read_file(i, f, s)]
    assert [json.loads(d["meta"]) for d in items] == metas  # index.json skipped, not read as records


def test_decode_without_rules_reads_nulls_as_absent():
    """A struct-meta Parquet file from elsewhere (no tokenmill metadata): a null field is no key."""
    assert decode_meta({"a": 1, "b": None, "c": {"d": None}}, MetaRules.from_metadata(None)) == {"a": 1, "c": {}}
    assert MetaRules.from_metadata({b"tokenmill.meta": b"not json"}) == MetaRules()
