"""``fsbus ls`` and ``fsbus stats``: look at what is on the bus without consuming it."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .output import emit, emit_json, format_age, format_size, format_table
from .queue import queue_json, queue_table
from .runtime import bus_config, resolve_root, run_async

if TYPE_CHECKING:
    from fsbus import Bus, MessageInfo, QueueInfo, StreamInfo

# anyio, the Bus and Streams are imported when a command runs, not for --help.

__all__ = ["Snapshot", "add_browse_commands", "take_snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """Everything visible on the bus at one moment."""

    taken: float
    """Wall-clock time of the snapshot (seconds since the epoch)."""
    messages: tuple[MessageInfo, ...]
    """Messages present (multi and single), as browsed."""
    streams: tuple[StreamInfo, ...]
    """Streams under the root."""


def _stream_infos(root: Path) -> tuple[StreamInfo, ...]:
    from fsbus import Stream, StreamNotFound, list_streams

    infos = []
    for name in list_streams(root):
        try:
            with Stream.open(root, name, create=False) as stream:
                infos.append(stream.info())
        except StreamNotFound:
            continue  # deleted while we looked
    return tuple(infos)


async def take_snapshot(bus: Bus, root: Path, pattern: str = "#") -> Snapshot:
    """Browse every message matching ``pattern`` and read every stream's info."""
    import anyio.to_thread

    taken = time.time()
    messages = [info async for info in bus.browse(pattern)]
    streams = await anyio.to_thread.run_sync(_stream_infos, root)
    return Snapshot(taken, tuple(messages), streams)


def add_browse_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Register ``ls`` and ``stats`` on ``subparsers``."""
    p = subparsers.add_parser(
        "ls",
        parents=[common],
        help="list messages on the bus without consuming them",
        description="List the messages whose topic matches PATTERN (default '#': all) as "
        "a table: topic, kind, size, time left before expiry, priority, and whether a "
        "consumer holds it locked right now. Nothing is read or consumed. With --json "
        "print one JSON object per message.",
    )
    p.add_argument("pattern", metavar="PATTERN", nargs="?", default="#", help="topic pattern")
    p.add_argument("--limit", metavar="N", type=int, help="show at most N messages")
    p.set_defaults(func=run_ls)

    s = subparsers.add_parser(
        "stats",
        parents=[common],
        help="count messages, bytes, topics and buckets; list streams and queues",
        description="Summarise the bus directory: messages by kind, locked and expired, "
        "bytes, the busiest topics and buckets, every stream's offsets and size, and "
        "every durable queue's depth, consumers and bindings.",
    )
    s.add_argument("--top", metavar="N", type=int, default=10, help="topics to show (10)")
    s.set_defaults(func=run_stats)


def _sort_key(info: MessageInfo) -> tuple[float, str]:
    return (info.published_at or info.expires, info.name)


def info_json(info: MessageInfo, now: float) -> dict[str, Any]:
    """The JSON object ``ls --json`` prints for one message."""
    return {
        "topic": info.topic,
        "kind": "single" if info.single else "multi",
        "size": info.size,
        "expires": info.expires,
        "expires_in": round(info.expires - now, 3),
        "locked": info.locked,
        "priority": info.priority,
        "published_at": info.published_at,
        "host": info.host,
        "headers": dict(info.headers),
        "name": info.name,
        "bucket": info.bucket,
        "path": str(info.path),
    }


def _expiry_text(expires: float, now: float) -> str:
    left = expires - now
    return "expired" if left <= 0 else f"in {format_age(left)}"


def ls_table(infos: Sequence[MessageInfo], now: float) -> list[str]:
    """The table ``ls`` prints."""
    rows = [
        [
            info.topic,
            "single" if info.single else "multi",
            format_size(info.size),
            _expiry_text(info.expires, now),
            str(info.priority) if info.single else "-",
            "locked" if info.locked else "",
        ]
        for info in infos
    ]
    return format_table(["TOPIC", "KIND", "SIZE", "EXPIRES", "PRIO", "LOCKED"], rows, right=(2, 4))


def run_ls(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus ls``."""
    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)

    async def command() -> int:
        async with Bus(root, config=config) as bus:
            infos = [info async for info in bus.browse(args.pattern)]
        infos.sort(key=_sort_key)
        if args.limit is not None:
            infos = infos[: max(0, args.limit)]
        now = time.time()
        if args.json:
            for info in infos:
                emit_json(info_json(info, now))
        elif infos:
            for line in ls_table(infos, now):
                emit(line)
        return 0

    return run_async(command)


def stats_json(
    snap: Snapshot, num_buckets: int, top: int, queues: Sequence[QueueInfo] = ()
) -> dict[str, Any]:
    """The summary ``stats`` prints, as one JSON object."""
    msgs = snap.messages
    topics = Counter(m.topic for m in msgs)
    topic_bytes: Counter[str] = Counter()
    for m in msgs:
        topic_bytes[m.topic] += m.size
    buckets = Counter(m.bucket for m in msgs)
    deepest = buckets.most_common(1)
    return {
        "messages": len(msgs),
        "multi": sum(1 for m in msgs if not m.single),
        "single": sum(1 for m in msgs if m.single),
        "locked": sum(1 for m in msgs if m.locked),
        "bytes": sum(m.size for m in msgs),
        "topics": len(topics),
        "buckets": num_buckets,
        "buckets_in_use": len(buckets),
        "deepest_bucket": (
            {"bucket": deepest[0][0], "messages": deepest[0][1]} if deepest else None
        ),
        "oldest_published_at": min(
            (m.published_at for m in msgs if m.published_at is not None), default=None
        ),
        "top_topics": [
            {"topic": t, "messages": n, "bytes": topic_bytes[t]}
            for t, n in topics.most_common(max(0, top))
        ],
        "streams": [stream_json(s) for s in snap.streams],
        "queues": [queue_json(q) for q in sorted(queues, key=lambda q: q.name)],
    }


def stream_json(info: StreamInfo) -> dict[str, Any]:
    """One stream's summary."""
    return {
        "name": info.name,
        "start_offset": info.start_offset,
        "end_offset": info.end_offset,
        "records": info.end_offset - info.start_offset,
        "bytes": info.size_bytes,
        "segments": len(info.segments),
    }


def stats_lines(stats: dict[str, Any], root: Path) -> list[str]:
    """The human-readable form of :func:`stats_json`."""
    lines = [
        f"bus {root}",
        f"  messages  {stats['messages']} (multi {stats['multi']}, single {stats['single']}; "
        f"{stats['locked']} locked)",
        f"  bytes     {format_size(stats['bytes'])}",
        f"  topics    {stats['topics']}",
    ]
    deepest = stats["deepest_bucket"]
    bucket_line = f"  buckets   {stats['buckets_in_use']} of {stats['buckets']} in use"
    if deepest:
        bucket_line += f", deepest {deepest['bucket']} holds {deepest['messages']}"
    lines.append(bucket_line)
    if stats["top_topics"]:
        lines.append("")
        rows = [
            [t["topic"], str(t["messages"]), format_size(t["bytes"])] for t in stats["top_topics"]
        ]
        lines += [
            "  " + line for line in format_table(["TOPIC", "MESSAGES", "BYTES"], rows, right=(1, 2))
        ]
    lines.append("")
    if stats["streams"]:
        rows = [
            [
                s["name"],
                str(s["records"]),
                str(s["start_offset"]),
                str(s["end_offset"]),
                format_size(s["bytes"]),
                str(s["segments"]),
            ]
            for s in stats["streams"]
        ]
        lines.append("streams")
        header = ["NAME", "RECORDS", "FIRST", "NEXT", "BYTES", "SEGMENTS"]
        lines += ["  " + line for line in format_table(header, rows, right=(1, 2, 3, 4, 5))]
    else:
        lines.append("streams   none")
    if stats["queues"]:  # said only when there are some: older buses print as before
        lines += ["", "queues"]
        lines += ["  " + line for line in queue_table(stats["queues"])]
    return lines


def run_stats(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus stats``."""
    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)

    async def command() -> int:
        async with Bus(root, config=config) as bus:
            snap = await take_snapshot(bus, root)
            queues = await bus.queues()
        stats = stats_json(snap, len(bus.layout.buckets), args.top, queues)
        if args.json:
            emit_json(stats)
        else:
            for line in stats_lines(stats, root):
                emit(line)
        return 0

    return run_async(command)
