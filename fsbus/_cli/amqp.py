"""``fsbus amqp``: serve the bus to RabbitMQ clients (AMQP 0-9-1) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import re
import sys

from .runtime import CliError, bus_config, interruptible, resolve_root, run_async

DEFAULT_LISTEN = "127.0.0.1:5672"


def add_amqp_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    p = subparsers.add_parser(
        "amqp",
        parents=[common],
        help="serve the bus to RabbitMQ clients over AMQP 0-9-1",
        description="Listen for AMQP 0-9-1 clients (pika, aio-pika, kombu, Celery, amqplib) "
        "and serve them the bus directory: exchanges, queues and bindings are kept in the "
        "directory, so any number of gateways on any hosts serve one bus. Stop with Ctrl-C "
        "or SIGTERM.",
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="address to listen on; port 0 picks a free one (default: %(default)s)",
    )
    p.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="NAME:PASSWORD",
        help="a user clients may log in as (repeatable; default guest:guest, which RabbitMQ "
        "and this gateway accept from loopback only)",
    )
    p.add_argument(
        "--disk-free-limit",
        type=parse_bytes,
        default=None,
        metavar="SIZE",
        help="free space of the bus's filesystem below which publishers are blocked "
        "(connection.blocked), as RabbitMQ's disk alarm does: bytes, or with a unit such as "
        "50MB, 2GB, 512MiB (default: 50MB, or FSBUS_AMQP_DISK_FREE_LIMIT)",
    )
    p.add_argument(
        "--inode-free-limit",
        type=parse_count,
        default=None,
        metavar="COUNT",
        help="free inodes below which publishers are blocked: every message is a file "
        "(default: 1000, or FSBUS_AMQP_INODE_FREE_LIMIT)",
    )
    p.set_defaults(func=run_amqp)


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """``50MB``, ``2GB``, ``512MiB`` or a number of bytes (RabbitMQ's units: kB/MB/GB are
    powers of 1000, KiB/MiB/GiB of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes (50000000) or a number with a unit "
            "(50MB, 2GB, 512MiB)"
        )
    value = float(match.group(1))
    return int(value * _UNITS[unit])


def parse_count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: give a whole number, e.g. 1000")
    return int(text)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise CliError(f"--listen {text!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def run_amqp(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    users = {}
    for entry in args.user:
        name, sep, password = entry.partition(":")
        if not sep or not name:
            raise CliError(f"--user {entry!r}: give NAME:PASSWORD")
        users[name] = password
    root = resolve_root(args)
    config = bus_config(args)

    async def command() -> int:
        from fsbus.amqp import Gateway

        async with Gateway(
            root,
            host=host,
            port=port,
            users=users or None,
            config=config,
            disk_free_limit=args.disk_free_limit,
            inode_free_limit=args.inode_free_limit,
        ) as gw:
            print(
                f"fsbus AMQP gateway for {root} on {gw.url.replace('guest:guest@', '')}",
                file=sys.stderr,
                flush=True,
            )
            import anyio

            with interruptible():
                await anyio.sleep_forever()
        return 0

    return run_async(command)
