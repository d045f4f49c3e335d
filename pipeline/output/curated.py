"""Curated documents on disk: the curate phase's result, and the ``documents`` output.

The last curation step writes each batch it receives, on the worker that holds it, as one Parquet
part named by the batch's first ``ord`` (batches arrive in ``ord`` order, so name order is corpus
order whatever the parallelism). The driver only sees one small row per part. Later phases read
contiguous row ranges of the corpus (:func:`read_rows`) without loading whole parts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import storage
from pipeline.documents import DOC_FIELDS, text_bytes
from pipeline.output.documents_meta import MetaPlan, MetaProfile, encode_meta, parse_meta_json, profile_meta

#: rows per Parquet row group: what a range read can skip over
ROW_GROUP = 1024
PART_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("first_ord", pa.int64()),
                         ("bytes", pa.int64()), ("writer", pa.string())])


def worker_name() -> str:
    """``host:pid:node`` of the process running a task (the Ray node id's first 8 hex digits)."""
    node = "-"
    try:
        import ray  # lazy: the driver imports this module (for its records) before it needs Ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()[:8]
    except Exception:  # noqa: BLE001 - a name for reports only
        pass
    return f"{os.uname().nodename}:{os.getpid()}:{node}"


def write_part(table: pa.Table, folder: str) -> pa.Table:
    """Ray Data UDF: documents in, one Parquet part per batch written, one row describing it out."""
    if table.num_rows == 0:
        return PART_SCHEMA.empty_table()
    table = table.select(DOC_FIELDS)
    first = int(table.column("ord")[0].as_py())
    name = f"part-{first:020d}.parquet"
    write_parquet(table, storage.join(folder, name))
    return pa.table({"part": [name], "rows": [table.num_rows], "first_ord": [first],
                     "bytes": [text_bytes(table)], "writer": [worker_name()]}, schema=PART_SCHEMA)


def write_parquet(table: pa.Table, path: str) -> None:
    """One Parquet file, published whole (a temporary name renamed, or one upload) through the storage layer."""
    with storage.open_output(path) as f:
        # no dictionary or min/max statistics over the text (hashing and comparing every text was ~40% of the
        # write, and nothing looks them up); `ord` keeps its statistics
        pq.write_table(table, f, row_group_size=ROW_GROUP, use_dictionary=["source"], write_statistics=["ord"])


def parquet_file(path: str) -> pq.ParquetFile:
    return pq.ParquetFile(storage.open_input(path))


@dataclass(frozen=True)
class Part:
    """One curated Parquet part: its file name, rows, first ``ord``, text bytes and the worker that wrote it."""

    name: str
    rows: int
    first_ord: int
    bytes: int = 0
    writer: str = ""

    def to_json(self) -> dict[str, str | int]:
        """The row :func:`write_part` describes it with (and its line in the work folder's state)."""
        return {"part": self.name, "rows": self.rows, "first_ord": self.first_ord, "bytes": self.bytes,
                "writer": self.writer}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Part:
        return cls(str(row["part"]), int(row["rows"]), int(row["first_ord"]), int(row.get("bytes", 0)),
                   str(row.get("writer", "")))


def sorted_parts(parts: list[Part]) -> list[Part]:
    """Parts in corpus order (by first ``ord``): the order every range read counts rows in."""
    return sorted(parts, key=lambda p: p.first_ord)


def read_rows(folder: str, parts: list[Part], lo: int, hi: int, columns: list[str] | None = None) -> pa.Table:
    """Rows ``[lo, hi)`` of the corpus (global positions in ``ord`` order), reading only the row
    groups that hold them."""
    pieces = []
    start = 0
    for part in parts:
        end = start + part.rows
        if end > lo and start < hi:
            a, b = max(lo, start) - start, min(hi, end) - start
            f = parquet_file(storage.join(folder, part.name))
            groups: list[int] = []
            offset, first_group_start = 0, -1
            for g in range(f.num_row_groups):
                n = f.metadata.row_group(g).num_rows
                if offset + n > a and offset < b:
                    groups.append(g)
                    if first_group_start < 0:
                        first_group_start = offset
                offset += n
            t = f.read_row_groups(groups, columns=columns)
            pieces.append(t.slice(a - first_group_start, b - a))
        start = end
        if start >= hi:
            break
    if not pieces:
        raise ValueError(f"rows {lo}..{hi} are not in the curated parts")
    return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]


def sample_texts(folder: str, parts: list[Part], max_docs: int, max_bytes: int) -> list[str]:
    """The first documents in corpus order, up to a count and a byte budget (tokenizer training)."""
    texts: list[str] = []
    size = 0
    for part in parts:
        f = parquet_file(storage.join(folder, part.name))
        for batch in f.iter_batches(batch_size=ROW_GROUP, columns=["text"]):
            for text in batch.column(0).to_pylist():
                texts.append(text)
                size += len(text)
                if size >= max_bytes or len(texts) >= max_docs:
                    return texts
    return texts


def profile_documents(folder: str, parts: list[Part], lo: int, hi: int) -> MetaProfile:
    """Ray task: what the meta of documents ``[lo, hi)`` looks like, for one struct type over every part."""
    try:
        metas = [parse_meta_json(m) for m in read_rows(folder, parts, lo, hi, ["meta"]).column(0).to_pylist()]
    except ValueError as exc:
        return MetaProfile(None, problem=f"a meta that does not parse: {str(exc)[:200]}")
    return profile_meta(metas)


def export_documents(folder: str, parts: list[Part], k: int, lo: int, hi: int, dest_dir: str,
                     fmt: str, plan: MetaPlan | None = None) -> dict[str, Any] | None:
    """Write documents ``[lo, hi)`` as ``documents`` part ``k`` (Parquet with ``meta`` as ``plan`` says, or
    JSONL with ``meta`` as an object); returns its listing entry, or None when ``plan``'s struct does not
    hold this range's meta exactly (nothing is written: the caller redoes every part with JSON meta)."""
    table = read_rows(folder, parts, lo, hi)
    fname = f"part-{k:06d}.{fmt}"
    if fmt == "parquet":
        if plan is not None and plan.mode == "struct":
            table = _struct_meta(table, plan)
            if table is None:
                return None
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=ROW_GROUP)
        data = sink.getvalue().to_pybytes()
    else:
        lines = []
        for row in table.to_pylist():
            row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
            if not row.get("segments"):
                row.pop("segments", None)
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        data = "".join(lines).encode("utf-8")
    storage.write_bytes(storage.join(dest_dir, fname), data)
    return {"name": f"documents/{fname}", "rows": table.num_rows, "first_row": lo,
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _struct_meta(table: pa.Table, plan: MetaPlan) -> pa.Table | None:
    """``table`` with its meta JSON as ``plan``'s struct (the decode rules in the schema metadata)."""
    array = encode_meta([parse_meta_json(m) for m in table.column("meta").to_pylist()], plan)
    if array is None:
        return None
    table = table.set_column(table.schema.get_field_index("meta"), "meta", array)
    return table.replace_schema_metadata(plan.rules.metadata())
