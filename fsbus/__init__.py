"""fsbus: a message bus in a directory.

Topic pub/sub, work queues and replayable streams over a local or shared
filesystem, with no broker process. On-disk compatible with qlobber-fsq 14.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._errors import (
    ClosedError,
    CorruptDataError,
    DiskFull,
    FsBusError,
    InvalidConfig,
    InvalidHeader,
    InvalidPattern,
    InvalidTopic,
    LockingUnsupported,
    OffsetOutOfRange,
    PayloadTooLarge,
    QueueError,
    QueueFull,
    QueueMismatch,
    QueueNotFound,
    StorageError,
    StoragePermissionError,
    StreamError,
    StreamNotFound,
    UsageError,
    WouldBlock,
)

if _typing.TYPE_CHECKING:
    from ._bus.blocking import BlockingBus, BlockingMessages
    from ._bus.doctor import DoctorCheck, DoctorReport, check_directory
    from ._bus.engine import Bus, Handler, Subscription
    from ._bus.fs import probe_locking
    from ._bus.iterator import Decline, MessageIterator, Requeue
    from ._bus.message import BusStatistics, Message, MessageInfo, PublishInfo, PurgeReport
    from ._config import BusConfig
    from ._core.trie import TopicTrie
    from ._queues.definition import QueueInfo, QueueOptions
    from ._stream.aio import AsyncConsumerGroup, AsyncStream
    from ._stream.config import StreamConfig
    from ._stream.framing import ColumnBatch, Record, RecordIn
    from ._stream.groups import ConsumerGroup, GroupInfo
    from ._stream.log import SegmentInfo, Stream, StreamInfo, list_streams
    from ._stream.maint import CompactionReport, RetentionReport
    from ._stream.queue import QueueEmpty, StreamQueue
    from ._stream.staged import SegmentStager, StagedSegment, read_staged_columns
    from ._stream.writer import RecoveryInfo

__version__ = "0.1.0"

__all__ = (
    "AsyncConsumerGroup",
    "AsyncStream",
    "BlockingBus",
    "BlockingMessages",
    "Bus",
    "BusConfig",
    "BusStatistics",
    "ClosedError",
    "ColumnBatch",
    "CompactionReport",
    "ConsumerGroup",
    "CorruptDataError",
    "Decline",
    "DiskFull",
    "DoctorCheck",
    "DoctorReport",
    "FsBusError",
    "GroupInfo",
    "Handler",
    "InvalidConfig",
    "InvalidHeader",
    "InvalidPattern",
    "InvalidTopic",
    "LockingUnsupported",
    "Message",
    "MessageInfo",
    "MessageIterator",
    "OffsetOutOfRange",
    "PayloadTooLarge",
    "PublishInfo",
    "PurgeReport",
    "QueueEmpty",
    "QueueError",
    "QueueFull",
    "QueueInfo",
    "QueueMismatch",
    "QueueNotFound",
    "QueueOptions",
    "Record",
    "RecordIn",
    "RecoveryInfo",
    "Requeue",
    "RetentionReport",
    "SegmentInfo",
    "SegmentStager",
    "StagedSegment",
    "StorageError",
    "StoragePermissionError",
    "Stream",
    "StreamConfig",
    "StreamError",
    "StreamInfo",
    "StreamNotFound",
    "StreamQueue",
    "Subscription",
    "TopicTrie",
    "UsageError",
    "WouldBlock",
    "__version__",
    "check_directory",
    "list_streams",
    "probe_locking",
    "read_staged_columns",
)

# Everything but the errors is imported on first use (PEP 562), so ``import fsbus`` and the
# modules that need only a part of it (a Spark worker reading a Stream never starts the
# Bus's event loop machinery) stay cheap to import.
_LAZY = {
    "AsyncConsumerGroup": "._stream.aio",
    "AsyncStream": "._stream.aio",
    "BlockingBus": "._bus.blocking",
    "BlockingMessages": "._bus.blocking",
    "Bus": "._bus.engine",
    "BusConfig": "._config",
    "BusStatistics": "._bus.message",
    "ColumnBatch": "._stream.framing",
    "CompactionReport": "._stream.maint",
    "ConsumerGroup": "._stream.groups",
    "Decline": "._bus.iterator",
    "DoctorCheck": "._bus.doctor",
    "DoctorReport": "._bus.doctor",
    "GroupInfo": "._stream.groups",
    "Handler": "._bus.engine",
    "Message": "._bus.message",
    "MessageInfo": "._bus.message",
    "MessageIterator": "._bus.iterator",
    "PublishInfo": "._bus.message",
    "PurgeReport": "._bus.message",
    "QueueEmpty": "._stream.queue",
    "QueueInfo": "._queues.definition",
    "QueueOptions": "._queues.definition",
    "Record": "._stream.framing",
    "RecordIn": "._stream.framing",
    "RecoveryInfo": "._stream.writer",
    "Requeue": "._bus.iterator",
    "RetentionReport": "._stream.maint",
    "SegmentInfo": "._stream.log",
    "SegmentStager": "._stream.staged",
    "StagedSegment": "._stream.staged",
    "Stream": "._stream.log",
    "StreamConfig": "._stream.config",
    "StreamInfo": "._stream.log",
    "StreamQueue": "._stream.queue",
    "Subscription": "._bus.engine",
    "TopicTrie": "._core.trie",
    "check_directory": "._bus.doctor",
    "list_streams": "._stream.log",
    "probe_locking": "._bus.fs",
    "read_staged_columns": "._stream.staged",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsbus' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
