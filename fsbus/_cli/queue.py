"""``fsbus queue``: declare, bind, unbind, list, purge and delete durable named queues.

A queue keeps a copy of every message published to a topic matching one of its
bindings until a consumer of the queue takes it (``fsbus subscribe --queue NAME``),
whether or not a consumer runs when it is published. ``ls`` prints a table, or one
JSON object per queue with ``--json``::

    {"name": "orders", "depth": 3, "consumers": 1, "dead_lettering": 0, "bindings": ["orders.#"],
     "options": {"message_ttl": null, "max_length": null, "overflow": "drop-head", ...}}
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from fsbus import FsBusError, QueueMismatch, QueueNotFound

from .output import emit, emit_json, format_table
from .runtime import bus_config, resolve_root, run_async

if TYPE_CHECKING:
    from pathlib import Path

    from fsbus import Bus, QueueInfo, QueueOptions

# anyio and the Bus are imported when a command runs, not for --help.

__all__ = ["add_queue_commands", "missing_queue", "options_flags", "queue_json", "queue_table"]

OVERFLOWS = ("drop-head", "reject-publish")


def add_queue_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Register ``queue declare|bind|unbind|ls|purge|delete`` on ``subparsers``."""
    parents = [common]
    queue = subparsers.add_parser(
        "queue",
        parents=parents,
        help="durable named queues: declare, bind, unbind, ls, purge, delete",
        description="Durable named queues: a queue keeps a copy of every message "
        "published to a topic matching one of its bindings until one of its consumers "
        "(`fsbus subscribe --queue NAME`) takes it, whether or not a consumer runs when "
        "the message is published. Each message goes to one consumer of the queue.",
    )
    sub = queue.add_subparsers(dest="queue_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser(
        "declare",
        parents=parents,
        help="create a queue (or add bindings to one with the same options)",
        description="Create queue NAME bound to each PATTERN. Declaring a queue that "
        "exists with the same options adds the PATTERNs to its bindings (safe to repeat); "
        "with other options it fails (exit status 1) saying which differ. Prints the queue.",
    )
    p.add_argument("name", metavar="NAME", help="queue name: letters, digits and _ . : -")
    p.add_argument(
        "patterns",
        metavar="PATTERN",
        nargs="*",
        help="topic patterns routed into the queue ('*' one word, '#' any)",
    )
    p.add_argument(
        "--message-ttl",
        metavar="SECONDS",
        type=_positive_seconds,
        help="a message waits in the queue at most this long (its own TTL may be less)",
    )
    p.add_argument(
        "--max-length",
        metavar="N",
        type=_count,
        help="the queue holds at most N messages; see --overflow",
    )
    p.add_argument(
        "--overflow",
        choices=OVERFLOWS,
        help="when full: drop the oldest message (drop-head, the default) or refuse "
        "the publish (reject-publish)",
    )
    p.add_argument(
        "--dead-letter",
        metavar="TOPIC",
        help="republish a message under TOPIC after --max-deliveries failed deliveries "
        "(default: drop it then)",
    )
    p.add_argument(
        "--max-deliveries",
        metavar="N",
        type=_positive_int,
        help="failed deliveries before a message is dead-lettered or dropped "
        "(default: retried until it expires)",
    )
    p.add_argument(
        "--dead-letter-expired",
        action="store_true",
        help="republish under --dead-letter TOPIC the messages that expire in the queue "
        "too (default: drop them)",
    )
    p.add_argument(
        "--dead-letter-dropped",
        action="store_true",
        help="republish under --dead-letter TOPIC the messages a full drop-head queue "
        "drops from its head too (default: drop them)",
    )
    p.add_argument(
        "--auto-delete",
        action="store_true",
        help="delete the queue when its last consumer leaves (after it had one)",
    )
    p.add_argument(
        "--expires",
        metavar="SECONDS",
        type=_positive_seconds,
        help="delete the queue after SECONDS with no consumer and no declare",
    )
    # argparse gives `declare NAME --opt X PATTERN`'s PATTERN back unparsed; main adds it
    p.set_defaults(func=run_declare, late_positional="patterns")

    p = sub.add_parser(
        "bind",
        parents=parents,
        help="route messages matching a pattern into a queue too (safe to repeat)",
        description="Add PATTERN to the bindings of queue NAME: messages published "
        "from now on whose topic matches it get a copy in the queue. Binding a pattern "
        "the queue already has changes nothing.",
    )
    p.add_argument("name", metavar="NAME", help="queue name")
    p.add_argument("pattern", metavar="PATTERN", help="topic pattern")
    p.set_defaults(func=run_bind, bind=True)

    p = sub.add_parser(
        "unbind",
        parents=parents,
        help="stop routing messages matching a pattern into a queue",
        description="Remove PATTERN from the bindings of queue NAME. Messages already in "
        "the queue stay. Unbinding a pattern the queue does not have changes nothing.",
    )
    p.add_argument("name", metavar="NAME", help="queue name")
    p.add_argument("pattern", metavar="PATTERN", help="topic pattern")
    p.set_defaults(func=run_bind, bind=False)

    p = sub.add_parser(
        "ls",
        parents=parents,
        help="list queues: name, depth, consumers, bindings",
        description="List every queue of the bus as a table: name, depth (messages "
        "waiting or being handled), consumers attached now (any process, any host) and "
        "bindings. With --json print one JSON object per queue, options included.",
    )
    p.set_defaults(func=run_ls)

    p = sub.add_parser(
        "purge",
        parents=parents,
        help="remove the messages waiting in a queue",
        description="Remove every message waiting in queue NAME (one a consumer holds "
        "right now is left alone) and print how many went. The queue and its bindings "
        "stay. Nothing asks for confirmation.",
    )
    p.add_argument("name", metavar="NAME", help="queue name")
    p.set_defaults(func=run_purge)

    p = sub.add_parser(
        "delete",
        parents=parents,
        help="delete a queue and its messages",
        description="Delete queue NAME with its bindings and messages; print how many "
        "messages it held. Nothing asks for confirmation.",
    )
    p.add_argument("name", metavar="NAME", help="queue name")
    p.add_argument(
        "--if-unused",
        action="store_true",
        help="only if no consumer is attached (else fail, exit status 1)",
    )
    p.add_argument(
        "--if-empty",
        action="store_true",
        help="only if it holds no message (else fail, exit status 1)",
    )
    p.set_defaults(func=run_delete)


# --- argument types -------------------------------------------------------------------------


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return value


def _positive_int(text: str, least: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {text!r}")
    return value


def _count(text: str) -> int:
    return _positive_int(text, least=0)


# --- what is printed ------------------------------------------------------------------------


def queue_json(info: QueueInfo) -> dict[str, Any]:
    """The JSON object printed for one queue."""
    return {
        "name": info.name,
        "depth": info.depth,
        "consumers": info.consumers,
        "dead_lettering": info.dead_lettering,
        "bindings": list(info.bindings),
        "options": dataclasses.asdict(info.options),
    }


def _bindings_text(bindings: Sequence[str]) -> str:
    return " ".join(bindings) if bindings else "-"


def queue_table(queues: Sequence[dict[str, Any]]) -> list[str]:
    """The table ``queue ls`` prints, from :func:`queue_json` objects."""
    rows = [
        [q["name"], str(q["depth"]), str(q["consumers"]), _bindings_text(q["bindings"])]
        for q in queues
    ]
    return format_table(["NAME", "DEPTH", "CONSUMERS", "BINDINGS"], rows, right=(1, 2))


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _value_text(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def options_flags(options: QueueOptions) -> str:
    """The ``queue declare`` options that declare a queue with ``options``."""
    out = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value == f.default or value is None or value is False:
            continue
        out.append(_flag(f.name) if value is True else f"{_flag(f.name)} {_value_text(value)}")
    return " ".join(out)


def _mismatch(name: str, asked: QueueOptions, found: QueueOptions) -> str:
    diffs = []
    for f in dataclasses.fields(asked):
        ours, theirs = getattr(asked, f.name), getattr(found, f.name)
        if ours != theirs:
            diffs.append(
                f"{_flag(f.name)} asked {_value_text(ours)}, the queue has {_value_text(theirs)}"
            )
    same = options_flags(found)
    repeat = f"`fsbus queue declare {name} {same}`" if same else "no options"
    return (
        f"queue {name!r} exists with other options ({'; '.join(diffs)}): nothing changed; "
        f"declare it with the options it has ({repeat}), or delete it first "
        f"(`fsbus queue delete {name}` drops its messages)"
    )


def _info_line(verb: str, info: QueueInfo) -> str:
    return (
        f"{verb} queue {info.name!r}: bindings {_bindings_text(info.bindings)}; "
        f"{info.depth} message(s), {info.consumers} consumer(s)"
        + (
            f", {info.dead_lettering} dropped on their way to {info.options.dead_letter!r}"
            if info.dead_lettering
            else ""
        )
    )


# --- commands -------------------------------------------------------------------------------


def missing_queue(name: str, root: Path) -> QueueNotFound:
    """The error for a queue that is not declared, in the command line's words."""
    return QueueNotFound(
        f"no queue named {name!r} on {root}; declare it first: "
        f"fsbus queue declare {name} PATTERN..."
    )


def _run(args: argparse.Namespace, body: Callable[[Bus], Awaitable[int]]) -> int:
    """Open the bus of ``args`` and run ``await body(bus)``."""
    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)

    async def command() -> int:
        async with Bus(root, config=config) as bus:
            try:
                code: int = await body(bus)
            except QueueNotFound as exc:
                raise missing_queue(args.name, root) from exc
        return code

    return run_async(command)


async def _options_of(bus: Bus, name: str) -> QueueOptions | None:
    try:
        return (await bus.queue_info(name)).options
    except FsBusError:
        return None


def run_declare(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus queue declare``."""
    from fsbus import QueueOptions

    asked = QueueOptions(
        message_ttl=args.message_ttl,
        max_length=args.max_length,
        overflow=args.overflow or "drop-head",
        dead_letter=args.dead_letter,
        max_deliveries=args.max_deliveries,
        auto_delete=args.auto_delete,
        expires=args.expires,
        dead_letter_expired=args.dead_letter_expired,
        dead_letter_dropped=args.dead_letter_dropped,
    )

    async def body(bus: Bus) -> int:
        try:
            info = await bus.declare_queue(args.name, args.patterns, **dataclasses.asdict(asked))
        except QueueMismatch as exc:
            found = await _options_of(bus, args.name)
            if found is None:
                raise  # gone meanwhile: the library's words will do
            raise QueueMismatch(_mismatch(args.name, asked, found)) from exc
        if args.json:
            emit_json(queue_json(info))
        else:
            emit(_info_line("declared", info))
        return 0

    return _run(args, body)


def run_bind(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus queue bind`` and ``fsbus queue unbind``."""

    async def body(bus: Bus) -> int:
        if args.bind:
            await bus.bind_queue(args.name, args.pattern)
        else:
            await bus.unbind_queue(args.name, args.pattern)
        info = await bus.queue_info(args.name)
        if args.json:
            emit_json(queue_json(info))
        else:
            emit(_info_line("bound" if args.bind else "unbound", info))
        return 0

    return _run(args, body)


def run_ls(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus queue ls``."""

    async def body(bus: Bus) -> int:
        infos = sorted(await bus.queues(), key=lambda i: i.name)
        if args.json:
            for info in infos:
                emit_json(queue_json(info))
        elif infos:
            for line in queue_table([queue_json(info) for info in infos]):
                emit(line)
        return 0

    return _run(args, body)


def run_purge(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus queue purge``."""

    async def body(bus: Bus) -> int:
        purged = await bus.purge_queue(args.name)
        if args.json:
            emit_json({"queue": args.name, "purged": purged})
        else:
            emit(f"purged {purged} message(s) from queue {args.name!r}")
        return 0

    return _run(args, body)


def run_delete(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus queue delete``."""

    async def body(bus: Bus) -> int:
        if args.if_unused or args.if_empty:
            # say it in the command line's words; delete_queue checks again under its lock
            info = await bus.queue_info(args.name)
            if args.if_unused and info.consumers:
                raise QueueMismatch(
                    f"queue {args.name!r} has {info.consumers} consumer(s) and --if-unused "
                    "was given: not deleted; stop its consumers first, or leave out --if-unused"
                )
            if args.if_empty and info.depth:
                raise QueueMismatch(
                    f"queue {args.name!r} holds {info.depth} message(s) and --if-empty was "
                    "given: not deleted; consume or purge them first "
                    f"(`fsbus queue purge {args.name}`), or leave out --if-empty"
                )
        held = await bus.delete_queue(args.name, if_unused=args.if_unused, if_empty=args.if_empty)
        if args.json:
            emit_json({"queue": args.name, "deleted": True, "messages": held})
        else:
            emit(f"deleted queue {args.name!r} (it held {held} message(s))")
        return 0

    return _run(args, body)
