"""``publish_many`` keeps the order a consumer relies on, durable or not, on both faces.

A consumer lists the buckets whose stamps changed and takes what it finds in publish
order, holding back what was published after its listing began
(:func:`fsbus._bus.scan.split_fresh`). That keeps a publisher's order only if each
message was placed *and stamped* before the next one was named: then a message named
before the listing began had every earlier one stamped before it, where the listing (or
an earlier one) saw it.

Two batches broke that: a durable ``publish_many`` through the durable log held every
stamp until its record was synced (a consumer woken by another publisher's stamp took a
later message of the batch before an earlier one), and the async ``publish_many`` named
every message before the first went out. Here an :class:`~fsbus._bus.ops.Ops` seam
records, with the time, each rename into a bus's buckets and each stamp of its
``UPDATE``, and the test checks the rule itself for every two messages in a row: the
earlier one's bus stamped between the two renames, and the later one named (its name
carries the millisecond) no earlier than that stamp.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, BusConfig
from fsbus._bus.scan import name_published_ms
from tests.tracked_ops import TrackedOps

N = 300
"""Messages of the batch: enough to span many milliseconds."""
ON = BusConfig(durable_log="on")


class Recorder(TrackedOps):
    """Records renames into a bus's ``messages/`` and writes into its ``update/UPDATE``,
    each with the bus (the folder holding ``messages`` or ``update``) and the
    millisecond just before the call."""

    def __init__(self) -> None:
        super().__init__("/update/UPDATE")
        self.events: list[tuple[str, str, str, int]] = []  # (kind, bus, name, ms)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        ms = int(time.time() * 1000)
        n = super().pwrite(fd, data, offset)
        with self.lock:
            path = self.path_of(fd)
            if path is not None:
                self.events.append(("stamp", path[: -len("/update/UPDATE")], "", ms))
        return n

    def rename(self, src: str, dst: str) -> None:
        ms = int(time.time() * 1000)
        super().rename(src, dst)
        bucket = os.path.dirname(dst)
        if os.path.basename(os.path.dirname(bucket)) == "messages":
            with self.lock:
                self.events.append(
                    ("place", os.path.dirname(os.path.dirname(bucket)), os.path.basename(dst), ms)
                )

    def clear(self) -> None:
        with self.lock:
            self.events.clear()


def assert_each_stamped_before_the_next_is_named(
    events: list[tuple[str, str, str, int]], bus: str, count: int
) -> None:
    """For the messages placed into ``bus`` (``count`` of them), in the order placed:
    between two renames, a stamp of ``bus``; the later message's name no older than
    that stamp."""
    placed = [i for i, e in enumerate(events) if e[0] == "place" and e[1] == bus]
    assert len(placed) == count, [e for e in events if e[1] == bus][:5]
    for a, b in itertools.pairwise(placed):
        stamps = [
            events[i] for i in range(a + 1, b) if events[i][0] == "stamp" and events[i][1] == bus
        ]
        assert stamps, f"{events[a][2]} was not stamped before {events[b][2]} was placed"
        named = name_published_ms(events[b][2])
        assert named is not None
        assert named >= stamps[0][3], (
            f"{events[b][2]} was named at {named}, before {events[a][2]} was stamped "
            f"(at {stamps[0][3]} or later)"
        )


def _buses(root: Path, queue: bool) -> list[str]:
    out = [str(root)]
    if queue:
        out.append(str(root / "fsbus" / "queues" / "q" / "bus"))
    return out


def _setup(root: Path, queue: bool) -> None:
    with BlockingBus(root, config=ON) as bus:
        if queue:
            bus.declare_queue("q", ["t.#"])


@pytest.mark.parametrize("queue", [False, True], ids=["bus", "queue"])
@pytest.mark.parametrize("durable", [False, True], ids=["plain", "durable"])
def test_blocking_publish_many_stamps_each_message_before_naming_the_next(
    root: Path, durable: bool, queue: bool
) -> None:
    _setup(root, queue)
    ops = Recorder()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        bus.publish("t.x", b"first", single=True, durable=durable)  # makes the log, opens q
        ops.clear()
        infos = bus.publish_many([("t.x", str(i)) for i in range(N)], single=True, durable=durable)
        events = list(ops.events)
        assert [os.path.basename(i.path) for i in infos] == [
            e[2] for e in events if e[0] == "place" and e[1] == str(root)
        ]
        for b in _buses(root, queue):
            assert_each_stamped_before_the_next_is_named(events, b, N)


@pytest.mark.anyio
@pytest.mark.parametrize("queue", [False, True], ids=["bus", "queue"])
@pytest.mark.parametrize("durable", [False, True], ids=["plain", "durable"])
async def test_async_publish_many_stamps_each_message_before_naming_the_next(
    root: Path, durable: bool, queue: bool
) -> None:
    _setup(root, queue)
    ops = Recorder()
    async with Bus(root, ops=ops, config=ON) as bus:
        await bus.publish("t.x", b"first", single=True, durable=durable)
        ops.clear()
        infos = await bus.publish_many(
            [("t.x", str(i)) for i in range(N)], single=True, durable=durable
        )
        events = list(ops.events)
        assert [os.path.basename(i.path) for i in infos] == [
            e[2] for e in events if e[0] == "place" and e[1] == str(root)
        ]
        for b in _buses(root, queue):
            assert_each_stamped_before_the_next_is_named(events, b, N)
