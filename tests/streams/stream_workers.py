"""Child processes for the multi-process stream tests (run as a script, not collected).

    python stream_workers.py append ROOT NAME WORKER COUNT     appenders racing each other
    python stream_workers.py forever ROOT NAME                 append until killed, report offsets
    python stream_workers.py torn ROOT NAME [HOW]              die in the middle of a frame
    python stream_workers.py consume ROOT NAME GROUP ID TIMEOUT   a consumer-group member

Each prints one line per event on stdout (flushed), so the parent waits on events, never
on sleeps.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Sequence

from fsbus import RecordIn, Stream, StreamConfig
from fsbus._stream.ops import StreamOps

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
    """Writes half of the first write of more than ``limit`` bytes (one buffer or many),
    then reports and waits to be killed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
        if len(data) > self.limit:
            super().pwrite(fd, memoryview(data)[: len(data) // 2], pos)
            say("torn", pos, len(data) // 2)
            threading.Event().wait()
        super().pwrite(fd, data, pos)

    def pwritev(self, fd: int, parts: Sequence[bytes | bytearray | memoryview], pos: int) -> None:
        size = sum(map(len, parts))
        if size > self.limit:
            super().pwrite(fd, b"".join(parts)[: size // 2], pos)
            say("torn", pos, size // 2)
            threading.Event().wait()
        super().pwritev(fd, parts, pos)


BIG = StreamConfig(durability="none", segment_bytes=4 << 20, index_interval_bytes=16 << 10)


def big_values(tag: str, n: int) -> list[bytes]:
    """``n`` distinct values of about 10 KB."""
    return [f"{tag}{i:06d}".encode() * (10_240 // (len(tag) + 6)) for i in range(n)]


def torn(root: str, name: str, how: str = "small") -> None:
    """Commit a batch, then die halfway through writing the next one.

    ``how``: ``small`` (short records), ``batch`` (10 KB records through append_batch)
    or ``values`` (10 KB records through append_values, a vectored write).
    """
    if how == "small":
        s = Stream._open(root, name, config=FAST, create=True, ops=_TornOps(1000))
        r = s.append_batch([b"committed"] * 10)
        say("committed", r.stop)
        s.append_batch([b"lost" * 100] * 10)
        return
    s = Stream._open(root, name, config=BIG, create=True, ops=_TornOps(200_000))
    r = s.append_batch(big_values("committed", 15))  # one frame, under the limit
    say("committed", r.stop)
    lost = big_values("lost", 30)  # one frame of 300 KB, over it
    if how == "batch":
        s.append_batch(lost)
    else:
        s.append_values(b"".join(lost), [len(v) for v in lost])


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
