"""The output a job writes, local folder or object-store prefix alike: :class:`OutputStore` is what callers
use, :class:`StoreBase` the logic both backends share.

Shared here, once: the marker (ownership, :meth:`StoreBase.claim`), the commit journal and the commit's
order (:meth:`StoreBase.commit`: old manifest out, new files in, marker, new manifest last, clean-up), the
collision check, and the records' reading and writing (through :mod:`pipeline.storage`, whose one atomic
write serves both). A backend gives only what really differs: how the output is held (a ``flock`` or a
lease), how a staged file reaches its name (a rename or a server-side copy), what happens to the old files
and how its stage is listed. The rules themselves are described in :mod:`pipeline.output.open_store`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import ClassVar, Protocol, TypedDict

from pipeline import storage
from pipeline.output.layout import (
    MAX_RECORD_BYTES,
    PRIVATE,
    BadRecord,
    EarlierOutput,
    Journal,
    Marker,
    OutputError,
    check_rel,
    check_rel_list,
    describe_os_error,
    is_manifest,
    new_marker,
    os_error_category,
    parse_journal,
    parse_marker,
    parse_object,
    record_bytes,
)


class OutputStore(Protocol):
    """One job's output. Use: ``with out.lock(): out.claim(overwrite); ...build in out.stage...;
    out.commit()``; ``claim`` and ``commit`` need the lock. Locations are ``str`` (local paths or URIs,
    for :mod:`pipeline.storage`)."""

    #: the output itself (``output.path``)
    path: str
    #: tokenmill's private area, ``<path>/.tokenmill``
    private: str
    #: the running job's state, ``<private>/work`` (the job engine owns its content)
    work: str
    #: where the new set is built under its published names, ``<work>/stage``
    stage: str

    def lock(self) -> AbstractContextManager[None]:
        """Hold the output for one job; a second holder is refused naming the first."""
        ...

    def claim(self, overwrite: bool, owner: str | None = None) -> None:
        """Make the output the job's: refuse a foreign one, another ``owner``'s, and an earlier run's output
        without ``overwrite``."""
        ...

    def check_claim(self, overwrite: bool) -> None:
        """What ``claim`` would refuse, without the lock and writing nothing."""
        ...

    def commit(self, stage_dir: str | None = None) -> list[str]:
        """Publish the staged set in place of the old one; returns the published files."""
        ...

    def read_marker(self) -> Marker | None:
        """The marker, or None when the output has none or a damaged one."""
        ...

    def is_tokenmill(self) -> bool:
        """Whether tokenmill wrote this output."""
        ...

    def add_published(self, names: list[str], drop: Sequence[str] = ()) -> None:
        """List ``names`` in the marker of a finished output, under its lock (``tokenmill card`` on an older one),
        and no longer ``drop`` (files it removed)."""
        ...


class Holder(TypedDict):
    """Who holds an output's lock (what a second run is told)."""

    host: str
    pid: int
    started: str


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def me() -> Holder:
    return {"host": os.uname().nodename, "pid": os.getpid(), "started": now()}


def in_use(path: str, holder: dict[str, object] | None) -> str:
    """The refusal a second run gets, naming the holder when its record says who it is."""
    if holder is None or not {"pid", "host", "started"} <= holder.keys():
        return f"output.path: {path} is in use by another tokenmill run (it is just starting)"
    return (f"output.path: {path} is in use by tokenmill pid {holder['pid']} on {holder['host']} "
            f"since {holder['started']}")


def _reason(exc: Exception) -> str:
    """An exception's reason on one line."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


class StoreBase(ABC):
    """What a local folder and an object-store prefix share; a backend provides the abstract primitives."""

    #: what the output is called in messages ("folder", "prefix")
    NOUN: ClassVar[str]
    #: whether a commit renames staged files into place. Then a staged file still there is one not yet
    #: published, and the collision check also holds when an interrupted commit is finished; a copy leaves
    #: every staged object behind until the end, so there the check runs once, before the journal.
    RENAMES: ClassVar[bool]

    def __init__(self, path: str) -> None:
        self.path = path
        self.private = storage.join(path, PRIVATE)
        self.marker_path = storage.join(self.private, "marker.json")
        self.lock_path = storage.join(self.private, "lock")
        self.work = storage.join(self.private, "work")
        self.stage = storage.join(self.work, "stage")
        self.journal_path = storage.join(self.private, "commit.json")

    # the backend's primitives ------------------------------------------------------------------------------

    @abstractmethod
    def lock(self) -> AbstractContextManager[None]: ...

    @abstractmethod
    def _holds_lock(self) -> bool: ...

    @abstractmethod
    def _present(self) -> bool:
        """Whether anything is at ``path`` yet; OutputError when what is there cannot be an output."""

    @abstractmethod
    def _holds_foreign_files(self) -> bool:
        """Whether the output holds anything besides tokenmill's private area (asked when it has no marker)."""

    @abstractmethod
    def _stage_rel(self, stage: str) -> str:
        """``stage`` relative to the output; ValueError unless it lies inside ``work``."""

    @abstractmethod
    def _list_stage(self, stage: str) -> list[str]:
        """Every file staged below ``stage``, relative to it (``shards/shard-000000.tar``)."""

    @abstractmethod
    def _existing(self, root: str, rels: list[str]) -> set[str]:
        """Which of ``rels`` exist below ``root``."""

    def _obstacle(self, rel: str) -> str | None:
        """Why ``rel`` cannot be published over what is at its name, if anything does stop it."""
        return None

    @abstractmethod
    def _retire(self, journal: Journal) -> None:
        """Steps 1-2 of a commit: the old manifests out (first), and whatever else the backend removes now."""

    @abstractmethod
    def _place(self, stage: str, rel: str) -> None:
        """One staged file to its published name; nothing when an interrupted call already did it."""

    @abstractmethod
    def _clean_up(self, journal: Journal) -> None:
        """Step 6: what the new set does not need any more (old files, the emptied stage)."""

    # records -----------------------------------------------------------------------------------------------

    def _read_record(self, loc: str) -> dict[str, object] | None:
        """The JSON object stored at ``loc``; None when there is none (BadRecord when it does not parse)."""
        try:
            data = storage.read_bytes(loc, MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise BadRecord(_reason(exc)) from None
        return parse_object(data)

    def _write_record(self, loc: str, record: Marker | Journal) -> None:
        try:
            storage.write_bytes(loc, record_bytes(record))
        except OSError as exc:
            raise OutputError(describe_os_error(exc, loc), os_error_category(exc)) from None

    def _load_marker(self) -> Marker | None:
        data = self._read_record(self.marker_path)
        return None if data is None else parse_marker(data)

    def read_marker(self) -> Marker | None:
        """The marker, or None when the output has none or a damaged one."""
        try:
            return self._load_marker()
        except BadRecord:
            return None

    def is_tokenmill(self) -> bool:
        """Whether tokenmill wrote this output (its marker exists and parses)."""
        return self.read_marker() is not None

    def add_published(self, names: list[str], drop: Sequence[str] = ()) -> None:
        """List ``names`` (published names, :func:`check_rel`) in the marker of a finished output, under its lock:
        files written after the commit (``tokenmill card`` on an output older than cards) are then served and
        replaced like the rest; ``drop``: names no longer there (an older card). A folder without a marker is
        left alone."""
        with self.lock():
            marker = self.read_marker()
            if marker is None:
                return
            kept = [f for f in marker["files"] if f not in drop]
            missing = [check_rel(n) for n in names if n not in kept]
            if missing or len(kept) != len(marker["files"]):
                self._write_record(self.marker_path, new_marker(kept + missing, marker["created"],
                                                                marker.get("owner")))

    def _load_journal(self) -> Journal | None:
        try:
            data = self._read_record(self.journal_path)
            return None if data is None else parse_journal(data)
        except BadRecord as exc:
            raise OutputError(f"output.path: {self.journal_path} is damaged ({exc})") from None

    # ownership ---------------------------------------------------------------------------------------------

    def _checked_marker(self, advice: str = "") -> Marker | None:
        """The marker (None when there is none); :class:`OutputError` naming it, then ``advice``, when damaged."""
        try:
            return self._load_marker()
        except BadRecord as exc:
            raise OutputError(f"output.path: {self.marker_path} is damaged ({exc}){advice}") from None

    def _check_ownership(self) -> Marker | None:
        """Refuse an output tokenmill may not write, before creating anything in it; returns its marker (None when
        the output is missing or has none)."""
        if not self._present():
            return None
        marker = self._checked_marker(f"; choose an empty {self.NOUN}")
        if marker is None and self._holds_foreign_files():
            raise OutputError(f"output.path: {self.path} is not empty and was not written by tokenmill "
                              f"(no {PRIVATE}/marker.json); choose an empty {self.NOUN}")
        return marker

    def claim(self, overwrite: bool, owner: str | None = None) -> None:
        """Make this output the job's: refuse a foreign one (whatever ``overwrite`` says), one whose marker names
        another ``owner`` (a service's team), and an earlier run's output (a shard set, or any file the marker
        lists) without ``overwrite``; write the marker (with ``owner``) into a new or empty one. Finishes a
        commit an earlier run left half-done first, so the check sees a consistent output. Deletes nothing."""
        self._require_lock("claim")
        self._check_owner(self._check_ownership(), owner)
        self.finish_pending_commit()
        marker = self._load_marker()
        if marker is None:
            self._write_record(self.marker_path, new_marker([], now(), owner))
            return
        if not overwrite:
            self._refuse_earlier_output(marker["files"])

    def _check_owner(self, marker: Marker | None, owner: str | None) -> None:
        """:class:`OutputError` when ``marker`` names another owner than ``owner`` (None: no owner asked)."""
        if owner is not None and marker is not None and marker.get("owner", owner) != owner:
            raise OutputError(f"output.path: {self.path} belongs to another team (its job wrote it first); "
                                  "choose another folder")

    def check_claim(self, overwrite: bool) -> None:
        """What :meth:`claim` would refuse, asked without the lock and writing nothing (the service asks it before
        it queues a job): a foreign or damaged output (:class:`OutputError`) and, without ``overwrite``, an
        earlier run's output (:class:`EarlierOutput`). A half-done commit counts as done: claim finishes it first."""
        marker = self._check_ownership()
        if overwrite:
            return
        if marker is not None:
            journal = self._load_journal()
            self._refuse_earlier_output(marker["files"] if journal is None else journal["new"])

    def _refuse_earlier_output(self, files: list[str]) -> None:
        """:class:`EarlierOutput` when ``files`` (what the marker lists) or the folder hold a published output."""
        if any(is_manifest(rel) for rel in files) or storage.exists(storage.join(self.path, "manifest.json")):
            raise EarlierOutput(f"output.path: {self.path} already holds a shard set (manifest.json); pass "
                                "--overwrite (or set output.overwrite: true) to replace it")
        if files:  # e.g. a documents-only job's documents/ and stats.json
            raise EarlierOutput(f"output.path: {self.path} already holds an earlier run's output "
                                f"({', '.join(sorted({rel.split('/')[0] for rel in files}))}); pass "
                                "--overwrite (or set output.overwrite: true) to replace it")

    def _require_lock(self, what: str) -> None:
        if not self._holds_lock():
            raise RuntimeError(f"{type(self).__name__}.{what}() needs lock() held on {self.path}")

    # commit ------------------------------------------------------------------------------------------------

    def pending_commit(self) -> str | None:
        """The stage of a commit that was interrupted (its journal is still there), else None."""
        journal = self._load_journal()
        return None if journal is None else storage.join(self.path, journal["stage"])

    def finish_pending_commit(self) -> bool:
        """Finish a commit an earlier run left half-done; whether there was one."""
        self._require_lock("finish_pending_commit")
        journal = self._load_journal()
        if journal is None:
            return False
        self._apply(journal)
        return True

    def commit(self, stage_dir: str | os.PathLike[str] | None = None) -> list[str]:
        """Publish the staged set (default ``stage``) in place of the old one; returns the published files.
        Call it only once the new run has succeeded: it is the only place that deletes anything. Calling it
        again after an interruption finishes the same commit."""
        self._require_lock("commit")
        stage = os.fspath(stage_dir) if stage_dir is not None else self.stage
        rel_stage = self._stage_rel(stage)
        journal = self._load_journal()
        if journal is not None and journal["stage"] != rel_stage:
            raise OutputError(f"output.path: {self.path} has an unfinished commit of {journal['stage']}, not of "
                              f"{rel_stage}; finish that one first")
        if journal is None:
            journal = self._new_journal(stage, rel_stage)
            self._check_collisions(journal)
            self._write_record(self.journal_path, journal)
        self._apply(journal)
        return list(journal["new"])

    def _new_journal(self, stage: str, rel_stage: str) -> Journal:
        marker = self._checked_marker()
        if marker is None:
            raise RuntimeError(f"{type(self).__name__}.commit() before claim() on {self.path}")
        files = [rel for rel in self._list_stage(stage) if not storage.is_temp_name(rel.rsplit("/", 1)[-1])]
        try:
            new = check_rel_list(sorted(files), "the stage")
        except BadRecord as exc:
            raise OutputError(f"output.path: cannot commit {stage}: {exc}") from None
        if not new:
            raise OutputError(f"output.path: cannot commit {stage}: nothing is staged")
        return {"stage": rel_stage, "new": new, "old": marker["files"], "created": marker["created"]}

    def _check_collisions(self, journal: Journal) -> None:
        """Refuse, before anything moves, a staged name that would overwrite a file tokenmill did not publish."""
        old = set(journal["old"])
        staged = self._existing(storage.join(self.path, journal["stage"]), journal["new"])
        taken = self._existing(self.path, [rel for rel in journal["new"] if rel in staged and rel not in old])
        for rel in journal["new"]:
            if rel not in staged:
                continue  # already in place (an interrupted commit)
            obstacle = self._obstacle(rel)
            if obstacle is not None:
                raise OutputError(obstacle)
            if rel in taken:
                raise OutputError(f"output.path: {storage.join(self.path, rel)} exists and was not written by "
                                  "tokenmill; move it away (tokenmill will not overwrite it)")

    def _apply(self, journal: Journal) -> None:
        """The commit's steps in order (:mod:`pipeline.output.open_store`); each backend step skips what an
        interrupted call already did, so a commit is finished by calling this again."""
        if self.RENAMES:
            self._check_collisions(journal)
        stage = storage.join(self.path, journal["stage"])
        try:
            self._retire(journal)  # 1-2. the old manifests first: no manifest ever describes a mixed set
            for rel in journal["new"]:  # 3. every staged file into place, the manifests last (5)
                if not is_manifest(rel):
                    self._place(stage, rel)
            current = self._load_marker()
            owner = current.get("owner") if current is not None else None
            self._write_record(self.marker_path, new_marker(journal["new"], journal["created"], owner))  # 4.
            for rel in journal["new"]:  # 5. the commit point; a documents-only job has no manifest
                if is_manifest(rel):
                    self._place(stage, rel)
            self._clean_up(journal)  # 6.
            storage.delete_file(self.journal_path)
        except OSError as exc:
            what = describe_os_error(exc) if exc.filename or exc.filename2 else _reason(exc)
            raise OutputError(f"output.path: {what} during the commit (the next run finishes it)",
                              os_error_category(exc)) from None
