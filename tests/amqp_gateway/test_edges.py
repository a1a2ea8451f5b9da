"""Edges of AMQP methods where a client meets RabbitMQ's rules: the same observable
results on the gateway and on RabbitMQ (pika)."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from .conftest import Broker, Names
from .test_features import WAIT, get_all


def closed_with(
    conn: pika.BlockingConnection, call: object, *args: object, **kwargs: object
) -> tuple[int, str]:
    """The (code, text) the broker closes the channel with when ``call`` is made."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value.reply_code, caught.value.reply_text


@pytest.mark.parametrize("method", ["ack", "nack"])
def test_a_multiple_settle_of_an_unknown_tag_is_406_and_settles_nothing(
    conn: pika.BlockingConnection, names: Names, method: str
) -> None:
    """``multiple`` up to a tag that is not outstanding (never given, or settled
    already) closes the channel with 406, as one tag would; nothing is settled, so what
    the channel held goes back to the queue."""
    ch = conn.channel()
    q = ch.queue_declare(names("multi")).method.queue
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    first = ch.basic_get(q)[0].delivery_tag
    ch.basic_get(q)
    settle = getattr(ch, f"basic_{method}")

    def settle_then_look(tag: int) -> None:  # (a settle has no reply: the close comes after)
        settle(tag, multiple=True)
        ch.queue_declare(q, passive=True)

    code, text = closed_with(conn, settle_then_look, first + 10)
    assert (code, text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {first + 10}")
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.message_count == 3
    first = ch.basic_get(q)[0].delivery_tag
    ch.basic_ack(first)
    settle = ch.basic_ack
    code, text = closed_with(conn, settle_then_look, first)  # settled already
    assert (code, text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {first}")
    ch = conn.channel()
    assert ch.queue_delete(q).method.message_count == 2


def test_unbinding_what_does_not_exist_is_ok(conn: pika.BlockingConnection, names: Names) -> None:
    """queue.unbind naming a missing queue, a missing exchange or a binding that is not
    there answers unbind-ok."""
    ch = conn.channel()
    ch.queue_unbind(names("no-such-queue"), "amq.direct", "k")
    q = ch.queue_declare(names("unbound"), exclusive=True).method.queue
    ch.queue_unbind(q, names("no-such-exchange"), "k")
    ch.queue_unbind(q, "amq.direct", "never-bound")
    assert ch.is_open


def test_a_user_id_other_than_the_login_is_refused(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A publish whose ``user_id`` is not the connection's user closes the channel with
    406 and is not routed; the login's own name is taken."""
    ch = conn.channel()
    q = ch.queue_declare(names("uid"), exclusive=True).method.queue
    ch.basic_publish("", q, b"mine", pika.BasicProperties(user_id="guest"))
    ch.basic_publish("", q, b"forged", pika.BasicProperties(user_id="mallory"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert (caught.value.reply_code, caught.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user "
        "was 'guest'",
    )
    ch = conn.channel()
    [(_, props, body)] = get_all(ch, q, 1)
    assert (body, props.user_id) == (b"mine", "guest")
    assert ch.queue_declare(q, passive=True).method.message_count == 0


@pytest.mark.parametrize("exchange", ["", "amq.direct"])
def test_priorities_over_the_queues_maximum_count_as_the_maximum(
    conn: pika.BlockingConnection, names: Names, exchange: str
) -> None:
    """In a queue with ``x-max-priority`` 5, priorities 7 and 9 are taken as 5: served
    with the 5s, first in first out, ahead of the lower ones (through the default
    exchange, or another one)."""
    ch = conn.channel()
    q = ch.queue_declare(
        names("capped"), exclusive=True, arguments={"x-max-priority": 5}
    ).method.queue
    if exchange:
        ch.queue_bind(q, exchange, q)
    sent = [None, 1, 9, 5, 0, 3, 7]
    for i, priority in enumerate(sent):
        ch.basic_publish(exchange, q, str(i).encode(), pika.BasicProperties(priority=priority))
    got = [int(body) for _, _, body in get_all(ch, q, len(sent))]
    assert [sent[i] for i in got] == [9, 5, 7, 3, 1, None, 0]


def test_the_default_exchange_cannot_be_declared_bound_or_unbound(
    conn: pika.BlockingConnection, names: Names
) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("plain"), exclusive=True).method.queue
    code, text = closed_with(conn, ch.exchange_declare, "", "direct")
    assert code == 403
    ch = conn.channel()
    code, text = closed_with(conn, ch.queue_bind, q, "", "alias")
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - operation not permitted on the default exchange",
    )
    ch = conn.channel()
    code, text = closed_with(conn, ch.queue_unbind, q, "", q)
    assert code == 403


def test_a_predeclared_exchange_declared_with_other_flags_is_406(
    conn: pika.BlockingConnection,
) -> None:
    ch = conn.channel()
    ch.exchange_declare("amq.direct", "direct", durable=True)  # as it is: ok
    code, text = closed_with(conn, ch.exchange_declare, "amq.direct", "direct", durable=False)
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' in "
        "vhost '/': received 'false' but current is 'true'",
    )


def test_declaring_a_queue_again_with_the_other_exclusive_flag_is_405(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A queue declared again, on the same connection, exclusive where it was not or not
    where it was: 405 RESOURCE_LOCKED, as for another connection's exclusive queue."""
    locked = (
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{}' in vhost "
        "'/'. It could be originally declared on another connection or the exclusive "
        "property value does not match that of the original declaration."
    )
    ch = conn.channel()
    q = ch.queue_declare(names("shared"), durable=True).method.queue
    code, text = closed_with(conn, ch.queue_declare, q, durable=True, exclusive=True)
    assert (code, text) == (405, locked.format(q))
    conn.channel().queue_delete(q)
    ch = conn.channel()
    q = ch.queue_declare(names("own"), exclusive=True).method.queue
    code, text = closed_with(conn, ch.queue_declare, q, exclusive=False)
    assert (code, text) == (405, locked.format(q))


def test_a_message_requeued_by_a_consumer_comes_back_next(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A consumer (prefetch 1) nacks a message with requeue: it is delivered again at
    once, redelivered, before the messages behind it (it came back half a second later,
    after every other message of the queue)."""
    ch = conn.channel()
    q = ch.queue_declare(names("requeued"), exclusive=True).method.queue
    for i in range(30):
        ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=1)
    got: list[str] = []

    def on_message(c: object, m: pika.spec.Basic.Deliver, p: object, body: bytes) -> None:
        got.append(body.decode() + ("R" if m.redelivered else ""))
        if body == b"1" and not m.redelivered:
            ch.basic_nack(m.delivery_tag, requeue=True)
        else:
            ch.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on_message)
    deadline = time.monotonic() + WAIT
    while len(got) < 31:
        assert time.monotonic() < deadline, got
        conn.process_data_events(time_limit=0.05)
    assert got[:5] == ["0", "1", "1R", "2", "3"]
    assert sorted(got) == sorted([str(i) for i in range(30)] + ["1R"])


@pytest.mark.parametrize("settle", ["nack", "reject"])
def test_a_get_after_a_requeue_takes_the_message_given_back(
    conn: pika.BlockingConnection, names: Names, settle: str
) -> None:
    """basic.get, nack (or reject) with requeue, basic.get: the second get takes the
    message given back, redelivered (it took the next one while the first was still
    being given back)."""
    ch = conn.channel()
    for turn in range(5):
        q = ch.queue_declare(names(f"getback-{turn}"), exclusive=True).method.queue
        for i in range(3):
            ch.basic_publish("", q, str(i).encode())
        [first] = wait_get(ch, q, 1)
        if settle == "nack":
            ch.basic_nack(first.delivery_tag, requeue=True)
        else:
            ch.basic_reject(first.delivery_tag, requeue=True)
        out = []
        for _ in range(3):
            method, _props, body = ch.basic_get(q)
            out.append(body.decode() + ("R" if method.redelivered else ""))
            ch.basic_ack(method.delivery_tag)
        assert out == ["0R", "1", "2"]


@pytest.mark.parametrize("ending", ["channel", "connection", "recover"])
def test_messages_gets_hold_go_back_in_order_when_their_channel_ends(
    broker: Broker, names: Names, ending: str
) -> None:
    """Three of four messages taken with basic.get and never settled: when their channel
    closes (or their connection, or a ``basic.recover`` gives them back), they are in
    the queue again, ahead of the fourth and redelivered; nothing is lost or doubled."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as keeper:
        kc = keeper.channel()
        q = kc.queue_declare(names(f"held-{ending}")).method.queue
        for i in range(4):
            kc.basic_publish("", q, str(i).encode())
        c = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = c.channel()
        assert [m.redelivered for m in wait_get(ch, q, 3)] == [False] * 3
        if ending == "channel":
            ch.close()
        elif ending == "connection":
            c.close()
        else:
            ch.basic_recover(requeue=True)
        deadline = time.monotonic() + WAIT
        while kc.queue_declare(q, passive=True).method.message_count < 4:
            assert time.monotonic() < deadline, "the held messages never came back"
            time.sleep(0.02)
        got = [(body, m.redelivered) for m, _p, body in get_all(kc, q, 4)]
        assert got == [(b"0", True), (b"1", True), (b"2", True), (b"3", False)]
        assert kc.basic_get(q) == (None, None, None)
        kc.queue_delete(q)
        if c.is_open:
            c.close()


def wait_get(ch: object, queue: str, n: int) -> list:
    """``n`` basic.get methods of ``queue``, not acked (polled: RabbitMQ's queue can lag
    the channel's publishes)."""
    out = []
    deadline = time.monotonic() + WAIT
    while len(out) < n:
        method, _props, _body = ch.basic_get(queue)  # type: ignore[attr-defined]
        if method is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
            continue
        out.append(method)
    return out


@pytest.mark.parametrize("how", ["nack multiple", "rejects", "consumer"])
def test_rejected_messages_are_dead_lettered_in_the_order_rejected(
    conn: pika.BlockingConnection, names: Names, how: str
) -> None:
    """Eight messages rejected without requeue at once (one nack with ``multiple``,
    eight rejects in a row, or a consumer rejecting each as it comes): the dead-letter
    queue gets them in that order (they came in a different order each run)."""
    ch = conn.channel()
    dq = ch.queue_declare(names("dead"), exclusive=True).method.queue
    q = ch.queue_declare(
        names("work"),
        exclusive=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dq},
    ).method.queue
    for i in range(8):
        ch.basic_publish("", q, str(i).encode())
    if how == "consumer":
        ch.basic_qos(prefetch_count=10)
        seen: list[bytes] = []

        def on_message(c: object, m: pika.spec.Basic.Deliver, p: object, body: bytes) -> None:
            seen.append(body)
            ch.basic_reject(m.delivery_tag, requeue=False)

        ch.basic_consume(q, on_message)
        deadline = time.monotonic() + WAIT
        while len(seen) < 8:
            assert time.monotonic() < deadline
            conn.process_data_events(time_limit=0.05)
    else:
        methods = wait_get(ch, q, 8)
        if how == "nack multiple":
            ch.basic_nack(methods[-1].delivery_tag, multiple=True, requeue=False)
        else:
            for m in methods:
                ch.basic_reject(m.delivery_tag, requeue=False)
    got = [body for _, _, body in get_all(ch, dq, 8)]
    assert got == [str(i).encode() for i in range(8)]


HEADER_CASES = [
    # (binding arguments, message headers, routed?)
    ({"flag": True}, {"flag": True}, True),
    ({"flag": True}, {"flag": 1}, False),  # a boolean is not a number
    ({"n": 1}, {"n": True}, False),
    ({"s": "raw"}, {"s": b"raw"}, True),  # a string and a byte array of its bytes
    ({"by": b"raw"}, {"by": "raw"}, True),
    ({"by": b"raw"}, {"by": b"raw"}, True),
    ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
    ({"x-match": "all-with-x", "x-foo": "bar"}, {"other": "bar"}, False),
    ({"x-match": "any-with-x", "x-foo": "bar", "k": "v"}, {"x-foo": "bar"}, True),
    ({"x-match": "any", "x-foo": "bar", "k": "v"}, {"x-foo": "bar"}, False),
    ({"x-match": "all", "x-foo": "bar"}, {"anything": 1}, True),  # x- keys left out
]


@pytest.mark.parametrize(("binding", "headers", "routed"), HEADER_CASES)
def test_headers_exchange_values_match_as_rabbitmqs_typed_values(
    conn: pika.BlockingConnection,
    names: Names,
    binding: dict[str, object],
    headers: dict[str, object],
    routed: bool,
) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(names("hdr"), exclusive=True).method.queue
    ch.queue_bind(q, "amq.headers", arguments=binding)
    ch.basic_publish("amq.headers", "", b"m", pika.BasicProperties(headers=headers))
    ch.basic_publish("", q, b"end")  # after it in the queue, if it was routed
    bodies = [body for _, _, body in get_all(ch, q, 2 if routed else 1)]
    assert bodies == ([b"m", b"end"] if routed else [b"end"])


def test_an_unknown_x_match_is_refused_at_bind(conn: pika.BlockingConnection, names: Names) -> None:
    ch = conn.channel()
    q = ch.queue_declare(names("hdr"), exclusive=True).method.queue
    code, text = closed_with(
        conn, ch.queue_bind, q, "amq.headers", arguments={"x-match": "bogus", "k": "v"}
    )
    assert code == 406
    assert "x-match" in text


def test_an_unused_queue_with_x_expires_goes_when_its_time_is_up(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """A queue declared with ``x-expires`` 500 ms and then left unused (its connection
    open and idle) is gone within a couple of seconds, as on RabbitMQ: it went at the
    gateway's next gc, up to 10 s later. Watched with mandatory publishes (a publish is
    no use of a queue; a passive declare would be one), returned once it is gone."""
    ch = conn.channel()
    q = ch.queue_declare(names("brief"), arguments={"x-expires": 500}).method.queue
    ch.confirm_delivery()
    declared = time.monotonic()
    while True:
        try:
            ch.basic_publish("", q, b"still there?", mandatory=True)
        except pika.exceptions.UnroutableError:
            break
        assert time.monotonic() - declared < 4.0, "still there 4 s after its 500 ms"
        time.sleep(0.05)
    assert time.monotonic() - declared >= 0.5
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 404
