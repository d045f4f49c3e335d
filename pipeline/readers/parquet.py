"""Parquet files read in row batches with pyarrow, one document per row."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import storage
from pipeline.documents import Doc, Drop
from pipeline.readers.docs import drop, error_text
from pipeline.readers.jsonl import record_doc
from pipeline.spec import InputSpec

BATCH_ROWS = 1024


def read_parquet(
    file_index: int, path: str, name: str, spec: InputSpec, to_doc: Callable[..., Doc | Drop] = record_doc
) -> Iterator[Doc | Drop]:
    try:
        pf = pq.ParquetFile(storage.open_input(path))
    except (OSError, pa.ArrowException) as exc:
        yield drop(name, file_index, 0, "unreadable_file", error=error_text(exc))
        return
    record_index = 0
    with pf:
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS):
                for row in _rows(batch):
                    if isinstance(row, Exception):
                        yield drop(name, file_index, record_index, "bad_record:unconvertible",
                                   error=error_text(row))
                    else:
                        yield to_doc(file_index, name, spec, record_index, _row_text(row, spec), row)
                    record_index += 1
        except (OSError, pa.ArrowException) as exc:
            yield drop(name, file_index, record_index, "unreadable_file", error=error_text(exc))


def _rows(batch: pa.RecordBatch) -> list[dict | Exception]:
    """The batch as Python rows; a value Python cannot hold (a timestamp past year 9999) costs only its row."""
    try:
        return batch.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        rows: list[dict | Exception] = []
        for i in range(batch.num_rows):
            try:
                rows.append(batch.slice(i, 1).to_pylist()[0])
            except (OverflowError, ValueError, pa.ArrowException) as exc:
                rows.append(exc)
        return rows


def _row_text(row: dict, spec: InputSpec) -> str:
    """What a rejected row shows: its text field when there is one, else the row's repr."""
    value = row.get(spec.text_field)
    return value if isinstance(value, str) else repr(row)[:10240]
