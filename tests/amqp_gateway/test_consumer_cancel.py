"""A consumer cancelled with messages claimed for it but not yet sent.

The gateway claims a consumer's messages from the queue ahead of sending them (up to its
prefetch). What it had not sent when the consumer went away was never delivered, so the
next consumer gets it with ``redelivered`` false, as RabbitMQ, which sends at once, would
have it (what the client received and did not ack comes back redelivered: see
test_features.py). ``channel.flow``
(which RabbitMQ does not accept from clients) holds the claimed messages on the gateway
while the consumer is cancelled.
"""

from __future__ import annotations

import time

import pika

from fsbus import BlockingBus
from fsbus.amqp._routing import bus_queue_name

from .conftest import Broker, Names

WAIT = 20.0


def _wait_held(broker: Broker, queue: str, n: int) -> None:
    assert broker.root is not None
    deadline = time.monotonic() + WAIT
    with BlockingBus(broker.root) as bus:
        while sum(m.locked for m in bus.browse(queue=bus_queue_name(queue))) < n:
            assert time.monotonic() < deadline, f"the gateway did not claim {n} within {WAIT} s"
            time.sleep(0.02)


def test_unsent_messages_of_a_cancelled_consumer_are_not_redelivered(gateway: Broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("held").method.queue
        for i in range(6):
            ch.basic_publish("", q, str(i).encode())
        ch.basic_qos(prefetch_count=4)
        ch.flow(False)  # the gateway claims for the consumer, and sends nothing
        first: list[bytes] = []
        tag = ch.basic_consume(q, lambda _c, _m, _p, b: first.append(b))
        _wait_held(gateway, q, 4)
        ch.basic_cancel(tag)
        ch.flow(True)
        other = conn.channel()
        again: dict[bytes, bool] = {}
        for method, _props, body in other.consume(q, inactivity_timeout=WAIT):
            assert method is not None, f"stalled after {again}"
            again[body] = method.redelivered
            other.basic_ack(method.delivery_tag)
            if len(again) == 6:
                break
        other.cancel()
    finally:
        conn.close()
    assert first == []
    assert again == {str(i).encode(): False for i in range(6)}


def test_a_cancelled_consumer_holding_unacked_messages_no_longer_counts(
    broker: Broker, names: Names
) -> None:
    """Once ``cancel-ok`` is sent the consumer is gone, whatever it still holds unacked:
    the queue counts no consumer and ``queue.delete(if_unused)`` deletes it. (The
    gateway settles the cancelled subscription in the background, until those messages
    are settled.)"""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        q = names("leaving")
        ch.queue_declare(q)
        ch.basic_publish("", q, b"held")
        got: list[bytes] = []
        tag = ch.basic_consume(q, lambda _c, _m, _p, b: got.append(b))
        deadline = time.monotonic() + WAIT
        while not got:
            assert time.monotonic() < deadline, "no delivery"
            conn.process_data_events(time_limit=0.1)
        ch.basic_cancel(tag)  # the message stays unacked on this channel
        assert ch.queue_declare(q, passive=True).method.consumer_count == 0
        ch.queue_delete(q, if_unused=True)
    finally:
        conn.close()
    assert got == [b"held"]
