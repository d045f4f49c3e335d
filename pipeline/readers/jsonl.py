"""JSON Lines (plain, gzip or zstandard), streamed line by line: one record per line.

The record index is the 0-based line number, so a document's ``ord`` points at its line; blank lines
count but yield nothing. A line over ``max_record_bytes`` is one ``record_too_large`` stub (its offset in the
decompressed file and its size; the id is the made-up ``name:index``: the line is never parsed), read past in
bounded memory (:mod:`pipeline.readers.bounded`). A cut or corrupt compressed file yields what was readable, then
one ``truncated_file`` drop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from pipeline.documents import Drop, ReaderDocument, is_blank
from pipeline.readers.bounded import TooLarge, lines, too_large
from pipeline.readers.compression import TruncatedInput, check_complete, open_binary
from pipeline.readers.docs import drop, encodable, error_text, make_doc, make_ord, meta_json, record_id
from pipeline.spec import DEFAULT_MAX_RECORD_BYTES, InputSpec

BOM = "\ufeff"


def iter_records(
    file_index: int, path: str, name: str, limit: int = DEFAULT_MAX_RECORD_BYTES
) -> Iterator[tuple[int, bytes, dict[str, Any]] | Drop]:
    """Yield ``(record_index, raw_line, record)`` for each JSON object, or a Drop for a bad line or one over
    ``limit`` bytes."""
    next_index = 0
    with open_binary(path) as fh:
        try:
            for line in lines(fh, limit):  # the last line is checked not to be cut short
                record_index, next_index = next_index, next_index + 1
                if isinstance(line, TooLarge):
                    yield too_large(name, file_index, record_index, limit, offset=line.offset, size=line.size)
                    continue
                line = line.rstrip(b"\r\n")
                if line.strip():
                    yield parse_line(file_index, name, record_index, line)
            check_complete(fh)
        except TruncatedInput as exc:
            yield drop(name, file_index, next_index, "truncated_file", error=str(exc))


def parse_line(
    file_index: int, name: str, record_index: int, line: bytes
) -> tuple[int, bytes, dict[str, Any]] | Drop:
    try:  # the fast path; anything orjson refuses (BOM, NaN, huge ints, lone surrogates...) is json's to judge
        record = orjson.loads(line)
        if isinstance(record, dict):
            return record_index, line, record
    except orjson.JSONDecodeError:
        pass
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return drop(name, file_index, record_index, "invalid_utf8", line, error=error_text(exc))
    if record_index == 0 and text.startswith(BOM):
        text = text[1:]
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, and e.g. an integer over 4300 digits
        return drop(name, file_index, record_index, "bad_json", line, error=error_text(exc))
    if not isinstance(record, dict):
        return drop(name, file_index, record_index, "not_an_object", line, type=type(record).__name__)
    return record_index, line, record


def record_doc(
    file_index: int, name: str, spec: InputSpec, record_index: int, raw: bytes | str,
    record: dict[str, Any],
) -> ReaderDocument | Drop:
    """A plain-text document from a parsed record (shared with the Parquet reader)."""
    doc_id = record_id(record, spec.id_field, name, record_index)
    text = record.get(spec.text_field)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return drop(name, file_index, record_index, "invalid_utf8", raw, doc_id, error=error_text(exc))
    if not isinstance(text, str):
        return drop(name, file_index, record_index, "missing_text", raw, doc_id, field=spec.text_field)
    if is_blank(text):
        return drop(name, file_index, record_index, "empty_text", raw, doc_id)
    if not encodable(text):
        return drop(name, file_index, record_index, "invalid_utf8", raw, doc_id, error="lone surrogate")
    meta = meta_json(record, (spec.text_field, spec.id_field))
    return make_doc(doc_id, text, name, make_ord(file_index, record_index), meta)


def read_jsonl(
    file_index: int, path: str, name: str, spec: InputSpec, to_doc: Callable[..., ReaderDocument | Drop] = record_doc
) -> Iterator[ReaderDocument | Drop]:
    for item in iter_records(file_index, path, name, spec.max_record_bytes):
        if isinstance(item, Drop):
            yield item
        else:
            yield to_doc(file_index, name, spec, *item)
