"""A local output folder (:class:`OutputDir`): the primitives :class:`~pipeline.output.store.StoreBase`
needs, on a filesystem that has rename and ``flock``.

- **Lock**: an exclusive, non-blocking ``flock`` on ``.tokenmill/lock``, held for the job's life, so the
  kernel frees it when the holder dies (a lock file naming a dead pid is simply taken over). The file
  names the holder; a second lock of the same folder in one process is a bug and is refused too.
- **Commit**: staged files are renamed into place (``os.replace``, same filesystem: a file keeps its inode
  and mtime); the old ones are first moved to ``.tokenmill/trash/``, emptied at the end. Nothing is ever
  written through a symlinked folder, nor a file published over a folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from pipeline import storage
from pipeline.output.layout import PRIVATE, Journal, OutputError, describe_os_error, is_manifest, os_error_category
from pipeline.output.store import StoreBase, in_use, me

# Lock files this process holds (real paths): a second lock() of the same folder in one process is a bug.
_HELD: set[str] = set()
_HELD_GUARD = threading.Lock()


def _os_failure(exc: OSError, path: str) -> OutputError:
    return OutputError(f"output.path: {describe_os_error(exc, path)}", os_error_category(exc))


class OutputDir(StoreBase):
    """One local output folder (:class:`~pipeline.output.store.OutputStore`)."""

    NOUN: ClassVar[str] = "folder"
    RENAMES: ClassVar[bool] = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(str(Path(path)))
        self.trash = storage.join(self.private, "trash")

    # ownership ---------------------------------------------------------------------------------------------

    def _present(self) -> bool:
        if not os.path.lexists(self.path):
            return False
        if not os.path.isdir(self.path):
            raise OutputError(f"output.path: {self.path} is not a folder")
        return True

    def _holds_foreign_files(self) -> bool:
        """Whether it holds more than a ``.tokenmill/`` folder (one without a marker is a run that stopped before its
        claim: tokenmill's own name, nothing published)."""
        try:
            entries = os.listdir(self.path)
        except OSError as exc:
            raise OutputError(f"output.path: cannot read {self.path}: {exc.strerror or exc}") from None
        return bool(entries) and not (entries == [PRIVATE] and os.path.isdir(self.private)
                                      and not os.path.islink(self.private))

    # lock --------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder for one job: exclusive, non-blocking, freed by the kernel if this process dies.

        Creates the folder (and ``.tokenmill/``) when missing, but never inside a folder that is not
        tokenmill's."""
        self._check_ownership()
        try:
            os.makedirs(self.private, exist_ok=True)
        except OSError as exc:
            raise _os_failure(exc, self.private) from None
        with self._held_here(), self._flocked() as fd:
            try:
                yield
            finally:
                with contextlib.suppress(OSError):  # so a finished job is never named as the holder
                    os.ftruncate(fd, 0)

    @contextlib.contextmanager
    def _held_here(self) -> Iterator[None]:
        """This process's claim on the lock file: a second one is refused (one process, one holder)."""
        key = os.path.realpath(self.lock_path)
        with _HELD_GUARD:
            if key in _HELD:
                raise OutputError(f"output.path: {self.path} is already locked by this process (pid {os.getpid()}); "
                                  "locking it twice is a bug")
            _HELD.add(key)
        try:
            yield
        finally:
            with _HELD_GUARD:
                _HELD.discard(key)

    @contextlib.contextmanager
    def _flocked(self) -> Iterator[int]:
        """The lock file, ``flock``ed and naming this process (whatever a dead holder left is replaced)."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _os_failure(exc, self.lock_path) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputError(in_use(self.path, _holder_in(fd))) from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(me()).encode(), 0)
                os.fsync(fd)
            except OSError as exc:
                raise _os_failure(exc, self.lock_path) from None
            yield fd
        finally:
            os.close(fd)  # releases the flock

    def _holds_lock(self) -> bool:
        with _HELD_GUARD:
            return os.path.realpath(self.lock_path) in _HELD

    # commit ------------------------------------------------------------------------------------------------

    def _stage_rel(self, stage: str) -> str:
        """The stage must lie in ``.tokenmill/work``: the same filesystem, so every move is a rename, and the
        journal can name it relatively."""
        real = Path(os.path.realpath(stage))
        work = Path(os.path.realpath(self.work))
        if not real.is_relative_to(work) or real == work:
            raise ValueError(f"stage {stage} must lie inside {self.work}")
        return real.relative_to(os.path.realpath(self.path)).as_posix()

    def _list_stage(self, stage: str) -> list[str]:
        """Plain files and folders only: a symlink or a device in the stage is refused."""
        if not os.path.isdir(stage):
            raise OutputError(f"output.path: cannot commit {stage}: not a folder")
        files = []
        for root, dirs, names in os.walk(stage):
            for name in dirs + names:
                full = os.path.join(root, name)
                if os.path.islink(full) or not (os.path.isdir(full) or os.path.isfile(full)):
                    raise OutputError(f"output.path: cannot commit {full}: only plain files and folders are published")
            files += [Path(root, name).relative_to(stage).as_posix() for name in names]
        return files

    def _existing(self, root: str, rels: list[str]) -> set[str]:
        return {rel for rel in rels if os.path.lexists(os.path.join(root, rel))}

    def _blocked(self, rel: str) -> str | None:
        """A folder on the way to ``rel`` that is a symlink or not a folder: never written through."""
        cur = self.path
        for part in rel.split("/")[:-1]:
            cur = os.path.join(cur, part)
            if os.path.islink(cur) or (os.path.lexists(cur) and not os.path.isdir(cur)):
                return cur
        return None

    def _obstacle(self, rel: str) -> str | None:
        blocked = self._blocked(rel)
        if blocked is not None:
            return f"output.path: {blocked} is not a plain folder; tokenmill will not publish {rel} through it"
        dest = os.path.join(self.path, rel)
        if os.path.isdir(dest) and not os.path.islink(dest):
            return f"output.path: {dest} is a folder; tokenmill will not publish a file over it"
        return None

    def _retire(self, journal: Journal) -> None:
        """Every old file to trash, the manifests first. A name in both sets whose staged file is already gone
        was moved in by an interrupted call: it is the new file, keep it."""
        stage = os.path.join(self.path, journal["stage"])
        new = set(journal["new"])
        for rel in sorted(journal["old"], key=lambda r: not is_manifest(r)):
            if rel not in new or os.path.lexists(os.path.join(stage, rel)):
                self._discard(rel)

    def _discard(self, rel: str) -> None:
        """Move one previously published file to trash: only a file, never through a symlinked folder."""
        target = os.path.join(self.path, rel)
        if self._blocked(rel) is not None or not os.path.lexists(target):
            return
        if os.path.isdir(target) and not os.path.islink(target):
            return
        dest = os.path.join(self.trash, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(target, dest)

    def _place(self, stage: str, rel: str) -> None:
        src = os.path.join(stage, rel)
        if not os.path.lexists(src):
            return  # moved by an interrupted call
        dest = os.path.join(self.path, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(src, dest)

    def _clean_up(self, journal: Journal) -> None:
        """The renames made durable; then trash, the folders the old files leave empty, the emptied stage."""
        storage.fsync_dir(self.path)
        shutil.rmtree(self.trash, ignore_errors=True)
        for rel in journal["old"]:
            self._prune(os.path.join(self.path, rel))
        for root, _dirs, _names in os.walk(os.path.join(self.path, journal["stage"]), topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(root)

    def _prune(self, path: str) -> None:
        """Remove the folders above ``path`` that are now empty, up to (not including) the output folder."""
        top = Path(self.path)
        for parent in Path(path).parents:
            if parent == top or not parent.is_relative_to(top):
                return
            try:
                os.rmdir(parent)
            except OSError:
                return


def _holder_in(fd: int) -> dict[str, object] | None:
    """The holder a lock file names, if it names one yet."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
