"""Redis (redis-server from Debian) through redis-py: pub/sub for fan-out, lists for queues.

The harness starts its own ``redis-server`` on 127.0.0.1 on a free port with persistence
off (``--save '' --appendonly no``), and stops it after the run; if it is missing and we are
root it is installed with apt-get. Two variants, both reported: ``redis`` sends one command
per message and waits for the reply (sequential), ``redis-pipe`` sends them in pipelines of
100 (the fastest normal way to feed Redis). Subscribers use ``PSUBSCRIBE bench.*`` (the
counterpart of a wildcard topic subscription); workers ``BRPOP``; append is ``RPUSH``.
Redis keeps everything in memory, so the filesystem under test does not matter to it.

Redis's default ``client-output-buffer-limit pubsub 32mb 8mb 60`` is left as it is: a
subscriber that falls more than 32 MB behind (pipelined 10 KB publishes do that) is cut
off and its messages are lost, which the harness reports as a failed run with the count.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any, ClassVar

from bench.child import ID_WIDTH, Tally, make_payload, make_ping, ping_sent_at, ready, result
from bench.scenarios import Kind
from bench.systems.base import System

PIPELINE = 100
_SERVER: dict[str, Any] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def apt_install(package: str) -> str | None:
    """apt-get install ``package`` (root only), waiting for another apt to finish."""
    if os.geteuid() != 0:
        return f"{package} is not installed and we are not root (apt-get install {package})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for _ in range(3):
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=180", package],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode == 0:
            return None
        if "Unable to locate" in proc.stderr:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
    return f"apt-get install {package} failed: {proc.stderr.strip()[-200:]}"


def start_redis() -> str | None:
    """Start (once per harness process) a private redis-server; return why not, or None."""
    if "port" in _SERVER:
        _SERVER["users"] += 1
        return None
    if shutil.which("redis-server") is None:
        why = apt_install("redis-server")
        if why:
            return why
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="fsbus-bench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", workdir, "--daemonize", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port).ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                return "redis-server did not answer within 10 s"
            time.sleep(0.02)
    _SERVER.update(port=port, proc=proc, dir=workdir, users=1)
    return None


def stop_redis() -> None:
    if "port" not in _SERVER:
        return
    _SERVER["users"] -= 1
    if _SERVER["users"] > 0:
        return
    proc: subprocess.Popen[bytes] = _SERVER["proc"]
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(_SERVER["dir"], ignore_errors=True)
    _SERVER.clear()


class RedisSequential(System):
    name: ClassVar[str] = "redis"
    label: ClassVar[str] = "Redis, one command at a time"
    module: ClassVar[str] = "redis_"
    uses_fs: ClassVar[bool] = False
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {
            "publish",
            "fanout",
            "workqueue",
            "latency",
            "append",
            "read",
            "inprocess",
            "inprocess_single",
            "latency_inprocess",
        }
    )
    extra_params: ClassVar[dict[str, Any]] = {"pipeline": 1}

    def prepare(self) -> str | None:
        why = start_redis()
        if why is None:
            self.extra_params = {**self.extra_params, "port": _SERVER["port"]}
        return why

    def close(self) -> None:
        stop_redis()


class RedisPipelined(RedisSequential):
    name: ClassVar[str] = "redis-pipe"
    label: ClassVar[str] = f"Redis, pipelines of {PIPELINE}"
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {"publish", "fanout", "workqueue", "append", "read"}
    )
    extra_params: ClassVar[dict[str, Any]] = {"pipeline": PIPELINE}


def _client(p: dict[str, Any]) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=int(p["port"]))


def _key(p: dict[str, Any]) -> str:
    # every measurement runs in its own directory: use it to keep keys apart
    return f"bench:{os.path.basename(p['dir'])}"


def _send(p: dict[str, Any], command: str, key: str) -> tuple[int, int]:
    r = _client(p)
    n, size, batch = int(p["n"]), int(p["size"]), int(p["pipeline"])
    payloads = [make_payload(i, size) for i in range(n)]
    t0 = time.monotonic_ns()
    if batch <= 1:
        call = getattr(r, command)
        for body in payloads:
            call(key, body)
    else:
        for start in range(0, n, batch):
            pipe = r.pipeline(transaction=False)
            call = getattr(pipe, command)
            for body in payloads[start : start + batch]:
                call(key, body)
            pipe.execute()
    return t0, time.monotonic_ns()


def _pub(p: dict[str, Any]) -> None:
    if p.get("single"):
        t0, t1 = _send(p, "lpush", _key(p))
    else:
        t0, t1 = _send(p, "publish", "bench.topic")
    result(t0_ns=t0, t1_ns=t1)


def _sub(p: dict[str, Any]) -> None:
    tally = Tally(p.get("expect"))
    ps = _client(p).pubsub(ignore_subscribe_messages=True)
    ps.psubscribe("bench.*")
    while ps.get_message(timeout=1.0) is None and not ps.subscribed:
        pass
    ready()
    while not tally.finished:
        msg = ps.get_message(timeout=0.05)
        if msg is not None and msg["type"] == "pmessage":
            tally.hit(msg["data"])
    ps.close()
    tally.send_result()


def _worker(p: dict[str, Any]) -> None:
    tally = Tally(None)
    r = _client(p)
    r.ping()
    key = _key(p)
    ready()
    while not tally.finished:
        got = r.brpop([key], timeout=0.05)
        if got is not None:
            tally.hit(got[1])
    tally.send_result()


def _echo(p: dict[str, Any]) -> None:
    r = _client(p)
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe("bench.ping")
    while ps.get_message(timeout=1.0) is None and not ps.subscribed:
        pass
    ready()
    tally = Tally(None)  # only for STOP
    while not tally.finished:
        msg = ps.get_message(timeout=0.05)
        if msg is not None and msg["type"] == "message":
            r.publish("bench.pong", b"%020d" % time.monotonic_ns() + msg["data"])


def _ping(p: dict[str, Any]) -> None:
    r = _client(p)
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe("bench.pong")
    while ps.get_message(timeout=1.0) is None and not ps.subscribed:
        pass
    rtt: list[int] = []
    oneway: list[int] = []
    for i in range(int(p["n"])):
        r.publish("bench.ping", make_ping(i, int(p["size"])))
        while True:
            msg = ps.get_message(timeout=5.0)
            if msg is not None and msg["type"] == "message":
                break
        t = time.monotonic_ns()
        data = msg["data"]
        sent = ping_sent_at(data[20:])
        rtt.append(t - sent)
        oneway.append(int(data[:20]) - sent)
    result(rtt_ns=rtt, oneway_ns=oneway)


def _append(p: dict[str, Any]) -> None:
    t0, t1 = _send(p, "rpush", _key(p) + ":log")
    _client(p).delete(_key(p) + ":log")
    result(t0_ns=t0, t1_ns=t1)


def _read(p: dict[str, Any]) -> None:
    key = _key(p) + ":log"
    _send({**p, "pipeline": 1000}, "rpush", key)
    r = _client(p)
    n = int(p["n"])
    t0 = time.monotonic_ns()
    got = 0
    chunk = 1000 if int(p["pipeline"]) > 1 else 1
    while got < n:
        got += len(r.lrange(key, got, got + chunk - 1))
    t1 = time.monotonic_ns()
    r.delete(key)
    result(t0_ns=t0, t1_ns=t1)


def _inprocess(p: dict[str, Any]) -> None:
    import asyncio

    import redis.asyncio

    n, size, window = int(p["n"]), int(p["size"]), int(p["window"])
    single = bool(p.get("single"))
    payloads = [make_payload(i, size) for i in range(n)]
    ids: list[int] = []
    times = {"t0": 0, "last": 0, "published": 0}

    def hit(data: bytes) -> None:
        times["last"] = time.monotonic_ns()
        ids.append(int(data[:ID_WIDTH]))

    async def main() -> None:
        r = redis.asyncio.Redis(host="127.0.0.1", port=int(p["port"]))
        key = _key(p)
        if single:
            consumer = redis.asyncio.Redis(host="127.0.0.1", port=int(p["port"]))
            await consumer.ping()

            async def receive() -> None:
                while len(ids) < n:
                    got = await consumer.brpop([key], timeout=1)
                    if got is not None:
                        hit(got[1])

            async def send(body: bytes) -> None:
                await r.lpush(key, body)

        else:
            ps = r.pubsub()
            await ps.psubscribe("bench.*")
            while await ps.get_message(timeout=5.0) is None:  # the psubscribe confirmation
                pass

            async def receive() -> None:
                while len(ids) < n:
                    msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg["type"] == "pmessage":
                        hit(msg["data"])

            async def send(body: bytes) -> None:
                await r.publish("bench.topic", body)

        async def publisher(first: int) -> None:
            for i in range(first, n, window):
                await send(payloads[i])

        reader = asyncio.ensure_future(receive())
        times["t0"] = time.monotonic_ns()
        await asyncio.gather(*(publisher(k) for k in range(min(window, n))))
        times["published"] = time.monotonic_ns()
        try:
            await asyncio.wait_for(reader, 60)
        except TimeoutError:
            pass
        await r.aclose()
        if single:
            await consumer.aclose()

    asyncio.run(main())
    result(ids=ids, t0_ns=times["t0"], last_ns=times["last"], published_ns=times["published"])


def _inprocess_ping(p: dict[str, Any]) -> None:
    import asyncio

    import redis.asyncio

    rtt: list[int] = []

    async def main() -> None:
        r = redis.asyncio.Redis(host="127.0.0.1", port=int(p["port"]))
        ps = r.pubsub()
        await ps.subscribe("bench.ping", "bench.pong")
        confirmed = 0
        while confirmed < 2:  # both subscribe confirmations
            if await ps.get_message(timeout=5.0) is not None:
                confirmed += 1
        got = asyncio.Event()

        async def serve() -> None:
            # the echo and the ping's receiver share the subscribed connection
            while True:
                msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is None or msg["type"] != "message":
                    continue
                if msg["channel"] == b"bench.ping":
                    await r.publish("bench.pong", msg["data"])
                else:
                    rtt.append(time.monotonic_ns() - ping_sent_at(msg["data"]))
                    got.set()

        server = asyncio.ensure_future(serve())
        for i in range(int(p["n"])):
            got.clear()
            await r.publish("bench.ping", make_ping(i, int(p["size"])))
            await asyncio.wait_for(got.wait(), 30)
        server.cancel()
        await r.aclose()

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
    "append": _append,
    "read": _read,
}
