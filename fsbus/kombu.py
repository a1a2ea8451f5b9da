"""A kombu transport over a bus directory: ``Connection("fsbus:///path/to/bus")``.

kombu and Celery applications run on a bus with no broker and no gateway process::

    import fsbus.kombu  # registers the "fsbus" URL scheme with kombu
    from kombu import Connection

    with Connection("fsbus:///srv/bus") as conn:
        q = conn.SimpleQueue("jobs")
        q.put({"n": 1})
        msg = q.get(timeout=5)
        msg.ack()

Without the import, name the class: ``Connection("fsbus:///srv/bus",
transport="fsbus.kombu:Transport")`` (Celery: ``broker_transport =
"fsbus.kombu:Transport"``).

How kombu's model maps onto the bus (see docs/kombu.md):

* a kombu queue is a durable queue of the bus (same name when it is a valid queue name,
  else escaped: see :func:`queue_name`), declared with its ``x-`` arguments;
* a publish to an exchange is a copy into every durable queue whose bindings match the
  topic ``kombu.<exchange>.<routing key>`` (:func:`publish_topic`), in any process; a
  binding of a queue is a binding of its durable queue to a pattern that depends on the
  exchange type (:func:`binding_pattern`). So exchanges need no shared state: only the
  binder's exchange type matters, and fanout and topic exchanges reach every process;
* the message's body is the payload, the rest of kombu's message (properties,
  headers, content type) one header ``x-kombu``;
* a delivered message stays claimed by this process until kombu acks it (consumed),
  rejects it (consumed, or given back when requeued) or the channel closes (given
  back); a consumer that dies has its messages delivered again, ``redelivered`` set.
"""

# kombu's functions carry no annotations: calling them is what this module does.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import atexit
import base64
import hashlib
import logging
import os
import threading
import time
import weakref
from collections import deque, namedtuple
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager
from queue import Empty
from typing import Any
from urllib.parse import unquote

import anyio
from anyio.from_thread import BlockingPortal
from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.utils.json import dumps as _json_dumps
from kombu.utils.json import loads as _json_loads
from kombu.utils.uuid import uuid

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    ClosedError,
    FsBusError,
    Message,
    MessageIterator,
    QueueError,
    QueueFull,
    QueueInfo,
    QueueMismatch,
    QueueNotFound,
    StorageError,
    UsageError,
    __version__,
)

__all__ = [
    "Channel",
    "PublishRefused",
    "QoS",
    "Transport",
    "binding_pattern",
    "publish_topic",
    "queue_name",
    "register",
]

log = logging.getLogger("fsbus.kombu")

SCHEME = "fsbus"
"""The URL scheme: ``fsbus:///absolute/path`` or ``fsbus://relative/path``."""

META_HEADER = "x-kombu"
"""The bus header holding a kombu message's properties, headers and content type."""

ENVELOPE_HEADER = "x-kombu-envelope"
"""Set when the whole kombu message is the payload (its metadata did not fit a header)."""

FOREVER = 1e10
"""The TTL given to messages without an ``expiration`` (about 300 years): the bus's
default for work-queue messages is an hour, a broker's is never."""

queue_declare_ok_t = namedtuple("queue_declare_ok_t", ("queue", "message_count", "consumer_count"))
"""What queue_declare returns (as py-amqp's tuple of that name)."""

_PREDECLARED = {"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic"}
_BUSY = 1.0  # seconds after its last delivery that a queue counts as busy
_GET_AGAIN = 0.01  # seconds between gets while every message of a queue is held
_MAX_META = 60_000  # bytes of the x-kombu header; the bus takes 64 KiB of headers in all
_MAX_QUEUE_NAME = 200
_TOPIC_PREFIX = "kombu"


class PublishRefused(ChannelError, QueueFull):  # type: ignore[misc]
    """A publish refused by a full queue declared with ``x-overflow: reject-publish``
    (``max_length`` reached): the queue did not get the message; the other queues it was
    routed to did. It is kombu's :class:`~kombu.exceptions.ChannelError` (one of
    ``Connection.channel_errors``: a publish with ``retry=True`` retries it, as it retries
    RabbitMQ's nack of a confirmed publish) and :class:`fsbus.QueueFull`; ``__cause__`` is
    the bus's QueueFull."""

    def __init__(self, message: str) -> None:
        ChannelError.__init__(self, message)


# ---------------------------------------------------------------------------- names


def queue_name(name: str) -> str:
    """The durable queue of kombu queue ``name``.

    A name made of letters, digits and ``_ . -`` (not starting with ``.`` or ``-``, no
    ``..``) is used as it is; any other character becomes ``:`` and the hex of its
    UTF-8 bytes (``celery@host.celery.pidbox`` -> ``celery:40host.celery.pidbox``), a
    name starting with an escaped character gets a leading ``_``, and one longer than 200
    characters is cut and ends with ``::`` and a hash of the whole name. Two kombu names
    never share a queue.
    """
    out: list[str] = []
    prev = ""
    for i, ch in enumerate(name):
        ok = ch.isascii() and (ch.isalnum() or ch in "_.-")
        if ch == "." and (i == 0 or prev == "."):
            ok = False
        if ch == "-" and i == 0:
            ok = False
        out.append(ch if ok else "".join(f":{b:02x}" for b in ch.encode("utf-8", "replace")))
        prev = ch
    text = "".join(out)
    if not text or text[0] == ":":
        text = "_" + text
    if len(text) > _MAX_QUEUE_NAME:
        digest = hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:40]
        text = f"{text[:150]}::{digest}"
    return text


def _escape(text: str, *, dots: bool) -> str:
    """``text`` with ``%``, ``*``, ``#``, control characters (and ``.`` if ``dots``)
    written as ``%XX``, so that it is literal in a pattern."""
    out = []
    for ch in text:
        if ch in "%*#" or ord(ch) < 0x20 or (dots and ch == "."):
            out.append(f"%{ord(ch):02X}")
        else:
            out.append(ch)
    return "".join(out)


def _exchange_word(exchange: str) -> str:
    return _escape(exchange, dots=True) or "%"


def _key_words(key: str, *, wildcards: bool) -> str:
    return ".".join(
        w if wildcards and w in ("*", "#") else _escape(w, dots=False) for w in key.split(".")
    )


def publish_topic(exchange: str, routing_key: str) -> str:
    """The bus topic of a publish to ``exchange`` with ``routing_key``.

    ``kombu.<exchange as one word>.<routing key, word by word>`` (the same for every
    exchange type, so a publisher needs no exchange declaration); the words are escaped
    (``% . * #`` as ``%25 %2E %2A %23``) so that they never act as wildcards. The
    exchange ``amq.topic`` publishes on the routing key itself, the bus's own topics.
    """
    if exchange == "amq.topic":
        return routing_key
    return f"{_TOPIC_PREFIX}.{_exchange_word(exchange)}.{_key_words(routing_key, wildcards=False)}"


def binding_pattern(exchange: str, kind: str, binding_key: str) -> str:
    """The bus pattern of a binding to ``exchange`` (of type ``kind``) with ``binding_key``.

    direct: the publish topic of that key exactly; topic: the same, with the key's ``*``
    and ``#`` words left as wildcards; fanout: every key of the exchange. Bindings to
    ``amq.topic`` are bus patterns as they are.
    """
    if exchange == "amq.topic":
        return binding_key
    head = f"{_TOPIC_PREFIX}.{_exchange_word(exchange)}"
    if kind == "fanout":
        return f"{head}.#"
    if kind == "topic":
        return f"{head}.{_key_words(binding_key, wildcards=True)}"
    if kind == "direct":
        return f"{head}.{_key_words(binding_key, wildcards=False)}"
    raise ChannelError(f"exchange type {kind!r} is not supported by the fsbus transport")


def _root_of(hostname: str | None, virtual_host: str | None) -> str:
    """The bus directory named by a connection's URL (or bare path)."""
    host = hostname or ""
    if "://" in host:
        path = unquote(host.split("://", 1)[1])
    elif host and host != "localhost":
        path = host
    else:
        path = virtual_host or ""
    if not path or path == "/":
        raise UsageError(
            f"no bus directory in {hostname!r}: give one as fsbus:///absolute/path "
            "(three slashes) or fsbus://relative/path"
        )
    return path


# ---------------------------------------------------------------------------- arguments


def _ms_to_s(value: Any, what: str) -> float:
    try:
        ms = float(value)
    except (TypeError, ValueError):
        ms = -1.0
    if ms < 0:
        raise ChannelError(f"PRECONDITION_FAILED - invalid {what}: {value!r}")
    return max(ms, 1.0) / 1000


def _queue_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``declare_queue`` options from queue_declare's arguments (unknown ``x-`` ignored)."""
    args = kwargs.get("arguments") or {}
    options: dict[str, Any] = {"auto_delete": bool(kwargs.get("auto_delete", False))}
    if args.get("x-message-ttl") is not None:
        options["message_ttl"] = _ms_to_s(args["x-message-ttl"], "x-message-ttl")
    if args.get("x-expires") is not None:
        options["expires"] = _ms_to_s(args["x-expires"], "x-expires")
    if args.get("x-max-length") is not None:
        options["max_length"] = int(args["x-max-length"])
    overflow = args.get("x-overflow")
    if overflow is not None:
        options["overflow"] = (
            "reject-publish" if str(overflow).startswith("reject") else str(overflow)
        )
    return options


def _priority(props: Mapping[str, Any]) -> int | None:
    """kombu priority p (higher first) as the bus's (lower first, 50 by default): 50 - p."""
    p = props.get("priority")
    if p is None:
        return None
    try:
        return max(0, min(255, 50 - int(p)))
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- messages


def _raw_body(message: Mapping[str, Any], decode: Callable[[Any, Any], Any]) -> bytes:
    props = message.get("properties") or {}
    body = message.get("body")
    if body is None:
        return b""
    encoding = props.get("body_encoding")
    if encoding:
        body = decode(body, encoding)
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def _encode(message: Mapping[str, Any], body: bytes) -> tuple[bytes, dict[str, str]]:
    """The payload and bus headers of a kombu message."""
    props = dict(message.get("properties") or {})
    props.pop("delivery_tag", None)
    props.pop("body_encoding", None)
    meta = {
        "properties": props,
        "headers": message.get("headers") or {},
        "content-type": message.get("content-type"),
        "content-encoding": message.get("content-encoding"),
    }
    text = _json_dumps(meta)
    if len(text.encode("utf-8")) <= _MAX_META:
        headers = {META_HEADER: text}
        ctype = meta["content-type"]
        if isinstance(ctype, str) and ctype and len(ctype) < 200:
            headers["content-type"] = ctype
        return body, headers
    envelope = dict(meta, body=base64.b64encode(body).decode("ascii"))
    envelope["properties"] = dict(props, body_encoding="base64")
    return _json_dumps(envelope).encode("utf-8"), {ENVELOPE_HEADER: "1"}


def _decode(msg: Message) -> dict[str, Any]:
    """A kombu message (virtual transport form, body base64) from a bus message."""
    payload = msg.payload
    meta: dict[str, Any] | None = None
    try:
        if ENVELOPE_HEADER in msg.headers:
            meta = _json_loads(payload)
            if not isinstance(meta, dict):
                raise ValueError("not a kombu envelope")
            payload = base64.b64decode(meta.pop("body", "") or "")
        elif META_HEADER in msg.headers:
            meta = _json_loads(msg.headers[META_HEADER])
            if not isinstance(meta, dict):
                raise ValueError("not kombu metadata")
    except Exception:  # not ours after all: deliver it as a foreign message
        log.warning("message %s: unreadable kombu metadata; delivered as raw bytes", msg.name)
        meta, payload = None, msg.payload
    if meta is None:
        # Published by a plain fsbus client: the payload as bytes, its headers as headers.
        meta = {
            "properties": {"priority": max(0, 50 - msg.priority)},
            "headers": dict(msg.headers),
            "content-type": msg.headers.get("content-type") or "application/data",
            "content-encoding": msg.headers.get("content-encoding") or "binary",
        }
    props = dict(meta.get("properties") or {})
    info = dict(props.get("delivery_info") or {})
    info.setdefault("exchange", "")
    info.setdefault("routing_key", msg.topic)
    info["redelivered"] = msg.delivery_count > 1
    props["delivery_info"] = info
    props["body_encoding"] = "base64"
    props["delivery_tag"] = uuid()
    return {
        "body": base64.b64encode(payload).decode("ascii"),
        "properties": props,
        "headers": meta.get("headers") or {},
        "content-type": meta.get("content-type"),
        "content-encoding": meta.get("content-encoding"),
    }


# ---------------------------------------------------------------------------- subscriptions


class _Sub:
    """A subscription to one durable queue, on the connection's event loop.

    It claims up to ``prefetch`` messages ahead and acknowledges only when told
    (``ack_previous=False``): ``held`` are the messages kombu has and has not settled,
    ``ready`` those taken from the bus while waiting, not yet handed over.
    """

    __slots__ = ("cm", "held", "it", "portal", "prefetch", "ready")

    def __init__(self, portal: BlockingPortal, bus: Bus, name: str, prefetch: int) -> None:
        self.portal = portal
        self.prefetch = prefetch
        self.cm = portal.wrap_async_context_manager(
            bus.messages(queue=name, prefetch=prefetch, buffer=prefetch, ack_previous=False)
        )
        self.it: MessageIterator = self.cm.__enter__()
        self.held: dict[str, Message] = {}
        self.ready: deque[Message] = deque()

    def take(self, timeout: float) -> Message | None:
        """A message now (or within ``timeout`` seconds), or None."""
        if self.ready:
            return self.ready.popleft()
        try:
            return self.portal.call(self.it.receive, timeout)
        except TimeoutError:
            return None
        except StopAsyncIteration:
            raise ClosedError("the queue subscription ended") from None
        except QueueNotFound as exc:  # its queue was deleted: the connection starts over
            raise ClosedError(f"the queue subscription ended: {exc}") from None

    def ack(self, msg: Message) -> None:
        self.portal.call(self.it.ack, msg)

    def release(self, msg: Message) -> None:
        self.portal.call(self.it.release, msg)

    def close(self) -> None:
        """Leave: what it holds (held, ready, or claimed ahead) goes back to the queue."""
        self.held.clear()
        self.ready.clear()
        try:
            self.cm.__exit__(None, None, None)
        except (FsBusError, OSError, RuntimeError) as exc:
            log.debug("closing a queue subscription: %s", exc)


class _GiveBack(Exception):
    """Ends a :class:`_Got`'s block: its message goes back to the queue."""


class _Got:
    """One message taken with ``Bus.get`` (no subscription) and held until kombu settles
    it; settled and closed as a :class:`_Sub` is."""

    __slots__ = ("cm", "held", "msg", "open", "prefetch", "ready")

    def __init__(self, portal: BlockingPortal, bus: Bus, name: str) -> None:
        self.cm = portal.wrap_async_context_manager(bus.get(name))
        self.msg: Message | None = self.cm.__enter__()
        self.open = True
        self.held: dict[str, Message] = {}
        self.ready: deque[Message] = deque()  # (never any: it holds one message)
        self.prefetch = 1
        if self.msg is None:
            self._end(None)

    def ack(self, msg: Message) -> None:
        self._end(None)

    def release(self, msg: Message) -> None:
        self._end(_GiveBack("given back by kombu"))

    def close(self) -> None:
        self.held.clear()
        try:
            self._end(_GiveBack("the channel closed"))
        except (FsBusError, OSError, RuntimeError) as exc:
            log.debug("closing a get: %s", exc)

    def _end(self, exc: _GiveBack | None) -> None:
        if not self.open:
            return
        self.open = False
        if exc is None:
            self.cm.__exit__(None, None, None)
        else:
            self.cm.__exit__(type(exc), exc, None)


def _room(sub: _Sub | _Got) -> int:
    return sub.prefetch - len(sub.held)


# ---------------------------------------------------------------------------- kombu


class QoS(virtual.QoS):
    """Acknowledgements are the bus's: ack consumes, a requeueing reject gives back."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.transport._settle(delivery_tag, consume=True)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        # Not requeued: consumed (dropped), as a broker without a dead-letter exchange does.
        self.channel.transport._settle(delivery_tag, consume=not requeue)
        self._quick_ack(delivery_tag)


class Channel(virtual.Channel):
    """A kombu channel on the bus of its :class:`Transport`."""

    QoS = QoS
    do_restore = True
    supports_fanout = True  # bindings are the bus's, so fanout reaches every process

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        self.transport: Transport = connection
        self.bus: BlockingBus = connection.bus
        self._subs: dict[str, list[_Sub]] = {}
        self._no_ack: dict[str, bool] = {}
        self._exclusive: set[str] = set()
        self._last_hit: dict[str, float] = {}
        super().__init__(connection, **kwargs)
        for name, kind in _PREDECLARED.items():  # a broker has these: kombu never declares them
            self.state.exchanges.setdefault(
                name,
                {"type": kind, "durable": True, "auto_delete": False, "arguments": {}, "table": []},
            )

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        """``Queue(expires=..., message_ttl=..., max_length=...)`` as ``x-`` arguments."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    # -- queues -------------------------------------------------------------------------
    def _declare(self, queue: str, kwargs: Mapping[str, Any]) -> QueueInfo:
        try:
            info = self.bus.declare_queue(queue_name(queue), (), **_queue_options(kwargs))
        except QueueMismatch as exc:
            raise ChannelError(f"PRECONDITION_FAILED - {exc}") from exc
        if kwargs.get("exclusive"):
            self._exclusive.add(queue)
        return info

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        """Declare ``queue`` (a durable queue of the bus); passive: it must exist."""
        queue = queue or f"amq.gen-{uuid()}"
        if passive:
            try:
                info = self.bus.queue_info(queue_name(queue))
            except QueueNotFound:
                raise ChannelError(
                    f"NOT_FOUND - no queue {queue!r} on the bus {self.bus.root}",
                    (50, 10),
                    "Channel.queue_declare",
                    "404",
                ) from None
        else:
            info = self._declare(queue, kwargs)
        return queue_declare_ok_t(queue, self._ready(queue, info), info.consumers)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self._declare(queue, kwargs)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        try:
            self.bus.queue_info(queue_name(queue))
        except QueueNotFound:
            return False
        return True

    def _ready(self, queue: str, info: QueueInfo) -> int:
        """Messages ready in the queue, as a broker counts them for ``queue_declare``
        (``qsize()``): those no consumer holds. A message delivered and not yet acked,
        or claimed ahead by a consumer's prefetch, is left out (one lock probe each)."""
        if not info.depth:
            return 0
        try:
            return sum(1 for m in self.bus.browse(queue=queue_name(queue)) if not m.locked)
        except QueueNotFound:
            return 0

    def _size(self, queue: str) -> int:
        """Messages in the queue: waiting, or held by a consumer and not yet acked."""
        try:
            return self.bus.queue_info(queue_name(queue)).depth
        except QueueNotFound:
            return 0

    def _purge(self, queue: str) -> int:
        for sub in list(self._subs.get(queue, ())):
            if not sub.held:  # what it took ahead goes back, then is purged
                self._close_sub(queue, sub)
        try:
            return self.bus.purge_queue(queue_name(queue))
        except QueueNotFound:
            return 0

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> int | None:
        """Delete the durable queue (nothing when ``if_unused``/``if_empty`` refuse)."""
        self._close_subs(queue)
        self.state.queue_bindings_delete(queue)
        self._exclusive.discard(queue)
        try:
            return self.bus.delete_queue(queue_name(queue), if_unused=if_unused, if_empty=if_empty)
        except QueueNotFound:
            return 0
        except QueueError:  # in use or not empty, as asked
            return None

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.queue_delete(queue)

    # -- bindings -----------------------------------------------------------------------
    def _queue_bind(self, exchange: str, routing_key: str, pattern: Any, queue: str) -> None:
        kind = self.typeof(exchange).type
        self.bus.bind_queue(queue_name(queue), binding_pattern(exchange, kind, routing_key))

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        exchange = exchange or "amq.direct"
        kind = self.typeof(exchange).type
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        try:
            self.bus.unbind_queue(queue_name(queue), binding_pattern(exchange, kind, routing_key))
        except QueueNotFound:
            pass

    # -- publishing ---------------------------------------------------------------------
    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kw: Any
    ) -> None:
        """Copy ``message`` into every queue bound to where it goes, in any process."""
        props = message["properties"]
        props["delivery_info"].update(exchange=exchange, routing_key=routing_key)
        if not exchange:  # the default exchange: the routing key names the queue
            self._put(routing_key, message)
            return
        topic = publish_topic(exchange, routing_key)
        targets = self.bus.routes(topic)
        if not targets:
            return  # unroutable: dropped, as by a broker (no mandatory returns here)
        payload, headers = _encode(message, _raw_body(message, self.decode_body))
        # one call for every queue: a full reject-publish queue refuses its own copy only,
        # and one deleted since routes() looked is left out
        self._enqueue(list(targets), topic, payload, headers, props, exchange, routing_key)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        payload, headers = _encode(message, _raw_body(message, self.decode_body))
        topic = publish_topic("", queue)
        try:
            self._enqueue(
                queue_name(queue), topic, payload, headers, message["properties"], "", queue
            )
        except QueueNotFound:
            log.debug("publish to missing queue %r dropped", queue)

    def _put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **kw: Any
    ) -> None:
        self.basic_publish(message, exchange, routing_key)

    def _enqueue(
        self,
        name: str | list[str],
        topic: str,
        payload: bytes,
        headers: dict[str, str],
        props: Mapping[str, Any],
        exchange: str,
        routing_key: str,
    ) -> None:
        """Put the message into queue ``name`` (or each of several); a full reject-publish
        queue raises :class:`PublishRefused`, after the others got their copies."""
        expiration = props.get("expiration")
        ttl = FOREVER if expiration in (None, "") else _ms_to_s(expiration, "expiration")
        durable = self.transport.durable_messages
        if durable is None:
            durable = props.get("delivery_mode") == 2
        try:
            self.bus.enqueue(
                name,
                topic,
                payload,
                ttl=ttl,
                durable=bool(durable),
                headers=headers,
                priority=_priority(props),
            )
        except QueueFull as exc:
            where = f"exchange {exchange!r}" if exchange else "the default exchange"
            raise PublishRefused(
                f"publish to {where} with routing key {routing_key!r} refused: {exc}"
            ) from exc

    # -- consuming ----------------------------------------------------------------------
    def basic_consume(
        self, queue: str, no_ack: bool, callback: Callable[..., Any], consumer_tag: str, **kw: Any
    ) -> None:
        self._no_ack[queue] = bool(no_ack)
        super().basic_consume(queue, no_ack, callback, consumer_tag, **kw)

    def basic_cancel(self, consumer_tag: str) -> None:
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack.pop(queue, None)
            for sub in list(self._subs.get(queue, ())):
                if not sub.held:  # else: once kombu settled what it holds
                    self._close_sub(queue, sub)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """One message or None, without a consumer (waits briefly when the queue has some,
        all held by others)."""
        if queue in self._active_queues:
            try:  # what its consumers claimed ahead, first
                raw = self._take(queue, no_ack=no_ack, wait=0.0)
            except Empty:
                return None
        else:
            got = self._get_one(queue)
            if got is None:
                return None
            assert got.msg is not None
            raw = self._hand_over(queue, got, got.msg, no_ack)
        message = self.Message(raw, channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get_one(self, queue: str) -> _Got | None:
        """The head of ``queue`` taken with ``Bus.get``; while the queue has messages and
        none is free, tried again for up to ``get_wait`` seconds."""
        portal, bus = self.transport._engine()
        deadline = time.monotonic() + self.transport.get_wait
        while True:
            try:
                got = _Got(portal, bus, queue_name(queue))
            except QueueNotFound:
                return None
            if got.msg is not None:
                return got
            if time.monotonic() >= deadline or not self._size(queue):
                return None
            time.sleep(_GET_AGAIN)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        return self._take(queue, no_ack=self._no_ack.get(queue, False), wait=0.0)

    def _take(self, queue: str, *, no_ack: bool, wait: float) -> dict[str, Any]:
        """The next message of ``queue`` for kombu (held until settled), or Empty."""
        subs = self._pool(queue)
        for sub in subs:
            msg = self._try(queue, sub, 0.0)
            if msg is not None:
                return self._hand_over(queue, sub, msg, no_ack)
        if wait > 0 and subs:
            sub = max(subs, key=_room)
            msg = self._try(queue, sub, wait)
            if msg is not None:
                return self._hand_over(queue, sub, msg, no_ack)
        raise Empty()

    def _wait(self, queue: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for a message of ``queue``; kept for the next _get."""
        subs = self._pool(queue)
        if any(sub.ready for sub in subs):
            return True
        if not subs or max(map(_room, subs)) <= 0:
            return False
        sub = max(subs, key=_room)
        msg = self._try(queue, sub, timeout)
        if msg is None:
            return False
        sub.ready.append(msg)
        return True

    def _try(self, queue: str, sub: _Sub, timeout: float) -> Message | None:
        try:
            return sub.take(timeout)
        except (ClosedError, StorageError, OSError) as exc:  # its bus or queue is gone
            log.debug("queue subscription ended: %s", exc)
            self._close_sub(queue, sub)
            return None

    def _pool(self, queue: str) -> list[_Sub]:
        """This channel's subscriptions to ``queue``: together they claim up to kombu's
        prefetch count (one more subscription when it grows, as Celery does for each
        task with an ETA; idle ones leave when it shrinks)."""
        want = 1
        if queue in self._active_queues:
            want = int(self.qos.prefetch_count or self.transport.prefetch_limit)
        subs = self._subs.setdefault(queue, [])
        have = sum(sub.prefetch for sub in subs)
        if have < want:
            try:
                portal, bus = self.transport._engine()
                subs.append(_Sub(portal, bus, queue_name(queue), want - have))
            except QueueNotFound:
                pass
        elif have > want:
            for sub in sorted(subs, key=lambda sub: sub.prefetch):
                if not sub.held and not sub.ready and have - sub.prefetch >= want:
                    have -= sub.prefetch
                    self._close_sub(queue, sub)
        return list(subs)

    def _close_sub(self, queue: str, sub: _Sub | _Got) -> None:
        with self.transport._lock:
            subs = self._subs.get(queue, [])
            if sub in subs:
                subs.remove(sub)
            if not subs:
                self._subs.pop(queue, None)
            for tag in list(sub.held):
                self.transport._held.pop(tag, None)
        sub.close()

    def _hand_over(
        self, queue: str, sub: _Sub | _Got, msg: Message, no_ack: bool
    ) -> dict[str, Any]:
        raw = _decode(msg)
        self._last_hit[queue] = time.monotonic()
        if no_ack:
            sub.ack(msg)
        else:
            tag = raw["properties"]["delivery_tag"]
            with self.transport._lock:
                sub.held[tag] = msg
                self.transport._held[tag] = (self, queue, sub)
        return raw

    def _settled(self, queue: str, sub: _Sub | _Got) -> None:
        """One of ``sub``'s messages was settled: close it if it is no longer wanted."""
        if not sub.held and (self.closed or queue not in self._active_queues):
            self._close_sub(queue, sub)

    def _close_subs(self, queue: str) -> None:
        for sub in list(self._subs.get(queue, ())):
            self._close_sub(queue, sub)

    def _restore(self, message: Any) -> None:
        """Give an unacked message back to its queue (it is redelivered, ``redelivered``)."""
        self.transport._settle(message.delivery_tag, consume=False)

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

    def close(self) -> None:
        """Cancel consumers, give back what is unacked, delete exclusive queues."""
        if self.closed:
            return
        if self.transport._forked():
            # kombu closes inherited connections after a fork: their consumers, unacked
            # messages and exclusive queues are the parent's, so only forget them here.
            self.closed = True
            with self.transport._lock:
                self._subs.clear()
            if self.connection is not None:
                self.connection.close_channel(self)
            return
        super().close()  # unacked messages are released (see _restore)
        with self.transport._lock:
            subs: dict[_Sub | _Got, None] = dict.fromkeys(
                sub for group in self._subs.values() for sub in group
            )
            self._subs.clear()
            for tag, (channel, _q, sub) in list(self.transport._held.items()):
                if channel is self:
                    del self.transport._held[tag]
                    subs[sub] = None
        for sub in subs:
            sub.close()
        for queue in list(self._exclusive):
            try:
                self.bus.delete_queue(queue_name(queue))
            except (FsBusError, OSError):
                pass
        self._exclusive.clear()


_OPEN: weakref.WeakSet[Transport] = weakref.WeakSet()


class Transport(virtual.Transport):
    """kombu transport: ``Connection("fsbus:///path/to/bus")``.

    ``transport_options``:

    * ``polling_interval`` (0.1): seconds between looks at queues other than the one
      being waited on (a consumer of one queue is woken at once by a message);
    * ``prefetch_limit`` (64): messages claimed ahead per consumed queue when the
      channel's prefetch count is 0 (unlimited);
    * ``durable_messages`` (None): fsync each message before publish returns: None
      follows the message's ``delivery_mode`` (2, kombu's default, is persistent);
    * ``get_wait`` (0.5): seconds ``basic_get`` (``queue.get()``, ``SimpleQueue.get_nowait``)
      waits for a message while the queue is not empty but none is claimable yet;
    * ``config``: a :class:`~fsbus.BusConfig` (or a dict of its fields) for the bus.
    """

    Channel = Channel

    can_parse_url = True
    polling_interval = 0.1
    driver_type = "fsbus"
    driver_name = "fsbus"
    connection_errors = (*virtual.Transport.connection_errors, StorageError, ClosedError)  # type: ignore[assignment]
    channel_errors = (*virtual.Transport.channel_errors, QueueError, UsageError)  # type: ignore[assignment]
    # Sorted as py-amqp sorts RabbitMQ's (see docs/kombu.md, Errors and retries): what a
    # retry on a new connection can get past (the disk, a closed bus, a full queue, as
    # py-amqp's socket errors and MessageNacked), under the caller's retry policy; and
    # what it cannot (a missing queue, other arguments, a bad name), raised at once.
    recoverable_connection_errors = (
        *virtual.Transport.connection_errors,
        StorageError,
        ClosedError,
        PublishRefused,
        OSError,
    )
    recoverable_channel_errors = ()
    implements = virtual.Transport.implements.extend(
        asynchronous=False,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
        heartbeats=False,
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._client = client
        options = client.transport_options
        self.prefetch_limit = int(options.get("prefetch_limit", 64))
        self.durable_messages: bool | None = options.get("durable_messages")
        self.get_wait = float(options.get("get_wait", 0.5))
        config = options.get("config")
        self._config = BusConfig(**config) if isinstance(config, dict) else config
        self._bus: BlockingBus | None = None
        self._loop: _LoopThread | None = None
        self._portal: BlockingPortal | None = None
        self._engine_cm: AbstractContextManager[Bus] | None = None
        self._engine_bus: Bus | None = None
        self._pid = 0
        self._lock = threading.RLock()
        self._held: dict[str, tuple[Channel, str, _Sub | _Got]] = {}
        self._turn = 0

    @property
    def root(self) -> str:
        """The bus directory of this connection."""
        return _root_of(self._client.hostname, self._client.virtual_host)

    @property
    def bus(self) -> BlockingBus:
        """The connection's bus (opened on first use, closed with the connection)."""
        with self._lock:
            if self._bus is None:
                bus = BlockingBus(self.root, config=self._config)
                bus.__enter__()
                self._bus, self._pid = bus, os.getpid()
                _OPEN.add(self)
            return self._bus

    def _engine(self) -> tuple[BlockingPortal, Bus]:
        """The event loop (a thread) and the async bus that consumers run on."""
        with self._lock:
            _ = self.bus
            if self._portal is None:
                self._loop = _LoopThread()
                self._portal = self._loop.portal
            if self._engine_bus is None:
                cm = self._portal.wrap_async_context_manager(Bus(self.root, config=self._config))
                self._engine_bus = cm.__enter__()
                self._engine_cm = cm
            return self._portal, self._engine_bus

    def driver_version(self) -> str:
        return __version__

    def establish_connection(self) -> Transport:
        _ = self.bus
        result: Transport = super().establish_connection()
        return result

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        self._close_bus()

    def _forked(self) -> bool:
        """True in a process forked after this connection opened its bus."""
        return self._pid not in (0, os.getpid())

    def _close_bus(self) -> None:
        with self._lock:
            bus, self._bus = self._bus, None
            engine_cm, self._engine_cm, self._engine_bus = self._engine_cm, None, None
            loop, self._loop, self._portal = self._loop, None, None
            self._held.clear()
        if self._forked():
            return  # a forked child: the threads are the parent's
        try:
            if engine_cm is not None:
                engine_cm.__exit__(None, None, None)
        finally:
            if loop is not None:
                loop.stop()
            if bus is not None:
                bus.close()

    def _settle(self, delivery_tag: str, *, consume: bool) -> bool:
        """Ack (``consume``) or give back a held message; False if it is not held."""
        with self._lock:
            entry = self._held.pop(delivery_tag, None)
            if entry is None:
                return False
            channel, queue, sub = entry
            msg = sub.held.pop(delivery_tag, None)
        if msg is not None:
            try:
                if consume:
                    sub.ack(msg)
                else:
                    sub.release(msg)
            except (FsBusError, OSError, RuntimeError) as exc:
                # Its subscription ended: the message went back to the queue already.
                log.warning("could not settle message %s: %s", msg.name, exc)
        channel._settled(queue, sub)
        return True

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver one message; wait for one on a consumed queue meanwhile."""
        start = time.monotonic()
        while True:
            try:
                if self.cycle is None:
                    raise Empty()
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise TimeoutError()  # socket.timeout, as kombu expects
            wait = self.polling_interval
            if timeout is not None:
                wait = max(0.0, min(wait, timeout - elapsed))
            self._wait_any(wait)

    def _wait_any(self, wait: float) -> None:
        """Block up to ``wait`` on one consumed queue, else sleep.

        The queue that delivered last is waited on while it is busy (its next message
        wakes this at once); otherwise the consumed queues take turns.
        """
        candidates = [
            (channel, queue)
            for channel in list(self.channels)
            if not channel.closed and channel._consumers and channel.qos.can_consume()
            for queue in dict.fromkeys(channel._active_queues)
        ]
        start = time.monotonic()
        if candidates:
            now = start
            hits = [
                (channel._last_hit.get(queue, 0.0), i)
                for i, (channel, queue) in enumerate(candidates)
            ]
            last, best = max(hits)
            if now - last < _BUSY:
                pick = best
            else:
                self._turn = pick = (self._turn + 1) % len(candidates)
            channel, queue = candidates[pick]
            if channel._wait(queue, wait):
                return
        left = wait - (time.monotonic() - start)
        if left > 0:
            time.sleep(left)  # nothing to wait on: look at all the queues again then


class _LoopThread:
    """An event loop in a daemon thread, with a portal into it.

    Not anyio's ``start_blocking_portal``: its context manager is a suspended generator,
    and a forked child that drops it (kombu closes pooled connections after a fork)
    finalises the generator, which asks the parent's loop thread, absent in the child,
    to stop and waits forever. A child simply forgets this object.
    """

    def __init__(self) -> None:
        ready: Future[BlockingPortal] = Future()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                ready.set_result(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(serve)
            except BaseException as exc:  # reported to the thread that waits for it
                if not ready.done():
                    ready.set_exception(exc)

        self._pid = os.getpid()
        self._thread = threading.Thread(target=run, name="fsbus-kombu-loop", daemon=True)
        self._thread.start()
        self.portal = ready.result()

    def stop(self) -> None:
        """Stop the loop and wait for its thread (nothing to do in a forked child)."""
        if self._pid != os.getpid():
            return
        try:
            self.portal.call(self.portal.stop, False)
        except RuntimeError:  # stopped already
            pass
        self._thread.join()


def register(name: str = SCHEME) -> None:
    """Make ``Connection("<name>:///path")`` use this transport (done on import)."""
    TRANSPORT_ALIASES.setdefault(name, f"{__name__}:Transport")


def _close_all_at_exit() -> None:
    # A bus with a subscription runs an event-loop thread that the interpreter would
    # wait for forever at exit: close the connections left open, which gives their
    # unacked messages back (in this process only: a forked child has no such thread).
    for transport in list(_OPEN):
        if transport._pid == os.getpid() and transport._bus is not None:
            try:
                transport.close_connection(transport)
            except Exception:  # at exit: nothing else to do
                pass


register()
# Runs before the interpreter joins non-daemon threads (plain atexit runs after that).
getattr(threading, "_register_atexit", atexit.register)(_close_all_at_exit)
