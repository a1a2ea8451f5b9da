"""AMQP exchanges, bindings and queue arguments mapped onto bus topics and queues (pure).

Every AMQP publish becomes one bus publish whose topic says where it goes:

* ``amq.topic`` (and the default topic exchange a bus user thinks of): the routing key
  itself, so fsbus subscribers and AMQP queues bound to ``amq.topic`` see each other;
* another ``topic`` exchange ``X``: ``amqp.<X>.<routing key>``;
* a ``direct`` exchange: ``amqp-direct.<X>.<routing key as one word>``;
* a ``fanout`` exchange: ``amqp-fanout.<X>``;
* the default exchange ``""``: ``amqp-queue.<queue name as one word>``; every queue the
  gateway declares is bound to its own such topic.

``<X>`` is the exchange name as one word. A word here is escaped: ``%`` ``.`` ``*`` and
``#`` become ``%25`` ``%2E`` ``%2A`` ``%23``, so a name or a direct routing key never
splits into words or turns into a wildcard. A binding of queue ``Q`` to an exchange is a
binding of the durable queue ``Q`` to the matching pattern (a topic exchange's binding
key keeps its ``*`` and ``#``). Headers exchanges route in the gateway (see
:func:`headers_match`).

An AMQP queue name is any short string; the durable queue standing for it has an fsbus
queue name, escaped by :func:`bus_queue_name` with the scheme of the kombu transport
(``fsbus.kombu``), so a gateway client and a kombu program on ``fsbus://`` that name one
queue share it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
PREDECLARED = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}


class AmqpError(Exception):
    """A channel or connection error with its AMQP reply code."""

    def __init__(self, code: int, text: str, *, connection: bool = False) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.connection = connection


NOT_FOUND = 404
ACCESS_REFUSED = 403
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
NOT_ALLOWED = 530
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541


TOPIC_WORDS = 100
"""Words a bus topic holds at most (the bus's rule, which its qlobber-fsq peers need): a
topic exchange's keys, after its prefix (``amqp.<exchange>.``, two words; none on
``amq.topic``), take the rest."""


def word(text: str) -> str:
    """``text`` as one topic word (escaped: see the module docs)."""
    return (
        text.replace("%", "%25").replace(".", "%2E").replace("*", "%2A").replace("#", "%23")
    ) or "%"


def publish_topic(exchange: str, kind: str, routing_key: str) -> str | None:
    """The bus topic of a publish to ``exchange`` (None: headers, routed here)."""
    if exchange == "":
        return f"amqp-queue.{word(routing_key)}"
    if kind == "topic":
        if exchange == "amq.topic":
            return routing_key
        return f"amqp.{word(exchange)}.{routing_key}"
    if kind == "direct":
        return f"amqp-direct.{word(exchange)}.{word(routing_key)}"
    if kind == "fanout":
        return f"amqp-fanout.{word(exchange)}"
    return None


def binding_pattern(exchange: str, kind: str, binding_key: str) -> str | None:
    """The bus pattern a binding to ``exchange`` stands for (None: headers)."""
    if kind == "topic":
        if exchange == "amq.topic":
            return binding_key
        return f"amqp.{word(exchange)}.{binding_key}"
    if kind == "direct":
        return f"amqp-direct.{word(exchange)}.{word(binding_key)}"
    if kind == "fanout":
        return f"amqp-fanout.{word(exchange)}"
    return None


def own_pattern(queue: str) -> str:
    """The default exchange's binding of ``queue``."""
    return f"amqp-queue.{word(queue)}"


DEAD_TOPIC = "amqp-dead-letter"
"""The bus topic a queue with ``x-delivery-limit`` and a dead-letter exchange gives a
message up to (its queue in the ``x-fsbus-queue`` header): the gateways take it from
:data:`DEAD_QUEUE` to the queue's dead-letter exchange."""
DEAD_QUEUE = "_amqp:dead-letters"
"""The bus queue bound to :data:`DEAD_TOPIC`. No AMQP name gives it (see
:func:`bus_queue_name`: ``:de`` followed by ``a`` escapes no character)."""

MAX_QUEUE_NAME = 200
"""The longest fsbus queue name."""
_LONG_HEAD = 150
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def bus_queue_name(name: str) -> str:
    """The fsbus queue name of AMQP queue ``name`` (the kombu transport's scheme).

    Letters, digits and ``_ . -`` stay, except a leading ``.`` or ``-`` and the second
    ``.`` of ``..``; any other character becomes ``:`` and the hex of its UTF-8 bytes
    (``w@host.celery.pidbox`` -> ``w:40host.celery.pidbox``); a result starting with
    ``:`` gets a leading ``_``. A result over 200 characters keeps its first 150, then
    ``::`` and 40 hex digits of the SHA-256 of ``name``. See :func:`amqp_queue_name`.
    """
    parts: list[str] = []
    prev = ""
    for i, ch in enumerate(name):
        keep = ch in _SAFE and not (
            (ch == "." and (i == 0 or prev == ".")) or (ch == "-" and i == 0)
        )
        parts.append(ch if keep else "".join(f":{b:02x}" for b in ch.encode("utf-8", "replace")))
        prev = ch
    text = "".join(parts)
    if not text or text[0] == ":":
        text = "_" + text
    if len(text) > MAX_QUEUE_NAME:
        digest = hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:40]
        text = f"{text[:_LONG_HEAD]}::{digest}"
    return text


def amqp_queue_name(bus_name: str) -> str | None:
    """The AMQP queue name :func:`bus_queue_name` turned into ``bus_name``; None for a
    shortened (hashed) name, or one that no AMQP name gives."""
    if "::" in bus_name:
        return None
    text = bus_name[1:] if bus_name.startswith("_:") else bus_name
    out = bytearray()
    i = 0
    try:
        while i < len(text):
            if text[i] == ":":
                out.append(int(text[i + 1 : i + 3], 16))
                i += 3
            else:
                out += text[i].encode("ascii")
                i += 1
        name = out.decode("utf-8")
    except (ValueError, UnicodeError):
        return None
    return name if bus_queue_name(name) == bus_name else None


X_MATCH = ("all", "any", "all-with-x", "any-with-x")
"""The values RabbitMQ takes for a headers binding's ``x-match``."""


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """RabbitMQ's headers exchange rule: ``x-match`` all (default) or any, over the
    binding arguments not starting with ``x-`` (``all-with-x``, ``any-with-x``: those
    too, but ``x-match``); a binding value None tests presence. Values match as
    RabbitMQ's typed values do: a boolean only a boolean (``True`` is not ``1``), and a
    string and a byte array of the same bytes alike."""
    mode = str(arguments.get("x-match", "all"))
    with_x = mode.endswith("-with-x")
    wanted = {
        k: v for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))
    }
    have = headers or {}
    if not wanted:
        return not mode.startswith("any")
    tests = [(k in have and (v is None or _same(v, have[k]))) for k, v in wanted.items()]
    return any(tests) if mode.startswith("any") else all(tests)


def _same(want: Any, have: Any) -> bool:
    if isinstance(want, bool) or isinstance(have, bool):
        return type(want) is type(have) and want == have
    if isinstance(have, bytes | bytearray):  # (a binding's bytes are kept as latin-1 text)
        have = have.decode("latin-1")
    if isinstance(want, bytes | bytearray):
        want = want.decode("latin-1")
    return bool(want == have)


@dataclass
class RouteJob:
    """One AMQP publish, as the gateway routes it onto the bus."""

    exchange: str
    """The exchange it was published to."""
    routing_key: str
    """Its routing key."""
    amqp_headers: Mapping[str, Any] | None
    """Its headers property (what a headers exchange matches)."""
    body: bytes
    """Its body."""
    ttl: float | None = None
    """Seconds it may wait (its ``expiration``)."""
    durable: bool = False
    """``delivery_mode=2``: written durably."""
    headers: dict[str, str] = field(default_factory=dict)
    """The bus headers it is stored with."""
    priority: int | None = None
    """Its bus priority."""
    amqp_priority: int | None = None
    """Its AMQP priority (higher first), capped per queue by ``x-max-priority``."""
    error: AmqpError | None = None
    """Why it cannot be routed (a bad property): a channel error in its turn."""
    internal_ok: bool = False
    """Routed by the gateway itself (dead-lettering): an internal exchange takes it, as it
    takes no client's publish."""
    not_into: frozenset[str] = frozenset()
    """Bus queues it is not routed into (a dead letter's cycle: see
    :func:`~fsbus.amqp._deaths.cycle_queues`)."""


@dataclass(frozen=True)
class QueueArguments:
    """The ``x-`` arguments of ``queue.declare`` the gateway understands."""

    message_ttl: float | None = None
    expires: float | None = None
    max_length: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    delivery_limit: int | None = None

    @property
    def bus_overflow(self) -> str:
        """The bus queue's ``overflow``: ``reject-publish-dlx`` is ``reject-publish``
        (with ``dead_letter_dropped``: see :attr:`dead_letters_overflow`)."""
        return "reject-publish" if self.overflow.startswith("reject") else self.overflow

    @property
    def dead_letters_overflow(self) -> bool:
        """Whether what overflows is dead-lettered, as RabbitMQ does: the head a full
        drop-head queue drops, the publish a full reject-publish-dlx one refuses (not
        with plain reject-publish); only with a dead-letter exchange and a length."""
        return (
            self.dead_letter_exchange is not None
            and self.max_length is not None
            and self.overflow != "reject-publish"
        )


def _int_arg(args: Mapping[str, Any], key: str, *, minimum: int) -> int | None:
    if key not in args:
        return None
    value = args[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AmqpError(
            PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - invalid arg '{key}' for queue: {value!r} is not an "
            f"integer >= {minimum}",
        )
    return value


def queue_arguments(args: Mapping[str, Any] | None) -> QueueArguments:
    """Parse queue.declare's arguments; AmqpError 406 on a bad value."""
    args = args or {}
    ttl = _int_arg(args, "x-message-ttl", minimum=0)
    expires = _int_arg(args, "x-expires", minimum=1)
    max_length = _int_arg(args, "x-max-length", minimum=0)
    max_priority = _int_arg(args, "x-max-priority", minimum=0)
    limit = _int_arg(args, "x-delivery-limit", minimum=0)
    overflow = str(args.get("x-overflow", "drop-head"))
    if overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
        raise AmqpError(
            PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - invalid arg 'x-overflow' for queue: {overflow!r} (this "
            "gateway takes drop-head, reject-publish or reject-publish-dlx)",
        )
    if max_priority is not None and max_priority > 255:
        raise AmqpError(
            PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue: {max_priority} > 255",
        )
    dlx = args.get("x-dead-letter-exchange")
    dlk = args.get("x-dead-letter-routing-key")
    return QueueArguments(
        message_ttl=None if ttl is None else max(ttl, 1) / 1000,
        expires=None if expires is None else expires / 1000,
        max_length=max_length,
        overflow=overflow,
        dead_letter_exchange=None if dlx is None else str(dlx),
        dead_letter_routing_key=None if dlk is None else str(dlk),
        max_priority=max_priority,
        delivery_limit=limit,
    )


def amqp_priority_to_bus(priority: int | None, max_priority: int | None = None) -> int | None:
    """AMQP priorities are higher-first (0-255); the bus's lower-first with 50 as the
    default. Priority p becomes 50 - p (at least 0), so no priority stays at 50."""
    if priority is None:
        return None
    p = min(priority, max_priority) if max_priority is not None else priority
    return max(0, 50 - p)


def expiration_seconds(expiration: str | None) -> float | None:
    """The ``expiration`` property (milliseconds, as text) in seconds; AmqpError 406 if bad."""
    if expiration is None or expiration == "":
        return None
    try:
        ms = int(expiration)
    except ValueError:
        ms = -1
    if ms < 0:
        raise AmqpError(
            PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid expiration '{expiration}'"
        )
    return max(ms, 1) / 1000
