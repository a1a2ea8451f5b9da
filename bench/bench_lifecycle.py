"""What a test pays for its messaging: a bus's whole life beside a RabbitMQ session.

A test suite that uses fsbus gives each test a bus on a new directory (as the pytest
plugin's fixtures do); one that uses RabbitMQ connects each test to a broker started
once. This measures, per test, on each filesystem (``--fs``, default tmpfs and journaled
ext4, see ``bench/filesystems.py``), the cycles taking turns:

* ``fsbus``: ``async with Bus(new directory)``, ``subscribe`` to a topic, ``publish``
  one message and wait for it in the handler, then close the bus (leave the block);
* ``rabbitmq``: ``pika.BlockingConnection`` to a private node whose data directory is on
  the same filesystem (started once, untimed, as a suite's broker is), a channel, an
  exclusive server-named queue, ``basic_publish`` to it, ``basic_get`` until it comes,
  ``basic_ack``, then close the connection.

Median milliseconds of each phase and of the whole cycle over ``--cycles`` cycles (after
a few untimed ones), and the speed ratio of the whole cycle, fsbus / RabbitMQ (above 1 =
fsbus faster). Every message is checked to come back.

    .venv/bin/python -m bench.bench_lifecycle [--fs tmpfs,ext4loop] [--cycles 60] [--json FILE]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

import fsbus
from bench.bench_queues import Rabbit, _fsbus_source, log
from bench.filesystems import scratch, unavailable

PHASES = ("open", "subscribe", "round trip", "close")
WARM = 5


async def _fsbus_cycle(root: Path, payload: bytes) -> dict[str, float]:
    from fsbus import Bus, Message

    got = anyio.Event()
    seen: list[bytes] = []

    async def handler(msg: Message) -> None:
        seen.append(msg.payload)
        got.set()

    t0 = time.perf_counter()
    async with Bus(root) as bus:
        t1 = time.perf_counter()
        await bus.subscribe("test.event", handler)
        t2 = time.perf_counter()
        await bus.publish("test.event", payload)
        with anyio.fail_after(10):
            await got.wait()
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    if seen != [payload]:
        raise AssertionError(f"fsbus: the message came back as {seen!r}")
    return {"open": t1 - t0, "subscribe": t2 - t1, "round trip": t3 - t2, "close": t4 - t3}


def _rabbit_cycle(port: int, payload: bytes) -> dict[str, float]:
    import pika

    t0 = time.perf_counter()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    t1 = time.perf_counter()
    queue = ch.queue_declare("", exclusive=True).method.queue
    t2 = time.perf_counter()
    ch.basic_publish("", queue, payload)
    deadline = time.monotonic() + 10
    while True:
        method, _props, body = ch.basic_get(queue)
        if method is not None:
            break
        if time.monotonic() > deadline:
            raise AssertionError("rabbitmq: the message did not come back")
    ch.basic_ack(method.delivery_tag)
    t3 = time.perf_counter()
    conn.close()
    t4 = time.perf_counter()
    if body != payload:
        raise AssertionError(f"rabbitmq: the message came back as {body!r}")
    return {"open": t1 - t0, "subscribe": t2 - t1, "round trip": t3 - t2, "close": t4 - t3}


def measure(fs: str, cycles: int) -> dict[str, Any]:
    """Both systems' cycles on filesystem ``fs``, taking turns; per system and phase, the
    seconds of every timed cycle."""
    times: dict[str, dict[str, list[float]]] = {
        system: {p: [] for p in (*PHASES, "total")} for system in ("fsbus", "rabbitmq")
    }
    with scratch(fs) as place:
        rabbit = Rabbit(place.path)
        try:
            runs: dict[str, Callable[[int], dict[str, float]]] = {
                "fsbus": lambda i: anyio.run(
                    _fsbus_cycle, place.path / f"bus-{i}", f"message {i}".encode()
                ),
                "rabbitmq": lambda i: _rabbit_cycle(rabbit.port, f"message {i}".encode()),
            }
            for i in range(WARM + cycles):
                order = ("fsbus", "rabbitmq") if i % 2 == 0 else ("rabbitmq", "fsbus")
                for system in order:
                    phases = runs[system](i)
                    if i < WARM:
                        continue
                    for p, s in phases.items():
                        times[system][p].append(s)
                    times[system]["total"].append(sum(phases.values()))
        finally:
            rabbit.sys.close()
        return {"fs": fs, "description": place.description, "times": times}


def report(results: list[dict[str, Any]], cycles: int) -> str:
    lines = [
        "# A test's messaging: a bus's life beside a RabbitMQ session",
        "",
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; fsbus: "
        f"{_fsbus_source(fsbus.__file__)}; {cycles} cycles a system and filesystem, "
        "taking turns; medians in ms",
        *(f"- `{r['fs']}`: {r['description']}" for r in results),
        "- fsbus: open a Bus on a new directory, subscribe, publish one message and "
        "receive it, close; RabbitMQ: connect (the node started once, untimed), declare "
        "an exclusive queue, publish, `basic_get`, ack, close",
        "",
        "| fs | system | open | subscribe / declare | round trip | close | whole | "
        "fsbus / RabbitMQ (speed) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        med = {
            s: {p: statistics.median(v) * 1000 for p, v in ph.items()}
            for s, ph in r["times"].items()
        }
        ratio = med["rabbitmq"]["total"] / med["fsbus"]["total"]
        for s in ("fsbus", "rabbitmq"):
            m = med[s]
            cells = " | ".join(f"{m[p]:.2f}" for p in (*PHASES, "total"))
            lines.append(
                f"| {r['fs']} | {s} | {cells} | {f'{ratio:.2f}x' if s == 'fsbus' else ''} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_lifecycle", description=__doc__)
    ap.add_argument("--fs", default="tmpfs,ext4loop")
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = ap.parse_args(argv)
    results = []
    for fs in args.fs.split(","):
        why = unavailable(fs)
        if why:
            log(f"{fs}: skipped ({why})")
            continue
        log(f"== {fs} ==")
        results.append(measure(fs, args.cycles))
    text = report(results, args.cycles)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
