"""RabbitMQ (rabbitmq-server from Debian) through pika: a topic exchange and a work queue.

Optional: the harness starts a private node on 127.0.0.1 (its own node name, ports, data
and log directories under a temp dir) and skips RabbitMQ with a note if it is not answering
within 30 s; it stops the node after the run. Publishes go to the topic exchange ``bench``
without publisher confirms (the fastest normal way); subscribers bind an exclusive queue
with ``bench.*`` and auto-ack; workers share one queue with prefetch 100 and ack each
message. Transient messages: the filesystem under test does not matter to it.

The in-process scenarios use aio-pika on one event loop and one connection: multi is the
topic exchange with an exclusive queue bound ``bench.*`` (no ack), single is one queue
with prefetch 100 and an ack per message; publishes (no confirms) come from 50 tasks; the
round trip has the ping and the echo consumers on the same channel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from bench.child import ID_WIDTH, Tally, make_payload, make_ping, ping_sent_at, ready, result
from bench.scenarios import Kind
from bench.systems.base import System
from bench.systems.redis_ import apt_install

START_TIMEOUT = 30.0
EXCHANGE = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _epmd_running() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 4369), timeout=1):
            return True
    except OSError:
        return False


class RabbitMQ(System):
    name: ClassVar[str] = "rabbitmq"
    label: ClassVar[str] = "RabbitMQ topic exchange (pika)"
    module: ClassVar[str] = "rabbitmq"
    uses_fs: ClassVar[bool] = False
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {
            "publish",
            "fanout",
            "workqueue",
            "latency",
            "inprocess",
            "inprocess_single",
            "latency_inprocess",
        }
    )

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._port = 0
        self._epmd_before = True

    def prepare(self) -> str | None:
        self._epmd_before = _epmd_running()
        if shutil.which("rabbitmq-server") is None:
            why = apt_install("rabbitmq-server")
            if why:
                return why
        self._dir = tempfile.mkdtemp(prefix="fsbus-bench-rabbit-")
        base = Path(self._dir)
        (base / "enabled_plugins").write_text("[].\n")
        self._port = _free_port()
        node = f"fsbusbench{os.getpid()}@localhost"
        env = {
            **os.environ,
            "HOME": str(base),
            "RABBITMQ_NODENAME": node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self._port),
            "RABBITMQ_DIST_PORT": str(_free_port()),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(base / "none"),
        }
        # Debian's /usr/sbin wrapper switches to the rabbitmq user; run the real script as us
        direct = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
        self._proc = subprocess.Popen(
            [str(direct) if direct.exists() else "rabbitmq-server"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import pika

        deadline = time.monotonic() + START_TIMEOUT
        params = pika.ConnectionParameters("127.0.0.1", self._port, connection_attempts=1)
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return f"rabbitmq-server exited ({self._proc.returncode}) while starting"
            try:
                pika.BlockingConnection(params).close()
            except pika.exceptions.AMQPError:
                time.sleep(0.25)
                continue
            self.extra_params = {"port": self._port}
            return None
        return f"RabbitMQ did not answer within {START_TIMEOUT:.0f} s"

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                self._proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._proc.wait()
        self._proc = None
        if not self._epmd_before and _epmd_running():
            # the Erlang port mapper our node started; leave one that was there before
            subprocess.run(["epmd", "-kill"], capture_output=True, check=False)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _channel(p: dict[str, Any]) -> tuple[Any, Any]:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(p["port"])))
    ch = conn.channel()
    ch.exchange_declare(EXCHANGE, "topic")
    return conn, ch


def _work_queue(p: dict[str, Any]) -> str:
    # One queue per measurement directory. Its last component alone is the same for every
    # run (bench.filesystems names them <box>/run), and a queue declared by the
    # cross-process work queue outlives it on the node: the in-process run's
    # auto-delete declare of that name was refused (PRECONDITION_FAILED).
    return "work-" + hashlib.sha1(os.fsencode(p["dir"])).hexdigest()[:16]


def _pub(p: dict[str, Any]) -> None:
    conn, ch = _channel(p)
    payloads = [make_payload(i, int(p["size"])) for i in range(int(p["n"]))]
    if p.get("single"):
        queue = _work_queue(p)
        ch.queue_declare(queue)
        t0 = time.monotonic_ns()
        for body in payloads:
            ch.basic_publish("", queue, body)
    else:
        t0 = time.monotonic_ns()
        for body in payloads:
            ch.basic_publish(EXCHANGE, "bench.topic", body)
    conn.process_data_events(0)
    t1 = time.monotonic_ns()
    conn.close()
    result(t0_ns=t0, t1_ns=t1)


def _bind(ch: Any, key: str) -> str:
    q = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue
    ch.queue_bind(q, EXCHANGE, routing_key=key)
    return str(q)


def _sub(p: dict[str, Any]) -> None:
    conn, ch = _channel(p)
    tally = Tally(p.get("expect"))
    q = _bind(ch, "bench.*")
    ch.basic_consume(q, lambda _c, _m, _p, body: tally.hit(body), auto_ack=True)
    ready()
    while not tally.finished:
        conn.process_data_events(time_limit=0.05)
    tally.send_result()
    conn.close()


def _worker(p: dict[str, Any]) -> None:
    conn, ch = _channel(p)
    queue = _work_queue(p)
    ch.queue_declare(queue)
    ch.basic_qos(prefetch_count=100)
    tally = Tally(None)

    def on_message(c: Any, method: Any, _props: Any, body: bytes) -> None:
        tally.hit(body)
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message)
    ready()
    while not tally.finished:
        conn.process_data_events(time_limit=0.05)
    tally.send_result()
    conn.close()


def _echo(p: dict[str, Any]) -> None:
    conn, ch = _channel(p)
    q = _bind(ch, "bench.ping")

    def on_message(c: Any, _m: Any, _p: Any, body: bytes) -> None:
        c.basic_publish(EXCHANGE, "bench.pong", b"%020d" % time.monotonic_ns() + body)

    ch.basic_consume(q, on_message, auto_ack=True)
    tally = Tally(None)  # for STOP only
    ready()
    while not tally.finished:
        conn.process_data_events(time_limit=0.05)
    conn.close()


def _ping(p: dict[str, Any]) -> None:
    conn, ch = _channel(p)
    q = _bind(ch, "bench.pong")
    got: list[bytes] = []
    ch.basic_consume(q, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    rtt: list[int] = []
    oneway: list[int] = []
    for i in range(int(p["n"])):
        ch.basic_publish(EXCHANGE, "bench.ping", make_ping(i, int(p["size"])))
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.01)
        t = time.monotonic_ns()
        data = got.pop()
        sent = ping_sent_at(data[20:])
        rtt.append(t - sent)
        oneway.append(int(data[:20]) - sent)
    conn.close()
    result(rtt_ns=rtt, oneway_ns=oneway)


def _inprocess(p: dict[str, Any]) -> None:
    import asyncio

    import aio_pika

    n, size, window = int(p["n"]), int(p["size"]), int(p["window"])
    single = bool(p.get("single"))
    payloads = [make_payload(i, size) for i in range(n)]
    ids: list[int] = []
    times = {"t0": 0, "last": 0, "published": 0}

    async def main() -> None:
        conn = await aio_pika.connect(host="127.0.0.1", port=int(p["port"]))
        ch = await conn.channel(publisher_confirms=False)
        done = asyncio.Event()

        def hit(body: bytes) -> None:
            times["last"] = time.monotonic_ns()
            ids.append(int(body[:ID_WIDTH]))
            if len(ids) >= n:
                done.set()

        if single:
            await ch.set_qos(prefetch_count=100)
            queue = await ch.declare_queue(_work_queue(p), auto_delete=True)

            async def on_message(msg: Any) -> None:
                hit(msg.body)
                await msg.ack()

            await queue.consume(on_message)
            exchange, key = ch.default_exchange, queue.name
        else:
            exchange = await ch.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC)
            queue = await ch.declare_queue(exclusive=True, auto_delete=True)
            await queue.bind(exchange, "bench.*")

            async def on_multi(msg: Any) -> None:
                hit(msg.body)

            await queue.consume(on_multi, no_ack=True)
            key = "bench.topic"

        async def publisher(first: int) -> None:
            for i in range(first, n, window):
                await exchange.publish(aio_pika.Message(payloads[i]), routing_key=key)

        times["t0"] = time.monotonic_ns()
        await asyncio.gather(*(publisher(k) for k in range(min(window, n))))
        times["published"] = time.monotonic_ns()
        try:
            await asyncio.wait_for(done.wait(), 60)
        except TimeoutError:
            pass
        await conn.close()

    asyncio.run(main())
    result(ids=ids, t0_ns=times["t0"], last_ns=times["last"], published_ns=times["published"])


def _inprocess_ping(p: dict[str, Any]) -> None:
    import asyncio

    import aio_pika

    rtt: list[int] = []

    async def main() -> None:
        conn = await aio_pika.connect(host="127.0.0.1", port=int(p["port"]))
        ch = await conn.channel(publisher_confirms=False)
        exchange = await ch.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC)
        got = asyncio.Event()

        async def echo(msg: Any) -> None:
            await exchange.publish(aio_pika.Message(msg.body), routing_key="bench.pong")

        async def pong(msg: Any) -> None:
            rtt.append(time.monotonic_ns() - ping_sent_at(msg.body))
            got.set()

        for key, cb in (("bench.ping", echo), ("bench.pong", pong)):
            q = await ch.declare_queue(exclusive=True, auto_delete=True)
            await q.bind(exchange, key)
            await q.consume(cb, no_ack=True)
        for i in range(int(p["n"])):
            got.clear()
            body = make_ping(i, int(p["size"]))
            await exchange.publish(aio_pika.Message(body), routing_key="bench.ping")
            await asyncio.wait_for(got.wait(), 30)
        await conn.close()

    asyncio.run(main())
    result(rtt_ns=rtt)


ROLES = {
    "inprocess": _inprocess,
    "inprocess_ping": _inprocess_ping,
    "pub": _pub,
    "sub": _sub,
    "worker": _worker,
    "echo": _echo,
    "ping": _ping,
}
