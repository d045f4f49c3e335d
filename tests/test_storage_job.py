"""A whole job reading from and writing to a local S3 server (moto) gives the local-disk run's shard set,
a later job deduplicates against its index in the bucket, and the trainer's loader streams from it."""

from __future__ import annotations

import json

import pytest

from pipeline import storage
from pipeline.job.engine import run_job
from pipeline.job.errors import JobError
from pipeline.shard_format import Manifest
from pipeline.spec import parse_spec
from tests.corpus_fixtures import clean_corpus, write_jsonl

pytestmark = [pytest.mark.ray]


def _spec(inputs: list[str], out: str, **over) -> object:
    spec = {
        "name": "s3",
        "inputs": [{"path": p} for p in inputs],
        "stages": [{"type": "normalize"}, {"type": "exact_dedup"}],
        "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 500}},
        "packing": {"seq_len": 128},
        "output": {"path": out, "samples_per_shard": 16},
        "execution": {"batch_size": 32, "parallelism": 2},
    }
    spec.update(over)
    return parse_spec(spec)


def test_a_job_on_s3_matches_the_local_run_and_feeds_dedup_and_the_loader(s3_endpoint, bucket, ray_shared, tmp_path):
    clean_corpus(tmp_path / "corpus", 200)
    for f in sorted((tmp_path / "corpus").iterdir()):
        storage.write_bytes(f"{bucket}/corpus/{f.name}", f.read_bytes())

    local = run_job(_spec([str(tmp_path / "corpus")], str(tmp_path / "out")))
    remote = run_job(_spec([f"{bucket}/corpus"], f"{bucket}/out"))
    m_local = Manifest.load(tmp_path / "out")
    m_remote = Manifest.from_json(storage.read_bytes(f"{bucket}/out/manifest.json"))
    assert m_remote.shards == m_local.shards and len(m_local.shards) >= 3  # names, counts, sha256: identical
    assert m_remote.tokenizer_hash == m_local.tokenizer_hash
    for s in m_remote.shards:
        assert storage.read_bytes(f"{bucket}/out/{s.name}") == (tmp_path / "out" / s.name).read_bytes()
    stats = json.loads(storage.read_text(f"{bucket}/out/stats.json"))
    assert [s["docs_out"] for s in stats["stages"]] == [s["docs_out"] for s in local.stats["stages"]]
    assert storage.list_files(f"{bucket}/out/.tokenmill/work") == []  # committed: nothing left staged
    assert storage.is_file(f"{bucket}/out/index/exact_dedup/meta.json")
    # the dataset card is written in the bucket as on disk (its text names the inputs, so only the figures compare)
    assert storage.read_text(f"{bucket}/out/README.md").startswith("---\npretty_name: ")
    for fig in ("card/funnel.svg", "card/lengths.png"):
        assert storage.read_bytes(f"{bucket}/out/{fig}") == (tmp_path / "out" / fig).read_bytes(), fig

    with pytest.raises(JobError, match="already holds a shard set"):  # a rerun is refused, nothing changes
        run_job(_spec([f"{bucket}/corpus"], f"{bucket}/out"))
    assert storage.read_bytes(f"{bucket}/out/manifest.json") == m_remote.to_json().encode()

    # a refresh: the old corpus plus 30 new documents, deduplicated against the index in the bucket
    write_jsonl(tmp_path / "new.jsonl", [{"id": f"new-{i}", "text": f"A new document number {i} about rivers."}
                                         for i in range(30)])
    storage.write_bytes(f"{bucket}/fresh/new.jsonl", (tmp_path / "new.jsonl").read_bytes())
    refresh = run_job(_spec([f"{bucket}/corpus", f"{bucket}/fresh/new.jsonl"], f"{bucket}/v2",
                            stages=[{"type": "exact_dedup", "params": {"dedup_against": f"{bucket}/out"}}],
                            tokenizer=None, output={"path": f"{bucket}/v2", "documents": "jsonl"}))
    dedup = next(s for s in refresh.stats["stages"] if s["stage"].endswith("exact_dedup"))
    assert dedup["docs_out"] == 30 and sum(dedup["dropped"].values()) == 200
    index = json.loads(storage.read_text(f"{bucket}/v2/documents.json"))
    assert index["rows"] == 30

    # the trainer's loader reads the same batches from the bucket as from the disk
    from training.data import ShardLoader

    def batches(location: str) -> list[list[int]]:
        loader = ShardLoader(location, 4, num_workers=0, max_epochs=1, shuffle=False)
        return [b["input_ids"].flatten().tolist() for b in loader]

    assert batches(f"{bucket}/out") == batches(str(tmp_path / "out")) != []
    assert remote.stats["output"] == local.stats["output"]
