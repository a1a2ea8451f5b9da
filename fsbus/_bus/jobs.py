"""The engine's two ways of getting work done: batches of file operations in a worker
thread (:class:`Batcher`), and handler jobs for its pool of worker tasks (:class:`JobQueue`).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread

from .._errors import ClosedError

__all__ = ["Batcher", "HandOff", "Job", "JobQueue"]

T = TypeVar("T")
R = TypeVar("R")

Job = tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]
"""A handler job: an async function and its arguments."""


class HandOff(Generic[T]):
    """Items waiting on the loop for a worker-thread hop, taken a batch at a time."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._wake = anyio.Event()

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: T) -> None:
        self.items.append(item)
        self._wake.set()

    async def take(self, limit: int) -> list[T]:
        """The next batch of at most ``limit`` items, once there is one."""
        while not self.items:
            await self._wake.wait()
            self._wake = anyio.Event()
        batch, self.items = self.items[:limit], self.items[limit:]
        return batch

    def put_back(self, batch: list[T]) -> None:
        """Return a batch that did not run to the front of the line."""
        self.items[:0] = batch

    def drain(self) -> list[T]:
        """Remove and return every item still waiting."""
        items, self.items = self.items, []
        return items


@dataclass
class _Slot(Generic[T, R]):
    item: T
    event: anyio.Event | None = None  # set when done (submit); None for post
    result: R | BaseException | None = None
    done: Callable[[R | BaseException], None] | None = None  # called when done (post)


class Batcher(Generic[T, R]):
    """Runs ``fn(items)`` in a worker thread for everything submitted meanwhile.

    ``runner``, if given, runs each batch instead (``runner(fn, items)``): the engine's
    runs it inline on the loop while the mount is fast. It must not abandon a batch it
    has started, as ``to_thread.run_sync(..., abandon_on_cancel=False)`` does not.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], list[R | BaseException]],
        limit: int,
        runner: Callable[
            [Callable[[list[T]], list[R | BaseException]], list[T]],
            Awaitable[list[R | BaseException]],
        ]
        | None = None,
    ) -> None:
        self._fn = fn
        self._limit = limit
        self._runner = runner
        self._queue: HandOff[_Slot[T, R]] = HandOff()
        self._closed = False

    async def submit(self, item: T) -> R:
        if self._closed:
            raise ClosedError("the bus is closed; open a new Bus to publish")
        slot: _Slot[T, R] = _Slot(item, anyio.Event())
        self._queue.put(slot)
        assert slot.event is not None
        await slot.event.wait()
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result  # type: ignore[return-value]

    def post(self, item: T, done: Callable[[R | BaseException], None]) -> None:
        """Queue ``item`` without waiting; ``done(result)`` runs on the loop after its batch.

        Posted items still queued when the batcher stops are run then, not dropped.
        """
        if self._closed:
            raise ClosedError("the bus is closed")
        self._queue.put(_Slot(item, done=done))

    async def run(self) -> None:
        try:
            while True:
                batch = await self._queue.take(self._limit)
                items = [s.item for s in batch]
                try:
                    if self._runner is not None:
                        results = await self._runner(self._fn, items)
                    else:
                        results = await anyio.to_thread.run_sync(
                            self._fn, items, abandon_on_cancel=False
                        )
                except BaseException:
                    # Cancelled before the batch ran (run_sync checkpoints first): hand
                    # it back so the finally below answers its submitters.
                    self._queue.put_back(batch)
                    raise
                for s, r in zip(batch, results, strict=True):
                    if s.done is not None:
                        s.done(r)
                    else:
                        assert s.event is not None
                        s.result = r
                        s.event.set()
        finally:
            self._closed = True
            queued = self._queue.drain()
            posted = [s for s in queued if s.done is not None]
            for s in queued:
                if s.event is not None:
                    s.result = ClosedError("the bus closed before this operation ran")
                    s.event.set()
            if posted:
                with anyio.CancelScope(shield=True):
                    results = await anyio.to_thread.run_sync(
                        self._fn, [s.item for s in posted], abandon_on_cancel=False
                    )
                for s, r in zip(posted, results, strict=True):
                    assert s.done is not None
                    s.done(r)


class JobQueue:
    """Handler jobs for the pool of worker tasks: a deque, and one Event per idle worker.

    Cheaper than a memory object stream, whose every receive makes a checkpoint, an
    Event and a task lookup: here a busy worker takes the next job with a ``popleft``.
    Workers are woken one at a time: a job wakes an idle worker only when none is on its
    way already, and a worker that takes a job and sees more behind it wakes the next
    (which takes one if this one's handler waits). Waking one per job, a burst of
    handlers that never wait was run by the first worker woken, and every other one woke
    to an empty queue and went back to sleep on a new Event. At most
    ``handler_concurrency`` jobs are queued (the engine's slots bound them), so a worker
    that takes job after job without yielding returns to the loop soon.

    Workers are started as jobs need them, up to the limit given to :meth:`start`, and
    then stay: a bus whose handlers never run more than a few at a time has a few
    tasks, not ``handler_concurrency`` of them (an AMQP gateway's 256 per bus were a
    tenth of its start-up).
    """

    def __init__(self) -> None:
        self._jobs: collections.deque[Job] = collections.deque()
        self._idle: collections.deque[anyio.Event] = collections.deque()
        self._tg: anyio.abc.TaskGroup | None = None
        self._limit = 0
        self.workers = 0
        """Worker tasks started so far (at most the limit)."""
        self._waking = 0
        """Workers woken (or started) that have not taken up the queue yet."""

    def start(self, tg: anyio.abc.TaskGroup, limit: int) -> None:
        """Run workers in ``tg``, at most ``limit`` of them; jobs queued before now start."""
        self._tg = tg
        self._limit = limit
        if self._jobs and not self._waking:
            self._wake_one()

    def _wake_one(self) -> None:
        """Wake an idle worker, or start one if none is idle and the limit allows."""
        if self._idle:
            self._waking += 1
            self._idle.popleft().set()
        elif self.workers < self._limit:
            assert self._tg is not None
            self._waking += 1
            self.workers += 1
            self._tg.start_soon(self.work)

    def put(self, job: Job) -> None:
        self._jobs.append(job)
        if not self._waking:
            self._wake_one()

    def take_all(self) -> list[Job]:
        """Remove and return every job not started (when closing)."""
        jobs = list(self._jobs)
        self._jobs.clear()
        return jobs

    async def work(self) -> None:
        """Run jobs one after another, for ever (a worker task; cancelled at close)."""
        jobs = self._jobs
        self._waking -= 1  # started: it was counted as on its way
        while True:
            if jobs:
                fn, args = jobs.popleft()
                if jobs and not self._waking:
                    self._wake_one()  # for the next job, should this one's handler wait
                await fn(*args)
                continue
            wake = anyio.Event()
            self._idle.append(wake)
            try:
                await wake.wait()
            except BaseException:
                if wake.is_set():
                    self._waking -= 1
                else:  # cancelled while idle (the bus is closing)
                    self._idle.remove(wake)
                raise
            self._waking -= 1
