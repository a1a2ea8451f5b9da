"""RabbitMQ's six tutorials with aio-pika (asyncio), on the gateway and on RabbitMQ.

Each tutorial counts every message it publishes and checks that exactly those arrive
(and that the queues are left empty); every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aio_pika
import anyio
import pytest
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)

from .conftest import Broker, Names

WAIT = 30.0


@asynccontextmanager
async def connect(broker: Broker) -> AsyncIterator[AbstractConnection]:
    """A plain connection: connect_robust's channels name queues themselves ("amq_<hex>"),
    and the tutorials want server-named ones ("amq.gen-...")."""
    connection = await aio_pika.connect(broker.url)
    async with connection:
        yield connection


async def take(queue: AbstractQueue, n: int) -> list[bytes]:
    """Consume ``n`` messages of ``queue`` (acking each), or fail after WAIT seconds."""
    got: list[bytes] = []
    try:
        with anyio.fail_after(WAIT):
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == n:
                        break
    except TimeoutError:
        pytest.fail(f"only {len(got)} of {n} messages of {queue.name} within {WAIT} s: {got}")
    return got


async def drained(channel: AbstractChannel, name: str) -> None:
    """Wait until a passive declare of queue ``name`` counts no message (fail after WAIT s).

    RabbitMQ says 0 as soon as the last ack is in. The gateway can count a message whose
    ack it is writing (the file is still there), so right after the last ack it can still
    say 1 or more for a moment.
    """
    count = None
    try:
        with anyio.fail_after(WAIT):
            while True:
                queue = await channel.declare_queue(name, passive=True)
                count = queue.declaration_result.message_count
                if count == 0:
                    return
                await anyio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"{name} still counts {count} messages after {WAIT} s")


@pytest.mark.asyncio
async def test_1_hello_world(broker: Broker, names: Names) -> None:
    queue_name = names("hello")
    async with connect(broker) as conn:
        channel = await conn.channel()
        await channel.declare_queue(queue_name)
        await channel.default_exchange.publish(
            aio_pika.Message(body=b"Hello World!"), routing_key=queue_name
        )
    async with connect(broker) as conn:
        channel = await conn.channel()
        queue = await channel.declare_queue(queue_name)
        assert await take(queue, 1) == [b"Hello World!"]
        await drained(channel, queue_name)
        await queue.delete()


@pytest.mark.asyncio
async def test_2_work_queues(broker: Broker, names: Names) -> None:
    queue_name = names("task_queue")
    tasks = [f"task {i}{'.' * (i % 3)}".encode() for i in range(60)]
    done: list[tuple[int, bytes]] = []
    all_done = asyncio.Event()

    async with connect(broker) as w0, connect(broker) as w1, connect(broker) as producer:
        for n, conn in enumerate((w0, w1)):
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=1)
            queue = await channel.declare_queue(queue_name, durable=True)

            async def callback(message: AbstractIncomingMessage, n: int = n) -> None:
                async with message.process():
                    # the tutorial's "work": a short pause per dot
                    await asyncio.sleep(0.002 * message.body.count(b"."))
                    done.append((n, message.body))
                    if len(done) >= len(tasks):
                        all_done.set()

            await queue.consume(callback)

        channel = await producer.channel()
        await channel.declare_queue(queue_name, durable=True)
        for body in tasks:
            await channel.default_exchange.publish(
                aio_pika.Message(body=body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue_name,
            )
        try:
            await asyncio.wait_for(all_done.wait(), WAIT)
        except TimeoutError:
            pytest.fail(f"only {len(done)} of {len(tasks)} tasks done within {WAIT} s")
        await drained(channel, queue_name)
        await channel.queue_delete(queue_name)
    assert Counter(b for _, b in done) == Counter(tasks)
    assert {n for n, _ in done} == {0, 1}, "both workers took tasks"


@pytest.mark.asyncio
async def test_3_publish_subscribe(broker: Broker, names: Names) -> None:
    exchange_name = names("logs")
    async with connect(broker) as conn:
        channel = await conn.channel()
        logs = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.FANOUT)
        queues = []
        for _ in range(2):
            queue = await channel.declare_queue(exclusive=True)
            assert queue.name.startswith("amq.gen-")
            await queue.bind(logs)
            queues.append(queue)
        for i in range(5):
            await logs.publish(aio_pika.Message(body=f"log {i}".encode()), routing_key="")
        for queue in queues:
            assert await take(queue, 5) == [f"log {i}".encode() for i in range(5)]
            await drained(channel, queue.name)
        await logs.delete()


@pytest.mark.asyncio
async def test_4_routing(broker: Broker, names: Names) -> None:
    exchange_name = names("direct_logs")
    async with connect(broker) as conn:
        channel = await conn.channel()
        direct = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.DIRECT)
        errors = await channel.declare_queue(exclusive=True)
        everything = await channel.declare_queue(exclusive=True)
        await errors.bind(direct, routing_key="error")
        for severity in ("info", "warning", "error"):
            await everything.bind(direct, routing_key=severity)
        for severity in ("info", "error", "warning", "debug", "error.x", "*"):
            await direct.publish(aio_pika.Message(body=severity.encode()), routing_key=severity)
        assert await take(errors, 1) == [b"error"]
        assert await take(everything, 3) == [b"info", b"error", b"warning"]
        await drained(channel, errors.name)
        await drained(channel, everything.name)
        await direct.delete()


@pytest.mark.asyncio
async def test_5_topics(broker: Broker, names: Names) -> None:
    exchange_name = names("topic_logs")
    async with connect(broker) as conn:
        channel = await conn.channel()
        topic = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC)
        q1 = await channel.declare_queue(exclusive=True)
        q2 = await channel.declare_queue(exclusive=True)
        await q1.bind(topic, routing_key="*.orange.*")
        await q2.bind(topic, routing_key="*.*.rabbit")
        await q2.bind(topic, routing_key="lazy.#")
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
            await topic.publish(aio_pika.Message(body=key.encode()), routing_key=key)
        assert await take(q1, 3) == [
            b"quick.orange.rabbit",
            b"lazy.orange.elephant",
            b"quick.orange.fox",
        ]
        assert await take(q2, 5) == [
            b"quick.orange.rabbit",
            b"lazy.orange.elephant",
            b"lazy.brown.fox",
            b"lazy.orange.male.rabbit",
            b"lazy",
        ]
        await drained(channel, q1.name)
        await drained(channel, q2.name)
        await topic.delete()


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


@pytest.mark.asyncio
async def test_6_rpc(broker: Broker, names: Names) -> None:
    rpc_queue = names("rpc_queue")
    served: list[bytes] = []

    async with connect(broker) as server_conn, connect(broker) as client_conn:
        # the server: one request at a time, answers to reply_to with the correlation_id
        server = await server_conn.channel()
        await server.set_qos(prefetch_count=1)
        requests = await server.declare_queue(rpc_queue)

        async def on_request(message: AbstractIncomingMessage) -> None:
            async with message.process(requeue=False):
                assert message.reply_to is not None
                served.append(message.body)
                await server.default_exchange.publish(
                    aio_pika.Message(
                        body=str(fib(int(message.body))).encode(),
                        correlation_id=message.correlation_id,
                    ),
                    routing_key=message.reply_to,
                )

        await requests.consume(on_request)

        # the client: an exclusive callback queue, a future per correlation_id
        client = await client_conn.channel()
        callback_queue = await client.declare_queue(exclusive=True)
        assert callback_queue.name.startswith("amq.gen-")
        futures: dict[str, asyncio.Future[bytes]] = {}
        strays: list[AbstractIncomingMessage] = []

        async def on_response(message: AbstractIncomingMessage) -> None:
            future = futures.get(message.correlation_id or "")
            if future is None or future.done():
                strays.append(message)
            else:
                future.set_result(message.body)

        await callback_queue.consume(on_response, no_ack=True)

        async def call(n: int) -> int:
            corr_id = str(uuid.uuid4())
            futures[corr_id] = asyncio.get_running_loop().create_future()
            await client.default_exchange.publish(
                aio_pika.Message(
                    body=str(n).encode(),
                    content_type="text/plain",
                    correlation_id=corr_id,
                    reply_to=callback_queue.name,
                ),
                routing_key=rpc_queue,
            )
            return int(await asyncio.wait_for(futures[corr_id], WAIT))

        assert await call(1) == 1
        assert await call(10) == 55
        # several calls in flight at once: each answer finds its caller
        ns = [20, 3, 15, 7, 0]
        assert await asyncio.gather(*(call(n) for n in ns)) == [fib(n) for n in ns]
        assert strays == []
        assert Counter(served) == Counter(str(n).encode() for n in [1, 10, *ns])
        await server.queue_delete(rpc_queue)
