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
