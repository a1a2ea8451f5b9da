"""The frames the gateway encodes or reads itself (the hot paths) are pamqp's, byte for
byte, and read as pamqp reads them."""

from __future__ import annotations

import datetime
import struct

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from fsbus.amqp._frames import (
    ack_fields,
    confirm_frame,
    content_header,
    deliver_frame,
    plain_properties,
    publish_fields,
)

short = st.text(max_size=60)
exchanges = st.from_regex(r"[A-Za-z0-9_.:-]{0,60}", fullmatch=True)  # what pamqp allows
tags = st.integers(1, 2**63 - 1)  # pamqp encodes a signed long long


@given(st.integers(1, 65535), short, tags, st.booleans(), exchanges, short)
def test_deliver_is_pamqps(
    channel: int, ctag: str, tag: int, redelivered: bool, exchange: str, rk: str
) -> None:
    method = spec.Basic.Deliver(
        consumer_tag=ctag,
        delivery_tag=tag,
        redelivered=redelivered,
        exchange=exchange,
        routing_key=rk,
    )
    assert deliver_frame(channel, ctag, tag, redelivered, exchange, rk) == pframe.marshal(
        method, channel
    )


def test_deliver_of_a_long_name_is_left_to_pamqp() -> None:
    assert deliver_frame(1, "c", 1, False, "", "k" * 256) is None


@given(st.integers(1, 65535), tags)
def test_confirms_are_pamqps(channel: int, tag: int) -> None:
    ack = pframe.marshal(spec.Basic.Ack(delivery_tag=tag), channel)
    nack = pframe.marshal(spec.Basic.Nack(delivery_tag=tag), channel)
    assert confirm_frame(channel, tag, True) == ack
    assert confirm_frame(channel, tag, False) == nack


# The readers of the hot frames (a basic.ack or basic.publish a message, and the content
# header's properties) agree with pamqp's decoding, or leave the frame to pamqp.


def _payload(method: object, channel: int = 1) -> bytes:
    return pframe.marshal(method, channel)[7:-1]  # without the frame header and end octet


@given(tags, st.booleans())
def test_ack_reader_agrees_with_pamqp(tag: int, multiple: bool) -> None:
    assert ack_fields(_payload(spec.Basic.Ack(delivery_tag=tag, multiple=multiple))) == (
        tag,
        multiple,
    )


@given(exchanges, exchanges, st.booleans(), st.booleans())
def test_publish_reader_agrees_with_pamqp(
    exchange: str, rk: str, mandatory: bool, immediate: bool
) -> None:
    method = spec.Basic.Publish(
        exchange=exchange, routing_key=rk, mandatory=mandatory, immediate=immediate
    )
    assert publish_fields(_payload(method)) == (exchange, rk, mandatory)


def test_the_readers_leave_other_methods_to_pamqp() -> None:
    for method in (spec.Basic.Nack(delivery_tag=1), spec.Basic.Qos(), spec.Basic.Get()):
        assert ack_fields(_payload(method)) is None
        assert publish_fields(_payload(method)) is None


optional_short = st.none() | exchanges
timestamps = st.none() | st.datetimes(
    min_value=datetime.datetime(1970, 1, 2), timezones=st.just(datetime.UTC)
).map(lambda d: d.replace(microsecond=0))
octets = st.none() | st.integers(0, 255)


@given(
    st.none() | st.just("application/json"),
    st.none() | st.sampled_from([1, 2]),
    octets,
    optional_short,
    optional_short,
    st.none() | st.integers(0, 10**9).map(str),
    optional_short,
    timestamps,
    st.booleans(),
)
def test_properties_reader_agrees_with_pamqp(
    content_type: str | None,
    mode: int | None,
    priority: int | None,
    correlation_id: str | None,
    reply_to: str | None,
    expiration: str | None,
    app_id: str | None,
    timestamp: datetime.datetime | None,
    with_headers: bool,
) -> None:
    props = spec.Basic.Properties(
        content_type=content_type,
        delivery_mode=mode,
        priority=priority,
        correlation_id=correlation_id,
        reply_to=reply_to,
        expiration=expiration,
        app_id=app_id,
        timestamp=timestamp,
        headers={"k": 1} if with_headers else None,
    )
    frame = pframe.marshal(pheader.ContentHeader(0, 5, props), 1)
    size, raw = content_header(frame[7:-1])
    assert size == 5
    plain = plain_properties(raw)
    if with_headers:
        assert plain is None  # pamqp decodes the headers table
        return
    _n, _c, decoded = pframe.unmarshal(frame)
    got = decoded.properties
    assert plain == (got.delivery_mode, got.priority, got.expiration, got.reply_to)


@given(st.binary(max_size=80))
def test_properties_reader_never_disagrees_with_pamqp_on_random_bytes(raw: bytes) -> None:
    plain = plain_properties(raw)
    if plain is None:
        return
    header = struct.pack(">HHQ", 60, 0, 0) + raw
    frame = struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce"
    _n, _c, decoded = pframe.unmarshal(frame)
    got = decoded.properties
    assert plain == (got.delivery_mode, got.priority, got.expiration, got.reply_to)
