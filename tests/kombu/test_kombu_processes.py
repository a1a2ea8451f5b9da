# kombu carries no annotations.
# mypy: disable-error-code="no-untyped-call"

"""The kombu transport across processes: competing consumers, a consumer killed before
acking, fanout to queues consumed in two processes. Every message is counted."""

from __future__ import annotations

import collections
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Consumer, Producer

from fsbus import BlockingBus
from tests.kombu.kombu_helpers import WAIT, drain_until, peer_argv, wait_for
from tests.peer_process import JsonLinesPeer

pytestmark = pytest.mark.slow


@pytest.fixture
def peers() -> Iterator[list[JsonLinesPeer]]:
    started: list[JsonLinesPeer] = []
    yield started
    for p in started:
        p.kill()


def start(peers: list[JsonLinesPeer], name: str, *args: str) -> JsonLinesPeer:
    peer = JsonLinesPeer(peer_argv(*args), name=name)
    peers.append(peer)
    peer.wait_count("ready", 1, timeout=WAIT)
    return peer


def bodies(peer: JsonLinesPeer) -> list[Any]:
    return [e["body"] for e in peer.of("got")]


def test_two_consumer_processes_compete_each_message_once(
    url: str, bus: BlockingBus, peers: list[JsonLinesPeer]
) -> None:
    n = 300
    queue = Queue("work", Exchange("jobs", type="direct"), routing_key="work")
    with Connection(url) as conn:
        queue(conn.default_channel).declare()
    a = start(peers, "consumer A", url, "work", "--exchange", "jobs", "--key", "work")
    b = start(peers, "consumer B", url, "work", "--exchange", "jobs", "--key", "work")
    with Connection(url) as conn:
        producer = Producer(conn.channel(), exchange=Exchange("jobs", type="direct"))
        for i in range(n):
            producer.publish({"i": i}, routing_key="work")

    def total() -> int:
        return a.count("got") + b.count("got")

    wait_for(lambda: total() >= n, what=f"{n} messages consumed")
    wait_for(lambda: bus.queue_info("work").depth == 0, what="every message acked")
    assert a.stop() == 0
    assert b.stop() == 0
    got = [x["i"] for x in bodies(a) + bodies(b)]
    assert sorted(got) == list(range(n))  # every message, each once
    assert a.count("got") > 0
    assert b.count("got") > 0
    assert not any(e["redelivered"] for e in a.of("got") + b.of("got"))


def test_a_consumer_killed_before_acking_has_its_message_redelivered(
    url: str, bus: BlockingBus, peers: list[JsonLinesPeer]
) -> None:
    queue = Queue("fragile", routing_key="fragile")
    with Connection(url) as conn:
        queue(conn.default_channel).declare()
        producer = Producer(conn.channel())
        for i in range(5):
            producer.publish({"i": i}, routing_key="fragile")
    holder = start(peers, "holder", url, "fragile", "--hold", "--prefetch", "1")
    held = holder.wait_count("got", 1)[0]["body"]["i"]
    assert bus.queue_info("fragile").depth == 5
    holder.proc.send_signal(signal.SIGKILL)
    holder.wait_exit()
    assert holder.count("got") == 1  # prefetch 1: it held one message, unacked

    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append((body["i"], message.delivery_info["redelivered"]))
        message.ack()

    with Connection(url) as conn:
        with Consumer(conn.channel(), [queue], callbacks=[on_message], accept=["json"]):
            drain_until(conn, lambda: len(got) >= 5)
    assert sorted(i for i, _ in got) == [0, 1, 2, 3, 4]  # nothing lost, nothing twice
    assert [i for i, redelivered in got if redelivered] == [held]
    wait_for(lambda: bus.queue_info("fragile").depth == 0, what="every message acked")


def test_fanout_reaches_queues_consumed_in_two_processes(
    url: str, bus: BlockingBus, peers: list[JsonLinesPeer]
) -> None:
    n = 100
    readers = [
        start(peers, f"reader {i}", url, f"news-{i}", "--exchange", "news", "--type", "fanout")
        for i in range(2)
    ]
    with Connection(url) as conn:  # this process declares neither queue
        producer = Producer(conn.channel(), exchange=Exchange("news", type="fanout"))
        for i in range(n):
            producer.publish({"i": i}, routing_key=f"any.{i % 3}")
    for reader in readers:
        reader.wait_count("got", n)
    for i, reader in enumerate(readers):
        name = f"news-{i}"

        def drained(name: str = name) -> bool:
            return bus.queue_info(name).depth == 0

        wait_for(drained, what=f"{name} acked")
        assert reader.stop() == 0
        counts = collections.Counter(b["i"] for b in bodies(reader))
        assert counts == collections.Counter(range(n))  # every message, once per queue


def test_topic_bindings_made_in_another_process_route_publishes(
    url: str, bus: BlockingBus, peers: list[JsonLinesPeer]
) -> None:
    args = ("--exchange", "shop", "--type", "topic")
    eu = start(peers, "eu", url, "orders-eu", *args, "--key", "order.eu.*")
    every = start(peers, "every", url, "orders-all", *args, "--key", "order.#")
    keys = ["order.eu.new", "order.us.new", "order.eu.paid", "order", "refund.eu.new"]
    with Connection(url) as conn:
        producer = Producer(conn.channel(), exchange=Exchange("shop", type="topic"))
        for key in keys:
            producer.publish({"key": key}, routing_key=key)
    eu.wait_count("got", 2)
    every.wait_count("got", 4)
    wait_for(lambda: bus.queue_info("orders-all").depth == 0, what="acked")
    wait_for(lambda: bus.queue_info("orders-eu").depth == 0, what="acked")
    assert eu.stop() == 0
    assert every.stop() == 0
    assert sorted(b["key"] for b in bodies(eu)) == ["order.eu.new", "order.eu.paid"]
    assert sorted(b["key"] for b in bodies(every)) == sorted(keys[:4])


def _child_publishes(url: str, results: Any) -> None:
    # kombu closed the parent's pooled connections on fork (its after-fork hook): this
    # child got here only if that close let go of the parent's event-loop thread.
    with Connection(url) as conn:
        conn.SimpleQueue("from-child").put({"pid": "child"})
    results.put("done")


def test_a_process_forked_while_a_pooled_connection_consumes_runs_and_exits(
    url: str, bus: BlockingBus
) -> None:
    import multiprocessing

    with Connection(url) as conn:
        pool = conn.Pool(limit=1)
        pooled = pool.acquire()
        q = pooled.SimpleQueue("work")
        q.put({"n": 1})
        q.get(timeout=WAIT).ack()  # the pooled connection now runs its event-loop thread
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=_child_publishes, args=(url, results))
        child.start()
        child.join(WAIT)
        if child.exitcode is None:
            child.kill()
        assert child.exitcode == 0
        assert results.get(timeout=WAIT) == "done"
        q.close()
        pooled.release()
        pool.force_close_all()
    wait_for(lambda: bus.queue_info("from-child").depth == 1, what="the child's message")
