"""Building documents and drops the same way in every reader: ids, ords, meta, raw text of bad records."""

from __future__ import annotations

import json
from typing import Any

from pipeline.documents import Drop, ReaderDocument, dump_meta
from pipeline.error_line import error_line

#: a dropped record keeps at most this much of its raw bytes (enough to see what went wrong)
MAX_RAW_BYTES = 10 * 1024
#: meta is for small fields (url, title, labels); bigger ones (html, embeddings) would bloat every stage
MAX_META_FIELD_BYTES = 4 * 1024
RECORD_BITS = 40


def make_ord(file_index: int, record_index: int) -> int:
    """The deterministic order key: ``file_index << 40 | record_index``."""
    return (file_index << RECORD_BITS) | record_index


def default_id(name: str, record_index: int) -> str:
    """``name:record_index``; ``name`` is the file's path relative to its input (:func:`paths.source_name`)."""
    return f"{name}:{record_index}"


def record_id(record: dict[str, Any], id_field: str, name: str, record_index: int) -> str:
    """The record's own id when it is a str or int (not a bool), else ``name:record_index``."""
    value = record.get(id_field)
    if isinstance(value, str) and value and encodable(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return default_id(name, record_index)


def encodable(text: str) -> bool:
    """False for strings with lone surrogates (from JSON ``\\ud800`` escapes): Arrow cannot store them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def meta_json(record: dict[str, Any], exclude: tuple[str, ...] | set[str]) -> str:
    """JSON of the record's other fields (:func:`dump_meta`), without fields over 4 KB.

    orjson rather than json: this runs once per document and was a tenth of a reader's time.
    """
    rest = {k: v for k, v in record.items() if k not in exclude}
    try:
        whole = dump_meta(rest)
    except (TypeError, ValueError):  # non-str keys from Parquet maps, ints over 64 bits, circular structures
        whole = None
    if whole is not None and len(whole) <= MAX_META_FIELD_BYTES:
        return whole  # the common case: small enough that no single field can be too big
    parts = []
    for key in sorted(rest, key=str):
        try:
            value = dump_meta(rest[key])
        except (TypeError, ValueError):
            try:  # e.g. an int over 64 bits: json writes it
                value = json.dumps(rest[key], default=str, sort_keys=True, ensure_ascii=False)
            except (TypeError, ValueError):
                continue
        if len(value) <= MAX_META_FIELD_BYTES:
            parts.append(f"{dump_meta(str(key))}:{value}")
    return "{" + ",".join(parts) + "}"


def raw_text(raw: bytes | str) -> str:
    """A bad record's raw content for the rejected/ output: at most 10 KB, decoded leniently."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    return raw[:MAX_RAW_BYTES].decode("utf-8", "replace")


def make_doc(
    doc_id: str, text: str, source: str, ord_: int, meta: str = "{}", segments: str | None = None
) -> ReaderDocument:
    return {"id": doc_id, "text": text, "source": source, "ord": ord_, "meta": meta, "segments": segments}


def drop(
    name: str,
    file_index: int,
    record_index: int,
    reason: str,
    raw: bytes | str = b"",
    doc_id: str | None = None,
    **detail: Any,
) -> Drop:
    """A Drop whose doc carries id (``doc_id``, else ``name:record_index``), source (``name``, the path
    below the input, as for documents), ord and the raw (truncated) record text."""
    doc = make_doc(
        doc_id or default_id(name, record_index),
        raw_text(raw),
        name,
        make_ord(file_index, record_index),
    )
    return Drop(doc, reason, {k: v for k, v in detail.items() if v is not None})


def error_text(exc: BaseException) -> str:
    """One short line describing an exception, for a Drop's detail."""
    return error_line(exc)[:300]
