"""RabbitMQ's tutorials through two AMQP gateways, one on each CephFS client: the
publisher talks to the gateway on client A, the consumer to the one on client B."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from fsbus.amqp import Gateway, running

from .clusters import Cluster

WAIT = 60.0


@pytest.fixture
def gateways(ceph: Cluster) -> Iterator[tuple[Gateway, Gateway]]:
    name = f"amqp-{uuid.uuid4().hex[:12]}"
    (ceph.a / name).mkdir()
    root_a: Path = ceph.a / name
    root_b: Path = ceph.b / name
    with running(root_a) as a, running(root_b) as b:
        yield a, b


def connect(gw: Gateway) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(gw.url))


def take(gw: Gateway, queue: str, n: int, **declare: object) -> list[bytes]:
    with connect(gw) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, **declare)  # type: ignore[arg-type]
        got: list[bytes] = []
        for method, _props, body in ch.consume(queue, inactivity_timeout=WAIT):
            assert method is not None, f"only {len(got)} of {n} within {WAIT} s"
            ch.basic_ack(method.delivery_tag)
            got.append(body)
            if len(got) == n:
                break
        ch.cancel()
        return got


def test_hello_world_and_work_queues_across_clients(gateways: tuple[Gateway, Gateway]) -> None:
    a, b = gateways
    with connect(a) as conn:
        ch = conn.channel()
        ch.queue_declare("hello")
        ch.basic_publish("", "hello", b"Hello World!")
        ch.queue_declare("task_queue", durable=True)
        ch.confirm_delivery()
        for i in range(40):
            ch.basic_publish(
                "", "task_queue", f"task {i}".encode(), pika.BasicProperties(delivery_mode=2)
            )
    assert take(b, "hello", 1) == [b"Hello World!"]
    # two workers, one behind each gateway
    results: dict[str, list[bytes]] = {}

    def work(name: str, gw: Gateway) -> None:
        with connect(gw) as conn:
            ch = conn.channel()
            ch.queue_declare("task_queue", durable=True)
            ch.basic_qos(prefetch_count=1)
            got = results.setdefault(name, [])
            for method, _p, body in ch.consume("task_queue", inactivity_timeout=3):
                if method is None:
                    break
                got.append(body)
                ch.basic_ack(method.delivery_tag)
            ch.cancel()

    threads = [threading.Thread(target=work, args=(n, g)) for n, g in (("A", a), ("B", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT * 2)
    done = Counter(body for got in results.values() for body in got)
    assert done == Counter(f"task {i}".encode() for i in range(40))


def test_topics_and_rpc_across_clients(gateways: tuple[Gateway, Gateway]) -> None:
    a, b = gateways
    with connect(b) as conn:
        ch = conn.channel()
        ch.exchange_declare("topic_logs", "topic")
        ch.queue_declare("lazy", durable=True)
        ch.queue_bind("lazy", "topic_logs", "lazy.#")
    with connect(a) as conn:
        ch = conn.channel()
        ch.exchange_declare("topic_logs", "topic", passive=True)
        for key in ("lazy.orange.elephant", "quick.brown.fox", "lazy"):
            ch.basic_publish("topic_logs", key, key.encode())
    assert take(b, "lazy", 2, durable=True) == [b"lazy.orange.elephant", b"lazy"]

    # RPC: the server behind gateway B, the client behind gateway A
    stop = threading.Event()
    serving = threading.Event()

    def server() -> None:
        with connect(b) as conn:
            ch = conn.channel()
            ch.queue_declare("rpc_queue")

            def on_request(c: object, m: object, props: pika.BasicProperties, body: bytes) -> None:
                ch.basic_publish(
                    "",
                    props.reply_to,
                    str(int(body) * 2).encode(),
                    pika.BasicProperties(correlation_id=props.correlation_id),
                )
                ch.basic_ack(m.delivery_tag)  # type: ignore[attr-defined]

            ch.basic_consume("rpc_queue", on_request)
            serving.set()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.1)

    t = threading.Thread(target=server)
    t.start()
    try:
        assert serving.wait(WAIT)
        with connect(a) as conn:
            ch = conn.channel()
            reply = ch.queue_declare("", exclusive=True).method.queue
            answers: dict[str, bytes] = {}
            ch.basic_consume(
                reply,
                lambda _c, _m, p, body: answers.__setitem__(p.correlation_id, body),
                auto_ack=True,
            )
            corr = str(uuid.uuid4())
            ch.basic_publish(
                "", "rpc_queue", b"21", pika.BasicProperties(reply_to=reply, correlation_id=corr)
            )
            deadline = time.monotonic() + WAIT
            while corr not in answers:
                assert time.monotonic() < deadline, "no RPC answer"
                conn.process_data_events(time_limit=0.05)
            assert answers[corr] == b"42"
    finally:
        stop.set()
        t.join()


def test_retry_after_a_delay_across_clients(gateways: tuple[Gateway, Gateway]) -> None:
    """RabbitMQ's "retry after a delay" through the two gateways: a waiting queue with
    ``x-message-ttl`` whose dead-letter exchange leads to the work queue. Published
    through gateway A, consumed through gateway B; whichever gateway holds the waiting
    queue's expirer lock dead-letters them: each of 30 arrives once, with its
    ``x-death``, and the waiting queue is left empty."""
    a, b = gateways
    with connect(a) as conn:
        ch = conn.channel()
        ch.queue_declare("work", durable=True)
        ch.queue_declare(
            "waiting",
            durable=True,
            arguments={
                "x-message-ttl": 500,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "work",
            },
        )
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("", "waiting", f"retry {i}".encode())
    reasons: list[str] = []
    got: list[bytes] = []
    with connect(b) as conn:
        ch = conn.channel()
        for method, props, body in ch.consume("work", inactivity_timeout=WAIT):
            assert method is not None, f"only {len(got)} of 30 within {WAIT} s"
            ch.basic_ack(method.delivery_tag)
            got.append(body)
            reasons.append(props.headers["x-death"][0]["reason"])
            if len(got) == 30:
                break
        ch.cancel()
        assert ch.queue_declare("waiting", passive=True).method.message_count == 0
    assert Counter(got) == Counter(f"retry {i}".encode() for i in range(30))
    assert set(reasons) == {"expired"}
