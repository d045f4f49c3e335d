"""Documents as Arrow tables: one fixed schema between every stage of the Ray pipeline."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

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


def docs_to_table(docs: list[dict[str, Any]]) -> pa.Table:
    rows = [{k: d.get(k) for k in DOC_FIELDS} for d in docs]
    for r in rows:
        if r["meta"] is None:
            r["meta"] = "{}"
        if r["segments"] is None:
            r["segments"] = ""
    return pa.Table.from_pylist(rows, schema=DOC_SCHEMA)


def table_to_docs(table: pa.Table) -> list[dict[str, Any]]:
    return table.select(DOC_FIELDS).to_pylist()


def text_bytes(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 0
    return int(pc.sum(pc.binary_length(table.column("text").cast(pa.large_binary()))).as_py() or 0)


def reject_row(doc: dict[str, Any], reason: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": doc.get("id"),
        "source": doc.get("source"),
        "ord": doc.get("ord"),
        "reason": reason,
        "detail": detail or {},
        "text": doc.get("text"),
    }
