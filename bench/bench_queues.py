"""Durable named queues: fsbus beside RabbitMQ, in one run, on tmpfs and journaled ext4.

Two measurements, each on every filesystem (``--fs``, default ``tmpfs,ext4loop``: the
scratch helpers of :mod:`bench.filesystems`), round after round, interleaved and rotated
(A B C D, B C D A, ...), each run in a fresh directory; the median of the rounds is kept
and compared as a speed ratio (above 1 = fsbus faster).

**Work queue** (``flow``): 1 publisher process, 4 consumer processes, 100-byte messages,
N messages (``--quick``: 5,000; full: 50,000). N / (last receipt by any consumer - first
publish). Every payload carries its index; every receipt is counted, and a run where a
message is missing or received twice is a failure (``fail`` in the table). After the
consumers have gone, the queue must be empty (a message received but never acknowledged
would be back in it). Two like-for-like variants:

* ``persistent``: fsbus ``publish(..., durable=True)`` (the message and its queue copy
  fdatasync'ed, their directories fsync'ed, before publish returns) against RabbitMQ
  persistent messages (``delivery_mode=2``) with publisher confirms, one publish waiting
  for its confirm before the next (pika's ``BlockingChannel.confirm_delivery``);
* ``transient``: fsbus ``durable=False`` against RabbitMQ ``delivery_mode=1`` without
  confirms.

fsbus: the harness declares ``bus.declare_queue("bench", ["bench.#"])``; the publisher
calls ``BlockingBus.publish("bench.x", payload, durable=...)`` in a loop; each consumer
is an async ``Bus`` with ``subscribe(None, handler, queue="bench")`` (the default
prefetch: up to ``handler_concurrency`` = 16 claimed at once; acknowledged when the handler
returns). RabbitMQ (pika, a private node started by :class:`bench.systems.rabbitmq.RabbitMQ`
with its data directory on the filesystem under test, one node per filesystem): a durable
topic exchange and a durable classic queue bound ``bench.#``, the publisher publishes on
``bench.x``; consumers ``basic_qos(prefetch_count=16)``, manual ``basic_ack`` of each
message. Secondary figures in the JSON: the publisher's own rate, and CPU µs per message
summed over every process involved (RabbitMQ: its server's processes too).

**Publishing cost** (``publish``): one process, ``BlockingBus.publish("bench.x", 100 B)``
in a loop, no consumers (``--quick``: 10,000; full: 30,000), on:

* ``plain``: a fresh bus with no ``fsbus/queues`` directory (no queue was ever declared);
* ``0 queues``: a bus with one queue bound ``other.#`` (none matches ``bench.x``);
* ``1 queue`` / ``3 queues``: one / three queues bound ``bench.#``;
* ``full queue``: one queue bound ``bench.#`` with ``max_length`` 1,000 (drop-head),
  filled to it first: every copy drops one from the head;
* ``1 queue async``: as ``1 queue``, with ``await bus.publish`` from an async ``Bus``
  (after untimed publishes elsewhere: a new bus measures the mount in a thread first).

After each run every bound queue must hold N messages (the full queue: 1,000, up to a
32nd more). Reported as rates and cost ratios (time per publish): 3 queues / 1 queue
(target ≤ 2x), 0 queues / plain, and full queue / 1 queue; and the speed ratio of
``await bus.publish`` to ``BlockingBus.publish`` into one queue.

    .venv/bin/python -m bench.bench_queues [--quick] [--fs tmpfs,ext4loop] [--rounds R]
        [-n N] [--publish-n N] [--only flow|publish] [--json FILE] [--out FILE] [--profile]

``--profile``: every fsbus consumer of each work-queue run runs under cProfile (every
thread of it, timed by the thread's CPU clock); the top functions of the consumers of
each run, merged, are printed to stderr. ``-v``: each run's per-process CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.child import Tally, make_payload, ready, result
from bench.filesystems import Scratch, scratch, unavailable
from bench.procs import ChildFailed, run_flow, run_single

QUEUE = "bench"
TOPIC = "bench.x"
BINDING = "bench.#"
EXCHANGE = "bench-queues"
CONSUMERS = 4
SIZE = 100
PREFETCH = 16
"""RabbitMQ's prefetch_count: fsbus's default for a queue consumer (``prefetch=None``:
up to ``BusConfig.handler_concurrency``, 16 by default; checked at start)."""
TARGET_VS_RABBIT = 1.5
TARGET_3_VS_1 = 2.0
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "queues.md"
QUICK_OUT = HERE / "results" / "quick" / "queues.md"


# --- children ----------------------------------------------------------------------------
# ``python -m bench.bench_queues --child ROLE PARAMS_JSON``: the protocol of bench.child
# (READY, COUNT, RESULT on stdout; STOP on stdin).


def _cpu() -> tuple[float, float]:
    """This process's user and system CPU seconds so far (every thread)."""
    t = os.times()
    return t.user, t.system


def _write_cpu(p: dict[str, Any], name: str, since: tuple[float, float], msgs: int) -> None:
    user, system = _cpu()
    Path(p["cpu_dir"], name).write_text(
        json.dumps({"user": user - since[0], "sys": system - since[1], "msgs": msgs})
    )


def _fsbus_pub(p: dict[str, Any]) -> None:
    import fsbus

    payloads = [make_payload(i, SIZE) for i in range(int(p["n"]))]
    durable, single = bool(p["durable"]), bool(p.get("single"))
    with fsbus.BlockingBus(p["dir"]) as bus:
        publish = bus.publish
        c0 = _cpu()
        t0 = time.monotonic_ns()
        for body in payloads:
            publish(TOPIC, body, durable=durable, single=single)
        t1 = time.monotonic_ns()
        _write_cpu(p, "pub", c0, len(payloads))
    result(t0_ns=t0, t1_ns=t1)


def _fsbus_consumer(p: dict[str, Any]) -> None:
    import anyio

    import fsbus

    tally = Tally(None)
    profiles: list[cProfile.Profile] | None = [] if p.get("profile") else None
    c0 = [(0.0, 0.0)]

    async def handler(msg: fsbus.Message) -> None:
        tally.hit(msg.payload)

    async def main() -> None:
        if profiles is not None:
            _profile_threads(profiles)  # before the bus starts its worker threads
        async with fsbus.Bus(p["dir"]) as bus:
            if p.get("single"):  # the bus's own work queue, for reference
                sub = await bus.subscribe(BINDING, handler, kind="single")
            else:
                sub = await bus.subscribe(None, handler, queue=QUEUE)
            c0[0] = _cpu()
            ready()
            await anyio.to_thread.run_sync(tally.wait)
            _write_cpu(p, f"consumer-{p['k']}", c0[0], len(tally.ids))
            await bus.unsubscribe(sub)

    anyio.run(main)
    if profiles:
        threading.setprofile(None)
        pstats.Stats(*profiles).dump_stats(p["profile"])
    tally.send_result()


def _profile_threads(profiles: list[cProfile.Profile]) -> None:
    """cProfile this thread, and every thread that starts from now on, each on its own
    profiler (merged at the end): the engine lists and claims in worker threads. The
    timer is the thread's CPU time, so waiting (epoll, locks) counts for nothing."""

    def start(*_: Any) -> None:
        sys.setprofile(None)
        prof = cProfile.Profile(time.thread_time)  # CPU, not waits
        profiles.append(prof)
        prof.enable()

    threading.setprofile(start)
    prof = cProfile.Profile(time.thread_time)  # CPU, not waits
    profiles.append(prof)
    prof.enable()


def _rabbit_conn(p: dict[str, Any]) -> Any:
    import pika

    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(p["port"])))


def _rabbit_pub(p: dict[str, Any]) -> None:
    import pika

    conn = _rabbit_conn(p)
    ch = conn.channel()
    persistent = bool(p["durable"])
    if persistent:
        ch.confirm_delivery()  # each basic_publish waits for the broker's ack
    props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
    payloads = [make_payload(i, SIZE) for i in range(int(p["n"]))]
    publish = ch.basic_publish
    c0 = _cpu()
    t0 = time.monotonic_ns()
    for body in payloads:
        publish(EXCHANGE, TOPIC, body, props)
    conn.process_data_events(0)
    t1 = time.monotonic_ns()
    _write_cpu(p, "pub", c0, len(payloads))
    conn.close()
    result(t0_ns=t0, t1_ns=t1)


def _rabbit_consumer(p: dict[str, Any]) -> None:
    conn = _rabbit_conn(p)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    tally = Tally(None)

    def on_message(c: Any, method: Any, _props: Any, body: bytes) -> None:
        tally.hit(body)
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(p["queue"], on_message)
    c0 = _cpu()
    ready()
    while not tally.finished:
        conn.process_data_events(time_limit=0.05)
    _write_cpu(p, f"consumer-{p['k']}", c0, len(tally.ids))
    conn.close()
    tally.send_result()


def _fsbus_publish_only(p: dict[str, Any]) -> None:
    import fsbus

    payloads = [make_payload(i, SIZE) for i in range(int(p["n"]))]
    if p.get("async"):
        import anyio

        async def main() -> None:
            async with fsbus.Bus(p["dir"]) as bus:
                publish = bus.publish
                # a new bus measures the mount in a worker thread first (not timed)
                for _ in range(ASYNC_WARM_UP):
                    await publish("warm.up", b"x")
                c0 = time.process_time()
                t0 = time.monotonic_ns()
                for body in payloads:
                    await publish(TOPIC, body)
                t1 = time.monotonic_ns()
                cpu = time.process_time() - c0
            result(t0_ns=t0, t1_ns=t1, cpu_s=cpu)

        anyio.run(main)
        return
    with fsbus.BlockingBus(p["dir"]) as bus:
        publish = bus.publish
        publish("warm.up", b"x")  # the first publish of a process opens files: not timed
        c0 = time.process_time()
        t0 = time.monotonic_ns()
        for body in payloads:
            publish(TOPIC, body)
        t1 = time.monotonic_ns()
        cpu = time.process_time() - c0
    result(t0_ns=t0, t1_ns=t1, cpu_s=cpu)


ROLES = {
    "fsbus-pub": _fsbus_pub,
    "fsbus-consumer": _fsbus_consumer,
    "rabbitmq-pub": _rabbit_pub,
    "rabbitmq-consumer": _rabbit_consumer,
    "fsbus-publish-only": _fsbus_publish_only,
}


def child_cmd(role: str, params: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "bench.bench_queues", "--child", role, json.dumps(params)]


# --- the harness ---------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Run:
    """One measurement (one system, one variant, one round)."""

    rate: float | None
    ok: bool = True
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    detail: str = ""
    """Per-process CPU (printed with ``-v``)."""


class Rabbit:
    """A private RabbitMQ node whose data directory is on the filesystem under test.

    :class:`bench.systems.rabbitmq.RabbitMQ` starts it exactly as the main harness does
    (its own node name, ports, ``RABBITMQ_MNESIA_BASE`` in a temp dir); the temp dir is
    made on ``place`` by pointing :mod:`tempfile` there while it starts.
    """

    def __init__(self, place: Path) -> None:
        from bench.systems.rabbitmq import RabbitMQ

        why: str | None = None
        for attempt in range(2):  # a first start right after boot once exited early (0)
            self.sys = RabbitMQ()
            old = tempfile.tempdir
            tempfile.tempdir = str(place)
            try:
                why = self.sys.prepare()
            finally:
                tempfile.tempdir = old
            if not why:
                break
            self.sys.close()
            log(f"  RabbitMQ did not start ({why}){'; trying again' if attempt == 0 else ''}")
        if why:
            raise RuntimeError(why)
        self.port = int(self.sys.extra_params["port"])
        self.data = self.sys._dir

    def channel(self) -> tuple[Any, Any]:
        conn = _rabbit_conn({"port": self.port})
        return conn, conn.channel()

    def cpu_seconds(self) -> float:
        """CPU time of every process of the node's session (beam.smp, epmd is apart)."""
        proc = self.sys._proc
        if proc is None:
            return 0.0
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == proc.pid:  # session id
                total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.sys.close()


def _sync(path: Path) -> None:
    """syncfs before a measurement: nobody pays for another's writeback."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["sync", "-f", str(path)], check=False, timeout=60)


def _cpu_read(cpu_dir: Path) -> dict[str, dict[str, float]]:
    return {f.name: json.loads(f.read_text()) for f in cpu_dir.iterdir()}


def _flow(
    system: str,
    durable: bool,
    n: int,
    place: Scratch,
    rabbit: Rabbit | None,
    *,
    profile: Path | None,
) -> Run:
    """One work-queue run: declare, 4 consumers, 1 publisher, count, check the queue."""
    work = place.workdir(f"flow-{system}")
    work.mkdir(parents=True)
    cpu_dir = work / "cpu"
    cpu_dir.mkdir()
    bus_dir = work / "bus"
    timeout = max(180.0, n / 50)
    try:
        _sync(work)
        base: dict[str, Any] = {"n": n, "durable": durable, "cpu_dir": str(cpu_dir)}
        server_cpu = 0.0
        if system in ("fsbus", "fsbus-wq"):
            import fsbus

            if system == "fsbus":
                with fsbus.BlockingBus(str(bus_dir)) as bus:
                    bus.declare_queue(QUEUE, [BINDING])
            else:
                base["single"] = True
            base["dir"] = str(bus_dir)
            cons = [
                child_cmd(
                    "fsbus-consumer",
                    {**base, "k": k, **({"profile": f"{profile}.{k}"} if profile else {})},
                )
                for k in range(CONSUMERS)
            ]
            pub = child_cmd("fsbus-pub", base)
        else:
            assert rabbit is not None
            qname = f"bench-{work.name}"
            conn, ch = rabbit.channel()
            ch.exchange_declare(EXCHANGE, "topic", durable=True)
            ch.queue_declare(qname, durable=True)
            ch.queue_bind(qname, EXCHANGE, routing_key=BINDING)
            conn.close()
            base |= {"port": rabbit.port, "queue": qname}
            cons = [child_cmd("rabbitmq-consumer", {**base, "k": k}) for k in range(CONSUMERS)]
            pub = child_cmd("rabbitmq-pub", base)
            server_cpu = -rabbit.cpu_seconds()
        try:
            flow = run_flow(pub, cons, count=n, shared=True, timeout=timeout)
        except ChildFailed as exc:
            log(f"  {system} failed: {exc}")
            return Run(None, ok=False, note=str(exc).splitlines()[0][:200])
        if rabbit is not None and system == "rabbitmq":
            server_cpu += rabbit.cpu_seconds()
        notes = []
        if flow.missing:
            notes.append(f"{flow.missing} lost")
        if flow.duplicates:
            notes.append(f"{flow.duplicates} duplicated")
        left = _left_in_queue(system, bus_dir, rabbit, base.get("queue"))
        if left:
            notes.append(f"{left} left in the queue (not acknowledged)")
        ok = not notes
        cpus = _cpu_read(cpu_dir)
        pub_cpu = cpus["pub"]["user"] + cpus["pub"]["sys"]
        per_consumer = [v for k, v in cpus.items() if k != "pub"]
        cons_cpu = sum(v["user"] + v["sys"] for v in per_consumer)
        cons_sys = sum(v["sys"] for v in per_consumer)
        detail = (
            "consumers (messages, user s, sys s): "
            + ", ".join(f"({v['msgs']:.0f}, {v['user']:.2f}, {v['sys']:.2f})" for v in per_consumer)
            + f"; publisher user {cpus['pub']['user']:.2f} s, sys {cpus['pub']['sys']:.2f} s"
        )
        return Run(
            n / flow.seconds if ok else None,
            ok=ok,
            note=", ".join(notes),
            extra={
                "publisher_rate": n / max(flow.publish_seconds, 1e-9),
                "cpu_us_per_msg": (pub_cpu + cons_cpu + server_cpu) / n * 1e6,
                "publisher_cpu_us_per_msg": pub_cpu / n * 1e6,
                "consumers_cpu_us_per_msg": cons_cpu / n * 1e6,
                "consumers_sys_share": cons_sys / max(cons_cpu, 1e-9),
                "server_cpu_us_per_msg": server_cpu / n * 1e6,
            },
            detail=detail,
        )
    finally:
        place.remove(work)


def _left_in_queue(system: str, bus_dir: Path, rabbit: Rabbit | None, qname: str | None) -> int:
    if system in ("fsbus", "fsbus-wq"):
        import fsbus

        if system == "fsbus-wq":  # work-queue messages still in the buckets
            return sum(
                1 for b in (bus_dir / "messages").iterdir() for f in os.listdir(b) if "+s+" in f
            )
        with fsbus.BlockingBus(str(bus_dir)) as bus:
            return bus.queue_info(QUEUE).depth
    assert rabbit is not None
    assert qname is not None
    conn, ch = rabbit.channel()
    try:
        left = int(ch.queue_declare(qname, passive=True).method.message_count)
        ch.queue_delete(qname)
        return left
    finally:
        conn.close()


PUBLISH_VARIANTS = ("plain", "0 queues", "1 queue", "3 queues", "full queue", "1 queue async")
ASYNC_WARM_UP = 300
"""``1 queue async``: plain publishes (not timed) before the timed ones, as in bench_async."""
FULL_LENGTH = 1000
"""``full queue``: one queue bound ``bench.#`` with ``max_length`` this, ``drop-head``,
filled to it before the timed publishes: every copy then drops one from its head."""


def _publish_cost(variant: str, n: int, place: Scratch) -> Run:
    """One process publishing ``n`` messages on a bus with ``variant``'s queues."""
    import fsbus

    work = place.workdir(f"publish-{variant.replace(' ', '')}")
    work.mkdir(parents=True)
    try:
        names: list[str] = []
        if variant != "plain":
            with fsbus.BlockingBus(str(work)) as bus:
                if variant == "0 queues":
                    bus.declare_queue("other", ["other.#"])
                elif variant == "full queue":
                    names = ["full"]
                    bus.declare_queue("full", [BINDING], max_length=FULL_LENGTH)
                    for _ in range(FULL_LENGTH):
                        bus.publish(TOPIC, b"filler")
                else:
                    names = [f"q{i}" for i in range(int(variant[0]))]
                    for name in names:
                        bus.declare_queue(name, [BINDING])
        elif (work / "fsbus" / "queues").exists():
            raise RuntimeError("a fresh bus has a queues directory")
        _sync(work)
        try:
            res = run_single(
                child_cmd(
                    "fsbus-publish-only",
                    {"dir": str(work), "n": n, "async": variant.endswith("async")},
                ),
                timeout=max(120.0, n / 100),
            )
        except ChildFailed as exc:
            log(f"  publish {variant} failed: {exc}")
            return Run(None, ok=False, note=str(exc).splitlines()[0][:200])
        secs = (int(res["t1_ns"]) - int(res["t0_ns"])) / 1e9
        notes = []
        if names:
            with fsbus.BlockingBus(str(work)) as bus:
                for name in names:
                    depth = bus.queue_info(name).depth
                    if variant == "full queue":
                        # drop-head trims once a 32nd over (docs/queues.md, Max length)
                        if not FULL_LENGTH <= depth <= FULL_LENGTH + FULL_LENGTH // 32:
                            notes.append(f"full queue holds {depth}, max_length {FULL_LENGTH}")
                    elif depth != n:
                        notes.append(f"queue {name} holds {depth} of {n}")
        if variant == "plain" and (work / "fsbus" / "queues").exists():
            notes.append("the plain bus grew a queues directory")
        ok = not notes
        return Run(
            n / secs if ok else None,
            ok=ok,
            note=", ".join(notes),
            extra={"cpu_us_per_msg": float(res["cpu_s"]) / n * 1e6},
        )
    finally:
        place.remove(work)


FLOW_VARIANTS = (
    ("fsbus", True),
    ("rabbitmq", True),
    ("fsbus-wq", True),
    ("fsbus", False),
    ("rabbitmq", False),
    ("fsbus-wq", False),
)
"""``fsbus-wq``: for reference, the bus's own work queue (``publish(..., single=True)``,
consumers ``subscribe("bench.#", kind="single")``), no named queue: what a named queue
adds over it (the copy at publish, the queue's own bus in each consumer)."""


def _rotate(items: tuple[Any, ...], r: int) -> list[Any]:
    k = r % len(items)
    return list(items[k:] + items[:k])


def _median(runs: list[Run]) -> float | None:
    vals = [r.rate for r in runs if r.rate is not None]
    if not runs or not vals or not all(r.ok for r in runs):
        return None
    return statistics.median(vals)


def _summary(runs: list[Run]) -> dict[str, Any]:
    keys = {k for r in runs for k in r.extra}
    return {
        "median": _median(runs),
        "ok": bool(runs) and all(r.ok for r in runs),
        "rounds": [r.rate for r in runs],
        "notes": [r.note for r in runs if r.note],
        "extra": {
            k: statistics.median([r.extra[k] for r in runs if k in r.extra]) for k in sorted(keys)
        },
    }


def run_fs(
    fs: str, args: argparse.Namespace, profile_dir: Path | None
) -> tuple[str, dict[str, Any]]:
    """Every measurement on one filesystem; its description and results."""
    out: dict[str, Any] = {"flow": {}, "publish": {}}
    with scratch(fs, size_mb=6144) as place:
        log(f"== {fs}: {place.description} ==")
        rabbit: Rabbit | None = None
        if args.only in (None, "flow"):
            rabbit_dir = place.path / "rabbitmq"
            rabbit_dir.mkdir()
            try:
                rabbit = Rabbit(rabbit_dir)
                log(f"  RabbitMQ node on port {rabbit.port}, data in {rabbit.data}")
            except (RuntimeError, OSError, ImportError) as exc:
                log(f"  RabbitMQ skipped: {exc}")
                out["rabbitmq_skipped"] = str(exc)
        try:
            if args.only in (None, "flow"):
                runs: dict[str, list[Run]] = {}
                for r in range(args.rounds):
                    for system, durable in _rotate(FLOW_VARIANTS, r):
                        if system == "rabbitmq" and rabbit is None:
                            continue
                        key = f"{system}/{'persistent' if durable else 'transient'}"
                        prof = None
                        if profile_dir is not None and system.startswith("fsbus"):
                            prof = profile_dir / f"{fs}-{key.replace('/', '-')}-r{r}.prof"
                        m = _flow(system, durable, args.n, place, rabbit, profile=prof)
                        runs.setdefault(key, []).append(m)
                        log(
                            f"  round {r + 1} {key:<22} "
                            + (f"{m.rate:>10,.0f} msg/s" if m.rate else f"FAILED {m.note}")
                            + f"  (publisher {m.extra.get('publisher_rate', 0):,.0f} msg/s;"
                            f" CPU µs/msg: {m.extra.get('cpu_us_per_msg', 0):.0f} ="
                            f" pub {m.extra.get('publisher_cpu_us_per_msg', 0):.0f}"
                            f" + consumers {m.extra.get('consumers_cpu_us_per_msg', 0):.0f}"
                            f" + server {m.extra.get('server_cpu_us_per_msg', 0):.0f})"
                        )
                        if args.verbose and m.detail:
                            log(f"    {m.detail}")
                out["flow"] = {k: _summary(v) for k, v in runs.items()}
            if args.only in (None, "publish"):
                pruns: dict[str, list[Run]] = {}
                for r in range(args.rounds):
                    for variant in _rotate(PUBLISH_VARIANTS, r):
                        m = _publish_cost(variant, args.publish_n, place)
                        pruns.setdefault(variant, []).append(m)
                        log(
                            f"  round {r + 1} publish, {variant:<9} "
                            + (f"{m.rate:>10,.0f} msg/s" if m.rate else f"FAILED {m.note}")
                        )
                out["publish"] = {k: _summary(v) for k, v in pruns.items()}
        finally:
            if rabbit is not None:
                rabbit.close()
        return place.description, out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def add_ratios(results: dict[str, dict[str, Any]]) -> None:
    for res in results.values():
        flow = res["flow"]
        res["ratios"] = {}
        for variant in ("persistent", "transient"):
            f, q = flow.get(f"fsbus/{variant}"), flow.get(f"rabbitmq/{variant}")
            if f and q:
                res["ratios"][f"fsbus/rabbitmq {variant}"] = _ratio(f["median"], q["median"])
        pub = res["publish"]
        med = {k: v["median"] for k, v in pub.items()}
        # cost ratios: time per publish, i.e. the inverse of the rate ratio
        if pub:
            res["ratios"]["cost 3 queues / 1 queue"] = _ratio(
                med.get("1 queue"), med.get("3 queues")
            )
            res["ratios"]["cost 1 queue / plain"] = _ratio(med.get("plain"), med.get("1 queue"))
            res["ratios"]["cost 0 queues / plain"] = _ratio(med.get("plain"), med.get("0 queues"))
            res["ratios"]["cost full queue / 1 queue"] = _ratio(
                med.get("1 queue"), med.get("full queue")
            )
            # a speed ratio: await bus.publish against BlockingBus.publish, one queue
            res["ratios"]["1 queue, async / blocking"] = _ratio(
                med.get("1 queue async"), med.get("1 queue")
            )


def _rate(v: float | None) -> str:
    return "fail" if v is None else f"{v:,.0f}"


def _cpu_cell(e: dict[str, float]) -> str:
    if "cpu_us_per_msg" not in e:
        return "—"
    parts = f"{e['publisher_cpu_us_per_msg']:.0f} + {e['consumers_cpu_us_per_msg']:.0f}"
    if e.get("server_cpu_us_per_msg"):
        parts += f" + {e['server_cpu_us_per_msg']:.0f}"
    return f"{e['cpu_us_per_msg']:.0f} ({parts})"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Durable queues: fsbus and RabbitMQ",
        "",
        f"- {meta['date']}; {meta['machine']}; Python {meta['python']}; {meta['rabbitmq']}",
        f"- plan **{meta['plan']}**, {meta['rounds']} interleaved rounds, median shown; "
        f"took {meta['seconds']:.0f} s",
        f"- command: `{meta['command']}`",
        f"- fsbus: {meta['fsbus']}",
    ]
    lines += [f"- `{fs}`: {desc}" for fs, desc in meta["filesystems"].items()]
    lines += [
        "",
        "Ratios are measured in the same run: speed ratios fsbus / RabbitMQ (above 1 = "
        "fsbus faster), and cost ratios (time per publish) for publishing into bound queues.",
    ]
    if any(r["flow"] for r in results.values()):
        lines += [
            "",
            f"## Work queue: 1 publisher, {CONSUMERS} consumers, {SIZE} B, {meta['n']:,} messages",
            "",
            "End to end, first publish to last receipt, messages/s; every message counted "
            "(exactly once), and the queue empty after the consumers left. *persistent*: "
            "fsbus `durable=True` vs RabbitMQ `delivery_mode=2` with publisher confirms "
            "(one publish at a time); *transient*: fsbus `durable=False` vs RabbitMQ "
            f"`delivery_mode=1`, no confirms. RabbitMQ prefetch {PREFETCH} = fsbus's "
            "default. *fsbus work queue*: for reference, the bus's own work queue "
            "(`publish(..., single=True)`, consumers `subscribe('bench.#', kind='single')`), "
            "no named queue. Publisher: the publisher's own rate. CPU: µs per message, "
            "publisher + consumers (+ RabbitMQ's server processes).",
            "",
            "| fs | variant | fsbus queue | RabbitMQ | fsbus / RabbitMQ | fsbus work queue | "
            "publisher fsbus | publisher RabbitMQ | CPU µs/msg fsbus | CPU µs/msg RabbitMQ |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for fs, res in results.items():
            for variant in ("persistent", "transient"):
                f = res["flow"].get(f"fsbus/{variant}")
                q = res["flow"].get(f"rabbitmq/{variant}")
                w = res["flow"].get(f"fsbus-wq/{variant}")
                if not f and not q:
                    continue
                fe = f["extra"] if f else {}
                qe = q["extra"] if q else {}
                lines.append(
                    f"| {fs} | {variant} | {_rate(f['median']) if f else '—'} | "
                    f"{_rate(q['median']) if q else 'skipped'} | "
                    f"{_x(res['ratios'].get(f'fsbus/rabbitmq {variant}'))} | "
                    f"{_rate(w['median']) if w else '—'} | "
                    f"{_rate(fe.get('publisher_rate'))} | {_rate(qe.get('publisher_rate'))} | "
                    f"{_cpu_cell(fe)} | {_cpu_cell(qe)} |"
                )
    if any(r["publish"] for r in results.values()):
        lines += [
            "",
            f"## Publishing into bound queues: one process, {SIZE} B, "
            f"{meta['publish_n']:,} messages, no consumers",
            "",
            "`BlockingBus.publish('bench.x', …)` messages/s. *plain*: a fresh bus without a "
            "queues directory; *0 queues*: one queue bound `other.#`; *1* / *3 queues*: bound "
            "`bench.#` (each must hold every message after); *full queue*: one queue bound "
            f"`bench.#` with `max_length={FULL_LENGTH}` (drop-head), filled first, so that "
            "every publish drops a copy from its head; *1 queue async*: as *1 queue*, with "
            "`await bus.publish` from an async `Bus` (after "
            f"{ASYNC_WARM_UP} untimed publishes elsewhere). Cost ratios are time per "
            "publish; *async / blocking* is a speed ratio.",
            "",
            "| fs | plain | 0 queues | 1 queue | 3 queues | full queue | 1 queue async | "
            "cost 0 queues / plain | cost 1 queue / plain | cost 3 queues / 1 queue | "
            "cost full queue / 1 queue | 1 queue, async / blocking |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for fs, res in results.items():
            p = res["publish"]
            if not p:
                continue
            rt = res["ratios"]
            lines.append(
                f"| {fs} | "
                + " | ".join(_rate(p[v]["median"]) if v in p else "—" for v in PUBLISH_VARIANTS)
                + f" | {_x(rt.get('cost 0 queues / plain'))} | {_x(rt.get('cost 1 queue / plain'))}"
                f" | {_x(rt.get('cost 3 queues / 1 queue'))}"
                f" | {_x(rt.get('cost full queue / 1 queue'))}"
                f" | {_x(rt.get('1 queue, async / blocking'))} |"
            )
    lines += [
        "",
        "## Targets",
        "",
        "| target | fs | measured | needed | met |",
        "|---|---|---|---|---|",
    ]
    for fs, res in results.items():
        rt = res["ratios"]
        for variant in ("persistent", "transient"):
            v = rt.get(f"fsbus/rabbitmq {variant}")
            if f"fsbus/rabbitmq {variant}" in rt:
                lines.append(
                    f"| work queue, {variant}: fsbus ≥ {TARGET_VS_RABBIT}x RabbitMQ | {fs} | "
                    f"{_x(v)} | {TARGET_VS_RABBIT:.2f}x | "
                    f"{'—' if v is None else ('yes' if v >= TARGET_VS_RABBIT else 'no')} |"
                )
        if "cost 3 queues / 1 queue" in rt:
            v = rt["cost 3 queues / 1 queue"]
            lines.append(
                f"| publish cost, 3 queues ≤ {TARGET_3_VS_1}x 1 queue | {fs} | {_x(v)} | "
                f"≤ {TARGET_3_VS_1:.2f}x | "
                f"{'—' if v is None else ('yes' if v <= TARGET_3_VS_1 else 'no')} |"
            )
    notes = [
        f"- {fs} {key}: {'; '.join(s['notes'])}"
        for fs, res in results.items()
        for part in ("flow", "publish")
        for key, s in res[part].items()
        if s["notes"]
    ]
    notes += [
        f"- {fs}: RabbitMQ skipped: {res['rabbitmq_skipped']}"
        for fs, res in results.items()
        if "rabbitmq_skipped" in res
    ]
    if notes:
        lines += ["", "## Notes", "", *notes]
    lines += [
        "",
        "Every round is in the JSON (`python -m bench.bench_queues --json FILE`).",
        "",
    ]
    return "\n".join(lines)


def _rabbit_version() -> str:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"RabbitMQ {out} (Debian), pika" if out else "RabbitMQ (version unknown), pika"


def _fsbus_source(init: str) -> str:
    """Which fsbus was measured: its commit, and whether its files differ from it.

    The benchmark may be run from a ``git archive`` copy of a commit (others may be
    editing the working tree): ``FSBUS_BENCH_COMMIT`` then names that commit.
    """
    where = Path(init).resolve().parent
    named = os.environ.get("FSBUS_BENCH_COMMIT")
    if named:
        return f"commit {named} (a copy of it in {where.parent})"
    git = ["git", "-C", str(where)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        return f"{where} (not a git checkout)"
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"commit {head.stdout.strip()}" + (
        " with uncommitted changes to fsbus/" if dirty else ""
    )


def print_profiles(profile_dir: Path) -> None:
    """The consumers of each run merged: CPU seconds by own time, then cumulative."""
    runs = sorted({p.name.rsplit(".", 1)[0] for p in profile_dir.glob("*.prof.*")})
    for run in runs:
        files = sorted(str(p) for p in profile_dir.glob(f"{run}.*"))
        for order in ("tottime", "cumulative"):
            buf = io.StringIO()
            st = pstats.Stats(*files, stream=buf)
            st.sort_stats(order).print_stats(30)
            log(f"--- cProfile, the {len(files)} consumers of {run}, by {order} (CPU s) ---")
            log("\n".join(buf.getvalue().splitlines()[:60]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        ROLES[argv[1]](json.loads(argv[2]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.bench_queues", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="5,000 messages, 2 rounds")
    ap.add_argument("--fs", default="tmpfs,ext4loop", help="comma-separated: tmpfs,ext4loop,disk")
    ap.add_argument("--rounds", type=int, help="rounds (default: 2 quick, 3 full)")
    ap.add_argument("-n", type=int, help="work-queue messages (default: 5,000 quick, 50,000 full)")
    ap.add_argument(
        "--publish-n", type=int, help="messages per publish-cost run (10,000 quick, 30,000 full)"
    )
    ap.add_argument("--only", choices=("flow", "publish"), help="one of the two measurements")
    ap.add_argument("--json", metavar="FILE", help="write the JSON there instead of stdout")
    ap.add_argument(
        "--out",
        metavar="FILE",
        help=f"the Markdown table (default: {DEFAULT_OUT}; with --quick, {QUICK_OUT})",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile the fsbus consumers")
    ap.add_argument("-v", "--verbose", action="store_true", help="per-process CPU of every run")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.n = args.n or (5_000 if args.quick else 50_000)
    args.publish_n = args.publish_n or (10_000 if args.quick else 30_000)

    import fsbus

    if fsbus.BusConfig().handler_concurrency != PREFETCH:
        log(f"note: fsbus's default prefetch is now {fsbus.BusConfig().handler_concurrency}")
    filesystems = [f for f in args.fs.split(",") if f]
    for fs in filesystems:
        why = unavailable(fs)
        if why:
            ap.error(why)
    profile_dir = Path(tempfile.mkdtemp(prefix="fsbus-bench-prof-")) if args.profile else None
    t0 = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    described: dict[str, str] = {}
    for fs in filesystems:
        described[fs], results[fs] = run_fs(fs, args, profile_dir)
    add_ratios(results)
    meta = {
        "plan": "quick" if args.quick else "full",
        "rounds": args.rounds,
        "n": args.n,
        "publish_n": args.publish_n,
        "filesystems": described,
        "seconds": round(time.monotonic() - t0, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"Linux {platform.release()}",
        "python": platform.python_version(),
        "rabbitmq": _rabbit_version(),
        "command": " ".join(["python -m bench.bench_queues", *argv]),
        "fsbus": _fsbus_source(fsbus.__file__),
    }
    md = markdown(results, meta)
    out = Path(args.out) if args.out else QUICK_OUT if args.quick else DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    log(md)
    log(f"wrote {out}")
    doc = json.dumps({"meta": meta, "results": results}, indent=2)
    if args.json:
        Path(args.json).write_text(doc)
    else:
        print(doc)
    if profile_dir is not None:
        print_profiles(profile_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
