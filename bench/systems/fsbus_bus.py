"""fsbus's Bus, through the public API only.

Publishers use ``BlockingBus.publish`` in a plain loop (the fair comparison with the raw
loop: one call per message, each message in its bucket when the call returns); subscribers,
workers and the latency pair use the async ``Bus`` with a handler. ``fsbus`` runs the default
configuration (inotify wake-ups plus UPDATE polling); ``fsbus-poll`` forces polling only
(``force_polling=True``, what a network filesystem gets). ``match`` times ``TopicTrie``.

The in-process scenarios use the async ``Bus`` only: one event loop subscribes (``kind``
multi or single) and publishes with ``await bus.publish`` from ``window`` tasks (50 in
flight), or runs the ping and the echo handler side by side on the same bus.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

from bench.child import ID_WIDTH, Tally, make_payload, make_ping, ping_sent_at, ready, result
from bench.scenarios import Kind, Scenario
from bench.systems.base import System

TOPIC = "bench.topic"


class FsBus(System):
    name: ClassVar[str] = "fsbus"
    label: ClassVar[str] = "fsbus Bus"
    module: ClassVar[str] = "fsbus_bus"
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {
            "publish",
            "publish_durable",
            "fanout",
            "workqueue",
            "latency",
            "latency_single",
            "match",
            "inprocess",
            "inprocess_single",
            "latency_inprocess",
        }
    )
    extra_params: ClassVar[dict[str, Any]] = {"polling": False}

    def prepare(self) -> str | None:
        try:
            import fsbus
        except ImportError as exc:  # pragma: no cover - the harness runs in the venv
            return f"fsbus does not import: {exc}"
        if not hasattr(fsbus, "BlockingBus"):
            return "this fsbus has no Bus yet"
        return None

    def supports(self, sc: Scenario) -> bool:
        if sc.kind == "match" and sc.kind in self.kinds:
            import fsbus

            # the harness uses public names only (an older fsbus kept the trie private)
            return hasattr(fsbus, "TopicTrie")
        return super().supports(sc)


class FsBusPolling(FsBus):
    name: ClassVar[str] = "fsbus-poll"
    label: ClassVar[str] = "fsbus Bus, polling only"
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {"fanout", "workqueue", "latency", "latency_single"}
    )
    extra_params: ClassVar[dict[str, Any]] = {"polling": True}
    latency_probes: ClassVar[int | None] = 10


def _config(p: dict[str, Any]) -> Any:
    import fsbus

    return fsbus.BusConfig(force_polling=bool(p.get("polling")))


def _pub(p: dict[str, Any]) -> None:
    import fsbus

    n, size = int(p["n"]), int(p["size"])
    single, durable = bool(p.get("single")), bool(p.get("durable"))
    payloads = [make_payload(i, size) for i in range(n)]
    with fsbus.BlockingBus(p["dir"], config=_config(p)) as bus:
        t0 = time.monotonic_ns()
        for body in payloads:
            bus.publish(TOPIC, body, single=single, durable=durable)
        t1 = time.monotonic_ns()
    result(t0_ns=t0, t1_ns=t1)


async def _wait(tally: Tally) -> None:
    import anyio

    await anyio.to_thread.run_sync(tally.wait)


def _consume(p: dict[str, Any], expect: int | None) -> None:
    import anyio

    import fsbus

    tally = Tally(expect)

    async def handler(msg: fsbus.Message) -> None:
        tally.hit(msg.payload)

    async def main() -> None:
        async with fsbus.Bus(p["dir"], config=_config(p)) as bus:
            sub = await bus.subscribe(TOPIC, handler)
            ready()
            await _wait(tally)
            await bus.unsubscribe(sub)

    anyio.run(main)
    tally.send_result()


def _sub(p: dict[str, Any]) -> None:
    _consume(p, p.get("expect"))


def _worker(p: dict[str, Any]) -> None:
    _consume(p, None)


def _echo(p: dict[str, Any]) -> None:
    import anyio

    import fsbus

    tally = Tally(None)  # for STOP only
    single = bool(p.get("single"))

    async def main() -> None:
        async with fsbus.Bus(p["dir"], config=_config(p)) as bus:

            async def handler(msg: fsbus.Message) -> None:
                now = b"%020d" % time.monotonic_ns()
                await bus.publish("bench.pong", now + msg.payload, single=single)

            await bus.subscribe("bench.ping", handler)
            ready()
            await _wait(tally)

    anyio.run(main)


def _ping(p: dict[str, Any]) -> None:
    import anyio

    import fsbus

    rtt: list[int] = []
    oneway: list[int] = []
    single = bool(p.get("single"))

    async def main() -> None:
        got: anyio.Event = anyio.Event()

        async def handler(msg: fsbus.Message) -> None:
            t = time.monotonic_ns()
            sent = ping_sent_at(msg.payload[20:])
            rtt.append(t - sent)
            oneway.append(int(msg.payload[:20]) - sent)
            got.set()

        async with fsbus.Bus(p["dir"], config=_config(p)) as bus:
            await bus.subscribe("bench.pong", handler)
            for i in range(int(p["n"])):
                got = anyio.Event()
                await bus.publish("bench.ping", make_ping(i, int(p["size"])), single=single)
                with anyio.fail_after(30):
                    await got.wait()

    anyio.run(main)
    result(rtt_ns=rtt, oneway_ns=oneway)


def _inprocess(p: dict[str, Any]) -> None:
    import anyio

    import fsbus

    n, size, window = int(p["n"]), int(p["size"]), int(p["window"])
    single = bool(p.get("single"))
    payloads = [make_payload(i, size) for i in range(n)]
    ids: list[int] = []
    times = {"t0": 0, "last": 0, "published": 0}

    async def main() -> None:
        done = anyio.Event()

        async def handler(msg: fsbus.Message) -> None:
            times["last"] = time.monotonic_ns()
            ids.append(int(msg.payload[:ID_WIDTH]))
            if len(ids) >= n:
                done.set()

        async with fsbus.Bus(p["dir"], config=_config(p)) as bus:
            await bus.subscribe(TOPIC, handler, kind="single" if single else "multi")

            async def publisher(first: int) -> None:
                for i in range(first, n, window):
                    await bus.publish(TOPIC, payloads[i], single=single)

            times["t0"] = time.monotonic_ns()
            async with anyio.create_task_group() as tg:
                for k in range(min(window, n)):
                    tg.start_soon(publisher, k)
            times["published"] = time.monotonic_ns()
            with anyio.move_on_after(60):
                await done.wait()

    anyio.run(main)
    result(ids=ids, t0_ns=times["t0"], last_ns=times["last"], published_ns=times["published"])


def _inprocess_ping(p: dict[str, Any]) -> None:
    import anyio

    import fsbus

    rtt: list[int] = []

    async def main() -> None:
        got = [anyio.Event()]

        async with fsbus.Bus(p["dir"], config=_config(p)) as bus:

            async def echo(msg: fsbus.Message) -> None:
                await bus.publish("bench.pong", msg.payload)

            async def pong(msg: fsbus.Message) -> None:
                rtt.append(time.monotonic_ns() - ping_sent_at(msg.payload))
                got[0].set()

            await bus.subscribe("bench.ping", echo)
            await bus.subscribe("bench.pong", pong)
            for i in range(int(p["n"])):
                got[0] = anyio.Event()
                await bus.publish("bench.ping", make_ping(i, int(p["size"])))
                with anyio.fail_after(30):
                    await got[0].wait()

    anyio.run(main)
    result(rtt_ns=rtt)


def _match(p: dict[str, Any]) -> None:
    import fsbus

    trie_cls = getattr(fsbus, "TopicTrie", None)
    if trie_cls is None:
        raise SystemExit("fsbus does not export TopicTrie")
    with open(p["file"], encoding="utf-8") as f:
        data = json.load(f)
    trie = trie_cls()
    a0 = time.perf_counter()
    for k, b in enumerate(data["bindings"]):
        trie.add(b, k)
    a1 = time.perf_counter()
    matches = 0
    match_set = trie.match_set
    t0 = time.perf_counter()
    for t in data["topics"]:
        matches += len(match_set(t))
    t1 = time.perf_counter()
    result(seconds=t1 - t0, add_seconds=a1 - a0, matches=matches)


ROLES = {
    "pub": _pub,
    "sub": _sub,
    "worker": _worker,
    "echo": _echo,
    "ping": _ping,
    "match": _match,
    "inprocess": _inprocess,
    "inprocess_ping": _inprocess_ping,
}
