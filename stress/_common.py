"""What every scenario shares: sizes, payloads, event logs, summaries, the CLI.

Children record what they do in per-process event logs (one ``O_APPEND`` write per
line, so a line is either whole or absent even when the process is SIGKILLed); the
parent reads the logs to count deliveries.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.context
import os
import random
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "SIZES",
    "EventLog",
    "Runner",
    "Summary",
    "add_options",
    "check_payload",
    "main_for",
    "make_payload",
    "matches",
    "options",
    "random_pattern",
    "random_topic",
    "read_events",
    "spawn",
    "wait_until",
    "workdir",
]

SIZES = ("small", "large")
START_TIMEOUT = 180.0
"""Seconds a role process may take to open its bus and subscribe (GlusterFS on a loaded
machine takes tens of seconds)."""

WORDS = ("a", "b", "c", "d", "e")


def spawn() -> multiprocessing.context.SpawnContext:
    """A spawn context: children start clean (no inherited event loop or threads)."""
    return multiprocessing.get_context("spawn")


# ---------------------------------------------------------------- payloads
def make_payload(rng: random.Random, *, low: int = 1, high: int = 200_000) -> tuple[bytes, str]:
    """A random payload (log-uniform size in [low, high]) and its CRC-32 as hex."""
    size = round(low * (high / low) ** rng.random()) if high > low else low
    data = rng.randbytes(size)
    return data, f"{zlib.crc32(data):08x}"


def check_payload(data: bytes, crc: str) -> bool:
    """Whether ``data`` has the CRC-32 the publisher put in its headers."""
    return f"{zlib.crc32(data):08x}" == crc


# ---------------------------------------------------------------- topics
def random_topic(rng: random.Random, *, max_words: int = 4) -> str:
    """A topic of 1..max_words words from a small vocabulary (so bindings overlap)."""
    return ".".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))


def random_pattern(rng: random.Random, *, max_words: int = 4) -> str:
    """A RabbitMQ-style binding: words, ``*`` and ``#`` mixed at random."""
    parts = []
    for _ in range(rng.randint(1, max_words)):
        r = rng.random()
        parts.append("#" if r < 0.2 else "*" if r < 0.45 else rng.choice(WORDS))
    return ".".join(parts)


def matches(pattern: str, topic: str) -> bool:
    """Reference AMQP topic matcher (independent of fsbus's trie)."""
    return _match(pattern.split("."), topic.split("."))


def _match(pat: Sequence[str], words: Sequence[str]) -> bool:
    if not pat:
        return not words
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    if head == "*":
        return words[0] != "" and _match(rest, words[1:])
    return head == words[0] and _match(rest, words[1:])


# ---------------------------------------------------------------- event logs
class EventLog:
    """Append-only event lines of one process; each line is one ``write`` (atomic)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, *fields: object) -> None:
        """Record one event: space-separated fields, no spaces inside a field."""
        os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())

    def close(self) -> None:
        """Close the log."""
        os.close(self._fd)


def read_events(paths: Iterable[Path]) -> Iterator[tuple[str, list[str]]]:
    """(file stem, fields) for every complete line of every log."""
    for path in paths:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines(keepends=True):
            if line.endswith("\n"):
                yield path.stem, line.split()


def wait_until(condition: Callable[[], bool], timeout: float | None, step: float = 0.05) -> bool:
    """Check ``condition`` until it holds or ``timeout`` seconds pass (None: no limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if condition():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(step)


@contextmanager
def workdir(roots: Sequence[str] | None = None) -> Iterator[tuple[Path, list[str]]]:
    """A scratch directory for the event logs, and the bus directories to use.

    Without ``roots`` the bus lives in the scratch directory. With them (paths to one
    directory, e.g. two mounts of a share, as two "hosts" see it), each gets the same
    fresh subdirectory, removed afterwards.
    """
    base = os.environ.get("FSBUS_STRESS_DIR")
    path = Path(tempfile.mkdtemp(prefix="fsbus-stress-", dir=base))
    buses = [f"{r.rstrip('/')}/{path.name}" for r in roots] if roots else [str(path / "bus")]
    try:
        yield path, buses
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if roots:
            shutil.rmtree(buses[0], ignore_errors=True)


# ---------------------------------------------------------------- summaries
@dataclass
class Summary:
    """The outcome of one scenario run."""

    scenario: str
    """Scenario name."""
    size: str
    """Configuration name (small or large)."""
    sent: int = 0
    """Messages published."""
    delivered: int = 0
    """Deliveries counted (one per message and receiver that must get it)."""
    duplicates: int = 0
    """Deliveries beyond the first that the guarantee forbids."""
    lost: int = 0
    """Expected deliveries that never happened."""
    seconds: float = 0.0
    """Wall time from first publish to last delivery."""
    notes: dict[str, int] = field(default_factory=dict)
    """Scenario-specific counters (allowed duplicates, kills, failures, expired ...)."""
    violations: list[str] = field(default_factory=list)
    """What went wrong, in words (empty: every guarantee held)."""

    @property
    def ok(self) -> bool:
        """No loss, no forbidden duplicate, no other violation."""
        return not self.violations and not self.lost and not self.duplicates

    @property
    def rate(self) -> float:
        """Deliveries per second."""
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """The one-line summary a scenario prints."""
        extra = "".join(f" {k}={v}" for k, v in sorted(self.notes.items()))
        return (
            f"{self.scenario} size={self.size} sent={self.sent} delivered={self.delivered} "
            f"duplicates={self.duplicates} lost={self.lost} rate={self.rate:.0f}/s "
            f"seconds={self.seconds:.1f}{extra} result={'OK' if self.ok else 'FAIL'}"
        )


_NAME = re.compile(r"^[a-z_]+$")


class Runner(Protocol):
    """What every scenario's ``run`` looks like."""

    def __call__(
        self,
        size: str,
        *,
        seed: int | None = None,
        config: dict[str, object] | None = None,
        roots: Sequence[str] | None = None,
    ) -> Summary: ...


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options every scenario takes."""
    parser.add_argument("--size", choices=SIZES, default="small", help="configuration to run")
    parser.add_argument(
        "--root",
        action="append",
        metavar="DIR",
        help="run the bus under DIR (repeat with other paths to the same directory, such "
        "as two mounts of a share: processes are spread over them)",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='a BusConfig option for every process (VALUE in JSON), e.g. locking="rename"',
    )
    parser.add_argument("--seed", type=int, help="random seed (printed in the summary)")


def options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``run`` from parsed options."""
    config: dict[str, object] = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--config wants KEY=VALUE, not {item!r}")
        try:
            config[key] = json.loads(value)
        except ValueError:
            config[key] = value
    return {"seed": args.seed, "config": config or None, "roots": args.root}


def main_for(name: str, run: Runner, argv: Sequence[str] | None = None) -> int:
    """CLI of one scenario: parse the options, run, print the summary, return the exit code."""
    assert _NAME.match(name)
    parser = argparse.ArgumentParser(prog=f"python -m stress.{name}")
    add_options(parser)
    args = parser.parse_args(argv)
    summary = run(args.size, **options(args))
    print(summary.line(), flush=True)
    for v in summary.violations[:20]:
        print(f"  violation: {v}", file=sys.stderr)
    return 0 if summary.ok else 1
