"""What a failed or cancelled job leaves in its output folder: what a rerun reuses, and nothing else.

A rerun of the same spec reuses the records of the finished phases (``work/state.json``), the curated
parts of a finished curate phase, the packed ranges (``ranges.jsonl`` and ``ranges/``) and the shards
whose files match their recorded size and sha256 (``shards.jsonl`` and ``stage/``). It never reuses the
work of an unfinished curate phase (curated parts, groups, ``rejected/``, dedup indexes: the phase starts
over from empty folders) nor a temporary file (a write cut short by a full disk or a stopped worker), so
a failure removes those: a job that ran out of disk gives back the space of the work it cannot resume.
"""

from __future__ import annotations

import contextlib
import os

from pipeline import storage
from pipeline.job.state import WorkState


def drop(out: str, work: str, stage: str, state: WorkState) -> None:
    """Remove from the output ``out`` what a rerun of ``state``'s spec would not reuse (best effort: never
    raises: the failure being reported matters more)."""
    with contextlib.suppress(OSError):
        if state.done("curate") is None:
            for folder in (storage.join(work, "curated"), storage.join(work, "groups"),
                           storage.join(stage, "rejected"), storage.join(stage, "index"),
                           storage.join(work, "all"), storage.join(work, "validation-keys")):  # output.validation
                storage.rmtree(folder)
        if not storage.is_remote(out):  # an object store keeps no half-written object (an upload is aborted)
            for path in temp_files(storage.local_path(out)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def temp_files(folder: str) -> list[str]:
    """Every temporary file (:func:`pipeline.storage.is_temp_name`) below a local ``folder``."""
    return [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
            if storage.is_temp_name(name)]
