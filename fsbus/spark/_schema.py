"""Row shapes of the Spark source, Arrow conversion, and helpers to decode ``value``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column

    from fsbus import MessageInfo, Record

__all__ = [
    "BUS_SCHEMA",
    "STREAM_SCHEMA",
    "bus_batch",
    "headers_array",
    "stream_batch",
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
_OFFSET = attrgetter("offset")
_TIMESTAMP = attrgetter("timestamp")
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_HEADERS_OF = attrgetter("headers")
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
        offsets = pa.array([0] * (len(headers) + 1), pa.int32())
        empty = pa.array([], pa.string())
        return pa.MapArray.from_arrays(offsets, empty, empty)
    return pa.array([list(h.items()) for h in headers], _HEADERS)


def stream_batch(stream: str, records: Sequence[Record]) -> pa.RecordBatch:
    """One Arrow batch of ``STREAM_SCHEMA`` rows from stream records.

    Column-wise, with shortcuts for the common shapes (contiguous offsets, no keys, no
    headers): this runs once per record on the executors and is most of a read's cost.
    """
    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=_STREAM_ARROW)
    first = records[0].offset
    if records[-1].offset - first == n - 1:
        offsets = pa.array(np.arange(first, first + n, dtype=np.int64))
    else:
        offsets = pa.array(list(map(_OFFSET, records)), pa.int64())
    stamps = np.fromiter(map(_TIMESTAMP, records), dtype=np.float64, count=n)
    micros = pa.array(np.rint(stamps * 1_000_000).astype(np.int64)).view(_TS)
    keys = list(map(_KEY, records))
    key_array = pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary())
    columns = [
        pa.array([stream] * n, pa.string()),
        offsets,
        micros,
        key_array,
        pa.array(list(map(_VALUE, records)), pa.binary()),
        headers_array(list(map(_HEADERS_OF, records))),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_STREAM_ARROW)


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
