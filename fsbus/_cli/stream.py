"""``fsbus stream``: append, read (from/to, follow), info, groups (list, lag, reset, delete),
compact and retain.

``read`` prints one JSON object per record::

    {"offset": 7, "timestamp": 1700000000.5, "key": "k", "value": "text", "headers": {}}

(``key_base64`` / ``value_base64`` replace ``key`` / ``value`` when the bytes are not
UTF-8). ``info`` and ``groups`` print tables, or JSON lines with ``--json``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsbus import UsageError

from .output import emit, emit_json, format_size, format_table
from .runtime import CliError, resolve_root, run_async

if TYPE_CHECKING:
    from fsbus import Record, Stream, StreamConfig

# Streams (and pydantic, for StreamConfig) are imported when a command runs, not for --help.

__all__ = ["add_stream_commands"]


def add_stream_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser | None = None,
) -> None:
    """Register ``stream append|read|groups|info`` on ``subparsers``."""
    parents = [common] if common is not None else [_own_common()]
    stream = subparsers.add_parser(
        "stream",
        parents=parents,
        help="replayable logs: append, read, follow, consumer groups, info",
        description="Named, replayable, append-only logs under ROOT/streams/.",
    )
    sub = stream.add_subparsers(dest="stream_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser(
        "append",
        parents=parents,
        help="append a record (or one per line)",
        description="Append VALUE (or stdin with '-', or one record per line with --lines) "
        "to stream NAME, creating it if missing. Prints the offsets written.",
    )
    p.add_argument("name", metavar="NAME", help="stream name")
    p.add_argument("value", metavar="VALUE", nargs="?", help="record value; '-' for stdin")
    p.add_argument("--lines", metavar="FILE", help="one record per line of FILE ('-' for stdin)")
    p.add_argument("--key", help="record key (partitions groups, drives compaction)")
    p.add_argument(
        "--header",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a record header (repeatable)",
    )
    p.add_argument(
        "--durability",
        choices=("none", "batch", "record"),
        default="batch",
        help="when the records reach the disk (default: batch, one fdatasync)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="records per append_batch with --lines (default 1000)",
    )
    # argparse binds an optional positional before later options; the CLI's main puts a
    # value left over among the options back into it
    p.set_defaults(func=_cmd_append, late_positional="value")

    p = sub.add_parser(
        "read",
        parents=parents,
        help="print records as JSON lines (optionally following new ones)",
        description="Print the records of NAME from --from (default: the start) up to --to "
        "or the end, one JSON object per line. With --follow, wait for new records.",
    )
    p.add_argument("name", metavar="NAME", help="stream name")
    p.add_argument(
        "--from",
        dest="start",
        default="start",
        metavar="OFFSET",
        help="first offset, or 'start' / 'end' (default: start)",
    )
    p.add_argument(
        "--from-time",
        metavar="TIME",
        help="start at the first record at or after TIME (epoch seconds or ISO 8601)",
    )
    p.add_argument("--to", type=_offset, metavar="OFFSET", help="stop before this offset")
    p.add_argument("--max", type=_positive_int, metavar="N", help="print at most N records")
    p.add_argument("--follow", "-f", action="store_true", help="wait for new records")
    p.set_defaults(func=_cmd_read)

    p = sub.add_parser(
        "record",
        parents=parents,
        help="record Bus topics into a stream, each message once (until Ctrl-C)",
        description="Append every message published on topics matching PATTERN to stream "
        "NAME, exactly once, in publish order as seen: a durable queue collects them while "
        "the recorder is down, so a restarted recorder misses nothing and appends nothing "
        "twice. Prints one JSON line per batch recorded.",
    )
    p.add_argument("pattern", metavar="PATTERN", help="topics to record, e.g. 'orders.#'")
    p.add_argument("--into", required=True, metavar="NAME", help="the stream appended to")
    p.add_argument(
        "--queue",
        metavar="QUEUE",
        help="the durable queue collecting the messages (default: named after PATTERN and NAME)",
    )
    p.add_argument("--once", action="store_true", help="record what is waiting now, then exit")
    p.set_defaults(func=_cmd_record)

    p = sub.add_parser(
        "info",
        parents=parents,
        help="segments, sizes and offsets of a stream (or of every stream)",
        description="Without NAME, one line per stream; with NAME, its segments.",
    )
    p.add_argument("name", metavar="NAME", nargs="?", help="stream name")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "compact",
        parents=parents,
        help="keep only the newest record of each key in the closed segments",
        description="Rewrite the closed segments of NAME keeping the newest record of each "
        "key (records without a key stay; offsets do not change).",
    )
    p.add_argument("name", metavar="NAME", help="stream name")
    p.set_defaults(func=_cmd_compact)

    p = sub.add_parser(
        "retain",
        parents=parents,
        help="delete old segments by size, age or consumption",
        description="Delete the oldest closed segments of NAME while the stream is larger "
        "than --max-bytes, older than --max-age, or (--consumed) committed by every group.",
    )
    p.add_argument("name", metavar="NAME", help="stream name")
    p.add_argument("--max-bytes", type=_positive_int, metavar="N", help="size to keep")
    p.add_argument("--max-age", type=float, metavar="SECONDS", help="age to keep")
    p.add_argument(
        "--consumed", action="store_true", help="delete segments every group has consumed"
    )
    p.set_defaults(func=_cmd_retain)

    g = sub.add_parser(
        "groups",
        parents=parents,
        help="consumer groups: list, lag, reset, delete",
        description="Inspect and manage the consumer groups of a stream.",
    )
    gsub = g.add_subparsers(dest="groups_command", metavar="ACTION", required=True)
    p = gsub.add_parser("list", parents=parents, help="groups with their lag and consumers")
    p.add_argument("name", metavar="NAME", help="stream name")
    p.set_defaults(func=_cmd_groups_list)
    p = gsub.add_parser("lag", parents=parents, help="committed offset and lag per partition")
    p.add_argument("name", metavar="NAME", help="stream name")
    p.add_argument("group", metavar="GROUP", help="group name")
    p.set_defaults(func=_cmd_groups_lag)
    p = gsub.add_parser(
        "reset",
        parents=parents,
        help="set a group's committed offsets (also repairs a corrupt offsets file)",
        description="Set every partition's committed offset of GROUP. Stop the group's "
        "consumers first: a running consumer commits its own positions over the reset.",
    )
    p.add_argument("name", metavar="NAME", help="stream name")
    p.add_argument("group", metavar="GROUP", help="group name")
    p.add_argument(
        "--to",
        required=True,
        metavar="WHERE",
        help="'earliest', 'latest' or an offset",
    )
    p.set_defaults(func=_cmd_groups_reset)
    p = gsub.add_parser("delete", parents=parents, help="remove a group")
    p.add_argument("name", metavar="NAME", help="stream name")
    p.add_argument("group", metavar="GROUP", help="group name")
    p.set_defaults(func=_cmd_groups_delete)


def _own_common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--root", metavar="DIR", default=argparse.SUPPRESS, help="bus directory")
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON lines"
    )
    p.add_argument(
        "-o",
        "--option",
        metavar="KEY=VALUE",
        action="append",
        default=argparse.SUPPRESS,
        help="set a StreamConfig field (repeatable)",
    )
    return p


# --- argument types -------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def _offset(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an offset (>= 0), got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an offset (>= 0), got {n}")
    return n


def _time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            f"--from-time wants epoch seconds or ISO 8601 (2024-05-01T12:00:00Z), got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


# --- helpers --------------------------------------------------------------------------------


def _root(args: argparse.Namespace) -> Path:
    root = getattr(args, "root", None)
    return root if isinstance(root, Path) else resolve_root(args)


def _open(args: argparse.Namespace, *, create: bool, **cfg: Any) -> Stream:
    from fsbus import Stream

    return Stream.open(_root(args), args.name, config=stream_config(args, **cfg), create=create)


def stream_config(args: argparse.Namespace, **cfg: Any) -> StreamConfig:
    """A :class:`StreamConfig` from the command's options and ``-o KEY=VALUE`` overrides
    (StreamConfig fields for the stream commands, e.g. ``-o segment_bytes=1048576``)."""
    from fsbus import StreamConfig

    options: dict[str, Any] = dict(cfg)
    for item in getattr(args, "option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-o/--option needs KEY=VALUE (a StreamConfig field), got {item!r}")
        try:
            options[key.strip().replace("-", "_")] = json.loads(value)
        except ValueError:
            options[key.strip().replace("-", "_")] = value
    return StreamConfig(**options)


def _bytes_fields(name: str, data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode("ascii")}


def record_json(r: Record) -> dict[str, Any]:
    """The JSON object ``stream read`` prints for a record."""
    out: dict[str, Any] = {"offset": r.offset, "timestamp": r.timestamp}
    out |= _bytes_fields("key", r.key)
    out |= _bytes_fields("value", r.value)
    out["headers"] = dict(r.headers)
    return out


def _headers(items: list[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError(f"--header needs NAME=VALUE, got {item!r}")
        out[k] = v
    return out or None


# --- commands -------------------------------------------------------------------------------


def _cmd_append(args: argparse.Namespace) -> int:
    if (args.value is None) == (args.lines is None):
        raise CliError("stream append needs VALUE or --lines FILE (one of them)")
    from fsbus import RecordIn

    headers = _headers(args.header)
    with _open(args, create=True, durability=args.durability) as s:
        if args.lines is not None:
            first = last = None
            count = 0
            for chunk in _chunks(_read_lines(args.lines), args.batch_size):
                recs = [RecordIn(v, key=args.key, headers=headers) for v in chunk]
                r = s.append_batch(recs)
                first = r.start if first is None else first
                last = r.stop - 1
                count += len(r)
            if getattr(args, "json", False):
                emit_json({"stream": s.name, "first": first, "last": last, "count": count})
            else:
                emit(f"{count} records" + (f", offsets {first}..{last}" if count else ""))
            return 0
        value = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
        off = s.append(value, key=args.key, headers=headers)
        if getattr(args, "json", False):
            emit_json({"stream": s.name, "offset": off})
        else:
            emit(str(off))
    return 0


def _read_lines(source: str) -> Iterator[bytes]:
    f = sys.stdin.buffer if source == "-" else open(source, "rb")
    try:
        for line in f:
            yield line.rstrip(b"\r\n")
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def _chunks(it: Iterator[bytes], n: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for x in it:
        chunk.append(x)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _start(args: argparse.Namespace, s: Stream) -> int:
    if args.from_time is not None:
        return s.offset_for_time(_time(args.from_time))
    text = str(args.start)
    if text in ("start", "earliest"):
        return s.start_offset
    if text in ("end", "latest"):
        return s.end_offset
    try:
        return _offset(text)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"--from: {exc} or 'start' / 'end'") from None


def _cmd_read(args: argparse.Namespace) -> int:
    with _open(args, create=False) as s:
        start = _start(args, s)
        if not args.follow:
            for r in s.read(start, args.to, max_records=args.max):
                emit_json(record_json(r))
            return 0
        config = s.config

    from fsbus import AsyncStream

    async def follow() -> int:
        left = args.max
        async with (
            AsyncStream(_root(args), args.name, config=config, create=False) as a,
            a.follow(start, stop=args.to) as records,
        ):
            async for r in records:
                emit_json(record_json(r))
                if left is not None:
                    left -= 1
                    if left <= 0:
                        break
        return 0

    return run_async(follow)


def _cmd_record(args: argparse.Namespace) -> int:
    import json
    import signal
    import threading

    from fsbus.recording import drain, record_forever

    root = _root(args)
    if args.once:
        r = drain(root, args.pattern, args.into, queue=args.queue)
        print(
            json.dumps({"appended": r.appended, "skipped": r.skipped, "end_offset": r.end_offset}),
            flush=True,
        )
        return 0
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for r in record_forever(root, args.pattern, args.into, queue=args.queue, stop=stop):
        print(
            json.dumps({"appended": r.appended, "skipped": r.skipped, "end_offset": r.end_offset}),
            flush=True,
        )
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from fsbus import Stream, list_streams

    as_json = getattr(args, "json", False)
    root = _root(args)
    if args.name is None:
        rows: list[dict[str, Any]] = []
        for name in list_streams(root):
            with Stream.open(root, name, create=False) as s:
                info = s.info()
            row: dict[str, Any] = {
                "stream": name,
                "start_offset": info.start_offset,
                "end_offset": info.end_offset,
                "segments": len(info.segments),
                "size_bytes": info.size_bytes,
                "groups": list(info.groups),
            }
            rows.append(row)
            if as_json:
                emit_json(row)
        if not as_json:
            _table(
                ["STREAM", "START", "END", "SEGMENTS", "SIZE", "GROUPS"],
                [
                    [
                        r["stream"],
                        r["start_offset"],
                        r["end_offset"],
                        r["segments"],
                        format_size(r["size_bytes"]),
                        ",".join(r["groups"]),
                    ]
                    for r in rows
                ],
            )
        return 0
    with _open(args, create=False) as s:
        info = s.info()
    if as_json:
        emit_json(
            {
                "stream": info.name,
                "path": info.path,
                "start_offset": info.start_offset,
                "end_offset": info.end_offset,
                "size_bytes": info.size_bytes,
                "groups": list(info.groups),
                "segments": [
                    {
                        "base_offset": seg.base_offset,
                        "end_offset": seg.end_offset,
                        "size_bytes": seg.size_bytes,
                        "path": seg.path,
                    }
                    for seg in info.segments
                ],
            }
        )
        return 0
    emit(
        f"stream {info.name}: offsets {info.start_offset}..{info.end_offset} "
        f"({info.end_offset - info.start_offset} records), {len(info.segments)} segments, "
        f"{format_size(info.size_bytes)}; groups: {', '.join(info.groups) or '-'}"
    )
    _table(
        ["SEGMENT", "FIRST", "END", "SIZE"],
        [
            [Path(seg.path).name, seg.base_offset, seg.end_offset, format_size(seg.size_bytes)]
            for seg in info.segments
        ],
    )
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    with _open(args, create=False) as s:
        report = s.compact()
    if getattr(args, "json", False):
        emit_json(
            {
                "stream": args.name,
                "segments": list(report.segments),
                "removed_records": report.removed_records,
                "freed_bytes": report.freed_bytes,
            }
        )
    else:
        emit(
            f"compacted {len(report.segments)} segments: {report.removed_records} records "
            f"removed, {format_size(report.freed_bytes)} freed"
        )
    return 0


def _cmd_retain(args: argparse.Namespace) -> int:
    if args.max_bytes is None and args.max_age is None and not args.consumed:
        raise CliError("stream retain needs --max-bytes, --max-age or --consumed")
    with _open(
        args,
        create=False,
        retention_bytes=args.max_bytes,
        retention_seconds=args.max_age,
        delete_consumed=args.consumed,
    ) as s:
        report = s.enforce_retention()
    if getattr(args, "json", False):
        emit_json(
            {
                "stream": args.name,
                "deleted": list(report.deleted),
                "freed_bytes": report.freed_bytes,
                "start_offset": report.start_offset,
            }
        )
    else:
        emit(
            f"deleted {len(report.deleted)} segments, {format_size(report.freed_bytes)} "
            f"freed; the stream starts at offset {report.start_offset}"
        )
    return 0


def _cmd_groups_list(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    rows: list[dict[str, Any]] = []
    with _open(args, create=False) as s:
        for name in s.groups():
            gi = s.group_info(name)
            row: dict[str, Any] = {
                "group": gi.name,
                "partitions": gi.partitions,
                "lag": gi.lag,
                "committed_min": min(gi.committed.values(), default=0),
                "consumers": list(gi.members),
            }
            rows.append(row)
            if as_json:
                emit_json(row)
    if not as_json:
        _table(
            ["GROUP", "PARTITIONS", "COMMITTED", "LAG", "CONSUMERS"],
            [
                [
                    r["group"],
                    r["partitions"],
                    r["committed_min"],
                    r["lag"],
                    ",".join(r["consumers"]),
                ]
                for r in rows
            ],
        )
    return 0


def _cmd_groups_lag(args: argparse.Namespace) -> int:
    with _open(args, create=False) as s:
        gi = s.group_info(args.group)
        end = s.end_offset
    if getattr(args, "json", False):
        emit_json(
            {
                "group": gi.name,
                "end_offset": end,
                "lag": gi.lag,
                "committed": {str(p): o for p, o in gi.committed.items()},
                "owners": {str(p): m for p, m in gi.owners.items()},
            }
        )
        return 0
    emit(f"group {gi.name}: lag {gi.lag} (end offset {end})")
    _table(
        ["PARTITION", "COMMITTED", "OWNER"],
        [[p, o, gi.owners.get(p, "-")] for p, o in sorted(gi.committed.items())],
    )
    return 0


def _cmd_groups_reset(args: argparse.Namespace) -> int:
    to: str | int = args.to
    if to not in ("earliest", "latest"):
        try:
            to = _offset(str(to))
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"--to: {exc} or 'earliest' / 'latest'") from None
    with _open(args, create=False) as s:
        offsets = s.reset_group(args.group, to)
    target = next(iter(offsets.values()), 0)
    if getattr(args, "json", False):
        emit_json({"group": args.group, "committed": target, "partitions": len(offsets)})
    else:
        emit(f"group {args.group}: every partition resumes at offset {target}")
    return 0


def _cmd_groups_delete(args: argparse.Namespace) -> int:
    with _open(args, create=False) as s:
        if args.group not in s.groups():
            raise UsageError(f"stream {s.name!r} has no consumer group {args.group!r}")
        s.delete_group(args.group)
    if getattr(args, "json", False):
        emit_json({"group": args.group, "deleted": True})
    else:
        emit(f"group {args.group} deleted")
    return 0


def _table(header: list[str], rows: list[list[Any]]) -> None:
    for line in format_table(header, [[str(c) for c in r] for r in rows]):
        emit(line)
