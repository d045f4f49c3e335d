"""No local path of the machine that ran a job in its card or ``card/spec.yaml``: they are published, pushed to the
Hub, copied; a home folder's name says who ran it and a path means nothing on another machine.

Every string of the spec's JSON data that is an absolute local path (``/...``, ``~...``, ``file://...``,
``C:\\...``) is rewritten, whichever field holds it (inputs, tokenizer, stage parameters such as ``benchmarks``,
``dedup_against`` or a model, those of a stage added later): relative to the deepest folder all of them share (the
project folder a spec usually lies in: ``data/raw/*.jsonl``, ``bench/arith.jsonl.gz``) when that folder is at least
:data:`MIN_SHARED` levels deep (``/home/me``: a path relative to ``/home`` would name someone's folder), else as its
file name (or pattern) alone; each with a fingerprint (a file's sha256; an input's, a folder's or a pattern's over
its files' names and sizes, as ``stats.json``'s inputs have it). Where the output lies plays no part: the same spec
and data give the same card in any folder.

URIs (``s3://``, ``hf://``...) stay as they are: they name no local folder. What was rewritten is kept in
``card/redacted.json`` (field, what it is now, fingerprint; never what it was), so a rebuilt card lists it too.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

REDACTED = "redacted.json"
#: folders a path must share with the output (counting ``/``) to be written relative to it
MIN_SHARED = 3
#: hex digits of a fingerprint shown
FINGERPRINT = 16
_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")


def is_local_absolute(value: str) -> bool:
    """A path of the machine itself: absolute, home-relative or ``file://`` (no other URI)."""
    if value.startswith("file://"):
        return True
    if _URI.match(value):
        return False
    return value.startswith(("/", "~")) or bool(_WINDOWS.match(value))


def _local(value: str) -> str:
    return os.path.expanduser(value.removeprefix("file://"))


def fingerprint(path: str) -> str | None:
    """A file's sha256; a folder's or pattern's over each file's name (below it) and size; None when nothing is
    there (the card is made where the job ran: a path of another machine has none)."""
    path = _local(path)
    if os.path.isfile(path):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    base = path if os.path.isdir(path) else os.path.dirname(path)
    found = sorted(glob.glob(os.path.join(path, "**") if os.path.isdir(path) else path, recursive=True))
    files = [p for p in found if os.path.isfile(p)]
    if not files:
        return None
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{os.path.relpath(p, base)}\t{os.path.getsize(p)}\n".encode())
    return digest.hexdigest()


def local_paths(data: Any) -> list[str]:
    """Every absolute local path in JSON ``data``."""
    if isinstance(data, str):
        return [data] if is_local_absolute(data) else []
    values = data.values() if isinstance(data, dict) else data if isinstance(data, list) else []
    return [p for v in values for p in local_paths(v)]


def shared_root(paths: list[str]) -> str | None:
    """The deepest folder holding every one of ``paths`` (a pattern's folder part included), when it is at least
    :data:`MIN_SHARED` levels deep."""
    folders = [os.path.dirname(os.path.normpath(_local(p))) for p in paths]
    try:
        root = os.path.commonpath(folders) if folders else None
    except ValueError:  # another drive
        return None
    return root if root is not None and len(PurePosixPath(root).parts) >= MIN_SHARED else None


@dataclass
class Redactor:
    """Rewrites the local paths of one output's card: relative to ``root`` (:func:`shared_root`; None: each by its
    name); ``known``: fingerprints already recorded (an input's ``sha256`` from ``stats.json``), by path."""

    root: str | None
    known: dict[str, str] = field(default_factory=dict)
    #: what was rewritten: ``{"field", "now", "sha256"?}``, one per field, in the order met
    found: list[dict[str, str]] = field(default_factory=list)

    def path(self, value: str, where: str) -> str:
        """``value`` as the card shows it; ``where`` names its field for :attr:`found`."""
        if not is_local_absolute(value):
            return value
        path = os.path.normpath(_local(value))
        now = os.path.relpath(path, self.root) if self.root else PurePosixPath(path.replace("\\", "/")).name or "."
        sha = self.known.get(value) or fingerprint(value)
        entry = {"field": where, "now": now} | ({"sha256": sha[:FINGERPRINT]} if sha else {})
        if all(e["field"] != where for e in self.found):
            self.found.append(entry)
        return now

    def spec(self, data: Any, loc: str = "") -> Any:
        """A copy of a spec's JSON ``data`` with every local path rewritten (:meth:`path`)."""
        if isinstance(data, str):
            return self.path(data, loc)
        if isinstance(data, dict):
            return {k: self.spec(v, f"{loc}.{k}" if loc else str(k)) for k, v in data.items()}
        if isinstance(data, list):
            return [self.spec(v, f"{loc}[{i}]") for i, v in enumerate(data)]
        return data


def merge(earlier: list[dict[str, str]], now: list[dict[str, str]]) -> list[dict[str, str]]:
    """The fields rewritten before (a spec already published without its paths) and now, one entry per field."""
    fields = {e["field"] for e in now}
    return [e for e in earlier if e.get("field") not in fields] + now
