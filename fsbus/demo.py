"""A bus in a directory, shown with real processes: ``python -m fsbus.demo`` (``make demo``).

The demo starts separate OS processes on one directory (a fresh temporary one, or
``--root``):

* two subscribers with different wildcard patterns (``orders.eu.*`` and
  ``orders.*.paid``) that print every event they receive;
* three workers sharing one work queue (``jobs.#``), each job handled by one of them;
* then two publishers, each publishing order events (multi: every matching
  subscriber gets a copy) and jobs (single: exactly one worker gets it).

It counts who got what, checks that every subscriber received every matching event
exactly once and that every job was handled exactly once, prints a summary, and
exits non-zero on any violation. Everything goes through the public ``fsbus`` API.
"""

from __future__ import annotations

import argparse
import functools
import json
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from fsbus import BlockingBus, Bus

REGIONS = ("eu", "us", "apac")
EVENTS = ("created", "paid", "shipped")
SUBSCRIBERS = (("subscriber-eu", "orders.eu.*"), ("subscriber-paid", "orders.*.paid"))
WORKERS = ("worker-1", "worker-2", "worker-3")
PUBLISHERS = ("publisher-1", "publisher-2")
JOB_PATTERN = "jobs.#"
DEADLINE = 15.0  # seconds for every message to arrive once the publishers are done


# --- the child processes ---------------------------------------------------------


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _until_signalled(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def _consume(root: str, pattern: str, *, work: bool) -> None:
    # A signal ends only the loop: leaving the blocks below then completes the last
    # acknowledgement and closes the bus cleanly.
    async with Bus(root) as bus, bus.messages(pattern) as it, anyio.create_task_group() as tg:
        tg.start_soon(_until_signalled, tg.cancel_scope)
        _say(event="ready")
        async for msg in it:
            body = msg.json()
            if work:
                await anyio.sleep(0.002)  # "process" the job; lets the others take some
                _say(event="job", id=body["id"])
                await it.ack(msg)
            else:
                _say(event="got", id=body["id"], topic=msg.topic)


async def _publish(root: str, index: int, events: int, jobs: int) -> None:
    async with Bus(root) as bus:
        for k in range(events):
            topic = f"orders.{REGIONS[(k + index) % 3]}.{EVENTS[(k // 3) % 3]}"
            ident = f"p{index}-e{k}"
            await bus.publish(topic, json.dumps({"id": ident, "amount": k}))
            _say(event="published", id=ident, topic=topic)
        for k in range(jobs):
            ident = f"p{index}-j{k}"
            await bus.publish("jobs.invoice.render", json.dumps({"id": ident}), single=True)
            _say(event="queued", id=ident)
    _say(event="done")


def _child(args: argparse.Namespace) -> int:
    if args.role == "publisher":
        anyio.run(_publish, args.root, args.index, args.events, args.jobs)
    else:
        anyio.run(functools.partial(_consume, work=args.role == "worker"), args.root, args.pattern)
    return 0


# --- the parent ------------------------------------------------------------------


def matches(pattern: str, topic: str) -> bool:
    """AMQP topic matching, small and slow: the demo's independent expectation."""

    def match(p: Sequence[str], t: Sequence[str]) -> bool:
        if not p:
            return not t
        if p[0] == "#":
            return any(match(p[1:], t[i:]) for i in range(len(t) + 1))
        if not t:
            return False
        return (p[0] == t[0] or (p[0] == "*" and t[0] != "")) and match(p[1:], t[1:])

    return match(pattern.split("."), topic.split("."))


@dataclass
class Child:
    """One process of the demo and what it said."""

    name: str
    """Its role name (``worker-2``)."""
    proc: subprocess.Popen[bytes]
    """The process."""
    said: list[dict[str, Any]] = field(default_factory=list)
    """Every event it printed, in order."""
    stderr: list[str] = field(default_factory=list)
    """Its stderr lines (shown if it fails)."""
    readers: list[threading.Thread] = field(default_factory=list)
    """The threads reading its stdout and stderr."""


class Demo:
    """Starts the processes, gathers their output, checks the counts."""

    def __init__(self, root: Path, events: int, jobs: int) -> None:
        self.root = root
        self.events = events
        self.jobs = jobs
        self.children: dict[str, Child] = {}
        self.inbox: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
        self.problems: list[str] = []

    def start(self, name: str, *extra: str) -> Child:
        cmd = [sys.executable, "-m", "fsbus.demo", "--root", str(self.root), *extra]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        child = Child(name, proc)
        self.children[name] = child

        def read_out() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                self.inbox.put((name, json.loads(raw)))
            self.inbox.put((name, None))

        def read_err() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                child.stderr.append(raw.decode("utf-8", "replace").rstrip())

        for target in (read_out, read_err):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            child.readers.append(thread)
        return child

    def pump(self, until: Any, deadline: float) -> bool:
        """Gather output until ``until()`` holds; False if the deadline passes first."""
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                name, event = self.inbox.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if event is None:
                child = self.children[name]
                if child.proc.wait() != 0:
                    self.problems.append(f"{name} exited with status {child.proc.returncode}")
                    return False
                continue
            self.children[name].said.append(event)
        return True

    def events_of(self, name: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.children[name].said if e["event"] == kind]

    def run(self) -> int:
        started = time.monotonic()
        print(f"fsbus demo: a bus in {self.root}")
        consumers = [*(n for n, _ in SUBSCRIBERS), *WORKERS]
        for name, pattern in SUBSCRIBERS:
            self.start(name, "--role", "subscriber", "--pattern", pattern)
        for name in WORKERS:
            self.start(name, "--role", "worker", "--pattern", JOB_PATTERN)
        ready = self.pump(
            lambda: all(self.events_of(n, "ready") for n in consumers),
            time.monotonic() + 30.0,
        )
        if not ready:
            return self.fail("the subscribers and workers did not start")
        pids = ", ".join(f"{n} {self.children[n].proc.pid}" for n in consumers)
        print(f"  started {len(SUBSCRIBERS)} subscribers and {len(WORKERS)} workers ({pids})")
        for i, name in enumerate(PUBLISHERS, 1):
            self.start(
                name,
                "--role",
                "publisher",
                "--index",
                str(i),
                "--events",
                str(self.events),
                "--jobs",
                str(self.jobs),
            )
        print(
            f"  started {len(PUBLISHERS)} publishers: {self.events} events + {self.jobs} jobs each"
        )
        if not self.pump(
            lambda: all(self.events_of(n, "done") for n in PUBLISHERS),
            time.monotonic() + 30.0,
        ):
            return self.fail("the publishers did not finish")

        published = [e for n in PUBLISHERS for e in self.events_of(n, "published")]
        queued = {e["id"] for n in PUBLISHERS for e in self.events_of(n, "queued")}
        expected = {
            name: {e["id"] for e in published if matches(pattern, e["topic"])}
            for name, pattern in SUBSCRIBERS
        }

        def complete() -> bool:
            subs_done = all(
                len(self.events_of(name, "got")) >= len(expected[name]) for name, _ in SUBSCRIBERS
            )
            jobs_done = sum(len(self.events_of(w, "job")) for w in WORKERS) >= len(queued)
            return subs_done and jobs_done

        arrived = self.pump(complete, time.monotonic() + DEADLINE)
        self.stop(consumers)
        self.report(published, queued, expected, arrived)
        self.check_queue_empty()
        took = time.monotonic() - started
        if self.problems:
            print("FAILED:")
            for problem in self.problems:
                print(f"  - {problem}")
            return 1
        print(f"OK: nothing lost, no event delivered twice, no job handled twice ({took:.1f} s)")
        return 0

    def stop(self, names: Sequence[str]) -> None:
        """SIGTERM the consumers (they shut down cleanly) and gather their last words."""
        for name in names:
            self.children[name].proc.send_signal(signal.SIGTERM)
        for name in names:
            child = self.children[name]
            code = child.proc.wait(timeout=30)
            for t in child.readers:
                t.join(30)
            if code != 0:
                self.problems.append(f"{name} exited with status {code} after SIGTERM")
        while True:  # what they printed before they stopped
            try:
                name, event = self.inbox.get_nowait()
            except queue.Empty:
                break
            if event is not None:
                self.children[name].said.append(event)

    def report(
        self,
        published: list[dict[str, Any]],
        queued: set[str],
        expected: dict[str, set[str]],
        arrived: bool,
    ) -> None:
        topics = Counter(e["topic"] for e in published)
        print(f"  published {len(published)} events on {len(topics)} topics, {len(queued)} jobs")
        for name, pattern in SUBSCRIBERS:
            got = [e["id"] for e in self.events_of(name, "got")]
            counts = Counter(got)
            twice = sorted(i for i, n in counts.items() if n > 1)
            missing = sorted(expected[name] - set(got))
            strange = sorted(set(got) - expected[name])
            print(
                f"  {name:<16} {pattern:<14} got {len(set(got))}/{len(expected[name])} "
                f"matching events"
            )
            if missing:
                self.problems.append(f"{name} missed {len(missing)} events, e.g. {missing[:3]}")
            if twice:
                self.problems.append(f"{name} got {len(twice)} events twice, e.g. {twice[:3]}")
            if strange:
                self.problems.append(f"{name} got events not matching {pattern}: {strange[:3]}")
        handled: Counter[str] = Counter()
        for name in WORKERS:
            jobs = [e["id"] for e in self.events_of(name, "job")]
            handled.update(jobs)
            print(f"  {name:<16} {JOB_PATTERN:<14} handled {len(jobs)} jobs")
        twice = sorted(i for i, n in handled.items() if n > 1)
        lost = sorted(queued - set(handled))
        print(
            f"  work queue: {len(queued)} jobs, {len(set(handled) & queued)} handled, "
            f"{len(twice)} handled twice, {len(lost)} lost"
        )
        if twice:
            self.problems.append(f"{len(twice)} jobs were handled twice, e.g. {twice[:3]}")
        if lost:
            self.problems.append(f"{len(lost)} jobs were never handled, e.g. {lost[:3]}")
        if not arrived and not self.problems:
            self.problems.append(f"not everything arrived within {DEADLINE:.0f} s")

    def check_queue_empty(self) -> None:
        with BlockingBus(self.root) as bus:
            left = list(bus.browse(JOB_PATTERN))
        if left:
            self.problems.append(f"{len(left)} jobs are still on the bus")

    def fail(self, what: str) -> int:
        for child in self.children.values():
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
        print(f"FAILED: {what}")
        for problem in self.problems:
            print(f"  - {problem}")
        for child in self.children.values():
            if child.stderr:
                print(f"  {child.name} stderr:")
                for line in child.stderr[-10:]:
                    print(f"    {line}")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo (or, with ``--role``, one of its processes)."""
    parser = argparse.ArgumentParser(
        prog="python -m fsbus.demo",
        description="Publishers, subscribers and a shared work queue as separate processes "
        "on one bus directory; checks that nothing is lost or handled twice.",
    )
    parser.add_argument("--root", help="bus directory (default: a fresh temporary one)")
    parser.add_argument("--events", type=int, default=60, help="events per publisher (60)")
    parser.add_argument("--jobs", type=int, default=30, help="jobs per publisher (30)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--role", choices=("publisher", "subscriber", "worker"), help=argparse.SUPPRESS
    )
    parser.add_argument("--pattern", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        return _child(args)
    temporary = args.root is None
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="fsbus-demo-"))
    try:
        return Demo(root, args.events, args.jobs).run()
    finally:
        if temporary and not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
