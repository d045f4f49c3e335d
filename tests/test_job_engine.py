"""The job engine as a user meets it: a `tokenmill run` killed or cancelled, then rerun (issue 8).

- SIGKILL after k >= 2 shards: the rerun keeps those shard files (same inode and mtime), does not
  rerun the finished phases (asserted from the events) and ends byte-identical to an uninterrupted run.
- SIGKILL during curation: the rerun redoes curation once (no document counted or set aside twice).
- SIGINT mid-job: exit 130 within 10 s, no manifest, no Ray process of the job left; the rerun completes.
- A different spec on a half-done output is refused; --overwrite starts over.
- parallelism 1 and 4 (1 and 2: tests/test_job.py) give byte-identical shards, written by several processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from pipeline.job import events as ev
from pipeline.job.engine import Job
from pipeline.job.errors import JobError
from pipeline.shard_format import Manifest
from pipeline.spec import load_spec
from tests.corpus_fixtures import make_text, write_jsonl
from tests.processes import processes_naming

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parent.parent


def _corpus(folder: Path, n_docs: int) -> None:
    import random

    rng = random.Random(7)
    docs = [{"id": f"d{i}", "text": make_text(rng, rng.choice([8, 30, 90, 200]))} for i in range(n_docs)]
    docs += [dict(docs[i], id=f"copy{i}") for i in range(0, n_docs, 50)]  # exact duplicates to set aside
    write_jsonl(folder / "a.jsonl", docs[: len(docs) // 2])
    write_jsonl(folder / "b.jsonl", docs[len(docs) // 2:])


def _spec_file(tmp: Path, out: str, n_docs: int = 2000, **over) -> Path:
    (tmp / "in").mkdir(exist_ok=True)
    if not any((tmp / "in").iterdir()):
        _corpus(tmp / "in", n_docs)
    spec = {
        "name": "engine-test",
        "inputs": [{"path": "in/*.jsonl"}],
        "stages": [{"type": "normalize"}, {"type": "exact_dedup"}],
        "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 500}},
        "packing": {"seq_len": 128, "range_docs": 100},
        "output": {"path": out, "samples_per_shard": 8},
        "execution": {"parallelism": 1, "batch_size": 64},
    }
    for key, value in over.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    path = tmp / f"{Path(out).name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cli(spec: Path, ray_tmp: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "service.cli", "run", str(spec), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _events(out: Path) -> list[dict]:
    path = out / ".tokenmill" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _attempts(out: Path) -> list[list[dict]]:
    runs: list[list[dict]] = []
    for e in _events(out):
        if e["type"] == "job_started":
            runs.append([])
        if runs:
            runs[-1].append(e)
    return runs


def _wait_for(pred, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the job ended (rc {proc.returncode}) before the point to interrupt it:\n"
                                 f"{proc.stdout.read()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("timed out waiting for the job")


def _kill_group(proc: subprocess.Popen, ray_tmp: str) -> None:
    """SIGKILL the CLI and every process of its Ray: what a machine crash does to them."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in processes_naming(ray_tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tree(out: Path) -> dict[str, str]:
    from pipeline.shard_format import sha256_file

    names = ["manifest.json", "tokenizer.json", *sorted(p.relative_to(out).as_posix()
                                                        for p in (out / "shards").iterdir())]
    return {n: sha256_file(out / n) for n in names}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, ray_local):
    """One corpus and the shard set of an uninterrupted run of its spec (in this process's Ray)."""
    tmp = tmp_path_factory.mktemp("engine")
    spec = _spec_file(tmp, "reference")
    Job(load_spec(spec)).run()
    return tmp, _tree(tmp / "reference")


@pytest.fixture
def ray_tmp():
    folder = tempfile.mkdtemp(prefix="tmr", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    yield folder
    for pid in processes_naming(folder):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_sigkill_after_shards_then_rerun_keeps_them_and_matches(workspace, ray_tmp):
    tmp, reference = workspace
    spec = _spec_file(tmp, "killed")
    out = tmp / "killed"
    shards_log = out / ".tokenmill" / "work" / "shards.jsonl"
    proc = _cli(spec, ray_tmp)
    _wait_for(lambda: shards_log.exists() and shards_log.read_text().count("\n") >= 2, proc)
    _kill_group(proc, ray_tmp)
    kept = [json.loads(line) for line in shards_log.read_text().splitlines() if line.endswith("}")]
    assert len(kept) >= 2
    stage = out / ".tokenmill" / "work" / "stage"
    before = {r["name"]: (stage / r["name"]).stat() for r in kept}
    assert not (out / "manifest.json").exists()

    rerun = _cli(spec, ray_tmp)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    assert _tree(out) == reference
    for name, st in before.items():
        now = (out / name).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), name
    first, second = _attempts(out)
    assert [e["phase"] for e in second if e["type"] == "phase" and e["state"] == "skipped"] == ["curate", "tokenizer"]
    assert second[0]["resumed_phases"] == ["curate", "tokenizer"]
    reused = {e["name"] for e in second if e["type"] == "shard_written" and e["reused"]}
    assert set(before) <= reused
    written_again = {e["name"] for e in second if e["type"] == "shard_written" and not e["reused"]}
    assert not (written_again & set(before))
    assert any(e["type"] == "job_finished" for e in second) and not any(e["type"] == "job_finished" for e in first)


@pytest.mark.slow
def test_sigkill_during_curation_reruns_it_once(workspace, ray_tmp):
    tmp, reference = workspace
    spec = _spec_file(tmp, "killed_early")
    out = tmp / "killed_early"
    proc = _cli(spec, ray_tmp)
    _wait_for(lambda: any(e["type"] == "phase" and e["phase"] == "curate" for e in _events(out)), proc)
    _kill_group(proc, ray_tmp)
    assert not any(e["type"] == "phase" and e["state"] == "finished" for e in _events(out))

    rerun = _cli(spec, ray_tmp)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    assert _tree(out) == reference
    ref_stats = json.loads((tmp / "reference" / "stats.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    assert [(s["stage"], s["docs_in"], s["docs_out"], s["dropped"]) for s in stats["stages"]] == \
        [(s["stage"], s["docs_in"], s["docs_out"], s["dropped"]) for s in ref_stats["stages"]]
    rejected = [line for p in (out / "rejected").rglob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(rejected) == sum(sum(s["dropped"].values()) for s in stats["stages"]) > 0


@pytest.mark.slow
def test_sigint_cancels_within_seconds_and_the_rerun_completes(workspace, ray_tmp):
    tmp, reference = workspace
    spec = _spec_file(tmp, "cancelled")
    out = tmp / "cancelled"
    proc = _cli(spec, ray_tmp)
    _wait_for(lambda: any(e["type"] == "shard_written" for e in _events(out)), proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 130, output
    assert took < 10, took
    assert "cancelled" in output and "Traceback" not in output
    assert not (out / "manifest.json").exists()
    deadline = time.monotonic() + 10  # Ray's processes exit right after the driver's shutdown
    while processes_naming(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_naming(ray_tmp) == []
    assert _events(out)[-1]["type"] == "job_failed" and _events(out)[-1]["category"] == "cancelled"

    rerun = _cli(spec, ray_tmp)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output
    assert _tree(out) == reference


def test_another_spec_on_unfinished_work_is_refused_until_overwrite(workspace, tmp_path):
    tmp, _ = workspace
    out = tmp_path / "out"
    spec = load_spec(_spec_file(tmp, str(out)))
    state_dir = out / ".tokenmill" / "work"
    job = Job(spec)
    job.cancel()  # cancelled before any phase: leaves a work folder with this spec's state
    with pytest.raises(JobError) as err:
        job.run()
    assert err.value.category == "cancelled" and (state_dir / "state.json").exists()
    other = load_spec(_spec_file(tmp, str(out), packing={"seq_len": 64}))
    with pytest.raises(JobError, match="another spec") as err:
        Job(other).run()
    assert err.value.category == "validation"
    other.output.overwrite = True
    result = Job(other).run()
    assert result.manifest is not None and result.manifest.seq_len == 64


def test_parallelism_gives_identical_shards_written_by_several_processes(workspace, tmp_path):
    """Also: output.documents: parquet next to the shards leaves the shards as they were."""
    tmp, reference = workspace
    import pyarrow.parquet as pq

    seen: list[ev.Event] = []
    out = tmp_path / "p4"  # 1 is the reference; 1 vs 2 is tests/test_job.py's
    spec = load_spec(_spec_file(tmp, str(out), execution={"parallelism": 4}, output={"documents": "parquet"}))
    Job(spec, on_event=seen.append).run()
    shards = {k: v for k, v in _tree(out).items() if k != "manifest.json"}  # documents: is in the spec hash
    assert shards == {k: v for k, v in reference.items() if k != "manifest.json"}
    assert Manifest.load(out).shards == Manifest.load(tmp / "reference").shards
    writers = {e.writer for e in seen if isinstance(e, ev.ShardWritten)}
    assert len(writers) > 1, writers
    # the documents output next to the shards: every kept document once, in ord order
    table = pq.read_table(sorted((out / "documents").glob("part-*.parquet")))
    ords = table.column("ord").to_pylist()
    assert ords == sorted(ords) and len(ords) == json.loads((out / "stats.json").read_text())["documents"]["rows"]


def test_documents_output_and_a_documents_only_job(workspace, tmp_path):
    """output.documents writes the kept documents (ord order, metadata as objects) next to the shards or,
    with tokenizer: null, instead of them; `tokenmill inspect` reads and verifies a documents-only output."""

    tmp, reference = workspace
    only = tmp_path / "docs_only"
    Job(load_spec(_spec_file(tmp, str(only), tokenizer=None, output={"documents": "jsonl"}))).run()
    assert not (only / "manifest.json").exists() and not (only / "shards").exists()
    stats = json.loads((only / "stats.json").read_text())
    kept = next(s for s in stats["stages"] if s["stage"].endswith("exact_dedup"))["docs_out"]
    rows = [json.loads(line) for p in sorted((only / "documents").glob("part-*.jsonl"))
            for line in p.read_text().splitlines()]
    assert len(rows) == kept == stats["documents"]["rows"] and len(rows) < 2000 + 40
    assert [r["ord"] for r in rows] == sorted(r["ord"] for r in rows)
    assert all(isinstance(r["meta"], dict) and r["text"] for r in rows)
    assert len(list((only / "documents").glob("part-*.jsonl"))) == -(-kept // 100)  # range_docs 100 each
    proc = subprocess.run([sys.executable, "-m", "service.cli", "inspect", str(only), "--decode", "1", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"documents": kept, "parts": -(-kept // 100), "bad_parts": 0}
    first = next(p for p in sorted((only / "documents").glob("part-*.jsonl")))
    first.write_text(first.read_text().replace("a", "b", 1))
    proc = subprocess.run([sys.executable, "-m", "service.cli", "inspect", str(only)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"BAD documents/{first.name}" in proc.stdout

