"""A streaming read of Bus topics: ``readStream.format("fsbus").option("pattern", ...)``.

A recording (see :mod:`fsbus.recording`) gives the Bus's messages the offsets Spark
needs: a durable queue bound to the pattern collects every message published while the
query runs or is stopped, and at each micro-batch the driver drains it into a Stream
(``bus-<queue>``), exactly once, before asking for the Stream's end. From there on it
is a Stream read: checkpointed offsets, admission control, AvailableNow, executors
reading their ranges. Rows are rebuilt into ``BUS_SCHEMA`` from what each record keeps.

The queue is named by the option ``queue``, or after the pattern: two queries reading
the same pattern at once need a ``queue`` each. A query deleted for good leaves its
queue, which is deleted after a week without a drain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from ._schema import ALL_STREAM_COLUMNS
from ._stream_source import StreamMicroBatchReader, StreamRangePartition, read_range

if TYPE_CHECKING:
    import pyarrow as pa

    from fsbus import BlockingBus

__all__ = ["BusTopicsReader", "recording_names"]


def recording_names(pattern: str, queue: str | None) -> tuple[str, str]:
    """(queue, stream) of the recording a read of ``pattern`` uses."""
    from fsbus.recording import queue_for

    q = queue or queue_for(pattern, "spark")
    return q, f"bus-{q}"


class BusTopicsReader(StreamMicroBatchReader):
    """Micro-batches of the messages published on topics matching ``pattern``."""

    def __init__(self, opts: Any, pattern: str, queue: str) -> None:
        super().__init__(opts, None)
        self.pattern = pattern
        self.queue = queue
        # The driver's bus for the drains, kept from one micro-batch to the next (a new
        # one for each drain cost 60-70 ms of its latency); never pickled to executors.
        self._bus: BlockingBus | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_bus"] = None
        return state

    def _record(self) -> None:
        from fsbus.recording import drain, recorder_bus

        if self._bus is None:
            self._bus = recorder_bus(self.opts.root).__enter__()  # closed by stop()
        try:
            drain(
                self.opts.root, self.pattern, self.opts.streams[0], queue=self.queue, bus=self._bus
            )
        except BaseException:
            self.stop()  # the next drain starts from a fresh bus
            raise

    def stop(self) -> None:
        """The query stopped: close the drains' bus."""
        bus, self._bus = self._bus, None
        if bus is not None:
            bus.close()

    def initialOffset(self) -> dict[str, int]:
        self._record()  # declares the queue: the query sees what is published from now on
        return super().initialOffset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._record()
        super().prepareForTriggerAvailableNow()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        if self._target is None:
            self._record()
        return super().latestOffset(start, limit)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRangePartition)
        from ._arrow import bus_rows_batch

        for batch in read_range(partition, ALL_STREAM_COLUMNS):
            yield bus_rows_batch(batch.to_pylist())


def bus_topic_source_options(options: Mapping[str, str]) -> tuple[Any, str, str]:
    """(StreamSourceOptions of the recording's stream, pattern, queue) for a streaming
    read of Bus topics; bad options raise InvalidConfig saying which."""
    from ._options import parse_stream_source_options

    lower = {k.lower(): v for k, v in options.items()}
    pattern = lower.get("pattern", "#")
    queue, stream = recording_names(pattern, lower.get("queue"))
    passed = {
        k: v
        for k, v in options.items()
        if k.lower()
        in (
            "path",
            "maxrecordspertrigger",
            "maxrecordsperpartition",
            "minpartitions",
            "failondataloss",
        )
    }
    opts = parse_stream_source_options({**passed, "stream": stream, "startingOffsets": "earliest"})
    return dataclasses.replace(opts), pattern, queue
