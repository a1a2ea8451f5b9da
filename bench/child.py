"""The child-process side of the harness: ``python -m bench.child SYSTEM ROLE PARAMS_JSON``.

Every multi-process scenario runs each publisher, subscriber, worker or responder in its own
process. They talk to the harness with lines on stdout:

``READY``           the process is subscribed / connected and can be sent messages;
``COUNT <n>``       messages received so far (work queues: the harness sums them);
``RESULT <json>``   the final figures; the process exits after it.

and take ``STOP`` on stdin (work queue drained, or the harness gave up waiting).
Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, shared by every process on the machine
(Node's ``process.hrtime.bigint()`` reads the same clock), so a publisher's start and a
subscriber's last receipt can be compared.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from typing import Any

ID_WIDTH = 8
TS_WIDTH = 20


def make_payload(index: int, size: int) -> bytes:
    """A payload of ``size`` bytes that starts with the message's index."""
    head = b"%0*d" % (ID_WIDTH, index)
    return head + b"x" * max(0, size - len(head))


def make_ping(index: int, size: int) -> bytes:
    """A latency probe: index, then the send time in ns, padded to ``size``."""
    head = b"%0*d%0*d" % (ID_WIDTH, index, TS_WIDTH, time.monotonic_ns())
    return head + b"x" * max(0, size - len(head))


def ping_sent_at(payload: bytes) -> int:
    """The send time stamped by :func:`make_ping`."""
    return int(payload[ID_WIDTH : ID_WIDTH + TS_WIDTH])


def emit(line: str) -> None:
    """Write one protocol line to the harness."""
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_OUT_LOCK = threading.Lock()


def ready() -> None:
    emit("READY")


def result(**figures: Any) -> None:
    emit("RESULT " + json.dumps(figures, separators=(",", ":")))


class Tally:
    """Counts what a consumer received: indices (to find losses and duplicates) and times."""

    def __init__(self, expect: int | None) -> None:
        self.expect = expect
        self.ids: list[int] = []
        self.first_ns = 0
        self.last_ns = 0
        self.done = threading.Event()
        self.stop = threading.Event()
        self._reported = -1
        threading.Thread(target=self._read_stdin, daemon=True).start()
        threading.Thread(target=self._report, daemon=True).start()

    def hit(self, payload: bytes) -> None:
        now = time.monotonic_ns()
        if not self.ids:
            self.first_ns = now
        self.last_ns = now
        self.ids.append(int(payload[:ID_WIDTH]))
        if self.expect is not None and len(self.ids) >= self.expect:
            self.done.set()

    @property
    def finished(self) -> bool:
        return self.done.is_set() or self.stop.is_set()

    def wait(self) -> None:
        while not self.finished:
            self.done.wait(0.01)

    def send_result(self) -> None:
        result(ids=self.ids, first_ns=self.first_ns, last_ns=self.last_ns)

    def _read_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip() == "STOP":
                break
        self.stop.set()
        self.done.set()

    def _report(self) -> None:
        while not self.finished:
            n = len(self.ids)
            if n != self._reported:
                self._reported = n
                emit(f"COUNT {n}")
            time.sleep(0.02)


def main(argv: list[str]) -> None:
    system, role, params = argv[0], argv[1], json.loads(argv[2])
    module = importlib.import_module(f"bench.systems.{system}")
    module.ROLES[role](params)


if __name__ == "__main__":
    main(sys.argv[1:])
