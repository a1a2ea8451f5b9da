"""The fsbus AMQP gateway beside RabbitMQ: the same client code against both, in one run.

Servers, on each filesystem of ``--fs`` (default ``tmpfs,ext4loop``: the scratch helpers
of :mod:`bench.filesystems`):

* ``fsbus``: the gateway as a process of its own, ``python -m fsbus amqp --root DIR
  --listen 127.0.0.1:PORT``, its bus directory on the filesystem under test (one process
  per filesystem, kept for all the rounds, as a RabbitMQ node is);
* ``rabbitmq``: the harness's private ``rabbitmq-server`` node
  (:class:`bench.bench_queues.Rabbit`, i.e. :class:`bench.systems.rabbitmq.RabbitMQ`), its
  data directory on the same filesystem.

**Throughput**: for each client (``pika`` ``BlockingConnection``; ``aio-pika``, a plain
``connect``, not the robust one) and mode:

* ``transient``: ``delivery_mode`` 1, no publisher confirms;
* ``confirms``: publisher confirms and ``delivery_mode=2`` (pika's ``confirm_delivery``;
  aio-pika's default ``publisher_confirms=True``), one publish waiting for its confirm
  before the next, as the plain loop of either client does;
* ``get``: published as ``transient``, then taken one at a time with ``basic.get`` and
  acked (pika's ``basic_get``, aio-pika's ``queue.get()``): a tenth of N, at least 300;

the harness declares a fresh durable queue; a publisher process publishes N 100-byte
messages to it through the default exchange (``--quick``: 3,000; full: 30,000), then
declares it passively on the same channel until it holds all N (publish rate = N / (first
publish .. that moment); the client's own loop rate is in the JSON); then a consumer
process (``basic_qos(prefetch_count=100)``, manual ``basic_ack`` of each message) takes
them all (consume rate = N / (``basic_consume`` .. last receipt)). Every payload carries
its index: a message lost or received twice fails the run, and the queue must be empty
once the consumer has gone. Server CPU per message (the gateway process; RabbitMQ's node)
is measured around each phase.

Every (system, client, mode) runs once per round (3 rounds, ``--quick`` too), the order
rotated from round to round (fsbus and RabbitMQ alternate), each on a fresh queue; medians
of the rounds are kept and compared as speed ratios fsbus / RabbitMQ (above 1 = fsbus
faster).

**Start-up**: from just before the server process is started until a pika client has
connected, opened a channel and declared a durable queue: ``fsbus amqp`` against
``rabbitmq-server``, on a fresh data directory (*fresh*) and once more on the directory the
first start left (*again*), several rounds each (3 quick, 5 full), alternating; nothing else
is running then (the throughput servers start after). epmd, which a RabbitMQ node needs, is stopped
after each RabbitMQ start unless it was running before, so every start pays for it. The
gateway runs from byte code, as a pip install leaves it: one untimed start writes what a
checkout lacks.

    .venv/bin/python -m bench.bench_amqp [--quick] [--fs tmpfs,ext4loop] [--rounds R]
        [-n N] [--startup-rounds S] [--only throughput|startup] [--clients pika,aio-pika]
        [--json FILE] [--out FILE] [--profile] [-v]

``--profile``: ``py-spy record`` samples the gateway process during each fsbus phase; the
busiest functions of each phase (own samples and with callees, idle time left out) are
printed to stderr at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_queues import Rabbit, _fsbus_source, _rotate, _sync
from bench.child import Tally, make_payload, result
from bench.filesystems import Scratch, scratch, unavailable
from bench.procs import REPO, ChildFailed, run_single

SIZE = 100
PREFETCH = 100
CLIENTS = ("pika", "aio-pika")
MODES = ("transient", "confirms", "get", "fanout")
FANOUT = 3
"""Queues bound to the fanout exchange of the *fanout* mode."""
GET_SHARE = 10
"""The ``get`` mode moves this fraction of N (at least 300): one round trip a message."""
SYSTEMS = ("fsbus", "rabbitmq")
STALL_SECONDS = 20.0
"""A consumer that got nothing for this long stops and reports what it has."""
START_TIMEOUT = 60.0
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "amqp.md"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- children ------------------------------------------------------------------------------
# ``python -m bench.bench_amqp --child ROLE PARAMS_JSON``: RESULT on stdout (bench.child).


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _pika_params(port: int) -> Any:
    import pika

    return pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)


def _pika_pub(p: dict[str, Any]) -> None:
    import pika

    conn = pika.BlockingConnection(_pika_params(int(p["port"])))
    ch = conn.channel()
    confirms = p["mode"] == "confirms"
    if confirms:
        ch.confirm_delivery()  # each basic_publish waits for the broker's ack
    props = pika.BasicProperties(delivery_mode=2 if confirms else 1)
    queue, n = p["queue"], int(p["n"])
    exchange = p.get("exchange", "")  # fanout: every queue of p["queues"] gets each
    key = "" if exchange else queue
    payloads = [make_payload(i, SIZE) for i in range(n)]
    publish = ch.basic_publish
    c0 = _cpu()
    t0 = time.monotonic_ns()
    for body in payloads:
        publish(exchange, key, body, props)
    t1 = time.monotonic_ns()
    counts = []
    deadline = time.monotonic() + 60
    for q in p.get("queues", [queue]):  # the same channel: after every publish above
        while True:
            held = int(ch.queue_declare(q, durable=True, passive=True).method.message_count)
            if held >= n or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        counts.append(held)
    held = min(counts)
    t2 = time.monotonic_ns()
    cpu = _cpu() - c0
    conn.close()
    result(t0_ns=t0, t1_ns=t1, t2_ns=t2, held=held, cpu_s=cpu)


def _pika_consumer(p: dict[str, Any]) -> None:
    import pika

    conn = pika.BlockingConnection(_pika_params(int(p["port"])))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    tally = Tally(int(p["n"]))

    def on_message(c: Any, method: Any, _props: Any, body: bytes) -> None:
        tally.hit(body)
        c.basic_ack(method.delivery_tag)

    c0 = _cpu()
    t0 = time.monotonic_ns()
    if p["mode"] == "get":
        empty_since = None
        while not tally.finished:
            method, _props, body = ch.basic_get(p["queue"])
            if method is None:  # none ready yet (publishes still landing)
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since > STALL_SECONDS:
                    break
                continue
            empty_since = None
            tally.hit(body)
            ch.basic_ack(method.delivery_tag)
        cpu = _cpu() - c0
        conn.close()
        result(ids=tally.ids, t0_ns=t0, last_ns=tally.last_ns, cpu_s=cpu)
        return
    ch.basic_consume(p["queue"], on_message)
    seen, last_change = 0, time.monotonic()
    while not tally.finished:
        conn.process_data_events(time_limit=0.05)
        if len(tally.ids) != seen:
            seen, last_change = len(tally.ids), time.monotonic()
        elif time.monotonic() - last_change > STALL_SECONDS:
            break
    cpu = _cpu() - c0
    conn.close()  # after the acks on the wire
    result(ids=tally.ids, t0_ns=t0, last_ns=tally.last_ns, cpu_s=cpu)


def _aio_url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def _aio_pub(p: dict[str, Any]) -> None:
    import aio_pika

    async def main() -> dict[str, Any]:
        confirms = p["mode"] == "confirms"
        queue, n = p["queue"], int(p["n"])
        conn = await aio_pika.connect(_aio_url(int(p["port"])))
        try:
            ch = await conn.channel(publisher_confirms=confirms)
            mode = (
                aio_pika.DeliveryMode.PERSISTENT
                if confirms
                else aio_pika.DeliveryMode.NOT_PERSISTENT
            )
            messages = [
                aio_pika.Message(make_payload(i, SIZE), delivery_mode=mode) for i in range(n)
            ]
            exchange = ch.default_exchange
            key = queue
            if p.get("exchange"):  # fanout: every queue of p["queues"] gets each
                exchange = await ch.get_exchange(p["exchange"])
                key = ""
            publish = exchange.publish
            c0 = _cpu()
            t0 = time.monotonic_ns()
            for msg in messages:
                await publish(msg, routing_key=key)  # with confirms: waits for the ack
            t1 = time.monotonic_ns()
            counts = []
            deadline = time.monotonic() + 60
            for name in p.get("queues", [queue]):
                while True:
                    q = await ch.declare_queue(name, durable=True, passive=True)
                    held = int(q.declaration_result.message_count or 0)
                    if held >= n or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.002)
                counts.append(held)
            held = min(counts)
            t2 = time.monotonic_ns()
            cpu = _cpu() - c0
        finally:
            await conn.close()
        return {"t0_ns": t0, "t1_ns": t1, "t2_ns": t2, "held": held, "cpu_s": cpu}

    result(**asyncio.run(main()))


def _aio_consumer(p: dict[str, Any]) -> None:
    import aio_pika

    tally = Tally(int(p["n"]))

    async def main() -> dict[str, Any]:
        conn = await aio_pika.connect(_aio_url(int(p["port"])))
        try:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=PREFETCH)
            queue = await ch.declare_queue(p["queue"], durable=True, passive=True)

            acked = [0]
            all_acked = asyncio.Event()

            async def on_message(message: Any) -> None:
                all_acked.clear()
                tally.hit(message.body)
                await message.ack()
                acked[0] += 1
                if acked[0] == len(tally.ids):
                    all_acked.set()

            c0 = _cpu()
            t0 = time.monotonic_ns()
            if p["mode"] == "get":
                empty_since = None
                while not tally.finished:
                    message = await queue.get(no_ack=False, fail=False)
                    if message is None:  # none ready yet
                        empty_since = empty_since or time.monotonic()
                        if time.monotonic() - empty_since > STALL_SECONDS:
                            break
                        continue
                    empty_since = None
                    tally.hit(message.body)
                    await message.ack()
                return {
                    "ids": tally.ids,
                    "t0_ns": t0,
                    "last_ns": tally.last_ns,
                    "cpu_s": _cpu() - c0,
                }
            await queue.consume(on_message)
            seen, last_change = 0, time.monotonic()
            while not tally.finished:
                await asyncio.sleep(0.01)
                if len(tally.ids) != seen:
                    seen, last_change = len(tally.ids), time.monotonic()
                elif time.monotonic() - last_change > STALL_SECONDS:
                    break
            cpu = _cpu() - c0
            if acked[0] < len(tally.ids):  # every ack handed to the connection first
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_acked.wait(), 10)
        finally:
            await conn.close()
        return {"ids": tally.ids, "t0_ns": t0, "last_ns": tally.last_ns, "cpu_s": cpu}

    result(**asyncio.run(main()))


ROLES = {
    "pika-pub": _pika_pub,
    "pika-consumer": _pika_consumer,
    "aio-pika-pub": _aio_pub,
    "aio-pika-consumer": _aio_consumer,
}


def child_cmd(role: str, params: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "bench.bench_amqp", "--child", role, json.dumps(params)]


# --- servers --------------------------------------------------------------------------------


def _free_port() -> int:
    """A port nobody listens on, below the kernel's ephemeral range: a port from that range
    (what binding port 0 gives) can be taken as the source port of any outgoing connection
    on the machine before the server binds it, and its start then fails."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(256 << 20))  # as bench.procs does
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    return env


def _proc_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` (every thread of it)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gateway_cmd(root: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "fsbus", "amqp",
        "--root", str(root), "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip


def _connect_and_declare(port: int, queue: str) -> None:
    """What "ready" means here: a client connects, opens a channel, declares a queue."""
    import pika

    conn = pika.BlockingConnection(_pika_params(port))
    try:
        conn.channel().queue_declare(queue, durable=True)
    finally:
        conn.close()


def _wait_ready(proc: subprocess.Popen[bytes], port: int, deadline: float, what: str) -> None:
    import pika

    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) while starting")
        try:
            _connect_and_declare(port, "bench-ready")
            return
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer within {START_TIMEOUT:.0f} s") from None
            time.sleep(0.005)


def _stop(proc: subprocess.Popen[bytes], *, group: bool = False, timeout: float = 30) -> None:
    if proc.poll() is None:
        try:
            if group:
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                proc.terminate()
            proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            with contextlib.suppress(ProcessLookupError):
                if group:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            proc.wait()


class GatewayProc:
    """``python -m fsbus amqp`` on a bus directory, as a process of its own."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="fsbus-bench-gw-", suffix=".log")
        self.proc = subprocess.Popen(
            gateway_cmd(root, self.port),
            cwd=REPO,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        try:
            _wait_ready(self.proc, self.port, time.monotonic() + START_TIMEOUT, "fsbus amqp")
        except RuntimeError as exc:
            said = self.tail()
            self.close()
            raise RuntimeError(f"{exc}: {said}") from None

    def tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-600:].strip()

    def cpu_seconds(self) -> float:
        return _proc_cpu(self.proc.pid)

    def close(self) -> None:
        _stop(self.proc, timeout=15)
        self.log.close()


class Server:
    """One of the two servers under test, the same interface for both."""

    def __init__(self, system: str, place: Scratch) -> None:
        self.system = system
        where = place.path / system
        where.mkdir()
        self._gw: GatewayProc | None = None
        self._rabbit: Rabbit | None = None
        if system == "fsbus":
            self._gw = GatewayProc(where / "bus")
            self.port = self._gw.port
            self.pid = self._gw.proc.pid
        else:
            self._rabbit = Rabbit(where)
            self.port = self._rabbit.port
            self.pid = 0

    def cpu_seconds(self) -> float:
        if self._gw is not None:
            return self._gw.cpu_seconds()
        assert self._rabbit is not None
        return self._rabbit.cpu_seconds()

    def alive(self) -> bool:
        if self._gw is not None:
            return self._gw.proc.poll() is None
        return True

    def channel(self) -> tuple[Any, Any]:
        import pika

        conn = pika.BlockingConnection(_pika_params(self.port))
        return conn, conn.channel()

    def close(self) -> None:
        if self._gw is not None:
            self._gw.close()
        if self._rabbit is not None:
            self._rabbit.close()


# --- throughput ------------------------------------------------------------------------------


@dataclass
class Run:
    """One publish + consume of one (system, client, mode) in one round."""

    publish: float | None
    consume: float | None
    ok: bool = True
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class Profiler:
    """``py-spy record`` of the gateway while one phase runs (raw collapsed stacks)."""

    def __init__(self, pid: int, out: Path) -> None:
        exe = Path(sys.executable).with_name("py-spy")
        self.out = out
        self.proc = subprocess.Popen(
            [
                str(exe if exe.exists() else "py-spy"),
                "record",
                "--pid",
                str(pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.3)  # attached

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _queue_depth(server: Server, queue: str) -> int:
    conn, ch = server.channel()
    try:
        return int(ch.queue_declare(queue, durable=True, passive=True).method.message_count)
    finally:
        conn.close()


def _measure(
    server: Server,
    client: str,
    mode: str,
    n: int,
    place: Scratch,
    *,
    profile: Path | None,
) -> Run:
    """Declare a fresh queue, publish n, consume n, check; delete the queue."""
    if mode == "get":
        n = max(300, n // GET_SHARE)
    queue = f"bench-{secrets.token_hex(4)}"
    params: dict[str, Any] = {"port": server.port, "queue": queue, "n": n, "mode": mode}
    conn, ch = server.channel()
    ch.queue_declare(queue, durable=True)
    if mode == "fanout":  # published once, copied into each queue; the first is consumed
        params["exchange"] = f"{queue}-fan"
        params["queues"] = [queue, *(f"{queue}-{k}" for k in range(2, FANOUT + 1))]
        ch.exchange_declare(params["exchange"], "fanout")
        for q in params["queues"]:
            ch.queue_declare(q, durable=True)
            ch.queue_bind(q, params["exchange"])
    conn.close()
    timeout = max(300.0, n / 20)
    extra: dict[str, float] = {}
    notes: list[str] = []
    prof: Profiler | None = None
    try:
        _sync(place.path)
        s0 = server.cpu_seconds()
        if profile is not None:
            prof = Profiler(server.pid, Path(f"{profile}-publish.txt"))
        try:
            pub = run_single(child_cmd(f"{client}-pub", params), timeout=timeout)
        finally:
            if prof is not None:
                prof.stop()
        extra["server_cpu_us_publish"] = (server.cpu_seconds() - s0) / n * 1e6
        t0, t1, t2 = int(pub["t0_ns"]), int(pub["t1_ns"]), int(pub["t2_ns"])
        extra["publish_loop_rate"] = n / max((t1 - t0) / 1e9, 1e-9)
        extra["client_cpu_us_publish"] = float(pub["cpu_s"]) / n * 1e6
        pub_rate = n / max((t2 - t0) / 1e9, 1e-9)
        if int(pub["held"]) != n:
            notes.append(f"the queue held {pub['held']} of {n} after publishing")
        s0 = server.cpu_seconds()
        if profile is not None:
            prof = Profiler(server.pid, Path(f"{profile}-consume.txt"))
        try:
            con = run_single(child_cmd(f"{client}-consumer", params), timeout=timeout)
        finally:
            if prof is not None:
                prof.stop()
        extra["server_cpu_us_consume"] = (server.cpu_seconds() - s0) / n * 1e6
        extra["client_cpu_us_consume"] = float(con["cpu_s"]) / n * 1e6
        ids = con["ids"]
        distinct = len(set(ids))
        if distinct != n:
            notes.append(f"{n - distinct} lost")
        if len(ids) != distinct:
            notes.append(f"{len(ids) - distinct} duplicated")
        secs = (int(con["last_ns"]) - int(con["t0_ns"])) / 1e9
        con_rate = n / secs if ids and secs > 0 else None
        left = _queue_depth(server, queue)
        deadline = time.monotonic() + 5
        while left and time.monotonic() < deadline:  # acks still on their way
            time.sleep(0.05)
            left = _queue_depth(server, queue)
        if left:
            notes.append(f"{left} left in the queue (not acknowledged)")
    except ChildFailed as exc:
        log(f"  {server.system} {client} {mode} failed: {exc}")
        return Run(None, None, ok=False, note=str(exc).splitlines()[0][:200], extra=extra)
    finally:
        with contextlib.suppress(Exception):
            conn, ch = server.channel()
            for q in params.get("queues", [queue]):
                ch.queue_delete(q)
            if "exchange" in params:
                ch.exchange_delete(params["exchange"])
            conn.close()
    ok = not notes
    return Run(
        pub_rate if ok else None,
        con_rate if ok else None,
        ok=ok,
        note=", ".join(notes),
        extra=extra,
    )


def _variants(clients: list[str], modes: list[str]) -> tuple[tuple[str, str, str], ...]:
    return tuple((s, c, m) for c in clients for m in modes for s in SYSTEMS)


def _median(vals: list[float | None]) -> float | None:
    if not vals or any(v is None for v in vals):
        return None
    return statistics.median([v for v in vals if v is not None])


def _summary(runs: list[Run]) -> dict[str, Any]:
    keys = sorted({k for r in runs for k in r.extra})
    return {
        "publish": _median([r.publish for r in runs]),
        "consume": _median([r.consume for r in runs]),
        "ok": bool(runs) and all(r.ok for r in runs),
        "rounds_publish": [r.publish for r in runs],
        "rounds_consume": [r.consume for r in runs],
        "notes": [r.note for r in runs if r.note],
        "extra": {k: statistics.median([r.extra[k] for r in runs if k in r.extra]) for k in keys},
    }


def run_throughput(
    place: Scratch, args: argparse.Namespace, profile_dir: Path | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": {}, "skipped": {}}
    servers: dict[str, Server] = {}
    try:
        for system in SYSTEMS:
            try:
                servers[system] = Server(system, place)
                log(f"  {system} on port {servers[system].port}")
            except (RuntimeError, OSError, ImportError) as exc:
                log(f"  {system} skipped: {exc}")
                out["skipped"][system] = str(exc)
        runs: dict[str, list[Run]] = {}
        variants = _variants(args.clients, args.modes)
        for r in range(args.rounds):
            for system, client, mode in _rotate(variants, r):
                server = servers.get(system)
                if server is None:
                    continue
                if not server.alive():
                    out["skipped"][system] = "the server process died during the run"
                    continue
                key = f"{system}/{client}/{mode}"
                prof = None
                if profile_dir is not None and system == "fsbus":
                    prof = profile_dir / f"{place.name}-{client}-{mode}-r{r}"
                m = _measure(server, client, mode, args.n, place, profile=prof)
                runs.setdefault(key, []).append(m)
                e = m.extra
                log(
                    f"  round {r + 1} {key:<28} "
                    + (
                        f"publish {m.publish:>8,.0f} msg/s (loop {e['publish_loop_rate']:,.0f}), "
                        f"consume {m.consume:>8,.0f} msg/s"
                        if m.ok and m.publish and m.consume
                        else f"FAILED {m.note}"
                    )
                    + (
                        f"; server CPU µs/msg {e.get('server_cpu_us_publish', 0):.0f} publish, "
                        f"{e.get('server_cpu_us_consume', 0):.0f} consume"
                        if args.verbose
                        else ""
                    )
                )
        out["runs"] = {k: _summary(v) for k, v in runs.items()}
    finally:
        for s in servers.values():
            s.close()
    return out


# --- start-up --------------------------------------------------------------------------------


def _epmd_running() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 4369), timeout=1):
            return True
    except OSError:
        return False


def _rabbit_env(base: Path, port: int, node: str) -> dict[str, str]:
    """What :class:`bench.systems.rabbitmq.RabbitMQ` gives its node, on ``base``."""
    return {
        **os.environ,
        "HOME": str(base),
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(_free_port()),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "none"),
    }


def _rabbit_exe() -> str | None:
    direct = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # not Debian's su wrapper
    if direct.exists():
        return str(direct)
    return shutil.which("rabbitmq-server")


class StartupCase:
    """Starts of one server on one data directory: fresh, then again."""

    def __init__(self, system: str, base: Path) -> None:
        self.system = system
        self.base = base
        base.mkdir(parents=True)
        self.node = f"fsbusbenchstart{os.getpid()}{secrets.token_hex(2)}@localhost"
        if system == "rabbitmq":
            (base / "enabled_plugins").write_text("[].\n")

    def start(self, *, compile_first: bool = False) -> float:
        """Seconds from starting the process until a client declared a queue.

        The gateway's timed starts write no byte code, so each finds the same cache;
        ``compile_first`` (the warm-up start) writes it, as ``pip install`` does.
        """
        port = _free_port()  # a new one each start, the data directory's node name kept
        epmd_before = _epmd_running()
        said = self.base / "server.out"
        with open(said, "wb") as out:
            t0 = time.monotonic()
            if self.system == "fsbus":
                env = _env()
                if compile_first:
                    env.pop("PYTHONDONTWRITEBYTECODE", None)
                else:
                    env["PYTHONDONTWRITEBYTECODE"] = "1"
                proc = subprocess.Popen(
                    gateway_cmd(self.base / "bus", port),
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            else:
                exe = _rabbit_exe()
                if exe is None:
                    raise RuntimeError("rabbitmq-server is not installed")
                proc = subprocess.Popen(
                    [exe],
                    env=_rabbit_env(self.base, port, self.node),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        try:
            _wait_ready(proc, port, t0 + START_TIMEOUT, self.system)
            return time.monotonic() - t0
        except RuntimeError as exc:
            tail = said.read_text(errors="replace")[-400:].strip() if said.exists() else ""
            raise RuntimeError(f"{exc}: {tail}" if tail else str(exc)) from None
        finally:
            _stop(proc, group=self.system == "rabbitmq")
            if self.system == "rabbitmq" and not epmd_before and _epmd_running():
                subprocess.run(["epmd", "-kill"], capture_output=True, check=False)
                deadline = time.monotonic() + 5
                while _epmd_running() and time.monotonic() < deadline:
                    time.sleep(0.05)


def run_startup(place: Scratch, rounds: int) -> dict[str, Any]:
    times: dict[str, list[float | None]] = {}
    notes: list[str] = []
    # An installed fsbus has its byte code (pip compiles it), as RabbitMQ has its .beam
    # files; a checkout has none until something writes it: one untimed start does.
    warm = StartupCase("fsbus", place.workdir("start-warm-up"))
    try:
        warm.start(compile_first=True)
    except RuntimeError as exc:
        notes.append(f"the warm-up start failed: {exc}")
    place.remove(warm.base)
    for r in range(rounds):
        for system in _rotate(SYSTEMS, r):
            case = StartupCase(system, place.workdir(f"start-{system}"))
            for which in ("fresh", "again"):
                key = f"{system}/{which}"
                secs: float | None = None
                for attempt in range(2):
                    # RabbitMQ has now and then exited (0) early in a start; as
                    # bench_queues.Rabbit does, one more try (the failure is noted)
                    if attempt and which == "fresh":  # fresh again: a new directory
                        place.remove(case.base)
                        case = StartupCase(system, place.workdir(f"start-{system}"))
                    try:
                        _sync(place.path)
                        secs = case.start()
                        break
                    except RuntimeError as exc:
                        again = "; tried again" if attempt == 0 else ""
                        notes.append(f"{key} round {r + 1}: {exc}{again}")
                        log(f"  {key} did not start: {exc}{again}")
                times.setdefault(key, []).append(secs)
                log(
                    f"  start-up round {r + 1} {key:<16} "
                    + (f"{secs * 1000:>8,.0f} ms" if secs is not None else "FAILED")
                )
            place.remove(case.base)
    out: dict[str, Any] = {"notes": notes}
    for key, vals in times.items():
        ok = [v for v in vals if v is not None]
        out[key] = {
            "median": statistics.median(ok) if len(ok) == len(vals) else None,
            "min": min(ok) if ok else None,
            "max": max(ok) if ok else None,
            "rounds": vals,
        }
    return out


# --- the run -----------------------------------------------------------------------------------


def run_fs(
    fs: str, args: argparse.Namespace, profile_dir: Path | None
) -> tuple[str, dict[str, Any]]:
    out: dict[str, Any] = {}
    with scratch(fs, size_mb=6144) as place:
        log(f"== {fs}: {place.description} ==")
        if args.only in (None, "startup"):
            out["startup"] = run_startup(place, args.startup_rounds)
        if args.only in (None, "throughput"):
            out["throughput"] = run_throughput(place, args, profile_dir)
        return place.description, out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def add_ratios(results: dict[str, dict[str, Any]], clients: list[str]) -> None:
    for res in results.values():
        ratios: dict[str, float | None] = {}
        runs = res.get("throughput", {}).get("runs", {})
        for client in clients:
            for mode in MODES:
                f, q = runs.get(f"fsbus/{client}/{mode}"), runs.get(f"rabbitmq/{client}/{mode}")
                if f and q:
                    for phase in ("publish", "consume"):
                        ratios[f"{client}/{mode}/{phase}"] = _ratio(f[phase], q[phase])
        st = res.get("startup", {})
        for which in ("fresh", "again"):
            f, q = st.get(f"fsbus/{which}"), st.get(f"rabbitmq/{which}")
            if f and q:  # speed ratio: RabbitMQ's time / fsbus's time
                ratios[f"startup/{which}"] = _ratio(q["median"], f["median"])
        res["ratios"] = ratios


def _rate(v: float | None) -> str:
    return "fail" if v is None else f"{v:,.0f}"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _us(e: dict[str, float], key: str) -> str:
    return f"{e[key]:.0f}" if key in e else "—"


def _cpu_cell(e: dict[str, float]) -> str:
    return f"{_us(e, 'server_cpu_us_publish')} / {_us(e, 'server_cpu_us_consume')}"


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    clients = meta["clients"]
    lines = [
        "# AMQP 0-9-1: the fsbus gateway and RabbitMQ, the same client code",
        "",
        f"- {meta['date']}; {meta['machine']}; Python {meta['python']}; {meta['rabbitmq']}; "
        f"{meta['clients_versions']}",
        f"- plan **{meta['plan']}**: "
        + (
            f"{meta['n']:,} messages, {meta['rounds']} interleaved rounds"
            if meta["rounds"]
            else "no throughput"
        )
        + (
            f", start-up {meta['startup_rounds']} rounds"
            if meta["startup_rounds"]
            else ", no start-up"
        )
        + f"; medians shown; took {meta['seconds']:.0f} s",
        f"- command: `{meta['command']}`",
        f"- fsbus: {meta['fsbus']}; the gateway runs as `python -m fsbus amqp --root DIR "
        "--listen 127.0.0.1:PORT`, a process of its own, its bus directory on the "
        "filesystem of the row; RabbitMQ's data directory likewise",
    ]
    lines += [f"- `{fs}`: {desc}" for fs, desc in meta["filesystems"].items()]
    lines += [
        f"- load average (1, 5, 15 min) at the start: {meta['load']}; at the end: "
        f"{meta['load_end']}",
        "",
        "Ratios are speed ratios fsbus / RabbitMQ measured in the same run (above 1 = fsbus "
        "faster).",
    ]
    if any(r.get("throughput") for r in results.values()):
        lines += [
            "",
            f"## Throughput: {meta['n']:,} messages of {SIZE} B through one durable queue",
            "",
            "A publisher process publishes every message to a fresh durable queue via the "
            "default exchange; *publish* = N / (first publish until a passive declare on the "
            "same channel shows all N in the queue). Then a consumer process "
            f"(`prefetch_count={PREFETCH}`, manual `basic_ack` of each message) takes them "
            "all; *consume* = N / (`basic_consume` until the last receipt). Every message "
            "is counted (exactly once) and the queue is empty afterwards. *transient*: "
            "`delivery_mode` 1, no publisher confirms; *confirms*: publisher confirms and "
            "`delivery_mode=2`, one publish waiting for its confirm before the next "
            "(pika `confirm_delivery()`; aio-pika's default `publisher_confirms=True`, "
            "`await exchange.publish(...)` in a loop); *get*: published as *transient*, "
            f"then taken one at a time with `basic.get` and acked (a {GET_SHARE}th of N, "
            "at least 300: one round trip a message); *fanout*: published as *transient* "
            f"to a fanout exchange bound to {FANOUT} fresh durable queues (*publish* waits "
            "until each shows all N), then the first of them consumed. Server CPU: µs of "
            "the gateway "
            "process's (RabbitMQ node's) CPU per message, publish / consume.",
            "",
            "| fs | client | mode | publish fsbus | publish RabbitMQ "
            "| publish fsbus / RabbitMQ | consume fsbus | consume RabbitMQ "
            "| consume fsbus / RabbitMQ | server CPU µs/msg fsbus | server CPU µs/msg RabbitMQ |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for fs, res in results.items():
            th = res.get("throughput")
            if not th:
                continue
            runs, rt = th["runs"], res["ratios"]
            for client in clients:
                for mode in MODES:
                    f = runs.get(f"fsbus/{client}/{mode}")
                    q = runs.get(f"rabbitmq/{client}/{mode}")
                    if not f and not q:
                        continue
                    fe = f["extra"] if f else {}
                    qe = q["extra"] if q else {}
                    lines.append(
                        f"| {fs} | {client} | {mode} | "
                        f"{_rate(f['publish']) if f else 'skipped'} | "
                        f"{_rate(q['publish']) if q else 'skipped'} | "
                        f"{_x(rt.get(f'{client}/{mode}/publish'))} | "
                        f"{_rate(f['consume']) if f else 'skipped'} | "
                        f"{_rate(q['consume']) if q else 'skipped'} | "
                        f"{_x(rt.get(f'{client}/{mode}/consume'))} | "
                        f"{_cpu_cell(fe)} | {_cpu_cell(qe)} |"
                    )
        lines += [
            "",
            "The publishing client's own loop rate (before the passive declare) and the "
            "clients' CPU per message are in the JSON (`extra`).",
        ]
    if any(r.get("startup") for r in results.values()):
        lines += [
            "",
            "## Start-up: process start until a client has declared a queue",
            "",
            "From just before the server process is started until a pika client has "
            "connected, opened a channel and declared a durable queue (polled every 5 ms). "
            "*fresh*: an empty data directory; *again*: a second start on the directory "
            "the first one left, on a new port. No other server of this benchmark runs "
            "meanwhile. RabbitMQ's start includes starting epmd (stopped after each start). "
            "A start whose process exits early is tried once more (listed under Notes). "
            "fsbus runs from its byte code, as installed by pip: an untimed start first "
            "writes it (the checkout has none), and the timed ones write none. "
            "Median (min to max) in ms.",
            "",
            "| fs | start | `fsbus amqp` | `rabbitmq-server` | fsbus / RabbitMQ (speed) |",
            "|---|---|---|---|---|",
        ]
        for fs, res in results.items():
            st = res.get("startup")
            if not st:
                continue
            for which in ("fresh", "again"):
                f, q = st.get(f"fsbus/{which}"), st.get(f"rabbitmq/{which}")

                def cell(s: dict[str, Any] | None) -> str:
                    if not s or s["median"] is None:
                        return "fail"
                    return (
                        f"{s['median'] * 1000:,.0f} "
                        f"({s['min'] * 1000:,.0f} to {s['max'] * 1000:,.0f})"
                    )

                lines.append(
                    f"| {fs} | {which} | {cell(f)} | {cell(q)} | "
                    f"{_x(res['ratios'].get(f'startup/{which}'))} |"
                )
    notes = []
    for fs, res in results.items():
        th = res.get("throughput") or {}
        notes += [f"- {fs}: {s} skipped: {why}" for s, why in th.get("skipped", {}).items()]
        notes += [
            f"- {fs} {key}: {'; '.join(s['notes'])}"
            for key, s in th.get("runs", {}).items()
            if s["notes"]
        ]
        notes += [f"- {fs} start-up: {n}" for n in (res.get("startup") or {}).get("notes", [])]
    if notes:
        lines += ["", "## Notes", "", *notes]
    lines += ["", "Every round is in the JSON (`python -m bench.bench_amqp --json FILE`).", ""]
    return "\n".join(lines)


# --- profiles ------------------------------------------------------------------------------------

_LINE = re.compile(r" \(([^()]*?):\d+\)$")


def _frame_name(frame: str) -> str:
    """``func (/path/to/fsbus/_bus/engine.py:123)`` -> ``func (fsbus/_bus/engine.py)``."""
    m = _LINE.search(frame)
    if not m:
        return frame
    path = m.group(1)  # py-spy shortens paths on sys.path already: fsbus/_bus/fs.py
    if path.startswith("fsbus/"):
        short = path
    elif "/fsbus/" in path:
        short = "fsbus/" + path.rsplit("/fsbus/", 1)[1]
    elif "site-packages/" in path:
        short = path.rsplit("site-packages/", 1)[1]
    else:
        short = "/".join(path.split("/")[-2:])
    return f"{frame[: m.start()]} ({short})"


def _own_code(frame: str) -> bool:
    """A frame of fsbus's library code (not its command line, not the event loop)."""
    return "(fsbus/" in frame and "(fsbus/_cli/" not in frame and "(fsbus/__main__" not in frame


def summarize_profiles(profile_dir: Path, top: int = 25) -> str:
    """Each phase's rounds merged: share of busy samples per function, own and inclusive."""
    groups: dict[str, list[Path]] = collections.defaultdict(list)
    for f in sorted(profile_dir.glob("*.txt")):
        run, _, phase = f.stem.rpartition("-")
        groups[re.sub(r"-r\d+$", "", run) + "-" + phase].append(f)
    parts = []
    for name, files in sorted(groups.items()):
        own: collections.Counter[str] = collections.Counter()
        incl: collections.Counter[str] = collections.Counter()
        total = 0
        for f in files:
            for line in f.read_text(errors="replace").splitlines():
                stack, _, count = line.rpartition(" ")
                if not count.isdigit():
                    continue
                k = int(count)
                frames = [
                    _frame_name(x)
                    for x in stack.split(";")
                    if not x.startswith(("process ", "thread ("))
                ]
                if not frames:
                    continue
                total += k
                own[frames[-1]] += k
                for fr in set(frames):
                    incl[fr] += k
        if not total:
            continue
        parts.append(f"--- py-spy, gateway, {name}: {total} busy samples ---")
        parts.append("own:")
        parts += [f"  {v / total:6.1%}  {k}" for k, v in own.most_common(top)]
        parts.append("with callees (fsbus's own functions):")
        mine = [(k, v) for k, v in incl.most_common() if _own_code(k)][:top]
        parts += [f"  {v / total:6.1%}  {k}" for k, v in mine]
    return "\n".join(parts)


# --- main ----------------------------------------------------------------------------------------


def _versions() -> tuple[str, str]:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    rabbit = f"RabbitMQ {out} (Debian)" if out else "RabbitMQ (version unknown)"
    from importlib.metadata import PackageNotFoundError, version

    libs = []
    for lib in ("pika", "aio-pika"):
        try:
            libs.append(f"{lib} {version(lib)}")
        except PackageNotFoundError:
            libs.append(f"{lib} (not installed)")
    return rabbit, ", ".join(libs)


FS_DEFAULT = "tmpfs,ext4loop"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        ROLES[argv[1]](json.loads(argv[2]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.bench_amqp", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="3,000 messages")
    ap.add_argument("--fs", default=FS_DEFAULT, help="comma-separated: tmpfs,ext4loop,disk")
    ap.add_argument("--rounds", type=int, help="throughput rounds (default: 3)")
    ap.add_argument("--startup-rounds", type=int, help="start-up rounds (default: 3 quick, 5 full)")
    ap.add_argument("-n", type=int, help="messages per run (default: 3,000 quick, 30,000 full)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="pika,aio-pika")
    ap.add_argument("--modes", default=",".join(MODES), help=",".join(MODES))
    ap.add_argument("--only", choices=("throughput", "startup"))
    ap.add_argument("--json", metavar="FILE", help="write the JSON there instead of stdout")
    ap.add_argument(
        "--out", metavar="FILE", help=f"the Markdown (default: {DEFAULT_OUT}, for a whole run)"
    )
    ap.add_argument("--profile", action="store_true", help="py-spy the gateway in each phase")
    ap.add_argument("-v", "--verbose", action="store_true", help="server CPU of every run")
    args = ap.parse_args(argv)
    custom = args.n is not None or args.rounds is not None
    args.rounds = args.rounds or 3  # quick too: a shared 2-core machine swings 2-3x
    args.startup_rounds = args.startup_rounds or (3 if args.quick else 5)
    args.n = args.n or (3_000 if args.quick else 30_000)
    args.clients = [c for c in args.clients.split(",") if c]
    for c in args.clients:
        if c not in CLIENTS:
            ap.error(f"unknown client {c!r}; choose from {', '.join(CLIENTS)}")
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    filesystems = [f for f in args.fs.split(",") if f]
    for fs in filesystems:
        why = unavailable(fs)
        if why:
            ap.error(why)

    import fsbus

    profile_dir = Path(tempfile.mkdtemp(prefix="fsbus-bench-amqp-prof-")) if args.profile else None
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    t0 = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    described: dict[str, str] = {}
    for fs in filesystems:
        described[fs], results[fs] = run_fs(fs, args, profile_dir)
    add_ratios(results, args.clients)
    rabbit, libs = _versions()
    meta = {
        "plan": ("quick" if args.quick else "full") + (", sizes changed" if custom else ""),
        "rounds": args.rounds if args.only in (None, "throughput") else 0,
        "startup_rounds": args.startup_rounds if args.only in (None, "startup") else 0,
        "n": args.n,
        "clients": args.clients,
        "filesystems": described,
        "seconds": round(time.monotonic() - t0, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"Linux {platform.release()}",
        "load": load,
        "load_end": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "rabbitmq": rabbit,
        "clients_versions": libs,
        "command": " ".join(["python -m bench.bench_amqp", *argv]),
        "fsbus": _fsbus_source(fsbus.__file__),
    }
    md = markdown(results, meta)
    log(md)
    # Only a whole run replaces the committed results; a partial one (a profile, one
    # client, one filesystem, one phase, other sizes) is written only where --out says.
    partial = bool(
        args.only
        or args.profile
        or custom
        or args.fs != FS_DEFAULT
        or tuple(args.clients) != CLIENTS
        or tuple(args.modes) != MODES
    )
    out = Path(args.out) if args.out else None if partial else DEFAULT_OUT
    if out is None:
        log(f"a partial run: {DEFAULT_OUT} left as it is (pass --out FILE to keep this one)")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(md)
        log(f"wrote {out}")
    doc = json.dumps({"meta": meta, "results": results}, indent=2)
    if args.json:
        Path(args.json).write_text(doc)
    else:
        print(doc)
    if profile_dir is not None:
        summary = summarize_profiles(profile_dir)
        log(summary)
        (profile_dir / "summary.txt").write_text(summary + "\n")
        log(f"py-spy stacks and summary in {profile_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
