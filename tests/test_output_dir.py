"""The output-folder safety layer (pipeline/output/open_store.py): issue 9, cases 1, 2, 3, 4 and 13.

Each test names the case it covers. Scenarios are those of the issue, at the module level: the job
engine's own tests run them end to end.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from pipeline.output.layout import OutputError, describe_os_error
from pipeline.output.local_store import OutputDir
from pipeline.output.open_store import atomic_write_bytes, check_not_overlapping
from tests.processes import kill_all, processes_naming

REPO = Path(__file__).resolve().parents[1]
SET_A = {"manifest.json": b'{"set": "A"}', "stats.json": b"A stats", "tokenizer.json": b"A tok",
         "shards/shard-000000.tar": b"A0", "shards/shard-000001.tar": b"A1", "rejected/exact_dedup.jsonl": b"A rej"}
SET_B = {"manifest.json": b'{"set": "B"}', "stats.json": b"B stats", "tokenizer.json": b"B tok",
         "shards/shard-000000.tar": b"B0", "documents/docs-000000.parquet": b"B docs"}
USER = {"shards/my_photos.tar": b"photos", "index/important.db": b"db"}


def tree(root: str | Path) -> dict[str, bytes]:
    """Every file below ``root`` outside tokenmill's private area, by relative path."""
    root = Path(root)
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(".tokenmill"):
            out[rel] = path.read_bytes()
    return out


def write(root: str | Path, files: dict[str, bytes]) -> None:
    root = Path(root)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def publish(path: Path, files: dict[str, bytes], overwrite: bool = False) -> OutputDir:
    """One successful run: lock, claim, stage, commit."""
    out = OutputDir(path)
    with out.lock():
        out.claim(overwrite)
        write(out.stage, files)
        out.commit()
    return out


# ---- ownership and claim -------------------------------------------------------------------------------------


def test_claim_missing_and_empty_folders_writes_the_marker(tmp_path):
    for path in (tmp_path / "new" / "deep", tmp_path / "empty"):
        if path.name == "empty":
            path.mkdir()
        out = OutputDir(path)
        assert not out.is_tokenmill()
        with out.lock():
            out.claim(overwrite=False)
        marker = json.loads(Path(out.marker_path).read_text())
        assert marker["tool"] == "tokenmill" and marker["format"] == 1 and marker["files"] == []
        assert isinstance(marker["created"], str) and out.is_tokenmill()
        assert [p.name for p in Path(out.private).iterdir() if p.name.endswith(".tmp")] == []


def test_case1_foreign_folder_is_refused_with_or_without_overwrite(tmp_path):
    """Case 1: index/important.db, shards/my_photos.tar and rejected/ with no manifest: refused, untouched."""
    write(tmp_path, USER)
    (tmp_path / "rejected").mkdir()
    out = OutputDir(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(OutputError) as err:
            with out.lock():
                out.claim(overwrite)
        assert str(err.value) == (f"output.path: {tmp_path} is not empty and was not written by tokenmill "
                                  "(no .tokenmill/marker.json); choose an empty folder")
    assert tree(tmp_path) == USER and (tmp_path / "rejected").is_dir()
    assert not (tmp_path / ".tokenmill").exists() and not out.is_tokenmill()


def test_case1_overwrite_deletes_only_files_tokenmill_published(tmp_path):
    """Case 1: files a user put into a tokenmill folder (shards/my_photos.tar, index/important.db) survive
    --overwrite; tokenmill's old files not in the new set go, with the folders they leave empty."""
    publish(tmp_path, SET_A)
    write(tmp_path, USER)
    out = publish(tmp_path, SET_B, overwrite=True)
    assert tree(tmp_path) == {**SET_B, **USER}
    assert not (tmp_path / "rejected").exists()  # emptied by the commit: tokenmill's only content
    assert sorted(out.read_marker()["files"]) == sorted(SET_B)
    assert not Path(out.trash).exists() and not Path(out.journal_path).exists() and not Path(out.stage).exists()


def test_case1_staged_name_over_a_user_file_is_refused_before_anything_moves(tmp_path):
    """Case 1: a user file at a name tokenmill did not publish is never overwritten, nor is the old set touched."""
    publish(tmp_path, SET_A)
    write(tmp_path, {"documents/docs-000000.parquet": b"user's"})
    out = OutputDir(tmp_path)
    with out.lock():
        out.claim(overwrite=True)
        write(out.stage, SET_B)
        with pytest.raises(OutputError, match=r"documents/docs-000000.parquet exists and was not written by"):
            out.commit()
    assert tree(tmp_path) == {**SET_A, "documents/docs-000000.parquet": b"user's"}
    assert tree(out.stage) == SET_B and not Path(out.journal_path).exists()


def test_case1_damaged_marker_is_never_obeyed(tmp_path):
    """Case 1: a marker naming a path outside the layout cannot make --overwrite delete it."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep")
    folder = tmp_path / "out"
    for files in (["../victim.txt"], ["/etc/passwd"], ["notes.txt"], "shards/x.tar"):
        shutil.rmtree(folder, ignore_errors=True)
        write(folder, {".tokenmill/marker.json": json.dumps(
            {"tool": "tokenmill", "format": 1, "created": "t", "files": files}).encode()})
        out = OutputDir(folder)
        assert not out.is_tokenmill()
        with pytest.raises(OutputError, match=r"marker.json is damaged"):
            with out.lock():
                out.claim(overwrite=True)
    assert victim.read_bytes() == b"keep"


def test_existing_shard_set_needs_overwrite(tmp_path):
    publish(tmp_path, SET_A)
    out = OutputDir(tmp_path)
    with pytest.raises(OutputError) as err:
        with out.lock():
            out.claim(overwrite=False)
    assert "already holds a shard set" in str(err.value)
    assert "--overwrite" in str(err.value) and "output.overwrite: true" in str(err.value)
    assert tree(tmp_path) == SET_A


def test_documents_only_output_needs_overwrite_too(tmp_path):
    """A documents-only job publishes no manifest: its output is still protected, and replaced with overwrite."""
    docs = {"documents/docs-000000.jsonl": b"{}", "stats.json": b"{}"}
    publish(tmp_path, docs)
    out = OutputDir(tmp_path)
    with pytest.raises(OutputError, match=r"already holds an earlier run's output \(documents, stats.json\); "
                                          r"pass --overwrite"):
        with out.lock():
            out.claim(overwrite=False)
    publish(tmp_path, SET_B, overwrite=True)
    assert tree(tmp_path) == SET_B


# ---- staging and commit ----------------------------------------------------------------------------------------


def test_case2_failed_run_leaves_the_old_set_untouched(tmp_path):
    """Case 2: `run --overwrite` that fails (unreachable Ray, no document survived) never reaches commit:
    the old set, its inodes and its marker stay exactly as they were."""
    out = publish(tmp_path, SET_A)
    before = {rel: (tmp_path / rel).stat().st_ino for rel in SET_A}
    marker = Path(out.marker_path).read_bytes()
    with pytest.raises(RuntimeError, match="nowhere.invalid"):
        with out.lock():
            out.claim(overwrite=True)
            write(out.stage, {"shards/shard-000000.tar": b"half"})
            raise RuntimeError("cannot reach ray://nowhere.invalid:10001")
    assert tree(tmp_path) == SET_A
    assert {rel: (tmp_path / rel).stat().st_ino for rel in SET_A} == before
    assert Path(out.marker_path).read_bytes() == marker


def test_commit_moves_files_keeping_inode_and_mtime(tmp_path):
    """Published files are the staged files themselves (a rename); a killed writer's temp file is not published."""
    out = OutputDir(tmp_path)
    with out.lock():
        out.claim(overwrite=False)
        write(out.stage, SET_B)
        staged = Path(out.stage) / "shards/shard-000000.tar"
        os.utime(staged, ns=(1_000_000_000, 1_000_000_000))
        ino = staged.stat().st_ino
        (Path(out.stage) / "shards/.shard-000001.tar.123.abcd.tmp").write_bytes(b"left by a killed writer")
        assert sorted(out.commit()) == sorted(SET_B)
    done = (tmp_path / "shards/shard-000000.tar").stat()
    assert (done.st_ino, done.st_mtime_ns) == (ino, 1_000_000_000)
    assert tree(tmp_path) == SET_B


class Crash(BaseException):
    """The process dies here: nothing below catches it, as nothing runs after a kill."""


@pytest.fixture
def replace_calls(monkeypatch):
    """``os.replace`` counting its calls, and crashing at call number ``crash_at`` when set."""
    state = {"calls": 0, "crash_at": None}
    real = os.replace

    def replace(src, dst):
        state["calls"] += 1
        if state["calls"] == state["crash_at"]:
            raise Crash
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return state


def consistent(root: Path) -> bool:
    """A published manifest always describes a whole set: all of A or all of B, never a mix."""
    published = tree(root)
    if "manifest.json" not in published:
        return True
    wanted = SET_A if published["manifest.json"] == SET_A["manifest.json"] else SET_B
    return all(published.get(rel) == data for rel, data in wanted.items())


def test_case2_commit_interrupted_at_any_point_finishes_on_the_next_call(tmp_path, replace_calls):
    """Case 2: a crash at every single rename of a commit: the folder never shows a manifest over a mixed
    set, no file is lost, and the next commit (or the next run's claim) finishes it."""
    probe = tmp_path / "probe"
    publish(probe, SET_A)
    out = OutputDir(probe)
    with out.lock():
        out.claim(overwrite=True)
        write(out.stage, SET_B)
        replace_calls["calls"] = 0
        out.commit()
    renames = replace_calls["calls"]
    assert renames >= len(SET_A) + len(SET_B)
    for crash_at in range(1, renames + 1):
        folder = tmp_path / f"crash{crash_at}"
        publish(folder, SET_A)
        write(folder, USER)
        out = OutputDir(folder)
        with pytest.raises(Crash):
            with out.lock():
                out.claim(overwrite=True)
                write(out.stage, SET_B)
                replace_calls["calls"], replace_calls["crash_at"] = 0, crash_at
                out.commit()
        replace_calls["crash_at"] = None
        assert consistent(folder), crash_at
        assert tree(folder).items() >= USER.items()
        with out.lock():
            if crash_at % 2:
                out.commit()
            else:  # the next run's claim finishes the earlier commit before it checks anything
                out.claim(overwrite=True)
        assert tree(folder) == {**SET_B, **USER}, crash_at
        assert sorted(out.read_marker()["files"]) == sorted(SET_B)
        assert out.pending_commit() is None and not Path(out.trash).exists()


def test_commit_refuses_an_empty_stage_or_a_name_outside_the_layout(tmp_path):
    out = OutputDir(tmp_path)
    with out.lock():
        out.claim(overwrite=False)
        Path(out.stage).mkdir(parents=True)
        with pytest.raises(OutputError, match="nothing is staged"):
            out.commit()
        write(out.stage, {"manifest.json": b"{}", "notes.txt": b"x"})
        with pytest.raises(OutputError, match="'notes.txt' is not a published name"):
            out.commit()
    assert tree(tmp_path) == {}


def test_claim_and_commit_need_the_lock(tmp_path):
    out = OutputDir(tmp_path)
    with pytest.raises(RuntimeError, match=r"claim\(\) needs lock\(\)"):
        out.claim(overwrite=False)
    with pytest.raises(RuntimeError, match=r"commit\(\) needs lock\(\)"):
        out.commit()


# ---- lock -----------------------------------------------------------------------------------------------------

HOLDER = """
import sys
from pipeline.output.local_store import OutputDir
with OutputDir(sys.argv[1]).lock():
    print("locked", flush=True)
    sys.stdin.readline()
"""


def start_holder(path: Path) -> subprocess.Popen:
    """A second tokenmill process that holds the lock until its stdin closes (or it is killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_case3_second_process_is_refused_naming_the_holder(tmp_path):
    """Case 3: two runs on one output: the second fails at once, naming the first's pid, host and start."""
    holder = start_holder(tmp_path)
    try:
        out = OutputDir(tmp_path)
        with pytest.raises(OutputError) as err:
            with out.lock():
                pass
        message = str(err.value)
        assert message.startswith(f"output.path: {tmp_path} is in use by tokenmill pid {holder.pid} on "
                                  f"{os.uname().nodename} since ")
    finally:
        holder.stdin.close()
        holder.wait()
    with out.lock():  # the holder has finished: free again, and this process is now named as the holder
        assert json.loads(Path(out.lock_path).read_text())["pid"] == os.getpid()
    assert Path(out.lock_path).read_text() == ""


def test_case3_killed_holder_frees_the_lock(tmp_path):
    """Case 3: a holder killed with SIGKILL leaves a lock file naming a dead pid: taken over silently."""
    holder = start_holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    out = OutputDir(tmp_path)
    assert json.loads(Path(out.lock_path).read_text())["pid"] == holder.pid
    with out.lock():
        assert json.loads(Path(out.lock_path).read_text())["pid"] == os.getpid()


def test_case3_threads_racing_for_the_lock_one_wins(tmp_path):
    """Case 3: two callers at once: exactly one holds the lock, the other gets a one-line error."""
    start, tried = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    outcomes: list[str] = []

    def run() -> None:
        start.wait()
        try:
            with OutputDir(tmp_path).lock():
                outcomes.append("locked")
                tried.wait()  # hold the lock until the other caller has tried
        except OutputError as exc:
            outcomes.append(str(exc))
            tried.wait()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 2 and outcomes.count("locked") == 1
    refused = next(outcome for outcome in outcomes if outcome != "locked")
    assert refused.startswith(f"output.path: {tmp_path} is already locked by this process")


def test_lock_taken_twice_by_one_process_is_refused(tmp_path):
    with OutputDir(tmp_path).lock():
        with pytest.raises(OutputError, match="locking it twice is a bug"):
            with OutputDir(tmp_path).lock():
                pass
    with OutputDir(tmp_path).lock():  # released: free again
        pass


# ---- inputs vs output -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("output, inputs, index", [
    ("data", ["other.jsonl", "data"], 1),                      # output is an input folder
    ("data/out", ["data"], 0),                                 # output inside an input folder
    ("data/out", ["data/**/*.jsonl"], 0),                      # ...inside a glob's fixed folders
    ("data/out", ["data/x*/*.jsonl"], 0),
    ("out", ["out/shards"], 0),                                # an input folder inside the output
    ("out", ["out/stats.json"], 0),                            # an input file inside the output
    ("out", ["out/shards/*.tar"], 0),                          # a glob inside the output
    ("link_to_data/out", ["data"], 0),                         # output reached through a symlink
    ("out", ["link_into_out"], 0),                             # an input reached through a symlink
])
def test_case4_output_overlapping_an_input_is_refused(tmp_path, output, inputs, index):
    """Case 4: the output may not be, lie in, or contain what an input reads (both directions, real paths)."""
    write(tmp_path, {"data/a.jsonl": b"{}", "other.jsonl": b"{}", "out/stats.json": b"{}", "out/shards/s.tar": b""})
    (tmp_path / "link_to_data").symlink_to(tmp_path / "data")
    (tmp_path / "link_into_out").symlink_to(tmp_path / "out" / "shards")
    paths = [str(tmp_path / p) for p in inputs]
    with pytest.raises(OutputError) as err:
        check_not_overlapping(tmp_path / output, paths)
    assert str(err.value).startswith(f"output.path: {tmp_path / output} ")
    assert f"inputs.{index}.path ({paths[index]})" in str(err.value)


def test_case4_separate_output_and_inputs_are_accepted(tmp_path):
    write(tmp_path, {"data/a.jsonl": b"{}", "corpus/b.txt": b"x"})
    check_not_overlapping(tmp_path / "out", [tmp_path / "data", tmp_path / "corpus/*.txt"])
    check_not_overlapping(tmp_path / "data/out", [tmp_path / "data/a.jsonl"])  # a file input reads only itself


# ---- disk full ------------------------------------------------------------------------------------------------


def test_case13_os_error_is_one_line_naming_path_and_cause(tmp_path):
    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert describe_os_error(exc, tmp_path / "stats.json") == f"cannot write {tmp_path}/stats.json: " \
                                                              "No space left on device"


def test_case13_failed_atomic_write_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    target = tmp_path / "stats.json"
    target.write_bytes(b"old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError) as err:
        atomic_write_bytes(target, b"new")
    assert str(err.value) == f"cannot write {target}: No space left on device"
    assert os.listdir(tmp_path) == ["stats.json"] and target.read_bytes() == b"old"


FILL = """
import json, os, subprocess, sys
from pathlib import Path
folder = Path(sys.argv[1])
mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True,
                         text=True)
if mounted.returncode:
    print(json.dumps({"skip": "mount -t tmpfs failed: " + mounted.stderr.strip()}))
    sys.exit(0)
from pipeline.output.layout import OutputError
from pipeline.output.open_store import atomic_write_bytes
written, message = {}, None
for i in range(64):
    target = folder / f"shard-{i:06d}.tar"
    try:
        atomic_write_bytes(target, b"x" * 300_000)
    except OutputError as exc:
        message = str(exc)
        break
    written[target.name] = target.stat().st_size
left = {name: (folder / name).stat().st_size for name in os.listdir(folder)}
print(json.dumps({"message": message, "target": str(target), "written": written, "left": left}))
"""


def test_case13_really_full_disk_gives_one_line_and_no_partial_file(tmp_path):
    """Case 13: write shards into a 1 MiB tmpfs (a private mount namespace) until it is full."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (unshare --mount)")
    if not (shutil.which("unshare") and shutil.which("mount")):
        pytest.skip("unshare or mount is not installed")
    folder = tmp_path / "small"
    folder.mkdir()
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", FILL, str(folder)],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if run.returncode and "unshare" in run.stderr:
        pytest.skip(f"no private mount namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    if "skip" in result:
        pytest.skip(result["skip"])
    print(result)
    assert result["message"] == f"cannot write {result['target']}: No space left on device"
    assert result["written"] and result["left"] == result["written"]  # whole files only, no temp left
    assert set(result["written"].values()) == {300_000}


FULL_JOB = """
import json, os, subprocess, sys
from pathlib import Path
from pipeline.job.leftovers import temp_files
from pipeline.job.state import read_jsonl
from pipeline.shard_format import sha256_file
results = {}
for spec in sys.argv[1:]:
    spec = Path(spec)
    out, size = spec.parent / spec.stem, spec.stem.split("-")[1]
    out.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(out)], capture_output=True,
                             text=True)
    if mounted.returncode:
        print(json.dumps({"skip": "mount -t tmpfs failed: " + mounted.stderr.strip()}))
        sys.exit(0)
    run = subprocess.run([sys.executable, "-m", "service.cli", "run", str(spec)], capture_output=True, text=True,
                         timeout=300)
    work = out / ".tokenmill" / "work"
    shards = read_jsonl(str(work / "shards.jsonl"))
    results[spec.stem] = {
        "rc": run.returncode, "stderr": run.stderr,
        "last": json.loads((out / ".tokenmill" / "events.jsonl").read_text().splitlines()[-1]),
        "temp": temp_files(str(out)),
        "work": sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()),
        "kept_ok": all(sha256_file(work / "stage" / s["name"]) == s["sha256"] for s in shards),
        "shards": len(shards),
    }
print(json.dumps(results))
"""


@pytest.mark.ray
@pytest.mark.slow
def test_case13_a_job_on_a_full_disk_fails_infra_and_keeps_only_what_a_rerun_reuses(tmp_path):
    """Case 13 end to end: ``tokenmill run`` into a small tmpfs, full during curation (128 KiB) and during the
    write phase (3 MiB). Each: one line, exit 1, ``job_failed`` with category ``infra``; no temporary file left
    anywhere under the output; a failed curation leaves none of its work (a rerun starts it over), a failed
    write keeps the curated parts and every recorded shard, intact (what a rerun reuses)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (unshare --mount)")
    if not (shutil.which("unshare") and shutil.which("mount")):
        pytest.skip("unshare or mount is not installed")
    import random

    import yaml

    from tests.corpus_fixtures import make_text, write_jsonl

    rng = random.Random(7)
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"d{i}", "text": make_text(rng, rng.choice([8, 30, 90, 200]))}
                                              for i in range(1000)])
    specs = []
    for size in ("128k", "3m"):
        spec = {"name": "full", "inputs": [{"path": "in/*.jsonl"}],
                "stages": [{"type": "normalize"}, {"type": "exact_dedup"}],
                "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 500}},
                "packing": {"seq_len": 128, "range_docs": 100},
                "output": {"path": f"out-{size}", "samples_per_shard": 8},
                "execution": {"parallelism": 1, "batch_size": 64}}
        specs.append(tmp_path / f"out-{size}.yaml")
        specs[-1].write_text(yaml.safe_dump(spec))
    ray_tmp = tempfile.mkdtemp(prefix="tmd", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TMPDIR": ray_tmp}
    try:
        run = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", FULL_JOB,
                              *map(str, specs)], cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    finally:
        kill_all(processes_naming(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if run.returncode and "unshare" in run.stderr:
        pytest.skip(f"no private mount namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout.splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    for name, phase in (("out-128k", "curate"), ("out-3m", "write")):
        r = results[name]
        assert r["rc"] == 1 and len(r["stderr"].splitlines()) == 1, r["stderr"]
        assert r["stderr"].startswith("error: ") and "No space left on device" in r["stderr"], r["stderr"]
        assert (r["last"]["type"], r["last"]["category"], r["last"]["phase"]) == ("job_failed", "infra", phase)
        assert r["temp"] == [], r["temp"]
    assert results["out-128k"]["work"] == ["state.json"]  # curation starts over: none of its work is kept
    written = results["out-3m"]
    assert written["shards"] >= 2 and written["kept_ok"]
    assert any(p.startswith("curated/part-") for p in written["work"])
