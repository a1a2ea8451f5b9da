"""``fsbus amqp``: serve the bus to RabbitMQ clients (AMQP 0-9-1) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
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
    p.set_defaults(func=run_amqp)


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

        async with Gateway(root, host=host, port=port, users=users or None, config=config) as gw:
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
