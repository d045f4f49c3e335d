"""The languages of the documents an output holds: what the card's ``language:`` lists.

Not the ``lid`` stage's counts, which include every document it saw (the ones a language filter dropped too):
the kept documents' ``meta.lang``, exact. A job that tokenized has them in ``stats.json``'s ``profile``
(:mod:`pipeline.card.profile`, every packed document); one that only curated has them in ``documents/``,
read here (Parquet: the ``meta`` column alone). None when neither is there: the card then lists no language.
"""

from __future__ import annotations

import io
import json
from typing import Any

from pipeline import storage
from pipeline.card.profile import MAX_LANGUAGES


def kept_languages(folder: str, stats: dict[str, Any], documents: dict[str, Any] | None) -> list[str] | None:
    """The sorted ``meta.lang`` values of the kept documents in the output in ``folder``."""
    langs = ((stats.get("profile") or {}).get("languages") or None)
    if langs is not None and len(langs) < MAX_LANGUAGES:  # at the cap the rest were summed as ``other``
        return sorted(code for code, row in langs.items() if int(row.get("docs", 0)) > 0)
    if documents is None:
        return None
    root = storage.join(folder, "documents")
    found: set[str] = set()
    for path in sorted(storage.list_files(root)) if storage.exists(root) else []:
        data = storage.read_bytes(path)
        metas = _parquet_meta(data) if path.endswith(".parquet") else _jsonl_meta(data)
        found.update(v for v in (_lang(m) for m in metas) if v)
    return sorted(found)


def _lang(meta: Any) -> str | None:
    if isinstance(meta, str):  # Parquet meta stored as JSON text (pipeline.output.documents_meta)
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    value = meta.get("lang") if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None


def _parquet_meta(data: bytes) -> list[Any]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    meta = pq.read_table(io.BytesIO(data), columns=["meta"]).column("meta")
    if not pa.types.is_struct(meta.type):
        return meta.to_pylist()
    if meta.type.get_field_index("lang") < 0:
        return []
    return [{"lang": v} for v in pc.unique(pc.struct_field(meta, "lang")).to_pylist()]


def _jsonl_meta(data: bytes) -> list[Any]:
    out = []
    for line in data.splitlines():
        try:
            out.append(json.loads(line).get("meta"))
        except (ValueError, AttributeError):
            continue
    return out
