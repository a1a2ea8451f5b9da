"""The floor of a Python data source *sink*: one that does no work at all, for bench_spark.

``format("fsbus-sink-floor")`` takes any DataFrame: each task counts the Arrow batches
Spark hands it, and commit does nothing. Whatever it costs is what Spark's Python Data
Source API costs to write those rows (Python workers, Arrow over a socket, the Python
worker Spark starts for every commit), so the fsbus sink, which also stages the rows and
appends them durably once, cannot beat it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

__all__ = ["SinkFloorDataSource"]


def _drain(iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
    rows = 0
    for batch in iterator:
        rows += batch.num_rows
    return WriterCommitMessage()


class _Writer(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _drain(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class _StreamWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _drain(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class SinkFloorDataSource(DataSource):
    """``format("fsbus-sink-floor")``: a sink that drops every row."""

    @classmethod
    def name(cls) -> str:
        return "fsbus-sink-floor"

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        return _Writer()

    def streamWriter(self, schema: Any, overwrite: bool) -> _StreamWriter:
        return _StreamWriter()
