"""The ``fsbus`` command line (``python -m fsbus``), built on the public API only.

Every command that needs a bus takes ``--root DIR`` (or ``FSBUS_ROOT``); the
directory and its sub-folders are created when missing. Errors print one line,
``fsbus: error: ...``, and exit non-zero: 2 for a mistake in the command line or a
bad topic/pattern/header, 1 for anything else; ``FSBUS_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from fsbus import FsBusError, UsageError, __version__
from fsbus.ui import add_ui_command

from .amqp import add_amqp_command
from .browse import add_browse_commands
from .completion import add_completion_command
from .maintenance import add_maintenance_commands
from .publish import add_publish_command
from .queue import add_queue_commands
from .runtime import ENV_ROOT, CliError
from .stream import add_stream_commands
from .subscribe import add_subscribe_command
from .top import add_top_command

__all__ = ["build_parser", "main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def _common_options(*, top: bool) -> argparse.ArgumentParser:
    """Options every command accepts, before or after the command name."""
    p = argparse.ArgumentParser(add_help=False)
    default = None if top else argparse.SUPPRESS
    p.add_argument(
        "--root",
        metavar="DIR",
        default=default,
        help=f"bus directory (default: ${ENV_ROOT}); created with its sub-folders if missing",
    )
    p.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON (one object per line) instead of text",
    )
    p.add_argument(
        "-o",
        "--option",
        metavar="KEY=VALUE",
        action="append",
        default=None if top else argparse.SUPPRESS,
        help="set a BusConfig field, e.g. -o bucket_num_chars=1 (repeatable; every peer "
        "must agree on the on-disk format fields)",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole argparse tree of ``fsbus``."""
    parser = argparse.ArgumentParser(
        prog="fsbus",
        parents=[_common_options(top=True)],
        description="A message bus in a directory: topic pub/sub, work queues and streams "
        "with no broker process.",
        epilog="Run `fsbus COMMAND --help` for a command's options. Exit status: 0 ok, "
        "1 error, 2 usage error (bad option, topic or pattern), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"fsbus {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common_options(top=False)
    add_publish_command(subparsers, common)
    add_subscribe_command(subparsers, common)
    add_browse_commands(subparsers, common)
    add_maintenance_commands(subparsers, common)
    add_top_command(subparsers, common)
    add_stream_commands(subparsers, common)
    add_queue_commands(subparsers, common)
    add_ui_command(subparsers, common)
    add_amqp_command(subparsers, common)
    add_completion_command(subparsers, parser)
    return parser


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out += _leaves(inner)
        return out
    return [exc]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, FsBusError):
        text = exc.strerror or str(exc)
        if exc.filename is not None:
            text += f": {os.fsdecode(exc.filename)}"
    else:
        text = str(exc) or type(exc).__name__
    notes = getattr(exc, "__notes__", None) or []
    if notes:
        text += " (" + "; ".join(notes) + ")"
    return " ".join(text.split("\n"))


def _fail(exc: BaseException) -> int:
    if isinstance(exc, BrokenPipeError):
        # the reader went away (`fsbus ls | head`): stop quietly, like a killed pipe writer
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_BROKEN_PIPE
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    print(f"fsbus: error: {_describe(exc)}", file=sys.stderr)
    if isinstance(exc, CliError | UsageError):
        return EXIT_USAGE
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    late = getattr(args, "late_positional", None)
    if late is not None and extras:
        value = getattr(args, late)
        if isinstance(value, list):
            # `queue declare NAME --max-length 3 PATTERN...`: argparse ended the list at NAME
            value += [e for e in extras if not e.startswith("-")]
            extras = [e for e in extras if e.startswith("-")]
        elif len(extras) == 1 and value is None:
            # argparse binds `publish TOPIC --single PAYLOAD`'s optional PAYLOAD too early
            setattr(args, late, extras.pop())
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    debug = os.environ.get("FSBUS_DEBUG", "").strip() not in {"", "0"}
    try:
        code: int = args.func(args)
        return code
    except (FsBusError, OSError, CliError, KeyboardInterrupt, BaseExceptionGroup) as exc:
        if debug:
            raise
        leaves = _leaves(exc)
        expected = (FsBusError, OSError, CliError, KeyboardInterrupt)
        chosen = next((e for e in leaves if isinstance(e, expected)), None)
        if chosen is None:
            raise
        return _fail(chosen)
