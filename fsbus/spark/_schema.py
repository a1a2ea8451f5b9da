"""Row shapes of the Spark source, Arrow conversion, and helpers to decode ``value``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
    """One Arrow batch of ``STREAM_SCHEMA`` rows from stream records."""
    n = len(records)
    columns = [
        pa.array([stream] * n, pa.string()) if n else pa.array([], pa.string()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([_micros(r.timestamp) for r in records], _TS),
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        headers_array([r.headers for r in records]),
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
