"""The harness side of the child protocol (see :mod:`bench.child`): start, wait, count."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


STALL_SECONDS = 15.0
"""A flow whose consumers received nothing for this long after the publisher finished is
stopped (the missing messages are counted as lost) instead of waiting for the timeout."""


class ChildFailed(RuntimeError):
    """A child process died, said something unexpected or did not finish in time."""


def python_cmd(system: str, role: str, params: dict[str, Any]) -> list[str]:
    """The command line of a Python child of ``bench.systems.<system>``."""
    return [sys.executable, "-m", "bench.child", system, role, json.dumps(params)]


class Child:
    """One child process and a thread turning its stdout into a queue of lines."""

    def __init__(self, cmd: Sequence[str], *, cwd: Path = REPO) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Whether glibc hands a freed large buffer back to the kernel depends on the heap's
        # layout, so a payload-heavy child (10 KB records, a 10 MB batch at a time) ran in
        # one of two modes, one of them page-faulting every batch anew. Every child gets
        # the same fixed thresholds instead (see "Method" in bench/README.md).
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(256 << 20))
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
        self.cmd = list(cmd)
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.count = 0
        self.result: dict[str, Any] | None = None
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-40]

    def _fail(self, why: str) -> ChildFailed:
        tail = "".join(self._stderr[-15:]).strip()
        name = " ".join(self.cmd[3:5]) if "bench.child" in self.cmd else " ".join(self.cmd[:3])
        return ChildFailed(f"{name}: {why}" + (f"\n{tail}" if tail else ""))

    def poll(self, timeout: float) -> str | None:
        """Handle one line (or none within ``timeout``); return it."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self.lines.put(None)
            if self.result is None:
                self.proc.wait()
                raise self._fail(f"exited ({self.proc.returncode}) before its result")
            return None
        if line.startswith("COUNT "):
            self.count = int(line[6:])
        elif line.startswith("RESULT "):
            self.result = json.loads(line[7:])
            self.count = len(self.result.get("ids", ())) or self.count
        return line

    def wait_line(self, word: str, deadline: float) -> None:
        """Wait until the child says ``word`` (``READY``) or the deadline passes."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no {word} in time")
            line = self.poll(min(left, 0.5))
            if line == word:
                return

    def wait_result(self, deadline: float) -> dict[str, Any]:
        while self.result is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail("no result in time")
            self.poll(min(left, 0.5))
        return self.result

    def stop(self) -> None:
        """Ask a consumer to finish (``STOP`` on stdin)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("STOP\n")
            self.proc.stdin.flush()
            self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def close(self) -> None:
        """Make sure the process is gone."""
        if self.proc.poll() is None:
            self.stop()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass(frozen=True)
class Flow:
    """What one multi-process measurement found."""

    seconds: float
    """From the publisher's first publish to the last receipt by any consumer."""
    received: int
    """Messages received, summed over the consumers."""
    missing: int
    """Messages some consumer that should have had them never got."""
    duplicates: int
    """Extra receipts of a message by one consumer (fan-out) or by all (work queue)."""
    publish_seconds: float
    """How long the publisher itself took."""


def run_flow(
    publisher: Sequence[str],
    consumers: Sequence[Sequence[str]],
    *,
    count: int,
    shared: bool,
    timeout: float,
) -> Flow:
    """Start the consumers, wait until they are READY, publish, and count every message.

    ``shared``: a work queue (each message to one consumer; the harness stops the workers
    when the sum reaches ``count``); otherwise a fan-out (each consumer stops by itself after
    ``count`` messages).
    """
    children = [Child(c) for c in consumers]
    pub: Child | None = None
    last_total, last_change = -1, time.monotonic()
    try:
        deadline = time.monotonic() + 60
        for c in children:
            c.wait_line("READY", deadline)
        pub = Child(publisher)
        deadline = time.monotonic() + timeout
        stopped = False
        while True:
            if pub.result is None:
                pub.poll(0)
            for c in children:
                while c.result is None and c.poll(0) is not None:
                    pass
            if shared and not stopped and sum(c.count for c in children) >= count:
                for c in children:
                    c.stop()
                stopped = True
            if pub.result is not None and all(c.result is not None for c in children):
                break
            total = sum(c.count for c in children)
            if total != last_total:
                last_total, last_change = total, time.monotonic()
            stalled = (
                pub.result is not None
                and not stopped
                and time.monotonic() - last_change > STALL_SECONDS
            )
            if time.monotonic() > deadline or stalled:
                if stopped:
                    raise ChildFailed("consumers did not report after STOP")
                for c in children:
                    c.stop()
                stopped = True
                deadline = time.monotonic() + 15
            time.sleep(0.005)
        presult = pub.wait_result(deadline)
        return _tally(presult, [c.result or {} for c in children], count=count, shared=shared)
    finally:
        for c in [*children, *([pub] if pub else [])]:
            c.close()


def _tally(pub: dict[str, Any], results: list[dict[str, Any]], *, count: int, shared: bool) -> Flow:
    t0 = int(pub["t0_ns"])
    lasts = [int(r["last_ns"]) for r in results if r.get("ids")]
    end = max(lasts) if lasts else int(pub["t1_ns"])
    received = sum(len(r.get("ids", ())) for r in results)
    if shared:
        seen = Counter(i for r in results for i in r.get("ids", ()))
        missing = count - len(seen)
        dups = sum(v - 1 for v in seen.values())
    else:
        missing = dups = 0
        for r in results:
            per = Counter(r.get("ids", ()))
            missing += count - len(per)
            dups += sum(v - 1 for v in per.values())
    return Flow(
        seconds=(end - t0) / 1e9,
        received=received,
        missing=missing,
        duplicates=dups,
        publish_seconds=(int(pub["t1_ns"]) - t0) / 1e9,
    )


def run_single(cmd: Sequence[str], *, timeout: float) -> dict[str, Any]:
    """Run one child to its RESULT."""
    child = Child(cmd)
    try:
        return child.wait_result(time.monotonic() + timeout)
    finally:
        child.close()


def run_pair(server: Sequence[str], client: Sequence[str], *, timeout: float) -> dict[str, Any]:
    """Start ``server`` (the echo side), wait until READY, then run ``client`` to its RESULT."""
    srv = Child(server)
    try:
        srv.wait_line("READY", time.monotonic() + 60)
        return run_single(client, timeout=timeout)
    finally:
        srv.close()
