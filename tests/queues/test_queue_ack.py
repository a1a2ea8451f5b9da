"""How an ack removes a queue's copy. No qlobber-fsq peer reads a queue's bus, and fsbus's
own claim checks the link count under the lock, so on a local filesystem the copy is only
unlinked; a work-queue message of the main bus is truncated first, as qlobber-fsq peers
expect. A copy acked (unlinked, not truncated) by one consumer while another was taking
its lock reaches that other consumer not at all."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fsbus import BlockingBus, BusConfig
from fsbus._bus.ops import Ops
from tests.bus.test_claim_race import AckedBeforeTheLock, N

from .conftest import WAIT

CONFIG = BusConfig(locking="flock")


class Truncations(Ops):
    """Records the path of every file truncated."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: dict[int, str] = {}
        self.truncated: list[str] = []

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def ftruncate(self, fd: int, length: int) -> None:
        self.truncated.append(self.paths.get(fd, "?"))
        super().ftruncate(fd, length)


def _queue_files(root: Path, queue: str) -> list[Path]:
    messages = root / "fsbus" / "queues" / queue / "bus" / "messages"
    return [p for p in messages.rglob("*") if p.is_file()]


def test_a_queue_copy_is_unlinked_and_a_work_queue_message_truncated(root: Path) -> None:
    ops = Truncations()
    with BlockingBus(root, config=CONFIG, ops=ops) as bus:
        assert bus._fs.platform.family == "local"  # (the test's directory)
        bus.declare_queue("billing", ["orders.#"])
        for i in range(3):
            bus.publish("orders.paid", f"order {i}")
        bus.publish("jobs.resize", b"work", single=True)
        with bus.messages(queue="billing") as it:
            for _ in range(3):
                it.ack(it.get(timeout=WAIT))
        with bus.messages("jobs.#", kind="single") as it:
            job = it.get(timeout=WAIT)
            assert job.payload == b"work"
            it.ack(job)
        assert bus.queue_info("billing").depth == 0
    assert _queue_files(root, "billing") == []
    assert len(ops.truncated) == 1
    assert "/fsbus/queues/" not in ops.truncated[0]
    assert os.path.basename(ops.truncated[0]) == job.name


def test_a_queue_copy_acked_while_another_took_its_lock_is_not_delivered_again(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingBus(root, config=CONFIG) as publisher:
        publisher.declare_queue("billing", ["orders.#"])
        for i in range(2 * N):
            publisher.publish("orders.paid", f"order {i}")
    ops = AckedBeforeTheLock()  # another consumer's ack (an unlink) before each lock
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root, config=CONFIG, ops=ops) as bus:
        with bus.messages(queue="billing") as it:
            got = [it.get(timeout=WAIT) for _ in range(N)]
            for m in got:
                it.ack(m)
        assert bus.queue_info("billing").depth == 0
    assert len(ops.removed) == N
    taken = {os.path.basename(p) for p in ops.removed}
    assert len({m.name for m in got}) == N
    assert not taken & {m.name for m in got}
    assert "hard links" not in caplog.text
