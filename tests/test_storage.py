"""The storage layer: its one atomic write on a local disk (a failure leaves neither a temporary file nor
the target; the temporary names a write makes are exactly those cleanup recognises), and on a local S3
server (moto): files, globs, readers, and the object-store output's ownership, lock and commit protocol
(manifest = commit point). No Ray here: tests/test_storage_job.py runs whole jobs against the same server."""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import storage
from pipeline.output.layout import OutputError
from pipeline.output.local_store import OutputDir
from pipeline.output.object_store import ObjectOutputDir
from pipeline.output.open_store import check_not_overlapping, open_output_dir
from pipeline.readers import expand_inputs, read_file
from pipeline.spec import InputSpec
from tests.corpus_fixtures import clean_corpus

REPO = Path(__file__).resolve().parents[1]


class Killed(BaseException):
    """The writer dies here (not an Exception: nothing in between may catch it)."""


@pytest.mark.parametrize("fail_at", ["write", "fsync", "rename", "block"])
@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_local_write_leaves_no_temp_file_and_no_new_target(tmp_path, monkeypatch, fail_at, existing):
    """Whatever step fails (the data, the fsync, the rename, the caller's own block), the folder holds what
    it held before: the old target or none, and no temporary file."""
    target = tmp_path / "shard-000000.tar"
    if existing:
        target.write_bytes(b"old")
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fail(*_args: object) -> None:
        raise full

    if fail_at == "fsync":
        monkeypatch.setattr(os, "fsync", fail)
    elif fail_at == "rename":
        monkeypatch.setattr(os, "replace", fail)
    with pytest.raises((OSError, Killed)) as err:
        with storage.open_output(str(target)) as f:
            f.write(b"x" * 100_000)
            if fail_at == "write":
                raise full
            if fail_at == "block":
                raise Killed
    assert os.listdir(tmp_path) == (["shard-000000.tar"] if existing else [])
    assert not existing or target.read_bytes() == b"old"
    if fail_at in ("fsync", "rename"):  # the error names the file written, not its temporary name
        assert err.value.filename == str(target) and err.value.errno == errno.ENOSPC


def test_write_bytes_is_whole_or_nothing(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "stats.json"
    storage.write_bytes(str(target), b"first")
    storage.write_bytes(str(target), b"second")
    assert target.read_bytes() == b"second" and os.listdir(target.parent) == ["stats.json"]

    def fail(*_args: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError) as err:
        storage.write_bytes(str(target), b"third")
    assert err.value.filename == str(target)
    assert target.read_bytes() == b"second" and os.listdir(target.parent) == ["stats.json"]


KILLED_WRITER = """
import os, sys
from pipeline import storage
with storage.open_output(sys.argv[1]) as f:
    f.write(b"half a shard")
    f.flush()
    os._exit(0)  # killed mid-write: nothing runs after this, no clean-up either
"""


def test_cleanup_recognises_exactly_the_temp_names_the_write_makes(tmp_path, monkeypatch):
    """The names a write uses are temporary names (and differ every time); published names, hidden files
    and other ``.tmp`` forms are not. A write killed mid-way leaves one, which a commit does not publish."""
    made: list[str] = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (made.append(os.path.basename(src)), real(src, dst)))
    for _ in range(3):
        storage.write_bytes(str(tmp_path / "shard-000000.tar"), b"x")
    with storage.open_output(str(tmp_path / "manifest.json")) as f:
        f.write(b"{}")
    monkeypatch.undo()
    assert len(set(made)) == 4 and all(storage.is_temp_name(name) for name in made)
    assert all(storage.is_temp_name(storage.temp_name(name)) for name in ("a", "shard-000000.tar", ".hidden", "x.tmp"))
    for name in ("shard-000000.tar", "manifest.json", ".hidden", "x.tmp", ".x.tmp", ".x.tmp-123", "x.tmp-123",
                 ".x.123.tmp", "x.123.abcd.tmp", ".x.123.abcd.tmp.jsonl", ".x.12a.abcd.tmp"):
        assert not storage.is_temp_name(name), name

    out = OutputDir(tmp_path / "out")
    with out.lock():
        out.claim(overwrite=False)
        staged = Path(out.stage) / "shards" / "shard-000000.tar"
        storage.write_bytes(str(staged), b"whole")
        run = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(staged.with_name("shard-000001.tar"))],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        left = sorted(p.name for p in staged.parent.iterdir())
        assert len(left) == 2 and storage.is_temp_name(left[0]) and left[1] == "shard-000000.tar"
        assert out.commit() == ["shards/shard-000000.tar"]  # the killed write's temporary file is not published
    assert sorted(p.name for p in (tmp_path / "out" / "shards").iterdir()) == ["shard-000000.tar"]


def test_files_globs_and_whole_object_writes(bucket):
    storage.write_text(f"{bucket}/in/a.jsonl", "a\n")
    storage.write_bytes(f"{bucket}/in/sub/b.jsonl", b"b\n")
    storage.write_bytes(f"{bucket}/in/.hidden/c.jsonl", b"c\n")
    gz = gzip.compress(b'{"text": "x"}\n', mtime=0)
    storage.write_bytes(f"{bucket}/in/d.jsonl.gz", gz)
    assert storage.read_bytes(f"{bucket}/in/d.jsonl.gz") == gz  # stored as given: no compression by suffix
    assert storage.expand_remote(f"{bucket}/in/*.jsonl") == [f"{bucket}/in/a.jsonl"]
    assert storage.expand_remote(f"{bucket}/in/**/*.jsonl") == [f"{bucket}/in/a.jsonl", f"{bucket}/in/sub/b.jsonl"]
    assert storage.expand_remote(f"{bucket}/in") == sorted(
        f"{bucket}/in/{n}" for n in (".hidden/c.jsonl", "a.jsonl", "d.jsonl.gz", "sub/b.jsonl"))
    assert storage.expand_remote(f"{bucket}/nothing/*") == []
    with pytest.raises(RuntimeError), storage.open_output(f"{bucket}/out/half.bin") as f:
        f.write(b"x" * 100)
        raise RuntimeError("the writer failed")
    assert not storage.exists(f"{bucket}/out/half.bin")  # an aborted upload leaves nothing
    storage.copy_file(f"{bucket}/in/a.jsonl", f"{bucket}/out/a.jsonl")
    assert storage.read_text(f"{bucket}/out/a.jsonl") == "a\n"
    with pytest.raises(ValueError, match="larger than"):
        storage.read_bytes(f"{bucket}/in/a.jsonl", limit=1)
    storage.rmtree(f"{bucket}/in")
    assert storage.list_files(f"{bucket}/in") == [] and storage.exists(f"{bucket}/out/a.jsonl")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{bucket}/in/a.jsonl")


def test_readers_give_the_same_documents_from_s3_as_from_disk(bucket, tmp_path):
    clean_corpus(tmp_path, 40)  # a.jsonl and b.jsonl.gz
    pq.write_table(pa.table({"text": ["one doc", "another doc"]}), tmp_path / "c.parquet")
    for f in tmp_path.iterdir():
        storage.write_bytes(f"{bucket}/corpus/{f.name}", f.read_bytes())

    def docs(path: str) -> list[tuple]:
        out = []
        for i, inp, p in expand_inputs([InputSpec(path=path)]):
            out += [(d["id"], d["source"], d["ord"], d["text"]) for d in read_file(i, p, inp)]
        return out

    local, remote = docs(str(tmp_path)), docs(f"{bucket}/corpus")
    assert len(local) == 42 and remote == local  # same ids, sources (no bucket name in them), ords, texts


def _stage(out: ObjectOutputDir, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        storage.write_bytes(storage.join(out.stage, rel), data)


def test_commit_publishes_the_manifest_last_and_overwrite_replaces_only_its_files(bucket, monkeypatch):
    out = open_output_dir(f"{bucket}/set")
    assert isinstance(out, ObjectOutputDir)
    order: list[str] = []
    copy = storage.copy_file
    monkeypatch.setattr(storage, "copy_file", lambda s, d: (order.append(d.rsplit("/set/", 1)[1]), copy(s, d)))
    with out.lock():
        out.claim(overwrite=False)
        _stage(out, {"shards/shard-000000.tar": b"0", "shards/shard-000001.tar": b"1", "manifest.json": b"{}",
                     "stats.json": b"{}"})
        assert out.commit() == ["manifest.json", "shards/shard-000000.tar", "shards/shard-000001.tar", "stats.json"]
    assert order[-1] == "manifest.json" and len(order) == 4
    assert storage.list_files(out.stage) == [] and not storage.exists(out.journal_path)
    assert not storage.exists(out.lock_path)  # released

    with out.lock(), pytest.raises(OutputError, match="already holds a shard set"):
        out.claim(overwrite=False)
    storage.write_bytes(f"{bucket}/set-user-note.txt", b"not ours")  # beside the prefix: never touched
    with out.lock():
        out.claim(overwrite=True)
        _stage(out, {"shards/shard-000000.tar": b"new", "manifest.json": b'{"v": 2}'})
        out.commit()
    assert storage.list_files(f"{bucket}/set/shards") == [f"{bucket}/set/shards/shard-000000.tar"]
    assert storage.read_bytes(f"{bucket}/set/shards/shard-000000.tar") == b"new"
    assert not storage.exists(f"{bucket}/set/stats.json")  # published by the old run only: removed
    assert storage.read_text(f"{bucket}/set-user-note.txt") == "not ours"


def test_an_interrupted_commit_is_finished_by_the_next_run(bucket, monkeypatch):
    out = ObjectOutputDir(f"{bucket}/set")
    copy, calls = storage.copy_file, []

    def flaky(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("connection reset")
        copy(src, dst)

    monkeypatch.setattr(storage, "copy_file", flaky)
    with out.lock():
        out.claim(overwrite=False)
        _stage(out, {"shards/shard-000000.tar": b"0", "shards/shard-000001.tar": b"1", "manifest.json": b"{}"})
        with pytest.raises(OutputError, match="the next run finishes it"):
            out.commit()
    assert not storage.exists(f"{bucket}/set/manifest.json")  # never a manifest over an incomplete set
    monkeypatch.setattr(storage, "copy_file", copy)
    with out.lock(), pytest.raises(OutputError, match="already holds a shard set"):
        out.claim(overwrite=False)  # the claim finished the commit first, then saw its manifest
    assert storage.read_bytes(f"{bucket}/set/shards/shard-000001.tar") == b"1"
    assert json.loads(storage.read_text(out.marker_path))["files"] == [
        "manifest.json", "shards/shard-000000.tar", "shards/shard-000001.tar"]


def test_foreign_prefixes_live_leases_and_overlaps_are_refused(bucket, monkeypatch):
    storage.write_bytes(f"{bucket}/theirs/data.bin", b"x")
    with pytest.raises(OutputError, match="not written by tokenmill"), ObjectOutputDir(f"{bucket}/theirs").lock():
        pass
    out = ObjectOutputDir(f"{bucket}/busy")
    storage.write_text(out.lock_path, json.dumps({"host": "elsewhere", "pid": 7, "started": "then",
                                                   "renewed": time.time()}))
    with pytest.raises(OutputError, match="in use by tokenmill pid 7 on elsewhere"), out.lock():
        pass
    storage.write_text(out.lock_path, json.dumps({"host": "elsewhere", "pid": 7, "started": "then",
                                                   "renewed": time.time() - 3600}))
    with out.lock():  # a lease nobody renewed for an hour: its run is dead
        out.claim(overwrite=False)
    with pytest.raises(OutputError, match="overlaps inputs.0.path"):
        check_not_overlapping(f"{bucket}/corpus/out", [f"{bucket}/corpus/*.jsonl"])
    check_not_overlapping(f"{bucket}/corpus-out", [f"{bucket}/corpus/*.jsonl", "/some/local/input"])


def test_the_service_confines_object_store_paths_to_its_uri_roots():
    from pipeline.spec import parse_spec
    from service.confine import Roots, problems

    roots = Roots.of(["s3://data/in", "/srv/local-in"], ["s3://data/out"])
    assert Roots.from_json(roots.to_json()) == roots

    def found(inp: str, out: str) -> list[str]:
        spec = parse_spec({"name": "j", "inputs": [{"path": inp}], "output": {"path": out}})
        return [str(p) for p in problems(spec, roots, expand=False)]

    assert found("s3://data/in/*.jsonl", "s3://data/out/job-1") == []
    assert found("s3://data/out/job-1", "s3://data/out/job-2") == []  # a job may read an earlier job's output
    assert found("s3://other/x.jsonl", "s3://data/out") == [
        "inputs.0.path: 's3://other/x.jsonl' is not inside the readable roots (s3://data/in, s3://data/out)",
        "output.path: 's3://data/out' is not inside an output root (the root itself is not allowed) (s3://data/out)"]
    assert found("s3://data/in/../secret/x", "s3://data/outside/j") == [
        "inputs.0.path: 's3://data/in/../secret/x' may not contain '..'",
        "output.path: 's3://data/outside/j' is not inside an output root (the root itself is not allowed) "
        "(s3://data/out)"]
