"""AMQP 0-9-1 framing around pamqp: cutting the byte stream into frames, and content
frames written from the raw property bytes a publisher sent (never re-encoded)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ._routing import FRAME_ERROR, AmqpError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
BASIC_CLASS = 60
_HEAD = struct.Struct(">BHI")
_CONTENT = struct.Struct(">HHQ")


@dataclass(frozen=True)
class RawFrame:
    """One frame as read: its type, channel, payload, and the whole frame's bytes."""

    kind: int
    channel: int
    payload: bytes
    data: bytes


class FrameReader:
    """Cuts frames out of received bytes; refuses frames over ``frame_max``."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[RawFrame]:
        self._buf += data
        out = []
        while len(self._buf) >= 7:
            kind, channel, size = _HEAD.unpack_from(self._buf)
            if size + 8 > self.frame_max:
                raise AmqpError(
                    FRAME_ERROR,
                    f"FRAME_ERROR - type {kind}, all octets = <<>>: frame size {size + 8} "
                    f"larger than frame_max {self.frame_max}",
                    connection=True,
                )
            if len(self._buf) < size + 8:
                break
            if self._buf[size + 7] != FRAME_END:
                raise AmqpError(
                    FRAME_ERROR,
                    f"FRAME_ERROR - type {kind}, first 16 octets = <<>>: frame end marker "
                    f"{self._buf[size + 7]:#x} is not {FRAME_END:#x}",
                    connection=True,
                )
            data = bytes(self._buf[: size + 8])
            out.append(RawFrame(kind, channel, data[7 : 7 + size], data))
            del self._buf[: size + 8]
        return out


def content_header(payload: bytes) -> tuple[int, bytes]:
    """(body size, raw property bytes) of a content header frame's payload."""
    if len(payload) < _CONTENT.size:
        raise ValueError("content header too short")
    _cls, _weight, size = _CONTENT.unpack_from(payload)
    return size, payload[_CONTENT.size :]


def content_frames(channel: int, props: bytes, body: bytes, frame_max: int) -> bytes:
    """The header frame (with ``props`` as they came) and the body frames of a message."""
    header = _CONTENT.pack(BASIC_CLASS, 0, len(body)) + props
    parts = [_HEAD.pack(FRAME_HEADER, channel, len(header)), header, b"\xce"]
    room = max(frame_max - 8, 1)
    for i in range(0, len(body), room):
        chunk = body[i : i + room]
        parts += [_HEAD.pack(FRAME_BODY, channel, len(chunk)), chunk, b"\xce"]
    return b"".join(parts)


HEARTBEAT = _HEAD.pack(FRAME_HEARTBEAT, 0, 0) + b"\xce"

_DELIVER = struct.Struct(">HH")
_TAG = struct.Struct(">QB")
_ACK = struct.Struct(">HHQB")


def _short(text: str) -> bytes | None:
    data = text.encode("utf-8")
    return None if len(data) > 255 else bytes((len(data),)) + data


def deliver_frame(
    channel: int, consumer_tag: str, tag: int, redelivered: bool, exchange: str, routing_key: str
) -> bytes | None:
    """The method frame of basic.deliver, encoded here (the hot path of consuming);
    None when a name is too long for a short string (the caller lets pamqp say so)."""
    ctag, ex, rk = _short(consumer_tag), _short(exchange), _short(routing_key)
    if ctag is None or ex is None or rk is None:
        return None
    payload = b"".join(
        (_DELIVER.pack(BASIC_CLASS, 60), ctag, _TAG.pack(tag, 1 if redelivered else 0), ex, rk)
    )
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def confirm_frame(channel: int, tag: int, ok: bool) -> bytes:
    """The method frame of basic.ack (``ok``) or basic.nack confirming publish ``tag``."""
    if ok:
        payload = _ACK.pack(BASIC_CLASS, 80, tag, 0)
    else:
        payload = _ACK.pack(BASIC_CLASS, 120, tag, 2)  # the requeue bit set, as pamqp sets it
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


_ACK_ID = _DELIVER.pack(BASIC_CLASS, 80)
_PUBLISH_ID = _DELIVER.pack(BASIC_CLASS, 40)


def ack_fields(payload: bytes) -> tuple[int, bool] | None:
    """(delivery tag, multiple) of a basic.ack method frame's payload; None for any
    other method (the hot path of consuming: one ack a message)."""
    if len(payload) != 13 or payload[:4] != _ACK_ID:
        return None
    tag, bits = _TAG.unpack_from(payload, 4)
    return tag, bool(bits & 1)


def publish_fields(payload: bytes) -> tuple[str, str, bool] | None:
    """(exchange, routing key, mandatory) of a basic.publish method frame's payload; None
    for any other method, or one that is not well formed (pamqp then says why)."""
    if payload[:4] != _PUBLISH_ID:
        return None
    try:
        at = 6  # after the class, the method and the reserved short
        size = payload[at]
        exchange = payload[at + 1 : at + 1 + size].decode("utf-8")
        at += 1 + size
        size = payload[at]
        routing_key = payload[at + 1 : at + 1 + size].decode("utf-8")
        at += 1 + size
        if at + 1 != len(payload):
            return None
        return exchange, routing_key, bool(payload[at] & 1)
    except (IndexError, UnicodeDecodeError):
        return None


# the basic properties in their order: (flag, kind) with kind "s" a short string,
# "t" a field table, "o" an octet, "q" a 64-bit timestamp
_PROPERTIES = (
    (0x8000, "s"),  # content-type
    (0x4000, "s"),  # content-encoding
    (0x2000, "t"),  # headers
    (0x1000, "o"),  # delivery-mode
    (0x0800, "o"),  # priority
    (0x0400, "s"),  # correlation-id
    (0x0200, "s"),  # reply-to
    (0x0100, "s"),  # expiration
    (0x0080, "s"),  # message-id
    (0x0040, "q"),  # timestamp
    (0x0020, "s"),  # type
    (0x0010, "s"),  # user-id
    (0x0008, "s"),  # app-id
    (0x0004, "s"),  # cluster-id
)


def plain_properties(
    props: bytes,
) -> tuple[int | None, int | None, str | None, str | None] | None:
    """(delivery mode, priority, expiration, reply-to) of raw basic properties with no headers
    table, read by hand (the hot path of publishing); None when they carry headers or
    are not well formed: pamqp then decodes them (or says what is wrong)."""
    if len(props) < 2:
        return None
    flags = int.from_bytes(props[:2], "big")
    if flags & 0x2003:  # headers, or flag bits past the last property
        return None
    values: dict[int, int | str] = {}
    at = 2
    try:
        for flag, kind in _PROPERTIES:
            if not flags & flag:
                continue
            if kind == "s":
                size = props[at]
                if at + 1 + size > len(props):
                    return None
                if flag in (0x0100, 0x0200):
                    values[flag] = props[at + 1 : at + 1 + size].decode("utf-8")
                at += 1 + size
            elif kind == "o":
                values[flag] = props[at]
                at += 1
            else:
                at += 8
    except (IndexError, UnicodeDecodeError):
        return None
    if at != len(props):
        return None
    mode, priority = values.get(0x1000), values.get(0x0800)
    expiration, reply_to = values.get(0x0100), values.get(0x0200)
    assert mode is None or isinstance(mode, int)
    assert priority is None or isinstance(priority, int)
    assert expiration is None or isinstance(expiration, str)
    assert reply_to is None or isinstance(reply_to, str)
    return mode, priority, expiration, reply_to
