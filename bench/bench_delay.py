"""Delay queues through the AMQP gateway beside RabbitMQ: expired (and dropped) messages
dead-lettered.

RabbitMQ's "retry after a delay": a ``wait`` queue with ``x-message-ttl`` and a
dead-letter exchange leading to a ``work`` queue, and no consumer of ``wait``. One pika
client (``BlockingConnection``) publishes 100 B messages to ``wait`` through the default
exchange, noting when each was published, and consumes ``work`` (``prefetch_count=100``,
manual acks), noting when each arrives. On the gateway, the expired messages are found
by its look for them (about once a second, sooner when the next one is due: see
docs/queues.md, "Delays"), sent on through its own dead-letter queue and routed; on
RabbitMQ, by the queue's expiry timer.

Two scenarios: *burst*, N messages published at once (they expire within the time it
took to publish them), and *steady*, 1,000 a second for 5 s (2 s quick). A third,
*overflow*, dead-letters by length, not time: the wait queue has ``x-max-length`` 100 and
no ttl, N messages are published at once, and the oldest N - 100 are dropped from its
head into the work queue (reason ``maxlen``; on the gateway through the queue's spool of
dropped messages, see docs/queues.md, "Overflow"); the newest 100 must stay.

* **late**: how long after its expiry (publish time + ttl) each message reached the
  client (*overflow*: after the publish of the message that pushed it out): median, 99th
  percentile and the worst, in ms;
* **rate** (burst): N / (the first message's expiry .. the last receipt): how fast a
  backlog that expires at once is dead-lettered; (overflow): (N - 100) / (the first
  publish .. the last receipt).

Each (server, round) runs on fresh queues, the order of the two servers alternating; the
medians of the rounds are kept. Ratios are speeds, fsbus / RabbitMQ (above 1 = fsbus
faster): RabbitMQ's lateness over fsbus's, fsbus's rate over RabbitMQ's. Every message is
counted: a loss or a duplicate fails the run, and ``wait`` must be empty at the end.

    python -m bench.bench_delay --quick        # 2,000 messages, 3 rounds, tmpfs and ext4loop
    python -m bench.bench_delay --json FILE    # 10,000 messages
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.bench_amqp import FS_DEFAULT, PREFETCH, SIZE, SYSTEMS, Server, log
from bench.filesystems import scratch, unavailable

TTL_MS = 1000
PACE = 1000.0
"""Messages a second of the *steady* scenario."""
STEADY_QUICK, STEADY_FULL = 2.0, 5.0
"""Seconds of publishing of the *steady* scenario."""
OVERFLOW_LENGTH = 100
"""``x-max-length`` of the *overflow* scenario's wait queue."""
STALL_SECONDS = 30.0
"""A run that receives nothing for this long fails, saying what it has."""


def one_run(
    server: Server, n: int, ttl_ms: int, pace: float | None, *, overflow: bool = False
) -> dict[str, Any]:
    """Publish ``n`` messages into a fresh wait queue (all at once, or ``pace`` a second)
    and take them all from its work queue; the lateness of each and the rate (see the
    module's doc). ``overflow``: the wait queue has a length, not a ttl."""
    conn, ch = server.channel()
    tag = secrets.token_hex(4)
    work = ch.queue_declare(f"delay-work-{tag}", durable=True).method.queue
    limit: dict[str, Any] = (
        {"x-max-length": OVERFLOW_LENGTH} if overflow else {"x-message-ttl": ttl_ms}
    )
    wait = ch.queue_declare(
        f"delay-wait-{tag}",
        durable=True,
        arguments={
            **limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work,
        },
    ).method.queue
    kept = OVERFLOW_LENGTH if overflow else 0
    want = n - kept
    ch.basic_qos(prefetch_count=PREFETCH)
    arrived: dict[int, float] = {}
    duplicates = 0
    last_news = time.monotonic()

    def on_message(c: Any, method: Any, _props: Any, body: bytes) -> None:
        nonlocal duplicates, last_news
        now = time.time()
        i = int(body.split(b" ", 1)[0])
        if i in arrived:
            duplicates += 1
        arrived[i] = now
        last_news = time.monotonic()
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(work, on_message)
    published: list[float] = []
    start = time.time()
    for i in range(n):
        if pace is not None:
            due = start + i / pace
            while (gap := due - time.time()) > 0:
                conn.process_data_events(time_limit=gap)  # what arrived meanwhile
        published.append(time.time())
        ch.basic_publish("", wait, str(i).encode().ljust(SIZE, b" "))
    last_news = time.monotonic()
    while len(arrived) < want:
        conn.process_data_events(time_limit=0.1)
        if time.monotonic() - last_news > STALL_SECONDS + ttl_ms / 1000:
            break
    conn.process_data_events(time_limit=0.2)  # a duplicate would come now
    left = int(ch.queue_declare(wait, passive=True).method.message_count)
    for q in (wait, work):
        ch.queue_delete(q)
    conn.close()
    ok = set(arrived) == set(range(want)) and not duplicates and left == kept
    if overflow:  # dropped when the message OVERFLOW_LENGTH after it came
        late = sorted(arrived[i] - published[i + kept] for i in arrived if i + kept < n)
        start_at = published[0]
    else:
        late = sorted(arrived[i] - (published[i] + ttl_ms / 1000) for i in arrived)
        start_at = published[0] + ttl_ms / 1000
    rate = want / (max(arrived.values()) - start_at) if ok else None
    return {
        "ok": ok,
        "note": "" if ok else f"{len(arrived)} of {want}, {duplicates} twice, {left} left",
        "late_p50_ms": 1000 * late[len(late) // 2] if late else None,
        "late_p99_ms": 1000 * late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
        "late_max_ms": 1000 * late[-1] if late else None,
        "rate": rate,
    }


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if r["ok"] and r[key] is not None]
    return statistics.median(vals) if vals else None


def run_fs(
    fs: str, scenarios: list[tuple[str, int, float | None]], rounds: int, ttl_ms: int
) -> tuple[str, dict[str, Any]]:
    out: dict[str, Any] = {}
    with scratch(fs, size_mb=2048) as place:
        log(f"== {fs}: {place.description} ==")
        servers = {s: Server(s, place) for s in SYSTEMS}
        try:
            for name, n, pace in scenarios:
                runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
                for r in range(rounds):
                    order = SYSTEMS if r % 2 == 0 else tuple(reversed(SYSTEMS))
                    for s in order:
                        over = name == "overflow"
                        run = one_run(servers[s], n, ttl_ms, pace, overflow=over)
                        log(f"{fs} {name} round {r + 1} {s}: {run}")
                        runs[s].append(run)
                out[name] = {}
                for s in SYSTEMS:
                    keys = ("late_p50_ms", "late_p99_ms", "late_max_ms", "rate")
                    out[name][s] = {k: _median(runs[s], k) for k in keys}
                    out[name][s]["ok"] = all(r["ok"] for r in runs[s])
                    out[name][s]["runs"] = runs[s]
        finally:
            for server in servers.values():
                server.close()
        return place.description, out


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def _ms(v: float | None) -> str:
    return "fail" if v is None else f"{v:,.0f}"


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Dead-lettering by time (delay queues) and by length (overflow): fsbus and RabbitMQ",
        "",
        f"- {meta['date']}; {meta['machine']}; Python {meta['python']}",
        f"- {SIZE} B messages, x-message-ttl {meta['ttl_ms']} ms, {meta['rounds']} rounds, "
        f"medians; took {meta['seconds']:.0f} s",
        f"- command: `{meta['command']}`",
        "",
        "*burst*: all N published at once, so they expire within the publishing time; "
        f"*steady*: {meta['pace']:,.0f} a second. *overflow*: no ttl, x-max-length "
        f"{OVERFLOW_LENGTH}, N published at once: the oldest N - {OVERFLOW_LENGTH} are "
        "dead-lettered (reason maxlen). *late*: ms from a message's expiry (overflow: the "
        "publish that pushed it out) to its receipt (median, 99th percentile, worst); "
        "*rate* (burst, overflow): messages dead-lettered a second, from the first expiry "
        "(overflow: the first publish) to the last receipt. Ratios are speeds, fsbus / "
        "RabbitMQ (above 1 = fsbus faster).",
        "",
        "| fs | scenario | N | late p50 fsbus | RabbitMQ | late p99 fsbus | RabbitMQ "
        "| worst fsbus | RabbitMQ | rate fsbus | RabbitMQ | p50 ratio | rate ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fs, by_scenario in results.items():
        for name, res in by_scenario.items():
            f, r = res["fsbus"], res["rabbitmq"]
            burst = name in ("burst", "overflow")
            lines.append(
                f"| {fs} | {name} | {meta['n'][name]:,} "
                f"| {_ms(f['late_p50_ms'])} | {_ms(r['late_p50_ms'])} "
                f"| {_ms(f['late_p99_ms'])} | {_ms(r['late_p99_ms'])} "
                f"| {_ms(f['late_max_ms'])} | {_ms(r['late_max_ms'])} "
                f"| {_ms(f['rate']) if burst else '-'} | {_ms(r['rate']) if burst else '-'} "
                f"| {_ratio(r['late_p50_ms'], f['late_p50_ms'])} "
                f"| {_ratio(f['rate'], r['rate']) if burst else '-'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.bench_delay", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2,000 messages")
    ap.add_argument("--fs", default=FS_DEFAULT, help="comma-separated: tmpfs,ext4loop,disk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, help="burst messages (default: 2,000 quick, 10,000 full)")
    ap.add_argument("--ttl", type=int, default=TTL_MS, help="x-message-ttl in ms")
    ap.add_argument("--pace", type=float, default=PACE, help="steady messages a second")
    ap.add_argument("--json", metavar="FILE", help="write the JSON there instead of stdout")
    ap.add_argument("--out", metavar="FILE", help="write the Markdown there too")
    args = ap.parse_args(argv)
    n = args.n or (2_000 if args.quick else 10_000)
    steady = max(1, int(args.pace * (STEADY_QUICK if args.quick else STEADY_FULL)))
    scenarios = [("burst", n, None), ("steady", steady, args.pace), ("overflow", n, None)]
    filesystems = [f for f in args.fs.split(",") if f]
    for fs in filesystems:
        why = unavailable(fs)
        if why:
            ap.error(why)
    t0 = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    for fs in filesystems:
        _described, results[fs] = run_fs(fs, scenarios, args.rounds, args.ttl)
    meta = {
        "n": {name: count for name, count, _ in scenarios},
        "pace": args.pace,
        "ttl_ms": args.ttl,
        "rounds": args.rounds,
        "seconds": time.monotonic() - t0,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"Linux {platform.release()}",
        "python": platform.python_version(),
        "command": " ".join(["python -m bench.bench_delay", *argv]),
    }
    md = markdown(results, meta)
    log(md)
    if args.out:
        Path(args.out).write_text(md)
    doc = json.dumps({"meta": meta, "results": results}, indent=2)
    if args.json:
        Path(args.json).write_text(doc)
    else:
        print(doc)
    ok = all(res[s]["ok"] for by in results.values() for res in by.values() for s in SYSTEMS)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
