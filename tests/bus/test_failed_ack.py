"""An ack that fails on disk is not an ack: the message comes back, and is counted once.

A handler returned, so the bus acks its message: it truncates the file it holds locked and
unlinks it. When the filesystem refuses (here: ``ftruncate`` fails with EIO, through the
I/O seam), the message is still in its bucket, unlocked. The bus used to count it acked
(and a dead letter as dead-lettered) all the same; it now counts it released and delivers
it again after ``retry_interval``, without touching the descriptor it already closed.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message
from fsbus._bus.ops import Ops

from .conftest import WAIT, Inbox, message_files, wait_until


class FailingTruncate(Ops):
    """``ftruncate`` (the first step of an ack) fails with EIO ``left`` times."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.left = times
        self.failed = 0

    def ftruncate(self, fd: int, size: int) -> None:
        if self.left > 0:
            self.left -= 1
            self.failed += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().ftruncate(fd, size)


CONFIG = BusConfig(locking="flock", poll_interval=0.05, retry_interval=0.05)


@pytest.mark.anyio
async def test_a_failed_ack_redelivers_and_is_not_counted_acked(root: Path) -> None:
    ops = FailingTruncate(1)
    inbox = Inbox()
    async with Bus(root, config=CONFIG, ops=ops) as bus:
        await bus.subscribe("jobs.#", inbox, kind="single")
        await bus.publish("jobs.a", b"work", single=True)
        got = await inbox.wait_for(2)
        # the file goes first, the count follows once the ack is back on the loop
        await wait_until(lambda: not message_files(root) and bus.statistics().acked > 0)
        stats = bus.statistics()
    assert ops.failed == 1
    assert [m.payload for m in got] == [b"work", b"work"]  # the same message, again
    assert got[0].name == got[1].name
    # not a handler failure: without count_deliveries it is not counted as one
    assert got[1].delivery_count == got[0].delivery_count == 1
    assert stats.acked == 1
    assert stats.released == 1
    assert stats.delivered == 2


@pytest.mark.anyio
async def test_a_dead_letter_whose_ack_failed_is_counted_once_it_is_acked(root: Path) -> None:
    """max_deliveries=1: the first failure dead-letters the message. Its ack fails, so
    it comes back and is dead-lettered again (at least once); the count says one."""
    ops = FailingTruncate(1)
    config = CONFIG.model_copy(update={"max_deliveries": 1})
    calls: list[Message] = []

    async def failing(msg: Message) -> None:
        calls.append(msg)
        raise RuntimeError("cannot handle it")

    async def topics() -> list[str]:
        return [info.topic async for info in bus.browse("#")]

    async with Bus(root, config=config, ops=ops) as bus:
        await bus.subscribe("jobs.#", failing, kind="single")
        await bus.publish("jobs.b", b"poison", single=True)
        with anyio.fail_after(WAIT):
            # browsing is the only way to see them (no subscriber: no ack to race)
            while await topics() != ["dead-letter.jobs.b"] * 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        # the second ack's count follows its file's removal once it is back on the loop
        await wait_until(lambda: bus.statistics().acked > 0)
        stats = bus.statistics()
    assert ops.failed == 1
    assert len(calls) == 2
    assert calls[0].name == calls[1].name
    assert stats.dead_lettered == 1
    assert stats.acked == 1
    assert stats.released == 1
