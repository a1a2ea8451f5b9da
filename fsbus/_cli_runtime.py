"""How CLI commands find the bus, build its configuration and run async code.

:func:`run_async` runs a command's coroutine on asyncio and turns SIGINT/SIGTERM
into a clean cancellation: the command's ``async with Bus(...)`` blocks unwind,
work-queue messages being handled are released (no lock is left), and the exit
code is ``128 + signal number`` (130 for Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from fsbus import BusConfig

__all__ = ["CliError", "bus_config", "resolve_root", "run_async"]

ENV_ROOT = "FSBUS_ROOT"


class CliError(Exception):
    """A mistake on the command line; printed as one line, exit code 2."""


def resolve_root(args: argparse.Namespace) -> Path:
    """The bus directory from ``--root`` or ``FSBUS_ROOT``; :class:`CliError` if neither."""
    root = getattr(args, "root", None) or os.environ.get(ENV_ROOT, "")
    if not root:
        raise CliError(f"no bus directory: pass --root DIR or set {ENV_ROOT}")
    return Path(root).expanduser()


def _option_value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def bus_config(args: argparse.Namespace) -> BusConfig:
    """A :class:`BusConfig` with the ``-o KEY=VALUE`` overrides applied."""
    options: dict[str, object] = {}
    for item in getattr(args, "option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-o/--option needs KEY=VALUE (a BusConfig field), got {item!r}")
        options[key.strip().replace("-", "_")] = _option_value(value)
    return BusConfig(**options)


def run_async(command: Callable[[], Awaitable[int]]) -> int:
    """Run ``command`` on asyncio; SIGINT/SIGTERM cancel it cleanly (exit 128 + signum)."""
    received: list[int] = []

    async def main() -> int:
        result = 0
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        received.append(int(signum))
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_signals)
            result = await command()
            tg.cancel_scope.cancel()
        return result

    result = anyio.run(main)
    if received:
        return 128 + received[0]
    return result
