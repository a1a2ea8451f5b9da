"""The one error tree of fsbus.

Every exception fsbus raises on purpose derives from :class:`FsBusError`::

    FsBusError
    ├── UsageError                 the caller asked for something invalid (raised before any I/O)
    │   ├── InvalidTopic           a topic breaks the topic rules
    │   ├── InvalidPattern         a subscription pattern breaks the pattern rules
    │   ├── InvalidHeader          a header name or value is not allowed
    │   ├── InvalidConfig          a configuration value is out of range
    │   └── PayloadTooLarge        a payload exceeds ``max_payload_size``
    ├── ClosedError                the object was closed by its owner (not broken)
    ├── WouldBlock                 a ``*_nowait`` call could not proceed at once
    ├── StorageError               the filesystem failed under us (``__cause__`` is the OSError)
    │   ├── DiskFull               ENOSPC / EDQUOT
    │   ├── StoragePermissionError EACCES / EPERM / EROFS
    │   └── LockingUnsupported     flock does not exclude across this mount
    ├── CorruptDataError           a file's bytes fail their checksum or framing
    └── StreamError                stream-level problems
        ├── StreamNotFound         no stream of that name
        └── OffsetOutOfRange       the offset is before the start or after the end

Usage errors also derive from :class:`ValueError`, so code written against plain
Python conventions keeps working. Storage errors deliberately do not derive from
:class:`OSError`: callers catch ``FsBusError`` and find the ``OSError`` in
``__cause__`` and the path in :attr:`StorageError.path`.
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "ClosedError",
    "CorruptDataError",
    "DiskFull",
    "FsBusError",
    "InvalidConfig",
    "InvalidHeader",
    "InvalidPattern",
    "InvalidTopic",
    "LockingUnsupported",
    "OffsetOutOfRange",
    "PayloadTooLarge",
    "QueueError",
    "QueueFull",
    "QueueMismatch",
    "QueueNotFound",
    "StorageError",
    "StoragePermissionError",
    "StreamError",
    "StreamNotFound",
    "UsageError",
    "WouldBlock",
    "storage_error",
]


class FsBusError(Exception):
    """Root of every error fsbus raises on purpose."""


class UsageError(FsBusError, ValueError):
    """The caller asked for something invalid; nothing was written."""


class InvalidTopic(UsageError):
    """A topic breaks the topic rules (the message says which rule)."""


class InvalidPattern(UsageError):
    """A subscription pattern breaks the pattern rules."""


class InvalidHeader(UsageError):
    """A header name or value is not allowed."""


class InvalidConfig(UsageError):
    """A configuration value is out of range or inconsistent."""


class PayloadTooLarge(UsageError):
    """A payload is larger than the configured ``max_payload_size``."""


class ClosedError(FsBusError):
    """The bus, subscription or stream was closed by its owner."""


class WouldBlock(FsBusError):
    """A ``*_nowait`` operation could not complete without waiting."""


class StorageError(FsBusError):
    """The filesystem failed under us.

    ``path`` names the file or directory involved; ``__cause__`` is the original
    :class:`OSError`.
    """

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.path = os.fspath(path) if path is not None else None


class DiskFull(StorageError):
    """No space (or quota) left on the filesystem holding the bus."""


class StoragePermissionError(StorageError):
    """Permission denied, or the filesystem is read-only."""


class LockingUnsupported(StorageError):
    """``flock`` does not exclude other hosts on this mount (e.g. sshfs)."""


class CorruptDataError(FsBusError):
    """Bytes on disk fail their checksum or framing."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.path = os.fspath(path) if path is not None else None


class StreamError(FsBusError):
    """A stream-level problem."""


class StreamNotFound(StreamError):
    """No stream of that name exists under the root."""


class OffsetOutOfRange(StreamError):
    """An offset lies before the stream's start or after its end."""


class QueueError(FsBusError):
    """A durable-queue problem."""


class QueueNotFound(QueueError, LookupError):
    """No queue of that name is declared on the bus."""


class QueueMismatch(QueueError):
    """A queue exists with other options, or is not unused/empty as asked."""


class QueueFull(QueueError):
    """A queue with ``overflow="reject-publish"`` is at its ``max_length``."""


_HINTS = {
    errno.ENOSPC: (DiskFull, "the filesystem is full; free space or move the bus, then retry"),
    errno.EDQUOT: (DiskFull, "the disk quota is exhausted; free space, then retry"),
    errno.EACCES: (
        StoragePermissionError,
        "permission denied; check the owner and mode of the bus directory",
    ),
    errno.EPERM: (
        StoragePermissionError,
        "operation not permitted; check the owner and mode of the bus directory",
    ),
    errno.EROFS: (
        StoragePermissionError,
        "the filesystem is read-only; remount it read-write or use another root",
    ),
    errno.EMFILE: (
        StorageError,
        "this process has too many open files; raise `ulimit -n` or close other files",
    ),
    errno.ENFILE: (StorageError, "the system has too many open files"),
    errno.EMLINK: (
        StorageError,
        "fsbus never hard-links its files, so someone linked another file in here; "
        "remove this name (the file it links to is left untouched)",
    ),
    errno.ENOTDIR: (
        StorageError,
        "a file stands where a directory should be; point the bus at a directory",
    ),
}


def storage_error(
    what: str, exc: OSError, path: str | os.PathLike[str] | None = None
) -> StorageError:
    """Turn an OSError into the matching StorageError with a helpful message.

    ``what`` says what fsbus was doing ("publish to 'a.b'"); the caller raises the
    result ``from exc``.
    """
    p = path if path is not None else exc.filename
    cls, hint = _HINTS.get(exc.errno or 0, (StorageError, "see the cause for details"))
    where = f" at {os.fspath(p)!s}" if p is not None else ""
    return cls(f"{what} failed{where}: {exc.strerror or exc}; {hint}", p)
