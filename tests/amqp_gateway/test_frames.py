"""The gateway's framing around pamqp: frames cut from a byte stream, bodies cut into
frames of at most frame_max, and the kept (cached) pamqp outputs equal to what pamqp
gives afresh."""

from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader

from fsbus.amqp._frames import (
    FrameReader,
    confirm_frame,
    content_frames,
    decode_method,
    decode_properties,
    deliver_frame,
    read_header,
)
from fsbus.amqp._routing import AmqpError

short = st.text(max_size=60)
exchanges = st.from_regex(r"[A-Za-z0-9_.:-]{0,60}", fullmatch=True)  # what pamqp allows
tags = st.integers(1, 2**63 - 1)  # pamqp encodes a signed long long
optional_short = st.none() | exchanges.filter(bool)  # pamqp leaves an empty one out
timestamps = st.none() | st.datetimes(
    min_value=datetime.datetime(1970, 1, 2),
    max_value=datetime.datetime(2100, 1, 1),  # pamqp 4.0 misreads later ones
    timezones=st.just(datetime.UTC),
).map(lambda d: d.replace(microsecond=0))
properties = st.builds(
    spec.Basic.Properties,
    content_type=st.none() | st.just("application/json"),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=optional_short,
    reply_to=optional_short,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    app_id=optional_short,
    timestamp=timestamps,
    headers=st.none() | st.just({"k": 1, "s": "v"}),
)


def _frames(data: bytes) -> list[object]:
    out = []
    while data:
        used, _channel, value = pframe.unmarshal(data)
        out.append(value)
        data = data[used:]
    return out


@given(
    st.integers(1, 65535),
    short,
    st.lists(tags, min_size=1, max_size=6),
    st.booleans(),
    exchanges,
    short,
)
def test_deliver_is_pamqps(
    channel: int, ctag: str, many: list[int], redelivered: bool, exchange: str, rk: str
) -> None:
    """Each delivery's frame is pamqp's, the first to a consumer and exchange and key as
    the later ones (the frame kept for them, each tag put in)."""
    for tag in many:
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


def test_deliver_names_any_exchange_a_short_string_holds() -> None:
    (method,) = _frames(deliver_frame(1, "c", 1, False, "wörk queue!", "k"))
    assert isinstance(method, spec.Basic.Deliver)
    assert method.exchange == "wörk queue!"


@given(st.integers(1, 65535), tags)
def test_confirms_are_pamqps(channel: int, tag: int) -> None:
    assert confirm_frame(channel, tag, True) == pframe.marshal(
        spec.Basic.Ack(delivery_tag=tag), channel
    )
    assert confirm_frame(channel, tag, False) == pframe.marshal(
        spec.Basic.Nack(delivery_tag=tag), channel
    )


def _raw(data: bytes) -> object:
    (raw,) = FrameReader(1 << 20).feed(data)
    return raw


@given(exchanges, exchanges, st.booleans())
def test_a_kept_publish_reads_as_pamqp_reads_it(exchange: str, rk: str, mandatory: bool) -> None:
    data = pframe.marshal(
        spec.Basic.Publish(exchange=exchange, routing_key=rk, mandatory=mandatory), 3
    )
    for _ in range(2):  # read, then kept
        method = decode_method(_raw(data))  # type: ignore[arg-type]
        assert isinstance(method, spec.Basic.Publish)
        assert (method.exchange, method.routing_key, method.mandatory) == (exchange, rk, mandatory)


@given(properties, st.integers(0, 10**6))
def test_a_content_header_reads_as_pamqp_reads_it(props: spec.Basic.Properties, size: int) -> None:
    data = pframe.marshal(pheader.ContentHeader(0, size, props), 1)
    for _ in range(2):  # read, then kept
        header = read_header(_raw(data))  # type: ignore[arg-type]
        assert header.body_size == size
        assert header.properties == props
        assert header.props == props.marshal()
        assert decode_properties(header.props) == props


def test_an_empty_string_property_is_left_out_as_pamqp_leaves_it_out() -> None:
    # a publisher's header (pika's, say) with delivery-mode 2 and app-id "" (pamqp would
    # not send the empty one)
    payload = struct.pack(">HHQ", 60, 0, 1) + b"\x10\x08" + b"\x02" + b"\x00"
    data = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    header = read_header(_raw(data))  # type: ignore[arg-type]
    assert header.properties.app_id == ""  # as sent
    assert header.props == spec.Basic.Properties(delivery_mode=2).marshal()  # as stored


@given(properties, st.binary(max_size=300), st.integers(4096, 4200), st.integers(1, 65535))
def test_content_frames_carry_the_properties_and_the_body_in_frames_of_frame_max(
    props: spec.Basic.Properties, body: bytes, frame_max: int, channel: int
) -> None:
    body = body * 40
    for given_props in (props.marshal(), props):
        data = content_frames(channel, given_props, body, frame_max)
        if isinstance(given_props, bytes):  # kept: the same again
            assert content_frames(channel, given_props, body, frame_max) == data
        header, *bodies = _frames(data)
        assert isinstance(header, pheader.ContentHeader)
        assert (header.body_size, header.properties) == (len(body), props)
        assert b"".join(b.value for b in bodies) == body  # type: ignore[attr-defined]
        reader = FrameReader(frame_max)
        assert len(reader.feed(data)) == 1 + len(bodies)  # none over frame_max
        assert all(b.value for b in bodies)  # type: ignore[attr-defined]


@given(
    st.lists(
        st.tuples(st.sampled_from([1, 2, 3, 8]), st.integers(0, 65535), st.binary(max_size=300))
    ),
    st.lists(st.integers(1, 400), max_size=40),
)
def test_frames_come_out_whole_however_the_reads_cut_them(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    """A stream of frames read in pieces of any sizes gives each frame once, whole, in
    order: a frame cut across reads waits for its rest."""
    stream = b"".join(struct.pack(">BHI", k, c, len(p)) + p + b"\xce" for k, c, p in frames)
    reader = FrameReader(1 << 20)
    got, at = [], 0
    for n in [*cuts, len(stream)]:
        got += reader.feed(stream[at : at + n])
        at += n
    assert [(f.kind, f.channel, f.payload) for f in got] == frames
    assert b"".join(f.data for f in got) == stream


def test_a_frame_without_its_end_marker_or_over_frame_max_is_a_frame_error() -> None:
    """As RabbitMQ has it: 501 FRAME_ERROR, a connection error, naming what was wrong
    (after the frames of the reads before it were handed out)."""
    good = struct.pack(">BHI", 1, 1, 3) + b"abc\xce"
    for bad, text in (
        (struct.pack(">BHI", 1, 1, 3) + b"abc\x00", "frame end marker 0x0 is not 0xce"),
        (struct.pack(">BHI", 3, 1, 5000), "frame size 5008 larger than frame_max 4096"),
    ):
        reader = FrameReader(4096)
        assert [f.payload for f in reader.feed(good)] == [b"abc"]
        with pytest.raises(AmqpError, match=text) as caught:
            reader.feed(bad)
        assert (caught.value.code, caught.value.connection) == (501, True)
