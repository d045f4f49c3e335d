"""Instruction and chat JSONL records rendered by :func:`pipeline.readers.templates.render` into loss-masked segments.

The document's text is the concatenation of the segments; ``segments`` keeps the split as JSON
``[[text, train], ...]`` so the tokenizer can put loss only on the response parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pipeline.documents import Drop, ReaderDocument
from pipeline.readers.docs import drop, encodable, make_doc, make_ord, meta_json, record_id
from pipeline.readers.jsonl import iter_records
from pipeline.readers.templates import RecordError, render
from pipeline.spec import InputSpec

#: the record fields a format consumes; the rest goes to meta
RENDERED_FIELDS = {"instruction": ("instruction", "input", "output"), "chat": ("messages",)}


def read_sft(file_index: int, path: str, name: str, spec: InputSpec, fmt: str) -> Iterator[ReaderDocument | Drop]:
    consumed = (*RENDERED_FIELDS[fmt], spec.id_field)
    for item in iter_records(file_index, path, name, spec.max_record_bytes):
        if isinstance(item, Drop):
            yield item
            continue
        record_index, raw, record = item
        doc_id = record_id(record, spec.id_field, name, record_index)
        try:
            segments = render(record, fmt, spec.template)
        except RecordError as exc:
            yield drop(name, file_index, record_index, f"bad_record:{exc}", raw, doc_id)
            continue
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:  # a template that cannot render
            yield drop(name, file_index, record_index, "bad_record:bad_template", raw, doc_id, error=str(exc))
            continue
        text = "".join(t for t, _ in segments)
        if not encodable(text):
            yield drop(name, file_index, record_index, "invalid_utf8", raw, doc_id, error="lone surrogate")
            continue
        yield make_doc(
            doc_id,
            text,
            name,
            make_ord(file_index, record_index),
            meta_json(record, consumed),
            json.dumps([[t, bool(train)] for t, train in segments], ensure_ascii=False),
        )
