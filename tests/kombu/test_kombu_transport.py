# kombu carries no annotations.
# mypy: disable-error-code="no-untyped-call"

"""The kombu transport in one process: publish, consume, acks, exchanges, queues, names."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.exceptions import ChannelError, OperationalError
from kombu.messaging import Consumer, Producer

from fsbus import BlockingBus, DiskFull, QueueFull, QueueNotFound, UsageError
from fsbus.kombu import (
    FOREVER,
    PublishRefused,
    binding_pattern,
    publish_topic,
    queue_name,
)
from tests.kombu.kombu_helpers import WAIT, drain_until, wait_for


def consume(
    conn: Connection,
    queues: list[Queue],
    n: int,
    *,
    ack: bool = True,
    prefetch: int | None = None,
    no_ack: bool = False,
) -> list[Any]:
    """``n`` messages from ``queues`` (acked unless told), in delivery order."""
    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(message)
        if ack and not no_ack:
            message.ack()

    channel = conn.channel()
    consumer = Consumer(channel, queues, callbacks=[on_message], accept=["json"], no_ack=no_ack)
    if prefetch is not None:
        consumer.qos(prefetch_count=prefetch)
    with consumer:
        drain_until(conn, lambda: len(got) >= n)
    return got


# ---------------------------------------------------------------- publish and consume


def test_producer_consumer_round_trip_with_acks(url: str, bus: BlockingBus) -> None:
    exchange = Exchange("tasks", type="direct")
    queue = Queue("work", exchange, routing_key="work")
    with Connection(url) as conn:
        producer = Producer(conn.channel(), exchange=exchange)
        for i in range(20):
            producer.publish({"n": i}, routing_key="work", declare=[queue])
        assert bus.queue_info("work").depth == 20
        got = consume(conn, [queue], 20)
    assert sorted(m.decode()["n"] for m in got) == list(range(20))
    assert all(m.delivery_info["exchange"] == "tasks" for m in got)
    assert all(m.delivery_info["routing_key"] == "work" for m in got)
    assert not any(m.delivery_info["redelivered"] for m in got)
    assert bus.queue_info("work").depth == 0  # acked: consumed from the bus


def test_unacked_messages_come_back_when_the_channel_closes(url: str, bus: BlockingBus) -> None:
    queue = Queue("jobs", routing_key="jobs")
    with Connection(url) as conn:
        with conn.SimpleQueue(queue) as q:
            q.put({"job": 1})
        got = consume(conn, [queue], 1, ack=False)
        assert not got[0].delivery_info["redelivered"]
    assert bus.queue_info("jobs").depth == 1  # given back, not lost
    with Connection(url) as conn:
        again = consume(conn, [queue], 1)
    assert again[0].decode() == {"job": 1}
    assert again[0].delivery_info["redelivered"] is True
    assert bus.queue_info("jobs").depth == 0


def test_reject_with_requeue_redelivers_and_without_drops(url: str, bus: BlockingBus) -> None:
    with Connection(url) as conn, conn.SimpleQueue("rq") as q:
        q.put("a")
        first = q.get(timeout=WAIT)
        first.requeue()
        second = q.get(timeout=WAIT)
        assert second.payload == "a"
        assert second.delivery_info["redelivered"] is True
        second.reject()
        wait_for(lambda: bus.queue_info("rq").depth == 0, what="rejected message dropped")
        with pytest.raises(q.Empty):
            q.get(timeout=0.3)


def test_prefetch_holds_several_unacked_and_acks_in_any_order(url: str, bus: BlockingBus) -> None:
    queue = Queue("many", routing_key="many")
    with Connection(url) as conn:
        with conn.SimpleQueue(queue) as q:
            for i in range(12):
                q.put(i)
        held = consume(conn, [queue], 5, ack=False, prefetch=5)
        assert len(held) == 5
        assert bus.queue_info("many").depth == 12
        for m in reversed(held):
            m.ack()
        rest = consume(conn, [queue], 7, prefetch=5)
    bodies = [m.decode() for m in held + rest]
    assert sorted(bodies) == list(range(12))  # each once, none lost
    assert not any(m.delivery_info["redelivered"] for m in held)
    # (a message the first consumer claimed ahead and gave back when it stopped comes
    # again flagged redelivered, as a broker's prefetched and returned messages do)
    wait_for(lambda: bus.queue_info("many").depth == 0, what="all acked")


def test_prefetch_count_changed_while_messages_are_held(url: str, bus: BlockingBus) -> None:
    queue = Queue("grow", routing_key="grow")
    got: list[Any] = []
    ack_now = False

    def on_message(body: Any, message: Any) -> None:
        got.append(message)
        if ack_now:
            message.ack()

    with Connection(url) as conn:
        with conn.SimpleQueue(queue) as q:
            for i in range(10):
                q.put(i)
        consumer = Consumer(conn.channel(), [queue], callbacks=[on_message])
        consumer.qos(prefetch_count=2)
        with consumer:
            drain_until(conn, lambda: len(got) >= 2)
            consumer.qos(prefetch_count=5)  # as Celery does for each task with an ETA
            drain_until(conn, lambda: len(got) >= 5)
            assert bus.queue_info("grow").depth == 10  # five held, none acked
            for m in got:
                m.ack()
            ack_now = True
            consumer.qos(prefetch_count=1)
            drain_until(conn, lambda: len(got) >= 10)
    assert sorted(m.decode() for m in got) == list(range(10))  # each once
    wait_for(lambda: bus.queue_info("grow").depth == 0, what="all acked")


def test_no_ack_consumers_take_messages_for_good(url: str, bus: BlockingBus) -> None:
    queue = Queue("fire", routing_key="fire")
    with Connection(url) as conn:
        with conn.SimpleQueue(queue) as q:
            for i in range(3):
                q.put(i)
        got = consume(conn, [queue], 3, no_ack=True)
    assert sorted(m.decode() for m in got) == [0, 1, 2]
    assert bus.queue_info("fire").depth == 0


def test_simple_queue_put_get_qsize(url: str) -> None:
    with Connection(url) as conn, conn.SimpleQueue("simple") as q:
        for i in range(3):
            q.put({"i": i})
        assert q.qsize() == 3
        first = q.get_nowait()
        assert first.payload == {"i": 0}
        assert q.qsize() == 2  # as a broker counts: a message held, not acked, is not ready
        first.ack()
        assert q.qsize() == 2
        rest = [q.get(timeout=WAIT) for _ in range(2)]
        assert [m.payload for m in rest] == [{"i": 1}, {"i": 2}]
        for m in rest:
            m.ack()
        wait_for(lambda: q.qsize() == 0, what="acked messages consumed")
        with pytest.raises(q.Empty):
            q.get(timeout=0.2)
        with pytest.raises(q.Empty):
            q.get_nowait()


def test_get_without_a_consumer_takes_the_queue_in_order(url: str, bus: BlockingBus) -> None:
    """``get_nowait`` with no consumer is a ``Bus.get``: the head of the queue each time,
    held until acked (a rejected one comes back first), and Empty once all are taken."""
    with Connection(url) as conn, conn.SimpleQueue("ordered") as q:
        for i in range(40):
            q.put({"i": i})
        first = q.get_nowait()
        assert first.payload == {"i": 0}
        first.requeue()
        got = []
        for _ in range(40):
            m = q.get_nowait()
            got.append(m.payload["i"])
            m.ack()
        assert got == list(range(40))
        with pytest.raises(q.Empty):
            q.get_nowait()
        wait_for(lambda: bus.queue_info(queue_name("ordered")).depth == 0, what="all acked")


def test_priority_higher_first(url: str) -> None:
    queue = Queue("prio", routing_key="prio")
    with Connection(url) as conn:
        producer = Producer(conn.channel())
        for p in (0, 9, 5, 3):
            producer.publish(p, routing_key="prio", priority=p, declare=[queue])
        got = consume(conn, [queue], 4, prefetch=1)
    assert [m.decode() for m in got] == [9, 5, 3, 0]


def test_expiration_and_default_ttl(url: str, bus: BlockingBus) -> None:
    queue = Queue("ttl", routing_key="ttl")
    with Connection(url) as conn:
        producer = Producer(conn.channel())
        producer.publish({"m": "short"}, routing_key="ttl", expiration=30, declare=[queue])
        producer.publish({"m": "forever"}, routing_key="ttl")
    now = time.time()
    left = sorted(m.expires - now for m in bus.browse(queue="ttl"))
    assert len(left) == 2
    assert 25 < left[0] <= 30
    assert left[1] > FOREVER / 2  # not the bus's one-hour default


def test_large_headers_travel_in_the_payload(url: str) -> None:
    big = "x" * 100_000
    with Connection(url) as conn, conn.SimpleQueue("big") as q:
        q.put({"b": 1}, headers={"big": big})
        m = q.get(timeout=WAIT)
        assert m.payload == {"b": 1}
        assert m.headers["big"] == big
        m.ack()


# ---------------------------------------------------------------- exchanges


def test_topic_exchange_routes_by_pattern(url: str) -> None:
    ex = Exchange("events", type="topic")
    one = Queue("one", ex, routing_key="a.*.c")
    some = Queue("some", ex, routing_key="a.#")
    with Connection(url) as conn:
        producer = Producer(conn.channel(), exchange=ex)
        for q in (one, some):
            q(conn.default_channel).declare()
        for key in ("a.b.c", "a.b.d", "a", "b.a.c", "a.x.c", "a.*.c"):
            producer.publish(key, routing_key=key, serializer="json")
        got_one = consume(conn, [one], 3)
        got_some = consume(conn, [some], 5)
    assert sorted(m.decode() for m in got_one) == ["a.*.c", "a.b.c", "a.x.c"]
    assert sorted(m.decode() for m in got_some) == ["a", "a.*.c", "a.b.c", "a.b.d", "a.x.c"]


def test_direct_exchange_matches_keys_exactly(url: str) -> None:
    ex = Exchange("direct-x", type="direct")
    star = Queue("star", ex, routing_key="a.*")
    plain = Queue("plain", ex, routing_key="a.b")
    with Connection(url) as conn:
        for q in (star, plain):
            q(conn.default_channel).declare()
        producer = Producer(conn.channel(), exchange=ex)
        for key in ("a.b", "a.*", "a.c"):
            producer.publish(key, routing_key=key, serializer="json")
        assert [m.decode() for m in consume(conn, [star], 1)] == ["a.*"]
        assert [m.decode() for m in consume(conn, [plain], 1)] == ["a.b"]
        assert star(conn.default_channel).queue_declare(passive=True).message_count == 0
        assert plain(conn.default_channel).queue_declare(passive=True).message_count == 0


def test_fanout_exchange_copies_to_every_queue(url: str) -> None:
    ex = Exchange("news", type="fanout")
    queues = [Queue(f"reader{i}", ex) for i in range(3)]
    with Connection(url) as conn:
        for q in queues:
            q(conn.default_channel).declare()
        Producer(conn.channel(), exchange=ex).publish({"headline": 1}, routing_key="ignored")
        for q in queues:
            got = consume(conn, [q], 1)
            assert got[0].decode() == {"headline": 1}


def test_publisher_needs_no_declarations_of_its_own(url: str) -> None:
    """Bindings live on the bus: a connection that never saw the queue or the exchange
    routes to it (kombu's in-memory exchange table is not needed)."""
    queue = Queue("orders", Exchange("shop", type="topic"), routing_key="order.#")
    with Connection(url) as consumer_conn:
        queue(consumer_conn.default_channel).declare()
        with Connection(url) as publisher_conn:
            Producer(publisher_conn.channel()).publish(
                {"id": 7}, exchange="shop", routing_key="order.created"
            )
        got = consume(consumer_conn, [queue], 1)
    assert got[0].decode() == {"id": 7}


def test_unbind_stops_routing(url: str, bus: BlockingBus) -> None:
    ex = Exchange("ub", type="direct")
    queue = Queue("ubq", ex, routing_key="k")
    with Connection(url) as conn:
        bound = queue(conn.default_channel)
        bound.declare()
        producer = Producer(conn.channel(), exchange=ex)
        producer.publish(1, routing_key="k")
        bound.unbind_from(ex, routing_key="k")
        producer.publish(2, routing_key="k")
    assert bus.queue_info("ubq").depth == 1
    assert bus.queue_info("ubq").bindings == ()


def test_amq_topic_meets_plain_fsbus_clients(url: str, bus: BlockingBus) -> None:
    ex = Exchange("amq.topic", type="topic")
    queue = Queue("sensors", ex, routing_key="sensor.#")
    with Connection(url) as conn:
        queue(conn.default_channel).declare()
        assert bus.queue_info("sensors").bindings == ("sensor.#",)
        # an fsbus publisher's message reaches the kombu consumer
        bus.publish("sensor.t1", b"21.5")
        bus.publish("sensor.t2", b'{"c": 22}', headers={"content-type": "application/json"})
        got = consume(conn, [queue], 2)
        bodies = {m.delivery_info["routing_key"]: m.decode() for m in got}
        assert bodies == {"sensor.t1": b"21.5", "sensor.t2": {"c": 22}}
        # and a kombu publish to amq.topic reaches an fsbus queue with its body as payload
        bus.declare_queue("fs-side", ["sensor.#"])
        Producer(conn.channel(), exchange=ex).publish({"t": 3}, routing_key="sensor.t3")
    with bus.messages(queue="fs-side") as it:
        msg = it.get(timeout=WAIT)
        assert msg.topic == "sensor.t3"
        assert msg.payload == b'{"t": 3}'
        assert msg.headers["content-type"] == "application/json"
        it.ack(msg)


# ---------------------------------------------------------------- queues


def test_queue_arguments_become_queue_options(url: str, bus: BlockingBus) -> None:
    queue = Queue(
        "opts",
        routing_key="opts",
        expires=120,
        message_ttl=30,
        max_length=5,
        queue_arguments={"x-overflow": "reject-publish"},
    )
    with Connection(url) as conn:
        queue(conn.default_channel).declare()
    options = bus.queue_info("opts").options
    assert options.expires == 120
    assert options.message_ttl == 30
    assert options.max_length == 5
    assert options.overflow == "reject-publish"


def test_a_full_reject_publish_queue_refuses_with_a_channel_error(
    url: str, bus: BlockingBus
) -> None:
    """A publish a full reject-publish queue refuses raises PublishRefused, a kombu
    ChannelError (and fsbus.QueueFull), not the bus's bare QueueFull; the other queue the
    exchange routes it to still gets its copy, as RabbitMQ delivers it there."""
    ex = Exchange("jobs", type="topic")
    capped = Queue(
        "capped",
        ex,
        routing_key="job.#",
        max_length=2,
        queue_arguments={"x-overflow": "reject-publish"},
    )
    roomy = Queue("roomy", ex, routing_key="job.#")
    with Connection(url) as conn:
        for q in (capped, roomy):
            q(conn.default_channel).declare()
        producer = Producer(conn.channel(), exchange=ex)
        for i in range(2):
            producer.publish({"n": i}, routing_key="job.new", serializer="json")
        with pytest.raises(PublishRefused) as err:
            producer.publish({"n": 2}, routing_key="job.new", serializer="json")
        assert isinstance(err.value, ChannelError)
        assert isinstance(err.value, conn.channel_errors)
        assert isinstance(err.value, QueueFull)
        assert isinstance(err.value.__cause__, QueueFull)
        assert "exchange 'jobs' with routing key 'job.new' refused" in str(err.value)
        assert "'capped' is full" in str(err.value)
        # the default exchange: the queue named by the routing key
        with pytest.raises(PublishRefused, match=r"the default exchange.*'capped'"):
            Producer(conn.channel()).publish({"n": 3}, routing_key="capped", serializer="json")
        # retry=True (Celery's default): a recoverable error, as py-amqp's MessageNacked
        # (RabbitMQ's nack) is: kombu tries again on a new connection as often as the
        # retry policy allows, then raises its OperationalError with the refusal as cause
        retries: list[BaseException] = []
        with pytest.raises(OperationalError) as retried:
            Producer(conn.channel()).publish(
                {"n": 4},
                routing_key="capped",
                retry=True,
                retry_policy={"max_retries": 2, "interval_start": 0, "errback": _tried(retries)},
            )
        assert isinstance(retried.value.__cause__, PublishRefused)
        assert [type(e) for e in retries] == [PublishRefused, PublishRefused]
    assert bus.queue_info("capped").depth == 2
    assert bus.queue_info("roomy").depth == 3


def _tried(into: list[BaseException]) -> Callable[[BaseException, float], None]:
    """A retry policy's ``errback``: kombu calls it with each error it retries after."""

    def errback(exc: BaseException, interval: float) -> None:
        into.append(exc)

    return errback


def test_errors_a_retry_cannot_mend_are_raised_at_once(url: str, bus: BlockingBus) -> None:
    """The transport sorts its errors as py-amqp sorts RabbitMQ's: kombu's ``ensure``
    (``publish(retry=True)``, Celery's publishing) raises a bad message, a missing queue
    or a declaration with other arguments at once, with no new connection and no retry."""
    bus.declare_queue(queue_name("strict"), max_length=5)
    with Connection(url, transport_options={"config": {"max_payload_size": 1000}}) as conn:
        retries: list[BaseException] = []
        policy = {"max_retries": 3, "interval_start": 0, "errback": _tried(retries)}
        transport_connection = conn.connection
        with pytest.raises(UsageError, match="exceeds max_payload_size=1000"):
            Producer(conn.channel()).publish(
                b"x" * 2000,
                routing_key="strict",
                retry=True,
                retry_policy=policy,
            )
        channel = conn.default_channel
        declare = conn.ensure(channel, channel.queue_declare, **policy)
        with pytest.raises(ChannelError, match="NOT_FOUND"):
            declare("nowhere", passive=True)
        with pytest.raises(ChannelError, match="PRECONDITION_FAILED"):
            declare("strict", arguments={"x-max-length": 6})
        assert retries == []
        assert conn.connection is transport_connection  # never reconnected
    assert bus.queue_info(queue_name("strict")).depth == 0


def test_a_publish_on_a_full_disk_is_retried_under_the_policy_until_it_fits(
    tmp_path: Path,
) -> None:
    """A full disk is a recoverable error (the publish that raised left no copy):
    ``publish(retry=True)`` tries again, on a new connection, as the retry policy allows;
    once space is freed the message is in its queue once."""
    from tests.faults.conftest import tmpfs_at

    with tmpfs_at(tmp_path / "small", "size=8m,nr_inodes=400,mode=0755") as mnt:
        url = f"fsbus://{mnt / 'bus'}"
        queue = Queue("jobs", routing_key="jobs")
        with Connection(url) as conn:
            queue(conn.default_channel).declare()
            Producer(conn.channel()).publish({"n": 0}, routing_key="jobs")  # (warm)
            fillers = _fill_inodes(mnt / "filler")
            retries: list[BaseException] = []

            def free_after_two(exc: BaseException, interval: float) -> None:
                retries.append(exc)
                if len(retries) == 2:
                    shutil.rmtree(mnt / "filler")

            Producer(conn.channel()).publish(
                {"n": 1},
                routing_key="jobs",
                retry=True,
                retry_policy={"max_retries": 5, "interval_start": 0, "errback": free_after_two},
            )
            assert fillers > 0
            assert len(retries) == 2
            assert all(isinstance(e, DiskFull) for e in retries), retries
            got = consume(conn, [queue], 2)
        assert sorted(m.payload["n"] for m in got) == [0, 1]
        with BlockingBus(mnt / "bus") as bus:
            assert bus.queue_info(queue_name("jobs")).depth == 0


def _fill_inodes(where: Path) -> int:
    """Take every free inode of ``where``'s filesystem with empty files; how many."""
    where.mkdir()
    n = 0
    with pytest.raises(OSError, match="No space left"):  # noqa: PT012
        while True:
            (where / str(n)).touch()
            n += 1
    return n


def test_redeclaring_with_other_arguments_fails(url: str) -> None:
    with Connection(url) as conn:
        Queue("strict", routing_key="strict", max_length=5)(conn.default_channel).declare()
        with pytest.raises(
            ChannelError, match=r"PRECONDITION_FAILED.*max_length: asked 6, the queue has 5"
        ):
            Queue("strict", routing_key="strict", max_length=6)(conn.default_channel).declare()


def test_passive_declare_of_a_missing_queue_fails(url: str) -> None:
    with Connection(url) as conn, pytest.raises(ChannelError, match="NOT_FOUND"):
        conn.default_channel.queue_declare("nowhere", passive=True)


def test_purge_and_delete(url: str, bus: BlockingBus) -> None:
    queue = Queue("pd", routing_key="pd")
    with Connection(url) as conn:
        with conn.SimpleQueue(queue) as q:
            for i in range(4):
                q.put(i)
        bound = queue(conn.default_channel)
        assert bound.purge() == 4
        assert bus.queue_info("pd").depth == 0
        with conn.SimpleQueue(queue) as q:
            q.put("x")
        assert bound.delete() == 1
    with pytest.raises(QueueNotFound):
        bus.queue_info("pd")


def test_exclusive_queues_go_with_their_channel(url: str, bus: BlockingBus) -> None:
    with Connection(url) as conn:
        channel = conn.channel()
        Queue("mine", routing_key="mine", exclusive=True)(channel).declare()
        assert bus.queue_info("mine").depth == 0
        channel.close()
    with pytest.raises(QueueNotFound):
        bus.queue_info("mine")


def test_names_that_are_not_queue_names_are_escaped(url: str, bus: BlockingBus) -> None:
    name = "celery@host.celery.pidbox"
    with Connection(url) as conn, conn.SimpleQueue(name) as q:
        q.put("hi")
        assert bus.queue_info("celery:40host.celery.pidbox").depth == 1
        m = q.get(timeout=WAIT)
        assert m.payload == "hi"
        m.ack()


# ---------------------------------------------------------------- names and topics


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("celery", "celery"),
        ("a.b-c_d", "a.b-c_d"),
        ("celery@host", "celery:40host"),
        ("a:b", "a:3ab"),
        ("a..b", "a.:2eb"),
        (".a", "_:2ea"),
        ("-a", "_:2da"),
        ("a b/é", "a:20b:2f:c3:a9"),
    ],
)
def test_queue_name(name: str, expected: str) -> None:
    assert queue_name(name) == expected


def test_queue_names_stay_distinct_and_valid(bus: BlockingBus) -> None:
    names = ["a:40b", "a@b", "a..b", "a.:2eb", "x" * 300, "x" * 301, ".", "_:2e", "é" * 100]
    mapped = [queue_name(n) for n in names]
    assert len(set(mapped)) == len(names)
    for m in mapped:
        bus.declare_queue(m)  # every one is a valid queue name


def test_publish_topic_and_binding_patterns() -> None:
    assert publish_topic("ex", "a.b") == "kombu.ex.a.b"
    assert publish_topic("my.ex", "a*.#") == "kombu.my%2Eex.a%2A.%23"
    assert publish_topic("", "q") == "kombu.%.q"
    assert publish_topic("amq.topic", "sensor.t1") == "sensor.t1"
    assert binding_pattern("ex", "direct", "a.*") == "kombu.ex.a.%2A"
    assert binding_pattern("ex", "topic", "a.*.#") == "kombu.ex.a.*.#"
    assert binding_pattern("ex", "fanout", "whatever") == "kombu.ex.#"
    assert binding_pattern("amq.topic", "topic", "a.#") == "a.#"
    with pytest.raises(ChannelError):
        binding_pattern("ex", "headers", "")


# ---------------------------------------------------------------- connections


def test_transport_given_by_name(root: Path) -> None:
    with Connection(f"fsbus://{root}", transport="fsbus.kombu:Transport") as conn:
        with conn.SimpleQueue("named") as q:
            q.put(1)
            m = q.get(timeout=WAIT)
            assert m.payload == 1
            m.ack()
        assert conn.transport.driver_type == "fsbus"
    assert (root / "fsbus" / "queues" / "named").is_dir()


def test_url_without_a_directory_is_refused() -> None:
    with Connection("fsbus://") as conn, pytest.raises(UsageError, match="no bus directory"):
        conn.connect()


def test_a_consumer_left_open_does_not_hang_the_interpreter(root: Path) -> None:
    code = (
        "import fsbus.kombu\n"
        "from kombu import Connection\n"
        f"conn = Connection('fsbus://{root}')\n"
        "q = conn.SimpleQueue('left-open')\n"
        "q.put(1)\n"
        "m = q.get(timeout=10)\n"  # a subscription runs: the bus's event-loop thread too
        "print('got', m.payload, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "got 1"
    with BlockingBus(root) as b:
        assert b.queue_info("left-open").depth == 1  # unacked: given back, not lost
