"""An output in an object store (``output.path: s3://bucket/prefix``): the same layout, ownership and
commit rules as a local folder (:mod:`pipeline.job.output_dir`), on a store that has no rename.

What differs, and why:

- **Commit point = the manifest.** A commit copies every staged object to its published name (a
  server-side copy, no data through the driver), rewrites the marker, then copies ``manifest.json`` last:
  a reader that finds a manifest finds every shard it lists. The old manifest is deleted first, so no
  manifest ever describes a mixed set; the old files the new set does not replace are deleted after the
  new manifest is in. A journal (``.tokenmill/commit.json``) written before the first change makes an
  interrupted commit finish on the next run, as locally.
- **Lock = a lease object.** ``.tokenmill/lock`` names the holder (host, pid, started, renewed) and is
  renewed every ``LEASE_RENEW_S`` by a thread; a lock not renewed for ``LEASE_S`` belongs to a dead run
  and is taken over. An object store has no compare-and-swap in pyarrow's API, so two runs starting in
  the same second could both take it: the control plane runs one job per output, and the CLI user is
  told who holds it otherwise.
- Resumed shards are kept by name, size and sha256 (there is no inode to keep).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pipeline import storage
from pipeline.job.output_dir import (
    MARKER_FORMAT,
    PRIVATE,
    MarkerReader,
    OutputError,
    _BadRecord,
    _check_rel_list,
    _is_temp,
    check_journal,
    check_marker,
    is_manifest,
)

LEASE_S = 120.0
LEASE_RENEW_S = 30.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ObjectOutputDir(MarkerReader):
    """One output prefix in an object store; the interface of :class:`~pipeline.job.output_dir.OutputDir`."""

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")
        self.private = storage.join(self.path, PRIVATE)
        self.marker_path = storage.join(self.private, "marker.json")
        self.lock_path = storage.join(self.private, "lock")
        self.work = storage.join(self.private, "work")
        self.stage = storage.join(self.work, "stage")
        self.journal_path = storage.join(self.private, "commit.json")
        self._held = False

    # records -----------------------------------------------------------------------------------------------

    def _json(self, loc: str) -> dict[str, Any] | None:
        try:
            data = json.loads(storage.read_bytes(loc, 64 << 20))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise _BadRecord(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        if not isinstance(data, dict):
            raise _BadRecord("not a JSON object")
        return data

    def _put_json(self, loc: str, obj: Any) -> None:
        storage.write_bytes(loc, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

    def _load_marker(self) -> dict[str, Any] | None:
        return check_marker(self._json(self.marker_path))

    # ownership ---------------------------------------------------------------------------------------------

    def _check_ownership(self) -> None:
        try:
            marker = self._load_marker()
        except _BadRecord as exc:
            raise OutputError(f"output.path: {self.marker_path} is damaged ({exc}); choose an empty prefix") from None
        if marker is not None:
            return
        try:
            foreign = [f for f in storage.list_files(self.path) if not f.startswith(self.private + "/")]
        except OSError as exc:
            raise OutputError(f"output.path: cannot list {self.path}: {exc}", "infra") from None
        if foreign:
            raise OutputError(f"output.path: {self.path} is not empty and was not written by tokenmill "
                              f"(no {PRIVATE}/marker.json); choose an empty prefix")

    def claim(self, overwrite: bool) -> None:
        self._require_lock("claim")
        self._check_ownership()
        self.finish_pending_commit()
        marker = self._load_marker()
        if marker is None:
            self._put_json(self.marker_path, {"tool": "tokenmill", "format": MARKER_FORMAT, "created": _now(),
                                              "files": []})
            return
        if overwrite:
            return
        if any(is_manifest(rel) for rel in marker["files"]) or storage.exists(storage.join(self.path, "manifest.json")):
            raise OutputError(f"output.path: {self.path} already holds a shard set (manifest.json); pass "
                              "--overwrite (or set output.overwrite: true) to replace it")
        if marker["files"]:
            raise OutputError(f"output.path: {self.path} already holds an earlier run's output; pass "
                              "--overwrite (or set output.overwrite: true) to replace it")

    # lock --------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        self._check_ownership()
        holder = self._json_or_none(self.lock_path)
        me = {"host": os.uname().nodename, "pid": os.getpid(), "started": _now()}
        if holder and holder.get("renewed", 0) > time.time() - LEASE_S and not self._mine(holder):
            raise OutputError(f"output.path: {self.path} is in use by tokenmill pid {holder.get('pid')} on "
                              f"{holder.get('host')} since {holder.get('started')}")
        stop = threading.Event()

        def renew() -> None:
            while True:
                self._put_json(self.lock_path, {**me, "renewed": time.time()})
                if stop.wait(LEASE_RENEW_S):
                    return

        self._put_json(self.lock_path, {**me, "renewed": time.time()})
        thread = threading.Thread(target=lambda: stop.wait(LEASE_RENEW_S) or renew(), name="tokenmill-lease",
                                  daemon=True)
        thread.start()
        self._held = True
        try:
            yield
        finally:
            self._held = False
            stop.set()
            thread.join(timeout=10)
            with contextlib.suppress(OSError):
                storage.delete_file(self.lock_path)

    def _json_or_none(self, loc: str) -> dict[str, Any] | None:
        try:
            return self._json(loc)
        except _BadRecord:
            return None

    @staticmethod
    def _mine(holder: dict[str, Any]) -> bool:
        return holder.get("host") == os.uname().nodename and holder.get("pid") == os.getpid()

    def _require_lock(self, what: str) -> None:
        if not self._held:
            raise RuntimeError(f"ObjectOutputDir.{what}() needs lock() held on {self.path}")

    # commit ------------------------------------------------------------------------------------------------

    def finish_pending_commit(self) -> bool:
        self._require_lock("finish_pending_commit")
        journal = self._load_journal()
        if journal is None:
            return False
        self._apply(journal)
        return True

    def commit(self, stage_dir: str | None = None) -> list[str]:
        self._require_lock("commit")
        stage = (stage_dir or self.stage).rstrip("/")
        if not stage.startswith(self.work + "/"):
            raise ValueError(f"stage {stage} must lie inside {self.work}")
        rel_stage = stage[len(self.path) + 1:]
        journal = self._load_journal()
        if journal is not None and journal["stage"] != rel_stage:
            raise OutputError(f"output.path: {self.path} has an unfinished commit of {journal['stage']}")
        if journal is None:
            marker = self._load_marker()
            if marker is None:
                raise RuntimeError(f"ObjectOutputDir.commit() before claim() on {self.path}")
            files = sorted(f[len(stage) + 1:] for f in storage.list_files(stage)
                           if not _is_temp(storage.name(f)))
            try:
                new = _check_rel_list(files, "the stage")
            except _BadRecord as exc:
                raise OutputError(f"output.path: cannot commit {stage}: {exc}") from None
            if not new:
                raise OutputError(f"output.path: cannot commit {stage}: nothing is staged")
            journal = {"stage": rel_stage, "new": new, "old": marker["files"], "created": marker["created"]}
            self._put_json(self.journal_path, journal)
        self._apply(journal)
        return list(journal["new"])

    def _load_journal(self) -> dict[str, Any] | None:
        try:
            data = self._json(self.journal_path)
            if data is None:
                return None
            data = check_journal(data)
        except _BadRecord as exc:
            raise OutputError(f"output.path: {self.journal_path} is damaged ({exc})") from None
        return data

    def _apply(self, journal: dict[str, Any]) -> None:
        """Copy in, manifest last; every step is idempotent, so an interrupted commit is simply redone."""
        stage = storage.join(self.path, journal["stage"])
        new, old = journal["new"], journal["old"]
        try:
            for rel in old:  # 1. no manifest may describe a mixed set
                if is_manifest(rel):
                    storage.delete_file(storage.join(self.path, rel))
            for rel in new:  # 2. every staged object to its name (server-side copies)
                if not is_manifest(rel):
                    self._place(stage, rel)
            self._put_json(self.marker_path, {"tool": "tokenmill", "format": MARKER_FORMAT,
                                              "created": journal["created"], "files": new})
            for rel in new:  # 3. the commit point
                if is_manifest(rel):
                    self._place(stage, rel)
            for rel in set(old) - set(new):  # 4. what the new set does not replace
                storage.delete_file(storage.join(self.path, rel))
            storage.rmtree(stage)
            storage.delete_file(self.journal_path)
        except OSError as exc:
            raise OutputError(f"output.path: {exc} during the commit (the next run finishes it)", "infra") from None

    def _place(self, stage: str, rel: str) -> None:
        src = storage.join(stage, rel)
        if storage.exists(src):
            storage.copy_file(src, storage.join(self.path, rel))


def check_remote_not_overlapping(output: str, input_paths: list[str]) -> None:
    """The object-store form of :func:`~pipeline.job.output_dir.check_not_overlapping`: by prefix."""
    out = output.rstrip("/") + "/"
    for i, raw in enumerate(input_paths):
        if not storage.is_remote(raw):
            continue
        root = raw
        for c in storage.GLOB_CHARS:
            root = root.split(c, 1)[0]
        root = root.rsplit("/", 1)[0] + "/" if root != raw else raw.rstrip("/") + "/"
        if out.startswith(root) or root.startswith(out):
            raise OutputError(f"output.path: {output} overlaps inputs.{i}.path ({raw}); a later run would read its "
                              "own output; choose an output prefix outside the inputs")
