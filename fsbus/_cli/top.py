"""``fsbus top``: live rates and backlog per topic, bucket, stream and queue.

Rates come from comparing two snapshots: a message name that appeared was published
(in), one that vanished was consumed, expired or collected (out); a stream's rate is
the growth of its end offset. A durable queue's rates are measured the same way on the
names of the copies in it (``bus.browse(queue=...)``): a copy that appeared was routed
into it, one that vanished was acknowledged, expired, dropped or purged. Messages
published and consumed between two snapshots are not seen, so ``in``/``out`` are
lower bounds on a busy bus.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .browse import Snapshot, take_snapshot
from .output import emit, emit_json, format_size, format_table
from .runtime import bus_config, interruptible, resolve_root, run_async

if TYPE_CHECKING:
    from fsbus import Bus, QueueInfo

# anyio and the Bus are imported when the command runs, not for --help.

__all__ = ["add_top_command", "frame_json", "frame_lines", "queue_copies", "queue_rates"]

QueueCopies = Mapping[str, Collection[str]]
"""Queue name -> the names of the copies in it at one moment."""

CLEAR = "\x1b[H\x1b[2J"
BOLD = "\x1b[1m"
RESET = "\x1b[0m"


def add_top_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Register ``top`` on ``subparsers``."""
    p = subparsers.add_parser(
        "top",
        parents=[common],
        help="live message rates and backlog per topic, bucket, stream and queue",
        description="Redraw, every --interval seconds, the backlog (messages waiting, "
        "locked, bytes) and rates (in: newly published, out: consumed or expired) per "
        "topic, the deepest buckets, each stream's size and append rate, and each durable "
        "queue's depth, consumers and rates (in: copies routed into it, out: acknowledged, "
        "expired, dropped or purged). Ctrl-C "
        "quits (exit status 0). --once prints a single frame measured over one interval.",
    )
    p.add_argument(
        "--interval",
        metavar="SECONDS",
        type=float,
        default=1.0,
        help="seconds between refreshes (1.0)",
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--limit", metavar="N", type=int, help="topics shown (default: fits)")
    p.set_defaults(func=run_top)


async def queue_copies(bus: Bus) -> tuple[list[QueueInfo], dict[str, frozenset[str]]]:
    """Every durable queue now, and the names of the copies in each (browsed, not taken).

    A queue's depth is the number of copies browsed, so that the depth and the rates of a
    frame come from one listing (a copy routed between a count and a browse would
    otherwise be counted as arrived and not be in the depth)."""
    from fsbus import QueueNotFound

    infos = []
    copies: dict[str, frozenset[str]] = {}
    for q in await bus.queues():
        try:
            copies[q.name] = frozenset([i.name async for i in bus.browse(queue=q.name)])
        except QueueNotFound:
            continue  # deleted while we looked
        infos.append(dataclasses.replace(q, depth=len(copies[q.name])))
    return infos, copies


def queue_rates(
    before: QueueCopies, after: QueueCopies, seconds: float
) -> dict[str, tuple[float, float]]:
    """(in, out) copies per second of each queue in ``after``, over ``seconds``.

    As for topics: a copy name present in ``after`` and not in ``before`` arrived, one
    in ``before`` and not in ``after`` left. A queue new in ``after`` counts all its
    copies as arrivals; a queue gone from ``after`` is not reported.
    """
    dt = max(seconds, 1e-6)
    out = {}
    for name, now in after.items():
        then = before.get(name, ())
        now_set, then_set = set(now), set(then)
        out[name] = (
            round(len(now_set - then_set) / dt, 2),
            round(len(then_set - now_set) / dt, 2),
        )
    return out


def frame_json(
    prev: Snapshot,
    cur: Snapshot,
    num_buckets: int,
    queues: Sequence[QueueInfo] = (),
    copies: tuple[QueueCopies, QueueCopies] | None = None,
) -> dict[str, Any]:
    """Backlog and rates between two snapshots (and the queues now), as one JSON object.

    ``copies``: the names of each queue's copies at ``prev`` and at ``cur`` (from
    :func:`queue_copies`), for the queues' ``in_rate``/``out_rate`` (None without them).
    """
    dt = max(cur.taken - prev.taken, 1e-6)
    rates = queue_rates(copies[0], copies[1], dt) if copies is not None else {}
    before = {m.name: m.topic for m in prev.messages}
    after = {m.name: m.topic for m in cur.messages}
    arrived = Counter(t for n, t in after.items() if n not in before)
    left = Counter(t for n, t in before.items() if n not in after)
    per: dict[str, dict[str, Any]] = {}
    for m in cur.messages:
        row = per.setdefault(
            m.topic, {"topic": m.topic, "multi": 0, "single": 0, "locked": 0, "bytes": 0}
        )
        row["single" if m.single else "multi"] += 1
        row["locked"] += int(m.locked)
        row["bytes"] += m.size
    for topic in set(arrived) | set(left):
        per.setdefault(topic, {"topic": topic, "multi": 0, "single": 0, "locked": 0, "bytes": 0})
    topics = []
    for topic, row in per.items():
        row["in_rate"] = round(arrived[topic] / dt, 2)
        row["out_rate"] = round(left[topic] / dt, 2)
        topics.append(row)
    topics.sort(key=lambda r: (-(r["multi"] + r["single"]), -r["in_rate"], r["topic"]))
    buckets = Counter(m.bucket for m in cur.messages)
    old_streams = {s.name: s for s in prev.streams}
    streams = []
    for s in cur.streams:
        old = old_streams.get(s.name)
        grown = s.end_offset - old.end_offset if old is not None else 0
        streams.append(
            {
                "name": s.name,
                "records": s.end_offset - s.start_offset,
                "end_offset": s.end_offset,
                "bytes": s.size_bytes,
                "append_rate": round(max(grown, 0) / dt, 2),
            }
        )
    return {
        "time": cur.taken,
        "interval": round(dt, 3),
        "messages": len(cur.messages),
        "bytes": sum(m.size for m in cur.messages),
        "in_rate": round(sum(arrived.values()) / dt, 2),
        "out_rate": round(sum(left.values()) / dt, 2),
        "topics": topics,
        "buckets": {
            "total": num_buckets,
            "in_use": len(buckets),
            "deepest": [{"bucket": b, "messages": n} for b, n in buckets.most_common(5)],
        },
        "streams": streams,
        "queues": [
            {
                "name": q.name,
                "depth": q.depth,
                "consumers": q.consumers,
                "in_rate": rates[q.name][0] if q.name in rates else None,
                "out_rate": rates[q.name][1] if q.name in rates else None,
            }
            for q in sorted(queues, key=lambda q: q.name)
        ],
    }


def frame_lines(frame: dict[str, Any], root: Path, *, limit: int, color: bool) -> list[str]:
    """The text form of :func:`frame_json`."""
    bold, reset = (BOLD, RESET) if color else ("", "")
    stamp = time.strftime("%H:%M:%S", time.localtime(frame["time"]))
    b = frame["buckets"]
    lines = [
        f"{bold}fsbus top{reset} {root}  {stamp}  every {frame['interval']:.1f}s",
        f"messages {frame['messages']} ({format_size(frame['bytes'])})  "
        f"in {frame['in_rate']:,.1f}/s  out {frame['out_rate']:,.1f}/s  "
        f"buckets {b['in_use']}/{b['total']} in use"
        + (
            "  deepest " + ", ".join(f"{d['bucket']}:{d['messages']}" for d in b["deepest"])
            if b["deepest"]
            else ""
        ),
        "",
    ]
    topics = frame["topics"]
    rows = [
        [
            t["topic"],
            str(t["multi"]),
            str(t["single"]),
            str(t["locked"]),
            format_size(t["bytes"]),
            f"{t['in_rate']:,.1f}",
            f"{t['out_rate']:,.1f}",
        ]
        for t in topics[:limit]
    ]
    header = ["TOPIC", "MULTI", "SINGLE", "LOCKED", "BYTES", "IN/s", "OUT/s"]
    table = format_table(header, rows, right=(1, 2, 3, 4, 5, 6))
    lines.append(f"{bold}{table[0]}{reset}")
    lines += table[1:]
    if len(topics) > limit:
        lines.append(f"... {len(topics) - limit} more topic(s)")
    if not topics:
        lines.append("(no messages)")
    if frame["streams"]:
        lines.append("")
        rows = [
            [
                s["name"],
                str(s["records"]),
                str(s["end_offset"]),
                format_size(s["bytes"]),
                f"{s['append_rate']:,.1f}",
            ]
            for s in frame["streams"]
        ]
        table = format_table(
            ["STREAM", "RECORDS", "NEXT", "BYTES", "APPEND/s"], rows, right=(1, 2, 3, 4)
        )
        lines.append(f"{bold}{table[0]}{reset}")
        lines += table[1:]
    if frame["queues"]:
        lines.append("")
        rows = [
            [
                q["name"],
                str(q["depth"]),
                str(q["consumers"]),
                _rate(q["in_rate"]),
                _rate(q["out_rate"]),
            ]
            for q in frame["queues"]
        ]
        table = format_table(
            ["QUEUE", "DEPTH", "CONSUMERS", "IN/s", "OUT/s"], rows, right=(1, 2, 3, 4)
        )
        lines.append(f"{bold}{table[0]}{reset}")
        lines += table[1:]
    return lines


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:,.1f}"


def run_top(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus top``."""
    import anyio

    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)
    interval = max(args.interval, 0.05)
    tty = sys.stdout.isatty() and not args.json

    def limit() -> int:
        if args.limit is not None:
            return max(0, int(args.limit))
        if tty:
            return max(3, shutil.get_terminal_size().lines - 12)
        return 50

    def show(frame: dict[str, Any]) -> None:
        if args.json:
            emit_json(frame)
            return
        lines = frame_lines(frame, root, limit=limit(), color=tty)
        if tty and not args.once:
            sys.stdout.buffer.write(CLEAR.encode())
        for line in lines:
            emit(line)

    async def command() -> int:
        async with Bus(root, config=config) as bus:
            prev = await take_snapshot(bus, root)
            _, prev_copies = await queue_copies(bus)
            with interruptible():
                while True:
                    await anyio.sleep(interval)
                    cur = await take_snapshot(bus, root)
                    queues, cur_copies = await queue_copies(bus)
                    show(
                        frame_json(
                            prev, cur, len(bus.layout.buckets), queues, (prev_copies, cur_copies)
                        )
                    )
                    if args.once:
                        break
                    prev, prev_copies = cur, cur_copies
        return 0

    code = run_async(command)
    return 0 if code == 130 else code
