"""``fsbus subscribe``: print matching messages as JSON lines, optionally consuming a queue."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Literal

from .output import emit_json, payload_fields
from .queue import missing_queue
from .runtime import CliError, bus_config, interruptible, resolve_root, run_async

if TYPE_CHECKING:
    from fsbus import Message

# anyio and the Bus are imported when the command runs, not for --help.

__all__ = ["add_subscribe_command", "message_json"]


def add_subscribe_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Register ``subscribe`` on ``subparsers``."""
    p = subparsers.add_parser(
        "subscribe",
        parents=[common],
        help="print messages matching a pattern, one JSON object per line",
        description="Print each message whose topic matches PATTERN as one JSON object per "
        'line: {"topic", "payload" (text when UTF-8) or "payload_base64", "kind", '
        '"headers", "expires", "published_at", "host", "delivery_count", "priority", '
        '"name"}, and "queue" with --queue. With --queue NAME, consume the durable queue '
        "NAME instead (see `fsbus queue`): every message it holds, each acknowledged once "
        "printed, so it goes to one of the queue's consumers only; a PATTERN given too is "
        "bound to the queue first. Exit status: 0 when --count messages arrived or "
        "--timeout ran out (with whatever arrived printed), 1 when the --queue was deleted "
        "before (with what arrived printed), 130 on Ctrl-C (after a clean "
        "shutdown: work-queue messages being handled are released, no lock is left).",
    )
    p.add_argument(
        "pattern",
        metavar="PATTERN",
        nargs="?",
        help="topic pattern: '*' matches one word, '#' zero or more (e.g. 'orders.*.paid'); "
        "optional with --queue",
    )
    p.add_argument(
        "--queue",
        metavar="NAME",
        help="consume the durable queue NAME (declared with `fsbus queue declare`); with "
        "PATTERN, bind PATTERN to it first (safe to repeat)",
    )
    p.add_argument(
        "--single",
        action="store_true",
        help="consume work-queue messages: each is acknowledged (removed) after it is "
        "printed, so it goes to this subscriber only. Without --single the subscriber "
        "only observes multi messages and never takes work-queue ones",
    )
    p.add_argument(
        "--existing",
        action="store_true",
        help="also deliver messages already on the bus when subscribing (a queue always "
        "delivers what it holds)",
    )
    p.add_argument(
        "--count",
        metavar="N",
        type=_positive_int,
        help="exit (status 0) after N messages (status 1 if the --queue is deleted first)",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_seconds,
        help="exit (status 0) after SECONDS in total, having printed what arrived",
    )
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="do not print the 'subscribed' notice on stderr",
    )
    p.set_defaults(func=run_subscribe)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def message_json(msg: Message) -> dict[str, Any]:
    """The JSON object printed for one message."""
    out: dict[str, Any] = {"topic": msg.topic}
    out.update(payload_fields(msg.payload))
    out.update(
        {
            "kind": "single" if msg.single else "multi",
            "headers": dict(msg.headers),
            "expires": msg.expires,
            "published_at": msg.published_at,
            "host": msg.host,
            "delivery_count": msg.delivery_count,
            "priority": msg.priority,
            "name": msg.name,
        }
    )
    if msg.queue is not None:
        out["queue"] = msg.queue
    return out


def run_subscribe(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus subscribe``."""
    import anyio

    from fsbus import Bus, QueueNotFound

    if args.pattern is None and args.queue is None:
        raise CliError("give a PATTERN, or --queue NAME to consume a durable queue")
    if args.queue is not None and args.existing:
        raise CliError(
            "--existing does not apply to --queue: a queue delivers every message it holds"
        )
    if args.queue is not None and args.single:
        raise CliError(
            "--single does not apply to --queue: a queue's messages are each taken once, "
            "by one of its consumers"
        )
    root = resolve_root(args)
    config = bus_config(args)
    # Without --single this is an observer: it never takes work-queue messages. (A
    # queue's consumer takes its work-queue copies: kind does not apply.)
    kind: Literal["single", "multi", "any"] = (
        "any" if args.queue is not None else "single" if args.single else "multi"
    )
    if args.queue is None:
        what = repr(args.pattern)
    else:
        what = f"queue {args.queue!r}"
        if args.pattern is not None:
            what += f" (bound to {args.pattern!r})"

    async def command() -> int:
        received = 0
        gone: QueueNotFound | None = None
        async with Bus(root, config=config) as bus:
            try:
                async with bus.messages(
                    args.pattern, existing=args.existing, kind=kind, queue=args.queue
                ) as it:
                    if not args.quiet:
                        print(
                            f"fsbus: subscribed to {what} on {root} (Ctrl-C to stop)",
                            file=sys.stderr,
                            flush=True,
                        )
                    with interruptible(), anyio.move_on_after(args.timeout):
                        async for msg in it:
                            emit_json(message_json(msg))
                            if msg.single:
                                await it.ack(msg)
                            received += 1
                            if args.count is not None and received >= args.count:
                                break
                        else:
                            # it ended, with no --count reached, no --timeout, no signal:
                            # its queue was deleted (QueueNotFound), or the bus closed
                            try:
                                it.raise_if_queue_gone()
                            except QueueNotFound as exc:
                                gone = exc
            except QueueNotFound as exc:
                raise missing_queue(args.queue, root) from exc
        if gone is not None:
            wanted = f" of {args.count}" if args.count is not None else ""
            raise QueueNotFound(
                f"queue {args.queue!r} on {root} was deleted while this command consumed it, "
                f"after {received}{wanted} message(s); nothing more comes from it: declare it "
                f"again (fsbus queue declare {args.queue} PATTERN...) and subscribe anew"
            ) from gone
        return 0

    return run_async(command)
