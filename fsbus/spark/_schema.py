"""Row shapes of the Spark source, Arrow conversion, and helpers to decode ``value``."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column

    from fsbus import ColumnBatch, MessageInfo

__all__ = [
    "BUS_SCHEMA",
    "STREAM_SCHEMA",
    "bus_batch",
    "columns_batch",
    "headers_array",
    "value_as_json",
    "value_as_string",
]

STREAM_SCHEMA = (
    "stream string, offset long, timestamp timestamp, key binary, value binary, "
    "headers map<string,string>"
)
"""Columns of a Stream read: one row per record."""

BUS_SCHEMA = (
    "topic string, kind string, expires timestamp, size long, payload binary, "
    "headers map<string,string>, priority int, published_at timestamp, host string, "
    "locked boolean, name string, bucket string"
)
"""Columns of a Bus snapshot: one row per message on disk (nothing is consumed)."""

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


@functools.lru_cache(maxsize=8)
def _repeat(value: str, n: int) -> pa.Array:
    # batches mostly have the same few lengths: build the stream column once for each
    return pa.repeat(pa.scalar(value, pa.string()), n)


def columns_batch(stream: str, parts: Sequence[ColumnBatch]) -> pa.RecordBatch:
    """One Arrow batch of ``STREAM_SCHEMA`` rows from column batches of one stream.

    No Python object per record in the common case: the values' buffer becomes the
    Arrow binary array's data as is (a copy only to join several parts), its offsets are
    a cumulative sum of the value lengths, and offsets and timestamps are NumPy arrays.
    """
    n = sum(map(len, parts))
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=_STREAM_ARROW)
    offs = [p.offsets for p in parts]
    if all(isinstance(o, range) for o in offs) and offs[-1][-1] - offs[0][0] == n - 1:
        offsets = pa.array(np.arange(offs[0][0], offs[0][0] + n, dtype=np.int64))
    else:
        offsets = pa.array(np.concatenate([np.asarray(o, dtype=np.int64) for o in offs]))
    stamps = np.concatenate([np.frombuffer(p.timestamps, dtype=np.float64) for p in parts])
    micros = pa.array(np.rint(stamps * 1_000_000).astype(np.int64)).view(_TS)
    lengths = np.concatenate([np.frombuffer(p.value_lengths, dtype=np.uint32) for p in parts])
    ends = np.empty(n + 1, dtype=np.int64)
    ends[0] = 0
    np.cumsum(lengths, out=ends[1:])
    if ends[-1] > _INT32_MAX:
        raise ValueError(
            f"{int(ends[-1])} bytes of values in one Arrow batch exceed Spark's binary column "
            "limit (2 GiB); lower the stream's max_frame_bytes"
        )
    data = parts[0].value_data if len(parts) == 1 else b"".join(p.value_data for p in parts)
    values = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(data)]
    )
    if all(p.keys.count(None) == len(p) for p in parts):
        keys = _no_keys(n)
    else:
        keys = pa.array([k for p in parts for k in p.keys], pa.binary())
    if any(any(p.headers) for p in parts):
        headers = headers_array([h for p in parts for h in p.headers])
    else:
        headers = _no_headers(n)
    columns = [_repeat(stream, n), offsets, micros, keys, values, headers]
    return pa.RecordBatch.from_arrays(columns, schema=_STREAM_ARROW)


@functools.lru_cache(maxsize=8)
def _no_keys(n: int) -> pa.Array:
    return pa.nulls(n, pa.binary())


@functools.lru_cache(maxsize=8)
def _no_headers(n: int) -> pa.Array:
    empty = pa.array([], pa.string())
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), empty, empty)


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


def value_as_string(column: str = "value", *, alias: str | None = None) -> Column:
    """The binary ``column`` decoded as UTF-8 text (a Spark Column)."""
    from pyspark.sql import functions as F

    return F.col(column).cast("string").alias(alias or column)


def value_as_json(schema: Any, column: str = "value", *, alias: str | None = None) -> Column:
    """The binary ``column`` parsed as JSON with ``schema`` (DDL string or StructType).

    Rows whose value is not valid JSON give null, as with Spark's ``from_json``.
    """
    from pyspark.sql import functions as F

    return F.from_json(F.col(column).cast("string"), schema).alias(alias or column)
