"""The output folder's safety rules: what tokenmill owns there, who may write it, and how a new run replaces
the old one without losing anything if it fails half-way.

Layout. ``OUT`` is ``output.path``. Published names: ``manifest.json``, ``stats.json``, ``tokenizer.json``,
``shards/``, ``rejected/``, ``index/``, ``documents/``, and with ``output.split_by`` one folder per group
holding ``manifest.json``, ``tokenizer.json`` and ``shards/`` (``OUT/de/...``). tokenmill's private area
is ``OUT/.tokenmill/``:

- ``marker.json``: ``{"tool": "tokenmill", "format": 1, "created": ISO time, "files": [...]}``, ``files``
  being the relative path of every file the last commit published;
- ``lock``: the lock file (holds the holder's host, pid and start time while a job runs);
- ``work/``: the running job's state and staged output (the job engine owns its content; a new shard set is
  staged in ``work/stage/`` under the published names, e.g. ``work/stage/shards/shard-000000.tar``);
- ``commit.json``: the journal of a commit in progress; ``trash/``: the old files during a commit.

Ownership. A folder is tokenmill's only when ``.tokenmill/marker.json`` exists and parses (a marker naming a
path outside the published layout is damaged, never obeyed). A missing or empty folder is claimed by
writing the marker; any other non-empty folder is refused, with or without ``--overwrite``. A tokenmill
folder that holds an earlier run's output (a shard set's ``manifest.json``, or any file the marker lists,
e.g. a documents-only job's ``documents/``) is replaced only with ``--overwrite`` (``output.overwrite: true``).

What ``--overwrite`` deletes: exactly the files the marker lists (and the folders they leave empty), never
anything else: a user's ``shards/my_photos.tar`` stays. And it deletes nothing until the new run has
succeeded: deletion happens inside :meth:`OutputDir.commit`, which the engine calls only after the new set
is complete in the stage. A staged name that would overwrite a file the marker does not list is refused
before anything moves.

Commit. (1) remove the published ``manifest.json`` first, so no manifest ever describes a mixed set;
(2) move the previously published files to ``trash/``; (3) move every staged file into place with
``os.replace`` (same filesystem: a file keeps its inode and mtime); (4) rewrite the marker; (5) move the new
``manifest.json`` in last (a documents-only job has none); (6) empty ``trash/``. A journal (``commit.json``)
written before step 1 makes a commit interrupted at any point finish on the next call (``commit`` again, or
the next run's ``claim``).

Lock. One job per folder: an exclusive ``flock`` on ``.tokenmill/lock``, held for the job's life, so the
kernel frees it when the holder dies (a stale lock file naming a dead pid is simply taken over). A second
run fails at once with the holder's pid, host and start time; a second lock in the same process is a bug
and is refused too.

Inputs. The output folder may not be an input folder, lie inside one (a folder input or a glob's fixed
leading folders), or contain an input: otherwise the next run reads its own output
(:func:`check_not_overlapping`, on resolved paths).

Errors are :class:`OutputError`, one line naming ``output.path`` or the file and the reason; an ``OSError``
while writing (disk full...) reads ``cannot write PATH: No space left on device``
(:func:`describe_os_error`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PUBLISHED_FILES = ("manifest.json", "stats.json", "tokenizer.json")
PUBLISHED_FOLDERS = ("shards", "rejected", "index", "documents")
PUBLISHED = PUBLISHED_FILES + PUBLISHED_FOLDERS
#: ``output.split_by``: one shard set per group in ``OUT/<group>/`` (pipeline/output/groups.py)
GROUP_FILES = ("manifest.json", "tokenizer.json")
GROUP_FOLDERS = ("shards",)
_GROUP = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
PRIVATE = ".tokenmill"
MARKER_FORMAT = 1
GLOB_CHARS = "*?["

# Lock files this process holds (real paths): a second lock() of the same folder in one process is a bug.
_HELD: set[str] = set()
_HELD_GUARD = threading.Lock()


class OutputError(RuntimeError):
    """The output folder cannot be used or written: one line naming ``output.path`` (or the file) and why.

    ``category`` is ``validation`` (the folder is not usable as given) or ``infra`` (the machine failed:
    a write or a lock that the operating system refused)."""

    def __init__(self, message: str, category: str = "validation") -> None:
        super().__init__(message)
        self.category = category


class _BadRecord(ValueError):
    """A marker or journal that does not parse; the reason goes into an :class:`OutputError`."""


def check_journal(data: dict[str, Any]) -> dict[str, Any]:
    """A commit journal (``stage``, ``new``, ``old``, ``created``) with its lists checked; raises _BadRecord."""
    stage = data.get("stage")
    if not isinstance(stage, str) or not stage.startswith(f"{PRIVATE}/work/") or ".." in stage.split("/"):
        raise _BadRecord("stage is not inside .tokenmill/work")
    if not isinstance(data.get("created"), str):
        raise _BadRecord("created is not a time")
    data["new"] = _check_rel_list(data.get("new"), "new")
    data["old"] = _check_rel_list(data.get("old"), "old")
    return data


def os_error_category(exc: OSError) -> str:
    """``validation`` for a path the user can fix (not a folder, no permission, read-only), else ``infra``
    (disk full, I/O error: the machine)."""
    return "validation" if exc.errno in (errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR,
                                         errno.ENOENT) else "infra"


def describe_os_error(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """``cannot write PATH: REASON`` on one line, for any OSError while writing (e.g. a full disk)."""
    where = os.fspath(path) if path is not None else (exc.filename2 or exc.filename or "?")  # a rename's target
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot write {where}: {reason}".replace("\n", " ").replace("\r", " ")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``path`` so that readers see the old content or the new, never a part: a temporary file in the
    same folder, fsync, rename. The temporary file is removed on failure; an OSError becomes an
    :class:`OutputError` with :func:`describe_os_error`'s line."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = -1
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(describe_os_error(exc, path), os_error_category(exc)) from None
    _fsync_dir(path.parent)


def _is_temp(name: str) -> bool:
    """A temporary file :func:`atomic_write_bytes` left when its process died: never published."""
    return name.startswith(".") and name.endswith(".tmp")


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable. Best effort: some filesystems cannot fsync a folder, and the rename is done."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _check_rel(rel: Any) -> str:
    """A published relative path (``shards/x.tar``, ``stats.json``): never absolute, never ``..``, never
    outside the layout, so a damaged marker or journal cannot make a commit touch anything else."""
    if not isinstance(rel, str) or not rel:
        raise _BadRecord(f"{rel!r} is not a relative path")
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in rel or "\0" in rel:
        raise _BadRecord(f"{rel!r} is not a plain relative path")
    if not (_in_layout(parts) or (_GROUP.fullmatch(parts[0]) and parts[0] not in PUBLISHED
                                  and _in_layout(parts[1:], GROUP_FILES, GROUP_FOLDERS))):
        raise _BadRecord(f"{rel!r} is not a published name (files {', '.join(PUBLISHED_FILES)}; "
                         f"folders {', '.join(PUBLISHED_FOLDERS)}; a group's {', '.join(GROUP_FILES)}, shards/)")
    return rel


def _in_layout(parts: list[str], files: tuple[str, ...] = PUBLISHED_FILES,
               folders: tuple[str, ...] = PUBLISHED_FOLDERS) -> bool:
    return bool(parts) and ((parts[0] in files and len(parts) == 1) or (parts[0] in folders and len(parts) > 1))


def is_manifest(rel: str) -> bool:
    """The shard set's ``manifest.json`` or a group's (``de/manifest.json``): out first, in last."""
    return rel == "manifest.json" or (rel.count("/") == 1 and rel.endswith("/manifest.json"))


def _check_rel_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise _BadRecord(f"{what} is not a list")
    rels = [_check_rel(rel) for rel in value]
    if len(set(rels)) != len(rels):
        raise _BadRecord(f"{what} repeats a name")
    return rels


def _load_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is missing."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _BadRecord(exc.strerror or str(exc)) from None
    except ValueError as exc:
        raise _BadRecord(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _BadRecord("not a JSON object")
    return data


def _static_root(path: str) -> tuple[str, bool]:
    """The fixed leading folders of a glob (``data/**/*.txt`` -> ``data``) and whether it was a glob."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if any(c in part for c in GLOB_CHARS):
            return (str(Path(*parts[:i])) if i else os.curdir), True
    return path, False


def open_output_dir(path: str | os.PathLike[str]) -> Any:
    """The output at ``path``: a local :class:`OutputDir`, or an
    :class:`~pipeline.job.object_output.ObjectOutputDir` for an object-store URI (``s3://...``)."""
    from pipeline import storage

    if storage.is_remote(os.fspath(path)):
        from pipeline.job.object_output import ObjectOutputDir

        return ObjectOutputDir(os.fspath(path))
    return OutputDir(storage.local_path(path))


def check_not_overlapping(output: str | os.PathLike[str], input_paths: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse an output folder that equals or lies inside a folder an input reads, or that contains an
    input: either way a later run would read its own output. Paths are compared resolved (symlinks);
    object-store locations by prefix (:func:`pipeline.job.object_output.check_remote_not_overlapping`)."""
    from pipeline import storage

    inputs = [os.fspath(p) for p in input_paths]
    if storage.is_remote(os.fspath(output)):
        from pipeline.job.object_output import check_remote_not_overlapping

        check_remote_not_overlapping(os.fspath(output), inputs)
        return
    out = Path(os.path.realpath(os.path.expanduser(os.fspath(output))))
    for i, raw in enumerate(inputs):
        if storage.is_remote(raw):
            continue  # a local output cannot lie in an object store
        raw = os.path.expanduser(raw)
        root, is_glob = _static_root(raw)
        src = Path(os.path.realpath(root))
        if (is_glob or src.is_dir()) and out.is_relative_to(src):
            raise OutputError(f"output.path: {output} lies inside inputs.{i}.path ({raw}), a folder the job reads, "
                              "so a later run would read its own output; choose an output folder outside the inputs")
        if src.is_relative_to(out):
            raise OutputError(f"output.path: {output} contains inputs.{i}.path ({raw}), which a run would "
                              "read back or overwrite; choose an output folder outside the inputs")


def check_marker(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """A parsed marker, checked (:class:`_BadRecord` when damaged); None stays None (no marker)."""
    if data is None:
        return None
    if data.get("tool") != "tokenmill":
        raise _BadRecord("tool is not tokenmill")
    if data.get("format") != MARKER_FORMAT:
        raise _BadRecord(f"format {data.get('format')!r} is not {MARKER_FORMAT}")
    if not isinstance(data.get("created"), str):
        raise _BadRecord("created is not a time")
    data["files"] = _check_rel_list(data.get("files"), "files")
    return data


class MarkerReader:
    """What a local folder and an object-store prefix share: reading the marker (``_load_marker``)."""

    def _load_marker(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def read_marker(self) -> dict[str, Any] | None:
        """The marker, or None when the folder has none or a damaged one."""
        try:
            return self._load_marker()
        except _BadRecord:
            return None

    def is_tokenmill(self) -> bool:
        """Whether tokenmill wrote this folder (its marker exists and parses)."""
        return self.read_marker() is not None


class OutputDir(MarkerReader):
    """One output folder. Use: ``with out.lock(): out.claim(overwrite); ...build in out.stage...;
    out.commit()``. ``claim`` and ``commit`` need the lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.private = self.path / PRIVATE
        self.marker_path = self.private / "marker.json"
        self.lock_path = self.private / "lock"
        self.work = self.private / "work"
        self.stage = self.work / "stage"
        self.trash = self.private / "trash"
        self.journal_path = self.private / "commit.json"

    # ownership ---------------------------------------------------------------------------------------------

    def _load_marker(self) -> dict[str, Any] | None:
        return check_marker(_load_json_object(self.marker_path))

    def _looks_empty(self) -> bool:
        """Empty, or holding only a ``.tokenmill/`` folder without a marker (a run that stopped before its
        claim: tokenmill's own name, nothing published)."""
        try:
            entries = os.listdir(self.path)
        except OSError as exc:
            raise OutputError(f"output.path: cannot read {self.path}: {exc.strerror or exc}") from None
        return not entries or (entries == [PRIVATE] and self.private.is_dir() and not self.private.is_symlink())

    def _check_ownership(self) -> None:
        """Refuse a folder tokenmill may not write, before creating anything in it."""
        if not os.path.lexists(self.path):
            return
        if not self.path.is_dir():
            raise OutputError(f"output.path: {self.path} is not a folder")
        try:
            marker = self._load_marker()
        except _BadRecord as exc:
            raise OutputError(f"output.path: {self.path}/{PRIVATE}/marker.json is damaged ({exc}); "
                              "choose an empty folder") from None
        if marker is None and not self._looks_empty():
            raise OutputError(f"output.path: {self.path} is not empty and was not written by tokenmill "
                              f"(no {PRIVATE}/marker.json); choose an empty folder")

    def claim(self, overwrite: bool) -> None:
        """Make this folder the job's output: refuse a foreign folder (whatever ``overwrite`` says) and an
        earlier run's output (a shard set, or any file the marker lists) without ``overwrite``; write the
        marker into a new or empty folder. Finishes a commit an earlier run left half-done first, so the check
        sees a consistent folder. Deletes nothing."""
        self._require_lock("claim")
        self._check_ownership()
        self.finish_pending_commit()
        marker = self._load_marker()
        if marker is None:
            self._write_marker([], _now())
            return
        if overwrite:
            return
        if any(is_manifest(rel) for rel in marker["files"]) or (self.path / "manifest.json").exists():
            raise OutputError(f"output.path: {self.path} already holds a shard set (manifest.json); pass "
                              "--overwrite (or set output.overwrite: true) to replace it")
        if marker["files"]:  # e.g. a documents-only job's documents/ and stats.json
            raise OutputError(f"output.path: {self.path} already holds an earlier run's output "
                              f"({', '.join(sorted({rel.split('/')[0] for rel in marker['files']}))}); pass "
                              "--overwrite (or set output.overwrite: true) to replace it")

    def _write_marker(self, files: list[str], created: str) -> None:
        atomic_write_json(self.marker_path, {"tool": "tokenmill", "format": MARKER_FORMAT, "created": created,
                                             "files": files})

    # lock --------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder for one job: exclusive, non-blocking, freed by the kernel if this process dies.

        Creates the folder (and ``.tokenmill/``) when missing, but never inside a folder that is not
        tokenmill's."""
        self._check_ownership()
        try:
            self.private.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"output.path: {describe_os_error(exc, self.private)}", os_error_category(exc)) from None
        key = os.path.realpath(self.lock_path)
        with _HELD_GUARD:
            if key in _HELD:
                raise OutputError(f"output.path: {self.path} is already locked by this process (pid {os.getpid()}); "
                                  "locking it twice is a bug")
            _HELD.add(key)
        try:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise OutputError(f"output.path: {describe_os_error(exc, self.lock_path)}",
                                  os_error_category(exc)) from None
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise OutputError(self._in_use(fd)) from None
                holder = {"host": os.uname().nodename, "pid": os.getpid(), "started": _now()}
                try:  # whatever an earlier, dead holder left there is simply replaced
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps(holder).encode(), 0)
                    os.fsync(fd)
                except OSError as exc:
                    raise OutputError(f"output.path: {describe_os_error(exc, self.lock_path)}",
                                  os_error_category(exc)) from None
                try:
                    yield
                finally:
                    with contextlib.suppress(OSError):  # so a finished job is never named as the holder
                        os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # releases the flock
        finally:
            with _HELD_GUARD:
                _HELD.discard(key)

    def _in_use(self, fd: int) -> str:
        try:
            holder = json.loads(os.pread(fd, 4096, 0))
        except (OSError, ValueError):
            holder = None
        if not isinstance(holder, dict) or not {"pid", "host", "started"} <= holder.keys():
            return f"output.path: {self.path} is in use by another tokenmill run (it is just starting)"
        return (f"output.path: {self.path} is in use by tokenmill pid {holder['pid']} on {holder['host']} "
                f"since {holder['started']}")

    def _require_lock(self, what: str) -> None:
        with _HELD_GUARD:
            held = os.path.realpath(self.lock_path) in _HELD
        if not held:
            raise RuntimeError(f"OutputDir.{what}() needs lock() held on {self.path}")

    # commit ------------------------------------------------------------------------------------------------

    def pending_commit(self) -> Path | None:
        """The stage of a commit that was interrupted (its journal is still there), else None."""
        journal = self._load_journal()
        return None if journal is None else self.path / journal["stage"]

    def finish_pending_commit(self) -> bool:
        """Finish a commit an earlier run left half-done; whether there was one."""
        self._require_lock("finish_pending_commit")
        journal = self._load_journal()
        if journal is None:
            return False
        self._apply(journal)
        return True

    def commit(self, stage_dir: str | os.PathLike[str] | None = None) -> list[str]:
        """Publish the staged shard set (default ``.tokenmill/work/stage``) in place of the old one; returns
        the published files. Call it only once the new run has succeeded: it is the only place that deletes
        anything. Calling it again after an interruption finishes the same commit."""
        self._require_lock("commit")
        stage = Path(stage_dir) if stage_dir is not None else self.stage
        rel_stage = self._stage_rel(stage)
        journal = self._load_journal()
        if journal is not None and journal["stage"] != rel_stage:
            raise OutputError(f"output.path: {self.path} has an unfinished commit of {journal['stage']}, not of "
                              f"{rel_stage}; finish that one first")
        if journal is None:
            try:
                marker = self._load_marker()
            except _BadRecord as exc:
                raise OutputError(f"output.path: {self.marker_path} is damaged ({exc})") from None
            if marker is None:
                raise RuntimeError(f"OutputDir.commit() before claim() on {self.path}")
            new = self._staged_files(stage)
            journal = {"stage": rel_stage, "new": new, "old": marker["files"], "created": marker["created"]}
            self._check_collisions(journal)
            atomic_write_json(self.journal_path, journal)
        self._apply(journal)
        return list(journal["new"])

    def _stage_rel(self, stage: Path) -> str:
        """The stage relative to the folder; it must lie in ``.tokenmill/work`` (same filesystem, so every
        move is a rename, and the journal can name it relatively)."""
        real = Path(os.path.realpath(stage))
        work = Path(os.path.realpath(self.work))
        if not real.is_relative_to(work) or real == work:
            raise ValueError(f"stage {stage} must lie inside {self.work}")
        return real.relative_to(os.path.realpath(self.path)).as_posix()

    def _staged_files(self, stage: Path) -> list[str]:
        if not stage.is_dir():
            raise OutputError(f"output.path: cannot commit {stage}: not a folder")
        files = []
        for root, dirs, names in os.walk(stage):
            for name in dirs + names:
                full = Path(root, name)
                if full.is_symlink() or not (full.is_dir() or full.is_file()):
                    raise OutputError(f"output.path: cannot commit {full}: only plain files and folders are published")
            files += [Path(root, name).relative_to(stage).as_posix() for name in names if not _is_temp(name)]
        try:
            files = _check_rel_list(sorted(files), "the stage")
        except _BadRecord as exc:
            raise OutputError(f"output.path: cannot commit {stage}: {exc}") from None
        if not files:
            raise OutputError(f"output.path: cannot commit {stage}: nothing is staged")
        return files

    def _blocked(self, rel: str) -> Path | None:
        """A folder on the way to ``rel`` that is a symlink or not a folder: never written through."""
        cur = self.path
        for part in rel.split("/")[:-1]:
            cur = cur / part
            if cur.is_symlink() or (os.path.lexists(cur) and not cur.is_dir()):
                return cur
        return None

    def _check_collisions(self, journal: dict[str, Any]) -> None:
        """Refuse, before anything moves, a staged name that would overwrite a file tokenmill did not publish."""
        old = set(journal["old"])
        stage = self.path / journal["stage"]
        for rel in journal["new"]:
            if not os.path.lexists(stage / rel):
                continue  # already in place (an interrupted commit)
            blocked = self._blocked(rel)
            if blocked is not None:
                raise OutputError(f"output.path: {blocked} is not a plain folder; tokenmill will not publish "
                                  f"{rel} through it")
            dest = self.path / rel
            if dest.is_dir() and not dest.is_symlink():
                raise OutputError(f"output.path: {dest} is a folder; tokenmill will not publish a file over it")
            if rel not in old and os.path.lexists(dest):
                raise OutputError(f"output.path: {dest} exists and was not written by tokenmill; "
                                  "move it away (tokenmill will not overwrite it)")

    def _load_journal(self) -> dict[str, Any] | None:
        try:
            data = _load_json_object(self.journal_path)
            if data is None:
                return None
            data = check_journal(data)
        except _BadRecord as exc:
            raise OutputError(f"output.path: {self.journal_path} is damaged ({exc})") from None
        return data

    def _apply(self, journal: dict[str, Any]) -> None:
        """Steps 1-6 of a commit; each is skipped where an interrupted call already did it."""
        self._check_collisions(journal)
        stage = self.path / journal["stage"]
        new, old = set(journal["new"]), journal["old"]
        try:
            # 1-2. The old manifest first, then the old files. A name in both sets whose staged file is
            # already gone was moved in by an interrupted call: it is the new file, keep it.
            for rel in sorted(old, key=lambda r: not is_manifest(r)):
                if rel not in new or os.path.lexists(stage / rel):
                    self._discard(rel)
            # 3. Every staged file into place, the manifests last (5) after the marker (4).
            for rel in journal["new"]:
                if not is_manifest(rel):
                    self._place(stage, rel)
            self._write_marker(journal["new"], journal["created"])
            for rel in journal["new"]:  # if any: a documents-only job publishes none
                if is_manifest(rel):
                    self._place(stage, rel)
            _fsync_dir(self.path)
            # 6. Clean up: trash, the folders the old files leave empty, the emptied stage, the journal.
            shutil.rmtree(self.trash, ignore_errors=True)
            for rel in old:
                self._prune(self.path / rel)
            for root, _dirs, _names in os.walk(stage, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(root)
            os.unlink(self.journal_path)
        except OSError as exc:
            raise OutputError(f"output.path: {describe_os_error(exc)} during the commit (the next run finishes "
                              "it)", os_error_category(exc)) from None

    def _discard(self, rel: str) -> None:
        """Move one previously published file to trash: only a file, never through a symlinked folder."""
        target = self.path / rel
        if self._blocked(rel) is not None or not os.path.lexists(target):
            return
        if target.is_dir() and not target.is_symlink():
            return
        dest = self.trash / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(target, dest)

    def _place(self, stage: Path, rel: str) -> None:
        src = stage / rel
        if not os.path.lexists(src):
            return  # moved by an interrupted call
        dest = self.path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)

    def _prune(self, path: Path) -> None:
        """Remove the folders above ``path`` that are now empty, up to (not including) the output folder."""
        for parent in path.parents:
            if parent == self.path or not parent.is_relative_to(self.path):
                return
            try:
                os.rmdir(parent)
            except OSError:
                return
