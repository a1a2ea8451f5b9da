"""``x-single-active-consumer``: one consumer of the queue at a time gets its messages,
the others wait for it to leave; the same on the gateway and on RabbitMQ (pika), and
across the gateways of one bus."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from fsbus.amqp import running

from .conftest import Broker, Names

WAIT = 20.0
QUIET = 0.5
"""Seconds a consumer that must get nothing is watched."""
SAC = {"x-single-active-consumer": True}

Channel = pika.adapters.blocking_connection.BlockingChannel


@pytest.fixture
def conn(broker: Broker) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield c
    if c.is_open:
        c.close()


def pump(conns: list[pika.BlockingConnection], until: Callable[[], bool], what: str) -> None:
    """Process the connections' events until ``until()`` (at most WAIT s)."""
    deadline = time.monotonic() + WAIT
    while not until():
        assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
        for c in conns:
            c.process_data_events(time_limit=0.02)


def quiet(conns: list[pika.BlockingConnection]) -> None:
    """Process the connections' events for QUIET s."""
    deadline = time.monotonic() + QUIET
    while time.monotonic() < deadline:
        for c in conns:
            c.process_data_events(time_limit=0.02)


def consume(ch: Channel, queue: str, got: list[tuple[bytes, bool]], *, ack: bool = True) -> str:
    """Consume ``queue`` on ``ch``, each message's (body, redelivered) into ``got``."""

    def on_message(
        ch: Channel,
        method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        got.append((body, bool(method.redelivered)))
        if ack:
            ch.basic_ack(method.delivery_tag)

    return str(ch.basic_consume(queue, on_message))


def publish(ch: Channel, queue: str, bodies: range) -> None:
    for i in bodies:
        ch.basic_publish("", queue, str(i).encode())


def test_only_the_first_consumer_gets_messages_until_it_is_cancelled(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """Two consumers on two channels: all of 10 messages go to the first; once it is
    cancelled, the next 5 go to the second. Both are counted. A redeclare with another
    value of the argument is 406."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(names("sac"), arguments=SAC).method.queue
    first: list[tuple[bytes, bool]] = []
    second: list[tuple[bytes, bool]] = []
    ch1, ch2 = conn.channel(), conn.channel()
    tag1 = consume(ch1, q, first)
    consume(ch2, q, second)
    assert ch.queue_declare(q, passive=True).method.consumer_count == 2
    publish(ch, q, range(10))
    pump([conn], lambda: len(first) + len(second) == 10, "10 delivered")
    quiet([conn])
    assert [b for b, _ in first] == [str(i).encode() for i in range(10)]
    assert second == []
    ch1.basic_cancel(tag1)
    publish(ch, q, range(10, 15))
    pump([conn], lambda: len(second) == 5, "5 delivered to the second")
    quiet([conn])
    assert [b for b, _ in second] == [str(i).encode() for i in range(10, 15)]
    assert len(first) == 10
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare(q, arguments={"x-single-active-consumer": False})
    assert caught.value.reply_code == 406
    ch = conn.channel()
    ch.queue_delete(q)


def test_the_next_consumer_gets_the_unacked_messages_first(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """The active consumer holds 3 messages unacked (of 5) when its channel closes: the
    waiting one gets those 3 first, redelivered, then the other 2."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(names("sac-unacked"), arguments=SAC).method.queue
    first: list[tuple[bytes, bool]] = []
    second: list[tuple[bytes, bool]] = []
    ch1, ch2 = conn.channel(), conn.channel()
    ch1.basic_qos(prefetch_count=3)
    consume(ch1, q, first, ack=False)
    consume(ch2, q, second)
    publish(ch, q, range(5))
    pump([conn], lambda: len(first) == 3, "3 delivered to the first")
    quiet([conn])
    assert second == []
    ch1.close()
    pump([conn], lambda: len(second) == 5, "5 delivered to the second")
    assert second == [(str(i).encode(), i < 3) for i in range(5)]
    ch.queue_delete(q)


def test_a_waiting_consumer_keeps_an_auto_delete_queue_and_is_cancelled_with_its_queue(
    conn: pika.BlockingConnection, names: Names
) -> None:
    """An auto-delete queue whose active consumer is cancelled is kept for the waiting
    ones (counted; an exclusive consumer is refused while they are there), which get
    the messages; deleting the queue sends basic.cancel to every consumer, waiting ones
    too."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(names("sac-auto"), auto_delete=True, arguments=SAC).method.queue
    got: list[list[tuple[bytes, bool]]] = [[], [], []]
    chans = [conn.channel() for _ in got]
    cancelled: list[int] = []
    tags = []
    for i, c in enumerate(chans):
        c.add_on_cancel_callback(lambda _frame, i=i: cancelled.append(i))
        tags.append(consume(c, q, got[i]))
    assert ch.queue_declare(q, passive=True).method.consumer_count == 3
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        conn.channel().basic_consume(q, lambda *a: None, exclusive=True)
    assert caught.value.reply_code == 403
    publish(ch, q, range(4))
    pump([conn], lambda: sum(map(len, got)) == 4, "4 delivered")
    quiet([conn])
    assert [len(g) for g in got] == [4, 0, 0]
    chans[0].basic_cancel(tags[0])
    assert ch.queue_declare(q, passive=True).method.consumer_count == 2
    publish(ch, q, range(4, 6))
    pump([conn], lambda: len(got[1]) + len(got[2]) == 2, "2 delivered")
    quiet([conn])
    assert len(got[0]) == 4
    assert sorted(len(g) for g in got[1:]) == [0, 2]
    ch.queue_delete(q)
    pump([conn], lambda: sorted(cancelled) == [1, 2], "both cancelled")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 404


def test_one_active_consumer_across_two_gateways(tmp_path: Path) -> None:
    """Two gateways on one bus: a consumer on each; the first gets every message until
    it is cancelled, then the one on the other gateway gets them, the unacked ones of
    the first first."""
    root = tmp_path / "bus"
    with running(root) as gw1, running(root) as gw2:
        c1 = pika.BlockingConnection(pika.URLParameters(gw1.url))
        c2 = pika.BlockingConnection(pika.URLParameters(gw2.url))
        try:
            ch = c1.channel()
            ch.confirm_delivery()
            ch.queue_declare("sac", arguments=SAC)
            first: list[tuple[bytes, bool]] = []
            second: list[tuple[bytes, bool]] = []
            ch1, ch2 = c1.channel(), c2.channel()
            ch1.basic_qos(prefetch_count=2)
            consume(ch1, "sac", first, ack=False)
            consume(ch2, "sac", second)
            publish(ch, "sac", range(4))
            pump([c1, c2], lambda: len(first) == 2, "2 delivered to the first")
            quiet([c1, c2])
            assert second == []
            ch1.close()
            pump([c1, c2], lambda: len(second) == 4, "4 delivered to the second")
            assert second == [(str(i).encode(), i < 2) for i in range(4)]
            ch.queue_delete("sac")
        finally:
            c1.close()
            c2.close()


def test_waiting_consumers_of_another_gateway_are_counted(tmp_path: Path) -> None:
    """A consumer waiting on another gateway of the bus is counted by every gateway: in
    consumer_count, by if-unused and exclusive consumers, and it keeps an auto-delete
    queue whose active consumer (on the first gateway) is cancelled."""
    root = tmp_path / "bus"
    with running(root) as gw1, running(root) as gw2:
        c1 = pika.BlockingConnection(pika.URLParameters(gw1.url))
        c2 = pika.BlockingConnection(pika.URLParameters(gw2.url))
        try:
            ch, other = c1.channel(), c2.channel()
            ch.confirm_delivery()
            ch.queue_declare("sac", auto_delete=True, arguments=SAC)
            got: list[tuple[bytes, bool]] = []
            active = c1.channel()
            tag1 = consume(active, "sac", [])
            waiting = c2.channel()
            tag2 = consume(waiting, "sac", got)
            assert ch.queue_declare("sac", passive=True).method.consumer_count == 2
            assert other.queue_declare("sac", passive=True).method.consumer_count == 2
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                c1.channel().queue_delete("sac", if_unused=True)
            assert caught.value.reply_code == 406
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                c1.channel().basic_consume("sac", lambda *a: None, exclusive=True)
            assert caught.value.reply_code == 403
            active.basic_cancel(tag1)  # the queue is kept for the waiting one
            publish(ch, "sac", range(3))
            pump([c1, c2], lambda: len(got) == 3, "3 delivered to the second")
            assert ch.queue_declare("sac", passive=True).method.consumer_count == 1
            waiting.basic_cancel(tag2)  # its last consumer: deleted before the cancel-ok
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                ch.queue_declare("sac", passive=True)
            assert caught.value.reply_code == 404
        finally:
            c1.close()
            c2.close()


def sac_fds(root: Path) -> int:
    """This process's descriptors open on the bus's single-active-consumer files."""
    folder = str(root / "fsbus" / "amqp" / "sac") + "/"
    n = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            n += Path(fd).readlink().as_posix().startswith(folder)
        except OSError:
            continue
    return n


def test_no_descriptor_is_left_open(tmp_path: Path) -> None:
    """Each consumer of a single-active-consumer queue has a descriptor of its own, closed
    once it leaves: cancelled, its channel closed, its queue deleted (a waiting one
    too, which is sent basic.cancel) or its connection closed."""
    root = tmp_path / "bus"
    with running(root) as gw:
        c = pika.BlockingConnection(pika.URLParameters(gw.url))
        ch = c.channel()
        ch.queue_declare("sac", arguments=SAC)
        chans = [c.channel() for _ in range(4)]
        cancelled: list[int] = []
        tags = []
        for i, x in enumerate(chans):
            x.add_on_cancel_callback(lambda _frame, i=i: cancelled.append(i))
            tags.append(consume(x, "sac", []))
        assert sac_fds(root) == 4
        chans[1].basic_cancel(tags[1])  # a waiting one
        pump([c], lambda: sac_fds(root) == 3, "3 open")
        chans[2].close()  # a waiting one
        pump([c], lambda: sac_fds(root) == 2, "2 open")
        chans[0].basic_cancel(tags[0])  # the active one: the last becomes active
        pump([c], lambda: sac_fds(root) == 1, "1 open")
        assert ch.queue_declare("sac", passive=True).method.consumer_count == 1
        ch.queue_delete("sac")
        pump([c], lambda: cancelled == [3] and sac_fds(root) == 0, "0 open")
        ch.queue_declare("sac", arguments=SAC)
        for x in (c.channel(), c.channel()):
            consume(x, "sac", [])
        assert sac_fds(root) == 2
        c.close()
        deadline = time.monotonic() + WAIT
        while sac_fds(root):
            assert time.monotonic() < deadline, "still open after the connection closed"
            time.sleep(0.02)
