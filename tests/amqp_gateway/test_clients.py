"""Other AMQP 0-9-1 clients on the gateway and on RabbitMQ: kombu (py-amqp), a Celery
worker with the rpc:// result backend, and Node's amqplib.

Every test runs on ``broker`` (both servers) and checks the same observable results.
Where the gateway differs from RabbitMQ, the test says so with ``@gateway_bug(...)``: a
strict xfail on the gateway only, so it turns into a failure once the gateway is fixed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import Broker, Names

HERE = Path(__file__).resolve().parent


from celery.exceptions import TimeoutError as CeleryTimeoutError  # noqa: E402
from celery.result import AsyncResult  # noqa: E402
from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402
from kombu.message import Message as KombuMessage  # noqa: E402
from kombu.simple import SimpleQueue  # noqa: E402

from .celery_app import ADD, BROKER_ENV, REMOTE_CONTROL_ENV, make_app  # noqa: E402

WAIT = 30.0
REPO = HERE.parent.parent
NODE_MODULES = REPO / "tests" / "interop" / "node_modules"


def kombu_url(broker: Broker) -> str:
    """The broker as a kombu URL on py-amqp (``//`` at the end: the vhost ``/``)."""
    return f"pyamqp://guest:guest@{broker.host}:{broker.port}//"


@pytest.fixture
def kombu_conn(broker: Broker) -> Iterator[Connection]:
    with Connection(kombu_url(broker), connect_timeout=WAIT) as conn:
        conn.ensure_connection(max_retries=1)
        yield conn


def gateway_bug(reason: str) -> pytest.MarkDecorator:
    """Run on both servers, the gateway's run an expected failure (strict: it flips when
    the gateway is fixed)."""
    return pytest.mark.parametrize(
        "broker",
        [
            pytest.param(
                "fsbus", marks=pytest.mark.xfail(strict=True, reason=f"gateway: {reason}")
            ),
            "rabbitmq",
        ],
        indirect=True,
    )


def drained(count: Callable[[], int], name: str) -> None:
    """Wait until ``count()`` (a queue's message_count) is 0; fail after WAIT seconds.

    RabbitMQ says 0 as soon as the last ack is in. The gateway can count a message whose
    ack it is writing (the file is still there), so for a moment it can say more.
    """
    deadline = time.monotonic() + WAIT
    while (n := count()) != 0:
        assert time.monotonic() < deadline, f"{name} still counts {n} messages after {WAIT} s"
        time.sleep(0.05)


# ---------------------------------------------------------------------------- kombu


def test_kombu_producer_consumer_topic(kombu_conn: Connection, names: Names) -> None:
    exchange = Exchange(names("kombu-news"), type="topic", durable=True)
    queue = Queue(names("kombu-sport"), exchange, routing_key="news.sport.#", durable=True)
    sent = [{"n": i, "text": f"goal {i}"} for i in range(20)]
    with kombu_conn.channel() as channel:
        producer = Producer(channel, exchange=exchange, serializer="json")
        for i, body in enumerate(sent):
            producer.publish(
                body,
                routing_key=f"news.sport.{'football' if i % 2 else 'tennis'}",
                declare=[queue],
                delivery_mode=2,
                headers={"i": i},
            )
        # not bound: never reaches the queue
        producer.publish({"n": -1}, routing_key="news.weather", declare=[queue])
        producer.publish({"n": -2}, routing_key="sport.news", declare=[queue])

    got: list[dict[str, Any]] = []
    keys: list[str] = []

    def on_message(body: dict[str, Any], message: KombuMessage) -> None:
        assert message.headers["i"] == body["n"]
        assert message.content_type == "application/json"
        assert message.delivery_info["exchange"] == exchange.name
        got.append(body)
        keys.append(message.delivery_info["routing_key"])
        message.ack()

    deadline = time.monotonic() + WAIT
    with Consumer(kombu_conn, queues=[queue], callbacks=[on_message], accept=["json"]):
        while len(got) < len(sent):
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(got)} of {len(sent)} messages within {WAIT} s"
            try:
                kombu_conn.drain_events(timeout=min(left, 1.0))
            except TimeoutError:
                continue
        # nothing more comes: the two unbound keys were not routed here
        with pytest.raises(TimeoutError):
            kombu_conn.drain_events(timeout=0.5)
    assert got == sent
    assert Counter(keys) == {"news.sport.football": 10, "news.sport.tennis": 10}
    with kombu_conn.channel() as channel:
        bound = queue(channel)
        drained(lambda: bound.queue_declare(passive=True).message_count, bound.name)
        bound.delete()
        exchange(channel).delete()


@contextmanager
def simple_queue(broker: Broker, name: str, **transport: Any) -> Iterator[SimpleQueue]:
    """A kombu SimpleQueue (a durable direct exchange and queue, both named ``name``) on a
    connection whose publishes wait for the broker's confirm, so a put is in the queue
    when it returns. Both are deleted at the end, from a connection of their own."""
    options = {"confirm_publish": True, **transport}
    try:
        with Connection(kombu_url(broker), transport_options=options) as conn:
            queue = conn.SimpleQueue(name)
            try:
                yield queue
            finally:
                queue.close()
    finally:
        with Connection(kombu_url(broker)) as conn, conn.channel() as channel:
            Queue(name, Exchange(name), name)(channel).delete()
            Exchange(name)(channel).delete()


def test_kombu_simple_queue(broker: Broker, names: Names) -> None:
    """put; qsize; get (basic.consume and drain_events) with ack; Empty when drained."""
    with simple_queue(broker, names("kombu-simple")) as queue:
        for i in range(10):
            queue.put({"hello": i})
        assert queue.qsize() == 10
        got = []
        for _ in range(10):
            message = queue.get(block=True, timeout=WAIT)
            got.append(message.payload)
            message.ack()
        assert got == [{"hello": i} for i in range(10)]
        with pytest.raises(queue.Empty):
            queue.get(block=True, timeout=0.5)
        with pytest.raises(queue.Empty):
            queue.get_nowait()  # basic.get on an empty queue: get-empty


def test_kombu_simple_queue_qsize_leaves_out_unacked(broker: Broker, names: Names) -> None:
    with simple_queue(broker, names("kombu-qsize")) as queue:
        queue.consumer.qos(prefetch_count=1)
        for i in range(3):
            queue.put({"hello": i})
        assert queue.qsize() == 3
        first = queue.get(block=True, timeout=WAIT)  # held, not acked yet
        assert first.payload == {"hello": 0}
        assert queue.qsize() == 2
        first.ack()
        rest = []
        for _ in range(2):  # prefetch 1: the next comes once this one is acked
            message = queue.get(block=True, timeout=WAIT)
            rest.append(message.payload)
            message.ack()
        assert rest == [{"hello": 1}, {"hello": 2}]


def test_kombu_simple_queue_get_nowait(broker: Broker, names: Names) -> None:
    """get_nowait is basic.get: each message once, in order, acked."""
    # a read timeout, so a get-ok that never comes fails the test instead of hanging it
    with simple_queue(broker, names("kombu-get"), read_timeout=WAIT) as queue:
        for i in range(10):
            queue.put({"hello": i})
        got = []
        for _ in range(10):
            message = queue.get_nowait()
            got.append((message.payload, message.delivery_info["redelivered"]))
            message.ack()
        with pytest.raises(queue.Empty):
            queue.get_nowait()
        # nothing acked comes back to a consumer either
        with pytest.raises(queue.Empty):
            queue.get(block=True, timeout=1.0)
    assert got == [({"hello": i}, False) for i in range(10)]


def test_kombu_queue_get_auto_delete(broker: Broker, names: Names) -> None:
    """kombu.Queue.get (basic.get) on an auto-delete queue: RabbitMQ deletes such a queue
    when its last consumer is cancelled, and basic.get is no consumer."""
    exchange = Exchange(names("kombu-ad"), type="direct", auto_delete=True)
    queue = Queue(names("kombu-ad"), exchange, routing_key="k", auto_delete=True)
    options = {"confirm_publish": True, "read_timeout": WAIT}
    with Connection(kombu_url(broker), transport_options=options) as conn:
        with conn.channel() as channel:
            producer = Producer(channel, exchange=exchange, serializer="json")
            for i in range(3):
                producer.publish({"n": i}, routing_key="k", declare=[queue])
            bound = queue(channel)
            got = []
            for _ in range(3):
                message = bound.get()
                assert message is not None, f"get-empty after {got}"
                got.append(message.payload["n"])
                message.ack()
                # the queue stays (a passive declare of a queue that is gone is a 404)
                until = time.monotonic() + 1.0
                while time.monotonic() < until:
                    bound.queue_declare(passive=True)
                    time.sleep(0.1)
            assert got == [0, 1, 2]
            assert bound.get() is None
            bound.delete()
            exchange(channel).delete()


# ---------------------------------------------------------------------------- Celery


@dataclass
class Worker:
    queue: str
    log: Path
    proc: subprocess.Popen[bytes]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def celery_worker(broker: Broker, names: Names, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """``celery_worker(remote_control=True)`` starts a real ``celery worker`` (solo pool)
    on ``broker``, consuming a queue of this test's own. It is stopped at the end with
    SIGTERM (a warm shutdown), then SIGKILL."""
    started: list[Worker] = []

    def start(*, remote_control: bool = True) -> Worker:
        queue = names(f"celery{len(started)}")
        log = tmp_path / f"{queue}.log"
        env = {
            **os.environ,
            BROKER_ENV: kombu_url(broker),
            REMOTE_CONTROL_ENV: "1" if remote_control else "0",
            "PYTHONPATH": str(REPO),
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.amqp_gateway.celery_app",
                    "worker",
                    "--pool=solo",
                    "--concurrency=1",
                    "-Q",
                    queue,
                    "-n",
                    f"{queue}@%h",
                    "--loglevel=INFO",
                ],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(Worker(queue, log, proc))
        return started[-1]

    try:
        yield start
    finally:
        for worker in started:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
            try:
                worker.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
        if broker.kind == "rabbitmq":  # the session's server outlives the test
            with Connection(kombu_url(broker)) as conn, conn.channel() as channel:
                for worker in started:
                    Queue(worker.queue)(channel).delete()
                    Exchange(worker.queue)(channel).delete()


def result_of(result: AsyncResult, worker: Worker) -> Any:
    """The task's result, or fail as soon as the worker is dead or WAIT seconds passed."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return result.get(timeout=0.5)
        except CeleryTimeoutError:
            if worker.proc.poll() is not None:
                pytest.fail(
                    f"the worker exited ({worker.proc.returncode}); it said:\n{worker.output()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no result within {WAIT} s; the worker said:\n{worker.output()}")


def run_adds(broker: Broker, worker: Worker) -> None:
    """``add(2, 3)`` then ten more, each result back through the rpc:// backend."""
    client = make_app(kombu_url(broker))
    try:
        first = client.send_task(ADD, args=(2, 3), queue=worker.queue)
        assert result_of(first, worker) == 5
        results = [client.send_task(ADD, args=(i, 100), queue=worker.queue) for i in range(10)]
        assert [result_of(r, worker) for r in results] == [i + 100 for i in range(10)]
        assert all(r.successful() for r in [first, *results])
    finally:
        client.backend.result_consumer.stop()  # its own connection: app.close() leaves it
        client.close()
    assert "ready." in worker.output()


def test_celery_worker_rpc_result(broker: Broker, celery_worker: Callable[..., Worker]) -> None:
    """A worker with remote control on: its pidbox queue ('<name>@<host>.celery.pidbox')
    is not an fsbus queue name as it is; the gateway escapes it."""
    run_adds(broker, celery_worker())


def test_celery_worker_rpc_result_without_remote_control(
    broker: Broker, celery_worker: Callable[..., Worker]
) -> None:
    """The same with remote control off (no pidbox queue): tasks and rpc:// results."""
    run_adds(broker, celery_worker(remote_control=False))


# ---------------------------------------------------------------------------- amqplib


@pytest.fixture
def node() -> str:
    """The node executable (the test is skipped, saying why, without node or amqplib)."""
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not on PATH: the amqplib test needs Node.js 18+")
    if not (NODE_MODULES / "amqplib" / "package.json").exists():
        pytest.skip(
            "amqplib is not installed in tests/interop/node_modules: run "
            "`cd tests/interop && npm install`"
        )
    return exe


def test_amqplib_send_and_consume(broker: Broker, names: Names, node: str) -> None:
    queue = names("amqplib")
    try:
        done = subprocess.run(
            [node, str(HERE / "amqplib_client.js"), broker.url, queue, "10"],
            capture_output=True,
            timeout=WAIT + 30,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"amqplib_client.js did not finish: {exc.stdout!r} {exc.stderr!r}")
    events = [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]
    report = f"exit {done.returncode}; stdout: {events}; stderr: {done.stderr.decode()}"
    assert done.returncode == 0, report
    kinds = [e["event"] for e in events]
    assert kinds == ["connected", "asserted", "sent"] + ["received"] * 10 + ["done"], report
    assert events[1] == {"event": "asserted", "queue": queue, "messageCount": 0}
    received = [e for e in events if e["event"] == "received"]
    assert [e["body"] for e in received] == [f"message {i}" for i in range(10)]
    assert [e["messageId"] for e in received] == [f"m{i}" for i in range(10)]
    assert [e["headers"] for e in received] == [{"i": i} for i in range(10)]
    assert {e["contentType"] for e in received} == {"text/plain"}
    assert not any(e["redelivered"] for e in received)
    assert events[-1] == {"event": "done", "received": 10, "messageCount": 0}
