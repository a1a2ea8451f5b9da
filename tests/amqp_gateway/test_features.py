"""AMQP features on the gateway and on RabbitMQ, with pika: the same observable results."""

from __future__ import annotations

import collections
import datetime
import time
from typing import Any

import pika
import pika.exceptions
import pytest

from fsbus.amqp import running

from .conftest import Broker, Names

WAIT = 20.0


def get_all(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int) -> list:
    """``n`` messages of ``queue`` through basic.get (each acked), polling up to WAIT s."""
    out = []
    deadline = time.monotonic() + WAIT
    while len(out) < n:
        method, props, body = ch.basic_get(queue)
        if method is None:
            assert time.monotonic() < deadline, f"only {len(out)} of {n} within {WAIT} s"
            time.sleep(0.02)
            continue
        ch.basic_ack(method.delivery_tag)
        out.append((method, props, body))
    return out


def test_properties_come_back_as_published(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("props")).method.queue
    sent = pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"s": "v", "n": 7, "nested": {"list": [1, "two", {"x": True}]}},
        delivery_mode=2,
        priority=3,
        correlation_id="corr-1",
        reply_to="somewhere",
        expiration="60000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id="guest",
        app_id="tests",
    )
    ch.basic_publish("", q, b"\x00binary\xff", properties=sent)
    ((_method, got, body),) = get_all(ch, q, 1)
    assert body == b"\x00binary\xff"
    for field in (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(got, field) == getattr(sent, field), field
    ch.queue_delete(q)


def test_publisher_confirms_and_mandatory_returns(
    conn: pika.BlockingConnection, names: Names
) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(names("confirm"), durable=True).method.queue
    for i in range(20):
        ch.basic_publish(
            "", q, str(i).encode(), pika.BasicProperties(delivery_mode=2), mandatory=True
        )
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", names("nowhere"), b"x", mandatory=True)
    # not mandatory: dropped quietly, still confirmed
    ch.basic_publish("", names("nowhere"), b"x")
    assert ch.queue_declare(q, passive=True).method.message_count == 20
    ch.queue_delete(q)


def test_get_empty_message_count_purge_and_delete(
    conn: pika.BlockingConnection, names: Names
) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("counts")).method.queue
    assert ch.basic_get(q) == (None, None, None)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    deadline = time.monotonic() + WAIT
    while ch.queue_declare(q, passive=True).method.message_count < 5:
        assert time.monotonic() < deadline
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"0"
    assert method.message_count == 4
    assert ch.queue_purge(q).method.message_count == 4
    ch.basic_publish("", q, b"last")
    get_all(ch, q, 1)
    ch.basic_publish("", q, b"left")
    while ch.queue_declare(q, passive=True).method.message_count < 1:
        assert time.monotonic() < deadline
    assert ch.queue_delete(q).method.message_count == 1


def test_get_leaves_held_messages_out(conn: pika.BlockingConnection, names: Names) -> None:
    """A message a consumer holds (delivered, not acked) is neither got nor counted:
    basic.get's message count is what is ready after it, and get-empty comes when every
    message left is held."""
    consumer, getter = conn.channel(), conn.channel()
    q = getter.queue_declare(names("held")).method.queue
    for i in range(3):
        getter.basic_publish("", q, str(i).encode())
    deadline = time.monotonic() + WAIT
    while getter.queue_declare(q, passive=True).method.message_count < 3:
        assert time.monotonic() < deadline
    consumer.basic_qos(prefetch_count=1)
    held: list[bytes] = []
    tag = consumer.basic_consume(q, lambda _ch, _m, _p, body: held.append(body))
    while not held:
        assert time.monotonic() < deadline
        conn.process_data_events(time_limit=0.05)
    got = []
    for left in (1, 0):
        method, _props, body = getter.basic_get(q, auto_ack=True)
        assert method is not None
        assert method.message_count == left
        got.append(body)
    assert getter.basic_get(q) == (None, None, None)
    assert sorted(held + got) == [b"0", b"1", b"2"]
    consumer.basic_cancel(tag)
    getter.queue_delete(q)


def test_a_held_message_leaves_a_queue_empty_for_delete_if_empty(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``queue.delete(if_empty=True)`` counts the ready messages only, as RabbitMQ does: a
    message got and not yet acked (or whose ack is still being written) does not make the
    queue "not empty"; one ready message does."""
    holder, ch = conn.channel(), conn.channel()
    q = ch.queue_declare(names("held-delete")).method.queue
    for body in (b"held", b"ready"):
        ch.basic_publish("", q, body)
    deadline = time.monotonic() + WAIT
    while ch.queue_declare(q, passive=True).method.message_count < 2:
        assert time.monotonic() < deadline
    method, _props, body = holder.basic_get(q)
    assert (body, method.message_count) == (b"held", 1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_delete(q, if_empty=True)
    assert refused.value.reply_code == 406
    ch = conn.channel()
    got, _props, body = ch.basic_get(q)
    assert (body, got.message_count) == (b"ready", 0)
    ch.basic_ack(got.delivery_tag)
    assert ch.queue_delete(q, if_empty=True).method.message_count == 0
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        ch.queue_declare(q, passive=True)
    assert gone.value.reply_code == 404
    holder.basic_ack(method.delivery_tag)


def test_nack_reject_requeue_and_redelivered(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("nack")).method.queue
    for b in (b"a", b"b", b"c"):
        ch.basic_publish("", q, b)
    seen = []
    for method, _props, body in ch.consume(q, inactivity_timeout=WAIT):
        assert method is not None, f"stalled after {seen}"
        seen.append((body, method.redelivered))
        if body == b"a" and not method.redelivered:
            ch.basic_nack(method.delivery_tag, requeue=True)
        elif body == b"b":
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
        if {b for b, _ in seen} == {b"a", b"b", b"c"} and (b"a", True) in seen:
            break
    ch.cancel()
    assert (b"a", False) in seen
    assert (b"a", True) in seen
    assert [s for s in seen if s[0] == b"b"] == [(b"b", False)]
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)


def test_ack_multiple_and_prefetch(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("prefetch")).method.queue
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=2)
    got: list[pika.spec.Basic.Deliver] = []
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m))
    deadline = time.monotonic() + WAIT
    while len(got) < 2:
        assert time.monotonic() < deadline
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.5)  # more would arrive here if prefetch leaked
    assert len(got) == 2
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    while len(got) < 4:
        assert time.monotonic() < deadline
        conn.process_data_events(time_limit=0.05)
    ch.basic_ack(0, multiple=True)
    while len(got) < 6:
        assert time.monotonic() < deadline
        conn.process_data_events(time_limit=0.05)
    ch.basic_ack(0, multiple=True)
    ch.queue_delete(q)


def _wait_for(conn: pika.BlockingConnection, got: list, n: int) -> None:
    deadline = time.monotonic() + WAIT
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} deliveries within {WAIT} s"
        conn.process_data_events(time_limit=0.05)


def _exactly(conn: pika.BlockingConnection, got: list, n: int) -> None:
    """``n`` deliveries, and no more in the half second after (a prefetch that leaked
    would send one there)."""
    _wait_for(conn, got, n)
    conn.process_data_events(time_limit=0.5)
    assert len(got) == n


def test_a_global_prefetch_is_shared_by_the_channels_consumers(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``basic.qos`` with ``global``: the channel's consumers share one count (RabbitMQ's
    reading of the flag). With 3, two consumers of queues holding 4 messages each get 3
    in all until one is acked; a per-consumer count set as well limits each of them."""
    ch = conn.channel()
    queues = [ch.queue_declare(names(f"shared-{k}")).method.queue for k in range(2)]
    for q in queues:
        for i in range(4):
            ch.basic_publish("", q, str(i).encode())
    deadline = time.monotonic() + WAIT
    while any(ch.queue_declare(q, passive=True).method.message_count < 4 for q in queues):
        assert time.monotonic() < deadline
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[pika.spec.Basic.Deliver] = []
    tags = [ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m)) for q in queues]
    _exactly(conn, got, 3)
    ch.basic_ack(got[0].delivery_tag)
    _exactly(conn, got, 4)
    ch.basic_ack(0, multiple=True)
    _wait_for(conn, got, 7)
    ch.basic_ack(0, multiple=True)
    _wait_for(conn, got, 8)
    ch.basic_ack(0, multiple=True)
    assert collections.Counter(m.routing_key for m in got) == dict.fromkeys(queues, 4)

    # both counts: one each per consumer, three shared: two in all
    for tag in tags:
        ch.basic_cancel(tag)
    for q in queues:
        for i in range(2):
            ch.basic_publish("", q, str(i).encode())
    both = conn.channel()
    both.basic_qos(prefetch_count=1)
    both.basic_qos(prefetch_count=3, global_qos=True)
    more: list[pika.spec.Basic.Deliver] = []
    for q in queues:
        both.basic_consume(q, lambda _c, m, _p, _b: more.append(m))
    _exactly(conn, more, 2)
    both.basic_ack(0, multiple=True)
    _wait_for(conn, more, 4)
    both.basic_ack(0, multiple=True)
    for q in queues:
        ch.queue_delete(q)


def test_a_consumer_of_a_higher_priority_gets_the_messages_first(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """``x-priority`` on ``basic.consume``: of a queue's consumers with room for a
    message, one of the highest priority gets it; a lower one only while those are at
    their prefetch."""
    ch = conn.channel()
    q = ch.queue_declare(names("consumer-prio")).method.queue
    ch.basic_qos(prefetch_count=3)
    got: list[tuple[str, bytes]] = []
    for who, rank in (("low", 1), ("high", 10)):
        ch.basic_consume(
            q,
            lambda _c, _m, _p, b, who=who: got.append((who, b)),
            arguments={"x-priority": rank},
        )
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    _wait_for(conn, got, 3)
    assert [who for who, _ in got] == ["high"] * 3
    for i in range(3, 5):  # the high one is at its prefetch
        ch.basic_publish("", q, str(i).encode())
    _wait_for(conn, got, 5)
    assert [who for who, _ in got[3:]] == ["low", "low"]
    ch.basic_ack(0, multiple=True)
    ch.basic_publish("", q, b"5")  # room again for the high one
    _wait_for(conn, got, 6)
    assert got[5] == ("high", b"5")
    ch.basic_ack(0, multiple=True)
    assert sorted(b for _, b in got) == [str(i).encode() for i in range(6)]
    ch.queue_delete(q)


def test_priority_is_higher_first(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("prio"), arguments={"x-max-priority": 10}).method.queue
    for p in (1, 5, 9, 0, 7):
        ch.basic_publish("", q, str(p).encode(), pika.BasicProperties(priority=p))
    deadline = time.monotonic() + WAIT
    while ch.queue_declare(q, passive=True).method.message_count < 5:
        assert time.monotonic() < deadline
    assert [b for _m, _p, b in get_all(ch, q, 5)] == [b"9", b"7", b"5", b"1", b"0"]
    ch.queue_delete(q)


def test_expiration_and_message_ttl(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("ttl"), arguments={"x-message-ttl": 200}).method.queue
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"queue ttl")
    deadline = time.monotonic() + WAIT
    while (
        ch.basic_get(q, auto_ack=True) != (None, None, None)
        or ch.queue_declare(q, passive=True).method.message_count
    ):
        assert time.monotonic() < deadline, "messages outlived their TTL"
        time.sleep(0.05)
    ch.queue_delete(q)


def test_max_length_drop_head_and_reject_publish(
    conn: pika.BlockingConnection, names: Names
) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    head = ch.queue_declare(names("head"), arguments={"x-max-length": 3}).method.queue
    for i in range(6):
        ch.basic_publish("", head, str(i).encode())
    assert [b for _m, _p, b in get_all(ch, head, 3)] == [b"3", b"4", b"5"]
    refuse = ch.queue_declare(
        names("refuse"), arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
    ).method.queue
    ch.basic_publish("", refuse, b"1")
    ch.basic_publish("", refuse, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", refuse, b"3")
    ch.queue_delete(head)
    ch.queue_delete(refuse)


def test_a_full_reject_publish_queue_refuses_only_its_own_copy(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A fanout to several queues, one of them full with ``reject-publish``: the publish
    is nacked, and every other queue still gets its copy, whichever order the queues
    are written in (names before and after the full one)."""
    ch = conn.channel()
    ch.confirm_delivery()
    fan = names("fan-full")
    ch.exchange_declare(fan, "fanout")
    full = ch.queue_declare(
        names("b-full"), arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    ).method.queue
    others = [ch.queue_declare(names(n)).method.queue for n in ("a-open", "c-open")]
    for q in (full, *others):
        ch.queue_bind(q, fan)
    ch.basic_publish(fan, "", b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(fan, "", b"2")
    assert [b for _m, _p, b in get_all(ch, full, 1)] == [b"1"]
    for q in others:
        assert [b for _m, _p, b in get_all(ch, q, 2)] == [b"1", b"2"]
    ch.basic_publish(fan, "", b"3")  # room again: every queue gets it
    for q in (full, *others):
        assert [b for _m, _p, b in get_all(ch, q, 1)] == [b"3"]
        ch.queue_delete(q)
    ch.exchange_delete(fan)


def test_dead_letter_exchange_on_reject(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    dlx = names("dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = ch.queue_declare(names("dead")).method.queue
    ch.queue_bind(dead, dlx)
    work = ch.queue_declare(names("work"), arguments={"x-dead-letter-exchange": dlx}).method.queue
    ch.basic_publish("", work, b"poison")
    method, _p, _body = get_all_unacked(ch, work)
    ch.basic_reject(method.delivery_tag, requeue=False)
    ((_m, _props, dead_body),) = get_all(ch, dead, 1)
    assert dead_body == b"poison"
    for q in (dead, work):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_dead_lettering_adds_x_death(conn: pika.BlockingConnection, names: Names) -> None:
    """A rejected message reaches the dead-letter exchange with the ``x-death`` headers
    RabbitMQ adds: an entry per queue and reason, counted, the latest first; the first
    death's queue, reason and exchange; its own headers and properties kept, and its
    ``expiration`` moved into the entry. A queue whose dead-letter route leads back to
    itself counts a second rejection in the same entry."""
    ch = conn.channel()
    work = names("dl-work")
    ch.queue_declare(
        work,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": work},
    )
    props = pika.BasicProperties(
        headers={"mine": "kept"}, expiration="60000", correlation_id="c-1", delivery_mode=2
    )
    ch.basic_publish("", work, b"poison", props)
    for count in (1, 2):
        method, _p, _body = get_all_unacked(ch, work)
        ch.basic_reject(method.delivery_tag, requeue=False)  # back to work, dead-lettered
        method, got, body = get_all_unacked(ch, work)
        ch.basic_nack(method.delivery_tag, requeue=True)
        assert body == b"poison"
        headers = dict(got.headers)
        (death,) = headers["x-death"]
        assert {k: v for k, v in death.items() if k != "time"} == {
            "count": count,
            "reason": "rejected",
            "queue": work,
            "exchange": "",
            "routing-keys": [work],
            "original-expiration": "60000",
        }
        assert isinstance(death["time"], datetime.datetime)
        assert headers["x-first-death-queue"] == work
        assert headers["x-first-death-reason"] == "rejected"
        assert headers["x-first-death-exchange"] == ""
        assert headers["mine"] == "kept"
        assert got.expiration is None
        assert (got.correlation_id, got.delivery_mode) == ("c-1", 2)
    ch.queue_delete(work)


@pytest.mark.parametrize(
    ("dead_letter_key", "taken_by"), [(None, "get"), ("parked", "get"), (None, "consume")]
)
def test_delivery_limit_dead_letters_after_one_more_delivery(
    conn: pika.BlockingConnection, names: Names, dead_letter_key: str | None, taken_by: str
) -> None:
    """``x-delivery-limit`` (a quorum queue's, on RabbitMQ): a message given back each
    time, to ``basic.get`` or to a consumer, is delivered the limit and one more times,
    then goes to the dead-letter exchange with ``x-death`` reason ``delivery_limit``,
    under the dead-letter routing key if the queue has one, else its own."""
    ch = conn.channel()
    dlx = names("limit-dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = ch.queue_declare(names("limit-dead")).method.queue
    ch.queue_bind(dead, dlx)
    args: dict[str, object] = {
        "x-queue-type": "quorum",
        "x-delivery-limit": 2,
        "x-dead-letter-exchange": dlx,
    }
    if dead_letter_key is not None:
        args["x-dead-letter-routing-key"] = dead_letter_key
    q = ch.queue_declare(names("limited"), durable=True, arguments=args).method.queue
    ch.basic_publish("", q, b"poison", pika.BasicProperties(headers={"mine": 1}))
    deliveries = 0

    def give_back(c: Any, m: Any, _p: Any, _b: Any) -> None:
        nonlocal deliveries
        deliveries += 1
        c.basic_nack(m.delivery_tag, requeue=True)

    if taken_by == "consume":
        ch.basic_consume(q, give_back)
    deadline = time.monotonic() + WAIT
    while True:
        assert time.monotonic() < deadline, f"not dead-lettered after {deliveries} deliveries"
        if taken_by == "get":
            method, _p, _b = ch.basic_get(q)
            if method is not None:
                give_back(ch, method, None, None)
                continue
        method, props, body = ch.basic_get(dead, auto_ack=True)
        if method is not None:
            break
        conn.process_data_events(time_limit=0.02)
    assert deliveries == 3
    assert body == b"poison"
    assert (method.exchange, method.routing_key) == (dlx, dead_letter_key or q)
    headers = dict(props.headers)
    assert headers["mine"] == 1
    (death,) = headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", q, 1)
    assert (death["exchange"], death["routing-keys"]) == ("", [q])
    assert headers["x-first-death-reason"] == "delivery_limit"
    for name in (q, dead):
        ch.queue_delete(name)
    ch.exchange_delete(dlx)


def get_all_unacked(ch: pika.adapters.blocking_connection.BlockingChannel, q: str) -> tuple:
    deadline = time.monotonic() + WAIT
    while True:
        got = ch.basic_get(q)
        if got[0] is not None:
            return got
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_headers_exchange(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    ex = names("hdr")
    ch.exchange_declare(ex, "headers")
    all_q = ch.queue_declare(names("all")).method.queue
    any_q = ch.queue_declare(names("any")).method.queue
    ch.queue_bind(all_q, ex, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(any_q, ex, arguments={"x-match": "any", "format": "pdf", "type": "log"})
    ch.basic_publish(
        ex, "", b"1", pika.BasicProperties(headers={"format": "pdf", "type": "report"})
    )
    ch.basic_publish(ex, "", b"2", pika.BasicProperties(headers={"type": "log"}))
    ch.basic_publish(ex, "", b"3", pika.BasicProperties(headers={"format": "zip"}))
    assert [b for _m, _p, b in get_all(ch, all_q, 1)] == [b"1"]
    assert sorted(b for _m, _p, b in get_all(ch, any_q, 2)) == [b"1", b"2"]
    for q in (all_q, any_q):
        assert ch.queue_delete(q).method.message_count == 0
    ch.exchange_delete(ex)


# ------------------------------------------------------------------ errors
def channel_error(broker: Broker, action: object) -> int:
    """Run ``action(channel)``; return the reply code of the channel (or connection) close."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        try:
            action(ch)  # type: ignore[operator]
        except pika.exceptions.ChannelClosedByBroker as exc:
            return int(exc.reply_code)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            return int(exc.reply_code)
    raise AssertionError("no error")


def test_errors_are_rabbitmqs(broker: Broker, names: Names) -> None:
    q = names("q")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.queue_declare(q, arguments={"x-max-length": 10})
        ex = names("ex")
        ch.exchange_declare(ex, "fanout")
        assert (
            channel_error(broker, lambda ch: ch.queue_declare(names("missing"), passive=True))
            == 404
        )
        assert (
            channel_error(broker, lambda ch: ch.exchange_declare(names("nox"), passive=True)) == 404
        )
        assert channel_error(broker, lambda ch: ch.queue_bind(q, names("nox"))) == 404
        assert channel_error(broker, lambda ch: ch.basic_consume(names("missing"), print)) == 404
        assert (
            channel_error(broker, lambda ch: ch.queue_declare(q, arguments={"x-max-length": 20}))
            == 406
        )
        assert channel_error(broker, lambda ch: ch.queue_declare(q, durable=True)) == 406
        assert channel_error(broker, lambda ch: ch.exchange_declare(ex, "direct")) == 406
        assert channel_error(broker, lambda ch: ch.queue_declare("amq.mine")) == 403
        assert channel_error(broker, lambda ch: (ch.basic_ack(99), ch.queue_declare(q))) == 406
        excl = ch.queue_declare("", exclusive=True).method.queue
        assert channel_error(broker, lambda ch: ch.queue_declare(excl, passive=True)) == 405
        assert channel_error(broker, lambda ch: ch.basic_consume(excl, print)) == 405
        assert channel_error(broker, lambda ch: ch.basic_get(excl)) == 405

        ch.queue_delete(q)
        ch.exchange_delete(ex)


def test_a_get_sees_what_became_of_the_queue_since_its_last_get(
    broker: Broker, names: Names
) -> None:
    """A connection's ``basic.get`` of a shared queue, then of the same name deleted and
    declared again as another connection's exclusive queue: 405; once that connection
    closed (its queue gone with it), 404; declared shared again, a get finds it empty."""
    q = names("turns")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as a:
        ch = a.channel()
        ch.queue_declare(q)
        ch.basic_publish("", q, b"one")
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert method is not None
        assert body == b"one"
        assert ch.basic_get(q) == (None, None, None)
        ch.queue_delete(q)
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as b:
            b.channel().queue_declare(q, exclusive=True)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
                ch.basic_get(q)
            assert locked.value.reply_code == 405
        ch = a.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.basic_get(q)
        assert missing.value.reply_code == 404
        ch = a.channel()
        ch.queue_declare(q)
        assert ch.basic_get(q) == (None, None, None)
        ch.queue_delete(q)


@pytest.mark.parametrize("kind", ["direct", "topic", "fanout", "headers"])
def test_an_exchange_goes_with_its_bindings(broker: Broker, names: Names, kind: str) -> None:
    """``exchange.delete(if_unused)`` is refused (406) while a queue is bound to the
    exchange; a delete takes its bindings with it, so an exchange declared again by that
    name routes nothing to the queue that was bound."""
    ex, q = names(f"ex-{kind}"), names(f"bound-{kind}")
    args = {"x-match": "all", "k": "v"} if kind == "headers" else None
    props = pika.BasicProperties(headers={"k": "v"})
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        ch.exchange_declare(ex, kind)
        ch.queue_declare(q)
        ch.queue_bind(q, ex, "k", arguments=args)
        assert channel_error(broker, lambda ch: ch.exchange_delete(ex, if_unused=True)) == 406
        ch.basic_publish(ex, "k", b"routed", props, mandatory=True)  # still bound
        ch.exchange_delete(ex)
        ch.exchange_declare(ex, kind)
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(ex, "k", b"unbound", props, mandatory=True)
        ((_m, _p, body),) = get_all(ch, q, 1)
        assert body == b"routed"
        ch.queue_bind(q, ex, "k", arguments=args)
        ch.queue_unbind(q, ex, "k", arguments=args)
        ch.exchange_delete(ex, if_unused=True)  # no binding left: deleted
        assert channel_error(broker, lambda ch: ch.exchange_declare(ex, passive=True)) == 404
        ch.queue_delete(q)


def passive_declare_error(c: pika.BlockingConnection, exchange: str) -> int | None:
    """The reply code of a passive declare of ``exchange`` on a new channel of ``c``;
    None if it exists."""
    ch = c.channel()
    try:
        ch.exchange_declare(exchange, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return int(exc.reply_code)
    ch.close()
    return None


@pytest.mark.parametrize("kind", ["direct", "topic", "fanout", "headers"])
def test_an_auto_delete_exchange_goes_with_its_last_binding(
    broker: Broker, names: Names, kind: str
) -> None:
    """An auto-delete exchange is deleted when its last binding goes, by an unbind or
    with its queue's deletion; while a binding is left, and before it ever had one, it
    stays."""
    ex, ex2 = names(f"ad-{kind}"), names(f"ad2-{kind}")
    args = {"x-match": "all", "k": "v"} if kind == "headers" else None
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.exchange_declare(ex, kind, auto_delete=True)
        ch.exchange_declare(ex, passive=True)  # never bound: it stays
        q1 = ch.queue_declare(names(f"ad1-{kind}")).method.queue
        q2 = ch.queue_declare(names(f"ad2-{kind}")).method.queue
        ch.queue_bind(q1, ex, "k", arguments=args)
        ch.queue_bind(q2, ex, "k", arguments=args)
        ch.queue_unbind(q1, ex, "k", arguments=args)
        ch.exchange_declare(ex, passive=True)  # one binding left
        ch.queue_unbind(q2, ex, "k", arguments=args)
        assert channel_error(broker, lambda ch: ch.exchange_declare(ex, passive=True)) == 404

        ch.exchange_declare(ex2, kind, auto_delete=True)
        ch.queue_bind(q1, ex2, "k", arguments=args)
        ch.queue_delete(q2)  # bound elsewhere: nothing changes
        ch.exchange_declare(ex2, passive=True)
        ch.queue_delete(q1)
        assert channel_error(broker, lambda ch: ch.exchange_declare(ex2, passive=True)) == 404


def test_an_auto_delete_exchange_goes_with_a_closed_connections_exclusive_queue(
    broker: Broker, names: Names
) -> None:
    """The exclusive queue of a connection goes when it closes, and with it the last
    binding of an auto-delete exchange: the exchange goes too (RabbitMQ soon after the
    close, hence the wait)."""
    ex = names("ad-excl")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.exchange_declare(ex, "topic", auto_delete=True)
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, ex, "a.#")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        deadline = time.monotonic() + WAIT
        while (code := passive_declare_error(c, ex)) is None:
            assert time.monotonic() < deadline, "the exchange outlived its last binding"
            time.sleep(0.05)
        assert code == 404


def test_an_auto_delete_exchange_goes_when_an_fsbus_process_deletes_its_queue(
    gateway: Broker, names: Names
) -> None:
    """A binding that goes with a queue no gateway deleted (here deleted through the bus
    API; or expired): the gateways look for auto-delete exchanges left without one every
    few seconds, and delete them."""
    from fsbus import BlockingBus
    from fsbus.amqp._routing import bus_queue_name
    from fsbus.amqp._server import UNBOUND_CHECK_SECONDS

    ex, q = names("ad-bus"), names("ad-bus-q")
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as c:
        ch = c.channel()
        ch.exchange_declare(ex, "direct", auto_delete=True)
        ch.queue_declare(q)
        ch.queue_bind(q, ex, "k")
        assert gateway.root is not None
        with BlockingBus(gateway.root) as bus:
            bus.delete_queue(bus_queue_name(q))
        deadline = time.monotonic() + UNBOUND_CHECK_SECONDS + WAIT
        while (code := passive_declare_error(c, ex)) is None:
            assert time.monotonic() < deadline, "the exchange outlived its last binding"
            time.sleep(0.1)
        assert code == 404


HEADERS_ARGS = {"x-match": "all", "k": "v"}
HEADERS_PROPS = pika.BasicProperties(headers={"k": "v"})


def _routed_through_headers(
    ch: pika.adapters.blocking_connection.BlockingChannel, ex: str, q: str
) -> None:
    """Headers exchange ``ex`` and queue ``q`` bound to it; one message routed to ``q``."""
    ch.confirm_delivery()
    ch.exchange_declare(ex, "headers")
    ch.queue_declare(q)
    ch.queue_bind(q, ex, "", arguments=HEADERS_ARGS)
    ch.basic_publish(ex, "", b"routed", HEADERS_PROPS, mandatory=True)


def _declared_again_gets_nothing(
    ch: pika.adapters.blocking_connection.BlockingChannel, ex: str, q: str
) -> None:
    """``q``, declared again by its name after a delete, gets nothing through ``ex``."""
    ch.queue_declare(q)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(ex, "", b"unbound", HEADERS_PROPS, mandatory=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_a_deleted_queues_headers_bindings_go_with_it(broker: Broker, names: Names) -> None:
    """A queue's bindings go with it, to a headers exchange too: a queue declared again by
    that name gets nothing through them."""
    ex, q = names("hdr-del"), names("hdr-del-q")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        _routed_through_headers(ch, ex, q)
        ch.queue_delete(q)
        _declared_again_gets_nothing(ch, ex, q)
        ch.queue_delete(q)
        ch.exchange_delete(ex)


def test_a_headers_binding_goes_with_a_queue_an_fsbus_process_deleted(
    gateway: Broker, names: Names
) -> None:
    """A queue deleted through the bus API, not through a gateway, leaves its headers
    bindings written down; they stand for that queue only: a queue declared again by its
    name gets nothing through them, and binds afresh."""
    from fsbus import BlockingBus
    from fsbus.amqp._routing import bus_queue_name

    ex, q = names("hdr-bus-del"), names("hdr-bus-del-q")
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as c:
        ch = c.channel()
        _routed_through_headers(ch, ex, q)
        assert gateway.root is not None
        with BlockingBus(gateway.root) as bus:
            bus.delete_queue(bus_queue_name(q))
        _declared_again_gets_nothing(ch, ex, q)
        ch.queue_bind(q, ex, "", arguments=HEADERS_ARGS)
        ch.basic_publish(ex, "", b"bound again", HEADERS_PROPS, mandatory=True)
        got = ch.basic_get(q, auto_ack=True)
        assert got[2] == b"bound again"
        assert ch.basic_get(q, auto_ack=True) == (None, None, None)
        ch.queue_delete(q)
        ch.exchange_delete(ex)


def test_a_prefetch_size_is_not_implemented(broker: Broker) -> None:
    """``basic.qos`` limits by message count; a byte size closes the connection with 540,
    as RabbitMQ does, rather than being ignored."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        c.channel().basic_qos(prefetch_count=5)
    assert channel_error(broker, lambda ch: ch.basic_qos(prefetch_size=1000)) == 540


def test_an_exclusive_consumer_keeps_every_other_off(broker: Broker, names: Names) -> None:
    """While a queue has an exclusive consumer, any other ``basic.consume`` of it is
    refused with 403, exclusive or not, from any connection; after its cancel another
    may consume."""
    q = names("solo")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.queue_declare(q)
        tag = ch.basic_consume(q, lambda *_: None, exclusive=True)
        assert channel_error(broker, lambda ch: ch.basic_consume(q, print)) == 403
        assert channel_error(broker, lambda ch: ch.basic_consume(q, print, exclusive=True)) == 403
        ch.basic_cancel(tag)
        other = ch.basic_consume(q, lambda *_: None)
        assert channel_error(broker, lambda ch: ch.basic_consume(q, print, exclusive=True)) == 403
        ch.basic_cancel(other)
        ch.queue_delete(q)


def test_an_exclusive_consumer_may_follow_a_cancelled_one_still_holding_a_message(
    broker: Broker, names: Names
) -> None:
    """A cancelled consumer is gone at its cancel-ok, though the message it was sent is
    not acked yet: another may consume exclusively at once, and the ack still counts."""
    q = names("relay")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.queue_declare(q)
        ch.basic_publish("", q, b"held")
        got: list[int] = []
        tag = ch.basic_consume(q, lambda _ch, m, _p, _b: got.append(m.delivery_tag), exclusive=True)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.05)
        assert len(got) == 1
        ch.basic_cancel(tag)
        second = ch.basic_consume(q, lambda *_: None, exclusive=True)
        ch.basic_ack(got[0])
        ch.basic_cancel(second)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        ch.queue_delete(q)


def test_exclusive_consumers_follow_each_other_at_once(broker: Broker, names: Names) -> None:
    """Cancel an exclusive consumer and consume exclusively again, many times over: each
    cancel-ok ends the consumer, whatever its subscription is still doing in the
    background (a count read before that work ended once refused the next with 403)."""
    q = names("baton")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.queue_declare(q)
        for _ in range(60):
            tag = ch.basic_consume(q, lambda *_: None, exclusive=True)
            ch.basic_cancel(tag)
        assert ch.queue_declare(q, passive=True).method.consumer_count == 0
        ch.queue_delete(q)


def test_an_exclusive_consumer_holds_across_gateways(gateway: Broker, names: Names) -> None:
    """Two gateways on one bus: one's exclusive consumer keeps the other's clients off
    the queue until it is cancelled, or until its connection ends."""
    assert gateway.root is not None
    q = names("solo")
    with running(gateway.root) as second:
        other_url = second.url
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as c:
            ch = c.channel()
            ch.queue_declare(q)
            tag = ch.basic_consume(q, lambda *_: None, exclusive=True)
            with pika.BlockingConnection(pika.URLParameters(other_url)) as c2:
                ch2 = c2.channel()
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                    ch2.basic_consume(q, lambda *_: None)
                assert err.value.reply_code == 403
            ch.basic_cancel(tag)
            ch.basic_consume(q, lambda *_: None, exclusive=True)
        # that connection ended: its exclusive consumer with it
        with pika.BlockingConnection(pika.URLParameters(other_url)) as c2:
            c2.channel().basic_consume(q, lambda *_: None)


def test_internal_exchanges_and_unsupported_methods(broker: Broker, names: Names) -> None:
    """A client cannot publish to an internal exchange (403, as RabbitMQ); dead-lettering
    into one works. ``basic.recover`` without requeue is 540, as on RabbitMQ."""
    inner, q = names("inner"), names("behind")
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        ch.exchange_declare(inner, "fanout", internal=True)
        ch.queue_declare(q)
        ch.queue_bind(q, inner)
        work = ch.queue_declare(
            names("to-inner"), arguments={"x-dead-letter-exchange": inner}
        ).method.queue
        ch.basic_publish("", work, b"dead")
        method, _p, _b = get_all_unacked(ch, work)
        ch.basic_reject(method.delivery_tag, requeue=False)
        ((_m, _props, body),) = get_all(ch, q, 1)
        assert body == b"dead"
        assert (
            channel_error(
                broker, lambda ch: (ch.basic_publish(inner, "", b"x"), ch.queue_declare(q))
            )
            == 403
        )
        assert channel_error(broker, lambda ch: ch.basic_recover(requeue=False)) == 540
        for name in (q, work):
            ch.queue_delete(name)
        ch.exchange_delete(inner)


def test_a_count_right_after_a_get_leaves_the_message_out(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A ``queue.declare`` just after a ``basic.get`` counts the message taken as gone,
    whether or not its ack has reached the disk yet."""
    ch = conn.channel()
    q = ch.queue_declare(names("taken")).method.queue
    for i in range(20):
        ch.basic_publish("", q, str(i).encode())
    get_all_unacked(ch, q)  # published, and one taken (held unacked: not counted)
    for left in range(18, -1, -1):
        method, _p, _b = ch.basic_get(q, auto_ack=True)
        assert method is not None
        assert ch.queue_declare(q, passive=True).method.message_count == left
    ch.queue_delete(q)


def test_an_empty_queue_name_needs_a_queue_declared_before(broker: Broker) -> None:
    """A method naming no queue means the channel's last declared one; with none
    declared, RabbitMQ closes the channel with 404 and says so."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_get("")
    assert err.value.reply_code == 404
    assert err.value.reply_text == "NOT_FOUND - no previously declared queue"


def test_exclusive_queue_goes_with_its_connection(broker: Broker) -> None:
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        excl = c.channel().queue_declare("", exclusive=True).method.queue
    assert channel_error(broker, lambda ch: ch.queue_declare(excl, passive=True)) == 404


def test_bad_login_is_refused(broker: Broker) -> None:
    params = pika.URLParameters(broker.url.replace("guest:guest", "guest:wrong"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)


def test_timestamp_roundtrip_type(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("ts")).method.queue
    now = int(datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC).timestamp())
    ch.basic_publish("", q, b"t", pika.BasicProperties(timestamp=now))
    ((_m, props, _b),) = get_all(ch, q, 1)
    assert props.timestamp == now
    ch.queue_delete(q)


# Names a short string holds that pamqp's domains refuse (other characters, or over 127
# bytes for an exchange), and names that are no file name ("/", over 255 bytes escaped):
# RabbitMQ takes every one, and so must every method that carries them back.
ODD_QUEUE_NAMES = ["caf\u00e9", "a!b*%", "w@host/1 x", "q" * 240]
ODD_EXCHANGE_NAMES = ["logs/app", "orders!*()$=%&|~;'\u00e9", "x" * 240, "%2F%%"]


@pytest.mark.parametrize("queue", ODD_QUEUE_NAMES, ids=["utf8", "marks", "slash", "long"])
def test_any_queue_name_is_declared_published_to_and_taken(
    conn: pika.BlockingConnection, names: Names, queue: str
) -> None:
    """A queue of any name: declare-ok names it as declared, a publish through the
    default exchange reaches it, a get and a consumer take from it."""
    ch = conn.channel()
    name = names(queue)
    assert ch.queue_declare(name, exclusive=True).method.queue == name
    for body in (b"got", b"consumed"):
        ch.basic_publish("", name, body)
    [(method, _, body)] = get_all(ch, name, 1)
    assert (body, method.exchange, method.routing_key) == (b"got", "", name)
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + WAIT
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert got == [b"consumed"]
    assert ch.queue_declare(name, passive=True).method.message_count == 0


@pytest.mark.parametrize("exchange", ODD_EXCHANGE_NAMES, ids=["slash", "marks", "long", "escapes"])
def test_any_exchange_name_is_declared_routed_got_from_and_returned_from(
    conn: pika.BlockingConnection, names: Names, exchange: str
) -> None:
    """An exchange of any name: declared (a file name on the gateway whatever it holds),
    routed through, named back by basic.get-ok and by basic.return."""
    ch = conn.channel()
    name = names(exchange)
    ch.exchange_declare(name, "direct", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, "k")
    ch.exchange_declare(name, "direct", passive=True)
    ch.basic_publish(name, "k", b"routed")
    [(method, _, body)] = get_all(ch, q, 1)
    assert (body, method.exchange, method.routing_key) == (b"routed", name, "k")
    returned: list[tuple[str, str, bytes]] = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m.exchange, m.routing_key, b)))
    ch.basic_publish(name, "nowhere", b"back", mandatory=True)
    deadline = time.monotonic() + WAIT
    while not returned and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert returned == [(name, "nowhere", b"back")]
    ch.exchange_delete(name)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        conn.channel().exchange_declare(name, "direct", passive=True)
    assert caught.value.reply_code == 404


def test_a_storage_failure_under_a_method_closes_the_connection_with_541(
    gateway: Broker, names: Names
) -> None:
    """The bus directory failing under a method (here the gateway's exchanges folder
    replaced by a file, so that no record can be written there) closes the connection
    with RabbitMQ's 541 INTERNAL_ERROR naming what failed, not a dropped socket; the
    gateway keeps serving, and what does not need that folder works."""
    assert gateway.root is not None
    folder = gateway.root / "fsbus" / "amqp" / "exchanges"
    folder.rmdir()
    folder.write_text("not a folder")
    c = pika.BlockingConnection(pika.URLParameters(gateway.url))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        c.channel().exchange_declare(names("x"), "fanout")
    assert caught.value.reply_code == 541
    assert "INTERNAL_ERROR" in caught.value.reply_text
    assert "exchanges" in caught.value.reply_text
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as other:
        ch = other.channel()
        q = ch.queue_declare(names("q")).method.queue
        ch.basic_publish("", q, b"still served")
        [(_, _, body)] = get_all(ch, q, 1)
        assert body == b"still served"


def test_counts_right_after_an_ack_leave_out_only_what_is_held(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """Right after an ack (with ``multiple``) on the channel, a passive declare counts
    the ready messages, no fewer, and ``queue.delete(if_empty)`` refuses a queue that
    still has one: the acked messages' files are being removed meanwhile, and were
    counted as held after they had left the listing, which deleted a queue with a ready
    message about one time in three. Tried ten times over, for the race."""
    for turn in range(10):
        ch = conn.channel()
        q = ch.queue_declare(names(f"acked-{turn}")).method.queue
        for i in range(10):
            ch.basic_publish("", q, str(i).encode())
        deadline = time.monotonic() + WAIT  # (RabbitMQ's count can lag its publishes)
        while ch.queue_declare(q, passive=True).method.message_count < 10:
            assert time.monotonic() < deadline, "the publishes were never all counted"
            time.sleep(0.01)
        tags = [ch.basic_get(q)[0].delivery_tag for _ in range(5)]
        ch.basic_ack(tags[2], multiple=True)  # 3 acked, 2 held, 5 ready
        assert ch.queue_declare(q, passive=True).method.message_count == 5
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            ch.queue_delete(q, if_empty=True)
        assert caught.value.reply_code == 406
        ch = conn.channel()
        assert ch.queue_declare(q, passive=True).method.message_count == 7  # given back
        assert ch.queue_delete(q).method.message_count == 7
