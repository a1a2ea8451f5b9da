"""Child processes for the multi-process stream tests (run as a script, not collected).

    python stream_workers.py append ROOT NAME WORKER COUNT     appenders racing each other
    python stream_workers.py forever ROOT NAME                 append until killed, report offsets
    python stream_workers.py torn ROOT NAME                    die in the middle of a frame
    python stream_workers.py consume ROOT NAME GROUP ID TIMEOUT   a consumer-group member

Each prints one line per event on stdout (flushed), so the parent waits on events, never
on sleeps.
"""

from __future__ import annotations

import random
import sys
import threading

from fsbus import RecordIn, Stream, StreamConfig
from fsbus._stream_io import StreamOps

FAST = StreamConfig(durability="none", segment_bytes=64 << 10, index_interval_bytes=1024)


def say(*parts: object) -> None:
    print(*parts, flush=True)


def append(root: str, name: str, worker: str, count_arg: str) -> None:
    count = int(count_arg)
    rng = random.Random(worker)
    with Stream.open(root, name, config=FAST) as s:
        say("ready")
        sys.stdin.readline()  # start together
        i = 0
        while i < count:
            if rng.random() < 0.5:
                s.append(f"{worker}-{i}".encode())
                i += 1
            else:
                n = min(rng.randint(1, 50), count - i)
                recs: list[bytes | str | RecordIn] = [
                    RecordIn(f"{worker}-{j}", key=worker) for j in range(i, i + n)
                ]
                s.append_batch(recs)
                i += n
        say("done")


def forever(root: str, name: str) -> None:
    with Stream.open(root, name, config=FAST) as s:
        i = 0
        while True:
            r = s.append_batch([f"v{j}".encode() * 20 for j in range(i, i + 200)])
            i += 200
            say("ok", r.stop)


class _TornOps(StreamOps):
    """Writes half of the first big write, then reports and waits to be killed."""

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
        if len(data) > 1000:
            super().pwrite(fd, memoryview(data)[: len(data) // 2], pos)
            say("torn", pos, len(data) // 2)
            threading.Event().wait()
        super().pwrite(fd, data, pos)


def torn(root: str, name: str) -> None:
    s = Stream._open(root, name, config=FAST, create=True, ops=_TornOps())
    r = s.append_batch([b"committed"] * 10)
    say("committed", r.stop)
    s.append_batch([b"lost" * 100] * 10)


def consume(root: str, name: str, group: str, member: str, timeout: str) -> None:
    cfg = StreamConfig(durability="none", session_timeout=float(timeout), heartbeat_interval=0.1)
    with Stream.open(root, name, config=cfg) as s, s.group(group, consumer=member) as g:
        say("ready")
        while True:
            recs = g.poll(max_records=20, timeout=0.2)
            for r in recs:
                say("got", r.offset, r.value.decode())
            if recs:
                g.commit()
                say("committed", recs[-1].offset)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"append": append, "forever": forever, "torn": torn, "consume": consume}[cmd](*args)  # type: ignore[operator]
