"""The ``fsbus`` data source: one short name for Stream reads, Bus snapshots and writes.

Spark imports this module in every Python process that touches the source: a fresh one
creates the data source (``schema()``), another plans each streaming query and a third
commits each streaming write. So the readers and the sink are imported where a method
needs them, not here: a process that only plans a Stream read never loads pyarrow's
compute kernels, the sink or the Bus's engine (about 0.1-0.2 s a process).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
)

from fsbus import InvalidConfig

from ._files import absolute
from ._names import BUS_SCHEMA, STREAM_SCHEMA
from ._options import (
    SinkOptions,
    StreamSourceOptions,
    parse_bus_snapshot_options,
    parse_sink_options,
    parse_stream_source_options,
    reader_kind,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from ._sink import SinkColumns

__all__ = ["FsBusDataSource"]

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Spark's local property holding the micro-batch id in a streaming write task."""


class FsBusDataSource(DataSource):
    """``format("fsbus")``: read or write a Stream, snapshot or publish on the Bus.

    Every option is checked on the driver when the query is defined (``schema()``,
    ``reader()``, ``writer()`` run there), so mistakes fail before any task runs.
    """

    @classmethod
    def name(cls) -> str:
        return "fsbus"

    def schema(self) -> str:
        if reader_kind(self.options) == "bus":
            parse_bus_snapshot_options(self.options)
            return BUS_SCHEMA
        from ._stream_source import resolve_offsets

        resolve_offsets(self._stream_options(), ending=False)  # streams exist, offsets fit
        return STREAM_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        if reader_kind(self.options) == "bus":
            from ._bus_source import BusSnapshotReader

            opts = parse_bus_snapshot_options(self.options)
            return BusSnapshotReader(replace(opts, root=absolute(opts.root)))
        from ._stream_source import StreamBatchReader

        return StreamBatchReader(self._stream_options(), schema)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if reader_kind(self.options) == "bus":
            from ._bus_topics import BusTopicsReader, bus_topic_source_options

            opts, pattern, queue = bus_topic_source_options(self.options)
            return BusTopicsReader(replace(opts, root=absolute(opts.root)), pattern, queue)
        from ._stream_source import StreamMicroBatchReader, resolve_offsets

        opts = self._stream_options()
        resolve_offsets(opts, ending=False)
        return StreamMicroBatchReader(opts, schema)

    def _stream_options(self) -> StreamSourceOptions:
        # Executors get an absolute root: their working directory may differ.
        opts = parse_stream_source_options(self.options)
        return replace(opts, root=absolute(opts.root))

    def writer(self, schema: Any, overwrite: bool) -> BatchWriter:
        from ._sink import sink_columns

        opts = _sink_options(self.options, overwrite, streaming=False)
        return BatchWriter(opts, sink_columns(schema, opts))

    def streamWriter(self, schema: Any, overwrite: bool) -> StreamWriter:
        from ._sink import sink_columns

        opts = _sink_options(self.options, overwrite, streaming=True)
        return StreamWriter(opts, sink_columns(schema, opts))


def _sink_options(options: Any, overwrite: bool, *, streaming: bool) -> SinkOptions:
    if overwrite:
        raise InvalidConfig(
            "fsbus streams and the Bus are append-only: use mode('append') (batch) or "
            "outputMode('append') (streaming; aggregate over windows with a watermark), "
            "not overwrite/complete (Spark refuses 'update' for Python data source sinks)"
        )
    opts = parse_sink_options(options, streaming=streaming)
    return replace(opts, root=absolute(opts.root))


class BatchWriter(DataSourceArrowWriter):
    """A batch job's write: tasks stage, the driver appends or publishes once at the end."""

    def __init__(self, opts: SinkOptions, cols: SinkColumns) -> None:
        import uuid

        self.opts = opts
        self.cols = cols
        self.job = f"job-{uuid.uuid4().hex}"
        self.sink_id = "batch-jobs"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from ._sink import stage

        # Publishing on the Bus keeps a ledger naming the staged files, which must survive
        # a power cut; a Stream's staged segments are always synced (they are renamed in).
        durable = self.opts.stream is None
        return stage(self.opts, self.cols, self.sink_id, self.job, iterator, durable=durable)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from ._sink import publish

        publish(self.opts, self.sink_id, self.job, messages, replayable=False)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        from ._sink import discard

        discard(self.opts, self.sink_id, self.job, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    """A streaming query's sink: each micro-batch published exactly once by its batch id."""

    def __init__(self, opts: SinkOptions, cols: SinkColumns) -> None:
        assert opts.sink_id is not None
        self.opts = opts
        self.cols = cols
        self.sink_id = opts.sink_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        from ._sink import stage

        ctx = TaskContext.get()
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        return stage(self.opts, self.cols, self.sink_id, batch or "unknown", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from ._sink import publish

        publish(self.opts, self.sink_id, str(batchId), messages, replayable=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from ._sink import discard

        discard(self.opts, self.sink_id, str(batchId), messages)
