"""``fsbus gc``, ``fsbus purge`` and ``fsbus doctor``: keep the directory clean, empty a
queue, and check the directory can carry a bus."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .output import emit, emit_json
from .runtime import bus_config, resolve_root, run_async

if TYPE_CHECKING:
    from fsbus import DoctorReport, PurgeReport

# anyio and the Bus are imported inside the commands: `fsbus --help` needs neither.

__all__ = ["add_maintenance_commands", "doctor_json", "doctor_lines", "purge_json", "purge_line"]

PURGE_KINDS = ("single", "multi", "all")


def add_maintenance_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """Register ``gc``, ``purge`` and ``doctor`` on ``subparsers``."""
    g = subparsers.add_parser(
        "gc",
        parents=[common],
        help="remove expired messages and debris left by crashed publishers",
        description="Remove expired messages (and their topic files) and staging debris "
        "left by crashed publishers; print how many files went. On a terminal a progress "
        "line shows that the sweep is running.",
    )
    g.set_defaults(func=run_gc)

    p = subparsers.add_parser(
        "purge",
        parents=[common],
        help="remove the messages matching a pattern (work-queue messages by default)",
        description="Remove the messages on the bus whose topic matches PATTERN, without "
        "delivering them. A work-queue message is claimed and acknowledged as a consumer "
        "would, so one that a consumer holds right now is left alone and counted as "
        "locked. Multi messages (--kind multi or all) are removed for every subscriber. "
        "Prints what was removed; nothing asks for confirmation.",
    )
    p.add_argument("pattern", metavar="PATTERN", help="topic pattern ('*' one word, '#' any)")
    p.add_argument(
        "--kind",
        choices=PURGE_KINDS,
        default="single",
        help="which messages: single (work-queue, the default), multi, or all",
    )
    p.set_defaults(func=run_purge)

    d = subparsers.add_parser(
        "doctor",
        parents=[common],
        help="check that the directory can carry a bus (flock, inotify, clock, space)",
        description="Probe the bus directory the way the bus uses it: filesystem type "
        "(from /proc/self/mountinfo), layout and permissions, create/rename, flock between "
        "two open file descriptions, inotify seeing a write within 2 s, clock skew against "
        "a fresh file's mtime, free space and inodes. Each check says ok, warn or fail and "
        "what to fix. Exit status 1 when a check fails. The directory is not created.",
    )
    d.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        help="directory to check (default: --root / $FSBUS_ROOT)",
    )
    d.set_defaults(func=run_doctor)


def run_gc(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus gc``."""
    import anyio

    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)
    started = time.monotonic()
    removed = 0

    async def spinner() -> None:
        frames = "|/-\\"
        i = 0
        while True:
            elapsed = time.monotonic() - started
            sys.stderr.write(f"\r\x1b[2Kgc: sweeping {root} {frames[i % 4]} {elapsed:.1f}s")
            sys.stderr.flush()
            i += 1
            await anyio.sleep(0.1)

    async def command() -> int:
        nonlocal removed
        async with Bus(root, config=config) as bus, anyio.create_task_group() as tg:
            if sys.stderr.isatty():
                tg.start_soon(spinner)
            try:
                removed = await bus.gc()
            finally:
                tg.cancel_scope.cancel()
                if sys.stderr.isatty():
                    sys.stderr.write("\r\x1b[2K")
                    sys.stderr.flush()
        return 0

    code = run_async(command)
    seconds = time.monotonic() - started
    if code == 0:
        if args.json:
            emit_json({"removed": removed, "seconds": round(seconds, 3)})
        else:
            emit(f"removed {removed} file(s) in {seconds:.2f} s")
    return code


def purge_json(report: PurgeReport) -> dict[str, object]:
    """The JSON object ``purge --json`` prints."""
    return {
        "pattern": report.pattern,
        "kind": report.kind,
        "single": report.single,
        "multi": report.multi,
        "locked": report.locked,
    }


def purge_line(report: PurgeReport) -> str:
    """The human-readable summary of a purge."""
    line = (
        f"purged {report.single} work-queue and {report.multi} multi message(s) "
        f"matching {report.pattern!r}"
    )
    if report.locked:
        line += f"; {report.locked} held by a consumer, left alone"
    return line


def run_purge(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus purge``."""
    from fsbus import Bus

    root = resolve_root(args)
    config = bus_config(args)
    reports: list[PurgeReport] = []

    async def command() -> int:
        async with Bus(root, config=config) as bus:
            reports.append(await bus.purge(args.pattern, kind=args.kind))
        return 0

    code = run_async(command)
    if code == 0:
        [report] = reports
        if args.json:
            emit_json(purge_json(report))
        else:
            emit(purge_line(report))
    return code


def doctor_json(report: DoctorReport) -> dict[str, object]:
    """The JSON object ``doctor --json`` prints."""
    return {
        "root": report.root,
        "status": report.status,
        "checks": [
            {"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix}
            for c in report.checks
        ],
    }


def doctor_lines(report: DoctorReport) -> list[str]:
    """The human-readable report."""
    width = max((len(c.name) for c in report.checks), default=0)
    lines = []
    for c in report.checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    verdict = {
        "ok": "all checks passed",
        "warn": "usable, with warnings",
        "fail": "NOT usable as a bus until the failures are fixed",
    }[report.status]
    lines.append(f"{report.root}: {verdict}")
    return lines


def run_doctor(args: argparse.Namespace) -> int:
    """Entry point of ``fsbus doctor``."""
    from fsbus import check_directory

    root = Path(args.dir) if args.dir else resolve_root(args)
    report = check_directory(root)
    if args.json:
        emit_json(doctor_json(report))
    else:
        for line in doctor_lines(report):
            emit(line)
    return 0 if report.ok else 1
