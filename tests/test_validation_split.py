"""``output.validation`` (issue 40): a deterministic held-out split, disjoint from training, near duplicates on
one side.

Every test but the last runs without Ray: the spec's field and hash, the split's rules
(:func:`pipeline.output.validation.split_documents`) on permuted input and on many near-duplicate pairs, its sizes,
the manifest's entry. The last runs one small job and holds the job's split to the same function.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.dedup.near_config import NearConfig, NearDedupParams
from pipeline.output.curated import Part, write_parquet
from pipeline.output.validation import (
    document_keys,
    held_bands,
    key_config,
    key_part,
    split_documents,
    split_part,
    threshold,
)
from pipeline.problems import SpecError
from pipeline.shard_format import Manifest, ShardFormatError, ShardInfo
from pipeline.spec import parse_spec

WORDS = [f"w{i}" for i in range(3000)]


def _texts(n: int, seed: int = 0, words: int = 100) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def _near(text: str) -> str:
    """The text with one word of a hundred changed: 5-word shingles at Jaccard about 0.9."""
    words = text.split()
    words[len(words) // 2] = "changed"
    return " ".join(words)


def _jaccard(a: str, b: str) -> float:
    """Jaccard of the two texts' shingle sets, as near_dedup verifies pairs (its default parameters)."""
    x, y = NearConfig.from_params(NearDedupParams()).shingle_sets([a, b])
    inter = len(np.intersect1d(x, y))
    return inter / (len(x) + len(y) - inter)


# ---- the spec ----------------------------------------------------------------------------------------------


def _spec(**output: object) -> dict:
    return {"name": "v", "inputs": [{"path": "/data/in"}], "output": {"path": "/data/out", **output}}


def test_without_validation_the_spec_hash_is_the_one_before_the_field():
    # the hash of this spec before output.validation existed (an earlier output stays resumable)
    assert parse_spec(_spec()).content_hash() == "261e6bba82bab3c7f2de938693e25f7b5b19c9a98c58f929b439cc71709d94bc"
    assert parse_spec(_spec(validation={"share": 0.01})).content_hash() != parse_spec(_spec()).content_hash()


@pytest.mark.parametrize(("validation", "message"), [
    ({}, "output.validation: give exactly one of share or documents"),
    ({"share": 0.1, "documents": 5}, "output.validation: give exactly one of share or documents"),
    ({"share": 1.0}, "output.validation.share: Input should be less than 1"),
    ({"documents": 0}, "output.validation.documents: Input should be greater than or equal to 1"),
])
def test_share_or_documents_exactly_one(validation, message):
    with pytest.raises(SpecError) as exc:
        parse_spec(_spec(validation=validation))
    assert str(exc.value).splitlines()[0] == message


def test_refused_without_tokenizer_and_with_split_by():
    with pytest.raises(SpecError, match=r"output.validation: needs a tokenizer"):
        parse_spec({**_spec(validation={"share": 0.1}, documents="jsonl"), "tokenizer": None})
    with pytest.raises(SpecError, match=r"output.validation: cannot be combined with output.split_by"):
        parse_spec(_spec(validation={"share": 0.1}, split_by="lang"))


# ---- the split's rules, in one process -------------------------------------------------------------------------


def test_the_split_is_the_same_for_any_order_of_the_documents():
    texts = _texts(600)
    ids = [f"d{i}" for i in range(len(texts))]
    for cfg in (key_config(["normalize"]), key_config(["normalize", "near_dedup"])):
        held, dropped = split_documents(ids, texts, cfg, share=0.05)
        order = list(range(len(ids)))
        random.Random(1).shuffle(order)
        again = split_documents([ids[i] for i in order], [texts[i] for i in order], cfg, share=0.05)
        assert (held, dropped) == again and held
        assert split_documents(ids, texts, cfg, documents=17) == split_documents(
            [ids[i] for i in order], [texts[i] for i in order], cfg, documents=17)


def test_near_duplicates_and_exact_duplicates_land_on_one_side():
    base = _texts(1500, seed=2)
    texts = [t for b in base for t in (b, _near(b))] + base[:100]  # 1500 near pairs, 100 exact copies
    ids = [f"n{i}" for i in range(len(texts))]
    cfg = key_config(["normalize"])
    assert min(_jaccard(texts[2 * i], texts[2 * i + 1]) for i in range(20)) > 0.88
    held, dropped = split_documents(ids, texts, cfg, share=0.05)
    train = set(ids) - held - dropped
    sel, bands = document_keys(ids, texts, cfg)
    held_keys = {int(k) for i, d in enumerate(ids) if d in held for k in bands[i]}
    # the guarantee: no training document shares an LSH band (near_dedup's bands) with a held-out one
    assert not [d for i, d in enumerate(ids) if d in train and held_keys & {int(k) for k in bands[i]}]
    pairs = [(ids[2 * i], ids[2 * i + 1]) for i in range(1500)] + [(ids[i * 2], ids[3000 + i]) for i in range(100)]
    sides = [({a, b} & held, {a, b} & train) for a, b in pairs]
    assert sum(1 for h, _ in sides if h) > 100  # many pairs have a held-out member
    crossing = [p for p, (h, t) in zip(pairs, sides, strict=True) if h and t]
    assert len(crossing) <= 2  # at Jaccard 0.9 a pair shares no band with probability about 0.001
    assert all(not ({a, b} & held and {a, b} & train) for a, b in pairs[1500:])  # exact copies: never split


def test_share_and_documents_are_honoured():
    texts = _texts(4000, seed=3)
    ids = [f"s{i}" for i in range(len(texts))]
    cfg = key_config(["normalize"])
    held, _ = split_documents(ids, texts, cfg, share=0.05)
    assert 200 - 4 * 14 <= len(held) <= 200 + 4 * 14  # binomial: within four standard deviations
    assert len(split_documents(ids, texts, cfg, documents=123)[0]) == 123  # distinct documents: exactly N
    assert len(split_documents(ids[:50], texts[:50], cfg, share=0.0001)[0]) == 1  # at least one


@pytest.mark.parametrize("size", [{"documents": 40}, {"share": 0.05}])
def test_part_by_part_the_split_is_the_whole_corpus_split(tmp_path, size):
    """What a job's tasks do per curated part (key, threshold, held-out bands, split) gives the one-process answer."""
    base = _texts(300, seed=5)
    texts = [t for b in base for t in (b, _near(b))]
    ids = [f"p{i}" for i in range(len(texts))]
    cfg, parts, bounds = key_config(["normalize"]), [], [0, 170, 171, 600]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        name = f"part-{lo:020d}.parquet"
        write_parquet(pa.table({"id": ids[lo:hi], "ord": list(range(lo, hi)), "text": texts[lo:hi]}),
                      str(tmp_path / "all" / name))
        parts.append(Part(name, hi - lo, lo))
    folder, keys = str(tmp_path / "all"), str(tmp_path / "keys")
    lows = [key_part(folder, p, cfg, keys, size.get("documents", 1)) for p in parts]
    cut = threshold(size.get("share"), size.get("documents"), lows)
    held = np.unique(np.concatenate([held_bands(keys, p, cut) for p in parts]))
    out = [split_part(folder, p, keys, cut, held, str(tmp_path / "train"), str(tmp_path / "val")) for p in parts]
    got = {d for s in out if s.validation for d in _part_ids(tmp_path / "val", s.validation)}
    train = {d for s in out if s.train for d in _part_ids(tmp_path / "train", s.train)}
    want, dropped = split_documents(ids, texts, cfg, **size)
    assert got == want and train == set(ids) - want - dropped and sum(s.dropped for s in out) == len(dropped)


def _part_ids(folder: Path, part: Part) -> list[str]:
    return pq.read_table(folder / part.name)["id"].to_pylist()


# ---- the manifest's entry --------------------------------------------------------------------------------------


def _manifest(**kw: object) -> Manifest:
    shard = ShardInfo(name="shards/shard-000000.tar", samples=1, tokens=4, sha256="a" * 64, bytes=4096, partial=True)
    return Manifest(spec_hash="s", tokenizer_hash="t", seq_len=8, dtype="uint16", vocab_size=300,
                    samples_per_shard=2, bos_id=None, eos_id=1, pad_id=0, has_loss_mask=False, shards=[shard], **kw)


def test_the_manifest_names_the_split_only_when_there_is_one():
    old = _manifest().to_json()
    assert "validation" not in old and Manifest.from_json(old).to_json() == old  # earlier manifests: same bytes
    entry = {"path": "validation", "documents": 3, "samples": 2, "tokens": 9}
    new = _manifest(validation=entry).to_json()
    assert json.loads(new)["validation"] == entry and Manifest.from_json(new).validation == entry
    for bad in ({**entry, "path": "../x"}, {**entry, "tokens": -1}, {"path": "validation"}):
        with pytest.raises(ShardFormatError, match="validation"):
            Manifest.from_json(json.dumps({**json.loads(old), "validation": bad}))


# ---- one small job ---------------------------------------------------------------------------------------------


def _job_corpus(folder: Path) -> tuple[list[str], list[str], tuple[str, str]]:
    """Distinct documents, one exact copy, and a near pair one of whose documents the split holds out."""
    cfg = key_config(["length"])
    texts = _texts(60, seed=4, words=60)
    seed = 100
    while True:  # a near pair whose first document is held out (so the pair tests the split)
        planted = _texts(1, seed=seed, words=60)[0]
        sel, _ = document_keys(["x"], [planted], cfg)
        if int(sel[0]) < 0.1 * 2 ** 64:
            break
        seed += 1
    texts += [planted, _near(planted), texts[0]]
    ids = [f"j{i}" for i in range(len(texts))]
    folder.mkdir()
    for f in range(3):
        (folder / f"p{f}.jsonl").write_text("".join(
            json.dumps({"id": ids[i], "text": texts[i]}) + "\n" for i in range(f, len(texts), 3)))
    return ids, texts, (ids[60], ids[61])


def test_a_job_holds_out_its_split_as_a_shard_set(tmp_path, ray_shared):
    from pipeline.job.engine import run_job
    from training.data import ShardLoader

    ids, texts, pair = _job_corpus(tmp_path / "in")
    spec = parse_spec({"name": "val", "inputs": [{"path": str(tmp_path / "in" / "*.jsonl")}],
                       "stages": [{"type": "length", "params": {"min_chars": 1}}],
                       "tokenizer": {"train": {"vocab_size": 300, "min_frequency": 1}},
                       "packing": {"seq_len": 64, "range_docs": 16},
                       "output": {"path": str(tmp_path / "out"), "samples_per_shard": 8, "documents": "jsonl",
                                  "validation": {"share": 0.1}},
                       "execution": {"parallelism": 2}})
    result = run_job(spec)
    out = tmp_path / "out"
    val_docs = [json.loads(line) for line in (out / "validation" / "documents.jsonl").open()]
    held = [d["id"] for d in val_docs]
    expected, dropped = split_documents(ids, texts, key_config(["length"]), share=0.1)
    assert sorted(held) == sorted(expected) and len(held) == len(set(held))  # the function's answer
    assert pair[0] in held and (pair[1] in held or pair[1] in dropped)  # the near pair: not in training
    assert ("j0" in held) == ("j62" in held)  # an exact copy: on the same side
    train_docs = {json.loads(line)["id"] for f in (out / "documents").iterdir() for line in f.open()}
    manifest = Manifest.load(out)
    shard_ids = _shard_doc_ids(out, manifest)
    assert train_docs == set(ids) - set(held) - dropped and not shard_ids & set(held) and shard_ids == train_docs
    val = Manifest.load(out / "validation")
    assert manifest.validation == {"path": "validation", "documents": len(held), "samples": val.total_samples,
                                   "tokens": val.total_tokens}
    assert _shard_doc_ids(out / "validation", val) == set(held)
    batches = list(ShardLoader(str(out / "validation"), 1, num_workers=0, shuffle=False).epoch_batches())
    assert len(batches) == val.total_samples and val.tokenizer_hash == manifest.tokenizer_hash
    assert result.stats["validation"]["dropped_near_validation"] == len(dropped)
    assert "## Validation split" in (out / "README.md").read_text()


def _shard_doc_ids(folder: Path, manifest: Manifest) -> set[str]:
    from pipeline.output.inspect import iter_samples

    return {d for s in iter_samples(folder, manifest) for d in s.meta["doc_ids"]}
