"""Direct reply-to (``amq.rabbitmq.reply-to``) with pika, on the gateway and on RabbitMQ:
an RPC client that declares no reply queue gets every answer once, and the misuses get
RabbitMQ's 406."""

from __future__ import annotations

import threading
import time
import uuid

import pika
import pika.exceptions
import pytest

from .conftest import Broker, Names

WAIT = 30.0
REPLY_TO = "amq.rabbitmq.reply-to"


def test_rpc_with_direct_reply_to(broker: Broker, names: Names) -> None:
    rpc_queue = names("rpc")
    serving = threading.Event()
    stop = threading.Event()
    seen_reply_to: list[str] = []

    def server() -> None:
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
            ch = conn.channel()
            ch.queue_declare(queue=rpc_queue)

            def on_request(
                _ch: object, method: object, props: pika.BasicProperties, body: bytes
            ) -> None:
                seen_reply_to.append(props.reply_to)
                ch.basic_publish(
                    exchange="",
                    routing_key=props.reply_to,
                    properties=pika.BasicProperties(correlation_id=props.correlation_id),
                    body=body.upper(),
                )
                ch.basic_ack(delivery_tag=method.delivery_tag)  # type: ignore[attr-defined]

            ch.basic_consume(queue=rpc_queue, on_message_callback=on_request)
            serving.set()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.05)
            ch.queue_delete(rpc_queue)

    t = threading.Thread(target=server)
    t.start()
    try:
        assert serving.wait(WAIT)
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
            ch = conn.channel()
            answers: dict[str, list[bytes]] = {}

            def on_response(
                _ch: object, _m: object, props: pika.BasicProperties, body: bytes
            ) -> None:
                answers.setdefault(props.correlation_id, []).append(body)

            ch.basic_consume(queue=REPLY_TO, on_message_callback=on_response, auto_ack=True)
            asked = {str(uuid.uuid4()): f"question {i}".encode() for i in range(20)}
            for corr_id, body in asked.items():
                ch.basic_publish(
                    exchange="",
                    routing_key=rpc_queue,
                    properties=pika.BasicProperties(reply_to=REPLY_TO, correlation_id=corr_id),
                    body=body,
                )
            deadline = time.monotonic() + WAIT
            while len(answers) < len(asked) and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.05)
            assert answers == {c: [b.upper()] for c, b in asked.items()}
    finally:
        stop.set()
        t.join()
    # the responder saw a reply-to of its own for the caller's channel
    assert len(set(seen_reply_to)) == 1
    assert seen_reply_to[0].startswith(REPLY_TO + ".")


def test_reply_consumer_must_not_ack(broker: Broker) -> None:
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_consume(queue=REPLY_TO, on_message_callback=lambda *_: None)
        assert info.value.reply_code == 406


def test_publishing_with_direct_reply_to_needs_its_consumer(broker: Broker, names: Names) -> None:
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        q = ch.queue_declare(queue=names("rpc-no-consumer")).method.queue
        ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to=REPLY_TO))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare(queue=q, passive=True)  # a round trip: the close arrives
        assert info.value.reply_code == 406
        ch = conn.channel()
        ch.queue_delete(q)
