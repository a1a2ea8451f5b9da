"""fsbus: a message bus in a directory.

Topic pub/sub, work queues and replayable streams over a local or shared
filesystem, with no broker process. On-disk compatible with qlobber-fsq 14.
"""

from __future__ import annotations

from ._bus import Bus, Handler, MessageIterator, Subscription
from ._config import BusConfig
from ._doctor import DoctorCheck, DoctorReport, check_directory
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
