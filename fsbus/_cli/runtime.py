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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import anyio

    from fsbus import BusConfig

__all__ = ["CliError", "bus_config", "interruptible", "resolve_root", "run_async"]

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


def bus_config(args: argparse.Namespace) -> BusConfig | None:
    """A :class:`BusConfig` with the ``-o KEY=VALUE`` overrides applied; None (the
    defaults) without any."""

    options: dict[str, object] = {}
    for item in getattr(args, "option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-o/--option needs KEY=VALUE (a BusConfig field), got {item!r}")
        options[key.strip().replace("-", "_")] = _option_value(value)
    if not options:
        # the defaults: a bus opened without a config does not import pydantic (0.1-0.2 s
        # of every command's start)
        return None
    from fsbus import BusConfig  # pydantic: imported only when options are given

    return BusConfig(**options)


class _Interrupts:
    """The cancel scopes a signal should end first (see :func:`interruptible`)."""

    def __init__(self) -> None:
        self.scopes: list[anyio.CancelScope] = []


_interrupts: ContextVar[_Interrupts | None] = ContextVar("fsbus_cli_interrupts", default=None)


@contextmanager
def interruptible() -> Iterator[None]:
    """Mark the waiting part of a command: SIGINT/SIGTERM ends this block only.

    The code after the block runs normally, so a command leaves its ``async with
    Bus(...)`` blocks the usual way (acknowledgements already made are completed,
    work-queue messages not yet acknowledged are released). A second signal cancels
    everything.
    """
    import anyio

    registry = _interrupts.get()
    with anyio.CancelScope() as scope:
        if registry is not None:
            registry.scopes.append(scope)
        try:
            yield
        finally:
            if registry is not None:
                registry.scopes.remove(scope)


def run_async(command: Callable[[], Awaitable[int]]) -> int:
    """Run ``command`` on asyncio; SIGINT/SIGTERM stop it cleanly (exit 128 + signum).

    A signal cancels the blocks marked with :func:`interruptible` if any are active,
    else (or on a second signal) the whole command.
    """
    import anyio  # the event loop: imported when a command runs, not for --help

    received: list[int] = []

    async def main() -> int:
        result = 0
        registry = _Interrupts()
        _interrupts.set(registry)
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        received.append(int(signum))
                        if registry.scopes and len(received) == 1:
                            for scope in registry.scopes:
                                scope.cancel()
                            continue
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
