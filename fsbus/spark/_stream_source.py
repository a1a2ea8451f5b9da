"""Reading Streams from Spark: micro-batches (with admission control) and batch reads.

The driver only looks at offsets; every record is read on an executor, which opens the
stream from what travels in its :class:`StreamRangePartition` (root, name, range). The
Python process that plans a streaming query imports this module, so pyarrow is loaded
only where rows are built (:mod:`._arrow`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from fsbus import ColumnBatch, OffsetOutOfRange, Stream

from ._options import OffsetSpec, StreamSourceOptions
from ._plan import cap_offsets, split_ranges
from ._schema import ALL_STREAM_COLUMNS, StreamColumns, stream_columns

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "StreamBatchReader",
    "StreamMicroBatchReader",
    "StreamRangePartition",
    "read_range",
    "resolve_offsets",
]

ARROW_BATCH_ROWS = 8192
"""Records after which an Arrow batch is handed to Spark."""
ARROW_BATCH_BYTES = 1 << 20
"""Bytes of values after which an Arrow batch is handed to Spark: about a frame (the
stream's ``max_frame_bytes``), so a frame of a batch append becomes one Arrow batch whose
values are the frame's bytes as they are, and only small frames are joined (a copy)."""
LAGGING_VIEW_WAITS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.0, 2.0)
"""Seconds between reads of a range that this host sees shorter than the plan says it is
(a client's stale pages of a segment on a shared filesystem): about 5 s in all."""

log = logging.getLogger("fsbus.spark")


class StreamRangePartition(InputPartition):
    """What one Spark task needs to read ``[start, stop)`` of one stream (picklable)."""

    def __init__(
        self, *, root: str, stream: str, start: int, stop: int, fail_on_data_loss: bool
    ) -> None:
        super().__init__((stream, start, stop))
        self.root = root
        """The bus root directory."""
        self.stream = stream
        """The stream's name."""
        self.start = start
        """First offset to read."""
        self.stop = stop
        """First offset not to read."""
        self.fail_on_data_loss = fail_on_data_loss
        """Raise if retention removed part of the range (else read what is left)."""


def read_range(
    part: StreamRangePartition, columns: StreamColumns = ALL_STREAM_COLUMNS
) -> Iterator[pa.RecordBatch]:
    """Read one partition's records as Arrow batches of ``columns`` (runs on an executor)."""
    from ._arrow import arrow_schema, columns_batch  # here: a planner never builds rows

    schema = arrow_schema(columns)

    with Stream.open(part.root, part.stream, create=False) as stream:
        start = part.start
        first = stream.start_offset
        if start < first:
            if part.fail_on_data_loss:
                raise OffsetOutOfRange(
                    f"stream {part.stream!r}: offsets {start}..{min(first, part.stop) - 1} "
                    f"were removed by retention before Spark read them (the stream now starts "
                    f"at {first}); set option failOnDataLoss=false to skip them"
                )
            start = first
        if start >= part.stop:
            return
        parts: list[ColumnBatch] = []
        rows = size = 0
        reached = start
        for wait in (0.0, *LAGGING_VIEW_WAITS):
            if wait:
                time.sleep(wait)
            for cols in stream.read_columns(reached, part.stop):
                parts.append(cols)
                rows += len(cols)
                size += len(cols.value_data)
                if rows >= ARROW_BATCH_ROWS or size >= ARROW_BATCH_BYTES:
                    yield columns_batch(part.stream, parts, columns, schema)
                    parts, rows, size = [], 0, 0
            # The plan saw offsets up to stop: a read that ends before it is this host's
            # view lagging (stale pages of a shared filesystem), not the stream's end.
            reached = max(reached, stream.seen_end)
            if reached >= part.stop:
                break
        if parts:
            yield columns_batch(part.stream, parts, columns, schema)
        if reached < part.stop:
            msg = (
                f"stream {part.stream!r}: offsets {reached}..{part.stop - 1}, planned for "
                f"this task, are not readable on this host (read for "
                f"{sum(LAGGING_VIEW_WAITS):.0f} s); the segment holding them was cut "
                "or is corrupt"
            )
            if part.fail_on_data_loss:
                raise OffsetOutOfRange(msg + "; set option failOnDataLoss=false to skip them")
            log.warning("%s; skipped (failOnDataLoss=false)", msg)


def _position(stream: Stream, name: str, spec: OffsetSpec, option: str) -> int:
    first, end = stream.start_offset, stream.end_offset
    if spec == "earliest":
        return first
    if spec == "latest":
        return end
    if not first <= spec <= end:
        raise OffsetOutOfRange(
            f"option {option!r} asks for offset {spec} of stream {name!r}, "
            f"which holds offsets {first}..{end} (end exclusive); pick one in that range, "
            "or 'earliest' / 'latest'"
        )
    return spec


def resolve_offsets(opts: StreamSourceOptions, *, ending: bool) -> dict[str, int]:
    """Concrete starting (or ending) offsets of every stream; checks that the streams exist."""
    out: dict[str, int] = {}
    for name in opts.streams:
        with Stream.open(opts.root, name, create=False) as stream:
            ts = opts.ending_timestamp if ending else opts.starting_timestamp
            if ts is not None:
                out[name] = stream.offset_for_time(ts)
            elif ending:
                out[name] = _position(stream, name, opts.ending[name], "endingOffsets")
            else:
                out[name] = _position(stream, name, opts.starting[name], "startingOffsets")
    return out


def _ends(opts: StreamSourceOptions) -> dict[str, int]:
    out = {}
    for name in opts.streams:
        with Stream.open(opts.root, name, create=False) as stream:
            out[name] = stream.end_offset
    return out


def _partitions(
    opts: StreamSourceOptions, start: dict[str, int], end: dict[str, int]
) -> list[StreamRangePartition]:
    ranges = split_ranges(
        start,
        end,
        max_per_range=opts.max_records_per_partition,
        min_ranges=opts.min_partitions,
    )
    return [
        StreamRangePartition(
            root=opts.root,
            stream=r.stream,
            start=r.start,
            stop=r.stop,
            fail_on_data_loss=opts.fail_on_data_loss,
        )
        for r in ranges
    ]


class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of one or more streams; the checkpointed offset is ``{stream: next}``.

    ``schema`` is the one Spark hands the source: a narrower one given with ``.schema()``
    returns only its columns (see :func:`stream_columns`).
    """

    def __init__(self, opts: StreamSourceOptions, schema: Any = None) -> None:
        self.opts = opts
        self.columns = stream_columns(schema)
        self._target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return resolve_offsets(self.opts, ending=False)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _ends(self.opts)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        latest = self._target if self._target is not None else _ends(self.opts)
        # A stream added to the option since the checkpoint starts at its starting offset.
        begin = {n: int(start[n]) if n in start else self._start_of(n) for n in latest}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return cap_offsets(begin, latest, max_rows)

    def reportLatestOffset(self) -> dict[str, int]:
        return _ends(self.opts)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        begin = {n: int(start[n]) if n in start else self._start_of(n) for n in end}
        return _partitions(self.opts, begin, {n: int(v) for n, v in end.items()})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRangePartition)
        return read_range(partition, self.columns)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the stream keeps its records; retention is the stream's business."""

    def _start_of(self, name: str) -> int:
        single = dataclasses.replace(self.opts, streams=(name,))
        return resolve_offsets(single, ending=False)[name]


class StreamBatchReader(DataSourceReader):
    """A batch read of ``[starting, ending)`` of one or more streams (offsets or times).

    ``schema`` as for :class:`StreamMicroBatchReader`.
    """

    def __init__(self, opts: StreamSourceOptions, schema: Any = None) -> None:
        self.opts = opts
        self.columns = stream_columns(schema)
        start = resolve_offsets(opts, ending=False)
        end = resolve_offsets(opts, ending=True)
        self._parts = _partitions(opts, start, {n: max(end[n], start[n]) for n in end})

    def partitions(self) -> Sequence[InputPartition]:
        return self._parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRangePartition)
        return read_range(partition, self.columns)
