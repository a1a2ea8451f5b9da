"""Arrow batches of the Spark source's rows: Stream records and Bus messages.

Loaded where rows are built (the executors, a batch read's planner), not by the process
that plans a streaming query: pyarrow and NumPy take about 0.06 s to import.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ._schema import ALL_STREAM_COLUMNS, StreamColumns

if TYPE_CHECKING:
    from fsbus import ColumnBatch, MessageInfo

__all__ = [
    "arrow_schema",
    "bus_batch",
    "bus_rows_batch",
    "columns_batch",
    "headers_array",
]

_TS = pa.timestamp("us", tz="UTC")
_HEADERS = pa.map_(pa.string(), pa.string())

_STREAM_ARROW = pa.schema(
    [
        ("stream", pa.string()),
        ("offset", pa.int64()),
        ("timestamp", _TS),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADERS),
    ]
)
_BUS_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("kind", pa.string()),
        ("expires", _TS),
        ("size", pa.int64()),
        ("payload", pa.binary()),
        ("headers", _HEADERS),
        ("priority", pa.int32()),
        ("published_at", _TS),
        ("host", pa.string()),
        ("locked", pa.bool_()),
        ("name", pa.string()),
        ("bucket", pa.string()),
    ]
)


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1_000_000)


def headers_array(headers: Sequence[Mapping[str, str]]) -> pa.Array:
    """An Arrow map array of header mappings; cheap when every mapping is empty."""
    if not any(headers):
        return _no_headers(len(headers))
    return pa.array([list(h.items()) for h in headers], _HEADERS)


_INT32_MAX = 2**31 - 1


def arrow_schema(columns: StreamColumns) -> pa.Schema:
    """The Arrow schema of the batches of ``columns`` (names spelled as the query's schema
    spells them)."""
    if columns.spark_schema is None:
        return _STREAM_ARROW
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(columns.spark_schema, timezone="UTC")


def columns_batch(
    stream: str,
    parts: Sequence[ColumnBatch],
    columns: StreamColumns = ALL_STREAM_COLUMNS,
    schema: pa.Schema | None = None,
) -> pa.RecordBatch:
    """One Arrow batch of Stream rows (``columns`` of them) from column batches of one stream.

    No Python object per record in the common case: the values' buffer becomes the
    Arrow binary array's data as is (a copy only to join several parts), its offsets are
    a cumulative sum of the value lengths, and the other columns are NumPy buffers. Only
    the requested columns are built. Nothing here imports pandas (``pa.array`` would).
    ``schema``: :func:`arrow_schema` of ``columns``, made once by a caller that builds many
    batches (for a narrower schema it is converted from Spark's).
    """
    if schema is None:
        schema = arrow_schema(columns)
    n = sum(map(len, parts))
    if n == 0:
        return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
    arrays = [_COLUMN[name](stream, parts, n) for name in columns.names]
    if columns.spark_schema is not None:
        arrays = [
            a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema, strict=True)
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _stream_column(stream: str, parts: Sequence[ColumnBatch], n: int) -> pa.Array:
    return _repeat(stream, n)


def _offset_column(stream: str, parts: Sequence[ColumnBatch], n: int) -> pa.Array:
    offs = [p.offsets for p in parts]
    if all(isinstance(o, range) for o in offs) and offs[-1][-1] - offs[0][0] == n - 1:
        values = np.arange(offs[0][0], offs[0][0] + n, dtype=np.int64)
    else:
        values = np.concatenate([np.asarray(o, dtype=np.int64) for o in offs])
    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(values)])


def _timestamp_column(stream: str, parts: Sequence[ColumnBatch], n: int) -> pa.Array:
    stamps = np.concatenate([np.frombuffer(p.timestamps, dtype=np.float64) for p in parts])
    micros = np.rint(stamps * 1_000_000).astype(np.int64)
    return pa.Array.from_buffers(_TS, n, [None, pa.py_buffer(micros)])


def _key_column(stream: str, parts: Sequence[ColumnBatch], n: int) -> pa.Array:
    if all(p.keys.count(None) == len(p) for p in parts):
        return _no_keys(n)
    keys = [k for p in parts for k in p.keys]
    present = np.fromiter((k is not None for k in keys), dtype=np.bool_, count=n)
    lengths = np.fromiter((len(k) if k else 0 for k in keys), dtype=np.int64, count=n)
    data = b"".join(k for k in keys if k)
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [
            pa.py_buffer(np.packbits(present, bitorder="little")),
            pa.py_buffer(_ends(lengths, "keys")),
            pa.py_buffer(data),
        ],
    )


def _value_column(stream: str, parts: Sequence[ColumnBatch], n: int) -> pa.Array:
    lengths = np.concatenate([np.frombuffer(p.value_lengths, dtype=np.uint32) for p in parts])
    data = parts[0].value_data if len(parts) == 1 else b"".join(p.value_data for p in parts)
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(_ends(lengths, "values")), pa.py_buffer(data)]
    )


def _headers_column(stream: str, parts: Sequence[ColumnBatch], n: int) -> pa.Array:
    if all(_all_empty(p.headers) for p in parts):
        return _no_headers(n)
    return headers_array([h for p in parts for h in p.headers])


def _all_empty(headers: Sequence[Mapping[str, str]]) -> bool:
    """Whether every mapping is empty. A frame without headers repeats one empty mapping,
    which ``list.count`` matches by identity (a few ns a record, where testing each
    mapping's truth takes ten times that)."""
    if not headers:
        return True
    first = headers[0]
    return not first and headers.count(first) == len(headers)


def _ends(lengths: Any, what: str) -> Any:
    """Arrow's int32 offsets (n + 1 of them) of items with these lengths."""
    ends = np.empty(len(lengths) + 1, dtype=np.int64)
    ends[0] = 0
    np.cumsum(lengths, out=ends[1:])
    if ends[-1] > _INT32_MAX:
        raise ValueError(
            f"{int(ends[-1])} bytes of {what} in one Arrow batch exceed Spark's binary column "
            "limit (2 GiB); lower the stream's max_frame_bytes"
        )
    return ends.astype(np.int32)


_COLUMN = {
    "stream": _stream_column,
    "offset": _offset_column,
    "timestamp": _timestamp_column,
    "key": _key_column,
    "value": _value_column,
    "headers": _headers_column,
}


@functools.lru_cache(maxsize=8)
def _repeat(value: str, n: int) -> pa.Array:
    # batches mostly have the same few lengths: build the stream column once for each
    raw = value.encode()
    ends = np.arange(0, len(raw) * (n + 1), len(raw), dtype=np.int64)
    if ends[-1] > _INT32_MAX:
        raise ValueError(f"{n} rows of stream name {value!r} exceed an Arrow string column")
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(raw * n)]
    )


@functools.lru_cache(maxsize=8)
def _no_keys(n: int) -> pa.Array:
    return pa.nulls(n, pa.binary())


@functools.lru_cache(maxsize=8)
def _no_headers(n: int) -> pa.Array:
    empty = pa.Array.from_buffers(
        pa.string(), 0, [None, pa.py_buffer(np.zeros(1, dtype=np.int32)), pa.py_buffer(b"")]
    )
    offsets = pa.Array.from_buffers(
        pa.int32(), n + 1, [None, pa.py_buffer(np.zeros(n + 1, dtype=np.int32))]
    )
    return pa.MapArray.from_arrays(offsets, empty, empty)


def bus_batch(rows: Sequence[tuple[MessageInfo, bytes | None]]) -> pa.RecordBatch:
    """One Arrow batch of ``BUS_SCHEMA`` rows from browsed messages and their payloads."""
    infos = [info for info, _ in rows]
    columns = [
        pa.array([i.topic for i in infos], pa.string()),
        pa.array(["single" if i.single else "multi" for i in infos], pa.string()),
        pa.array([_micros(i.expires) for i in infos], _TS),
        pa.array([i.size for i in infos], pa.int64()),
        pa.array([payload for _, payload in rows], pa.binary()),
        headers_array([dict(i.headers or {}) for i in infos]),
        pa.array([i.priority for i in infos], pa.int32()),
        pa.array([_micros(i.published_at) for i in infos], _TS),
        pa.array([i.host for i in infos], pa.string()),
        pa.array([i.locked for i in infos], pa.bool_()),
        pa.array([i.name for i in infos], pa.string()),
        pa.array([i.bucket for i in infos], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_BUS_ARROW)


def bus_rows_batch(records: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    """``BUS_SCHEMA`` rows from records of a Bus recording (``STREAM_SCHEMA`` rows whose
    headers keep what the Bus knew of each message; see :mod:`fsbus.recording`)."""
    from fsbus.recording import (
        EXPIRES,
        HOST,
        KIND,
        MESSAGE,
        PRIORITY,
        PUBLISHED,
        RECORD_HEADERS,
        TOPIC,
    )

    def num(text: str | None) -> float | None:
        try:
            return float(text) if text else None
        except ValueError:
            return None

    heads = [dict(r["headers"] or ()) for r in records]
    own = set(RECORD_HEADERS)
    columns = [
        pa.array([h.get(TOPIC) for h in heads], pa.string()),
        pa.array([h.get(KIND) for h in heads], pa.string()),
        pa.array([_micros(num(h.get(EXPIRES))) for h in heads], _TS),
        pa.array([len(r["value"] or b"") for r in records], pa.int64()),
        pa.array([r["value"] for r in records], pa.binary()),
        headers_array([{k: v for k, v in h.items() if k not in own} for h in heads]),
        pa.array(
            [int(h[PRIORITY]) if h.get(PRIORITY, "").isdigit() else None for h in heads], pa.int32()
        ),
        pa.array([_micros(num(h.get(PUBLISHED))) for h in heads], _TS),
        pa.array([h.get(HOST) or None for h in heads], pa.string()),
        pa.array([None] * len(records), pa.bool_()),
        pa.array([h.get(MESSAGE) for h in heads], pa.string()),
        pa.array([None] * len(records), pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_BUS_ARROW)
