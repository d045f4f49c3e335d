"""Parquet files read in row batches with pyarrow, one document per row."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.readers.docs import drop, error_text
from pipeline.readers.jsonl import record_doc
from pipeline.spec import InputSpec
from pipeline.stages.base import Doc, Drop

BATCH_ROWS = 1024


def read_parquet(file_index: int, path: str, spec: InputSpec) -> Iterator[Doc | Drop]:
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        yield drop(path, file_index, 0, "unreadable_file", error=error_text(exc))
        return
    record_index = 0
    with pf:
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS):
                for row in batch.to_pylist():
                    yield record_doc(file_index, path, spec, record_index, _row_text(row, spec), row)
                    record_index += 1
        except (OSError, pa.ArrowException) as exc:
            yield drop(path, file_index, record_index, "unreadable_file", error=error_text(exc))


def _row_text(row: dict, spec: InputSpec) -> str:
    """What a rejected row shows: its text field when there is one, else the row's repr."""
    value = row.get(spec.text_field)
    return value if isinstance(value, str) else repr(row)[:10240]
