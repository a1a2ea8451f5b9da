"""The frames the gateway encodes itself (the hot paths) are pamqp's, byte for byte."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp import frame as pframe

from fsbus.amqp._frames import confirm_frame, deliver_frame

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
