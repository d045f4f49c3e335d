"""A schedule's output folder, versioned, and the job spec of one refresh run.

Layout of ``OUT`` (the schedule spec's ``output.path``)::

    OUT/v000001/   version 1: a whole tokenmill output (manifest.json, tokenizer.json, shards/, stats.json, index/)
    OUT/v000002/   version 2: only documents that no earlier version published
    OUT/latest     one line naming the newest published version's folder (``v000002``)

- A version folder is written by one job, published by that job's commit (its manifest last) and never
  written again: a later run writes a new folder, so a trainer reading version 1 keeps reading exactly
  version 1. A run that fails leaves its folder for inspection and its number is not reused (versions may
  skip a number; ``GET /v1/schedules/{id}/versions`` lists those that exist).
- ``latest`` is a plain file replaced atomically (written aside, then renamed), not a symlink: it reads
  the same through any copy tool, object store or HTTP server, and a reader opens it once, then reads the
  folder it names. Over the API, ``versions/latest`` answers with a redirect to the numbered version, which
  the trainer's loader follows once, for the manifest, and then pins (``training/data.py``).
- A schedule created on a folder that already holds versions (its schedule was deleted, whose history went
  with it) adopts them: each ``vNNNNNN`` that a job of this service published is recorded as the new
  schedule's version (same number, same job), so numbering, the dedup baseline and the tokenizer below all
  come from what is published there; a version no job of this service wrote, or one a job is still writing,
  makes creation a 409 naming it (:func:`service.store.repo.adopt_versions`). The deleted history's input
  fingerprints are gone, so the first run reads every input file again and its dedup stages drop what the
  adopted versions published.
- Every version shares the first version's tokenizer (later runs load ``v000001/tokenizer.json`` instead of
  training their own), so token ids mean the same in all versions and a trainer can mix them.
- Each run dedups its documents against every earlier published version: its ``exact_dedup`` and
  ``near_dedup`` stages get those folders in ``dedup_against`` (their ``index/``), so a document already
  published is dropped as ``exact_duplicate_of_published`` / ``near_duplicate_of_published``.
"""

from __future__ import annotations

import copy
import glob
import os
import re
from pathlib import Path
from typing import Any

from pipeline import storage
from pipeline.readers.paths import expand_path, source_name

LATEST = "latest"
_VERSION = re.compile(r"^v([0-9]{6})$")
#: stages that take ``dedup_against``: a schedule's spec needs one, or a refresh could republish documents
DEDUP_STAGES = ("exact_dedup", "near_dedup")


def version_name(number: int) -> str:
    return f"v{number:06d}"


def version_dir(out: str | os.PathLike[str], number: int) -> Path:
    return Path(out) / version_name(number)


def parse_number(name: str) -> int | None:
    """``v000002`` -> 2; anything else -> None."""
    m = _VERSION.match(name)
    return int(m.group(1)) if m else None


def on_disk(out: str | os.PathLike[str]) -> list[int]:
    """The numbers of the ``vNNNNNN`` names in ``out``, ascending (published or not)."""
    try:
        names = os.listdir(out)
    except OSError:
        return []
    return sorted(n for name in names if (n := parse_number(name)))


def highest_on_disk(out: str | os.PathLike[str]) -> int:
    """The highest ``vNNNNNN`` folder in ``out`` (0 when none): numbers a schedule that was deleted and made
    again, or a run the database forgot, are never handed out twice."""
    return max(on_disk(out), default=0)


def write_latest(out: str | os.PathLike[str], number: int) -> None:
    storage.write_bytes(str(Path(out) / LATEST), f"{version_name(number)}\n".encode())  # OSError naming it


def read_latest(out: str | os.PathLike[str]) -> int | None:
    try:
        text = (Path(out) / LATEST).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return parse_number(text)


def has_dedup_stage(spec: dict[str, Any]) -> bool:
    return any(st.get("type") in DEDUP_STAGES for st in spec.get("stages") or [])


def single_file_input(input_path: str, path: str) -> str:
    """An input path that names only ``path`` and gives its documents the ids the schedule's own input would
    (``sub/doc.jsonl:3``, not ``doc.jsonl:3``; see :func:`pipeline.readers.paths.source_name`).

    A glob or folder input names a file by its path below the input's fixed leading folder; a one-file glob
    with that same leading folder (its first part below turned into a one-character class: ``in/[s]ub/x``)
    keeps that name. Checked: if the pattern does not match exactly that file under the same name (a hidden
    file, an odd first character), the plain path is used.
    """
    root = input_path
    if glob.has_magic(root):
        while glob.has_magic(root):
            root = os.path.dirname(root)
    elif os.path.normpath(root) == os.path.normpath(path) or not os.path.isdir(root):
        return path
    rel = os.path.relpath(path, root)
    if rel.startswith(os.pardir):
        return path
    parts = rel.split(os.sep)
    first = glob.escape(parts[0])
    if not glob.has_magic(first):
        first = f"[{parts[0][0]}]" + glob.escape(parts[0][1:])
    pattern = os.path.join(root, first, *(glob.escape(p) for p in parts[1:]))
    try:
        ok = expand_path(pattern) == [path] and source_name(pattern, path) == source_name(input_path, path)
    except (OSError, ValueError):
        ok = False
    return pattern if ok else path


def first_tokenizer(version_paths: list[str]) -> str | None:
    """The tokenizer of the earliest version that has one (every later version loads it): its own, or with
    ``output.split_by`` a group's (the groups of one job share one tokenizer)."""
    for folder in version_paths:
        candidates = [Path(folder) / "tokenizer.json", *sorted(Path(folder).glob("*/tokenizer.json"))]
        for candidate in candidates:
            if candidate.is_file():
                return str(candidate)
    return None


def refresh_spec(template: dict[str, Any], files: list[tuple[int, str]], out: str, number: int,
                 earlier: list[str]) -> dict[str, Any]:
    """The job spec of run ``number``: the schedule's spec reading only ``files`` (``(input index, path)``),
    dedup'd against the ``earlier`` versions' folders (oldest first), written into ``OUT/vNNNNNN``, whose card
    compares it with them (``output.card_compare``)."""
    spec = copy.deepcopy(template)
    inputs = template["inputs"]
    spec["name"] = f"{template['name']}-{version_name(number)}"
    spec["inputs"] = [dict(inputs[i], path=single_file_input(inputs[i]["path"], path)) for i, path in files]
    for stage in spec.get("stages") or []:
        if stage.get("type") in DEDUP_STAGES and earlier:
            params = stage.setdefault("params", {})
            current = params.get("dedup_against")
            listed = [current] if isinstance(current, str) else list(current or [])
            params["dedup_against"] = listed + [p for p in earlier if p not in listed]
    tok = spec.get("tokenizer", {})
    if isinstance(tok, dict) and not tok.get("path"):
        shared = first_tokenizer(earlier)
        if shared is not None:
            spec["tokenizer"] = dict(tok, path=shared)
    # the version's dataset card compares it with the one before and plots every earlier version's size
    spec["output"] = dict(spec["output"], path=str(version_dir(out, number)), overwrite=False, card_compare=earlier)
    return spec
