"""The output folder's safety rules: what tokenmill owns there, who may write it, and how a new run replaces
the old one without losing anything if it fails half-way. The entry point: :func:`open_output_dir` gives
an :class:`~pipeline.output.store.OutputStore`, and :func:`check_not_overlapping` keeps inputs and
output apart.

Where the code is: the layout and records in :mod:`pipeline.output.layout`; the ownership, journal and
commit logic once, in :class:`~pipeline.output.store.StoreBase`; a backend's own primitives in
:mod:`pipeline.output.local_store` (:class:`OutputDir`: ``flock``, rename) and
:mod:`pipeline.output.object_store` (``ObjectOutputDir``: lease, server-side copy). Every file is written
by :mod:`pipeline.storage`'s one atomic write.

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
e.g. a documents-only job's ``documents/``) is replaced only with ``--overwrite`` (``output.overwrite: true``;
refused otherwise as :class:`EarlierOutput`). ``check_claim`` asks all this without the lock and writes
nothing: the service refuses a submission with it before queuing the job.

What ``--overwrite`` deletes: exactly the files the marker lists (and the folders they leave empty), never
anything else: a user's ``shards/my_photos.tar`` stays. And it deletes nothing until the new run has
succeeded: deletion happens inside ``commit()``, which the engine calls only after the new set is
complete in the stage. A staged name that would overwrite a file the marker does not list is refused
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

import os
from collections.abc import Iterable
from pathlib import Path

from pipeline import storage
from pipeline.output.layout import OutputError, describe_os_error, os_error_category
from pipeline.output.local_store import OutputDir
from pipeline.output.object_store import ObjectOutputDir, check_remote_not_overlapping
from pipeline.output.store import OutputStore

GLOB_CHARS = "*?["


def open_output_dir(path: str | os.PathLike[str]) -> OutputStore:
    """The output at ``path``: a local :class:`OutputDir`, or an
    :class:`~pipeline.output.object_store.ObjectOutputDir` for an object-store URI (``s3://...``)."""
    if storage.is_remote(os.fspath(path)):
        return ObjectOutputDir(os.fspath(path))
    return OutputDir(storage.local_path(path))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """:func:`pipeline.storage.write_bytes` (readers see the old content or the new, never a part; a failure
    leaves no temporary file) with an OSError as an :class:`OutputError` naming ``path``:
    ``cannot write PATH: No space left on device``."""
    try:
        storage.write_bytes(os.fspath(path), data)
    except OSError as exc:
        raise OutputError(describe_os_error(exc, path), os_error_category(exc)) from None


def _static_root(path: str) -> tuple[str, bool]:
    """The fixed leading folders of a glob (``data/**/*.txt`` -> ``data``) and whether it was a glob."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if any(c in part for c in GLOB_CHARS):
            return (str(Path(*parts[:i])) if i else os.curdir), True
    return path, False


def check_not_overlapping(output: str | os.PathLike[str], input_paths: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse an output folder that equals or lies inside a folder an input reads, or that contains an
    input: either way a later run would read its own output. Paths are compared resolved (symlinks);
    object-store locations by prefix (:func:`pipeline.output.object_store.check_remote_not_overlapping`)."""
    inputs = [os.fspath(p) for p in input_paths]
    if storage.is_remote(os.fspath(output)):
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
