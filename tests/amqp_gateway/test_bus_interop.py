"""The gateway and the bus side by side: one directory, AMQP clients and fsbus peers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pika
import pytest

from fsbus import BlockingBus, Bus, Message
from fsbus._core.topics import MAX_WORDS
from fsbus.amqp import running
from fsbus.amqp._routing import DEAD_QUEUE, TOPIC_WORDS

from .conftest import Broker

WAIT = 20.0


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def drain(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int) -> list[bytes]:
    got = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=WAIT):
        assert method is not None, f"only {len(got)} of {n} within {WAIT} s"
        ch.basic_ack(method.delivery_tag)
        got.append(body)
        if len(got) == n:
            break
    ch.cancel()
    return got


@pytest.mark.asyncio
async def test_amq_topic_is_the_bus(gateway: Broker) -> None:
    """AMQP publishes on amq.topic reach fsbus subscribers of the routing key; bus
    publishes reach AMQP queues bound to amq.topic, with fsbus headers as AMQP headers."""
    assert gateway.root is not None
    got: list[Message] = []
    arrived = anyio.Event()

    async def on_order(msg: Message) -> None:
        got.append(msg)
        arrived.set()

    async with Bus(gateway.root) as bus:
        await bus.subscribe("orders.*", on_order)

        def amqp_side() -> list[tuple[bytes, dict]]:
            with connect(gateway.url) as conn:
                ch = conn.channel()
                q = ch.queue_declare("", exclusive=True).method.queue
                ch.queue_bind(q, "amq.topic", "invoices.#")
                ch.basic_publish("amq.topic", "orders.new", b"from amqp")
                out = []
                for method, props, body in ch.consume(q, inactivity_timeout=WAIT):
                    assert method is not None
                    ch.basic_ack(method.delivery_tag)
                    out.append((body, props.headers, method.routing_key, method.exchange))
                    break
                ch.cancel()
                return out

        async with anyio.create_task_group() as tg:
            result: list = []

            async def run() -> None:
                result.extend(await anyio.to_thread.run_sync(amqp_side))

            tg.start_soon(run)
            with anyio.fail_after(WAIT):
                await arrived.wait()
            # the AMQP queue exists now (bound before publishing): publish from the bus
            with anyio.fail_after(WAIT):
                while not bus.routes("invoices.eu.paid"):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            await bus.publish("invoices.eu.paid", b"from fsbus", headers={"k": "v"})
    assert [m.payload for m in got] == [b"from amqp"]
    assert got[0].topic == "orders.new"
    assert result == [(b"from fsbus", {"k": "v"}, "invoices.eu.paid", "amq.topic")]


def test_fsbus_and_amqp_consumers_compete_on_one_queue(gateway: Broker) -> None:
    assert gateway.root is not None
    with (
        BlockingBus(gateway.root) as bus,
        connect(gateway.url) as conn,
        connect(gateway.url) as pub_conn,
    ):
        ch = conn.channel()
        ch.queue_declare("shared", durable=True)
        ch.basic_qos(prefetch_count=1)
        amqp_got: list[bytes] = []
        bus_got: list[bytes] = []
        ch.basic_consume(
            "shared",
            lambda c, m, _p, b: (amqp_got.append(b), c.basic_ack(m.delivery_tag)),
        )
        pub = pub_conn.channel()
        with bus.messages(queue="shared") as it:
            for i in range(200):
                pub.basic_publish("", "shared", str(i).encode())
            deadline = time.monotonic() + WAIT
            while len(amqp_got) + len(bus_got) < 200:
                assert time.monotonic() < deadline, (len(amqp_got), len(bus_got))
                conn.process_data_events(time_limit=0.005)
                try:
                    msg = it.get(timeout=0.005)
                except TimeoutError:
                    continue
                bus_got.append(msg.payload)
                it.ack(msg)
        assert Counter(amqp_got + bus_got) == Counter(str(i).encode() for i in range(200))
        assert amqp_got, "the AMQP consumer took a share"
        assert bus_got, "the fsbus consumer took a share"
        ch.queue_delete("shared")


def test_deleting_a_queue_the_bus_already_deleted_is_a_delete_ok(gateway: Broker) -> None:
    """A queue declared through the gateway and deleted with the Python API: a
    ``queue.delete`` of it, with or without its flags, answers delete-ok (0 messages), as
    RabbitMQ answers for a queue that is not there, and the queue is gone for AMQP too.
    Declared again through the gateway, it takes publishes (the gateway had kept the
    deleted queue's bus open for its publishes and went on writing into it)."""
    assert gateway.root is not None
    with BlockingBus(gateway.root) as bus, connect(gateway.url) as conn:
        ch = conn.channel()
        for flags in ({}, {"if_unused": True, "if_empty": True}):
            ch.queue_declare("gone-meanwhile", durable=True)
            ch.basic_publish("", "gone-meanwhile", b"lost with its queue")
            deadline = time.monotonic() + WAIT
            while ch.queue_declare("gone-meanwhile", passive=True).method.message_count < 1:
                assert time.monotonic() < deadline
            assert bus.delete_queue("gone-meanwhile") == 1
            assert ch.queue_delete("gone-meanwhile", **flags).method.message_count == 0
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
                ch.queue_declare("gone-meanwhile", passive=True)
            assert gone.value.reply_code == 404
            ch = conn.channel()


def test_a_delivery_limit_reached_while_no_gateway_runs(tmp_path: Path) -> None:
    """An fsbus consumer of an AMQP queue with ``x-delivery-limit`` fails a message the
    limit and one more times while no gateway runs: it waits on the bus, and the next
    gateway to start takes it to the queue's dead-letter exchange, once, with its
    ``x-death``."""
    root = tmp_path / "bus"
    with running(root) as gw, connect(gw.url) as conn:
        ch = conn.channel()
        ch.exchange_declare("parking", "fanout")
        ch.queue_declare("parked", durable=True)
        ch.queue_bind("parked", "parking")
        ch.queue_declare(
            "limited",
            durable=True,
            arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": "parking"},
        )
        ch.confirm_delivery()
        ch.basic_publish("", "limited", b"poison", pika.BasicProperties(delivery_mode=2))
    failures = 0
    with BlockingBus(root) as bus, bus.messages(queue="limited") as it:
        while failures < 2:
            msg = it.get(timeout=WAIT)
            failures += 1
            it.release(msg)  # a failed delivery: the second one is the last
        with pytest.raises(TimeoutError):
            it.get(timeout=0.5)  # not delivered a third time
    with running(root) as gw, connect(gw.url) as conn:
        ch = conn.channel()
        got: list[tuple[bytes, str]] = []
        deadline = time.monotonic() + WAIT
        while not got:
            assert time.monotonic() < deadline, "not dead-lettered"
            method, props, body = ch.basic_get("parked", auto_ack=True)
            if method is None:
                conn.process_data_events(time_limit=0.05)
                continue
            got.append((body, props.headers["x-death"][0]["reason"]))
        assert got == [(b"poison", "delivery_limit")]
        extra = ch.basic_get("parked", auto_ack=True)
        assert extra[0] is None, extra


def test_messages_that_expire_while_no_gateway_runs_are_dead_lettered_by_the_next(
    tmp_path: Path,
) -> None:
    """An AMQP queue with ``x-message-ttl`` and a dead-letter exchange; its messages
    expire while only a plain fsbus process has the bus open. That process sends them
    into the gateways' own queue (it knows no exchanges); the next gateway to start takes
    each to the dead-letter exchange, once, in order, with its ``x-death`` (reason
    ``expired``) and its properties as published."""
    root = tmp_path / "bus"
    with running(root) as gw, connect(gw.url) as conn:
        ch = conn.channel()
        ch.exchange_declare("later", "fanout")
        ch.queue_declare("retried", durable=True)
        ch.queue_bind("retried", "later")
        ch.queue_declare(
            "waiting",
            durable=True,
            arguments={"x-message-ttl": 5_000, "x-dead-letter-exchange": "later"},
        )
        ch.confirm_delivery()
        for i in range(5):
            props = pika.BasicProperties(delivery_mode=2, correlation_id=f"c{i}")
            ch.basic_publish("", "waiting", str(i).encode(), props)

    async def pass_them_on() -> None:
        # (5 s: the gateway above is gone long before they expire)
        async with Bus(root) as bus:
            with anyio.fail_after(WAIT):  # sent into the gateways' queue
                while (await bus.queue_info(DEAD_QUEUE)).depth < 5:  # noqa: ASYNC110
                    await anyio.sleep(0.05)

    anyio.run(pass_them_on)
    with running(root) as gw, connect(gw.url) as conn:
        ch = conn.channel()
        got: list[tuple[bytes, str, str | None]] = []
        deadline = time.monotonic() + WAIT
        while len(got) < 5:
            assert time.monotonic() < deadline, f"only {got} dead-lettered"
            method, props, body = ch.basic_get("retried", auto_ack=True)
            if method is None:
                conn.process_data_events(time_limit=0.05)
                continue
            got.append((body, props.headers["x-death"][0]["reason"], props.correlation_id))
        assert got == [(str(i).encode(), "expired", f"c{i}") for i in range(5)]
        extra = ch.basic_get("retried", auto_ack=True)
        assert extra[0] is None, extra
        assert ch.queue_declare("waiting", passive=True).method.message_count == 0


def test_a_queue_name_outside_fsbus_rules_is_escaped(gateway: Broker) -> None:
    """An AMQP queue named 'w@host/x' is the fsbus queue 'w:40host:2fx' (the kombu
    transport's name for it too); clients see the name they gave."""
    assert gateway.root is not None
    name = "w@host/x.celery.pidbox"
    with BlockingBus(gateway.root) as bus, connect(gateway.url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        assert ch.queue_declare(name, auto_delete=True).method.queue == name
        ch.basic_publish("", name, b"hello")
        info = bus.queue_info("w:40host:2fx.celery.pidbox")
        assert info.depth == 1
        with bus.messages(queue="w:40host:2fx.celery.pidbox") as it:
            msg = it.get(timeout=WAIT)
            assert msg.payload == b"hello"
            it.ack(msg)
        ch.basic_publish("", name, b"again")
        assert drain(ch, name, 1) == [b"again"]
        # its last consumer left: auto-deleted (the fsbus one had left before)
        deadline = time.monotonic() + WAIT
        code = None
        while code is None and time.monotonic() < deadline:
            try:
                ch.queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                code = exc.reply_code
            time.sleep(0.02)
        assert code == 404


def test_durable_state_survives_a_restart_and_two_gateways_share_it(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    with running(root) as first:
        with connect(first.url) as conn:
            ch = conn.channel()
            ch.exchange_declare("events", "topic", durable=True)
            ch.queue_declare("audit", durable=True)
            ch.queue_bind("audit", "events", "user.*")
    with running(root) as second, running(root) as third:
        with connect(second.url) as pub, connect(third.url) as sub:
            ch = pub.channel()
            ch.exchange_declare("events", "topic", passive=True)
            for i in range(10):
                ch.basic_publish("events", "user.login", str(i).encode())
            ch.basic_publish("events", "order.new", b"not bound")
            assert drain(sub.channel(), "audit", 10) == [str(i).encode() for i in range(10)]


def test_the_command_serves_until_sigterm(tmp_path: Path) -> None:
    """``fsbus amqp --root DIR --listen HOST:PORT`` as a user runs it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fsbus",
            "amqp",
            "--root",
            str(tmp_path / "bus"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"127.0.0.1:{port}" in line, line
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/") as conn:
            ch = conn.channel()
            ch.queue_declare("hello")
            ch.basic_publish("", "hello", b"hi")
            assert drain(ch, "hello", 1) == [b"hi"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 128 + signal.SIGTERM or proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert os.path.isdir(tmp_path / "bus" / "fsbus" / "amqp")


def test_topic_keys_longer_than_a_bus_topic_are_refused_naming_the_limit(gateway: Broker) -> None:
    """A bus topic holds at most 100 words (the bus's rule, which its qlobber-fsq peers
    need), and a declared topic exchange's keys take 2 of them (``amqp.<exchange>.``).
    RabbitMQ takes any key of 255 bytes; the gateway refuses a longer binding with 406
    naming the limit, and a longer publish reaches no queue (nacked under confirms)."""
    assert TOPIC_WORDS == MAX_WORDS

    def key(words: int) -> str:
        return ".".join(["a"] * words)

    with connect(gateway.url) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("ev", "topic")
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "ev", key(98))
        ch.basic_publish("ev", key(98), b"fits")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("ev", key(99), b"too long")
        assert ch.queue_declare(q, passive=True).method.message_count == 1
        for exchange, most in (("ev", 98), ("amq.topic", 100)):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                conn.channel().queue_bind(q, exchange, key(most + 1))
            assert caught.value.reply_code == 406
            text = caught.value.reply_text
            assert f"a binding key of {most + 1} words" in text, text
            assert f"'{exchange}' takes keys of at most {most} words" in text, text
