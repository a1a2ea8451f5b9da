"""The floor of a Python data source: one that does no work at all, for bench_spark.

``format("fsbus-floor")`` returns rows of ``fsbus.spark.STREAM_SCHEMA`` (the same six
columns, 100-byte values, no keys, empty headers) from one Arrow batch built once per task
and handed to Spark again and again: no file is read, nothing is decoded. Whatever it
costs is what Spark's Python Data Source API costs for those rows (Python workers, Arrow
over a socket, Arrow to Spark rows), so the fsbus source cannot beat it. Options: ``n``
(rows), ``partitions`` (tasks, as the fsbus read of the same rows plans), ``size``
(bytes per value), ``rows`` (rows per Arrow batch, as the fsbus source hands them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)

from fsbus.spark import STREAM_SCHEMA

__all__ = ["FloorDataSource"]


class FloorDataSource(DataSource):
    """``format("fsbus-floor")``: ``n`` ready-made rows, as a batch or a stream."""

    @classmethod
    def name(cls) -> str:
        return "fsbus-floor"

    def schema(self) -> str:
        return STREAM_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(self.options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(self.options)


def _ranges(lo: int, hi: int, parts: int) -> list[InputPartition]:
    step = -(-(hi - lo) // parts)
    return [InputPartition((a, min(hi, a + step))) for a in range(lo, hi, step)]


def _rows(options: Any, partition: InputPartition) -> Iterator[Any]:
    import numpy as np
    import pyarrow as pa

    lo, hi = partition.value
    size, per = int(options.get("size", 100)), int(options.get("rows", 65_536))
    values = pa.Array.from_buffers(
        pa.binary(),
        per,
        [
            None,
            pa.py_buffer(np.arange(0, size * (per + 1), size, dtype=np.int32)),
            pa.py_buffer(b"x" * (size * per)),
        ],
    )
    name = b"bench"
    stream = pa.Array.from_buffers(
        pa.string(),
        per,
        [
            None,
            pa.py_buffer(np.arange(0, len(name) * (per + 1), len(name), dtype=np.int32)),
            pa.py_buffer(name * per),
        ],
    )
    offsets = pa.Array.from_buffers(
        pa.int64(), per, [None, pa.py_buffer(np.arange(per, dtype=np.int64))]
    )
    ts = pa.timestamp("us", tz="UTC")
    stamps = pa.Array.from_buffers(ts, per, [None, pa.py_buffer(np.zeros(per, np.int64))])
    empty = pa.Array.from_buffers(
        pa.string(), 0, [None, pa.py_buffer(np.zeros(1, np.int32)), pa.py_buffer(b"")]
    )
    heads = pa.MapArray.from_arrays(
        pa.Array.from_buffers(
            pa.int32(), per + 1, [None, pa.py_buffer(np.zeros(per + 1, np.int32))]
        ),
        empty,
        empty,
    )
    schema = pa.schema(
        [
            ("stream", pa.string()),
            ("offset", pa.int64()),
            ("timestamp", ts),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", pa.map_(pa.string(), pa.string())),
        ]
    )
    batch = pa.RecordBatch.from_arrays(
        [stream, offsets, stamps, pa.nulls(per, pa.binary()), values, heads], schema=schema
    )
    left = hi - lo
    while left > 0:
        yield batch if left >= per else batch.slice(0, left)
        left -= per


class _BatchReader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.options = dict(options)

    def partitions(self) -> Sequence[InputPartition]:
        return _ranges(0, int(self.options["n"]), int(self.options.get("partitions", 1)))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _rows(self.options, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Any) -> None:
        self.options = dict(options)

    def initialOffset(self) -> dict[str, int]:
        return {"floor": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return {"floor": int(self.options["n"])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        parts = int(self.options.get("partitions", 1))
        return _ranges(int(start["floor"]), int(end["floor"]), parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _rows(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        pass
