"""A first delivery from a durable queue's bus reads no counter file. Only fsbus versions
with queues write there, and they count deliveries in each copy's leading byte (a
counter file only once the byte is full), so a byte of 0 means never delivered; on the
main bus it may mean counted in a file by an older fsbus or a qlobber-fsq peer, which is
looked for."""

from __future__ import annotations

from pathlib import Path

from fsbus import BlockingBus, BusConfig
from fsbus._bus.ops import Ops

from .conftest import WAIT

CONFIG = BusConfig(locking="flock")


class AttemptLookups(Ops):
    """Records every open and listing under an ``attempts`` directory."""

    def __init__(self) -> None:
        super().__init__()
        self.looked: list[str] = []

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        if "/attempts/" in path:
            self.looked.append(path)
        return super().open(path, flags, mode)

    def listdir(self, path: str) -> list[str]:
        if "/attempts/" in path:
            self.looked.append(path)
        return super().listdir(path)


def test_first_deliveries_from_a_queue_look_for_no_counter_file(root: Path) -> None:
    ops = AttemptLookups()
    with BlockingBus(root, config=CONFIG, ops=ops) as bus:
        bus.declare_queue("billing", ["orders.#"])
        for i in range(5):
            bus.publish("orders.paid", f"order {i}")
        with bus.messages(queue="billing") as it:
            got = [it.get(timeout=WAIT) for _ in range(5)]
            for msg in got:
                it.ack(msg)
        assert sorted(m.payload for m in got) == [b"order %d" % i for i in range(5)]
        assert {m.delivery_count for m in got} == {1}
        assert [p for p in ops.looked if "/fsbus/queues/" in p] == []
        # the main bus's work-queue message, byte 0 too, is still looked up
        bus.publish("jobs.resize", b"work", single=True)
        with bus.messages("jobs.#", kind="single") as it:
            job = it.get(timeout=WAIT)
            it.ack(job)
        assert job.delivery_count == 1
        assert [p for p in ops.looked if "/fsbus/queues/" not in p] != []


def test_a_queue_copy_given_back_is_counted_as_redelivered(root: Path) -> None:
    with BlockingBus(root, config=CONFIG) as bus:
        bus.declare_queue("billing", ["orders.#"])
        bus.publish("orders.paid", b"once")
        with bus.messages(queue="billing") as it:
            first = it.get(timeout=WAIT)
            it.release(first)
            again = it.get(timeout=WAIT)
            it.ack(again)
        assert (first.delivery_count, again.delivery_count) == (1, 2)
        assert again.name == first.name
