"""One AMQP channel: exchanges, queues, publishing, consuming and acknowledgements, each
mapped onto the bus's topics and durable queues (see :mod:`fsbus.amqp._routing`)."""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from .. import (
    Decline,
    InvalidPattern,
    Message,
    QueueFull,
    QueueInfo,
    QueueMismatch,
    QueueNotFound,
    Requeue,
    Subscription,
    UsageError,
)
from ._frames import (
    EMPTY_PROPERTIES,
    FRAME_HEADER,
    RawFrame,
    confirm_frame,
    content_frames,
    decode_properties,
    deliver_frame,
    read_header,
    unchecked,
)
from ._routing import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    DEAD_TOPIC,
    EXCHANGE_TYPES,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    TOPIC_WORDS,
    UNEXPECTED_FRAME,
    X_MATCH,
    AmqpError,
    RouteJob,
    amqp_priority_to_bus,
    binding_pattern,
    bus_queue_name,
    expiration_seconds,
    own_pattern,
    queue_arguments,
)
from ._state import jsonable, try_lock

if TYPE_CHECKING:
    from ._contracts import ConnectionPort, CountMark

Settle = Callable[[BaseException | None], None]
"""The bus's callback for a message delivered with no task waiting (see
Subscription.deliver_now): None once acked, or what a handler would have raised."""

GetSettle = Callable[[BaseException | None], Awaitable[None]]
"""The bus's settle of a message a basic.get took (see Bus._take_held): None to ack it,
or the exception that gives it back."""

PROPS = "x-amqp-props"
EXCHANGE = "x-amqp-exchange"
ROUTING_KEY = "x-amqp-routing-key"
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
UNLIMITED_PREFETCH = 256
"""Messages claimed at once for a consumer with no prefetch limit."""
SINGLE_ACTIVE = "x-single-active-consumer"
SINGLE_POLL = 0.2
"""Seconds between a waiting single-active consumer's tries of its queue's lock (it is
woken at once when an active consumer of this gateway leaves)."""


def message_view(
    headers: Mapping[str, str], topic: str
) -> tuple[bytes | spec.Basic.Properties, str, str]:
    """(properties, marshalled or as pamqp properties; exchange; routing key) a client
    sees for a bus message with ``headers`` and ``topic``."""
    raw = headers.get(PROPS)
    if raw is not None:
        try:
            props = base64.b64decode(raw)
            decode_properties(props)  # pamqp's reading, kept for the content header
        except Exception:  # not base64, or not properties pamqp can read
            props = EMPTY_PROPERTIES
        return props, headers.get(EXCHANGE, ""), headers.get(ROUTING_KEY, topic)
    # published by fsbus or qlobber-fsq: its headers become the headers table
    table: dict[str, Any] = dict(headers) if headers else {}
    return spec.Basic.Properties(headers=table or None), "amq.topic", topic


class _Requeue(Requeue):
    """The client gave a message back (nack/reject with requeue, recover, close): a
    redelivery, at once and ahead of what follows it, as on RabbitMQ."""


@dataclass
class Pending:
    """A delivered message waiting for the client's ack, nack or reject."""

    msg: Message
    queue: str
    """The AMQP name of its queue."""
    done: anyio.Event | None = None
    """Set once the client settled it, for the task that waits (a handler's delivery);
    None for a delivery the bus settles through :attr:`settle` or :attr:`get_settle`."""
    outcome: str = "requeue"
    settle: Settle | None = None
    """A delivery with no task waiting for it (see Subscription.deliver_now): the bus's
    callback, called once the client settled it."""
    get_settle: GetSettle | None = None
    """A basic.get's: the bus's settle, awaited once the client settled it, before the
    method that settled it returns (see Channel._settle_gets)."""


@dataclass(eq=False)
class Consumer:
    tag: str
    queue: str
    """The AMQP name of the queue it consumes."""
    no_ack: bool
    prefetch: int = UNLIMITED_PREFETCH
    rank: int = 0
    """Its ``x-priority``: the gateway's consumers of a queue with room for a message,
    the highest first (see Subscription.rank)."""
    ready: anyio.Event = field(default_factory=anyio.Event)
    sub: Subscription | None = None
    exclusive: dict[str, Any] | None = None
    """Its file in the AMQP state (``exclusive/``) when it consumes exclusively."""
    single_fd: int | None = None
    """A consumer of an ``x-single-active-consumer`` queue: its own open file description
    of the queue's ``sac/`` file, whose flock it holds while it is the active one (closed
    once it has left, releasing the lock)."""
    active: bool = True
    """False while it waits to be its queue's single active consumer (no subscription)."""
    wake: anyio.Event = field(default_factory=anyio.Event)
    """Set to make a waiting consumer try the lock now (or see that it is gone)."""
    stopped: bool = False
    """Its subscription was stopped (it is done once)."""
    waiting_key: str | None = None
    """While it waits: its file in ``sac/<Q>.waiting/`` (see AmqpState.add_waiting)."""
    queued: int = 0
    """Its deliveries waiting in a handler to be sent (for its client's flow, its
    channel's prefetch or its consume-ok): none is sent past them."""


@dataclass
class _Publish:
    exchange: str
    routing_key: str
    mandatory: bool
    size: int = -1
    props: bytes = b""
    """The properties, as pamqp marshals what it read (stored with the message)."""
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    expiration: str | None = None
    reply_to: str | None = None
    user_id: str | None = None
    body: bytearray = field(default_factory=bytearray)


def _not_found_queue(name: str) -> AmqpError:
    return AmqpError(NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '/'")


def _locked(name: str) -> AmqpError:
    return AmqpError(
        RESOURCE_LOCKED,
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in "
        "vhost '/'. It could be originally declared on another connection or the "
        "exclusive property value does not match that of the original declaration.",
    )


def _not_found_exchange(name: str) -> AmqpError:
    return AmqpError(NOT_FOUND, f"NOT_FOUND - no exchange '{name}' in vhost '/'")


class Channel:
    """The state of one open channel of a connection."""

    def __init__(self, conn: ConnectionPort, number: int) -> None:
        self.conn = conn
        self.number = number
        self.gateway = conn.gateway
        self.bus = conn.gateway.bus
        self.state = conn.gateway.state
        self.closing = False
        self.confirm = False
        self.published = 0
        self.flow = anyio.Event()
        self.flow.set()
        self.prefetch = 0
        """``basic.qos``'s count for consumers started after it (0: none)."""
        self.shared_prefetch = 0
        """``basic.qos`` with ``global``: the count the channel's consumers share (0: none).
        Both limits apply where both are set, as on RabbitMQ."""
        self._room = anyio.Event()
        """Set (and replaced) whenever a consumer's delivery is settled: deliveries
        waiting for room under :attr:`shared_prefetch` look again."""
        self.next_tag = 1
        self.unacked: dict[int, Pending] = {}
        self.consumers: dict[str, Consumer] = {}
        self.last_queue = ""
        self._pub: _Publish | None = None
        self._last_info: QueueInfo | None = None
        self._last_meta: dict[str, Any] | None = None
        """The AMQP record :meth:`_queue_owner` read last."""
        self._last_mark: CountMark | None = None
        self._gets: list[tuple[Pending, str]] = []
        """basic.gets' messages the client settled (or the channel gave back) and their
        outcomes, to settle on disk before the method returns (:meth:`_settle_gets`)."""
        self._dead_letters = anyio.Lock()
        self.reply_queue: str | None = None
        """The queue of this channel's direct reply-to consumer, if it has one."""

    # ------------------------------------------------------------------ dispatch
    async def method(self, m: Any) -> None:
        if self.closing:
            if isinstance(m, spec.Channel.CloseOk):
                self.conn.channels.pop(self.number, None)
            return  # everything else is ignored until close-ok
        if self._pub is not None:
            raise AmqpError(
                UNEXPECTED_FRAME,
                f"UNEXPECTED_FRAME - expected content header for class 60, got {m.name}",
                connection=True,
            )
        handler = _HANDLERS.get(type(m))
        if handler is None:
            if m.name.startswith("Tx."):
                raise AmqpError(
                    NOT_IMPLEMENTED,
                    "NOT_IMPLEMENTED - transactions (tx.*) are not supported by the fsbus "
                    "gateway; use publisher confirms",
                    connection=True,
                )
            if m.name in ("Exchange.Bind", "Exchange.Unbind"):
                raise AmqpError(
                    NOT_IMPLEMENTED,
                    "NOT_IMPLEMENTED - exchange-to-exchange bindings are not supported by the "
                    "fsbus gateway; bind the queues to each exchange",
                    connection=True,
                )
            raise AmqpError(
                COMMAND_INVALID,
                f"COMMAND_INVALID - {m.name} is not valid on a channel",
                connection=True,
            )
        try:
            await handler(self, m)
        except QueueNotFound as exc:  # deleted meanwhile (auto-delete, another client)
            raise AmqpError(NOT_FOUND, f"NOT_FOUND - {exc}") from None

    async def reply(self, *frames: Any) -> None:
        await self.conn.send(self.number, *frames)

    # ------------------------------------------------------------------ channel
    async def _channel_close(self, m: spec.Channel.Close) -> None:
        await self.close()
        self.conn.channels.pop(self.number, None)
        await self.reply(spec.Channel.CloseOk())

    async def _flow(self, m: spec.Channel.Flow) -> None:
        if m.active:
            self.flow.set()
        elif self.flow.is_set():
            self.flow = anyio.Event()
        await self.reply(spec.Channel.FlowOk(active=bool(m.active)))

    async def close(self) -> None:
        """Cancel every consumer and give back every unacknowledged message."""
        consumers, self.consumers = list(self.consumers.values()), {}
        await self._give_back_unacked()
        self.flow.set()
        for c in consumers:
            c.ready.set()
            with anyio.CancelScope(shield=True):
                await self._leave(c)

    async def _give_back_unacked(self) -> None:
        """Requeue every message delivered and not yet settled (a basic.get's on disk
        before this returns)."""
        pending, self.unacked = list(self.unacked.values()), {}
        for p in pending:
            self._conclude(p, "requeue")
        self._made_room()
        await self._settle_gets()

    def _conclude(self, p: Pending, outcome: str) -> None:
        """The client settled ``p`` (or its channel went): tell whoever waits for it."""
        p.outcome = outcome
        if p.get_settle is not None:
            self._gets.append((p, outcome))
        elif p.settle is None:
            assert p.done is not None
            p.done.set()
        elif outcome == "ack":
            p.settle(None)
        elif outcome == "drop":
            # dead-lettered first (in order, see _settled), then acked
            self.conn.tasks.start_soon(self._dead_letter_then_ack, p)
        else:
            p.settle(_Requeue())

    async def _dead_letter_then_ack(self, p: Pending) -> None:
        assert p.settle is not None
        try:
            with anyio.CancelScope(shield=True):  # (the connection may be ending)
                async with self._dead_letters:
                    await self.gateway.dead_letter(p.queue, p.msg)
        except Exception as exc:  # not dead-lettered: given back, as the handler's would
            p.settle(exc)
        else:
            p.settle(None)

    async def _drop_exclusive(self, consumer: Consumer) -> None:
        """An exclusive consumer is gone: others may consume its queue again."""
        doc, consumer.exclusive = consumer.exclusive, None
        if doc is not None:
            queue = bus_queue_name(consumer.queue)
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(self.state.drop_exclusive_consumer, queue, doc)

    async def _leave(self, consumer: Consumer, *, unused: bool = True) -> None:
        """A consumer is gone (cancelled, or its channel closed): stop its subscription;
        with ``unused``, an auto-delete queue whose last consumer it was is deleted once
        its messages are settled (a ``basic.cancel`` deletes it before, see
        :meth:`_cancel`)."""
        self.gateway.consumers.get(consumer.queue, set()).discard((self, consumer.tag))
        await self._drop_exclusive(consumer)
        if consumer.sub is None:
            consumer.wake.set()  # a waiting single-active consumer: its wait ends
            if unused and not consumer.active:
                await self.gateway.consumer_left(consumer.queue)
            return
        await self._stop_sub(consumer)
        if unused:
            await self.gateway.consumer_left(consumer.queue)

    async def _stop_sub(self, consumer: Consumer) -> None:
        """End ``consumer``'s subscription (once; what it held is given back), then
        release its single-active lock, if it has one, for the next consumer."""
        sub = consumer.sub
        if sub is None or consumer.stopped:
            return
        consumer.stopped = True
        try:
            await self.bus.unsubscribe(sub)
        finally:
            self.gateway.untrack(consumer.queue, sub)
            self._unlock(consumer)

    def _unlock(self, consumer: Consumer) -> None:
        """Close ``consumer``'s single-active file (releasing its lock, if it held it) and
        wake the next waiting consumer of its queue here."""
        fd, consumer.single_fd = consumer.single_fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.close(fd)
        self.gateway.wake_single(consumer.queue)

    # ------------------------------------------------------------------ exchanges
    async def _exchange_declare(self, m: spec.Exchange.Declare) -> None:
        name = m.exchange or ""
        existing = await anyio.to_thread.run_sync(self.state.exchange, name)
        if m.passive:
            if existing is None:
                raise _not_found_exchange(name)
        else:
            if name == "":
                raise AmqpError(
                    ACCESS_REFUSED,
                    "ACCESS_REFUSED - operation not permitted on the default exchange",
                )
            if name.startswith("amq.") and existing is None:
                raise AmqpError(
                    ACCESS_REFUSED,
                    f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'",
                )
            if m.exchange_type not in EXCHANGE_TYPES:
                raise AmqpError(
                    COMMAND_INVALID,
                    f"COMMAND_INVALID - unknown exchange type '{m.exchange_type}'",
                    connection=True,
                )
            if existing is not None:  # (a predeclared amq.* one is durable, as RabbitMQ's)
                for key, got in (
                    ("type", m.exchange_type),
                    ("durable", bool(m.durable)),
                    ("auto_delete", bool(m.auto_delete)),
                    ("internal", bool(m.internal)),
                ):
                    if existing.get(key) != got:
                        raise AmqpError(
                            PRECONDITION_FAILED,
                            f"PRECONDITION_FAILED - inequivalent arg '{key}' for exchange "
                            f"'{name}' in vhost '/': received '{_show(got)}' but current is "
                            f"'{_show(existing.get(key))}'",
                        )
            else:
                doc = {
                    "name": name,
                    "type": m.exchange_type,
                    "durable": bool(m.durable),
                    "auto_delete": bool(m.auto_delete),
                    "internal": bool(m.internal),
                    "arguments": jsonable(m.arguments or {}),
                }
                await anyio.to_thread.run_sync(self.state.write, "exchanges", name, doc)
        if not m.nowait:
            await self.reply(spec.Exchange.DeclareOk())

    async def _exchange_delete(self, m: spec.Exchange.Delete) -> None:
        name = m.exchange or ""
        if name.startswith("amq.") or name == "":
            raise AmqpError(
                ACCESS_REFUSED,
                f"ACCESS_REFUSED - operation not permitted on the default or 'amq.*' "
                f"exchange '{name}'",
            )
        ex = await anyio.to_thread.run_sync(self.state.exchange, name)
        if ex is not None:
            # Its bindings go with it, as on RabbitMQ (an exchange declared again by
            # that name starts with none); ``if-unused`` refuses while it has any.
            bound = await self.gateway.bindings_of(name, ex["type"])
            if m.if_unused and bound:
                raise AmqpError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use",
                )
            await anyio.to_thread.run_sync(self.state.remove, "exchanges", name)
            for queue, pattern in bound:
                if pattern is not None:
                    with contextlib.suppress(QueueNotFound):
                        await self.bus.unbind_queue(queue, pattern)
        await anyio.to_thread.run_sync(self.state.remove, "headers", name)
        if not m.nowait:
            await self.reply(spec.Exchange.DeleteOk())

    async def _exchange_of(self, name: str) -> dict[str, Any]:
        ex = await anyio.to_thread.run_sync(self.state.exchange, name)
        if ex is None:
            raise _not_found_exchange(name)
        return ex

    # ------------------------------------------------------------------ queues
    async def _queue_meta(self, name: str) -> dict[str, Any] | None:
        """The AMQP side of queue ``name``, if the bus has the queue (its bus info as
        :attr:`_last_info`)."""
        self._last_info = None
        self._last_mark = self.gateway.mark(name)  # before the listing: see ready_count
        try:
            info = await self.bus.queue_info(bus_queue_name(name))
        except QueueNotFound:
            return None
        except UsageError:
            return None
        meta = await anyio.to_thread.run_sync(self.state.read, "queues", bus_queue_name(name))
        if meta is None:  # a queue of the bus that no gateway declared
            meta = {
                "name": name,
                "durable": True,
                "exclusive": False,
                "auto_delete": info.options.auto_delete,
                "arguments": {},
                "owner": None,
            }
        meta["bus_auto_delete"] = info.options.auto_delete
        self._last_info = info
        return meta

    async def _queue_owner(self, name: str) -> dict[str, Any] | None:
        """The AMQP side of queue ``name`` as far as exclusivity goes, uncounted: what
        the gateways recorded, or (a queue of the bus that no gateway declared, or one
        that does not exist) no owner."""
        self._last_info = None
        meta = await anyio.to_thread.run_sync(self.state.read, "queues", bus_queue_name(name))
        self._last_meta = meta
        return meta if meta is not None else {"name": name, "owner": None}

    def _check_exclusive(self, name: str, meta: dict[str, Any]) -> None:
        owner = meta.get("owner")
        if owner and owner != self.conn.id and self.state.owner_alive(str(owner)):
            raise _locked(name)

    async def _queue_declare(self, m: spec.Queue.Declare, *, internal: bool = False) -> None:
        name = m.queue or ""
        generated = name == ""
        if generated:
            name = "amq.gen-" + base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip(
                "="
            )
        elif name.startswith("amq.") and not m.passive and not internal:
            raise AmqpError(
                ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'",
            )
        meta = await self._queue_meta(name)
        if m.passive:
            if meta is None:
                raise _not_found_queue(name)
            self._check_exclusive(name, meta)
        else:
            args = queue_arguments(m.arguments)
            wanted = {
                "name": name,
                "durable": bool(m.durable),
                "exclusive": bool(m.exclusive),
                "auto_delete": bool(m.auto_delete),
                "arguments": jsonable(m.arguments or {}),
                "owner": self.conn.id if m.exclusive else None,
            }
            if meta is not None:
                self._check_exclusive(name, meta)
                if bool(meta.get("exclusive")) != wanted["exclusive"]:
                    raise _locked(name)  # (as RabbitMQ: not an inequivalent arg)
                for key in ("durable", "auto_delete"):
                    if meta.get(key) != wanted[key]:
                        raise AmqpError(
                            PRECONDITION_FAILED,
                            f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{name}' "
                            f"in vhost '/': received '{_show(wanted[key])}' but current is "
                            f"'{_show(meta.get(key))}'",
                        )
                have = meta.get("arguments") or {}
                for key in sorted(set(have) | set(wanted["arguments"])):
                    if have.get(key) != wanted["arguments"].get(key):
                        raise AmqpError(
                            PRECONDITION_FAILED,
                            f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{name}' "
                            f"in vhost '/': received {_arg(wanted['arguments'].get(key))} but "
                            f"current is {_arg(have.get(key))}",
                        )
            # With a dead-letter exchange, a message that expires in the queue, or (with
            # x-delivery-limit) is delivered one time more than the limit and given back
            # each time, goes to the exchange (resolved then, as RabbitMQ does): from the
            # gateway that finds it, or through the gateways' own queue; without one it
            # is dropped.
            limit = args.delivery_limit
            dead_letter = DEAD_TOPIC if args.dead_letter_exchange is not None else None
            try:
                await self.bus.declare_queue(
                    bus_queue_name(name),
                    [own_pattern(name)],
                    message_ttl=args.message_ttl,
                    max_length=args.max_length,
                    overflow=args.bus_overflow,
                    dead_letter=dead_letter,
                    max_deliveries=None if limit is None else limit + 1,
                    # the gateway deletes an auto-delete queue when its last AMQP
                    # consumer leaves (see Gateway.consumer_left): a basic.get is no
                    # consumer. A queue the bus already deletes so keeps its option.
                    auto_delete=bool(meta is not None and meta.get("bus_auto_delete")),
                    expires=args.expires,
                    dead_letter_expired=dead_letter is not None,
                    dead_letter_dropped=args.dead_letters_overflow,
                )
            except QueueMismatch as exc:
                raise AmqpError(PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc}") from None
            except UsageError as exc:
                raise AmqpError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue name '{name}' cannot name an fsbus queue: {exc}",
                ) from None
            if meta is None or any(meta.get(k) != v for k, v in wanted.items()):
                await anyio.to_thread.run_sync(
                    self.state.write, "queues", bus_queue_name(name), wanted
                )
            if m.exclusive:
                self.conn.exclusive.add(name)
        self.last_queue = name
        # the queue is listed once: a declare of a queue that was there (a client
        # polling its depth with passive declares) counts what _queue_meta found
        ready, consumers = await self.gateway.ready_count(name, self._last_info, self._last_mark)
        consumers += await self.gateway.waiting_elsewhere(name, meta)
        if not m.nowait:
            await self.reply(
                unchecked(
                    spec.Queue.DeclareOk,
                    queue=name,
                    message_count=ready,
                    consumer_count=consumers,
                )
            )

    def _named(self, name: str) -> str:
        """The queue a method names: the channel's last one if empty (404 if none)."""
        name = name or self.last_queue
        if not name:
            raise AmqpError(NOT_FOUND, "NOT_FOUND - no previously declared queue")
        return name

    async def _queue_name(self, name: str, *, count: bool = True) -> str:
        """The queue a method names (the channel's last one if empty), checked: 404 if
        it does not exist, 405 if another connection holds it exclusively. ``count=False``
        leaves out the count (:attr:`_last_info`) and the bus's check (the caller's use of
        the queue raises QueueNotFound)."""
        name = self._named(name)
        meta = await (self._queue_meta(name) if count else self._queue_owner(name))
        if meta is None:
            raise _not_found_queue(name)
        self._check_exclusive(name, meta)
        return name

    async def _queue_bind(self, m: spec.Queue.Bind, *, bind: bool = True) -> None:
        if not m.exchange:
            raise AmqpError(
                ACCESS_REFUSED, "ACCESS_REFUSED - operation not permitted on the default exchange"
            )
        try:
            name = await self._queue_name(m.queue)
            ex = await self._exchange_of(m.exchange)
        except AmqpError as exc:
            if bind or exc.code != NOT_FOUND:
                raise
            # unbinding from a queue or an exchange that is not there: done, as on
            # RabbitMQ (no binding is left behind)
            await self.reply(spec.Queue.UnbindOk())
            return
        if ex["type"] == "headers":
            args = jsonable(m.arguments or {})
            mode = args.get("x-match", "all")
            if bind and mode not in X_MATCH:
                raise AmqpError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - Invalid x-match field value {mode!r}; expected "
                    "all, any, all-with-x, or any-with-x",
                )

            def change() -> None:
                uid = self.gateway.queue_uid(name)
                if bind and uid is None:
                    raise _not_found_queue(name)  # deleted since its name was read
                with self.state.locked():
                    # (those of queues deleted by fsbus processes, or declared again,
                    # go now: they stand for no queue)
                    current = [
                        b
                        for b in self.state.headers_bindings(m.exchange)
                        if self.gateway.bound_now(b[0], b[2]) and b[:2] != (name, args)
                    ]
                    if bind and uid is not None:
                        current.append((name, args, uid))
                    self.state.set_headers_bindings(m.exchange, current)

            await anyio.to_thread.run_sync(change)
        else:
            pattern = binding_pattern(m.exchange, ex["type"], m.routing_key or "")
            assert pattern is not None
            try:
                if bind:
                    await self.bus.bind_queue(bus_queue_name(name), pattern)
                else:
                    await self.bus.unbind_queue(bus_queue_name(name), pattern)
            except InvalidPattern as exc:
                key = m.routing_key or ""
                words = key.count(".") + 1
                most = TOPIC_WORDS - (pattern.count(".") + 1 - words)
                if words <= most:
                    raise AmqpError(PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc}") from None
                raise AmqpError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - a binding key of {words} words: exchange "
                    f"'{m.exchange}' takes keys of at most {most} words on the fsbus gateway",
                ) from None
            except UsageError as exc:
                raise AmqpError(PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc}") from None
            except QueueNotFound:  # deleted meanwhile by another process
                if bind:
                    raise _not_found_queue(name) from None
        if ex.get("auto_delete"):
            # RabbitMQ deletes an auto-delete exchange when its last binding goes
            if not bind:
                await self.gateway.drop_unbound([m.exchange])
            elif not await self.gateway.note_bound(m.exchange):
                # its last binding went (on another gateway) as this one was made: as if
                # it had gone first, this one is taken back
                if ex["type"] == "headers":
                    await anyio.to_thread.run_sync(self.state.remove, "headers", m.exchange)
                else:
                    undo = binding_pattern(m.exchange, ex["type"], m.routing_key or "")
                    with contextlib.suppress(QueueNotFound):
                        await self.bus.unbind_queue(bus_queue_name(name), undo or "")
                raise _not_found_exchange(m.exchange)
        if bind and not m.nowait:
            await self.reply(spec.Queue.BindOk())
        elif not bind:
            await self.reply(spec.Queue.UnbindOk())

    async def _queue_unbind(self, m: spec.Queue.Unbind) -> None:
        await self._queue_bind(m, bind=False)  # type: ignore[arg-type]

    async def _queue_purge(self, m: spec.Queue.Purge) -> None:
        name = await self._queue_name(m.queue)
        n = await self.bus.purge_queue(bus_queue_name(name))
        if not m.nowait:
            await self.reply(spec.Queue.PurgeOk(message_count=n))

    async def _queue_delete(self, m: spec.Queue.Delete) -> None:
        name = m.queue or self.last_queue
        meta = await self._queue_meta(name)
        if meta is None:
            if not m.nowait:
                await self.reply(spec.Queue.DeleteOk(message_count=0))
            return
        self._check_exclusive(name, meta)
        elsewhere = await self.gateway.waiting_elsewhere(name, meta) if m.if_unused else 0
        mark = self.gateway.mark(name)  # before the listing: see Gateway.ready_count
        try:
            info = await self.bus.queue_info(bus_queue_name(name))
            # "empty", like delete-ok's count, is the ready messages, as RabbitMQ counts
            # them: one delivered and not yet acked (or whose ack is still being
            # written) leaves the queue empty
            ready = (await self.gateway.ready_count(name, info, mark))[0] if info.depth else 0
        except QueueNotFound:  # its bus queue went meanwhile (deleted by another process)
            info, ready = None, 0
        if info is not None and m.if_unused:
            if elsewhere or self.gateway.counted_consumers(name, info.consumers):
                raise AmqpError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use",
                )
        if m.if_empty and ready:
            raise AmqpError(
                PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - queue '{name}' in vhost '/' is not empty",
            )
        await self.gateway.cancel_consumers_of(name)
        try:
            deleted = await self.bus.delete_queue(bus_queue_name(name))
        except QueueNotFound:
            deleted = 0
        # less those held when counted (a message published since is counted)
        n = max(0, deleted - (info.depth - ready)) if info is not None else 0
        self.gateway.forget(name)
        await anyio.to_thread.run_sync(self.state.remove, "queues", bus_queue_name(name))
        self.conn.exclusive.discard(name)
        await self.gateway.unbind_deleted(name)
        if not m.nowait:
            await self.reply(spec.Queue.DeleteOk(message_count=n))

    # ------------------------------------------------------------------ publishing
    async def _publish(self, m: spec.Basic.Publish) -> None:
        self._pub = _Publish(m.exchange or "", m.routing_key or "", bool(m.mandatory))

    async def content(self, raw: RawFrame) -> None:
        pub = self._pub
        if self.closing:
            return
        if pub is None:
            raise AmqpError(
                UNEXPECTED_FRAME,
                f"UNEXPECTED_FRAME - content frame on channel {self.number} with no "
                "basic.publish before it",
                connection=True,
            )
        if raw.kind == FRAME_HEADER:
            if pub.size >= 0:
                raise AmqpError(
                    UNEXPECTED_FRAME, "UNEXPECTED_FRAME - a second content header", connection=True
                )
            try:
                header = read_header(raw)
            except Exception as exc:
                raise AmqpError(
                    COMMAND_INVALID, f"COMMAND_INVALID - bad content header: {exc}", connection=True
                ) from None
            props = header.properties
            pub.size, pub.props = header.body_size, header.props
            pub.headers = props.headers
            pub.delivery_mode = props.delivery_mode
            pub.priority = props.priority
            pub.expiration = props.expiration
            pub.reply_to = props.reply_to
            pub.user_id = props.user_id
            if pub.reply_to == DIRECT_REPLY_TO:
                pub.props = self._direct_reply_props(raw)
        else:
            if pub.size < 0:
                raise AmqpError(
                    UNEXPECTED_FRAME,
                    "UNEXPECTED_FRAME - content body before its header",
                    connection=True,
                )
            pub.body += raw.payload
            if len(pub.body) > pub.size:
                raise AmqpError(
                    COMMAND_INVALID,
                    f"COMMAND_INVALID - content body longer than its header said ({pub.size})",
                    connection=True,
                )
        if pub.size >= 0 and len(pub.body) == pub.size:
            self._pub = None
            self.published += 1
            # routed with the other publishes of this read, in one worker-thread hop
            self.conn.publishes.append((self, self.published, pub, self._job(pub)))

    def _direct_reply_props(self, raw: RawFrame) -> bytes:
        """The properties of a publish whose reply-to is ``amq.rabbitmq.reply-to``,
        that property naming this channel's reply queue instead (as RabbitMQ does)."""
        if self.reply_queue is None:
            raise AmqpError(
                PRECONDITION_FAILED, "PRECONDITION_FAILED - fast reply consumer does not exist"
            )
        _n, _c, decoded = pframe.unmarshal(raw.data)
        assert isinstance(decoded, pheader.ContentHeader)
        decoded.properties.reply_to = self.reply_queue
        return decoded.properties.marshal()

    async def _direct_reply_queue(self, m: spec.Basic.Consume) -> str:
        """Direct reply-to: a consumer of ``amq.rabbitmq.reply-to`` consumes a queue of
        this connection's own (exclusive, auto-delete), named in the reply-to property of
        what the channel publishes; replies reach it through the default exchange."""
        if not m.no_ack:
            raise AmqpError(
                PRECONDITION_FAILED, "PRECONDITION_FAILED - reply consumer cannot acknowledge"
            )
        if self.reply_queue is not None:
            raise AmqpError(PRECONDITION_FAILED, "PRECONDITION_FAILED - reply consumer already set")
        name = f"{DIRECT_REPLY_TO}.{secrets.token_urlsafe(16)}"
        last = self.last_queue
        declare = spec.Queue.Declare(queue=name, exclusive=True, auto_delete=True, nowait=True)
        await self._queue_declare(declare, internal=True)
        self.last_queue = last
        self.reply_queue = name
        return name

    def _job(self, pub: _Publish) -> RouteJob:
        """What the gateway needs to route a complete publish (a bad expiration is kept
        as the job's error, raised in its turn)."""
        exchange, rk = pub.exchange, pub.routing_key
        job = RouteJob(
            exchange,
            rk,
            pub.headers,
            bytes(pub.body),
            ttl=None,
            durable=pub.delivery_mode == 2,
            headers={
                PROPS: base64.b64encode(pub.props).decode("ascii"),
                EXCHANGE: exchange,
                ROUTING_KEY: rk,
            },
            priority=amqp_priority_to_bus(pub.priority),
            amqp_priority=pub.priority,
        )
        try:
            job.ttl = expiration_seconds(pub.expiration)
        except AmqpError as exc:
            job.error = exc
        if pub.user_id is not None and pub.user_id != self.conn.user:
            # as RabbitMQ: a message may only name its publisher's own login
            job.error = AmqpError(
                PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - user_id property set to '{pub.user_id}' but "
                f"authenticated user was '{self.conn.user}'",
            )
        return job

    def routed(self, seq: int, pub: _Publish, job: RouteJob, outcome: int | BaseException) -> bytes:
        """The frames answering a publish once routed: basic.return if it was mandatory
        and reached no queue, the confirm. AmqpError if the publish was a channel error."""
        if isinstance(outcome, AmqpError):
            raise outcome
        if isinstance(outcome, QueueFull):
            routed, ok = 1, False
        elif isinstance(outcome, BaseException):  # a storage failure (full disk...): nack
            routed, ok = 0, False
        else:
            routed, ok = outcome, True
        out = b""
        if not routed and pub.mandatory:
            out += pframe.marshal(
                unchecked(
                    spec.Basic.Return,
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=job.exchange,
                    routing_key=job.routing_key,
                ),
                self.number,
            ) + content_frames(self.number, pub.props, job.body, self.conn.frame_max)
        if self.confirm:
            out += confirm_frame(self.number, seq, ok)
        return out

    async def _confirm_select(self, m: spec.Confirm.Select) -> None:
        self.confirm = True
        if not m.nowait:
            await self.reply(spec.Confirm.SelectOk())

    # ------------------------------------------------------------------ consuming
    async def _qos(self, m: spec.Basic.Qos) -> None:
        if m.prefetch_size:
            # RabbitMQ limits by count only, and closes the connection on a size
            raise AmqpError(
                NOT_IMPLEMENTED,
                f"NOT_IMPLEMENTED - prefetch_size!=0 ({m.prefetch_size})",
                connection=True,
            )
        if m.global_:
            self.shared_prefetch = m.prefetch_count or 0
            self._made_room()  # (a higher count lets waiting deliveries go)
        else:
            self.prefetch = m.prefetch_count or 0
        await self.reply(spec.Basic.QosOk())

    def _made_room(self) -> None:
        """Wake the deliveries waiting for room under :attr:`shared_prefetch` (a settle,
        a new count, or a consumer gone: theirs then go back untouched)."""
        self._room.set()
        self._room = anyio.Event()

    def _held_by_consumers(self) -> int:
        """Deliveries to this channel's consumers not yet settled (basic.gets' left out:
        RabbitMQ's prefetch does not count them)."""
        return sum(1 for p in self.unacked.values() if p.get_settle is None)

    async def _consume(self, m: spec.Basic.Consume) -> None:
        self._last_meta = None
        if m.queue == DIRECT_REPLY_TO:
            name = await self._direct_reply_queue(m)
        else:
            # uncounted: the subscription below says if the queue is gone
            name = await self._queue_name(m.queue, count=False)
        tag = m.consumer_tag or "amq.ctag-" + base64.urlsafe_b64encode(
            secrets.token_bytes(16)
        ).decode().rstrip("=")
        if tag in self.consumers:
            raise AmqpError(
                NOT_ALLOWED,
                f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
                connection=True,
            )
        in_use = AmqpError(
            ACCESS_REFUSED, f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use"
        )
        held = await anyio.to_thread.run_sync(self.state.exclusive_consumer, bus_queue_name(name))
        if held is not None:
            raise in_use
        if m.exclusive:
            # a consumer this gateway cancelled is gone, though its subscription may still
            # be settling (holding its consumer file), as for the counts: counted now,
            # with no await between the bus's count and the gateway's
            if await self.gateway.waiting_elsewhere(name, self._last_meta):
                raise in_use
            try:
                info = await self.bus.queue_info(bus_queue_name(name))
            except QueueNotFound:
                raise _not_found_queue(name) from None
            if self.gateway.counted_consumers(name, info.consumers):
                raise in_use
        meta: dict[str, Any] = self._last_meta or {}
        single: dict[str, Any] = meta.get("arguments") or {}
        # claimed ahead at most what it may be sent: its own count, and the channel's
        own = self.prefetch or UNLIMITED_PREFETCH
        prefetch = min(own, self.shared_prefetch) if self.shared_prefetch else own
        rank = (m.arguments or {}).get("x-priority", 0)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise AmqpError(
                PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{name}' in "
                f"vhost '/': {rank!r} is not an integer",
            )
        consumer = Consumer(tag, name, bool(m.no_ack), prefetch=prefetch, rank=rank)
        if m.exclusive:
            consumer.exclusive = {"owner": self.conn.id, "tag": tag}
            if not await anyio.to_thread.run_sync(
                self.state.take_exclusive_consumer, bus_queue_name(name), consumer.exclusive
            ):
                raise in_use
        try:
            if single.get(SINGLE_ACTIVE) is True:
                # one consumer at a time, on every gateway of the bus: the one holding
                # the flock of the queue's sac/ file; the others wait for it
                consumer.single_fd = await anyio.to_thread.run_sync(
                    self.state.open_single_active, bus_queue_name(name)
                )
                consumer.active = await anyio.to_thread.run_sync(try_lock, consumer.single_fd)
                if not consumer.active:
                    await self.bus.queue_info(bus_queue_name(name))  # (404 if gone)
                    consumer.waiting_key = secrets.token_hex(8)
                    await anyio.to_thread.run_sync(
                        self.state.add_waiting, bus_queue_name(name), consumer.waiting_key
                    )
            self.consumers[tag] = consumer
            if consumer.active:
                await self._subscribe(consumer)
        except BaseException as exc:
            self.consumers.pop(tag, None)
            with anyio.CancelScope(shield=True):
                await self._drop_exclusive(consumer)
                await self._not_waiting(consumer)
                self._unlock(consumer)
            if isinstance(exc, QueueNotFound):
                raise _not_found_queue(name) from None
            raise
        self.gateway.consumers.setdefault(name, set()).add((self, tag))
        if not consumer.active:
            self.conn.tasks.start_soon(self._wait_active, consumer)
        if not m.nowait:
            await self.reply(spec.Basic.ConsumeOk(consumer_tag=tag))
        consumer.ready.set()

    async def _subscribe(self, consumer: Consumer) -> None:
        """Subscribe ``consumer`` to its bus queue: its messages are delivered."""
        tag = consumer.tag

        async def handle(msg: Message) -> None:
            consumer.queued += 1  # (deliver_now sends nothing past it meanwhile)
            try:
                # (waiting on a set event would still yield to the loop once per message)
                if not consumer.ready.is_set():
                    await consumer.ready.wait()
                if not self.flow.is_set():
                    await self.flow.wait()
                while (
                    self.shared_prefetch
                    and not consumer.no_ack
                    and self._held_by_consumers() >= self.shared_prefetch
                    and self.consumers.get(tag) is consumer
                ):
                    # the channel's consumers share its count (basic.qos with global):
                    # sent once another's delivery is settled
                    await self._room.wait()
                if self.consumers.get(tag) is not consumer:
                    # cancelled before it was sent: back untouched (not "redelivered")
                    raise Decline
            finally:
                consumer.queued -= 1
            await self._deliver(consumer, msg)

        def deliver_now(msg: Message, settle: Settle) -> bool:
            # No task: sent at once, unless handle would wait (then it does), or one is
            # waiting already (this one would overtake it)
            if (
                consumer.queued
                or not consumer.ready.is_set()
                or not self.flow.is_set()
                or self.consumers.get(tag) is not consumer
                or (
                    self.shared_prefetch
                    and not consumer.no_ack
                    and self._held_by_consumers() >= self.shared_prefetch
                )
            ):
                return False
            return self._deliver_now(consumer, msg, settle)

        consumer.sub = await self.bus.subscribe(
            None, handle, queue=bus_queue_name(consumer.queue), prefetch=consumer.prefetch
        )
        consumer.sub.deliver_now = deliver_now
        consumer.sub.rank = consumer.rank
        consumer.sub.on_queue_gone = functools.partial(
            self._queue_gone, consumer.queue, tag, consumer
        )
        self.gateway.track(consumer.queue, consumer.sub)

    async def _wait_active(self, consumer: Consumer) -> None:
        """A waiting consumer of a single-active-consumer queue: once it holds the
        queue's lock (its active consumer left, on any gateway), it subscribes. The wait
        ends when it is cancelled, its channel or connection closes, or its queue is
        deleted (then the client is sent basic.cancel)."""
        waiting = self.gateway.single_waiters.setdefault(consumer.queue, [])
        waiting.append(consumer)
        try:
            fd = consumer.single_fd
            while self.consumers.get(consumer.tag) is consumer and fd is not None:
                if await anyio.to_thread.run_sync(try_lock, fd):
                    break
                with anyio.move_on_after(SINGLE_POLL):
                    await consumer.wake.wait()
                consumer.wake = anyio.Event()
            else:
                return
            if self.consumers.get(consumer.tag) is not consumer:
                return  # gone while it took the lock (released below)
            try:
                with anyio.CancelScope(shield=True):  # (a subscription is not left behind)
                    await self._subscribe(consumer)
            except Exception:  # deleted meanwhile, or the bus is closing: cancelled
                await self._queue_gone(consumer.queue, consumer.tag, consumer)
                return
            consumer.active = True
            await self._not_waiting(consumer)
            if self.consumers.get(consumer.tag) is not consumer:
                await self._stop_sub(consumer)  # gone while it subscribed
        finally:
            await self._not_waiting(consumer)
            with contextlib.suppress(ValueError):
                waiting.remove(consumer)
            if not waiting and self.gateway.single_waiters.get(consumer.queue) is waiting:
                del self.gateway.single_waiters[consumer.queue]
            if consumer.sub is None:
                self._unlock(consumer)

    async def _not_waiting(self, consumer: Consumer) -> None:
        """``consumer`` waits no more: its file for the other gateways' counts goes."""
        key, consumer.waiting_key = consumer.waiting_key, None
        if key is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(
                    self.state.drop_waiting, bus_queue_name(consumer.queue), key
                )

    def _delivery(self, consumer: Consumer, msg: Message, tag: int) -> bytes:
        """The frames of ``msg``'s basic.deliver to ``consumer`` with delivery tag ``tag``."""
        props, exchange, rk = message_view(msg.headers, msg.topic)
        method = deliver_frame(self.number, consumer.tag, tag, msg.delivery_count > 1, exchange, rk)
        return method + content_frames(self.number, props, msg.payload, self.conn.frame_max)

    async def _deliver(self, consumer: Consumer, msg: Message) -> None:
        tag = self.next_tag
        self.next_tag += 1
        pending = None
        if not consumer.no_ack:
            pending = Pending(msg, consumer.queue, done=anyio.Event())
            self.unacked[tag] = pending
        await self.conn.send_soon(self._delivery(consumer, msg, tag))
        if pending is not None:
            await self._settled(pending)

    def _deliver_now(self, consumer: Consumer, msg: Message, settle: Settle) -> bool:
        """:meth:`_deliver` with no task waiting for the client's ack: the bus's
        ``settle`` is called once it comes. False (nothing sent) when the connection's
        output is backed up: the delivery then waits for it in a handler."""
        tag = self.next_tag
        if not self.conn.send_soon_nowait(self._delivery(consumer, msg, tag)):
            return False
        self.next_tag += 1
        if consumer.no_ack:
            settle(None)
        else:
            self.unacked[tag] = Pending(msg, consumer.queue, settle=settle)
        return True

    async def _settled(self, pending: Pending) -> None:
        assert pending.done is not None
        await pending.done.wait()
        if pending.outcome == "ack":
            return
        if pending.outcome == "drop":
            # one at a time, in the order the client settled them (the waiters are woken
            # in that order, and the lock is fair): dead-lettered in that order, as on
            # RabbitMQ, not in whichever order their publishes happened to finish
            async with self._dead_letters:
                await self.gateway.dead_letter(pending.queue, pending.msg)
            return
        raise _Requeue

    async def _cancel(self, m: spec.Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag or "", None)
        self._made_room()
        if consumer is not None:
            if consumer.queue == self.reply_queue:
                self.reply_queue = None
            self.gateway.consumers.get(consumer.queue, set()).discard((self, consumer.tag))
            await self._drop_exclusive(consumer)
            # RabbitMQ deletes an auto-delete queue with its last consumer, before the
            # cancel-ok, though that consumer's messages are not acked yet (they go with
            # it): a passive declare after the cancel-ok is a 404. Its subscription then
            # settles in the background; deleting again after it could take a queue of
            # the same name that the client declared since.
            await self.gateway.consumer_left(consumer.queue)
            self.conn.tasks.start_soon(functools.partial(self._leave, consumer, unused=False))
        if not m.nowait:
            await self.reply(spec.Basic.CancelOk(consumer_tag=m.consumer_tag))

    async def _queue_gone(self, name: str, tag: str, consumer: Consumer) -> None:
        """The bus ended ``consumer`` (tag ``tag``): queue ``name`` was deleted elsewhere
        (through another gateway, or by an fsbus process). RabbitMQ cancels the
        consumers of a deleted queue: so does the gateway (this one only: one of a queue
        declared again since goes on)."""
        if self.consumers.get(tag) is not consumer:
            return  # cancelled meanwhile (its tag perhaps taken again by another)
        mine = self.gateway.consumers.get(name)
        if mine is not None:
            mine.discard((self, tag))
            if not mine:
                del self.gateway.consumers[name]
        with contextlib.suppress(Exception):  # (the channel may be closing meanwhile)
            await self.server_cancel(tag)

    async def server_cancel(self, tag: str) -> None:
        """The queue went away: cancel the consumer and tell the client if it listens."""
        consumer = self.consumers.pop(tag, None)
        self._made_room()
        if consumer is None:
            return
        await self._drop_exclusive(consumer)
        if consumer.sub is not None:
            self.conn.tasks.start_soon(self._stop_sub, consumer)
        else:
            consumer.wake.set()  # a waiting single-active consumer: its wait ends
        if self.conn.capabilities.get("consumer_cancel_notify"):
            await self.reply(spec.Basic.Cancel(consumer_tag=tag, nowait=True))

    async def _settle_gets(self) -> None:
        """Settle on disk what the client settled of this channel's basic.gets (in that
        order), before the method that settled them returns: RabbitMQ has done a settle
        before the channel's next method, so a get after a requeue takes the message
        given back, and a count after an ack or a requeue counts what it left."""
        while self._gets:
            p, outcome = self._gets.pop(0)
            assert p.get_settle is not None
            exc: BaseException | None = None if outcome in ("ack", "drop") else _Requeue()
            try:
                if outcome == "drop":
                    # dead-lettered first, in the order the client settled it (the lock
                    # orders it with the consumers' drops), then acked
                    async with self._dead_letters:
                        await self.gateway.dead_letter(p.queue, p.msg)
            except Exception as err:  # not dead-lettered: given back, as a failed delivery
                exc = err
            except BaseException as err:  # cancelled: given back, then the cancellation
                exc = err
                raise
            finally:
                await self._settle_get(p.queue, p.get_settle, exc)

    async def _settle_get(self, queue: str, settle: GetSettle, exc: BaseException | None) -> None:
        """Settle a basic.get's message on disk (None: ack it; else give it back); it
        counts as ready again only then (see Gateway.taken)."""
        try:
            await settle(exc)
        finally:
            self.gateway.taken(queue, -1)

    async def _get(self, m: spec.Basic.Get) -> None:
        # Not counted first: the take lists the queue, and says what else is ready. The
        # exclusivity check (405) runs inside the take's own look-up of the queue, before
        # it: one hand-off of blocking work a get, not a worker thread for it as well.
        # The bus holds the message taken, with no task, until the client settles it:
        # acked, or given back (a failed delivery, as RabbitMQ counts a requeue).
        name = self._named(m.queue)
        self._last_info = None
        owner = functools.partial(self.state.owner_of, "queues", bus_queue_name(name))

        def check() -> None:
            self._check_exclusive(name, {"owner": owner()})

        try:
            held = await self.bus._take_held(bus_queue_name(name), check)
            if held is None:
                await self.reply(spec.Basic.GetEmpty())
                return
            # held until settled on disk: a count meanwhile leaves it out, as RabbitMQ's
            self.gateway.taken(name, 1)
            try:
                left = await self.gateway.ready_after_get(name, held.waiting, held.consumers)
                await self._send_get_ok(m, held.msg, name, left, held.settle)
            except BaseException as exc:  # not delivered: given back
                await self._settle_get(name, held.settle, exc)
                raise
        except QueueNotFound:
            raise _not_found_queue(name) from None  # deleted since its name was read
        if m.no_ack:
            # acked on disk before the channel's next method, which finds it gone, as on
            # RabbitMQ
            await self._settle_get(name, held.settle, None)

    async def _send_get_ok(
        self, m: spec.Basic.Get, msg: Message, queue: str, left: int, settle: GetSettle
    ) -> None:
        props, exchange, rk = message_view(msg.headers, msg.topic)
        tag = self.next_tag
        self.next_tag += 1
        await self.conn.send_raw(
            pframe.marshal(
                unchecked(
                    spec.Basic.GetOk,
                    delivery_tag=tag,
                    redelivered=msg.delivery_count > 1,
                    exchange=exchange,
                    routing_key=rk,
                    message_count=left,
                ),
                self.number,
            )
            + content_frames(self.number, props, msg.payload, self.conn.frame_max)
        )
        if not m.no_ack:  # (once sent: a failed send gives it back, see _get)
            self.unacked[tag] = Pending(msg, queue, get_settle=settle)

    async def _settle(self, tag: int, multiple: bool, outcome: str) -> None:
        # As RabbitMQ: a tag that is not outstanding is an error, with ``multiple`` too
        # (then nothing is settled), but for 0 with ``multiple``: everything outstanding.
        if not (multiple and tag == 0) and tag not in self.unacked:
            raise AmqpError(
                PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
            )
        if multiple:
            tags = [t for t in self.unacked if tag == 0 or t <= tag]
        else:
            tags = [tag]
        for t in tags:
            self._conclude(self.unacked.pop(t), outcome)
        if self.shared_prefetch:
            self._made_room()
        if self._gets:
            await self._settle_gets()

    async def _ack(self, m: spec.Basic.Ack) -> None:
        await self._settle(m.delivery_tag or 0, bool(m.multiple), "ack")

    async def _nack(self, m: spec.Basic.Nack) -> None:
        await self._settle(
            m.delivery_tag or 0, bool(m.multiple), "requeue" if m.requeue else "drop"
        )

    async def _reject(self, m: spec.Basic.Reject) -> None:
        await self._settle(m.delivery_tag or 0, False, "requeue" if m.requeue else "drop")

    async def _recover(self, m: spec.Basic.Recover) -> None:
        if not m.requeue:  # as RabbitMQ: only a recover that requeues
            raise AmqpError(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - requeue=false", connection=True)
        await self._give_back_unacked()
        if isinstance(m, spec.Basic.Recover):
            await self.reply(spec.Basic.RecoverOk())


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _arg(value: Any) -> str:
    return "none" if value is None else f"the value '{value}' of type '{type(value).__name__}'"


_HANDLERS: dict[type, Any] = {
    spec.Channel.Close: Channel._channel_close,
    spec.Channel.Flow: Channel._flow,
    spec.Exchange.Declare: Channel._exchange_declare,
    spec.Exchange.Delete: Channel._exchange_delete,
    spec.Queue.Declare: Channel._queue_declare,
    spec.Queue.Bind: Channel._queue_bind,
    spec.Queue.Unbind: Channel._queue_unbind,
    spec.Queue.Purge: Channel._queue_purge,
    spec.Queue.Delete: Channel._queue_delete,
    spec.Basic.Publish: Channel._publish,
    spec.Basic.Qos: Channel._qos,
    spec.Basic.Consume: Channel._consume,
    spec.Basic.Cancel: Channel._cancel,
    spec.Basic.Get: Channel._get,
    spec.Basic.Ack: Channel._ack,
    spec.Basic.Nack: Channel._nack,
    spec.Basic.Reject: Channel._reject,
    spec.Basic.Recover: Channel._recover,
    spec.Basic.RecoverAsync: Channel._recover,
    spec.Confirm.Select: Channel._confirm_select,
}
