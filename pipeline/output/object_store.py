"""An output in an object store (``output.path: s3://bucket/prefix``): the same layout, ownership and
commit rules as a local folder (:mod:`pipeline.output.open_store`, shared in
:class:`~pipeline.output.store.StoreBase`), on a store that has no rename. This module gives only the
primitives that differ, and why:

- **Commit point = the manifest.** A commit copies every staged object to its published name (a
  server-side copy, no data through the driver), rewrites the marker, then copies ``manifest.json`` last:
  a reader that finds a manifest finds every shard it lists. The old manifest is deleted first, so no
  manifest ever describes a mixed set; the old files the new set does not replace are deleted after the
  new manifest is in. A journal (``.tokenmill/commit.json``) written before the first change makes an
  interrupted commit finish on the next run, as locally (every copy is simply redone).
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
from typing import ClassVar

from pipeline import storage
from pipeline.output.layout import BadRecord, Journal, OutputError, is_manifest
from pipeline.output.store import Holder, StoreBase, in_use, me

LEASE_S = 120.0
LEASE_RENEW_S = 30.0


class Lease(Holder):
    """The lock object: its holder, and when it was last renewed (``time.time()``)."""

    renewed: float


class ObjectOutputDir(StoreBase):
    """One output prefix in an object store (:class:`~pipeline.output.store.OutputStore`)."""

    NOUN: ClassVar[str] = "prefix"
    RENAMES: ClassVar[bool] = False

    def __init__(self, path: str) -> None:
        super().__init__(path.rstrip("/"))
        self._held = False

    # ownership ---------------------------------------------------------------------------------------------

    def _present(self) -> bool:
        return True  # a prefix with no object is simply empty

    def _holds_foreign_files(self) -> bool:
        try:
            return any(not f.startswith(self.private + "/") for f in storage.list_files(self.path))
        except OSError as exc:
            raise OutputError(f"output.path: cannot list {self.path}: {exc}", "infra") from None

    # lock --------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Take the lease (refused while another run renews it), renew it in a thread, delete it at the end."""
        self._check_ownership()
        holder = self._lease()
        if holder is not None and _live(holder) and not _mine(holder):
            raise OutputError(in_use(self.path, holder))
        lease = me()
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(LEASE_RENEW_S):
                self._put_lease(lease)

        self._put_lease(lease)
        thread = threading.Thread(target=renew, name="tokenmill-lease", daemon=True)
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

    def _lease(self) -> dict[str, object] | None:
        try:
            return self._read_record(self.lock_path)
        except BadRecord:
            return None  # a damaged lease holds nothing

    def _put_lease(self, holder: Holder) -> None:
        lease: Lease = {**holder, "renewed": time.time()}
        storage.write_bytes(self.lock_path, (json.dumps(lease, indent=1, sort_keys=True) + "\n").encode())

    def _holds_lock(self) -> bool:
        return self._held

    # commit ------------------------------------------------------------------------------------------------

    def _stage_rel(self, stage: str) -> str:
        stage = stage.rstrip("/")
        if not stage.startswith(self.work + "/"):
            raise ValueError(f"stage {stage} must lie inside {self.work}")
        return stage[len(self.path) + 1:]

    def _list_stage(self, stage: str) -> list[str]:
        stage = stage.rstrip("/")
        return [f[len(stage) + 1:] for f in storage.list_files(stage)]

    def _existing(self, root: str, rels: list[str]) -> set[str]:
        """One listing per top folder (``shards/``, a group's ``de/``) rather than a request per name."""
        found = set()
        for top in sorted({rel.split("/", 1)[0] for rel in rels if "/" in rel}):
            base = storage.join(root, top)
            found |= {f"{top}/{f[len(base) + 1:]}" for f in storage.list_files(base)}
        found |= {rel for rel in rels if "/" not in rel and storage.exists(storage.join(root, rel))}
        return found & set(rels)

    def _retire(self, journal: Journal) -> None:
        """Only the old manifests go now; the rest of the old set after the new manifest is in."""
        for rel in journal["old"]:
            if is_manifest(rel):
                storage.delete_file(storage.join(self.path, rel))

    def _place(self, stage: str, rel: str) -> None:
        src = storage.join(stage, rel)
        if storage.exists(src):
            storage.copy_file(src, storage.join(self.path, rel))

    def _clean_up(self, journal: Journal) -> None:
        for rel in sorted(set(journal["old"]) - set(journal["new"])):
            storage.delete_file(storage.join(self.path, rel))
        storage.rmtree(storage.join(self.path, journal["stage"]))


def _live(lease: dict[str, object]) -> bool:
    """Whether the lease was renewed recently enough that its run may still be alive."""
    renewed = lease.get("renewed", 0)
    return isinstance(renewed, int | float) and renewed > time.time() - LEASE_S


def _mine(lease: dict[str, object]) -> bool:
    return lease.get("host") == os.uname().nodename and lease.get("pid") == os.getpid()


def check_remote_not_overlapping(output: str, input_paths: list[str]) -> None:
    """The object-store form of :func:`~pipeline.output.open_store.check_not_overlapping`: by prefix."""
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
