"""Issue 9, input accounting: cases 5 (symlink loops), 6 (unreadable folders), 7 (a malformed WARC record),
8 (zero-width-only documents) and 15 (one rejected-record schema, sources relative to the input); issue 37: a gzip
bomb through a whole job (the readers' own bounds: tests/test_record_limit.py).

Every test names the case it covers; each fails on the code before the fix.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import shutil
import signal
import stat
import tempfile
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.documents import Drop, reject_row
from pipeline.readers import expand_inputs, read_file
from pipeline.readers.paths import expand_path
from pipeline.spec import InputSpec
from tests.corpus_fixtures import make_text, write_jsonl

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
#: the fields of every record in rejected/, in this order (case 15)
REJECT_FIELDS = ("id", "source", "ord", "stage", "reason", "kept_id", "detail", "text")


def read_inputs(inputs: list[InputSpec]) -> tuple[list[dict], list[Drop]]:
    docs, drops = [], []
    for file_index, spec, path in expand_inputs(inputs):
        for item in read_file(file_index, path, spec):
            (drops if isinstance(item, Drop) else docs).append(item)
    return docs, drops


def rel(root: Path, paths: list[str]) -> list[str]:
    return [Path(p).relative_to(root).as_posix() for p in paths]


# ---------------------------------------------------------------- case 5: symlink loops


@pytest.fixture
def looped(tmp_path: Path) -> Path:
    """``root/{a.txt, sub/b.txt, sub/deep/c.txt}`` with one loop: ``self -> .``."""
    root = tmp_path / "root"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.txt").write_text("beta")
    (root / "sub" / "deep" / "c.txt").write_text("gamma")
    (root / "self").symlink_to(".")
    return root


def test_glob_through_a_symlink_loop_reads_each_file_once(looped: Path) -> None:
    """Case 5: with ``self -> .`` a ``**`` glob read each file 41 times; now once, in path order."""
    want = ["a.txt", "sub/b.txt", "sub/deep/c.txt"]
    for pattern in ("**", "**/*.txt", "*/**/*.txt"):
        got = rel(looped, expand_path(str(looped / pattern)))
        assert got == (want[1:] if pattern.startswith("*/") else want), pattern
    assert rel(looped, expand_path(str(looped))) == want  # a folder input too
    assert expand_path(str(looped / "**")) == expand_path(str(looped / "**"))  # deterministic
    docs, drops = read_inputs([InputSpec(path=str(looped / "**" / "*.txt"))])
    assert [d["text"] for d in docs] == ["alpha", "beta", "gamma"] and drops == []


def _bounded(fn: Callable[..., Any], *args: Any, timeout: float = 60) -> Any:
    """``fn(*args)`` in a fresh process that is killed if it does not end (the old expansion never did)."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return pool.submit(fn, *args).result(timeout=timeout)
    except FutureTimeout:
        pytest.fail(f"{fn.__name__}{args} did not finish")
    finally:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)


def test_two_symlink_loops_end(looped: Path) -> None:
    """Case 5: with two loops the expansion never finished (11 min, 3.6 GB); now it ends with each file
    once. Run in a child process that is killed if it does not end, as the old code would not."""
    (looped / "sub" / "deep" / "up").symlink_to(Path("..") / "..")
    (looped / "sub" / "again").symlink_to("..")
    for pattern in ("**", "**/*.txt", "*/**/*.txt"):
        got = _bounded(expand_path, str(looped / pattern))
        assert rel(looped, got) == (["sub/b.txt", "sub/deep/c.txt"] if pattern.startswith("*/")
                                    else ["a.txt", "sub/b.txt", "sub/deep/c.txt"]), pattern


def test_symlinks_to_files_and_outside_folders_are_read_once(tmp_path: Path) -> None:
    """Case 5, the documented rule: a link to a file, or to a folder outside the input, is followed once
    (under the link's path); a file reached by two routes is listed once, under the smaller path."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.txt").write_text("outside")
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "r.txt").write_text("real")
    (root / "ext").symlink_to(outside)
    (root / "link.txt").symlink_to(root / "real" / "r.txt")
    (root / "twin").symlink_to("real")
    (root / "parent").symlink_to("..")  # the folder above the input: a loop, not followed
    for path in (str(root), str(root / "**")):
        assert rel(root, expand_path(path)) == ["ext/o.txt", "link.txt"], path
    docs, _ = read_inputs([InputSpec(path=str(root))])
    assert [(d["source"], d["text"]) for d in docs] == [("ext/o.txt", "outside"), ("link.txt", "real")]


# ---------------------------------------------------------------- case 6: unreadable folders


def _as_nobody(fn: Callable[[], Any]) -> Any:
    """``fn()`` run by a process that cannot bypass permissions: a forked child that drops root (the tests
    run as root, which reads anything), or this process when it is not root. Result passed back as JSON."""
    if os.geteuid() != 0:
        return fn()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            try:
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            except PermissionError as exc:  # e.g. a user namespace without uid 65534
                payload = {"skip": f"cannot drop root privileges here: {exc}"}
            else:
                try:
                    payload = {"result": fn()}
                except Exception:  # noqa: BLE001 - handed to the parent, which fails with it
                    payload = {"error": traceback.format_exc()}
            with os.fdopen(write_end, "w") as out:
                json.dump(payload, out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        data = inp.read()
    os.waitpid(pid, 0)
    assert data, "the unprivileged child died without a word"
    payload = json.loads(data)
    if "skip" in payload:
        pytest.skip(payload["skip"])
    assert "error" not in payload, payload.get("error")
    return payload["result"]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder an unprivileged user can reach (pytest's tmp_path is below a root-only folder)."""
    folder = Path(tempfile.mkdtemp(prefix="tokenmill-perm-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for sub in folder.rglob("*"):
            if sub.is_dir() and not sub.is_symlink():
                sub.chmod(0o755)
        shutil.rmtree(folder)


def test_unreadable_folder_is_a_counted_drop(shared_tmp: Path) -> None:
    """Case 6: a subfolder the process cannot list was skipped without a count; now it is one
    ``unreadable_folder`` drop (and an entry it cannot examine one ``unreadable_file``), written to
    rejected/ in the common schema, while everything readable is still read."""
    from pipeline.job.stats import StageRecorder

    root = shared_tmp / "corpus"
    for sub in ("open", "locked", "noexec"):
        (root / sub).mkdir(parents=True)
    (root / "a.txt").write_text("readable top")
    (root / "open" / "b.txt").write_text("readable below")
    (root / "locked" / "lost.txt").write_text("never seen")
    (root / "noexec" / "hidden.txt").write_text("listed, not openable")
    (root / "locked").chmod(0)
    (root / "noexec").chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # names listable, entries not
    rejected = shared_tmp / "rejected"
    rejected.mkdir(mode=0o777)
    rejected.chmod(0o777)

    def run() -> dict[str, Any]:
        out = {}
        for label, path in (("folder", str(root)), ("glob", str(root / "**" / "*.txt"))):
            docs, drops = read_inputs([InputSpec(path=path)])
            out[label] = {"docs": sorted(d["id"] for d in docs),
                          "drops": sorted((d.reason, d.doc["id"]) for d in drops)}
            if label == "folder":
                StageRecorder("00-read", None, str(rejected)).rejects(
                    [reject_row(d.doc, d.reason, d.detail) for d in drops])
        return out

    result = _as_nobody(run)
    for label in ("folder", "glob"):
        assert result[label]["docs"] == ["a.txt:0", "open/b.txt:0"], label
        assert result[label]["drops"] == [["unreadable_file", "noexec/hidden.txt:0"],
                                          ["unreadable_folder", "locked:0"]], label
    rows = [json.loads(line) for f in (rejected / "00-read").glob("*.jsonl") for line in f.read_text().splitlines()]
    by_reason = {r["reason"]: r for r in rows}
    assert set(by_reason) == {"unreadable_folder", "unreadable_file"}
    folder = by_reason["unreadable_folder"]
    assert tuple(folder) == REJECT_FIELDS
    assert (folder["stage"], folder["source"], folder["id"], folder["kept_id"]) == ("read", "locked", "locked:0", None)
    assert "Permission denied" in folder["detail"]["error"]


def test_unreadable_input_folder_itself_is_counted(shared_tmp: Path) -> None:
    """Case 6: an input folder that cannot be listed at all is one ``unreadable_folder`` drop, not an
    input that silently names nothing."""
    root = shared_tmp / "closed"
    root.mkdir()
    (root / "x.txt").write_text("unreachable")
    root.chmod(0)

    def run() -> list[list[str]]:
        docs, drops = read_inputs([InputSpec(path=str(root))])
        return [[d.reason, d.doc["id"]] for d in drops] + [["doc", d["id"]] for d in docs]

    assert _as_nobody(run) == [["unreadable_folder", "closed:0"]]


# ---------------------------------------------------------------- case 7: a malformed WARC record


def warc_record(n: int, body: bytes, after_version: bytes = b"") -> bytes:
    """One WET ``conversion`` record written by hand; ``after_version`` goes right after ``WARC/1.0``."""
    headers = (f"WARC-Type: conversion\r\nWARC-Record-ID: <urn:uuid:{n}>\r\nWARC-Target-URI: https://e.org/{n}\r\n"
               f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return b"WARC/1.0\r\n" + after_version + headers + body + b"\r\n\r\n"


BAD_RECORDS = {
    # the header line, then a garbage line and nothing else: warcio read the rest of the file as its body
    "garbage_only": b"WARC/1.0\r\n\x00garbage \xff line\r\n\r\n",
    # the header line, then a whitespace line that ends the header block early
    "blank_garbage": warc_record(2, b"second document", after_version=b" \t \r\n"),
    # a garbage line glued to the WARC-Type line: no WARC-Type
    "no_type": warc_record(2, b"second document", after_version=b"\x01\x02garbage"),
    # a Content-Length that is not a number
    "bad_length": warc_record(2, b"second document", after_version=b"Content-Length: twelve\r\n"),
}


@pytest.mark.parametrize("compress", [False, True], ids=["warc", "warc.gz"])
@pytest.mark.parametrize("bad", sorted(BAD_RECORDS))
def test_malformed_warc_record_is_counted_and_the_next_is_read(tmp_path: Path, bad: str, compress: bool) -> None:
    """Case 7: a record whose header line is followed by a garbage line swallowed the next valid record
    without a drop; now it is one ``malformed_warc_record`` drop and every valid record is read."""
    data = warc_record(1, b"first document") + BAD_RECORDS[bad] + warc_record(3, b"third document") + warc_record(
        4, b"fourth document")
    path = tmp_path / ("pages.warc.gz" if compress else "pages.warc")
    path.write_bytes(gzip.compress(data) if compress else data)
    docs, drops = read_inputs([InputSpec(path=str(path))])
    assert [d["text"] for d in docs] == ["first document", "third document", "fourth document"]
    assert [d["id"] for d in docs] == ["<urn:uuid:1>", "<urn:uuid:3>", "<urn:uuid:4>"]
    assert [(d.reason, d.doc["ord"]) for d in drops] == [("malformed_warc_record", 1)]
    assert drops[0].detail["error"]
    assert [d["ord"] for d in docs] == [0, 2, 3]  # every record keeps its place in the file


def test_warc_length_that_does_not_match_is_malformed(tmp_path: Path) -> None:
    """Case 7: a Content-Length shorter than the record leaves junk where the next record should start;
    the record is a ``malformed_warc_record`` drop (not kept cut short) and the next one is read."""
    bad = warc_record(2, b"second document").replace(b"Content-Length: 15", b"Content-Length: 6")
    path = tmp_path / "short.warc"
    path.write_bytes(warc_record(1, b"first document") + bad + warc_record(3, b"third document"))
    docs, drops = read_inputs([InputSpec(path=str(path))])
    assert [d["text"] for d in docs] == ["first document", "third document"]
    assert [(d.reason, d.doc["id"]) for d in drops] == [("malformed_warc_record", "<urn:uuid:2>")]


# ---------------------------------------------------------------- case 8: zero-width-only documents


def test_zero_width_only_documents_are_empty_text(tmp_path: Path) -> None:
    """Case 8: a document of only zero-width characters (and whitespace) was kept as non-empty; every
    reader now drops it as ``empty_text``, the reason it uses for blank text, and keeps visible text."""
    invisible = ZERO_WIDTH + " \n\t" + ZERO_WIDTH
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": "zw", "text": invisible}, {"id": "soft", "text": "\u00ad\u200b"},
                                             {"id": "ok", "text": "visible\u200bword"}])
    (tmp_path / "in" / "b.txt").write_text(invisible, encoding="utf-8")
    pq.write_table(pa.table({"id": ["pq"], "text": [ZERO_WIDTH]}), tmp_path / "in" / "c.parquet")
    (tmp_path / "in" / "d.wet").write_bytes(warc_record(1, ZERO_WIDTH.encode()) + warc_record(2, b"shown"))
    docs, drops = read_inputs([InputSpec(path=str(tmp_path / "in"))])
    assert [d["text"] for d in docs] == ["visible\u200bword", "shown"]
    assert Counter(d.reason for d in drops) == {"empty_text": 5}

    write_jsonl(tmp_path / "sft.jsonl", [{"instruction": "Say nothing.", "output": ZERO_WIDTH},
                                         {"instruction": ZERO_WIDTH, "output": "x"}])
    _, drops = read_inputs([InputSpec(path=str(tmp_path / "sft.jsonl"), format="instruction")])
    assert sorted(d.reason for d in drops) == ["bad_record:missing_instruction", "bad_record:missing_output"]


def test_normalize_drops_zero_width_only_text_as_empty_text() -> None:
    """Case 8: the normalize stage uses the same test and the same reason, for documents not from a reader."""
    from pipeline.stages.base import StageContext
    from pipeline.stages.normalize import Normalize, NormalizeParams

    stage = Normalize(NormalizeParams(), StageContext("t", "", 1, ""))
    docs = [{"id": i, "text": t, "segments": None} for i, t in (("zw", ZERO_WIDTH + "\n"), ("ok", " x\u200b "))]
    out = list(stage.process(docs))
    assert [(o.doc["id"], o.reason) for o in out if isinstance(o, Drop)] == [("zw", "empty_text")]
    assert [o["text"] for o in out if not isinstance(o, Drop)] == ["x\u200b"]


# ---------------------------------------------------------------- case 15: one rejected-record schema


def test_reject_row_has_one_schema() -> None:
    """Case 15: exact_dedup wrote ``{"kept_id"}``, near_dedup ``{"cluster"}`` in ``detail``; now every
    record has the same fields in the same order, ``kept_id`` at the top (None where nothing was kept)."""
    doc = {"id": "d", "source": "sub/a.jsonl", "ord": 7, "text": "t", "meta": "{}", "segments": None}
    dup = reject_row(doc, "exact_duplicate", {"kept_id": "k"}, "exact_dedup")
    assert dup == {"id": "d", "source": "sub/a.jsonl", "ord": 7, "stage": "exact_dedup", "reason": "exact_duplicate",
                   "kept_id": "k", "detail": {}, "text": "t"}
    assert tuple(dup) == REJECT_FIELDS
    bad = reject_row(doc, "bad_json", {"error": "x"})
    assert (bad["kept_id"], bad["detail"], bad["stage"]) == (None, {"error": "x"}, None)
    assert reject_row(dup, dup["reason"], dup["detail"]) == dup  # the recorder may apply it again


def test_stage_recorder_writes_the_schema_with_the_stage_type(tmp_path: Path) -> None:
    """Case 15: the stage in each record is the stage type (``near_dedup``), the folder keeps its key;
    rows a stage hands over in another shape are brought to the schema."""
    from pipeline.job.stats import StageRecorder

    raw = {"id": "d", "text": "t", "source": "a.jsonl", "ord": 3, "meta": "{}", "segments": None,
           "reason": "near_duplicate", "detail": {"kept_id": "k", "similarity": 0.9}}
    StageRecorder("03-near_dedup", None, str(tmp_path)).rejects([raw])
    (part,) = (tmp_path / "03-near_dedup").glob("*.jsonl")
    row = json.loads(part.read_text())
    assert tuple(row) == REJECT_FIELDS
    assert (row["stage"], row["kept_id"], row["detail"]) == ("near_dedup", "k", {"similarity": 0.9})


def test_documents_and_drops_carry_the_source_below_the_input(tmp_path: Path) -> None:
    """Case 15: ``source`` was the absolute input path; now it is the path below the input (the name
    default ids use) for every document and drop of every reader, so no machine path leaves the job."""
    root = tmp_path / "deep" / "corpus"
    write_jsonl(root / "sub" / "a.jsonl", [{"text": "one"}, {"text": "  "}])
    (root / "b.txt").write_text("two")
    (root / "c.warc").write_bytes(warc_record(1, b"three") + warc_record(2, b"\n"))
    pq.write_table(pa.table({"text": ["four", None]}), root / "d.parquet")
    docs, drops = read_inputs([InputSpec(path=str(root))])
    assert sorted(d["source"] for d in docs) == ["b.txt", "c.warc", "d.parquet", "sub/a.jsonl"]
    assert sorted(d.doc["source"] for d in drops) == ["c.warc", "d.parquet", "sub/a.jsonl"]
    docs, _ = read_inputs([InputSpec(path=str(root / "**" / "*.jsonl"))])
    assert [d["source"] for d in docs] == ["sub/a.jsonl"]
    assert not any(str(tmp_path) in json.dumps(d) for d in docs)


@pytest.mark.ray
def test_every_stage_writes_the_same_rejected_record(ray_local: Any, tmp_path: Path) -> None:
    """Case 15 through a whole job: read, normalize, exact_dedup and near_dedup rejects all have the
    same fields, the stage type, the kept id where one was kept, and a source relative to the input."""
    import random

    from pipeline.job.engine import run_job
    from pipeline.spec import parse_spec
    from tests.test_dedup_stages import edit, random_text

    rng = random.Random(3)
    texts = [random_text(rng, 120) for _ in range(30)]
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts)])
    write_jsonl(tmp_path / "in" / "sub" / "b.jsonl",
                [{"id": "exact", "text": texts[3]}, {"id": "near", "text": edit(rng, texts[8], 0.01)},
                 {"id": "blank", "text": ZERO_WIDTH}, {"id": "fresh", "text": make_text(rng, 80)}])
    with (tmp_path / "in" / "sub" / "b.jsonl").open("a") as fh:
        fh.write("{broken\n")
    spec = parse_spec({
        "name": "schema", "inputs": [{"path": str(tmp_path / "in")}],
        "stages": [{"type": "normalize"}, {"type": "exact_dedup"},
                   {"type": "near_dedup", "params": {"threshold": 0.7}}],
        "tokenizer": {"train": {"vocab_size": 300, "sample_docs": 100}}, "packing": {"seq_len": 256},
        "output": {"path": str(tmp_path / "out"), "samples_per_shard": 16}, "execution": {"batch_size": 16},
    })
    result = run_job(spec)
    rows = {}
    for part in sorted((result.output_dir / "rejected").rglob("*.jsonl")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            assert tuple(row) == REJECT_FIELDS, part
            assert part.parent.name.split("-", 1)[1] == row["stage"]
            rows[row["id"]] = row
    assert {i: (r["stage"], r["reason"], r["kept_id"], r["source"]) for i, r in rows.items()} == {
        "sub/b.jsonl:4": ("read", "bad_json", None, "sub/b.jsonl"),
        "blank": ("read", "empty_text", None, "sub/b.jsonl"),
        "exact": ("exact_dedup", "exact_duplicate", "a3", "sub/b.jsonl"),
        "near": ("near_dedup", "near_duplicate", "a8", "sub/b.jsonl"),
    }
    assert all(r["detail"] == {} for i, r in rows.items() if i in ("exact", "near"))


# ---------------------------------------------------------------- issue 37: a gzip bomb through a whole job


class WorkerPeaks:
    """The peak RSS (the kernel's ``VmHWM``) of each Ray worker this process started, sampled every 50 ms while a
    job runs. A worker past ``kill_above`` is killed (by its pid) and the test's thread interrupted (SIGUSR1 raises
    AssertionError there): Ray would run the read again and again, and a regression would fill the machine's memory
    instead of failing (the module's ``ray_local`` teardown ends what is left)."""

    def __init__(self, kill_above: int):
        self.kill_above = kill_above
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (command, bytes)
        self.killed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> WorkerPeaks:
        self._handler = signal.signal(signal.SIGUSR1, self._fail)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        signal.signal(signal.SIGUSR1, self._handler)

    def _fail(self, *_: object) -> None:
        raise AssertionError(f"a worker passed {self.kill_above / 1e9:.1f} GB and was killed: {self.killed}")

    def _watch(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.05):
            for proc in me.children(recursive=True):
                try:
                    command = " ".join(proc.cmdline()).strip()
                    status = Path(f"/proc/{proc.pid}/status").read_text()
                except (psutil.Error, OSError):
                    continue
                if not command.startswith("ray::"):  # Ray's own servers (raylet: the object store's pages), not workers
                    continue
                hwm = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) << 10
                self.peaks[proc.pid] = (command, max(hwm, self.peaks.get(proc.pid, ("", 0))[1]))
                if hwm > self.kill_above:
                    self.killed.append(f"{command}: {hwm / 1e9:.2f} GB")
                    proc.kill()
                    if len(self.killed) == 1:
                        os.kill(os.getpid(), signal.SIGUSR1)

    def largest(self) -> tuple[str, int]:
        return max(self.peaks.values(), key=lambda p: p[1])


@pytest.mark.ray
def test_gzip_bomb_job_keeps_workers_small(ray_local: Any, tmp_path: Path) -> None:
    """Issue 37: a 1.2 MB ``.jsonl.gz`` that inflates to one 1.2 GB line grew a ReadFiles worker past 3.3 GB with
    no error. With the default ``max_record_bytes`` (64 MiB) the job succeeds, keeps the other records, counts one
    ``record_too_large`` drop (a stub in rejected/) in exact stats, and no worker passes 1.5 GB."""
    from pipeline.job.engine import run_job
    from pipeline.spec import parse_spec
    from tests.test_record_limit import bomb

    src = tmp_path / "in" / "bomb.jsonl.gz"
    src.parent.mkdir()
    before = [{"id": f"a{i}", "text": f"record {i} before the bomb"} for i in range(3)]
    after = [{"id": f"b{i}", "text": f"record {i} after the bomb"} for i in range(2)]
    offset, size = bomb(src, before, 1200 << 20, after)
    assert src.stat().st_size < 1.3e6 and size > 1.2e9
    spec = parse_spec({"name": "bomb", "inputs": [{"path": str(src)}], "tokenizer": None,
                       "output": {"path": str(tmp_path / "out"), "documents": "jsonl"}})
    with WorkerPeaks(int(1.5e9)) as peaks:
        result = run_job(spec)
    command, peak = peaks.largest()
    print(f"largest worker peak RSS: {peak / 1e9:.2f} GB ({command})")  # shown with -s: the figure the README quotes
    assert not peaks.killed and peak < 1.5e9, f"{command} reached {peak / 1e9:.2f} GB"
    out = tmp_path / "out"
    kept = [json.loads(line)["id"] for f in sorted((out / "documents").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    assert kept == ["a0", "a1", "a2", "b0", "b1"]
    read = next(s for s in result.stats["stages"] if s["stage"] == "00-read")
    assert (read["docs_in"], read["docs_out"], read["dropped"]) == (6, 5, {"record_too_large": 1})
    rows = [json.loads(line) for f in (out / "rejected").rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert [(r["id"], r["reason"], r["text"], r["detail"]) for r in rows] == [
        ("bomb.jsonl.gz:3", "record_too_large", "", {"offset": offset, "size": size, "limit": 64 << 20})]
