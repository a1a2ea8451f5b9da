"""Child processes that report JSON lines, and flock probes.

Shared by the interop and multi-process tests: a reader thread collects the lines and
tests wait on them with timeouts.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Event = dict[str, Any]

TIMEOUT = 60.0
"""Generous upper bound for any single wait; a healthy run needs a few seconds."""


def locked_files(root: Path) -> set[str]:
    """Every file under ``root`` on which some process holds a flock (probed, released)."""
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                out.add(path)
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
    return out


def singles_on_disk(root: Path) -> set[str]:
    """Names of the work-queue message files still in the buckets."""
    out: set[str] = set()
    for bucket in (root / "messages").iterdir():
        out.update(n for n in os.listdir(bucket) if "+s+" in n)
    return out


class JsonLinesPeer:
    """A process whose stdout is one JSON object per line (``{"event": ...}``).

    A reader thread appends every line to :attr:`events` and wakes waiters; stderr is
    kept for failure messages. Lines that are not JSON are kept as ``{"event": "raw"}``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.events: list[Event] = []
        self._stderr: list[bytes] = []
        self._cond = threading.Condition()
        self._eof = False
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "raw", "line": line}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw)

    # ------------------------------------------------------------------ reading
    def of(self, kind: str) -> list[Event]:
        """A snapshot of the events of one kind, in arrival order."""
        with self._cond:
            return [e for e in self.events if e.get("event") == kind]

    def count(self, kind: str) -> int:
        """How many events of one kind arrived so far."""
        return len(self.of(kind))

    def wait_for(
        self, check: Callable[[list[Event]], bool], *, what: str, timeout: float = TIMEOUT
    ) -> None:
        """Block until ``check(events)`` holds; fail with the peer's output otherwise."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._eof or check(self.events), timeout)
            if ok and check(self.events):
                return
            events = list(self.events)
        reason = "exited" if self._eof else f"did not get there within {timeout} s"
        raise AssertionError(
            f"{self.name} {reason} while waiting for {what}.\n{self.describe(events)}"
        )

    def wait_count(self, kind: str, n: int, *, timeout: float = TIMEOUT) -> list[Event]:
        """Block until at least ``n`` events of ``kind`` arrived; returns them."""
        self.wait_for(
            lambda evs: sum(e.get("event") == kind for e in evs) >= n,
            what=f"{n} {kind!r} event(s)",
            timeout=timeout,
        )
        return self.of(kind)

    def describe(self, events: list[Event] | None = None) -> str:
        """The tail of what the peer said, for failure messages."""
        events = self.events if events is None else events
        errors = [e for e in events if e.get("event") in ("error", "raw")]
        stderr = b"".join(self._stderr).decode("utf-8", "replace")[-3000:]
        kinds: dict[str, int] = {}
        for e in events:
            kinds[str(e.get("event"))] = kinds.get(str(e.get("event")), 0) + 1
        return (
            f"exit code: {self.proc.poll()}; events: {kinds}; errors: {errors[-5:]}\n"
            f"stderr tail:\n{stderr}"
        )

    # ------------------------------------------------------------------ control
    def send(self, line: str) -> None:
        """Write one line on the peer's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self, *, timeout: float = TIMEOUT) -> int:
        """Ask the peer to stop ("STOP" on stdin), wait for it to exit; its exit code."""
        if self.proc.poll() is None:
            try:
                self.send("STOP")
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        return self.wait_exit(timeout=timeout)

    def wait_exit(self, *, timeout: float = TIMEOUT) -> int:
        """Wait for the process to exit and its output to be read; its exit code."""
        code = self.proc.wait(timeout=timeout)
        self._finish(timeout)
        return code

    def kill(self) -> None:
        """SIGKILL the process if it still runs (cleanup)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        self._finish(TIMEOUT)

    def _finish(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout=timeout)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:
                    pass
