"""Documents: the dict a stage sees, the Arrow schema between Ray tasks, and a dropped document.

A document is a plain dict (:class:`Document`, a TypedDict: dicts are what Arrow's ``to_pylist`` gives and
what a stage edits in place) with ``id`` (str), ``text`` (str), ``source`` (str, the path below its input),
``ord`` (int64: its position in the input, ``file_index << 40 | record_index``, used to restore a
deterministic order after any shuffle), ``meta`` (a dict in Python, a JSON string in Arrow and as a reader
yields it: :class:`ReaderDocument`) and ``segments`` (SFT prompt/response spans, JSON, or empty). Readers,
stages and the job engine all import this module; it imports nothing from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import regex


class _DocumentFields(TypedDict):
    id: str
    text: str
    #: the file's path below its input
    source: str
    #: ``file_index << 40 | record_index``: the order restored after a shuffle
    ord: int
    #: SFT prompt/response spans as JSON; None (from a reader) or "" (from Arrow) when there are none
    segments: str | None


class Document(_DocumentFields):
    """A document as a stage receives and returns it: ``meta`` parsed, annotations go there."""

    meta: dict[str, Any]


class ReaderDocument(_DocumentFields):
    """A document as a reader yields it: ``meta`` still its JSON (:func:`dump_meta`), parsed once per batch
    (:func:`parse_meta`) only when batch stages follow, else written to Arrow as it is."""

    meta: str


#: the short name the stages' signatures use
Doc = Document


@dataclass
class Drop:
    """A document taken out of the stream, why, and optional detail (e.g. the id it duplicates)."""

    doc: Document | ReaderDocument
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


DOC_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.large_string()),
        ("source", pa.string()),
        ("ord", pa.int64()),
        ("meta", pa.string()),
        ("segments", pa.large_string()),
    ]
)
DOC_FIELDS = DOC_SCHEMA.names


#: meta's JSON: sorted keys, compact, UTF-8; dates and other values JSON has no type for as ``str(value)``
_META_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def dump_meta(value: Any) -> str:
    """One value (or the whole meta) as meta's JSON (raises TypeError for what JSON cannot hold): the one
    serializer of ``meta``, for the readers and for the documents stages hand back."""
    return orjson.dumps(value, default=str, option=_META_OPTS).decode()


def docs_to_table(docs: Sequence[Document | ReaderDocument]) -> pa.Table:
    """Documents as a DOC_SCHEMA table (a ``meta`` dict as :func:`dump_meta` writes it).

    Column by column rather than ``Table.from_pylist`` of row dicts, which reads every field of every row
    through a dict: this runs on every batch.
    """
    def meta(m: Any) -> str:
        if m is None:
            return "{}"
        return m if isinstance(m, str) else dump_meta(m)

    return pa.Table.from_arrays([
        pa.array([d.get("id") for d in docs], pa.string()),
        pa.array([d.get("text") for d in docs], pa.large_string()),
        pa.array([d.get("source") for d in docs], pa.string()),
        pa.array([d.get("ord") for d in docs], pa.int64()),
        pa.array([meta(d.get("meta")) for d in docs], pa.string()),
        pa.array([d.get("segments") or "" for d in docs], pa.large_string()),
    ], schema=DOC_SCHEMA)


def table_to_docs(table: pa.Table) -> list[Document]:
    """Rows as dicts, ``meta`` parsed into a dict so stages can read and add annotations."""
    return parse_meta(table.select(DOC_FIELDS).to_pylist())


def parse_meta(docs: list[ReaderDocument]) -> list[Document]:
    """Each document's ``meta`` JSON string as a dict, in place: what stages read and annotate."""
    rows = cast(list[dict[str, Any]], docs)  # the same dicts: each becomes a Document here
    for d in rows:
        d["meta"] = orjson.loads(d["meta"]) if d["meta"] else {}
    return cast(list[Document], rows)


def docs_bytes(docs: Sequence[Document | ReaderDocument]) -> int:
    """UTF-8 bytes of the documents' texts (:func:`text_bytes` for documents not in a table)."""
    return sum(len(d["text"].encode("utf-8")) for d in docs)


def text_bytes(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 0
    return int(pc.sum(pc.binary_length(table.column("text").cast(pa.large_binary()))).as_py() or 0)


#: whitespace and default-ignorable code points (zero-width space/joiners, word joiner, BOM, soft hyphen,
#: bidi marks, variation selectors, tags...): a text of only these shows nothing, so it is empty
_BLANK = regex.compile(r"[\s\p{Default_Ignorable_Code_Point}]*")


def is_blank(text: str) -> bool:
    """True for a text with nothing visible: the empty check of every reader and of ``normalize``."""
    return _BLANK.fullmatch(text) is not None


#: the fields of a record in ``rejected/``, the same for every stage (readers included)
REJECT_FIELDS = ("id", "source", "ord", "stage", "reason", "kept_id", "detail", "text")


def reject_row(
    doc: Mapping[str, Any], reason: str, detail: dict[str, Any] | None = None, stage: str | None = None
) -> dict[str, Any]:
    """A dropped document as written to ``rejected/``: one schema whatever the stage, so tools can read
    every stage's rejects alike. ``kept_id`` (the id of the document kept in its place, for duplicates;
    else None) is taken out of ``detail``; ``detail`` holds the rest (error, url, ...). ``stage`` is
    filled in by the recorder. Applying it to its own output gives the same row.
    """
    rest = dict(detail) if isinstance(detail, dict) else ({} if detail is None else {"value": detail})
    kept_id = rest.pop("kept_id", doc.get("kept_id"))
    return {
        "id": doc.get("id"),
        "source": doc.get("source"),
        "ord": doc.get("ord"),
        "stage": stage if stage is not None else doc.get("stage"),
        "reason": reason,
        "kept_id": kept_id,
        "detail": rest,
        "text": doc.get("text"),
    }
