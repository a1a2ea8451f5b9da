"""Where a publish's file operations run: inline on the event loop, or in a worker thread.

A plain publish on a local filesystem is five system calls (create, write, close, rename,
stamp) and takes 15-60 µs; handing it to a worker thread costs more than that (the hop
alone, there and back, is 50-100 µs on asyncio). So :class:`Offload` runs a publish's
file operations **inline**, on the event loop, while they are fast, and moves them to a
worker thread when the mount turns slow, in batches (everything queued meanwhile goes in
one hop):

* Inline, each publish is timed. Two that took more than :data:`SLOW` (the loop was
  blocked that long) within :data:`STRIKE_WINDOW` inline publishes send the following
  publishes to the thread. One alone is taken for a hiccup (the process was preempted,
  a journal commit): on a busy machine one operation in a few dozen is, and each false
  alarm would cost a run of thread hops. A mount that turned slow makes every publish
  slow, so the second comes at once, or after one more.
* Inline work counts towards a budget (:data:`YIELD_AFTER`): once it is spent, the next
  publish first yields to the loop and waits in line for its turn, so a tight
  ``await publish`` loop cannot starve the other tasks, and a cancellation reaches it
  there. The line (one event per waiting task, woken one per turn of the loop by the
  usher task) keeps many publishing tasks from filling the loop's ready queue: a timer
  waits for about one turn of file work, not one per publishing task.
* In the thread, each publish is timed again, in the thread, without the hop. After
  :data:`FAST_RUN` of them in a row each took less than :data:`FAST`, publishing goes back
  inline. A bus starts on the thread path: the first publishes measure the mount before
  any of them runs on the loop.
* The engine's common call (a plain message while publishing is inline) takes
  :meth:`Offload.publish_plain`: the same inline step, without a plan. A publish into
  durable queues (the message and its copies, one file each) takes :meth:`Offload.call`:
  the same rule for the whole of it.
* A subscriber's scan (read UPDATE, list the changed buckets, decide, read the new
  messages) takes the same path through :meth:`Offload.scan`, under the same rule and
  the same counters: a slow scan is a strike like a slow publish, a fast scan in the
  thread counts towards going back inline like a fast publish. A scan of every bucket
  always goes to the thread (its time is not used), and so does one whose buckets to
  list held a big backlog at their last listing: the scan finds that out inline, from
  UPDATE, before it lists anything, and raises :class:`ScanTooBig`, which sends it to
  the thread. Its listing and decisions would hold the loop however fast the mount.
* Consuming takes :meth:`Offload.call` too: a work-queue subscription's claim rounds and
  its batches of acks and releases (a rename or an unlink each; a flock claim fails at
  once rather than wait), and a queue's ``get`` (the queue's record, the listing and
  claim of its head, then the ack or the give-back). A batch is timed per item: twenty
  acks in 0.8 ms are twenty fast operations, not one slow one (timed whole, a consumer
  with a prefetch never met :data:`FAST` and stayed on the thread path, every batch a
  hop there and back with the loop and the thread taking the GIL from each other: a
  quarter of an AMQP consumer's throughput on tmpfs). A batch goes inline only if its
  items, at the cost per item measured inline, fit in :data:`BATCH_BUDGET`; a bigger
  one goes to the thread however fast the mount (its size, not the mount, would hold
  the loop), as does a round of more than ``_INLINE_CLAIMS`` claims or a batch of as
  many acks. A batch that held the loop longer than :data:`SLOW` is a strike; one that
  runs inline stops once it has (:meth:`Offload.batch_seconds`: a claim round hands out
  what it won, a batch of acks leaves the rest for the thread), so a mount that turns
  slow under a run of inline batches holds the loop for one item past SLOW per strike,
  not for a whole batch.
* Some work is never inline: ``durable=True`` publishes (fdatasync and a directory fsync
  take milliseconds by nature; their times are not used for the choice), publishes on a
  filesystem that other hosts share (a network mount can stall for seconds with no
  warning), payloads that are files or async iterables, everything that locks
  (``flock`` may block), and publishes into a queue with a ``max_length`` (keeping it
  to length counts the queue now and then): those keep their worker-thread hops in the
  engine.

What the loop pays when a fast mount turns slow is two publishes (or scans): the first two to meet
the slowness run inline to their end (with a 10 ms filesystem, five operations each:
100 ms in all), and every later one goes to the thread until the mount is fast again.

Why it is safe:

* **All or nothing.** Inline or in the thread, a message is written under a staging name
  and made visible by one rename; a reader never sees half of one.
* **Cancellation.** Inline, nothing can interrupt the five calls; the cancellation is
  delivered at the next checkpoint. A publish cancelled while it waits for, or runs in,
  the thread is withdrawn if its rename has not started: the thread asks (under a lock)
  just before the rename, removes what it staged and raises :class:`~.fs.Withdrawn`,
  which nobody waits for. If the rename has started, the cancelled caller waits
  (shielded) until that message is placed and stamped, then raises. Either way, when a
  cancelled publish raises, its message is whole on the bus or not there at all, and it
  does not appear later.
* **Ordering.** A task's publish returns only once the message is in its bucket, on
  either path, so the publishes of one task land in the order it made them, across
  switches between the paths. Publishes of different tasks in flight at the same time
  have no order (as before).
* **One writer of the state.** The path choice and the counters live on the event loop;
  the thread only fills in each item's result and time, and the loop reads them after
  the hop.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from time import perf_counter
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .._errors import ClosedError
from .fs import BusFS, Withdrawn
from .jobs import HandOff
from .plan import PublishPlan

__all__ = [
    "BATCH_BUDGET",
    "FAST",
    "FAST_RUN",
    "SLOW",
    "STRIKE_WINDOW",
    "YIELD_AFTER",
    "Offload",
    "ScanTooBig",
]

SLOW = 0.002
"""Seconds: an inline publish that blocked the loop longer is a strike against inline."""
STRIKE_WINDOW = 2
"""A second strike within this many inline publishes of the first sends publishing to the
thread. (It was 8: on a machine short of cores, a queue consumer's inline work was
preempted often enough that two strikes among eight came some fifty times in 12,000
messages, each followed by a run of thread hops: a fifth of its work went to the thread,
at a tenth of its CPU.)"""
FAST = 0.0005
"""Seconds: a publish in the thread faster than this counts towards going back inline."""
FAST_RUN = 16
"""Fast publishes in a row, in the thread, after which publishing goes back inline."""
YIELD_AFTER = 0.0005
"""Seconds of inline file work after which the next inline publish yields to the loop first."""
BATCH_BUDGET = SLOW
"""Seconds: a batch of consuming work (claims, acks) runs inline only if its items, at the
cost per item measured inline, fit in this."""
_FIRST_ITEM_COST = 50e-6
"""Seconds per item assumed before any batch has been timed (a claim or an ack on a
local disk)."""
_BATCH = 256
"""Publishes handed to the thread in one hop, at most."""

T = TypeVar("T")


class ScanTooBig(Exception):
    """Raised by a scan's work running inline, before it has changed anything: the
    buckets it is about to list are too big to list on the loop; :meth:`Offload.scan`
    runs it again in the thread."""


class _Item:
    """One publish on the thread path."""

    __slots__ = (
        "cancelled",
        "committing",
        "data",
        "done",
        "event",
        "lock",
        "plan",
        "result",
        "took",
    )

    def __init__(self, plan: PublishPlan, data: bytes, lock: threading.Lock) -> None:
        self.plan = plan
        self.data = data
        self.lock = lock
        self.event = anyio.Event()
        self.result: int | BaseException = ClosedError(
            "the bus closed before this publish ran; nothing was written"
        )
        self.took = -1.0  # seconds its file operations took in the thread; -1: never ran
        self.cancelled = False  # the caller gave up (set on the loop, read by the thread)
        self.committing = False  # the thread passed the point of no return (the rename)
        self.done = False  # the thread finished it

    def go(self) -> bool:
        """In the thread, just before the rename: proceed unless the caller gave up."""
        with self.lock:
            if self.cancelled:
                return False
            self.committing = True
            return True


class Offload:
    """Runs publishes inline while the mount is fast, in a worker thread while it is slow.

    :meth:`run` must run in a task for as long as publishes may come (the bus's task
    group); :meth:`publish` from any task on the same loop.
    """

    def __init__(self, fs: BusFS) -> None:
        self._fs = fs
        self.inline_allowed = True
        """False: every publish goes to the thread (a shared filesystem; set after setup)."""
        self.inline = False
        """The path plain publishes take now (True: inline). A bus starts measuring in
        the thread."""
        self.inline_runs = 0
        """Publishes whose file operations ran on the event loop."""
        self.thread_runs = 0
        """Publishes whose file operations ran in a worker thread."""
        self.switches = 0
        """Changes of path, either way."""
        self.inline_scans = 0
        """Scans (:meth:`scan`) whose listing and reading ran on the event loop."""
        self.thread_scans = 0
        """Scans whose listing and reading ran in a worker thread."""
        self._fast_run = 0  # fast publishes in a row, in the thread
        self._inline_in: int | None = None  # the thread running work inline now (the loop's)
        self.item_cost = _FIRST_ITEM_COST
        """Seconds per item of the batches :meth:`call` ran inline, a moving average (in
        the thread the other thread's turns with the GIL count too: four to five times
        as much on tmpfs)."""
        self._strike = -STRIKE_WINDOW - 1  # inline operations at the last slow inline one
        self._debt = 0.0  # seconds of inline work since this last yielded to the loop
        self._lock = threading.Lock()
        self._queue: HandOff[_Item] = HandOff()
        self._closed = False
        self._line: collections.deque[anyio.Event] = collections.deque()  # waiting turns
        self._line_wake = anyio.Event()
        self._ushering = False

    # ------------------------------------------------------------------ publishing
    async def publish(self, plan: PublishPlan, data: bytes) -> int:
        """Write one message (inline or in the thread); returns its payload size."""
        if self.inline and not plan.durable:
            if self._debt > YIELD_AFTER:
                self._debt = 0.0
                await self._take_turn()
                if not self.inline:  # another task met a slow mount meanwhile
                    return await self._offload(plan, data)
            t0 = perf_counter()
            try:
                return self._fs.publish(plan, data)
            finally:
                took = perf_counter() - t0
                self._debt += took
                self.inline_runs += 1
                if took > SLOW:
                    self._struck()
        return await self._offload(plan, data)

    async def publish_plain(
        self, name: str, bucket_index: int, data: bytes, own: bool = False
    ) -> str | None:
        """A plain message (``BusFS.publish_plain``), inline; its path.

        None when publishing is not inline (now, or after this task's turn came): the
        caller then plans it and calls :meth:`publish`. The inline part of
        :meth:`publish`, repeated for the hot path.
        """
        if self._debt > YIELD_AFTER:
            self._debt = 0.0
            await self._take_turn()
        if not self.inline:
            return None
        t0 = perf_counter()
        try:
            return self._fs.publish_plain(name, bucket_index, data, own=own)
        finally:
            took = perf_counter() - t0
            self._debt += took
            self.inline_runs += 1
            if took > SLOW:
                self._struck()

    async def call(self, fn: Callable[[], T], *, big: bool = False, items: int | None = None) -> T:
        """Run blocking file work (``fn``) under :meth:`publish`'s rule: inline and timed
        while publishing is inline (one that held the loop longer than :data:`SLOW` is a
        strike), in a worker thread otherwise (timed there: fast ones count towards going
        back inline).

        It is the work of a publish that is more than one plain message (a message and
        its copies into durable queues), or a batch of ``items`` claims, acks or
        releases (a consumer's work): timed per item, and inline only while ``items`` at
        :attr:`item_cost` fit in :data:`BATCH_BUDGET`. ``big``: always in the thread
        (work whose size, not the mount, makes it long; a publish's is then untimed).
        """
        if items is not None and items * self.item_cost > BATCH_BUDGET:
            big = True
        return await self._run(fn, scan=False, big=big, items=items)

    async def _take_turn(self) -> None:
        """Yield to the loop, then wait in line for a turn to publish inline again.

        Publishing tasks wait here on an event each, outside the loop's queue of ready
        tasks, and the usher (:meth:`_usher`) wakes one per turn of the loop. With a bare
        checkpoint instead, 50 tasks publishing flat out would all be ready at once, and
        a timer or a socket would wait behind every one of their turns.
        """
        if not self._ushering:
            await anyio.lowlevel.checkpoint()
            return
        turn = anyio.Event()
        self._line.append(turn)
        self._line_wake.set()
        try:
            await turn.wait()
        except BaseException:
            if not turn.is_set():
                self._line.remove(turn)
            raise
        if self._closed:
            raise ClosedError("the bus is closed; open a new Bus to publish")

    def _struck(self) -> None:
        """An inline operation was slow: the second within the window moves to the thread."""
        n = self.inline_runs + self.inline_scans
        if n - self._strike <= STRIKE_WINDOW and self.inline:
            self.inline = False
            self.switches += 1
            self._fast_run = 0
        self._strike = n

    async def _offload(self, plan: PublishPlan, data: bytes) -> int:
        if self._closed:
            raise ClosedError("the bus is closed; open a new Bus to publish")
        item = _Item(plan, data, self._lock)
        self._queue.put(item)
        try:
            await item.event.wait()
        except BaseException:
            with self._lock:
                item.cancelled = True
                wait = item.committing and not item.done
            if wait:
                # Its rename is under way: let it land before this raises, so that the
                # message never appears after the caller saw the cancellation.
                with anyio.CancelScope(shield=True):
                    await item.event.wait()
            raise
        result = item.result
        if isinstance(result, BaseException):
            raise result
        return result

    # ------------------------------------------------------------------ the thread side
    async def run(self) -> None:
        """Hand publishes to the thread and usher inline ones, until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._usher)
            await self._hand_off()

    async def _usher(self) -> None:
        """Wake the publishing task first in line, one per turn of the loop."""
        self._ushering = True
        try:
            while True:
                if not self._line:
                    self._line_wake = anyio.Event()
                    await self._line_wake.wait()
                    continue
                self._line.popleft().set()
                await anyio.lowlevel.checkpoint()
        finally:
            self._ushering = False
            self._closed = True
            line, self._line = self._line, collections.deque()
            for turn in line:
                turn.set()

    async def _hand_off(self) -> None:
        """Hand queued publishes to a worker thread, a batch per hop, until cancelled."""
        try:
            while True:
                batch = await self._queue.take(_BATCH)
                try:
                    await anyio.to_thread.run_sync(self._run_batch, batch, abandon_on_cancel=False)
                except BaseException:
                    if any(item.done for item in batch):
                        self._settle(batch)
                    else:
                        # Cancelled before the batch ran (run_sync checkpoints first):
                        # put it back, so that the finally below answers its callers.
                        self._queue.put_back(batch)
                    raise
                self._settle(batch)
        finally:
            self._closed = True
            queued = self._queue.drain()
            for item in queued:  # never ran: their result says the bus closed
                item.event.set()

    def _run_batch(self, batch: list[_Item]) -> None:
        """In the worker thread: publish each item not withdrawn, timing each.

        Where durable publishes go through the durable log, a batch holding more than
        one is a group commit: the batch is one record and one sync of the log (each
        caller answered after it), and if that fails every publish of the batch is
        taken back and raises its error."""
        if sum(1 for item in batch if item.plan.durable) < 2:
            self._run_items(batch, answer=True)
            return
        try:
            self._fs.durably(lambda: self._run_items(batch, answer=False))
        except BaseException as exc:
            for item in batch:
                if not isinstance(item.result, BaseException):
                    item.result = exc  # (taken back with the record)
        for item in batch:
            self._answer_cancelled(item)

    def _run_items(self, batch: list[_Item], *, answer: bool) -> None:
        publish = self._fs.publish
        for item in batch:
            if item.cancelled:  # given up while queued: nothing was written
                item.result = Withdrawn(item.plan.name)
            else:
                t0 = perf_counter()
                try:
                    item.result = publish(item.plan, item.data, item.go)
                except BaseException as exc:
                    item.result = exc
                item.took = perf_counter() - t0
            if answer:
                self._answer_cancelled(item)

    def _answer_cancelled(self, item: _Item) -> None:
        with self._lock:
            item.done = True
            waiting = item.cancelled and item.committing
        if waiting:
            # Its caller was cancelled during the rename and waits for it alone.
            anyio.from_thread.run_sync(item.event.set)

    def _settle(self, batch: list[_Item]) -> None:
        """On the loop, after a hop: answer the callers, choose the path from the times."""
        for item in batch:
            item.event.set()
            if item.took < 0 or isinstance(item.result, Withdrawn):
                continue
            self.thread_runs += 1
            if item.plan.durable:
                continue  # syncs are slow by nature: they say nothing about the mount
            self._timed_in_thread(item.took)

    def _timed_in_thread(self, took: float) -> None:
        """One operation timed in the thread: a run of fast ones brings the work inline."""
        if took < FAST:
            self._fast_run += 1
        else:
            self._fast_run = 0
        if self._fast_run >= FAST_RUN and self.inline_allowed and not self.inline:
            self.inline = True
            self.switches += 1
            self._debt = 0.0
            self._strike = -STRIKE_WINDOW - 1
            # what the thread measured last (its hops included: an overestimate) until
            # batches run inline again; an earlier inline spell's cost is stale
            self.item_cost = max(took, _FIRST_ITEM_COST)

    # ------------------------------------------------------------------ scanning
    async def scan(self, fn: Callable[[bool], T], *, big: bool) -> T:
        """Run a scan's listing and reading (``fn(inline)``, blocking) inline or in the
        thread.

        The same rule as a publish's: inline while :attr:`inline` (timed; a slow scan is
        a strike, two within the window send publishes and scans to the thread), in a
        worker thread otherwise (timed there; fast scans count towards going back
        inline). A ``big`` scan (every bucket) always goes to the thread and its time is
        not used: it says how big the listing was, not how fast the mount is. So does a
        scan whose ``fn(True)`` raises :class:`ScanTooBig`: it is called again in the
        thread, as ``fn(False)``.
        """
        return await self._run(lambda: fn(True), scan=True, big=big, in_thread=lambda: fn(False))

    async def _run(
        self,
        fn: Callable[[], T],
        *,
        scan: bool,
        big: bool,
        in_thread: Callable[[], T] | None = None,
        items: int | None = None,
    ) -> T:
        """:meth:`call` (a publish's work) or :meth:`scan` (a scan's): ``fn`` inline,
        ``in_thread`` (default ``fn``) in the thread."""
        if self.inline and not big:
            if self._debt > YIELD_AFTER:
                self._debt = 0.0
                await self._take_turn()
            if self.inline:
                t0 = perf_counter()
                self._inline_in = threading.get_ident()
                try:
                    return fn()
                except ScanTooBig:
                    big = True  # and on to the thread, below
                finally:
                    self._inline_in = None
                    took = perf_counter() - t0
                    self._debt += took
                    if scan:
                        self.inline_scans += 1
                    else:
                        self.inline_runs += 1
                        if items is not None:
                            self._item_took(took, items)
                    if took > SLOW:
                        self._struck()

        work = fn if in_thread is None else in_thread

        def timed() -> tuple[T, float]:
            t0 = perf_counter()
            result = work()
            return result, perf_counter() - t0

        result, took = await anyio.to_thread.run_sync(timed)
        if scan:
            self.thread_scans += 1
            if not big:
                self._timed_in_thread(took)
        else:
            self.thread_runs += 1
            if items is not None:  # a batch, big or not, says how fast the mount is per item
                self._timed_in_thread(took / max(items, 1))
                if self.inline:
                    # Sent here by its size at the cost per item measured inline: what
                    # its items took here (no hop in it) corrects that cost, which one
                    # slow batch (the machine busy for a moment) would otherwise hold
                    # high for good, as no batch would run inline to lower it.
                    self._item_took(took, items)
            elif not big:
                self._timed_in_thread(took)
        return result

    def batch_seconds(self, otherwise: float) -> float:
        """How long a batch of work may go on before it stops and leaves the rest (for
        the thread): :data:`SLOW` when it runs inline (called from the work, on the
        loop), else ``otherwise``. A mount that turns slow while batches run inline then
        holds the loop for one item past SLOW, not for the whole batch."""
        return SLOW if self._inline_in == threading.get_ident() else otherwise

    def _item_took(self, took: float, items: int) -> None:
        """A batch of ``items`` just took ``took`` seconds inline: into :attr:`item_cost`."""
        self.item_cost += (took / max(items, 1) - self.item_cost) / 8
