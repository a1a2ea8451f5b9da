"""The ``fsbus ui`` subcommand; the CLI registers it with :func:`add_ui_command`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsbus import InvalidConfig

if TYPE_CHECKING:
    from fsbus import BusConfig

__all__ = ["add_ui_command", "run_ui"]

ENV_ROOT = "FSBUS_ROOT"


class UiUsageError(InvalidConfig):
    """A mistake in ``fsbus ui``'s arguments."""


def add_ui_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser | None = None,
) -> argparse.ArgumentParser:
    """Register ``ui`` on the CLI's ``subparsers``.

    ``common`` is the CLI's parent parser of shared options (``--root``, ``-o``); without
    it the command defines ``--root`` itself.
    """
    p = subparsers.add_parser(
        "ui",
        parents=[common] if common is not None else [],
        help="serve a local web dashboard of the bus (backlog, rates, queues, locks, streams)",
        description="Serve a web dashboard of the bus on 127.0.0.1: backlog and rates per "
        "topic and bucket, durable queues (depth, consumers, rates), work-queue messages "
        "being handled and by which process, streams "
        "with their segments and consumer groups, each message's headers and payload, and "
        "purging work queues. Purging needs the access token printed at start. Stop with "
        "Ctrl-C.",
    )
    if common is None:
        p.add_argument("--root", metavar="DIR", help=f"bus directory (default: ${ENV_ROOT})")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port",
        type=int,
        default=8765,
        help="port to listen on; 0 picks a free one (default: %(default)s)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("FSBUS_UI_TOKEN"),
        help="access token for purges (default: $FSBUS_UI_TOKEN, else a random one)",
    )
    p.set_defaults(func=run_ui)
    return p


def _root(args: argparse.Namespace) -> Path:
    root = getattr(args, "root", None) or os.environ.get(ENV_ROOT, "")
    if not root:
        raise UiUsageError(f"no bus directory: pass --root DIR or set {ENV_ROOT}")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise UiUsageError(f"{path} is not a directory; pass the root of a bus to --root")
    return path


def _config(args: argparse.Namespace) -> BusConfig | None:
    from fsbus import BusConfig  # pydantic: only when the command runs

    options: dict[str, Any] = {}
    for item in getattr(args, "option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UiUsageError(f"-o/--option needs KEY=VALUE (a BusConfig field), got {item!r}")
        try:
            options[key.strip().replace("-", "_")] = json.loads(value)
        except ValueError:
            options[key.strip().replace("-", "_")] = value
    return BusConfig(**options) if options else None


def run_ui(args: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM); returns the exit status."""
    from ._server import UiServer  # http.server and the Bus: only when the command runs

    root = _root(args)
    if not 0 <= args.port <= 65535:
        raise UiUsageError(f"--port must be 0-65535, got {args.port}")
    server = UiServer(
        str(root), host=args.host, port=args.port, token=args.token, config=_config(args)
    )
    stopped = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopped.set()

    previous = signal.signal(signal.SIGTERM, stop)
    with server:
        server.start()
        print(f"fsbus ui: serving {root} on {server.url}", flush=True)
        print(f"access token (needed to purge): {server.token}", flush=True)
        print(f"open {server.login_url} to sign this browser in", flush=True)
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"warning: listening on {args.host}: anyone who can reach it can read the bus",
                file=sys.stderr,
                flush=True,
            )
        try:
            stopped.wait()
        except KeyboardInterrupt:
            pass
    signal.signal(signal.SIGTERM, previous)
    return 0
