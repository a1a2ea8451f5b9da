"""The blocking face of the bus, for scripts, threads and Spark executors.

Publishing, browsing and garbage collection call the same I/O seam directly in the
caller's thread. Subscriptions run the async :class:`~fsbus.Bus` engine in a background
event-loop thread (an anyio blocking portal) and hand messages over, so delivery has
one implementation.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self

import anyio
from anyio.from_thread import BlockingPortal

from .._core.topics import validate_topic
from .._errors import ClosedError, FsBusError, QueueFull, UsageError
from .._queues.definition import QueueInfo, QueueOptions, cycle_of, dead_letter_headers
from .._queues.store import Expired
from .._settings import Settings, settings
from .browse import browse_messages, read_browsed
from .configured import Configured
from .engine import Bus, Kind
from .fs import BusFS, NameClash
from .iterator import MessageIterator
from .layout import Layout
from .loop_thread import LoopThread
from .message import BusStatistics, Message, MessageInfo, PublishInfo, PurgeKind, PurgeReport
from .namer import Namer, new_publish_info
from .ops import Ops
from .plan import PublishPlan, payload_bytes
from .purge import check_purge, purge_some, purge_targets
from .queueing import enqueue_each, open_store, refused_in_batch, route_planned
from .sweep import collect_garbage

if TYPE_CHECKING:
    from .._config import BusConfig
    from .._queues.definition import Definition

__all__ = ["BlockingBus", "BlockingMessages"]


class BlockingBus(Configured):
    """A bus used from plain (non-async) code.

    ::

        with BlockingBus("/srv/bus") as bus:
            bus.publish("jobs.resize", b"img-1", single=True)
            with bus.messages("jobs.*") as it:
                msg = it.get(timeout=5)
                it.ack(msg)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        config: BusConfig | None = None,
        ops: Ops | None = None,
    ) -> None:
        self._init(root, settings(config), ops)

    def _init(self, root: str | os.PathLike[str], options: Settings, ops: Ops | None) -> None:
        self._cfg = options
        self._config: BusConfig | None = None  # made from _cfg when asked (config)
        self.root = os.path.abspath(os.fspath(root))
        self.layout = Layout.of(self.root, self._cfg)
        self._ops = ops
        self._fs = BusFS(self.layout, self._cfg, ops)
        self._fs.spares = True  # (on a local filesystem: see BusFS.publish_plain)
        self._namer = Namer(self.layout, self._cfg)
        self._queues = open_store(self.layout, self._cfg, ops)
        # A main bus's stamps say they are fsbus's while a router is at work (stamps.py)
        self._fs.tag_stamps = True
        self._queues.on_router = self._fs.note_router
        self._fs.router_active = self._queues.router_active
        self._buckets = self.layout.buckets
        self._max_payload = self._cfg.max_payload_size
        self._hosts: dict[str, str] = {self._namer.host: self._namer.hostname}
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._portal: BlockingPortal | None = None
        self._bus_cm: AbstractContextManager[Bus] | None = None
        self._bus: Bus | None = None
        self._published = 0
        self._subscriptions: list[BlockingMessages] = []
        self._open = False
        self._closed = False

    def __enter__(self) -> Self:
        if self._open or self._closed:
            raise UsageError("a BlockingBus can be entered once; create a new one")
        self._fs.setup()
        self._fs.finish_setup(self._namer.host, self._namer.hostname)
        self._queues.log_source = self._fs.log_source
        self._open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop subscriptions (their unacked messages are released) and close.

        Any thread may call it, as often as it likes; each call returns once the bus is
        closed (a second thread closing at the same time waits for the first).
        """
        self._closed = True  # from here on, new calls are refused
        with self._close_lock:
            if not self._open:
                return
            if self._loop is not None and self._loop.forked:
                # A forked child: the subscriptions and their loop are the parent's.
                self._subscriptions.clear()
                self._loop = self._portal = self._bus_cm = self._bus = None
            with self._lock:
                # End open subscriptions first: a thread waiting in get() gets ClosedError
                # (the event loop cannot stop while their blocks are still open).
                for sub in list(self._subscriptions):
                    sub.__exit__(None, None, None)
                if self._bus_cm is not None:
                    self._bus_cm.__exit__(None, None, None)
                    self._bus_cm = self._bus = None
                if self._loop is not None:
                    self._loop.stop()
                    self._loop = self._portal = None
            self._fs.close()
            self._queues.close()
            self._open = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this BlockingBus is closed; open a new one")
        if not self._open:
            raise UsageError("use it as `with BlockingBus(root) as bus:` before calling it")

    def _check_writable(self, what: str) -> None:
        """:meth:`_check_open`, and that this bus is not open for looking only."""
        self._check_open()
        self._fs.check_writable(what)

    # ------------------------------------------------------------------ publish
    def publish(
        self,
        topic: str,
        payload: bytes | str | os.PathLike[str] | IO[bytes],
        *,
        single: bool = False,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> PublishInfo:
        """Publish a message (same options as :meth:`Bus.publish`), in this thread."""
        if (
            (type(payload) is bytes or type(payload) is str)
            and ttl is None
            and headers is None
            and priority is None
            and not durable
            and self._open
            and not self._queues.targets(topic)
        ):
            # The common call, at a fraction of the general path's cost: the same name,
            # file and stamp, without planning (see Namer.name_plain). Anything it does
            # not take (a new or long topic, a payload too large) goes the general way.
            named = self._namer.name_plain(topic, single)
            if named is not None:
                data = payload.encode("utf-8") if isinstance(payload, str) else payload
                if len(data) <= self._max_payload:
                    name, bi, expires_ms = named
                    try:
                        path = self._fs.publish_plain(name, bi, data)
                    except NameClash:  # astronomically rare: the general path renames it
                        pass
                    else:
                        self._published += 1
                        return new_publish_info(
                            topic,
                            name,
                            self._buckets[bi],
                            path,
                            True if single else False,  # as bool(single), without the call
                            expires_ms / 1000,
                            len(data),
                        )
        self._check_open()
        plan = self._namer.plan(topic, single, ttl, durable, headers, priority)
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        targets = self._queues.targets(topic)
        if targets:
            return self._publish_routed(
                plan, topic, single, payload, targets, ttl, durable, headers, priority
            )
        if isinstance(payload, bytes | bytearray | memoryview):
            data = bytes(payload)
            self._namer.check_size(len(data))
            try:
                size = self._fs.publish(plan, data)
            except NameClash:  # astronomically rare: name it again
                plan = self._namer.plan(topic, single, ttl, durable, headers, priority)
                size = self._fs.publish(plan, data)
        elif isinstance(payload, os.PathLike):
            size = self._fs.publish(plan, payload)
        elif hasattr(payload, "read"):
            size = self._publish_file(plan, payload)
        else:
            raise UsageError(
                "payload must be bytes, str, a path or a binary file object, not "
                f"{type(payload).__name__}"
            )
        self._published += 1
        return self._namer.info(plan, size)

    def publish_many(
        self,
        items: Sequence[tuple[str, bytes | str]],
        *,
        single: bool = False,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> list[PublishInfo]:
        """Publish many (topic, payload) pairs with the same options.

        Durable ones through the durable log are one record and one sync (if it cannot
        be written, every message of the call is taken back and the error raised)."""

        def each() -> list[PublishInfo]:
            out = []
            for i, (t, p) in enumerate(items):
                try:
                    out.append(
                        self.publish(
                            t,
                            p,
                            single=single,
                            ttl=ttl,
                            durable=durable,
                            headers=headers,
                            priority=priority,
                        )
                    )
                except QueueFull as exc:
                    raise refused_in_batch(exc, i, len(items)) from None
            return out

        return self._fs.durably(each, many=True) if durable else each()

    def _publish_file(self, plan: PublishPlan, fileobj: IO[bytes]) -> int:
        fd = self._fs.begin(plan)
        total = 0
        try:
            while chunk := fileobj.read(1 << 20):
                if not isinstance(chunk, bytes | bytearray | memoryview):
                    raise UsageError(
                        f"the payload file gave {type(chunk).__name__}, not bytes; "
                        "open it in binary mode ('rb')"
                    )
                total += len(chunk)
                self._namer.check_size(total)
                self._fs.write_chunk(fd, bytes(chunk), plan)
        except BaseException:
            self._fs.abort(plan, fd)
            raise
        self._fs.commit(plan, fd)
        return total

    # ------------------------------------------------------------------ subscribe
    def messages(
        self,
        pattern: str | None = None,
        *,
        existing: bool = False,
        kind: Kind = "any",
        buffer: int = 64,
        prefetch: int = 1,
        queue: str | None = None,
        ack_previous: bool = True,
    ) -> BlockingMessages:
        """Receive matching messages: ``with bus.messages("a.*") as it: it.get(timeout=1)``.

        ``queue=`` consumes a durable queue instead (with a pattern: bound to it first).
        Taking a message acknowledges the one taken before it unless it was settled, or
        unless ``ack_previous=False``: then each is acknowledged (or released) only when
        asked, so a batch can be taken first and acknowledged once it is stored.
        """
        self._check_open()
        if pattern is None and queue is None:
            raise UsageError("give a pattern, or queue= to consume a durable queue")
        portal, bus = self._engine()
        sub = BlockingMessages(
            portal, bus, pattern, existing, kind, buffer, prefetch, queue, ack_previous
        )
        sub._on_exit = self._subscriptions.remove
        self._subscriptions.append(sub)
        return sub

    def get(self, queue: str) -> AbstractContextManager[Message | None]:
        """Take the next message of durable queue ``queue`` without subscribing, held
        for a ``with`` block: ``with bus.get("billing") as msg: ...``.

        ``msg`` is None when no message is ready. The message is acknowledged when the
        block ends and given back for redelivery when it raises (see :meth:`Bus.get`).
        """
        self._check_open()
        portal, bus = self._engine()
        return portal.wrap_async_context_manager(bus.get(queue))

    # ------------------------------------------------------------------ durable queues
    def declare_queue(
        self,
        name: str,
        bindings: Sequence[str] = (),
        *,
        message_ttl: float | None = None,
        max_length: int | None = None,
        overflow: str = "drop-head",
        dead_letter: str | None = None,
        max_deliveries: int | None = None,
        auto_delete: bool = False,
        expires: float | None = None,
        dead_letter_expired: bool = False,
        dead_letter_dropped: bool = False,
    ) -> QueueInfo:
        """Declare a durable queue (see :meth:`Bus.declare_queue`)."""
        self._check_writable(f"declaring queue {name!r}")
        options = QueueOptions(
            message_ttl=message_ttl,
            max_length=max_length,
            overflow=overflow,  # type: ignore[arg-type]
            dead_letter=dead_letter,
            max_deliveries=max_deliveries,
            auto_delete=auto_delete,
            expires=expires,
            dead_letter_expired=dead_letter_expired,
            dead_letter_dropped=dead_letter_dropped,
        )
        if isinstance(bindings, str):
            bindings = [bindings]
        self._queues.declare(name, list(bindings), options)
        return self._queues.info(name)

    def bind_queue(self, name: str, pattern: str) -> None:
        """Route messages matching ``pattern`` into queue ``name`` too (idempotent)."""
        self._check_writable(f"binding queue {name!r}")
        self._queues.bind(name, pattern)

    def unbind_queue(self, name: str, pattern: str) -> None:
        """Stop routing messages matching ``pattern`` into queue ``name``."""
        self._check_writable(f"unbinding queue {name!r}")
        self._queues.bind(name, pattern, bind=False)

    def purge_queue(self, name: str) -> int:
        """Remove the messages waiting in queue ``name``; returns how many."""
        self._check_writable(f"purging queue {name!r}")
        return self._queues.purge(name)

    def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        """Delete queue ``name`` and its messages; returns how many messages it held."""
        self._check_writable(f"deleting queue {name!r}")
        return self._queues.delete(
            name, if_unused=if_unused, if_empty=if_empty, send=self._send_dropped
        )

    def _send_dropped(self, queue: str, target: str, messages: list[Expired], reason: str) -> None:
        """Publish what queue ``queue`` dropped (``reason`` ``maxlen``) under its
        dead-letter topic ``target``, in order, as the engine's sender does."""
        for topic, payload, headers in messages:
            headers = dead_letter_headers(headers, queue, topic, reason)
            self._publish_except(target, payload, cycle_of(headers), headers=headers)

    def _publish_except(
        self,
        topic: str,
        payload: bytes,
        skip: Collection[str],
        *,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> int:
        """Publish as :meth:`publish` does, but into none of the queues named in
        ``skip`` (a dead letter that would close a cycle through them); how many queues
        got a copy."""
        self._check_open()
        plan = self._namer.plan(topic, False, ttl, durable, headers, priority)
        targets = tuple(d for d in self._queues.targets(topic) if d.name not in skip)
        if targets:
            self._publish_routed(
                plan, topic, False, payload, targets, ttl, durable, headers, priority
            )
        else:
            self._namer.check_size(len(payload))
            try:
                self._fs.publish(plan, payload)
            except NameClash:  # astronomically rare: name it again
                plan = self._namer.plan(topic, False, ttl, durable, headers, priority)
                self._fs.publish(plan, payload)
            self._published += 1
        return len(targets)

    def _publish_routed(
        self,
        plan: PublishPlan,
        topic: str,
        single: bool,
        payload: bytes | str | os.PathLike[str] | IO[bytes],
        targets: tuple[Definition, ...],
        ttl: float | None,
        durable: bool,
        headers: dict[str, str] | None,
        priority: int | None,
    ) -> PublishInfo:
        """:meth:`publish` of a message the durable queues ``targets`` are bound to: a
        copy goes into each before this returns."""
        if isinstance(payload, os.PathLike):
            with open(payload, "rb") as f:
                payload = f.read()
        elif hasattr(payload, "read"):
            payload = payload.read()
        elif not isinstance(payload, bytes | bytearray | memoryview):
            payload = payload_bytes(payload)  # raises, naming what it was
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise UsageError("the payload file gave text, not bytes; open it in binary mode ('rb')")
        data = bytes(payload)
        self._namer.check_size(len(data))
        planned = [plan]
        # The message, then a copy in each queue before this returns (a durable one
        # syncs them all together: see route).
        size = route_planned(
            self._queues,
            self._fs,
            targets,
            planned,
            data,
            lambda: self._namer.plan(topic, single, ttl, durable, headers, priority),
            ttl=ttl,
            durable=durable,
            headers=headers,
            priority=priority,
        )
        self._published += 1
        return self._namer.info(planned[0], size)

    def routes(self, topic: str) -> list[str]:
        """The durable queues a message published on ``topic`` now gets a copy in."""
        self._check_open()
        return [d.name for d in self._queues.targets(validate_topic(topic))]

    def queue_info(self, name: str) -> QueueInfo:
        """Queue ``name``: bindings, options, depth and consumers now."""
        self._check_open()
        return self._queues.info(name)

    def queues(self) -> list[QueueInfo]:
        """Every queue declared on this bus."""
        self._check_open()
        out = []
        for n in self._queues.names():
            try:
                out.append(self._queues.info(n))
            except FsBusError:
                continue  # deleted meanwhile
        return out

    def enqueue(
        self,
        queue: str | Sequence[str],
        topic: str,
        payload: bytes | str,
        *,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> int:
        """Put a message straight into queue ``queue``, or into each of several queues;
        how many got it (see :meth:`Bus.enqueue`)."""
        self._check_writable("enqueueing a message")
        self._namer.check(topic, ttl, priority)  # the queue's bus checks the headers
        data = payload_bytes(payload)
        self._namer.check_size(len(data))
        if not isinstance(queue, str):
            return enqueue_each(
                self._queues,
                self._queues.existing(queue),
                topic,
                data,
                ttl=ttl,
                durable=durable,
                headers=headers,
                priority=priority,
            )
        d = self._queues.current(queue)
        self._queues.check_room((d,), (topic, data, headers))
        return self._queues.enqueue(
            d, topic, data, ttl=ttl, durable=durable, headers=headers, priority=priority
        )

    def _engine(self) -> tuple[BlockingPortal, Bus]:
        with self._lock:
            if self._portal is None:
                self._loop = LoopThread("fsbus-blocking-loop")
                self._portal = self._loop.portal
            if self._bus is None:
                # Built on the loop thread: a Bus makes its anyio events where it is
                # constructed, and a caller's thread may run another loop (trio).
                bus = self._portal.call(lambda: Bus._using(self.root, self._cfg, self._ops))
                self._bus_cm = self._portal.wrap_async_context_manager(bus)
                self._bus = self._bus_cm.__enter__()
            return self._portal, self._bus

    # ------------------------------------------------------------------ inspect
    def browse(self, pattern: str = "#", *, queue: str | None = None) -> Iterator[MessageInfo]:
        """Every unexpired message matching ``pattern``; nothing is read or consumed.

        With ``queue=``, the messages waiting in that durable queue or held by one of
        its consumers, those whose topic matches ``pattern`` (see :meth:`Bus.browse`);
        a queue that does not exist raises :class:`~fsbus.QueueNotFound`.
        """
        self._check_open()
        yield from browse_messages(self._fs, pattern, self._hosts, queue=queue, queues=self._queues)

    def read_payload(self, info: MessageInfo) -> bytes | None:
        """The payload of a browsed message without consuming it (None when gone), on the
        bus or in a queue (``browse(queue=...)``)."""
        self._check_open()
        return read_browsed(self._fs, info, self._queues)

    def gc(self, *, debris_age: float = 600.0) -> int:
        """Remove expired messages, quarantine foreign files, sweep crash debris, and
        delete the durable queues whose time is up (see :meth:`Bus.gc`)."""
        self._check_writable("gc (removing expired messages and debris)")
        n, q, debris = collect_garbage(self._fs, set(), debris_age)
        # (what a queue deleted here dropped goes on first, as with delete_queue; the
        # expired messages stay for the processes that dead-letter them)
        self._queues.expire_unused(on_delete=self._send_dropped)
        return n + q + debris

    def purge(self, pattern: str, *, kind: PurgeKind = "single") -> PurgeReport:
        """Remove the messages matching ``pattern`` now on the bus, in this thread.

        Same rules as :meth:`Bus.purge`: ``kind`` is ``"single"`` (the default),
        ``"multi"`` or ``"all"``; a work-queue message a consumer holds stays, counted
        as locked; a bad pattern or kind raises before anything is read.
        """
        self._check_writable(f"purging {kind} messages matching {pattern!r}")
        pattern = check_purge(pattern, kind)
        multi, single = purge_targets(self._fs, pattern, kind)
        removed, multi_removed, locked = purge_some(self._fs, multi, single)
        return PurgeReport(pattern, kind, single=removed, multi=multi_removed, locked=locked)

    def statistics(self) -> BusStatistics:
        """Counters: the subscription engine's, plus this face's publishes."""
        if self._bus is not None and self._portal is not None:
            s = self._portal.call(_stats, self._bus)
        else:
            s = BusStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, False)
        return dataclasses.replace(s, published=s.published + self._published)


async def _stats(bus: Bus) -> BusStatistics:
    return bus.statistics()


class BlockingMessages:
    """A subscription read from plain code; see :meth:`BlockingBus.messages`."""

    def __init__(
        self,
        portal: BlockingPortal,
        bus: Bus,
        pattern: str | None,
        existing: bool,
        kind: Kind,
        buffer: int,
        prefetch: int = 1,
        queue: str | None = None,
        ack_previous: bool = True,
    ) -> None:
        self._portal = portal
        self._cm = portal.wrap_async_context_manager(
            bus.messages(
                pattern,
                existing=existing,
                kind=kind,
                buffer=buffer,
                prefetch=prefetch,
                queue=queue,
                ack_previous=ack_previous,
            )
        )
        self._it: MessageIterator | None = None
        self._done = False
        self._exit_lock = threading.Lock()
        self._on_exit: Callable[[BlockingMessages], None] | None = None

    def __enter__(self) -> Self:
        self._it = self._cm.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._exit_lock:  # once: by its block, or by BlockingBus.close first
            if self._done:
                return
            self._done = True
            entered, self._it = self._it is not None, None
            if self._on_exit is not None:
                self._on_exit(self)
        if entered:
            self._cm.__exit__(exc_type, exc, tb)

    def _iter(self) -> MessageIterator:
        if self._done:
            raise ClosedError("this subscription is closed (its block ended or the bus closed)")
        if self._it is None:
            raise UsageError("use it as `with bus.messages(pattern) as it:`")
        return self._it

    def get(self, timeout: float | None = None) -> Message:
        """The next message; raises TimeoutError after ``timeout`` seconds, ClosedError
        once the subscription has ended, and :class:`~fsbus.QueueNotFound` if it ended
        because its durable queue was deleted."""
        it = self._iter()
        try:
            return self._portal.call(it.receive, timeout)
        except StopAsyncIteration:
            raise ClosedError("the subscription is closed") from None

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Message:
        it = self._iter()
        try:
            return self._portal.call(it.__anext__)
        except StopAsyncIteration:
            raise StopIteration from None

    def ack(self, msg: Message) -> None:
        """Consume a work-queue message.

        The message leaves its bucket just after this returns, in the bus's next
        finishing batch; ``statistics().acked`` counts it once it has.
        """
        self._portal.call(self._iter().ack, msg)

    def release(self, msg: Message) -> None:
        """Give a work-queue message back for redelivery (counts as a failure)."""
        self._portal.call(self._iter().release, msg)


_ = anyio  # the portal runs anyio on asyncio
