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
    StorageError,
    StoragePermissionError,
    StreamError,
    StreamNotFound,
    UsageError,
    WouldBlock,
)

if _typing.TYPE_CHECKING:
    from ._bus import Bus, Handler, MessageIterator, Subscription
    from ._config import BusConfig
    from ._doctor import DoctorCheck, DoctorReport, check_directory
    from ._fs import probe_locking
    from ._message import BusStatistics, Message, MessageInfo, PublishInfo
    from ._stream import SegmentInfo, Stream, StreamInfo, list_streams
    from ._stream_async import AsyncConsumerGroup, AsyncStream
    from ._stream_config import StreamConfig
    from ._stream_format import ColumnBatch, Record, RecordIn
    from ._stream_groups import ConsumerGroup, GroupInfo
    from ._stream_maint import CompactionReport, RetentionReport
    from ._stream_queue import QueueEmpty, StreamQueue
    from ._stream_writer import RecoveryInfo
    from ._sync import BlockingBus, BlockingMessages
    from ._trie import TopicTrie

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
    "QueueEmpty",
    "Record",
    "RecordIn",
    "RecoveryInfo",
    "RetentionReport",
    "SegmentInfo",
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
)

# Everything but the errors is imported on first use (PEP 562), so ``import fsbus`` and the
# modules that need only a part of it (a Spark worker reading a Stream never starts the
# Bus's event loop machinery) stay cheap to import.
_LAZY = {
    "AsyncConsumerGroup": "._stream_async",
    "AsyncStream": "._stream_async",
    "BlockingBus": "._sync",
    "BlockingMessages": "._sync",
    "Bus": "._bus",
    "BusConfig": "._config",
    "BusStatistics": "._message",
    "ColumnBatch": "._stream_format",
    "CompactionReport": "._stream_maint",
    "ConsumerGroup": "._stream_groups",
    "DoctorCheck": "._doctor",
    "DoctorReport": "._doctor",
    "GroupInfo": "._stream_groups",
    "Handler": "._bus",
    "Message": "._message",
    "MessageInfo": "._message",
    "MessageIterator": "._bus",
    "PublishInfo": "._message",
    "QueueEmpty": "._stream_queue",
    "Record": "._stream_format",
    "RecordIn": "._stream_format",
    "RecoveryInfo": "._stream_writer",
    "RetentionReport": "._stream_maint",
    "SegmentInfo": "._stream",
    "Stream": "._stream",
    "StreamConfig": "._stream_config",
    "StreamInfo": "._stream",
    "StreamQueue": "._stream_queue",
    "Subscription": "._bus",
    "TopicTrie": "._trie",
    "check_directory": "._doctor",
    "list_streams": "._stream",
    "probe_locking": "._fs",
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
