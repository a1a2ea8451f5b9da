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
from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pika.exceptions
import pytest

from fsbus import BlockingBus
from fsbus.amqp import running
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


def test_an_auto_delete_queue_goes_at_its_last_consumers_cancel(
    broker: Broker, names: Names
) -> None:
    """RabbitMQ deletes an auto-delete queue when its last consumer is cancelled, before
    the ``cancel-ok``, though that consumer still holds messages unacked: a passive
    declare right after is a 404. Acking those messages afterwards is no error, and a
    queue of the same name declared again after the cancel is a new queue: the old one's
    settling does not delete it, and it gives what is published into it."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        q = names("auto-del")
        ch.queue_declare(q, auto_delete=True)
        for body in (b"one", b"two"):
            ch.basic_publish("", q, body)
        got: list[int] = []
        tag = ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.delivery_tag))
        deadline = time.monotonic() + WAIT
        while len(got) < 2:
            assert time.monotonic() < deadline, f"only {len(got)} of 2 delivered"
            conn.process_data_events(time_limit=0.1)
        ch.basic_cancel(tag)
        probe = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            probe.queue_declare(q, passive=True)
        assert gone.value.reply_code == 404
        # The same name again, and a message in it, before the old messages are acked.
        ch.queue_declare(q, auto_delete=True)
        ch.basic_publish("", q, b"three")
        ch.basic_ack(got[-1], multiple=True)  # the deleted queue's: accepted, no error
        # The new queue stays (it has had no consumer) and gives its message.
        deadline = time.monotonic() + WAIT
        while True:
            method, _props, body = ch.basic_get(q)
            if method is not None:
                break
            assert time.monotonic() < deadline, "the queue declared again gave nothing"
            conn.process_data_events(time_limit=0.02)
        assert body == b"three"
        ch.basic_ack(method.delivery_tag)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        ch.queue_delete(q)
    finally:
        conn.close()


@contextmanager
def _another_connection(broker: Broker) -> Iterator[pika.BlockingConnection]:
    """A connection of another client: on fsbus, to a second gateway on the same bus
    (which deletes through the bus: the first gateway hears of it from the bus alone)."""
    if broker.kind == "rabbitmq":
        url = broker.url
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            yield conn
        finally:
            conn.close()
        return
    assert broker.root is not None
    with running(broker.root) as second:
        conn = pika.BlockingConnection(pika.URLParameters(second.url))
        try:
            yield conn
        finally:
            conn.close()


def _cancelled_within(conn: pika.BlockingConnection, cancelled: list[str]) -> None:
    deadline = time.monotonic() + WAIT
    while not cancelled:
        assert time.monotonic() < deadline, f"no basic.cancel within {WAIT} s"
        conn.process_data_events(time_limit=0.05)


@pytest.mark.parametrize("deleted_through", ["another connection", "the Python API"])
def test_a_consumer_of_a_queue_deleted_elsewhere_is_cancelled(
    broker: Broker, names: Names, deleted_through: str
) -> None:
    """RabbitMQ cancels the consumers of a queue deleted by another client (basic.cancel,
    to a client that says it understands it, as pika does); so does the gateway, for a
    queue deleted through another gateway of its bus or by an fsbus process. The channel
    goes on; a queue of that name declared again is a new queue, with no consumer."""
    if deleted_through == "the Python API" and broker.kind == "rabbitmq":
        pytest.skip("RabbitMQ has no Python API on its queues")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        q = names("doomed")
        ch.queue_declare(q)
        cancelled: list[str] = []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        tag = ch.basic_consume(q, lambda _c, _m, _p, _b: None)
        if deleted_through == "another connection":
            with _another_connection(broker) as other:
                other.channel().queue_delete(q)
        else:
            assert broker.root is not None
            with BlockingBus(broker.root) as bus:
                bus.delete_queue(bus_queue_name(q))
        _cancelled_within(conn, cancelled)
        assert cancelled == [tag]
        ch.queue_declare(q)
        ch.basic_publish("", q, b"to the new queue")
        deadline = time.monotonic() + WAIT
        while (ok := ch.queue_declare(q, passive=True).method).message_count < 1:
            assert time.monotonic() < deadline
        assert ok.consumer_count == 0
        _method, _props, body = ch.basic_get(q, auto_ack=True)
        assert body == b"to the new queue"
        ch.queue_delete(q)
    finally:
        conn.close()
