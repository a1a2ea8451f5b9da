"""A batch read of the Bus's current messages: a snapshot for inspection, nothing consumed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ._arrow import bus_batch
from ._options import BusSnapshotOptions

if TYPE_CHECKING:
    from fsbus import MessageInfo

__all__ = ["BusSnapshotReader"]

ARROW_BATCH_ROWS = 4096
"""Messages per Arrow batch handed to Spark."""


class BusSnapshotReader(DataSourceReader):
    """Browse the Bus once, in one task, and return every matching message."""

    def __init__(self, opts: BusSnapshotOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(self.opts.pattern)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from fsbus import BlockingBus  # here: Stream reads never load the Bus's engine

        rows: list[tuple[MessageInfo, bytes | None]] = []
        with BlockingBus(self.opts.root) as bus:
            for info in bus.browse(pattern=self.opts.pattern):
                payload = bus.read_payload(info) if self.opts.include_payload else None
                rows.append((info, payload))
                if len(rows) >= ARROW_BATCH_ROWS:
                    yield bus_batch(rows)
                    rows = []
        if rows:
            yield bus_batch(rows)
