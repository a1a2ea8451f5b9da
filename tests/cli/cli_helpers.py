"""Run the ``fsbus`` CLI as real subprocesses (``python -m fsbus``) and read what it prints."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMEOUT = 60.0


@dataclass
class Result:
    """A finished CLI run."""

    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def error_line(self) -> str:
        """The single ``fsbus: error:`` line, checking there is nothing else (no traceback)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert "Traceback" not in self.stderr, self.stderr
        errors = [line for line in lines if line.startswith("fsbus: error:")]
        assert len(errors) == 1, self.stderr
        return errors[0]


def cli_env(root: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSBUS_")}
    env["PYTHONUNBUFFERED"] = "1"
    if root is not None:
        env["FSBUS_ROOT"] = str(root)
    env.update(extra or {})
    return env


def run_cli(
    *args: str,
    root: Path | None,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "fsbus", *args],
        input=input if input is not None else b"",
        capture_output=True,
        env=cli_env(root, env),
        timeout=timeout,
        check=False,
    )
    return Result(
        proc.returncode,
        proc.stdout.decode("utf-8"),
        proc.stderr.decode("utf-8", "replace"),
    )


@dataclass
class Running:
    """A CLI process still running, its stdout and stderr read line by line."""

    proc: subprocess.Popen[bytes]
    out: queue.Queue[str | None] = field(default_factory=queue.Queue)
    err_lines: list[str] = field(default_factory=list)
    err_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start_readers(self) -> None:
        def read_out() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                self.out.put(raw.decode("utf-8").rstrip("\n"))
            self.out.put(None)

        def read_err() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                self.err_lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.err_event.set()
            self.err_event.set()

        for target in (read_out, read_err):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def wait_stderr(self, text: str, timeout: float = TIMEOUT) -> None:
        """Block until a stderr line contains ``text`` (or fail)."""
        deadline = time.monotonic() + timeout
        while True:
            self.err_event.clear()
            if any(text in line for line in self.err_lines):
                return
            left = deadline - time.monotonic()
            if left <= 0 or not self.threads[1].is_alive():
                raise AssertionError(f"no {text!r} on stderr; got {self.err_lines}")
            self.err_event.wait(left)

    def lines(self, count: int, timeout: float = TIMEOUT) -> list[str]:
        """The next ``count`` stdout lines (fails if the process ends first or time runs out)."""
        got = []
        for _ in range(count):
            try:
                line = self.out.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"only {len(got)} of {count} lines in {timeout} s") from None
            if line is None:
                raise AssertionError(f"process ended after {len(got)} of {count} lines")
            got.append(line)
        return got

    def finish(self, timeout: float = TIMEOUT) -> tuple[int, list[str]]:
        """Wait for the exit; return the code and the stdout lines not read yet."""
        code = self.proc.wait(timeout=timeout)
        self.close_pipes(timeout)
        rest = []
        while True:
            line = self.out.get_nowait() if not self.out.empty() else None
            if line is None:
                break
            rest.append(line)
        return code, rest

    def close_pipes(self, timeout: float = TIMEOUT) -> None:
        """Join the reader threads and close the pipes (after the process ended)."""
        for t in self.threads:
            t.join(timeout)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)


def start_cli(
    *args: str,
    root: Path | None,
    env: dict[str, str] | None = None,
    out: queue.Queue[str | None] | None = None,
) -> Running:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsbus", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(root, env),
    )
    running = Running(proc) if out is None else Running(proc, out)
    running.start_readers()
    return running


def ok(result: Result) -> Result:
    """Assert exit status 0, showing stderr otherwise."""
    assert result.code == 0, f"exit {result.code}: {result.stderr}"
    return result


def names(records: Sequence[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in records]
