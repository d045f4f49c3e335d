"""Parquet files read in row batches with pyarrow, one document per row.

A row with a string or binary value over ``max_record_bytes`` is one ``record_too_large`` stub (its id, the field,
the value's size), found in Arrow before the batch becomes Python objects. What a file costs is bounded by its row
groups, not by this limit: pyarrow decodes a column chunk of a row group at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import storage
from pipeline.documents import Drop, ReaderDocument
from pipeline.readers.bounded import too_large
from pipeline.readers.docs import drop, error_text, record_id
from pipeline.readers.jsonl import record_doc
from pipeline.spec import InputSpec

BATCH_ROWS = 1024


def read_parquet(
    file_index: int, path: str, name: str, spec: InputSpec, to_doc: Callable[..., ReaderDocument | Drop] = record_doc
) -> Iterator[ReaderDocument | Drop]:
    try:
        pf = pq.ParquetFile(storage.open_input(path))
    except (OSError, pa.ArrowException) as exc:
        yield drop(name, file_index, 0, "unreadable_file", error=error_text(exc))
        return
    record_index = 0
    with pf:
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS):
                big = _oversized(batch, spec.max_record_bytes)
                rows = iter(_rows(batch.filter([i not in big for i in range(batch.num_rows)]) if big else batch))
                for i in range(batch.num_rows):
                    row = big[i] if i in big else next(rows)
                    if isinstance(row, TooBig):
                        yield too_large(name, file_index, record_index, spec.max_record_bytes,
                                        _big_row_id(batch, i, row, spec, name, record_index),
                                        field=row.field, size=row.size)
                    elif isinstance(row, Exception):
                        yield drop(name, file_index, record_index, "bad_record:unconvertible",
                                   error=error_text(row))
                    else:
                        yield to_doc(file_index, name, spec, record_index, _row_text(row, spec), row)
                    record_index += 1
        except (OSError, pa.ArrowException) as exc:
            yield drop(name, file_index, record_index, "unreadable_file", error=error_text(exc))


class TooBig(NamedTuple):
    """A row's first string or binary value over the limit, and the fields of all of them."""

    field: str
    size: int
    fields: tuple[str, ...]


def _oversized(batch: pa.RecordBatch, limit: int) -> dict[int, TooBig]:
    """The rows with a string or binary value over ``limit`` bytes."""
    found: dict[int, TooBig] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        kind = column.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind)):
            continue
        sizes = pc.binary_length(column)
        over = pc.greater(sizes, limit)
        if not pc.any(over).as_py():
            continue
        for i in pc.indices_nonzero(over).to_pylist():
            first = found.get(i) or TooBig(name, sizes[i].as_py(), ())
            found[i] = first._replace(fields=(*first.fields, name))
    return found


def _big_row_id(batch: pa.RecordBatch, i: int, big: TooBig, spec: InputSpec, name: str, record_index: int) -> str:
    """The id of row ``i``, one of the rows too large to read: its id field unless that is one of the big values."""
    if spec.id_field not in batch.schema.names or spec.id_field in big.fields:
        return record_id({}, spec.id_field, name, record_index)
    return record_id({spec.id_field: batch.column(spec.id_field)[i].as_py()}, spec.id_field, name, record_index)


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
