"""``fsbus publish``: one message (argument, file or stdin) or many (``--lines``, ``--dir``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsbus import UsageError

from .output import Progress, emit, emit_json, format_size
from .runtime import CliError, bus_config, resolve_root, run_async

if TYPE_CHECKING:
    from fsbus import Bus, PublishInfo

# The Bus (anyio, pydantic, watchdog) is imported when a publish runs, not for --help.

__all__ = ["add_publish_command"]

_BATCH = 256  # messages per publish_many call in a bulk publish
_BATCH_BYTES = 8 << 20  # ... or this many payload bytes
_SMALL_FILE = 1 << 20  # --dir files up to this size are batched, bigger ones streamed


def add_publish_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Register ``publish`` on ``subparsers``."""
    p = subparsers.add_parser(
        "publish",
        parents=[common],
        help="publish a message (or one per line / per file)",
        description="Publish PAYLOAD (or a file, or stdin with '-') to TOPIC. With --lines "
        "or --dir publish many messages, showing progress on a terminal. Prints nothing "
        "unless --json is given.",
    )
    p.add_argument("topic", metavar="TOPIC", help="topic, words separated by '.'")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "payload",
        metavar="PAYLOAD",
        nargs="?",
        help="message body as text; '-' reads the body from stdin",
    )
    src.add_argument("--file", metavar="FILE", help="message body from FILE (streamed)")
    src.add_argument(
        "--lines",
        metavar="FILE",
        help="one message per line of FILE ('-' for stdin); line ends are removed",
    )
    src.add_argument(
        "--dir",
        metavar="DIR",
        help="one message per regular file in DIR, in name order",
    )
    p.add_argument(
        "--single",
        action="store_true",
        help="work-queue message: handled by exactly one consumer",
    )
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=_positive_float,
        help="time to live (default: 60 s for multi, 3600 s for single messages)",
    )
    p.add_argument("--durable", action="store_true", help="fsync before returning")
    p.add_argument(
        "--header",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="add a header (repeatable)",
    )
    p.add_argument(
        "--priority",
        metavar="N",
        type=int,
        help="work-queue priority 0-255, lower is taken first",
    )
    p.set_defaults(func=run_publish, late_positional="payload")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return value


def parse_headers(items: list[str]) -> dict[str, str] | None:
    """``["k=v", ...]`` as a dict; :class:`CliError` for an item without ``=``."""
    headers: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--header needs KEY=VALUE, got {item!r}")
        headers[key] = value
    return headers or None


def _iter_lines(source: str) -> Iterator[bytes]:
    stream = sys.stdin.buffer if source == "-" else open(source, "rb")
    try:
        for line in stream:
            if line.endswith(b"\n"):
                line = line[:-1]
                if line.endswith(b"\r"):
                    line = line[:-1]
            yield line
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _count_lines(source: str) -> int | None:
    if source == "-":
        return None
    path = Path(source)
    if not path.is_file():
        return None
    count = 0
    last = b"\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (1 if last != b"\n" else 0)


def _dir_files(source: str) -> list[Path]:
    path = Path(source)
    if not path.is_dir():
        raise CliError(f"--dir {source!r} is not a directory")
    return sorted(p for p in path.iterdir() if p.is_file())


def _dir_items(files: list[Path]) -> Iterator[bytes | Path]:
    """Small files as bytes (published in batches), big ones as paths (streamed)."""
    for f in files:
        if f.stat().st_size <= _SMALL_FILE:
            yield f.read_bytes()
        else:
            yield f


def _info_json(info: PublishInfo) -> dict[str, Any]:
    return {
        "topic": info.topic,
        "name": info.name,
        "bucket": info.bucket,
        "path": str(info.path),
        "kind": "single" if info.single else "multi",
        "expires": info.expires,
        "size": info.size,
    }


def run_publish(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus publish``."""
    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)
    options: dict[str, Any] = {
        "single": args.single,
        "ttl": args.ttl,
        "durable": args.durable,
        "headers": parse_headers(args.header),
        "priority": args.priority,
    }
    given = [
        name
        for name, value in (
            ("PAYLOAD", args.payload),
            ("--file", args.file),
            ("--lines", args.lines),
            ("--dir", args.dir),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise CliError(f"give only one of PAYLOAD, --file, --lines, --dir (got {', '.join(given)})")
    if args.lines is not None:
        if args.lines != "-" and not Path(args.lines).is_file():
            raise CliError(f"--lines {args.lines!r} is not a readable file")
        return _publish_many(
            args, root, config, options, _iter_lines(args.lines), _count_lines(args.lines)
        )
    if args.dir is not None:
        files = _dir_files(args.dir)
        return _publish_many(args, root, config, options, _dir_items(files), len(files))

    payload: bytes | str | Path
    if args.file is not None:
        path = Path(args.file)
        if not path.is_file():
            raise CliError(f"--file {args.file!r} is not a readable file")
        payload = path
    elif args.payload == "-":
        payload = sys.stdin.buffer.read()
    elif args.payload is not None:
        payload = args.payload.encode("utf-8", "surrogateescape")
    else:
        raise CliError(
            "nothing to publish: give PAYLOAD, '-' to read stdin, --file, --lines or --dir"
        )

    async def command() -> int:
        async with Bus(root, config=config) as bus:
            info = await bus.publish(args.topic, payload, **options)
        if args.json:
            emit_json(_info_json(info))
        return 0

    return run_async(command)


def _publish_many(
    args: argparse.Namespace,
    root: Path,
    config: Any,
    options: dict[str, Any],
    items: Iterator[bytes] | Iterator[bytes | Path],
    total: int | None,
) -> int:
    from fsbus import Bus

    done = 0
    size = 0
    started = time.monotonic()

    async def command() -> int:
        nonlocal done, size
        progress = Progress(f"publish {args.topic}", total)
        batch: list[bytes] = []
        batch_bytes = 0

        async def flush(bus: Bus) -> None:
            nonlocal done, size, batch_bytes
            if batch:
                infos = await bus.publish_many([(args.topic, b) for b in batch], **options)
                done += len(infos)
                size += sum(info.size for info in infos)
                batch.clear()
                batch_bytes = 0
                progress.update(done)

        try:
            async with Bus(root, config=config) as bus:
                for item in items:
                    if isinstance(item, Path):  # a big file: streamed on its own
                        await flush(bus)
                        info = await bus.publish(args.topic, item, **options)
                        done += 1
                        size += info.size
                        progress.update(done)
                        continue
                    batch.append(item)
                    batch_bytes += len(item)
                    if len(batch) >= _BATCH or batch_bytes >= _BATCH_BYTES:
                        await flush(bus)
                await flush(bus)
        except BaseException as exc:
            progress.close()
            if isinstance(exc, UsageError) and done == 0:
                raise  # rejected before anything was written
            if isinstance(exc, Exception):
                note = f"published {done} message(s) before the error"
                if batch and not isinstance(exc, UsageError):  # usage errors write nothing
                    note += (
                        f"; of the batch of {len(batch)} being written some may be published "
                        "too (check with `fsbus ls`)"
                    )
                exc.add_note(note)
            raise
        progress.close(done)
        return 0

    try:
        code = run_async(command)
    finally:
        seconds = time.monotonic() - started
    summary = {
        "topic": args.topic,
        "published": done,
        "bytes": size,
        "seconds": round(seconds, 3),
        "complete": code == 0,
    }
    if args.json:
        emit_json(summary)
    else:
        rate = done / seconds if seconds > 0 else 0.0
        emit(
            f"published {done} message(s), {format_size(size)}, to {args.topic!r} "
            f"in {seconds:.2f} s ({rate:,.0f}/s)"
            + ("" if code == 0 else " before being interrupted")
        )
    return code
