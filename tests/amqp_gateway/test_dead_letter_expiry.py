"""Dead-lettering of expired messages on the gateway and on RabbitMQ, with pika: a
message that outlives its queue's ``x-message-ttl`` or its own ``expiration`` goes to
the queue's dead-letter exchange with ``x-death`` reason ``expired`` (or is dropped
when the queue has none), the same observable results on each."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pika

from .conftest import Names
from .test_features import get_all

WAIT = 20.0  # the gateway may look for expired messages about once a second

Channel = pika.adapters.blocking_connection.BlockingChannel


def count(ch: Channel, queue: str) -> int:
    """``queue``'s ready messages, as a passive queue.declare counts them."""
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def wait_for_count(ch: Channel, queue: str, n: int, why: str) -> None:
    """Poll ``queue``'s count until it is ``n``, failing with ``why`` after WAIT s."""
    deadline = time.monotonic() + WAIT
    while (got := count(ch, queue)) != n:
        assert time.monotonic() < deadline, f"{why}: {got} messages, not {n}, after {WAIT} s"
        time.sleep(0.05)


def dead_letter_fanout(ch: Channel, names: Names, base: str) -> tuple[str, str, str]:
    """A fanout ``dlx``, a queue ``dead`` bound to it, and a queue ``src`` whose
    dead-letter exchange it is (no ttl): (dlx, dead, src)."""
    dlx = names(f"{base}-dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = ch.queue_declare(names(f"{base}-dead")).method.queue
    ch.queue_bind(dead, dlx)
    src = ch.queue_declare(
        names(f"{base}-src"), arguments={"x-dead-letter-exchange": dlx}
    ).method.queue
    return dlx, dead, src


def death_without_time(headers: dict[str, Any]) -> dict[str, Any]:
    """The one ``x-death`` entry of ``headers``, its ``time`` checked and left out."""
    (death,) = headers["x-death"]
    assert isinstance(death["time"], datetime.datetime)
    return {k: v for k, v in death.items() if k != "time"}


def expire_each_into_kept_once(ch: Channel, src: str, kept: str) -> None:
    """Publish 3 messages into ``src`` (whose ttl and dead-letter exchange lead into
    ``kept`` and back into ``src``): each expired one reaches ``kept`` once, dead in
    ``src``, and none goes back into ``src``, which stays empty over several ttl (polled
    for 1.5 s); then both queues are deleted."""
    for i in range(3):
        ch.basic_publish("", src, str(i).encode())
    got = get_all(ch, kept, 3)
    assert sorted(body for _m, _p, body in got) == [b"0", b"1", b"2"]
    assert {death_without_time(dict(p.headers))["queue"] for _m, p, _b in got} == {src}
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        assert count(ch, src) == 0, "routed back into the queue it died in"
        time.sleep(0.05)
    assert count(ch, kept) == 0
    for q in (src, kept):
        ch.queue_delete(q)


def test_a_wait_queue_retries_each_message_after_its_ttl(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """The "retry after a delay" pattern: a ``wait`` queue with ``x-message-ttl`` and no
    consumer dead-letters each message, once expired, through the default exchange to
    the ``work`` queue named by its ``x-dead-letter-routing-key``. A consumer of ``work``
    gets each of the 20 exactly once, in the order published, with one ``x-death`` entry
    (reason ``expired``, the wait queue, count 1, the exchange and routing keys it was
    published with), the
    first death's queue, reason and exchange, and its own properties and headers kept;
    ``wait`` is left empty."""
    ch = conn.channel()
    work = ch.queue_declare(names("retry-work"), durable=True).method.queue
    wait = ch.queue_declare(
        names("retry-wait"),
        arguments={
            "x-message-ttl": 300,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work,
        },
    ).method.queue
    for i in range(20):
        props = pika.BasicProperties(correlation_id=f"c-{i}", headers={"n": i}, delivery_mode=2)
        ch.basic_publish("", wait, str(i).encode(), props)
    got: list[tuple[Any, Any, bytes]] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append((m, p, b))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(work, on_message)
    deadline = time.monotonic() + WAIT
    while len(got) < 20:
        assert time.monotonic() < deadline, f"only {len(got)} of 20 retried within {WAIT} s"
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.5)  # nothing more comes
    assert [int(b) for _m, _p, b in got] == list(range(20))  # once each, in queue order
    for method, props, body in got:
        i = int(body)
        assert (method.exchange, method.routing_key) == ("", work)
        headers = dict(props.headers)
        assert death_without_time(headers) == {
            "count": 1,
            "reason": "expired",
            "queue": wait,
            "exchange": "",
            "routing-keys": [wait],
        }
        assert headers["x-first-death-queue"] == wait
        assert headers["x-first-death-reason"] == "expired"
        assert headers["x-first-death-exchange"] == ""
        assert headers["n"] == i
        assert (props.correlation_id, props.delivery_mode) == (f"c-{i}", 2)
        assert props.expiration is None
    assert count(ch, wait) == 0
    for q in (wait, work):
        ch.queue_delete(q)


def test_a_message_expiration_dead_letters_only_the_expiring_messages(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """Per-message TTL: of 10 messages to a queue with a dead-letter exchange and no
    queue TTL, the 5 with ``expiration`` "200" reach the dead-letter exchange under their
    own routing key, each once, with ``x-death`` reason ``expired`` and the expiration
    moved into the entry as ``original-expiration`` (the message's ``expiration`` gone);
    the 5 without stay in the queue. RabbitMQ's classic queues expire a message only at
    the head of the queue, so the expiring 5 are published first."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = dead_letter_fanout(ch, names, "expiry")
    for i in range(5):
        props = pika.BasicProperties(expiration="200", headers={"n": i})
        ch.basic_publish("", src, f"short {i}".encode(), props)
    for i in range(5):
        ch.basic_publish("", src, f"long {i}".encode(), pika.BasicProperties(headers={"n": i}))
    got = get_all(ch, dead, 5)
    assert sorted(b for _m, _p, b in got) == [f"short {i}".encode() for i in range(5)]
    for method, props, body in got:
        assert (method.exchange, method.routing_key) == (dlx, src)
        headers = dict(props.headers)
        assert death_without_time(headers) == {
            "count": 1,
            "reason": "expired",
            "queue": src,
            "exchange": "",
            "routing-keys": [src],
            "original-expiration": "200",
        }
        assert headers["x-first-death-reason"] == "expired"
        assert headers["n"] == int(body.split()[1])
        assert props.expiration is None
    wait_for_count(ch, src, 5, "the messages without an expiration did not stay")
    assert ch.basic_get(dead) == (None, None, None)
    kept = get_all(ch, src, 5)
    assert [b for _m, _p, b in kept] == [f"long {i}".encode() for i in range(5)]
    for _m, props, _b in kept:
        assert "x-death" not in props.headers
    for q in (src, dead):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_expired_messages_of_a_queue_without_a_dead_letter_exchange_are_dropped(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A queue with ``x-message-ttl`` and no dead-letter exchange: its 5 messages,
    confirmed in, are dropped once expired and its count comes down to 0."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(names("ttl-drop"), arguments={"x-message-ttl": 200}).method.queue
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    wait_for_count(ch, q, 0, "the expired messages were not dropped")
    assert ch.basic_get(q) == (None, None, None)
    ch.queue_delete(q)


def test_a_rejected_and_an_expired_message_are_dead_lettered_each_with_its_reason(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """Of one queue's two messages, one taken and rejected (``requeue=False``) and one
    left to its ``expiration``, each reaches the dead-letter exchange once, with reason
    ``rejected`` and ``expired`` respectively (only the expired one's entry has an
    ``original-expiration``). The rejected one is published first and taken with
    ``basic.get``, leaving the expiring one at the head, where RabbitMQ expires it."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = dead_letter_fanout(ch, names, "both")
    ch.basic_publish("", src, b"poison")
    ch.basic_publish("", src, b"stale", pika.BasicProperties(expiration="200"))
    method, _p, body = get_unacked(ch, src)
    assert body == b"poison"
    ch.basic_reject(method.delivery_tag, requeue=False)
    got = get_all(ch, dead, 2)
    deaths = {body: death_without_time(dict(props.headers)) for _m, props, body in got}
    assert deaths == {
        b"poison": {
            "count": 1,
            "reason": "rejected",
            "queue": src,
            "exchange": "",
            "routing-keys": [src],
        },
        b"stale": {
            "count": 1,
            "reason": "expired",
            "queue": src,
            "exchange": "",
            "routing-keys": [src],
            "original-expiration": "200",
        },
    }
    for _m, props, body in got:
        assert props.headers["x-first-death-reason"] == deaths[body]["reason"]
        assert props.expiration is None
    assert ch.basic_get(dead) == (None, None, None)
    assert count(ch, src) == 0
    for q in (src, dead):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def get_unacked(ch: Channel, queue: str) -> tuple[Any, Any, bytes]:
    """One message of ``queue`` through basic.get, not acked, polling up to WAIT s."""
    deadline = time.monotonic() + WAIT
    while True:
        method, props, body = ch.basic_get(queue)
        if method is not None:
            return method, props, body
        assert time.monotonic() < deadline, f"nothing in {queue} within {WAIT} s"
        time.sleep(0.02)


def test_an_expired_message_dead_lettered_back_into_its_own_queue_is_dropped(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``x-dead-letter-exchange`` "" (the default exchange) with no routing key sends an
    expired message back into the queue it died in: a cycle with no rejection in it,
    which RabbitMQ breaks by dropping the message. The queue empties and stays empty
    over several ttl and looks for expired messages (polled for 1.5 s: a message that
    came back would be counted for its 200 ms each time)."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(
        names("self-cycle"), arguments={"x-message-ttl": 200, "x-dead-letter-exchange": ""}
    ).method.queue
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    wait_for_count(ch, q, 0, "expired")
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        assert count(ch, q) == 0, "came back into the queue it died in"
        time.sleep(0.05)
    assert ch.basic_get(q, auto_ack=True)[0] is None
    ch.queue_delete(q)


def test_an_expired_message_is_not_routed_back_into_a_queue_it_died_in(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A fanout dead-letter exchange bound to the queue itself and to a collector: each
    expired message reaches the collector once, and not the queue it died in (RabbitMQ
    leaves out a queue that would close a cycle with no rejection); the queue stays
    empty over several ttl (polled for 1.5 s)."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx = names("cycle-dlx")
    ch.exchange_declare(dlx, "fanout")
    src = ch.queue_declare(
        names("cycle-src"), arguments={"x-message-ttl": 200, "x-dead-letter-exchange": dlx}
    ).method.queue
    kept = ch.queue_declare(names("cycle-kept")).method.queue
    for q in (src, kept):
        ch.queue_bind(q, dlx)
    expire_each_into_kept_once(ch, src, kept)
    ch.exchange_delete(dlx)


def test_an_expired_message_is_not_routed_back_through_amq_topic_into_its_queue(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """As above, through ``amq.topic`` (which the gateway also publishes on the bus
    itself, for fsbus subscribers): the queue and a collector are bound to the
    dead-letter routing key; each expired message reaches the collector once, and not
    the queue it died in, which stays empty over several ttl (polled for 1.5 s)."""
    ch = conn.channel()
    ch.confirm_delivery()
    key = names("cycle-key")
    src = ch.queue_declare(
        names("topic-cycle-src"),
        arguments={
            "x-message-ttl": 200,
            "x-dead-letter-exchange": "amq.topic",
            "x-dead-letter-routing-key": key,
        },
    ).method.queue
    kept = ch.queue_declare(names("topic-cycle-kept")).method.queue
    for q in (src, kept):
        ch.queue_bind(q, "amq.topic", key)
    expire_each_into_kept_once(ch, src, kept)
