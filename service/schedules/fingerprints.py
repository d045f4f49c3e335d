"""Which input files a refresh must read: those new or changed since the last run that consumed its inputs.

A file's fingerprint is its path, size, ``mtime_ns`` and sha256. Deciding "unchanged" from size and
mtime alone (the stat cache git's index and rsync's quick check use) costs one ``stat`` per file; the
content is hashed only when those differ from the baseline, i.e. only for a file the run is about to read
anyway, so hashing adds one read of new data and never a read of the old corpus. The hash then tells a
touched or re-copied file whose bytes are the same (``touch``, ``cp``, a re-sync) from a changed one: the
former is not read again.

Racy files: a file written in the same instant as its fingerprint could change again without its size or
mtime moving (git's "racy git" problem, Documentation/technical/racy-git.txt). A fingerprint taken less
than :data:`RACY_WINDOW_NS` after the file's mtime is marked ``racy`` and the next run hashes that file
whatever its stat says.

Files a folder input does not read (:func:`pipeline.readers.paths.detect_format`: ``b.jsonl.next`` while it
is being copied, a binary) are not fingerprinted, so a staging file coming and going starts no run; once
renamed to ``b.jsonl`` it is a new file. They are counted as ``skipped`` in the run's scan summary.

Deleted files are simply absent from the next snapshot: a version, once published, is never retracted.

The baseline lives in the schedule's run history, so a schedule deleted and created again on its folder
starts from none: its first run fingerprints and reads every file, and dedup against the versions it
adopted (:mod:`service.schedules.versions`) drops what they published.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.readers.paths import detect_format, expand_path, named_by
from pipeline.spec import InputSpec

#: mtime this close to the fingerprint's own time cannot be trusted by the next run. Two seconds covers the
#: coarsest mtime granularity in use (FAT's 2 s; ext4 and XFS tick with the kernel's coarse clock, ms)
RACY_WINDOW_NS = 2_000_000_000
_CHUNK = 1 << 20


@dataclass
class Scan:
    """A snapshot of every input file, and which of them the run must read."""

    #: ``{path: {size, mtime_ns, sha256, racy}}``: stored with the run, the baseline of the next one
    snapshot: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``(input index, path)`` of files not in the baseline, in input then path order
    new: list[tuple[int, str]] = field(default_factory=list)
    #: ``(input index, path)`` of files whose content differs from the baseline's
    changed: list[tuple[int, str]] = field(default_factory=list)
    unchanged: int = 0
    #: files in the inputs' folders whose format is not one a folder is read by (``unknown_format``)
    skipped: int = 0

    @property
    def to_read(self) -> list[tuple[int, str]]:
        return sorted(self.new + self.changed)

    def summary(self) -> dict[str, Any]:
        return {"new": [p for _, p in self.new], "changed": [p for _, p in self.changed], "unchanged": self.unchanged,
                "skipped": self.skipped}


def sha256_of(path: str) -> str | None:
    """The file's sha256, or None when it cannot be read (the job will count it as ``unreadable_file``)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(_CHUNK):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def scan(inputs: list[InputSpec], baseline: dict[str, dict[str, Any]]) -> Scan:
    """Fingerprint every file the inputs name now, against ``baseline`` (the last consuming run's snapshot)."""
    out = Scan()
    now_ns = time.time_ns()
    for i, inp in enumerate(inputs):
        for path in expand_path(inp.path):
            if path in out.snapshot:  # two inputs naming one file: read once, under the first
                continue
            if detect_format(path, inp.format, named_by(inp.path, path)) == "unknown":
                out.skipped += 1  # a staging file or a binary beside the data: not an input of any run
                continue
            old = baseline.get(path)
            try:
                st = os.stat(path)
            except OSError:  # gone since it was listed, or unreadable: the job reports it
                out.snapshot[path] = {"size": -1, "mtime_ns": -1, "sha256": None, "racy": True}
                (out.new if old is None else out.changed).append((i, path))
                continue
            same_stat = (old is not None and not old.get("racy") and old.get("sha256")
                         and (old["size"], old["mtime_ns"]) == (st.st_size, st.st_mtime_ns))
            if same_stat and old is not None:
                out.snapshot[path] = dict(old, racy=now_ns - st.st_mtime_ns < RACY_WINDOW_NS)
                out.unchanged += 1
                continue
            digest = sha256_of(path)
            out.snapshot[path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest,
                                  "racy": now_ns - st.st_mtime_ns < RACY_WINDOW_NS}
            if old is None:
                out.new.append((i, path))
            elif digest is None or digest != old.get("sha256"):
                out.changed.append((i, path))
            else:
                out.unchanged += 1  # touched, same bytes
    return out
