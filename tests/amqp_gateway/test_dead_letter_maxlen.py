"""Dead-lettering of the messages a full queue drops, on the gateway and on RabbitMQ,
with pika: a queue with ``x-max-length`` (and the default ``x-overflow: drop-head``)
that is over its length drops its oldest ready message, and sends it to the queue's
dead-letter exchange with ``x-death`` reason ``maxlen`` (or drops it silently when the
queue has none), the same observable results on each."""

from __future__ import annotations

import time
from typing import Any

import pika

from .conftest import Names
from .test_dead_letter_expiry import (
    WAIT,
    Channel,
    count,
    dead_letter_fanout,
    death_without_time,
    wait_for_count,
)
from .test_features import get_all


def consume_all(
    conn: pika.BlockingConnection, ch: Channel, queue: str, n: int
) -> list[tuple[Any, Any, bytes]]:
    """``n`` messages of ``queue`` through a consumer (each acked), waiting up to WAIT s
    for them and then 0.5 s more to see that no more come."""
    got: list[tuple[Any, Any, bytes]] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append((m, p, b))
        c.basic_ack(m.delivery_tag)

    tag = ch.basic_consume(queue, on_message)
    deadline = time.monotonic() + WAIT
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} within {WAIT} s"
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.5)  # nothing more comes
    ch.basic_cancel(tag)
    assert len(got) == n, f"{len(got)} messages, not {n}"
    return got


def maxlen_death(queue: str) -> dict[str, Any]:
    """The ``x-death`` entry (without its time) of a message published through the
    default exchange to ``queue`` and dropped from its head."""
    return {
        "count": 1,
        "reason": "maxlen",
        "queue": queue,
        "exchange": "",
        "routing-keys": [queue],
    }


def maxlen_fanout(ch: Channel, names: Names, base: str, max_length: int) -> tuple[str, str, str]:
    """``dead_letter_fanout``'s (dlx, dead, src), ``src`` declared again with
    ``x-max-length`` ``max_length`` (a queue's arguments are fixed when it is made)."""
    dlx, dead, src = dead_letter_fanout(ch, names, base)
    ch.queue_delete(src)
    args = {"x-max-length": max_length, "x-dead-letter-exchange": dlx}
    ch.queue_declare(src, arguments=args)
    return dlx, dead, src


def test_a_full_queue_dead_letters_its_dropped_heads_in_order(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A queue with ``x-max-length`` 3 and a fanout dead-letter exchange, sent 10
    messages: it keeps the last 3 (7, 8, 9, in order, with no ``x-death``), and the
    dead-letter exchange gets the first 7 under their own routing key, each once, in the
    order published, each with one ``x-death`` entry (count 1, reason ``maxlen``, the
    queue, the exchange and routing keys it was published with), the first death's
    reason, queue and exchange, and its own properties and (nested) headers kept."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = maxlen_fanout(ch, names, "maxlen", 3)
    for i in range(10):
        headers = {"n": i, "nested": {"list": [i, "x"], "s": "t"}}
        props = pika.BasicProperties(correlation_id=f"c-{i}", headers=headers, delivery_mode=2)
        ch.basic_publish("", src, str(i).encode(), props)
    wait_for_count(ch, src, 3, "the full queue did not keep its last 3")
    kept = get_all(ch, src, 3)
    assert [b for _m, _p, b in kept] == [b"7", b"8", b"9"]
    for _m, props, body in kept:
        assert "x-death" not in props.headers
        assert props.correlation_id == f"c-{int(body)}"
    assert ch.basic_get(src) == (None, None, None)
    got = consume_all(conn, ch, dead, 7)
    assert [int(b) for _m, _p, b in got] == list(range(7))  # once each, in queue order
    for method, props, body in got:
        i = int(body)
        assert (method.exchange, method.routing_key) == (dlx, src)
        headers = dict(props.headers)
        assert death_without_time(headers) == maxlen_death(src)
        assert headers["x-first-death-reason"] == "maxlen"
        assert headers["x-first-death-queue"] == src
        assert headers["x-first-death-exchange"] == ""
        assert headers["n"] == i
        assert headers["nested"] == {"list": [i, "x"], "s": "t"}
        assert (props.correlation_id, props.delivery_mode) == (f"c-{i}", 2)
    assert count(ch, dead) == 0
    for q in (src, dead):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_a_full_queue_overflows_into_the_queue_named_by_its_routing_key(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """The "overflow" pattern: a queue with ``x-max-length`` 2, dead-letter exchange ""
    (the default exchange) and ``x-dead-letter-routing-key`` naming an ``overflow``
    queue, sent 8 messages: it keeps the last 2, and ``overflow`` gets the first 6 under
    its own name as routing key, each once, in the order published, with reason
    ``maxlen``, the full queue and the routing key they were published with."""
    ch = conn.channel()
    ch.confirm_delivery()
    overflow = ch.queue_declare(names("overflow"), durable=True).method.queue
    src = ch.queue_declare(
        names("overflow-src"),
        arguments={
            "x-max-length": 2,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": overflow,
        },
    ).method.queue
    for i in range(8):
        props = pika.BasicProperties(headers={"n": i}, delivery_mode=2)
        ch.basic_publish("", src, str(i).encode(), props)
    got = consume_all(conn, ch, overflow, 6)
    assert [int(b) for _m, _p, b in got] == list(range(6))
    for method, props, body in got:
        assert (method.exchange, method.routing_key) == ("", overflow)
        headers = dict(props.headers)
        assert death_without_time(headers) == maxlen_death(src)
        assert headers["x-first-death-reason"] == "maxlen"
        assert headers["x-first-death-queue"] == src
        assert headers["n"] == int(body)
    wait_for_count(ch, src, 2, "the full queue did not keep its last 2")
    assert [b for _m, _p, b in get_all(ch, src, 2)] == [b"6", b"7"]
    for q in (src, overflow):
        assert count(ch, q) == 0
        ch.queue_delete(q)


def test_a_full_queue_without_a_dead_letter_exchange_drops_its_head_silently(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A fanout to a queue with ``x-max-length`` 3 and no dead-letter exchange and to a
    ``witness`` queue with no limit, sent 10 messages: the full queue holds the last 3,
    in order (the 7 dropped appear nowhere), and the witness still has all 10 (the drop
    is of the full queue's own copy)."""
    ch = conn.channel()
    ch.confirm_delivery()
    fan = names("drop-fan")
    ch.exchange_declare(fan, "fanout")
    src = ch.queue_declare(names("drop-src"), arguments={"x-max-length": 3}).method.queue
    witness = ch.queue_declare(names("drop-witness")).method.queue
    for q in (src, witness):
        ch.queue_bind(q, fan)
    for i in range(10):
        ch.basic_publish(fan, "", str(i).encode())
    wait_for_count(ch, src, 3, "the full queue did not keep its last 3")
    assert [b for _m, _p, b in get_all(ch, src, 3)] == [b"7", b"8", b"9"]
    assert ch.basic_get(src) == (None, None, None)
    wait_for_count(ch, witness, 10, "the witness did not get every message")
    assert [b for _m, _p, b in get_all(ch, witness, 10)] == [str(i).encode() for i in range(10)]
    for q in (src, witness):
        assert count(ch, q) == 0
        ch.queue_delete(q)
    ch.exchange_delete(fan)


def test_an_unacked_message_is_not_counted_until_it_is_requeued_into_a_full_queue(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """Only ready messages count toward ``x-max-length``: of a queue with length 2 whose
    message 0 is held (taken by ``basic.get``, not acked), messages 1 to 3 make it drop
    only 1, which is dead-lettered (``maxlen``); 0 is still held. Rejected with
    ``requeue=True``, 0 goes back to the head of the queue, now over its length, and
    is dropped at once: dead-lettered with reason ``maxlen`` (not ``rejected``), after
    1. The queue keeps 2 and 3; nothing is lost or delivered twice."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = maxlen_fanout(ch, names, "held", 2)
    ch.basic_publish("", src, b"0")
    wait_for_count(ch, src, 1, "the first message did not arrive")
    held, _p, body = ch.basic_get(src)
    assert body == b"0"
    for i in range(1, 4):
        ch.basic_publish("", src, str(i).encode())
    wait_for_count(ch, dead, 1, "the queue did not drop exactly one ready message")
    wait_for_count(ch, src, 2, "the queue did not keep 2 ready messages")
    ch.basic_reject(held.delivery_tag, requeue=True)
    wait_for_count(ch, dead, 2, "the requeued message was not dropped")
    wait_for_count(ch, src, 2, "the queue did not keep 2 ready messages")
    got = get_all(ch, dead, 2)
    assert [b for _m, _p, b in got] == [b"1", b"0"]
    for _m, props, _b in got:
        assert death_without_time(dict(props.headers)) == maxlen_death(src)
    assert [b for _m, _p, b in get_all(ch, src, 2)] == [b"2", b"3"]
    for q in (src, dead):
        assert count(ch, q) == 0
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_a_dropped_message_rejected_in_the_dead_queue_gets_a_second_death_first(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A message dropped by a full queue (``x-max-length`` 1) into a dead queue that has
    a dead-letter exchange of its own, then taken there and rejected (``requeue=False``):
    it reaches the second exchange, still under its first routing key, with two
    ``x-death`` entries, latest first: ``rejected`` (the dead queue, the first
    dead-letter exchange, the first routing key), then ``maxlen`` (the full queue); the
    first death's headers still name the ``maxlen`` one."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx2 = names("twice-dlx2")
    ch.exchange_declare(dlx2, "fanout")
    final = ch.queue_declare(names("twice-final")).method.queue
    ch.queue_bind(final, dlx2)
    dlx = names("twice-dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = ch.queue_declare(
        names("twice-dead"), arguments={"x-dead-letter-exchange": dlx2}
    ).method.queue
    ch.queue_bind(dead, dlx)
    src = ch.queue_declare(
        names("twice-src"), arguments={"x-max-length": 1, "x-dead-letter-exchange": dlx}
    ).method.queue
    ch.basic_publish("", src, b"a", pika.BasicProperties(headers={"k": 1}))
    ch.basic_publish("", src, b"b", pika.BasicProperties(headers={"k": 2}))
    wait_for_count(ch, dead, 1, "the head was not dead-lettered")
    method, _p, body = ch.basic_get(dead)
    assert body == b"a"
    ch.basic_reject(method.delivery_tag, requeue=False)
    ((method, props, body),) = consume_all(conn, ch, final, 1)
    assert body == b"a"
    assert (method.exchange, method.routing_key) == (dlx2, src)
    headers = dict(props.headers)
    deaths = [{k: v for k, v in d.items() if k != "time"} for d in headers["x-death"]]
    assert deaths == [
        {
            "count": 1,
            "reason": "rejected",
            "queue": dead,
            "exchange": dlx,
            "routing-keys": [src],
        },
        maxlen_death(src),
    ]
    assert headers["x-first-death-reason"] == "maxlen"
    assert headers["x-first-death-queue"] == src
    assert headers["x-first-death-exchange"] == ""
    assert headers["k"] == 1
    assert [b for _m, _p, b in get_all(ch, src, 1)] == [b"b"]
    for q in (src, dead, final):
        assert count(ch, q) == 0
        ch.queue_delete(q)
    for ex in (dlx, dlx2):
        ch.exchange_delete(ex)


def test_a_queue_of_max_length_0_dead_letters_every_message_at_once(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``x-max-length`` 0: each of 5 messages is dropped as it arrives, and reaches the
    dead-letter exchange once, in order, with reason ``maxlen``; the queue stays
    empty."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = maxlen_fanout(ch, names, "zero", 0)
    for i in range(5):
        ch.basic_publish("", src, str(i).encode())
    got = consume_all(conn, ch, dead, 5)
    assert [int(b) for _m, _p, b in got] == list(range(5))
    for _m, props, _b in got:
        assert death_without_time(dict(props.headers)) == maxlen_death(src)
    assert count(ch, src) == 0
    assert ch.basic_get(src) == (None, None, None)
    for q in (src, dead):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_a_dropped_head_dead_lettered_back_into_its_own_queue_is_dropped(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``x-dead-letter-exchange`` "" (the default exchange) with no routing key sends a
    dropped head back into the full queue it was dropped from: a cycle with no
    rejection in it, which RabbitMQ breaks by dropping the message. Sent 5 messages, the
    queue (``x-max-length`` 2) holds the last 2, in order, and nothing else."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(
        names("maxlen-cycle"), arguments={"x-max-length": 2, "x-dead-letter-exchange": ""}
    ).method.queue
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    wait_for_count(ch, q, 2, "the full queue did not keep its last 2")
    kept = get_all(ch, q, 2)
    assert [b for _m, _p, b in kept] == [b"3", b"4"]
    assert [p.headers for _m, p, _b in kept] == [None, None]  # not dead-lettered
    assert ch.basic_get(q) == (None, None, None)
    ch.queue_delete(q)


def overflowing(ch: Channel, names: Names, base: str, overflow: str) -> tuple[str, str, str]:
    """``dead_letter_fanout``'s (dlx, dead, src), ``src`` declared again with
    ``x-max-length`` 2 and ``x-overflow`` ``overflow``."""
    dlx, dead, src = dead_letter_fanout(ch, names, base)
    ch.queue_delete(src)
    args = {"x-max-length": 2, "x-overflow": overflow, "x-dead-letter-exchange": dlx}
    ch.queue_declare(src, arguments=args)
    return dlx, dead, src


def publish_confirmed(ch: Channel, queue: str, n: int) -> list[bool]:
    """Publish 0 .. n-1 to ``queue`` with confirms: whether each was acked (not nacked)."""
    acked = []
    for i in range(n):
        try:
            ch.basic_publish("", queue, str(i).encode())
            acked.append(True)
        except pika.exceptions.NackError:
            acked.append(False)
    return acked


def test_a_reject_publish_dlx_queue_nacks_and_dead_letters_what_it_refuses(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``x-overflow: reject-publish-dlx`` with ``x-max-length`` 2: of 5 confirmed
    publishes the first 2 are acked and kept, the other 3 are nacked and each
    dead-lettered once, in order, with reason ``maxlen``."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = overflowing(ch, names, "rpdlx", "reject-publish-dlx")
    assert publish_confirmed(ch, src, 5) == [True, True, False, False, False]
    got = consume_all(conn, ch, dead, 3)
    assert [b for _m, _p, b in got] == [b"2", b"3", b"4"]
    for _m, props, _b in got:
        assert death_without_time(dict(props.headers)) == maxlen_death(src)
    assert [b for _m, _p, b in get_all(ch, src, 2)] == [b"0", b"1"]
    for q in (src, dead):
        assert count(ch, q) == 0
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_a_reject_publish_queue_nacks_and_dead_letters_nothing(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """Plain ``x-overflow: reject-publish`` with a dead-letter exchange: the refused
    publishes are nacked and go nowhere (only ``reject-publish-dlx`` dead-letters them)."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = overflowing(ch, names, "rp", "reject-publish")
    assert publish_confirmed(ch, src, 4) == [True, True, False, False]
    ch.basic_publish(dlx, "", b"marker")  # straight to the dead queue: it comes after
    got = consume_all(conn, ch, dead, 1)
    assert [b for _m, _p, b in got] == [b"marker"]
    assert [b for _m, _p, b in get_all(ch, src, 2)] == [b"0", b"1"]
    for q in (src, dead):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_an_unacked_message_does_not_count_towards_a_reject_publish_queues_length(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``x-overflow: reject-publish``, ``x-max-length`` 2: message 0 taken by
    ``basic.get`` and not acked does not count, so 1 and 2 are acked and only 3 is
    nacked; the queue then holds 1 and 2 ready."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = overflowing(ch, names, "rpheld", "reject-publish")
    assert publish_confirmed(ch, src, 1) == [True]
    held, _p, body = ch.basic_get(src)
    assert body == b"0"
    acked = []
    for i in (1, 2, 3):
        try:
            ch.basic_publish("", src, str(i).encode())
            acked.append(True)
        except pika.exceptions.NackError:
            acked.append(False)
    assert acked == [True, True, False]
    assert count(ch, src) == 2
    ch.basic_ack(held.delivery_tag)
    assert [b for _m, _p, b in get_all(ch, src, 2)] == [b"1", b"2"]
    for q in (src, dead):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_deleting_a_full_queue_right_after_it_dropped_loses_no_dead_letter(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A queue with ``x-max-length`` 2 sent 20 messages (confirmed: each in the queue, or
    dropped from it) and deleted at once: the 18 it dropped are with its dead-letter
    exchange all the same, once each, in order (on the gateway the queue's spool goes
    out before the queue does), and ``queue.delete`` counts the 2 it held."""
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, dead, src = maxlen_fanout(ch, names, "maxlen-delete", 2)
    for i in range(20):
        ch.basic_publish("", src, str(i).encode())
    assert ch.queue_delete(src).method.message_count == 2
    got = consume_all(conn, ch, dead, 18)
    assert [int(b) for _m, _p, b in got] == list(range(18))
    for _m, props, _b in got:
        assert death_without_time(dict(props.headers))["reason"] == "maxlen"
    ch.queue_delete(dead)
    ch.exchange_delete(dlx)
