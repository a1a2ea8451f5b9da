"""Running the worker script and reading its event lines with timeouts."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from pathlib import Path

WORKERS = Path(__file__).with_name("stream_workers.py")


class Worker:
    """A child process whose stdout lines arrive on a queue."""

    def __init__(
        self, *args: object, sink: queue.Queue[tuple[int, str | None]] | None = None, tag: int = 0
    ) -> None:
        self.sink = sink
        self.tag = tag
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS), *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
            if self.sink is not None:
                self.sink.put((self.tag, line.rstrip("\n")))
        self.lines.put(None)
        if self.sink is not None:
            self.sink.put((self.tag, None))

    def expect(self, prefix: str, timeout: float = 30.0) -> list[str]:
        """Wait for the next line starting with ``prefix``; return its words."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line within {timeout}s") from None
            if line is None:
                raise AssertionError(f"worker exited ({self.proc.wait()}) before {prefix!r}")
            if line.startswith(prefix):
                return line.split()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self._reader.join(timeout=30)
