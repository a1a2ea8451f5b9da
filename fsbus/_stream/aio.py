"""AsyncStream: the async face of a stream, with follow mode (tail).

Built on the blocking :class:`~fsbus.Stream` (one implementation): every call that
touches the disk runs in a worker thread through ``anyio.to_thread``, and reads move
records in batches so the thread hop is paid once per batch, not per record.

Follow mode wakes on appends through inotify (watchdog) on the stream directory, and
polls every ``poll_interval`` as well, because on network filesystems inotify sees
only the appends made on this host. ``force_polling`` (``FSBUS_FORCE_POLLING=1``)
turns inotify off.
"""

from __future__ import annotations

import itertools
import os
from array import array
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

import anyio
import anyio.to_thread

from .._core.watch import Waker
from .._errors import ClosedError, UsageError
from .framing import ColumnBatch, Record, RecordIn
from .groups import ConsumerGroup, GroupInfo
from .log import Stream, StreamInfo
from .maint import CompactionReport, RetentionReport
from .staged import ADOPT_BYTES, SegmentStager, StagedSegment
from .writer import RecoveryInfo

if TYPE_CHECKING:
    from .config import StreamConfig

__all__ = ["AsyncConsumerGroup", "AsyncStream"]

READ_BATCH = 10_000
COLUMN_BATCHES = 16
"""Column batches (frames, about ``max_frame_bytes`` each) moved per thread hop."""

_T = TypeVar("_T")


class AsyncStream:
    """A stream for async code (anyio on asyncio or trio).

    Open with ``await AsyncStream.open(root, name)`` or ``async with
    AsyncStream(root, name) as s``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str,
        *,
        config: StreamConfig | None = None,
        create: bool = True,
    ) -> None:
        self._args = (root, name, config, create)
        self._stream: Stream | None = None

    @classmethod
    async def open(
        cls,
        root: str | os.PathLike[str],
        name: str,
        *,
        config: StreamConfig | None = None,
        create: bool = True,
    ) -> AsyncStream:
        """Open stream ``name`` under ``root`` (see :meth:`Stream.open <fsbus.Stream.open>`)."""
        self = cls(root, name, config=config, create=create)
        await self._ensure()
        return self

    async def _ensure(self) -> Stream:
        if self._stream is None:
            root, name, config, create = self._args
            self._stream = await anyio.to_thread.run_sync(
                lambda: Stream.open(root, name, config=config, create=create)
            )
        return self._stream

    @property
    def stream(self) -> Stream:
        """The blocking :class:`~fsbus.Stream` underneath."""
        if self._stream is None:
            raise UsageError("the AsyncStream is not open yet: await open() or use async with")
        return self._stream

    @property
    def name(self) -> str:
        """The stream's name."""
        return str(self._args[1])

    async def __aenter__(self) -> Self:
        await self._ensure()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the handle (idempotent)."""
        if self._stream is not None:
            self._stream.close()

    # --- appending -----------------------------------------------------------------------

    async def append(
        self,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        timestamp: float | None = None,
    ) -> int:
        """Append one record; return its offset."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(
            lambda: s.append(value, key=key, headers=headers, timestamp=timestamp)
        )

    async def append_batch(self, records: Iterable[bytes | str | RecordIn]) -> range:
        """Append many records under one hold of the append lock."""
        s = await self._ensure()
        items = list(records)
        return await anyio.to_thread.run_sync(s.append_batch, items)

    async def append_values(
        self,
        data: bytes | bytearray | memoryview,
        lengths: Sequence[int] | array[int],
        *,
        first_headers: Mapping[str, str] | None = None,
    ) -> range:
        """See :meth:`Stream.append_values <fsbus.Stream.append_values>`. Do not change
        ``data`` until this returns: the append reads it in a worker thread."""
        return await self.append_value_chunks(((data, lengths),), first_headers=first_headers)

    async def append_value_chunks(
        self,
        chunks: Iterable[tuple[bytes | bytearray | memoryview, Sequence[int] | array[int]]],
        *,
        first_headers: Mapping[str, str] | None = None,
    ) -> range:
        """See :meth:`Stream.append_value_chunks <fsbus.Stream.append_value_chunks>`; the
        buffers are read in a worker thread, as for :meth:`append_values`."""
        s = await self._ensure()
        pairs = list(chunks)
        return await anyio.to_thread.run_sync(
            lambda: s.append_value_chunks(pairs, first_headers=first_headers)
        )

    async def stager(
        self, prefix: str, *, durable: bool | None = None, frame_bytes: int | None = None
    ) -> SegmentStager:
        """See :meth:`Stream.stager <fsbus.Stream.stager>`. The stager is blocking: call
        its methods in a worker thread (``anyio.to_thread.run_sync``) from a loop."""
        s = await self._ensure()
        return s.stager(prefix, durable=durable, frame_bytes=frame_bytes)

    async def append_staged(
        self,
        segments: Iterable[StagedSegment | str | os.PathLike[str]],
        *,
        copy_below: int = ADOPT_BYTES,
    ) -> range:
        """See :meth:`Stream.append_staged <fsbus.Stream.append_staged>`."""
        s = await self._ensure()
        items = list(segments)
        return await anyio.to_thread.run_sync(lambda: s.append_staged(items, copy_below=copy_below))

    async def staged(self, prefix: str = "") -> list[str]:
        """See :meth:`Stream.staged <fsbus.Stream.staged>`."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.staged, prefix)

    async def remove_staged(self, paths: Iterable[str | os.PathLike[str]]) -> int:
        """See :meth:`Stream.remove_staged <fsbus.Stream.remove_staged>`."""
        s = await self._ensure()
        items = list(paths)
        return await anyio.to_thread.run_sync(s.remove_staged, items)

    async def recover(self) -> tuple[RecoveryInfo, ...]:
        """See :meth:`Stream.recover <fsbus.Stream.recover>`."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.recover)

    # --- offsets -------------------------------------------------------------------------

    async def start_offset(self) -> int:
        """The oldest offset kept."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(lambda: s.start_offset)

    async def end_offset(self) -> int:
        """The next offset to be written."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(lambda: s.end_offset)

    async def locked_end_offset(self) -> int:
        """See :meth:`Stream.locked_end_offset <fsbus.Stream.locked_end_offset>`."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.locked_end_offset)

    @property
    def seen_end(self) -> int:
        """See :attr:`Stream.seen_end <fsbus.Stream.seen_end>`."""
        return self.stream.seen_end

    async def offset_for_time(self, ts: float) -> int:
        """The first offset whose timestamp is >= ``ts``."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.offset_for_time, ts)

    async def info(self) -> StreamInfo:
        """Segments, sizes and offsets."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.info)

    async def enforce_retention(self) -> RetentionReport:
        """See :meth:`Stream.enforce_retention <fsbus.Stream.enforce_retention>`."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.enforce_retention)

    async def compact(self) -> CompactionReport:
        """See :meth:`Stream.compact <fsbus.Stream.compact>`."""
        s = await self._ensure()
        return await anyio.to_thread.run_sync(s.compact)

    # --- reading -------------------------------------------------------------------------

    async def _fetch(self, start: int, stop: int | None, limit: int) -> list[Record]:
        s = await self._ensure()
        return await anyio.to_thread.run_sync(lambda: list(s.read(start, stop, max_records=limit)))

    async def read(
        self, start: int = 0, stop: int | None = None, *, max_records: int | None = None
    ) -> AsyncIterator[Record]:
        """Records in [start, stop) up to the current end of the stream."""
        left = max_records
        off = start
        while left is None or left > 0:
            batch = await self._fetch(
                off, stop, READ_BATCH if left is None else min(left, READ_BATCH)
            )
            if not batch:
                return
            for r in batch:
                yield r
            off = batch[-1].offset + 1
            if left is not None:
                left -= len(batch)

    async def read_columns(
        self, start: int = 0, stop: int | None = None, *, max_records: int | None = None
    ) -> AsyncIterator[ColumnBatch]:
        """See :meth:`Stream.read_columns <fsbus.Stream.read_columns>`; batches move
        from the worker thread a few at a time."""
        s = await self._ensure()
        batches = await anyio.to_thread.run_sync(
            lambda: s.read_columns(start, stop, max_records=max_records)
        )
        async for batch in _pulled(batches, COLUMN_BATCHES):
            yield batch

    async def read_through(self, start: int, stop: int) -> AsyncIterator[Record]:
        """See :meth:`Stream.read_through <fsbus.Stream.read_through>`. Its pauses while
        this host's view lags (about 5 s at most in all) are spent in a worker thread."""
        s = await self._ensure()
        async for record in _pulled(s.read_through(start, stop), READ_BATCH):
            yield record

    def follow(self, start: int | None = None, *, stop: int | None = None) -> Follower:
        """Records from ``start`` (default: the end at entry) on, waiting for new ones::

            async with stream.follow(start=0) as records:
                async for record in records:
                    ...

        Iteration ends only at ``stop`` (if given); leaving the block stops the watch.
        """
        return Follower(self, start, stop)

    # --- groups --------------------------------------------------------------------------

    async def group(
        self, name: str, *, consumer: str | None = None, start: str | int = "earliest"
    ) -> AsyncConsumerGroup:
        """Join consumer group ``name`` (see :meth:`Stream.group <fsbus.Stream.group>`)."""
        s = await self._ensure()
        g = await anyio.to_thread.run_sync(lambda: s.group(name, consumer=consumer, start=start))
        return AsyncConsumerGroup(g)

    async def groups(self) -> list[str]:
        """Names of this stream's consumer groups."""
        return await self._call(lambda s: s.groups())

    async def group_info(self, name: str) -> GroupInfo:
        """See :meth:`Stream.group_info <fsbus.Stream.group_info>`."""
        return await self._call(lambda s: s.group_info(name))

    async def reset_group(self, name: str, to: str | int) -> dict[int, int]:
        """See :meth:`Stream.reset_group <fsbus.Stream.reset_group>`."""
        return await self._call(lambda s: s.reset_group(name, to))

    async def delete_group(self, name: str) -> None:
        """See :meth:`Stream.delete_group <fsbus.Stream.delete_group>`."""
        await self._call(lambda s: s.delete_group(name))

    async def _call(self, fn: Callable[[Stream], _T]) -> _T:
        s = await self._ensure()
        return await anyio.to_thread.run_sync(lambda: fn(s))


async def _pulled(items: Iterator[_T], per_hop: int) -> AsyncIterator[_T]:
    """The items of a blocking iterator, ``per_hop`` of them taken per worker-thread hop.

    An error the iterator raises is raised after the items it gave before it."""

    def take() -> tuple[list[_T], Exception | None]:
        chunk: list[_T] = []
        try:
            chunk.extend(itertools.islice(items, per_hop))
        except Exception as exc:
            return chunk, exc
        return chunk, None

    while True:
        chunk, error = await anyio.to_thread.run_sync(take)
        for item in chunk:
            yield item
        if error is not None:
            raise error
        if not chunk:
            return


@asynccontextmanager
async def watching(path: str, *, use_inotify: bool) -> AsyncIterator[Waker]:
    """A :class:`Waker` on ``path`` for the duration of the block.

    The waker reads inotify on the event loop when it can (then it needs a task, which
    this block owns) and falls back to a watcher thread otherwise.
    """
    waker = Waker(path, use_inotify=use_inotify)
    try:
        async with anyio.create_task_group() as tg:
            if waker.start():
                tg.start_soon(waker.run)
            try:
                yield waker
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(waker.stop)


class Follower:
    """The async iterator of :meth:`AsyncStream.follow`; an async context manager."""

    def __init__(self, stream: AsyncStream, start: int | None, stop: int | None) -> None:
        self._astream = stream
        self._off = start
        self._stop = stop
        self._waker: Waker | None = None
        self._exit = AsyncExitStack()
        self._batch: list[Record] = []
        self._i = 0

    @property
    def position(self) -> int | None:
        """The offset of the next record this follower yields."""
        return self._off

    async def __aenter__(self) -> Self:
        s = await self._astream._ensure()
        if self._off is None:
            self._off = await self._astream.end_offset()
        self._waker = await self._exit.enter_async_context(
            watching(str(s.path), use_inotify=not s.config.force_polling)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._waker = None
        await self._exit.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Record:
        if self._waker is None or self._off is None:
            raise UsageError("use the follower inside `async with stream.follow(...) as it`")
        s = self._astream.stream
        while self._i >= len(self._batch):
            if self._stop is not None and self._off >= self._stop:
                raise StopAsyncIteration
            if s.closed:
                raise ClosedError(f"stream {s.name!r} handle is closed")
            self._batch = await self._astream._fetch(self._off, self._stop, READ_BATCH)
            self._i = 0
            if not self._batch:
                await self._waker.wait(s.config.poll_interval)
        r = self._batch[self._i]
        self._i += 1
        self._off = r.offset + 1
        return r


class AsyncConsumerGroup:
    """One consumer of a consumer group, for async code."""

    def __init__(self, group: ConsumerGroup) -> None:
        self._group = group

    @property
    def group(self) -> ConsumerGroup:
        """The blocking :class:`~fsbus.ConsumerGroup` underneath."""
        return self._group

    async def poll(self, *, max_records: int = 500, timeout: float = 0.0) -> list[Record]:  # noqa: ASYNC109
        """Up to ``max_records`` records of this consumer's partitions; waits up to
        ``timeout`` seconds for some, woken by appends."""
        g = self._group
        cfg = g._stream.config
        recs = await anyio.to_thread.run_sync(lambda: g.poll(max_records=max_records))
        if recs or timeout <= 0:
            return recs
        with anyio.move_on_after(timeout):
            async with watching(str(g._stream.path), use_inotify=not cfg.force_polling) as w:
                while True:
                    recs = await anyio.to_thread.run_sync(lambda: g.poll(max_records=max_records))
                    if recs:
                        return recs
                    await w.wait(cfg.poll_interval)
        return []

    async def commit(self) -> dict[int, int]:
        """Commit every record polled so far."""
        return await anyio.to_thread.run_sync(self._group.commit)

    async def aclose(self) -> None:
        """Leave the group (uncommitted records will be delivered again)."""
        await anyio.to_thread.run_sync(self._group.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
