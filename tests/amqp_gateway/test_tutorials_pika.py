"""RabbitMQ's six tutorials with pika, unchanged, on the gateway and on RabbitMQ."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pika

from .conftest import Broker, Names

WAIT = 30.0


def connect(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def take(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int) -> list[bytes]:
    """Consume ``n`` messages of ``queue`` (acking each), or fail after WAIT seconds."""
    got: list[bytes] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=WAIT):
        assert method is not None, f"only {len(got)} of {n} messages within {WAIT} s: {got}"
        ch.basic_ack(method.delivery_tag)
        got.append(body)
        if len(got) == n:
            break
    ch.cancel()
    return got


def test_1_hello_world(broker: Broker, names: Names) -> None:
    queue = names("hello")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue)
        ch.basic_publish(exchange="", routing_key=queue, body=b"Hello World!")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue)
        assert take(ch, queue, 1) == [b"Hello World!"]
        ch.queue_delete(queue)


def test_2_work_queues(broker: Broker, names: Names) -> None:
    queue = names("task_queue")
    tasks = [f"task {i}{'.' * (i % 3)}".encode() for i in range(60)]
    done: list[tuple[int, bytes]] = []
    lock = threading.Lock()
    stop = threading.Event()
    ready = threading.Barrier(3)

    def worker(n: int) -> None:
        with connect(broker) as conn:
            ch = conn.channel()
            ch.queue_declare(queue=queue, durable=True)
            ch.basic_qos(prefetch_count=1)

            def callback(ch_: object, method: object, _props: object, body: bytes) -> None:
                with lock:
                    done.append((n, body))
                ch.basic_ack(delivery_tag=method.delivery_tag)  # type: ignore[attr-defined]

            ch.basic_consume(queue=queue, on_message_callback=callback)
            ready.wait()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.1)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    ready.wait()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(queue=queue, durable=True)
        for body in tasks:
            ch.basic_publish(
                exchange="",
                routing_key=queue,
                body=body,
                properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent),
            )
        start = time.monotonic()
        while len(done) < len(tasks) and time.monotonic() - start < WAIT:
            conn.process_data_events(time_limit=0.05)
        stop.set()
        for t in threads:
            t.join()
        ch.queue_delete(queue)
    assert Counter(b for _, b in done) == Counter(tasks)
    assert {n for n, _ in done} == {0, 1}, "both workers took tasks"


def test_3_publish_subscribe(broker: Broker, names: Names) -> None:
    exchange = names("logs")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange=exchange, exchange_type="fanout")
        queues = []
        for _ in range(2):
            result = ch.queue_declare(queue="", exclusive=True)
            assert result.method.queue.startswith("amq.gen-")
            ch.queue_bind(exchange=exchange, queue=result.method.queue)
            queues.append(result.method.queue)
        for i in range(5):
            ch.basic_publish(exchange=exchange, routing_key="", body=f"log {i}".encode())
        for q in queues:
            assert take(ch, q, 5) == [f"log {i}".encode() for i in range(5)]
        ch.exchange_delete(exchange)


def test_4_routing(broker: Broker, names: Names) -> None:
    exchange = names("direct_logs")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange=exchange, exchange_type="direct")
        errors = ch.queue_declare(queue="", exclusive=True).method.queue
        everything = ch.queue_declare(queue="", exclusive=True).method.queue
        ch.queue_bind(exchange=exchange, queue=errors, routing_key="error")
        for severity in ("info", "warning", "error"):
            ch.queue_bind(exchange=exchange, queue=everything, routing_key=severity)
        for severity in ("info", "error", "warning", "debug", "error.x", "*"):
            ch.basic_publish(exchange=exchange, routing_key=severity, body=severity.encode())
        assert take(ch, errors, 1) == [b"error"]
        assert take(ch, everything, 3) == [b"info", b"error", b"warning"]
        assert ch.queue_declare(queue=errors, passive=True).method.message_count == 0
        assert ch.queue_declare(queue=everything, passive=True).method.message_count == 0
        ch.exchange_delete(exchange)


def test_5_topics(broker: Broker, names: Names) -> None:
    exchange = names("topic_logs")
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange=exchange, exchange_type="topic")
        q1 = ch.queue_declare(queue="", exclusive=True).method.queue
        q2 = ch.queue_declare(queue="", exclusive=True).method.queue
        ch.queue_bind(exchange=exchange, queue=q1, routing_key="*.orange.*")
        ch.queue_bind(exchange=exchange, queue=q2, routing_key="*.*.rabbit")
        ch.queue_bind(exchange=exchange, queue=q2, routing_key="lazy.#")
        keys = [
            "quick.orange.rabbit",
            "lazy.orange.elephant",
            "quick.orange.fox",
            "lazy.brown.fox",
            "quick.brown.fox",
            "quick.orange.male.rabbit",
            "lazy.orange.male.rabbit",
            "lazy",
        ]
        for key in keys:
            ch.basic_publish(exchange=exchange, routing_key=key, body=key.encode())
        assert take(ch, q1, 3) == [
            b"quick.orange.rabbit",
            b"lazy.orange.elephant",
            b"quick.orange.fox",
        ]
        assert take(ch, q2, 5) == [
            b"quick.orange.rabbit",
            b"lazy.orange.elephant",
            b"lazy.brown.fox",
            b"lazy.orange.male.rabbit",
            b"lazy",
        ]
        ch.exchange_delete(exchange)


def test_6_rpc(broker: Broker, names: Names) -> None:
    rpc_queue = names("rpc_queue")
    serving = threading.Event()
    stop = threading.Event()

    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def server() -> None:
        with connect(broker) as conn:
            ch = conn.channel()
            ch.queue_declare(queue=rpc_queue)
            ch.basic_qos(prefetch_count=1)

            def on_request(
                ch_: object, method: object, props: pika.BasicProperties, body: bytes
            ) -> None:
                response = fib(int(body))
                ch.basic_publish(
                    exchange="",
                    routing_key=props.reply_to,
                    properties=pika.BasicProperties(correlation_id=props.correlation_id),
                    body=str(response).encode(),
                )
                ch.basic_ack(delivery_tag=method.delivery_tag)  # type: ignore[attr-defined]

            ch.basic_consume(queue=rpc_queue, on_message_callback=on_request)
            serving.set()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.1)
            ch.queue_delete(rpc_queue)

    t = threading.Thread(target=server)
    t.start()
    try:
        assert serving.wait(WAIT)
        with connect(broker) as conn:
            ch = conn.channel()
            callback_queue = ch.queue_declare(queue="", exclusive=True).method.queue
            answers: dict[str, bytes] = {}

            def on_response(
                _ch: object, _m: object, props: pika.BasicProperties, body: bytes
            ) -> None:
                answers[props.correlation_id] = body

            ch.basic_consume(queue=callback_queue, on_message_callback=on_response, auto_ack=True)
            for n in (1, 10, 20):
                corr_id = str(uuid.uuid4())
                ch.basic_publish(
                    exchange="",
                    routing_key=rpc_queue,
                    properties=pika.BasicProperties(
                        reply_to=callback_queue, correlation_id=corr_id
                    ),
                    body=str(n).encode(),
                )
                start = time.monotonic()
                while corr_id not in answers and time.monotonic() - start < WAIT:
                    conn.process_data_events(time_limit=0.05)
                assert answers[corr_id] == str(fib(n)).encode()
    finally:
        stop.set()
        t.join()
