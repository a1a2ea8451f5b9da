"""AMQP 0-9-1 framing around pamqp.

Ours is only the framing: cutting the received byte stream into frames
(:class:`FrameReader`, with RabbitMQ's error texts), the heartbeat frame, and cutting a
body into body frames of at most ``frame_max``. Every method frame and every content
header (class, weight, body size and properties) is marshalled and unmarshalled by pamqp
(the codec aiormq and aio-pika use); what repeats from message to message (the
basic.publish of a publisher, its content header, the header a consumer is sent for the
same properties and body size) is pamqp's output kept, not encoded or read again.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple, TypeVar

from pamqp import base as pbase
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from ._routing import FRAME_ERROR, AmqpError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
_HEAD = struct.Struct(">BHI")
_F = TypeVar("_F", bound=pbase.Frame)
CACHE_SIZE = 1024
"""Entries each cache of pamqp's outputs holds before it starts afresh."""


class RawFrame(NamedTuple):
    """One frame as read: its type, channel, payload, and the whole frame's bytes."""

    kind: int
    channel: int
    payload: bytes
    data: bytes


class FrameReader:
    """Cuts frames out of received bytes; refuses frames over ``frame_max``."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._buf = b""

    def feed(self, data: bytes) -> list[RawFrame]:
        # A read holds many frames (a publisher's burst): each is cut from the read as
        # one copy, and only what follows the last whole frame is kept for the next.
        buf = self._buf + data if self._buf else bytes(data)
        out = []
        at, end = 0, len(buf)
        unpack, frame_max = _HEAD.unpack_from, self.frame_max
        while end - at >= 7:
            kind, channel, size = unpack(buf, at)
            if size + 8 > frame_max:
                self._buf = buf[at:]
                raise AmqpError(
                    FRAME_ERROR,
                    f"FRAME_ERROR - type {kind}, all octets = <<>>: frame size {size + 8} "
                    f"larger than frame_max {frame_max}",
                    connection=True,
                )
            stop = at + size + 8
            if stop > end:
                break
            if buf[stop - 1] != FRAME_END:
                self._buf = buf[at:]
                raise AmqpError(
                    FRAME_ERROR,
                    f"FRAME_ERROR - type {kind}, first 16 octets = <<>>: frame end marker "
                    f"{buf[stop - 1]:#x} is not {FRAME_END:#x}",
                    connection=True,
                )
            frame = buf[at:stop]
            out.append(RawFrame(kind, channel, frame[7:-1], frame))
            at = stop
        self._buf = buf[at:] if at < end else b""
        return out


HEARTBEAT = _HEAD.pack(FRAME_HEARTBEAT, 0, 0) + b"\xce"


def body_frames(channel: int, body: bytes, frame_max: int) -> bytes:
    """The body frames carrying ``body``, each at most ``frame_max`` octets."""
    room = max(frame_max - 8, 1)
    parts = []
    for i in range(0, len(body), room):
        chunk = body[i : i + room]
        parts += [_HEAD.pack(FRAME_BODY, channel, len(chunk)), chunk, b"\xce"]
    return b"".join(parts)


def _bounded(cache: dict[Any, Any]) -> dict[Any, Any]:
    if len(cache) >= CACHE_SIZE:
        cache.clear()
    return cache


# ---------------------------------------------------------------------- method frames
_PUBLISHES: dict[bytes, spec.Basic.Publish] = {}


def decode_method(raw: RawFrame) -> Any:
    """pamqp's reading of a frame (pamqp's errors raised). A basic.publish is kept by its
    bytes: a publisher sends the same one for every message to the same place (the kept
    object is shared, not to be changed)."""
    publish = _PUBLISHES.get(raw.payload)
    if publish is not None:
        return publish
    _used, _channel, method = pframe.unmarshal(raw.data)
    if isinstance(method, spec.Basic.Publish):
        _bounded(_PUBLISHES)[raw.payload] = method
    return method


_UNCHECKED: dict[type, type] = {}


def unchecked(cls: type[_F], **fields: Any) -> _F:
    """pamqp's method ``cls`` with ``fields``, without its checks of names against the
    spec's domains (marshalled as pamqp marshals it). For the methods a server sends that
    name a queue or an exchange (queue.declare-ok, basic.get-ok, basic.return): RabbitMQ
    takes any name a short string holds (255 bytes of UTF-8, any characters), where
    pamqp's domains allow 127 bytes of ``[A-Za-z0-9-_.:]`` for an exchange and a few more
    characters for a queue, and raise ``ValueError`` for the others."""
    sub = _UNCHECKED.get(cls)
    if sub is None:
        sub = _UNCHECKED[cls] = type(
            cls.__name__,
            (cls,),
            {"__slots__": cls.__slots__, "validate": _no_checks, "__module__": __name__},
        )
    return sub(**fields)  # type: ignore[no-any-return]


def _no_checks(self: Any) -> None:
    pass


class _Deliver(spec.Basic.Deliver):
    """pamqp's basic.deliver without its check of the exchange name against the spec's
    domain: a delivery names the exchange the message was published to, whatever name
    that exchange was declared with (RabbitMQ delivers any name a short string holds)."""

    __slots__ = spec.Basic.Deliver.__slots__

    def validate(self) -> None:
        pass


_DeliverKey = tuple[int, str, bool, str, str]
# pamqp's basic.deliver for one consumer, redelivery flag, exchange and routing key, cut
# around its delivery tag: (what comes before the tag, what comes after), or None where
# the tag could not be told apart (then every frame is marshalled whole).
_DELIVERS: dict[_DeliverKey, tuple[bytes, bytes] | None] = {}
_TAG_A, _TAG_B = 0x0102030405060708, 0x7F6E5D4C3B2A1900


def deliver_frame(
    channel: int, consumer_tag: str, tag: int, redelivered: bool, exchange: str, routing_key: str
) -> bytes:
    """The method frame of basic.deliver, marshalled by pamqp.

    Deliveries to one consumer differ in their delivery tag alone (most of them, in a
    queue bound to one key), so pamqp's frame is kept for each consumer, flag, exchange
    and key, and only the tag's eight bytes are put in: where two frames pamqp marshalled
    with different tags differ, and nowhere else (checked when the frame is first kept).
    """
    key = (channel, consumer_tag, redelivered, exchange, routing_key)
    if key in _DELIVERS:
        cut = _DELIVERS[key]
    else:
        cut = _bounded(_DELIVERS)[key] = _cut_deliver(*key)
    if cut is None or not 0 <= tag < 1 << 63:  # pamqp: a signed long long
        return _marshal_deliver(channel, consumer_tag, tag, redelivered, exchange, routing_key)
    return cut[0] + tag.to_bytes(8, "big") + cut[1]


def _marshal_deliver(
    channel: int, consumer_tag: str, tag: int, redelivered: bool, exchange: str, routing_key: str
) -> bytes:
    method = _Deliver(
        consumer_tag=consumer_tag,
        delivery_tag=tag,
        redelivered=redelivered,
        exchange=exchange,
        routing_key=routing_key,
    )
    return pframe.marshal(method, channel)


def _cut_deliver(
    channel: int, consumer_tag: str, redelivered: bool, exchange: str, routing_key: str
) -> tuple[bytes, bytes] | None:
    a = _marshal_deliver(channel, consumer_tag, _TAG_A, redelivered, exchange, routing_key)
    b = _marshal_deliver(channel, consumer_tag, _TAG_B, redelivered, exchange, routing_key)
    at = a.find(_TAG_A.to_bytes(8, "big"))
    if (
        len(a) != len(b)
        or at < 0
        or b[at : at + 8] != _TAG_B.to_bytes(8, "big")
        or a[:at] != b[:at]
        or a[at + 8 :] != b[at + 8 :]
    ):
        return None
    return a[:at], a[at + 8 :]


def confirm_frame(channel: int, tag: int, ok: bool) -> bytes:
    """The method frame of basic.ack (``ok``) or basic.nack confirming publish ``tag``,
    marshalled by pamqp (a nack with pamqp's defaults)."""
    method = spec.Basic.Ack(delivery_tag=tag) if ok else spec.Basic.Nack(delivery_tag=tag)
    return pframe.marshal(method, channel)


# ---------------------------------------------------------------------- content headers
class Header(NamedTuple):
    """What the gateway uses of a content header a publisher sent, read by pamqp."""

    body_size: int
    properties: spec.Basic.Properties
    """pamqp's reading of the properties (shared between the publishes that sent the same
    header: not to be changed)."""
    props: bytes
    """The properties as pamqp marshals them (what is stored with the message)."""


_HEADERS: dict[bytes, Header] = {}


def read_header(raw: RawFrame) -> Header:
    """The body size and properties of a content header frame, unmarshalled by pamqp
    (kept by the frame's payload: a publisher sends the same header for messages of the
    same size and properties). pamqp's errors are raised."""
    header = _HEADERS.get(raw.payload)
    if header is not None:
        return header
    _used, _channel, decoded = pframe.unmarshal(raw.data)
    if not isinstance(decoded, pheader.ContentHeader):
        raise ValueError(f"not a content header: {decoded.name}")
    header = Header(decoded.body_size, decoded.properties, decoded.properties.marshal())
    _bounded(_HEADERS)[raw.payload] = header
    return header


EMPTY_PROPERTIES = spec.Basic.Properties().marshal()
_HEADER_START = pheader.ContentHeader().marshal()[: -len(EMPTY_PROPERTIES)]
"""pamqp's content header of no body before its properties: what turns marshalled
properties back into a content header pamqp can unmarshal."""

_PROPERTIES: dict[bytes, spec.Basic.Properties] = {}


def decode_properties(props: bytes) -> spec.Basic.Properties:
    """pamqp's reading of marshalled basic properties (kept by their bytes; shared: not to
    be changed). pamqp's errors are raised."""
    properties = _PROPERTIES.get(props)
    if properties is None:
        decoded = pheader.ContentHeader()
        decoded.unmarshal(_HEADER_START + props)
        properties = _bounded(_PROPERTIES)[props] = decoded.properties
    return properties


_HEADER_FRAMES: dict[tuple[int, bytes, int], bytes] = {}


def content_frames(
    channel: int, props: bytes | spec.Basic.Properties, body: bytes, frame_max: int
) -> bytes:
    """The content header frame (marshalled by pamqp, from the marshalled properties
    ``props`` or a pamqp properties object) and the body frames of a message."""
    if isinstance(props, bytes):
        key = (channel, props, len(body))
        header = _HEADER_FRAMES.get(key)
        if header is None:
            content = pheader.ContentHeader(0, len(body), decode_properties(props))
            header = _bounded(_HEADER_FRAMES)[key] = pframe.marshal(content, channel)
    else:
        header = pframe.marshal(pheader.ContentHeader(0, len(body), props), channel)
    return header + body_frames(channel, body, frame_max)
