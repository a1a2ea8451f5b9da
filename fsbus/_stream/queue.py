"""StreamQueue: a persistent work queue (put / get / task_done) on a stream and a group.

For users of persist-queue, cockburst or ``queue.Queue``: items are appended to a
stream; consumers share them through one consumer group; :meth:`StreamQueue.task_done`
acknowledges the oldest item handed out and not yet acknowledged (the stdlib rule), and
commits. Items handed out but never acknowledged are handed out again after a crash or
a restart: at-least-once.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Self

from .._errors import UsageError, WouldBlock
from .framing import Record, RecordIn
from .groups import ConsumerGroup, partition_of
from .log import Stream

if TYPE_CHECKING:
    from .config import StreamConfig

__all__ = ["QueueEmpty", "StreamQueue"]

FETCH = 256


class QueueEmpty(WouldBlock, queue.Empty, TimeoutError):
    """No item within the timeout (or at once, for ``get_nowait``).

    Also a :class:`queue.Empty` and a :class:`TimeoutError`, so code written for
    ``queue.Queue`` or for fsbus's blocking bus catches it unchanged.
    """


class StreamQueue:
    """A persistent FIFO work queue shared by processes (and threads).

    ``StreamQueue(root, "jobs")`` uses stream ``jobs`` and consumer group ``queue``;
    several processes opening the same queue share its items, each item going to one
    of them. ``commit_every`` acknowledgements are grouped in one commit (a crash
    redelivers at most that many done items).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str,
        *,
        group: str = "queue",
        consumer: str | None = None,
        config: StreamConfig | None = None,
        commit_every: int = 1,
    ) -> None:
        if commit_every < 1:
            raise UsageError(f"commit_every must be >= 1, got {commit_every}")
        self._stream = Stream.open(root, name, config=config)
        self._group_name = group
        self._consumer = consumer
        self._group: ConsumerGroup | None = None
        self._commit_every = commit_every
        self._buffer: deque[Record] = deque()
        self._outstanding: deque[int] = deque()
        self._last_done: int | None = None
        self._done_since_commit = 0
        self._lock = threading.RLock()  # the group, the buffer and the bookkeeping
        self._get_lock = threading.Lock()

    @property
    def stream(self) -> Stream:
        """The stream holding the items."""
        return self._stream

    # --- producing -----------------------------------------------------------------------

    def put(self, item: bytes | str, *, key: bytes | str | None = None) -> int:
        """Add an item; return its offset (durable as ``config.durability`` says)."""
        return self._stream.append(item, key=key)

    def put_many(self, items: Iterable[bytes | str | RecordIn]) -> range:
        """Add many items under one lock hold and one sync."""
        return self._stream.append_batch(items)

    # --- consuming -----------------------------------------------------------------------

    def get(self, block: bool = True, timeout: float | None = None) -> bytes:
        """The next item; waits up to ``timeout`` seconds (forever if None) unless
        ``block`` is false. Raises :class:`QueueEmpty` when there is none."""
        return self.get_record(block, timeout).value

    def get_nowait(self) -> bytes:
        """The next item if there is one now, else raise :class:`QueueEmpty`."""
        return self.get(block=False)

    def get_record(self, block: bool = True, timeout: float | None = None) -> Record:
        """Like :meth:`get`, returning the whole :class:`~fsbus.Record`."""
        if timeout is not None and timeout < 0:
            raise UsageError(f"timeout must be >= 0 or None, got {timeout!r}")
        ops = self._stream._ops
        deadline = None if timeout is None else ops.monotonic() + timeout
        with self._get_lock:  # one getter at a time; task_done() need not wait for it
            while True:
                with self._lock:
                    if not self._buffer:
                        group = self._get_group()
                        self._buffer.extend(group.poll(max_records=FETCH))
                        self._keep_owned()
                    if self._buffer:
                        rec = self._buffer.popleft()
                        self._outstanding.append(rec.offset)
                        return rec
                left = None if deadline is None else deadline - ops.monotonic()
                if not block or (left is not None and left <= 0):
                    raise QueueEmpty(
                        f"queue {self._stream.name!r} has no item"
                        + ("" if not block else f" after {timeout} s")
                    )
                wait = self._stream.config.poll_interval
                ops.sleep(wait if left is None else min(wait, left))

    def task_done(self) -> None:
        """Acknowledge the oldest item handed out and not yet acknowledged."""
        with self._lock:
            if not self._outstanding:
                raise UsageError("task_done() called more times than get()")
            self._last_done = self._outstanding.popleft()
            self._done_since_commit += 1
            if self._done_since_commit >= self._commit_every:
                self._commit()

    ack = task_done

    def qsize(self) -> int:
        """Items not yet handed out (exact for a sole consumer, an estimate otherwise)."""
        with self._lock:
            group = self._get_group()
            end = self._stream.end_offset
            pos = group.positions
            nxt = min(pos.values()) if pos else min(group.committed().values())
            return len(self._buffer) + max(end - nxt, 0)

    def empty(self) -> bool:
        """Whether :meth:`qsize` is 0."""
        return self.qsize() == 0

    def unfinished(self) -> int:
        """Items handed out and not yet acknowledged."""
        return len(self._outstanding)

    def close(self) -> None:
        """Commit what was acknowledged, leave the group, close the stream.

        Items handed out but not acknowledged go back to the queue.
        """
        with self._lock:
            if self._group is not None:
                if self._done_since_commit:
                    self._commit()
                self._group.close()
                self._group = None
            self._buffer.clear()
            self._outstanding.clear()
            self._stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------

    def _get_group(self) -> ConsumerGroup:
        if self._group is None:
            self._group = self._stream.group(self._group_name, consumer=self._consumer)
        return self._group

    def _commit(self) -> None:
        group = self._get_group()
        if self._last_done is not None:
            # Give partitions away only when nothing of ours is in flight.
            group.commit(through=self._last_done, release=not self._outstanding)
        self._done_since_commit = 0
        self._keep_owned()

    def _keep_owned(self) -> None:
        """Drop buffered items of partitions this consumer no longer holds."""
        group = self._group
        if group is None or not self._buffer:
            return
        held = group.assignment
        parts = group.partitions
        if len(held) < parts:
            self._buffer = deque(r for r in self._buffer if partition_of(r, parts) in held)
