"""A work-queue message another consumer acknowledged between our open and our lock.

A consumer opens a message, then takes its ``flock``. Meanwhile the consumer that held it
may acknowledge it: it unlinks the file and closes it, which frees the lock. Our lock then
succeeds on a file with no name left (``st_nlink == 0``): the message is gone, taken
once, by the other consumer. It used to be reported as a hard link planted from outside
the bus ("has 0 hard links: ... find who linked it there"), a false alarm that four busy
consumers of one queue raised now and then. The race is made here through the I/O seam:
the file is unlinked just before the lock is taken.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

import pytest

from fsbus import BlockingBus, BusConfig
from tests.tracked_ops import TrackedOps

N = 5


class AckedBeforeTheLock(TrackedOps):
    """Unlinks the first ``N`` messages opened for a claim just before their lock is
    taken, as a consumer that held them and acknowledged them would."""

    def __init__(self) -> None:
        super().__init__("/messages/")
        self.removed: list[str] = []

    def flock(self, fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_EX and operation & fcntl.LOCK_NB:
            with self.lock:
                path = self.path_of(fd)
                race = path is not None and len(self.removed) < N
                if race:
                    assert path is not None
                    self.removed.append(path)
            if race:
                os.unlink(path)  # the other consumer's ack
        super().flock(fd, operation)


def test_a_message_acked_while_we_took_its_lock_is_gone_not_foreign(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "bus"
    config = BusConfig(locking="flock")
    with BlockingBus(root, config=config) as publisher:
        for i in range(2 * N):
            publisher.publish("jobs.x", str(i), single=True)
    ops = AckedBeforeTheLock()
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root, config=config, ops=ops) as bus:
        with bus.messages("jobs.#", kind="single") as it:
            got = [it.get(timeout=30) for _ in range(N)]
            for m in got:
                it.ack(m)
    assert len(ops.removed) == N
    # The other N messages reached this consumer, each once; the N acked elsewhere did not.
    taken = {os.path.basename(p) for p in ops.removed}
    assert len({m.name for m in got}) == N
    assert not taken & {m.name for m in got}
    assert "hard links" not in caplog.text
    quarantine = root / "fsbus" / "quarantine"
    assert not quarantine.exists() or not any(quarantine.iterdir())
