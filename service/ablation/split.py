"""The common validation set: raw documents held out by a hash of their id before any variant runs.

Every variant reads ``OUT/raw/train.jsonl`` (the raw input less this set), so no filter decides what it is scored
on: a filter that drops hard documents cannot make its own validation easier. The split is a function of the ids
alone (the same on every run, machine and order): ``share`` keeps the ids whose hash falls below it, ``documents``
the N smallest hashes. ``by`` (a field of the raw records) also writes one file per value of it, so bits per byte
can be read per kind of text (clean prose against injected boilerplate, say).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pipeline.documents import Drop
from pipeline.readers import expand_inputs, read_file
from pipeline.spec import InputSpec
from service.ablation.plan import Layout
from service.ablation.spec import CommonValidation

_SCALE = float(1 << 64)


def id_hash(doc_id: str) -> float:
    """Where ``doc_id`` falls in [0, 1): the first 8 bytes of its SHA-256."""
    return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big") / _SCALE


@dataclass
class SplitCounts:
    train: int = 0
    validation: int = 0
    dropped: int = 0  #: records the reader could not use (no text, malformed)
    by: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"train": self.train, "validation": self.validation, "dropped": self.dropped, "by": self.by}


def raw_records(raw: InputSpec) -> Iterator[dict[str, Any]]:
    """Each usable document of the raw input as ``{id, text, **its other fields}``, in input order."""
    for file_index, spec, path in expand_inputs([raw]):
        for item in read_file(file_index, path, spec):
            if isinstance(item, Drop):
                continue
            yield {**json.loads(item["meta"] or "{}"), "id": item["id"], "text": item["text"]}


def input_files(raw: InputSpec) -> list[tuple[str, int, int]]:
    """Each file of the raw input with its size and modification time: a changed file makes a new split."""
    out = []
    for _, _, path in expand_inputs([raw]):
        try:
            st = os.stat(path)
        except OSError:  # an object store's file, or one gone: the reader says so
            out.append((path, -1, -1))
        else:
            out.append((path, st.st_size, st.st_mtime_ns))
    return out


def held_out_ids(raw: InputSpec, rule: CommonValidation) -> set[str] | None:
    """The ids of a ``documents: N`` split (the N smallest hashes); None for a ``share`` (decided per document)."""
    if rule.documents is None:
        return None
    hashes = sorted((id_hash(r["id"]), r["id"]) for r in raw_records(raw))
    return {doc_id for _, doc_id in hashes[: rule.documents]}


def split_raw(raw: InputSpec, rule: CommonValidation, layout: Layout) -> SplitCounts:
    """Write the variants' input and the common validation set (and its parts by ``rule.by``); each file is
    written beside and renamed into place, so an interrupted split leaves none half written."""
    chosen = held_out_ids(raw, rule)
    counts = SplitCounts()
    layout.raw.parent.mkdir(parents=True, exist_ok=True)
    parts: dict[str, TextIO] = {}
    tmp_train, tmp_common = _tmp(layout.raw), _tmp(layout.common)
    with open(tmp_train, "w") as train, open(tmp_common, "w") as common:
        for record in raw_records(raw):
            held = record["id"] in chosen if chosen is not None else id_hash(record["id"]) < (rule.share or 0.0)
            line = json.dumps(record, ensure_ascii=False) + "\n"
            if not held:
                train.write(line)
                counts.train += 1
                continue
            common.write(line)
            counts.validation += 1
            if rule.by is not None:
                value = _part_name(record.get(rule.by))
                counts.by[value] = counts.by.get(value, 0) + 1
                if value not in parts:
                    layout.common_part(value).parent.mkdir(parents=True, exist_ok=True)
                    parts[value] = open(_tmp(layout.common_part(value)), "w")  # noqa: SIM115 - closed below
                parts[value].write(json.dumps({"id": record["id"], "text": record["text"]}, ensure_ascii=False)
                                   + "\n")
    for value, fh in parts.items():
        fh.close()
        os.replace(_tmp(layout.common_part(value)), layout.common_part(value))
    os.replace(tmp_common, layout.common)
    os.replace(tmp_train, layout.raw)
    return counts


def _part_name(value: Any) -> str:
    text = "none" if value is None else str(value)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:64] or "none"


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")
