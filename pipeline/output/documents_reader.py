"""A tokenmill ``documents`` output read back as input: ids, text, ``meta`` and SFT segments as they were.

The plain JSONL/Parquet readers put a record's other fields into ``meta`` (capped at 4 KB a field), which
would bury an earlier job's annotations under ``meta["meta"]`` or cut them. This format takes the ``meta``
object whole, so a second job can filter on the verdicts a first one stored (``stored_filters``) without
recomputing them. Parts are Parquet (``meta`` a struct, or JSON text in older outputs and the fallback) or JSONL
by their file name; the index beside them is skipped; ``source`` and ``ord`` are the new job's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import storage
from pipeline.documents import Drop, ReaderDocument
from pipeline.output.documents_meta import LEGACY_INDEX_NAME, MetaRules, decode_meta
from pipeline.readers.docs import drop
from pipeline.readers.jsonl import read_jsonl, record_doc
from pipeline.readers.parquet import read_parquet
from pipeline.spec import InputSpec


def read_documents(file_index: int, path: str, name: str, spec: InputSpec) -> Iterator[ReaderDocument | Drop]:
    """A part's documents; an older output's index inside the folder (``index.json``) is no part."""
    if path.rsplit("/", 1)[-1] == LEGACY_INDEX_NAME:
        return iter(())
    if path.endswith(".parquet"):
        return read_parquet(file_index, path, name, spec, to_doc=partial(documents_doc, rules=_part_rules(path)))
    return read_jsonl(file_index, path, name, spec, to_doc=documents_doc)


def _part_rules(path: str) -> MetaRules:
    """How a part's struct ``meta`` decodes (its schema metadata); an unreadable file is read_parquet's to report."""
    try:
        with storage.open_input(path) as f:
            return MetaRules.from_metadata(pq.read_schema(f).metadata)
    except (OSError, pa.ArrowException):
        return MetaRules()


def documents_doc(
    file_index: int, name: str, spec: InputSpec, record_index: int, raw: bytes | str, record: dict[str, Any],
    rules: MetaRules | None = None,
) -> ReaderDocument | Drop:
    """As :func:`record_doc`, with ``meta`` and ``segments`` taken from the record instead of built (a struct
    ``meta`` decoded back to its dict by the part's ``rules``)."""
    item = record_doc(file_index, name, spec, record_index, raw, record)
    if isinstance(item, Drop):
        return item
    value = record.get("meta", {})
    meta = decode_meta(value, rules) if isinstance(value, dict) and rules is not None else _json_value(value)
    if not isinstance(meta, dict):
        return drop(name, file_index, record_index, "bad_record:meta", raw, item["id"],
                    error="a documents record's meta must be an object")
    segments = record.get("segments")
    item["meta"] = json.dumps(meta, sort_keys=True, ensure_ascii=True)
    item["segments"] = segments if segments is None or isinstance(segments, str) else json.dumps(segments)
    return item


def _json_value(value: Any) -> Any:
    """A field stored as JSON text (Parquet) or as an object (JSONL) -> the object; None when unparseable."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value else {}
        except ValueError:
            return None
    return {} if value is None else value
