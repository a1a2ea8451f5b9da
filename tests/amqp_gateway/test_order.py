"""One publisher's messages reach a queue's one consumer in the order published, on the
gateway as on RabbitMQ, while the consumer is running (its listings race the publishes).

The gateway routes a connection's publishes in batches. It once stamped each bucket
once per batch, at its end: a consumer's listing, looking at a bucket for an earlier
stamp, then found a later message of the batch and took it before an earlier one whose
bucket it had not looked at (in 17 runs of 20, 500 messages each)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pika
import pytest

from .conftest import Broker, Names

WAIT = 60.0
N = 500


def publish(url: str, queue: str, n: int, *, confirms: bool) -> None:
    """0 .. n-1 to ``queue`` through the default exchange, on a connection of its own."""
    c = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = c.channel()
        if confirms:
            ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, str(i).encode())
    finally:
        c.close()


@pytest.mark.parametrize(
    ("prefetch", "confirms"), [(0, False), (100, False), (1, False), (100, True)]
)
def test_a_running_consumer_gets_a_publishers_messages_in_order(
    conn: pika.BlockingConnection, broker: Broker, names: Names, prefetch: int, confirms: bool
) -> None:
    """A consumer (``prefetch`` 0: no limit) is running when another connection publishes
    500 messages to its queue back to back (``confirms``: each waiting for its confirm):
    it gets each once, in the order published."""
    ch = conn.channel()
    queue = ch.queue_declare(names("order")).method.queue
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    got: list[int] = []

    def on_message(c: Any, m: Any, _p: Any, body: bytes) -> None:
        got.append(int(body))
        c.basic_ack(m.delivery_tag)

    tag = ch.basic_consume(queue, on_message)
    conn.process_data_events(time_limit=0.05)  # consuming before the first publish
    failed: list[BaseException] = []

    def run() -> None:
        try:
            publish(broker.url, queue, N, confirms=confirms)
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)

    publisher = threading.Thread(target=run)
    publisher.start()
    deadline = time.monotonic() + WAIT
    while len(got) < N:
        assert time.monotonic() < deadline, f"only {len(got)} of {N} within {WAIT} s"
        conn.process_data_events(time_limit=0.05)
    publisher.join(WAIT)
    assert not failed, failed
    conn.process_data_events(time_limit=0.2)  # nothing more comes
    ch.basic_cancel(tag)
    if got != list(range(N)):
        at = next(i for i, (a, b) in enumerate(zip(got, range(N), strict=False)) if a != b)
        raise AssertionError(f"out of order at {at}: {got[max(0, at - 3) : at + 5]}")
    ch.queue_delete(queue)
