"""A queue's bus in a process stays open a moment after its last consumer there leaves,
so that a consumer that comes back at once (an AMQP ``basic.get`` subscribes for each
message) does not start a new one; and is never used over a queue deleted since.

Which bus a consumer got is read from the process's table of its queues' buses
(``Bus._queue_buses``): the point of the linger is that it is the same object.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig

from .conftest import WAIT, Inbox, wait_until


def hosted(bus: Bus, queue: str) -> Bus | None:
    entry = bus._queue_buses.get(queue)
    return None if entry is None else entry.bus


async def consume_one(bus: Bus, queue: str) -> bytes:
    """Subscribe, take one message, leave: what a basic.get does."""
    async with bus.messages(queue=queue) as it:
        msg = await it.__anext__()
        await it.ack(msg)
        return msg.payload


@pytest.mark.anyio
async def test_a_consumer_that_comes_back_at_once_reuses_the_queues_bus(
    root: Path, fast: BusConfig
) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(3):
            await bus.publish("t.x", b"%d" % i)
        assert await consume_one(bus, "q") == b"0"
        first = hosted(bus, "q")
        assert first is not None  # left open after its consumer left
        assert await consume_one(bus, "q") == b"1"
        assert hosted(bus, "q") is first
        # and closed once it has had no consumer for a while
        await wait_until(lambda: hosted(bus, "q") is None)
        assert await consume_one(bus, "q") == b"2"
        assert hosted(bus, "q") is not first


@pytest.mark.anyio
async def test_deleting_the_queue_closes_its_idle_bus_at_once(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        await bus.publish("t.x", b"old")
        assert await consume_one(bus, "q") == b"old"
        old = hosted(bus, "q")
        await bus.delete_queue("q")
        assert hosted(bus, "q") is None
        await bus.declare_queue("q", ["t.#"])
        await bus.publish("t.x", b"new")
        assert await consume_one(bus, "q") == b"new"
        assert hosted(bus, "q") is not old


@pytest.mark.anyio
async def test_a_queue_deleted_and_declared_again_elsewhere_gets_a_new_bus(
    root: Path, fast: BusConfig
) -> None:
    """Another process deletes the queue and declares it again while this one's bus of
    it lingers: the next consumer here must read the new queue, not the old directory."""
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        await bus.publish("t.x", b"old")
        assert await consume_one(bus, "q") == b"old"
        old = hosted(bus, "q")
        assert old is not None

        def elsewhere() -> None:
            with BlockingBus(root) as other:
                other.delete_queue("q")
                other.declare_queue("q", ["t.#"])
                other.publish("t.x", b"new")

        await anyio.to_thread.run_sync(elsewhere)
        inbox = Inbox()
        sub = await bus.subscribe(None, inbox, queue="q")
        assert hosted(bus, "q") is not old
        await inbox.wait_for(1)
        await bus.unsubscribe(sub)
    assert inbox.payloads == [b"new"]


@pytest.mark.anyio
async def test_an_auto_deleted_queue_does_not_keep_its_bus(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"], auto_delete=True)
        await bus.publish("t.x", b"only")
        assert await consume_one(bus, "q") == b"only"
        assert hosted(bus, "q") is None  # closed as its consumer left, not a moment later
        assert [i.name for i in await bus.queues()] == []


@pytest.mark.anyio
@pytest.mark.parametrize("declared_again", [False, True])
async def test_consumers_of_a_queue_deleted_elsewhere_end(
    root: Path, fast: BusConfig, declared_again: bool
) -> None:
    """A queue deleted by another process (here another bus, in a thread), perhaps
    declared again, ends the consumers this bus had of it, as RabbitMQ cancels the
    consumers of a deleted queue: a handler's subscription closes and says why
    (``queue_gone``, ``on_queue_gone`` called once), an iterator's ``async for`` ends.
    They never take what the new queue holds; a new subscription does."""
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        inbox = Inbox()
        sub = await bus.subscribe(None, inbox, queue="q")
        told: list[str] = []

        async def hook() -> None:
            told.append("gone")

        sub.on_queue_gone = hook
        iterated: list[bytes] = []
        iterator_ended = anyio.Event()

        async def iterate() -> None:
            async with bus.messages(queue="q") as it:
                async for msg in it:
                    iterated.append(msg.payload)
                    await it.ack(msg)
            iterator_ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate)
            with anyio.fail_after(WAIT):  # both consumers attached (a count: polled)
                while (await bus.queue_info("q")).consumers < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            await bus.publish("t.x", b"old")
            await wait_until(lambda: len(inbox.messages) + len(iterated) == 1)

            def elsewhere() -> None:
                with BlockingBus(root) as other:
                    other.delete_queue("q")
                    if declared_again:
                        other.declare_queue("q", ["t.#"])
                        other.publish("t.x", b"new")

            await anyio.to_thread.run_sync(elsewhere)
            with anyio.fail_after(WAIT):
                await iterator_ended.wait()
            await wait_until(lambda: sub.closed)
            assert sub.queue_gone
            await wait_until(lambda: told == ["gone"])
        assert sorted(inbox.payloads + iterated) == [b"old"]
        if declared_again:
            info = await bus.queue_info("q")
            assert (info.depth, info.consumers) == (1, 0)
            again = Inbox()
            await bus.subscribe(None, again, queue="q")
            assert [m.payload for m in await again.wait_for(1)] == [b"new"]
        else:
            assert [q.name for q in await bus.queues()] == []


def test_only_a_missing_directory_says_a_queue_was_deleted(tmp_path: Path) -> None:
    """What the consumers' watch reads from a stat of a queue's bus directory: its inode,
    "gone" (not there: the queue was deleted), or None for any other failure (a network
    mount's passing error), which ends no consumer."""
    from fsbus._bus.engine import _inode_or_gone

    there = tmp_path / "bus"
    there.mkdir()
    assert _inode_or_gone(str(there)) == there.stat().st_ino
    assert _inode_or_gone(str(tmp_path / "deleted")) == "gone"
    (tmp_path / "file").write_bytes(b"")
    assert _inode_or_gone(str(tmp_path / "file" / "bus")) == "gone"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert _inode_or_gone(str(tmp_path / "loop")) is None  # ELOOP: says nothing
