"""What an output holds and the records tokenmill keeps about it, checked: pure logic, no I/O.

The published names (:data:`PUBLISHED`, a group's :data:`GROUP_FILES`/:data:`GROUP_FOLDERS`), tokenmill's
private area (:data:`PRIVATE`), the marker and commit-journal records (:class:`Marker`, :class:`Journal`)
and the one error an output raises (:class:`OutputError`). A record read back from an output may be
damaged or hostile: :func:`parse_marker` and :func:`parse_journal` accept only published relative paths,
so no marker or journal can make a commit touch anything outside the layout.
"""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Literal, NotRequired, TypedDict

#: ``README.md``: the dataset card (pipeline/card); ``CARD.md``: where an older output has it, still a published
#: name so its marker reads and the next commit or ``tokenmill card`` replaces it
PUBLISHED_FILES = ("manifest.json", "stats.json", "tokenizer.json", "documents.json", "README.md", "CARD.md")
#: ``card/``: the dataset card's figures and the spec it names (pipeline/card)
PUBLISHED_FOLDERS = ("shards", "rejected", "index", "documents", "card")
PUBLISHED = PUBLISHED_FILES + PUBLISHED_FOLDERS
#: ``output.split_by``: one shard set per group in ``OUT/<group>/`` (pipeline/output/groups.py); ``output.validation``
#: is one too, in ``OUT/validation/``, with its documents' text (pipeline/output/validation.py)
GROUP_FILES = ("manifest.json", "tokenizer.json", "documents.jsonl")
GROUP_FOLDERS = ("shards",)
_GROUP = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
PRIVATE = ".tokenmill"
MARKER_FORMAT = 1
#: the largest marker or journal read back (a marker lists every published file)
MAX_RECORD_BYTES = 64 << 20
#: an :class:`OutputError`'s category: the user can fix it (``validation``), or the machine failed (``infra``)
Category = Literal["validation", "infra"]


class OutputError(RuntimeError):
    """The output folder cannot be used or written: one line naming ``output.path`` (or the file) and why.

    ``category`` is ``validation`` (the folder is not usable as given) or ``infra`` (the machine failed:
    a write or a lock that the operating system refused)."""

    def __init__(self, message: str, category: Category = "validation") -> None:
        super().__init__(message)
        self.category = category


class EarlierOutput(OutputError):
    """The output holds an earlier run's published files and ``overwrite`` is not set (the fix is that flag,
    not another folder): told apart so the service can answer it as such."""


class BadRecord(ValueError):
    """A marker or journal that does not parse; the reason goes into an :class:`OutputError`."""


class Marker(TypedDict):
    """``.tokenmill/marker.json``: tokenmill owns the output; ``files`` is what the last commit published;
    ``owner``, when a service's job wrote it, the team whose job first wrote it (no other team's job may write
    into it: :meth:`pipeline.output.store.StoreBase.claim`)."""

    tool: str
    format: int
    created: str
    files: list[str]
    owner: NotRequired[str]


class Journal(TypedDict):
    """``.tokenmill/commit.json``: a commit in progress, of the stage ``stage`` (relative to the output),
    publishing ``new`` in place of ``old``; ``created`` is the marker's."""

    stage: str
    new: list[str]
    old: list[str]
    created: str


def os_error_category(exc: OSError) -> Category:
    """``validation`` for a path the user can fix (not a folder, no permission, read-only), else ``infra``
    (disk full, I/O error: the machine)."""
    return "validation" if exc.errno in (errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR,
                                         errno.ENOENT) else "infra"


def describe_os_error(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """``cannot write PATH: REASON`` on one line, for any OSError while writing (e.g. a full disk)."""
    where = os.fspath(path) if path is not None else (exc.filename2 or exc.filename or "?")  # a rename's target
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot write {where}: {reason}".replace("\n", " ").replace("\r", " ")


def is_manifest(rel: str) -> bool:
    """The shard set's ``manifest.json`` or a group's (``de/manifest.json``): out first, in last."""
    return rel == "manifest.json" or (rel.count("/") == 1 and rel.endswith("/manifest.json"))


def check_rel(rel: object) -> str:
    """A published relative path (``shards/x.tar``, ``stats.json``): never absolute, never ``..``, never
    outside the layout, so a damaged marker or journal cannot make a commit touch anything else."""
    if not isinstance(rel, str) or not rel:
        raise BadRecord(f"{rel!r} is not a relative path")
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in rel or "\0" in rel:
        raise BadRecord(f"{rel!r} is not a plain relative path")
    if not (_in_layout(parts) or (_GROUP.fullmatch(parts[0]) and parts[0] not in PUBLISHED
                                  and _in_layout(parts[1:], GROUP_FILES, GROUP_FOLDERS))):
        raise BadRecord(f"{rel!r} is not a published name (files {', '.join(PUBLISHED_FILES)}; "
                        f"folders {', '.join(PUBLISHED_FOLDERS)}; a group's {', '.join(GROUP_FILES)}, shards/)")
    return rel


def _in_layout(parts: list[str], files: tuple[str, ...] = PUBLISHED_FILES,
               folders: tuple[str, ...] = PUBLISHED_FOLDERS) -> bool:
    return bool(parts) and ((parts[0] in files and len(parts) == 1) or (parts[0] in folders and len(parts) > 1))


def check_rel_list(value: object, what: str) -> list[str]:
    """A list of distinct published relative paths (:func:`check_rel`)."""
    if not isinstance(value, list):
        raise BadRecord(f"{what} is not a list")
    rels = [check_rel(rel) for rel in value]
    if len(set(rels)) != len(rels):
        raise BadRecord(f"{what} repeats a name")
    return rels


def record_bytes(record: Marker | Journal) -> bytes:
    """How a marker or journal is stored: indented, sorted JSON and a newline."""
    return (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()


def parse_object(data: bytes) -> dict[str, object]:
    """The JSON object in ``data``; :class:`BadRecord` when it is none."""
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise BadRecord(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise BadRecord("not a JSON object")
    return obj


def new_marker(files: list[str], created: str, owner: str | None = None) -> Marker:
    marker: Marker = {"tool": "tokenmill", "format": MARKER_FORMAT, "created": created, "files": files}
    if owner is not None:
        marker["owner"] = owner
    return marker


def parse_marker(data: dict[str, object]) -> Marker:
    """A marker read back, checked (:class:`BadRecord` when damaged)."""
    if data.get("tool") != "tokenmill":
        raise BadRecord("tool is not tokenmill")
    if data.get("format") != MARKER_FORMAT:
        raise BadRecord(f"format {data.get('format')!r} is not {MARKER_FORMAT}")
    created = data.get("created")
    if not isinstance(created, str):
        raise BadRecord("created is not a time")
    owner = data.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise BadRecord("owner is not a name")
    return new_marker(check_rel_list(data.get("files"), "files"), created, owner)


def parse_journal(data: dict[str, object]) -> Journal:
    """A commit journal read back with its lists checked (:class:`BadRecord` when damaged): its stage must lie
    in ``.tokenmill/work``."""
    stage = data.get("stage")
    if not isinstance(stage, str) or not stage.startswith(f"{PRIVATE}/work/") or ".." in stage.split("/"):
        raise BadRecord("stage is not inside .tokenmill/work")
    created = data.get("created")
    if not isinstance(created, str):
        raise BadRecord("created is not a time")
    return {"stage": stage, "new": check_rel_list(data.get("new"), "new"),
            "old": check_rel_list(data.get("old"), "old"), "created": created}
