"""Claims on a slow filesystem: what a round won reaches its handlers before the next round.

On a network filesystem each claim waits for the server (a lock taken from another
client's capabilities on CephFS takes a fifth of a second). A consumer with room for
hundreds used to claim them all before handing out the first, so a reader waiting a
couple of seconds for its first message gave up while the queue was full. Here the slow
server is an :class:`Ops` whose non-blocking exclusive lock takes 20 ms.
"""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

from fsbus import BlockingBus, BusConfig
from fsbus._bus.ops import Ops

N = 120
SLOW = 0.02


class SlowLocks(Ops):
    """Each attempt at a claim's lock waits like a round trip to a distant server."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.claims = 0

    def flock(self, fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_EX and operation & fcntl.LOCK_NB:
            time.sleep(SLOW)
            with self.lock:
                self.claims += 1
        super().flock(fd, operation)


def test_the_first_message_comes_after_one_round_not_after_every_claim(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    config = BusConfig(locking="flock", handler_concurrency=N)
    with BlockingBus(root, config=config) as publisher:
        for i in range(N):
            publisher.publish("jobs.x", str(i), single=True)
    ops = SlowLocks()
    with BlockingBus(root, config=config, ops=ops) as bus:
        with bus.messages("jobs.#", kind="single", prefetch=N, ack_previous=False) as it:
            first = it.get(timeout=30)
            claims_at_first = ops.claims
            got = [first, *(it.get(timeout=30) for _ in range(N - 1))]
            for m in got:
                it.ack(m)
    assert sorted(int(m.payload) for m in got) == list(range(N))  # each once
    # the old engine claimed all N (N x 20 ms) before the first reached the reader
    assert claims_at_first < N // 2, claims_at_first
    assert ops.claims >= N
