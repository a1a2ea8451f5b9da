"""Edges of AMQP methods where a client meets RabbitMQ's rules: the same observable
results on the gateway and on RabbitMQ (pika)."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from .conftest import Broker, Names
from .test_features import get_all


@pytest.fixture
def conn(broker: Broker) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield c
    if c.is_open:
        c.close()


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
