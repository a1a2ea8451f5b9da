"""The gateway: a TCP listener speaking AMQP 0-9-1 over one bus directory."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.abc

from .. import (
    BlockingBus,
    Bus,
    FsBusError,
    Message,
    QueueFull,
    QueueInfo,
    QueueNotFound,
    Subscription,
    UsageError,
    __version__,
)
from ._channel import (
    EXCHANGE,
    PROPS,
    ROUTING_KEY,
    SINGLE_ACTIVE,
    Channel,
    Consumer,
    message_view,
)
from ._connection import Connection
from ._contracts import CountMark
from ._deaths import cycle_queues, dead_lettered
from ._frames import decode_properties
from ._routing import (
    ACCESS_REFUSED,
    DEAD_QUEUE,
    DEAD_TOPIC,
    NOT_FOUND,
    AmqpError,
    RouteJob,
    amqp_priority_to_bus,
    binding_pattern,
    bus_queue_name,
    headers_match,
    publish_topic,
    word,
)
from ._socket import ClientSocket
from ._socket import serve as serve_sockets
from ._state import AmqpState, HeadersBinding

if TYPE_CHECKING:
    from .. import BusConfig

log = logging.getLogger("fsbus.amqp")

DEFAULT_USERS = {"guest": "guest"}
HANDLERS = 256
"""Handlers each queue's bus runs at once in a gateway: every message delivered and not
yet acknowledged holds one, so a gateway holds at most this many of a queue across its
consumers. Not more: while the consumers are full, each freed slot makes the bus look
through up to four times its free slots of waiting messages (1000 made consuming a deep
queue several times slower)."""
INLINE_BUDGET = 0.0005
"""Seconds of routing the event loop may do itself: a batch of publishes expected to
take less (at the recent cost per publish) is routed on the loop, not in a worker
thread, whose hop costs more than such a batch (one publish waiting for its confirm on
tmpfs). Slow writes (an fsync on a disk) raise the cost and go to a thread again."""
DISK_FREE_LIMIT = 50_000_000
"""Free bytes of the bus's filesystem below which publishes are held (RabbitMQ's
default ``disk_free_limit``); ``FSBUS_AMQP_DISK_FREE_LIMIT`` overrides it."""
INODE_FREE_LIMIT = 1_000
"""Free inodes below which publishes are held: every message is a file
(``FSBUS_AMQP_INODE_FREE_LIMIT`` overrides it)."""
DISK_CHECK_SECONDS = 0.5
"""How often the free space of the bus's filesystem is looked at."""
UNBOUND_CHECK_SECONDS = 5.0
"""Seconds between looks for auto-delete exchanges whose last binding went without a
gateway seeing it go (its queue deleted by an fsbus process, or expired)."""
_RECOUNTS = 3
"""Reads of a queue's count at most, while subscriptions here change under them."""


def _limit(env: str, default: int) -> int:
    text = os.environ.get(env)
    if text is None:
        return default
    try:
        return max(0, int(text))
    except ValueError:
        raise UsageError(f"{env}={text!r}: give a whole number of free bytes or inodes") from None


class Gateway:
    """An AMQP 0-9-1 endpoint over the bus in ``root`` (an async context manager).

    ``users`` maps user names to passwords (default ``{"guest": "guest"}``); as RabbitMQ
    does, ``guest`` may connect only from a loopback address. ``port=0`` picks a free
    port; :attr:`port` and :attr:`url` tell which.

    While the bus's filesystem has less than ``disk_free_limit`` bytes or
    ``inode_free_limit`` inodes free, publishes are held and publishing connections are
    sent ``connection.blocked`` (``connection.unblocked`` once there is room again), as
    RabbitMQ's disk alarm does.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 5672,
        users: Mapping[str, str] | None = None,
        config: BusConfig | None = None,
        disk_free_limit: int | None = None,
        inode_free_limit: int | None = None,
    ) -> None:
        self.root = os.fspath(root)
        self.disk_free_limit = (
            _limit("FSBUS_AMQP_DISK_FREE_LIMIT", DISK_FREE_LIMIT)
            if disk_free_limit is None
            else disk_free_limit
        )
        self.inode_free_limit = (
            _limit("FSBUS_AMQP_INODE_FREE_LIMIT", INODE_FREE_LIMIT)
            if inode_free_limit is None
            else inode_free_limit
        )
        self.alarm: str | None = None
        """Why publishes are held ("low on disk"), or None."""
        self.no_alarm = anyio.Event()
        self.no_alarm.set()
        self.connections: set[Connection] = set()
        self._route_cost = 1.0  # seconds per publish routed, a moving average
        self.host = host
        self.port = port
        self.users = dict(DEFAULT_USERS if users is None else users)
        # with no config given, the defaults as they are: no pydantic (0.1-0.2 s of the
        # gateway's start) for values known to be valid
        self.version = __version__
        self.bus: Bus = Bus._using(self.root, config, handler_concurrency=HANDLERS)
        # publishes are routed with it, a batch per worker-thread hop (see route_many)
        self.blocking = BlockingBus._using(self.root, config, handler_concurrency=HANDLERS)
        self.state: AmqpState
        self.consumers: dict[str, set[tuple[Channel, str]]] = {}
        # the consumers of each single-active-consumer queue waiting here, oldest first
        self.single_waiters: dict[str, list[Consumer]] = {}
        # the bus subscriptions of each queue (AMQP name) here: True for a basic.get's
        self._subs: dict[str, set[Subscription]] = {}
        self.subs_seq = 0
        """Counts changes of :attr:`_subs`: a count of the bus's read before one is stale
        (see :meth:`ready_count`)."""
        self._taken: dict[str, int] = {}  # messages basic.get holds, per queue
        self._stack = contextlib.AsyncExitStack()
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def url(self) -> str:
        """``amqp://guest:guest@HOST:PORT/`` for clients."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"amqp://guest:guest@{host}:{self.port}/"

    async def __aenter__(self) -> Self:
        try:
            return await self._start()
        except BaseException:
            await self._stack.aclose()  # what started stops, in reverse order
            raise

    async def _start(self) -> Self:
        stack = self._stack
        await stack.enter_async_context(self.bus)
        self.bus._expired_hook = self._expired
        await anyio.to_thread.run_sync(self.blocking.__enter__)
        stack.callback(self.blocking.close)
        self.state = await anyio.to_thread.run_sync(AmqpState, self.root)
        stack.callback(self.state.close)
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self.port, reuse_port=False
        )
        stack.push_async_callback(listener.aclose)
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        tg = await stack.enter_async_context(anyio.create_task_group())
        self._tg = tg
        stack.callback(tg.cancel_scope.cancel)
        tg.start_soon(serve_sockets, listener, self._handle)
        tg.start_soon(self._consume_dead_letters)
        tg.start_soon(self._collect_orphans)
        tg.start_soon(self._collect_unbound)
        tg.start_soon(self._watch_disk)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    async def _handle(self, stream: ClientSocket) -> None:
        await Connection(self, stream).run()

    def new_channel(self, conn: Any, number: int) -> Channel:
        return Channel(conn, number)

    def authenticate(self, user: str, password: str, loopback: bool) -> bool:
        if self.users.get(user) != password or not user:
            return False
        return not (user == "guest" and not loopback)

    # ------------------------------------------------------------------ disk alarm
    def _disk_low(self) -> str | None:
        """Blocking: "low on disk" when the bus's filesystem is short of bytes or
        inodes, else None (also when it cannot be asked)."""
        try:
            st = os.statvfs(self.root)
        except OSError as exc:
            log.warning("cannot read the free space of %s: %s", self.root, exc)
            return self.alarm
        # What a filesystem does not report is unknown, not full: CephFS reports 0 blocks
        # without a manager and f_ffree -1 (no inode limit), btrfs no inode count (as
        # `fsbus doctor` reads them).
        if st.f_blocks > 0 and st.f_bavail * st.f_frsize < self.disk_free_limit:
            return "low on disk"
        inodes_known = 0 < st.f_files < (1 << 63) and 0 <= st.f_favail <= st.f_files
        if inodes_known and st.f_favail < self.inode_free_limit:
            return "low on disk"
        return None

    async def _watch_disk(self) -> None:
        while True:
            alarm = await anyio.to_thread.run_sync(self._disk_low)
            if alarm != self.alarm:
                self.set_alarm(alarm)
            await anyio.sleep(DISK_CHECK_SECONDS)

    def set_alarm(self, alarm: str | None) -> None:
        """Hold publishes (``alarm`` says why) or, with None, release them."""
        if alarm == self.alarm:
            return
        if alarm is not None:
            log.warning("%s: free space of %s below the limit; publishes held", alarm, self.root)
            if self.alarm is None:
                self.no_alarm = anyio.Event()
            self.alarm = alarm
        else:
            log.warning("free space of %s above the limit again; publishes released", self.root)
            self.alarm = None
            self.no_alarm.set()
        for conn in list(self.connections):
            conn.alarm_changed()

    # ------------------------------------------------------------------ routing
    async def route_many(self, jobs: list[RouteJob]) -> list[int | BaseException]:
        """Route publishes onto the bus in one worker-thread hop; for each, how many
        queues got it, or why not (AmqpError: a channel error; QueueFull: a full
        reject-publish queue; another error: a storage failure, to nack)."""
        if len(jobs) * self._route_cost < INLINE_BUDGET:
            return self._route_many(jobs)
        return await anyio.to_thread.run_sync(self._route_many, jobs)

    def _route_many(self, jobs: list[RouteJob]) -> list[int | BaseException]:
        started = time.perf_counter()
        # Each message's bucket is stamped as it is placed, not once at the batch's end:
        # a consumer's listing takes a message only if it was named before the listing
        # began, which keeps one publisher's order only if each earlier message was
        # placed and stamped by then (scan.split_fresh). Stamped at the end, a later
        # message of the batch, seen in a bucket a listing looked at for another stamp,
        # went out before an earlier one whose bucket it did not look at.
        try:
            return self._route_jobs(jobs)
        finally:
            cost = (time.perf_counter() - started) / max(len(jobs), 1)
            self._route_cost += (cost - self._route_cost) / 4

    def _route_jobs(self, jobs: list[RouteJob]) -> list[int | BaseException]:
        exchanges: dict[str, dict[str, Any] | None] = {}
        headers_bindings: dict[str, list[HeadersBinding]] = {}
        out: list[int | BaseException] = []
        for job in jobs:
            if job.error is not None:
                out.append(job.error)
                continue
            try:
                if job.exchange not in exchanges:
                    exchanges[job.exchange] = self.state.exchange(job.exchange)
                ex = exchanges[job.exchange]
                if ex is None:
                    out.append(
                        AmqpError(
                            NOT_FOUND, f"NOT_FOUND - no exchange '{job.exchange}' in vhost '/'"
                        )
                    )
                    continue
                if ex.get("internal") and not job.internal_ok:
                    out.append(
                        AmqpError(
                            ACCESS_REFUSED,
                            f"ACCESS_REFUSED - cannot publish to internal exchange "
                            f"'{job.exchange}' in vhost '/'",
                        )
                    )
                    continue
                kind = str(ex["type"])
                if kind == "headers" and job.exchange not in headers_bindings:
                    headers_bindings[job.exchange] = self.state.headers_bindings(job.exchange)
                out.append(self._route_one(job, kind, headers_bindings.get(job.exchange, [])))
            except Exception as exc:  # a full queue, a storage failure: nacked
                out.append(exc)
        return out

    def _route_one(self, job: RouteJob, kind: str, bindings: list[HeadersBinding]) -> int:
        """Blocking: publish one message; how many queues got it (QueueFull if one is full)."""
        bus = self.blocking
        if kind == "headers":
            targets = sorted(
                {
                    bus_queue_name(q)
                    for q, a, uid in bindings
                    if headers_match(a, job.amqp_headers) and self.bound_now(q, uid)
                }
            )
            topic = f"amqp-headers.{word(job.exchange)}"
        else:
            topic = publish_topic(job.exchange, kind, job.routing_key) or ""
            targets = bus.routes(topic)
            if job.exchange == "amq.topic":
                # on the bus itself too: fsbus subscribers of the routing key see it
                if job.not_into:  # a dead letter: into none of the queues of its cycle
                    return bus._publish_except(
                        topic,
                        job.body,
                        job.not_into,
                        ttl=job.ttl,
                        durable=job.durable,
                        headers=job.headers,
                        priority=job.priority,
                    )
                bus.publish(
                    topic,
                    job.body,
                    ttl=job.ttl,
                    durable=job.durable,
                    headers=job.headers,
                    priority=job.priority,
                )
                return len(targets)
        if job.not_into:
            targets = [t for t in targets if t not in job.not_into]
        if not targets:
            return 0
        # one call for every queue: the copies are named and their headers encoded once;
        # a queue deleted meanwhile is left out, a full one refuses only its own copy
        groups = {job.priority: list(targets)}
        p = job.amqp_priority
        if p:  # a queue's x-max-priority caps it: a group per priority the copies get
            groups = {}
            for t in targets:
                cap = self.state.max_priority_of(t)
                bus_p = amqp_priority_to_bus(p, cap)
                groups.setdefault(bus_p, []).append(t)
        made = 0
        full: QueueFull | None = None
        for priority, group in groups.items():
            try:
                made += bus.enqueue(
                    group,
                    topic,
                    job.body,
                    ttl=job.ttl,
                    durable=job.durable,
                    headers=job.headers,
                    priority=priority,
                )
            except QueueFull as exc:  # the other groups still get theirs
                full = full or exc
        if full is not None:
            raise full
        return made

    async def dead_letter(self, queue: str, msg: Message, reason: str = "rejected") -> None:
        """A message of ``queue`` dead-lettered (rejected without requeue): to the queue's
        dead-letter exchange, if it has one, with the ``x-death`` headers RabbitMQ adds."""
        await self._dead_letter(bus_queue_name(queue), msg.headers, msg.topic, msg.payload, reason)

    async def _consume_dead_letters(self) -> None:
        """Consume :data:`DEAD_QUEUE` (see :meth:`_limit_reached`) while the gateway runs:
        every gateway of a bus does, each message taken by one. Started beside the
        listener, so that it does not hold up the gateway's start."""
        await self.bus.declare_queue(DEAD_QUEUE, [DEAD_TOPIC])
        # one at a time: dead-lettered in the order they came (the order they expired
        # in, or went over the delivery limit), as on RabbitMQ, on one gateway
        sub = await self.bus.subscribe(None, self._limit_reached, queue=DEAD_QUEUE, prefetch=1)
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(FsBusError):
                await self.bus.unsubscribe(sub)

    async def _limit_reached(self, msg: Message) -> None:
        """A message that expired in its queue, was dropped from the head of a full one, or
        was delivered ``x-delivery-limit`` + 1 times and given back each time, which a bus
        published to :data:`DEAD_TOPIC` (its queue, topic and, for an expired or dropped
        one, the reason in ``x-fsbus-*`` headers): to
        that queue's dead-letter exchange. Raising gives it back for a retry."""
        queue = msg.headers.get("x-fsbus-queue")
        if queue is None:
            log.warning("%s: a message without its queue (x-fsbus-queue): dropped", DEAD_QUEUE)
            return
        ours = ("x-fsbus-queue", "x-fsbus-topic", "x-fsbus-reason")
        inner = {k: v for k, v in msg.headers.items() if k not in ours}
        topic = msg.headers.get("x-fsbus-topic", msg.topic)
        said = msg.headers.get("x-fsbus-reason")
        reason = said if said in ("expired", "maxlen") else "delivery_limit"
        await self._dead_letter(queue, inner, topic, msg.payload, reason)

    async def _dead_letter(
        self, bus_queue: str, old: Mapping[str, str], topic: str, payload: bytes, reason: str
    ) -> None:
        await self._dead_letter_many(bus_queue, [(old, topic, payload)], reason)

    async def _expired(
        self,
        bus_queue: str,
        target: str,
        messages: list[tuple[str, bytes, dict[str, str]]],
        reason: str,
    ) -> bool:
        """The bus's hook for the expired messages of a queue it found, or those a full
        queue dropped from its head (``reason``: ``expired``, ``maxlen``; see
        ``Bus._expired_hook``): those of a queue with a dead-letter exchange (its
        dead-letter topic is :data:`DEAD_TOPIC`) are routed to the exchange here and now,
        in order, rather than through :data:`DEAD_QUEUE`. One that cannot be written is
        raised: the bus gives the batch back, to be sent again."""
        if target != DEAD_TOPIC:
            return False
        items = [(headers, topic, payload) for topic, payload, headers in messages]
        for outcome in await self._dead_letter_many(bus_queue, items, reason):
            if isinstance(outcome, Exception) and not isinstance(outcome, AmqpError | QueueFull):
                raise outcome
        return True

    async def _dead_letter_many(
        self, bus_queue: str, items: Sequence[tuple[Mapping[str, str], str, bytes]], reason: str
    ) -> list[int | BaseException]:
        """Dead-letter messages of ``bus_queue`` ((headers, topic, payload) each) to its
        dead-letter exchange, in order; each one's outcome as :meth:`route_many` says it
        (nothing, when the queue is gone or has no dead-letter exchange: dropped, as on
        RabbitMQ, as are those its exchange is missing for)."""
        meta = await anyio.to_thread.run_sync(self.state.read, "queues", bus_queue)
        args = (meta or {}).get("arguments") or {}
        dlx = args.get("x-dead-letter-exchange")
        if meta is None or dlx is None:
            return []  # the queue is gone, or has no dead-letter exchange: dropped
        queue = str(meta.get("name", bus_queue))
        now = time.time()
        jobs = []
        for old, topic, payload in items:
            view, exchange, first_rk = message_view(old, topic)
            props = decode_properties(view) if isinstance(view, bytes) else view
            rk = str(args.get("x-dead-letter-routing-key", first_rk))
            props = dead_lettered(
                props,
                queue=queue,
                reason=reason,
                exchange=exchange,
                routing_keys=[first_rk],
                now=now,
            )
            headers = dict(old)
            headers[PROPS] = base64.b64encode(props.marshal()).decode("ascii")
            not_into = frozenset(bus_queue_name(q) for q in cycle_queues(props))
            headers[EXCHANGE] = str(dlx)
            headers[ROUTING_KEY] = rk
            jobs.append(
                RouteJob(
                    str(dlx),
                    rk,
                    props.headers,
                    payload,
                    durable=props.delivery_mode == 2,
                    headers=headers,
                    priority=amqp_priority_to_bus(props.priority),
                    amqp_priority=props.priority,
                    internal_ok=True,
                    not_into=not_into,
                )
            )
        return await self.route_many(jobs)

    # ------------------------------------------------------------------ consumers
    def track(self, queue: str, sub: Subscription) -> None:
        """``sub`` consumes ``queue`` for a client."""
        self._subs.setdefault(queue, set()).add(sub)
        self.subs_seq += 1

    def untrack(self, queue: str, sub: Subscription) -> None:
        """``sub`` has ended (its messages are settled)."""
        subs = self._subs.get(queue)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[queue]
        self.subs_seq += 1

    def forget(self, queue: str) -> None:
        """``queue`` was deleted: the subscriptions to it still settling in the background
        are no part of a queue of that name declared next (its counts)."""
        self._subs.pop(queue, None)

    def counted_consumers(self, queue: str, counted: int) -> int:
        """The consumers of ``queue`` as RabbitMQ counts them, from ``counted`` (the
        bus's count, read with no await since): a consumer this gateway cancelled is
        gone once its ``cancel-ok`` is sent, though the bus counts its subscription
        until the background task that closes it has started."""
        open_subs = sum(1 for s in self._subs.get(queue, ()) if not s.closed)
        here = self.consumers.get(queue, ())
        # a waiting single-active consumer has no subscription: counted here (as RabbitMQ
        # counts it), not by the bus
        waiting = sum(
            1 for ch, tag in here if (c := ch.consumers.get(tag)) is not None and c.sub is None
        )
        leaving = open_subs - (len(here) - waiting)
        return max(0, counted - max(0, leaving)) + waiting

    async def waiting_elsewhere(self, queue: str, meta: Mapping[str, Any] | None) -> int:
        """The consumers of ``queue`` (its AMQP record ``meta``) waiting on other gateways
        to be its single active consumer: 0 but for an ``x-single-active-consumer``
        queue (their own gateway counts them; the bus does not, as they have no
        subscription)."""
        args = (meta or {}).get("arguments") or {}
        if args.get(SINGLE_ACTIVE) is not True:
            return 0
        try:
            return await anyio.to_thread.run_sync(
                self.state.waiting_elsewhere, bus_queue_name(queue)
            )
        except OSError:
            return 0

    def wake_single(self, queue: str) -> None:
        """A single-active consumer of ``queue`` left: its oldest waiting consumer here
        tries the lock now (the others, and those of other gateways, within
        :data:`~._channel.SINGLE_POLL`)."""
        for consumer in self.single_waiters.get(queue, ()):
            if consumer.sub is None:
                consumer.wake.set()
                return

    def held(self, queue: str) -> int:
        """The messages of ``queue`` this gateway's consumers hold: delivered, and not
        yet settled on disk."""
        return sum(s.in_flight for s in self._subs.get(queue, ())) + self._taken.get(queue, 0)

    def taken(self, queue: str, delta: int) -> None:
        """A basic.get took a message of ``queue`` (1), or it is settled on disk (-1)."""
        n = self._taken.get(queue, 0) + delta
        if n:
            self._taken[queue] = n
        else:
            self._taken.pop(queue, None)

    def mark(self, queue: str) -> CountMark:
        """What :meth:`ready_count` needs taken before the queue's bus is listed."""
        return CountMark(self.held(queue), self.subs_seq)

    async def ready_count(
        self, queue: str, info: QueueInfo | None = None, mark: CountMark | None = None
    ) -> tuple[int, int]:
        """(messages ready, consumers) of ``queue``, as RabbitMQ counts them: the
        messages held by a consumer, not yet acknowledged, are left out. ``info``: the
        queue's bus listed just after :meth:`mark` gave ``mark`` (else listed here).

        While nothing of the queue is held here (counted before ``info`` was listed)
        and no other process consumes it, every message listed is ready.
        Otherwise the ready ones are told by their locks (one browse): a held message
        stays locked until it is removed, so one whose ack is being written is counted
        neither as held nor as ready. (Subtracting what this gateway holds from the
        listing's count, as before, left out a message whose file an ack had removed
        before the listing but whose hold was counted as settled only after it: a count
        too low, and ``queue.delete(if_empty)`` deleting a queue with a ready message.)
        """
        name = bus_queue_name(queue)
        for _ in range(_RECOUNTS):
            # ``info`` read before a subscription of the queue here began or ended (a
            # single-active consumer taking over from one cancelled): read again, since
            # the consumers are counted from it and from the subscriptions here now
            if info is not None and mark is not None and mark.seq == self.subs_seq:
                break
            mark = self.mark(queue)
            info = await self.bus.queue_info(name)
        assert info is not None
        assert mark is not None
        held = mark.held
        subs = self._subs.get(queue, ())
        consumers = self.counted_consumers(queue, info.consumers)
        if not info.depth:
            return 0, consumers
        if not held and info.consumers <= len(subs):
            return info.depth, consumers
        ready = 0
        async for m in self.bus.browse(queue=name):
            ready += not m.locked
        return ready, consumers

    async def ready_after_get(self, queue: str, waiting: int, consumers: int) -> int:
        """A basic.get's message count: the messages ready in ``queue`` besides the one
        it took. ``waiting``, from the take's listing, leaves out what this process holds;
        when another process consumes the queue too, what it holds is told by the locks
        (one browse)."""
        if consumers <= len(self._subs.get(queue, ())):
            return waiting
        ready = 0
        async for m in self.bus.browse(queue=bus_queue_name(queue)):
            ready += not m.locked
        return ready  # (the taken one is locked: held by this process)

    async def consumer_left(self, queue: str) -> None:
        """An AMQP consumer of ``queue`` left (cancelled, or its subscription settled): an
        auto-delete queue with no consumer left as RabbitMQ counts them (a basic.get is
        none, a cancelled one still settling neither) is deleted, as RabbitMQ does."""
        if self.consumers.get(queue):
            return
        name = bus_queue_name(queue)
        try:
            meta = await anyio.to_thread.run_sync(self.state.read, "queues", name)
            if not meta or not meta.get("auto_delete") or meta.get("name") != queue:
                return
            if await self.waiting_elsewhere(queue, meta):
                return
            info = await self.bus.queue_info(name)
            if self.counted_consumers(queue, info.consumers):
                return
            await self.bus.delete_queue(name)
            self.forget(queue)
            await anyio.to_thread.run_sync(self.state.remove, "queues", name)
            await self.unbind_deleted(queue)
        except (FsBusError, OSError):
            return  # gone already, or the bus is closing

    async def cancel_consumers_of(self, queue: str) -> None:
        for channel, tag in list(self.consumers.pop(queue, set())):
            with contextlib.suppress(Exception):
                await channel.server_cancel(tag)

    async def drop_exclusive(self, queue: str) -> None:
        """The connection owning exclusive queue ``queue`` ended: delete it."""
        await self.cancel_consumers_of(queue)
        with contextlib.suppress(QueueNotFound):
            await self.bus.delete_queue(bus_queue_name(queue))
        self.forget(queue)
        await anyio.to_thread.run_sync(self.state.remove, "queues", bus_queue_name(queue))
        await self.unbind_deleted(queue)

    async def bindings_of(self, exchange: str, kind: str) -> list[tuple[str, str | None]]:
        """The bindings to ``exchange``: (bus queue, its pattern), or (AMQP queue, None)
        for a headers exchange's."""
        if kind == "headers":
            # (those of a queue deleted by an fsbus process, not through a gateway, are
            # still written down: they count no more)
            return await anyio.to_thread.run_sync(self._live_headers_bindings, exchange)
        own = binding_pattern(exchange, kind, "")
        assert own is not None
        # a topic or direct exchange's patterns start "<kind prefix>.<exchange>."
        prefix = own if kind == "fanout" else own[: own.rindex(".") + 1]
        return [
            (info.name, p)
            for info in await self.bus.queues()
            for p in info.bindings
            if (p == prefix if kind == "fanout" else p.startswith(prefix))
        ]

    def queue_uid(self, queue: str) -> str | None:
        """Blocking: the uid of AMQP queue ``queue`` as the routing table knows it (a
        change on another process seen once it returned), or None if there is none."""
        try:
            return self.blocking._queues.current(bus_queue_name(queue)).uid
        except QueueNotFound:
            return None

    def bound_now(self, queue: str, uid: str) -> bool:
        """Blocking: does a headers binding made to the queue of ``uid`` still stand for
        AMQP queue ``queue`` (not deleted by an fsbus process since, or declared again)?"""
        now = self.queue_uid(queue)
        return now is not None and uid in (now, "")  # "": a record older than uids

    def _live_headers_bindings(self, exchange: str) -> list[tuple[str, str | None]]:
        return [
            (queue, None)
            for queue, _args, uid in self.state.headers_bindings(exchange)
            if self.bound_now(queue, uid)
        ]

    async def note_bound(self, exchange: str) -> bool:
        """A binding to ``exchange`` was just made: an auto-delete exchange now goes with
        its last binding (:meth:`drop_unbound`). False if the exchange was deleted
        meanwhile (by its last binding going, on any gateway): the caller takes its
        binding back and answers 404, as if the exchange had gone first."""
        fd = await anyio.to_thread.run_sync(self.state.lock)
        try:
            return await anyio.to_thread.run_sync(self.state.note_bound, exchange)
        finally:
            os.close(fd)

    async def unbind_deleted(self, queue: str) -> None:
        """AMQP queue ``queue`` was deleted: its bindings go with it (those to headers
        exchanges are the gateway's to remove; the others went with its bus queue), and
        so does an auto-delete exchange left without any."""
        await anyio.to_thread.run_sync(self.state.drop_headers_bindings_of, queue)
        await self.drop_unbound()

    async def drop_unbound(self, exchanges: Collection[str] | None = None) -> None:
        """Delete the auto-delete exchanges (of ``exchanges``, or all) whose last binding
        is gone, as RabbitMQ does when its last queue is unbound from one, or deleted.
        One never bound stays. Each is looked at under the AMQP ``LOCK``, which a bind
        takes to mark its exchange bound (:meth:`note_bound`): a bind on another gateway
        either comes first (its binding keeps the exchange) or finds it gone."""
        names = await anyio.to_thread.run_sync(self.state.bound_auto_delete, exchanges)
        for name in names:
            fd = await anyio.to_thread.run_sync(self.state.lock)
            try:
                ex = await anyio.to_thread.run_sync(self.state.exchange, name)
                if ex is None or not (ex.get("auto_delete") and ex.get("bound")):
                    continue
                if await self.bindings_of(name, str(ex.get("type"))):
                    continue
                log.info("auto-delete exchange %r lost its last binding: deleted", name)
                await anyio.to_thread.run_sync(self.state.remove, "exchanges", name)
                await anyio.to_thread.run_sync(self.state.remove, "headers", name)
            finally:
                os.close(fd)

    async def _collect_unbound(self) -> None:
        """:meth:`drop_unbound`, every :data:`UNBOUND_CHECK_SECONDS`: for the bindings that
        went with a queue no gateway deleted (an fsbus process's delete, an expiry)."""
        while True:
            await anyio.sleep(UNBOUND_CHECK_SECONDS)
            try:
                await self.drop_unbound()
            except (OSError, FsBusError) as exc:
                log.warning("looking for auto-delete exchanges left unbound failed: %s", exc)

    async def _collect_orphans(self) -> None:
        """Delete exclusive queues of gateways that died, now and every 30 s."""
        while True:
            try:
                names = await anyio.to_thread.run_sync(self.state.orphaned_exclusive_queues)
                for name in names:
                    log.info("deleting exclusive queue %r of a gateway that is gone", name)
                    await self.drop_exclusive(name)
            except OSError as exc:
                log.warning("collecting exclusive queues of dead gateways failed: %s", exc)
            await anyio.sleep(30)


async def serve(
    root: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 5672,
    users: Mapping[str, str] | None = None,
    config: BusConfig | None = None,
    ready: anyio.Event | None = None,
    disk_free_limit: int | None = None,
    inode_free_limit: int | None = None,
) -> None:
    """Run a gateway until cancelled; ``ready`` is set once it listens."""
    async with Gateway(
        root,
        host=host,
        port=port,
        users=users,
        config=config,
        disk_free_limit=disk_free_limit,
        inode_free_limit=inode_free_limit,
    ) as gw:
        log.info("fsbus AMQP gateway on %s for %s", gw.url, gw.root)
        if ready is not None:
            ready.set()
        await anyio.sleep_forever()
