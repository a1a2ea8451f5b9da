"""A queue's bus in a process stays open a moment after its last consumer there leaves,
so that a consumer that comes back at once (an AMQP ``basic.get`` subscribes for each
message) does not start a new one; and is never used over a queue deleted since.

Which bus a consumer got is read from the process's table of its queues' buses
(``Bus._queue_buses``): the point of the linger is that it is the same object.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, QueueNotFound

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


@pytest.mark.anyio
async def test_receive_on_a_queue_deleted_elsewhere_says_so(root: Path, fast: BusConfig) -> None:
    """``receive()`` waiting on a queue that another process deletes raises QueueNotFound
    saying what happened and what to do, not a bare end of iteration; so does every
    later call."""
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        async with bus.messages(queue="q") as it:

            def elsewhere() -> None:
                with BlockingBus(root) as other:
                    other.delete_queue("q")

            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(anyio.to_thread.run_sync, elsewhere)
                    with pytest.raises(QueueNotFound, match=r"'q' was deleted.*declare it again"):
                        await it.receive(timeout=WAIT)
            with pytest.raises(QueueNotFound, match="'q' was deleted"):
                await it.receive(timeout=0)


def test_a_blocking_get_on_a_queue_deleted_elsewhere_says_so(root: Path, fast: BusConfig) -> None:
    """The blocking face the same: ``get(timeout)`` on a subscription whose queue another
    bus deletes raises QueueNotFound with the reason, within the watch's period."""
    with BlockingBus(root, config=fast) as bus, BlockingBus(root) as other:
        bus.declare_queue("q", ["t.#"])
        with bus.messages(queue="q") as it:
            deleted = threading.Event()

            def delete() -> None:
                other.delete_queue("q")
                deleted.set()

            threading.Thread(target=delete).start()
            with pytest.raises(QueueNotFound, match=r"'q' was deleted.*subscribe anew"):
                it.get(timeout=WAIT)
            assert deleted.is_set()


def test_a_queue_declared_again_is_another_queue_whatever_its_inodes(root: Path) -> None:
    """What says which queue a name is (QueueStore.identity, read by the consumers' watch
    and by the buses kept for publishing): a uid its definition keeps from its creation,
    with its bus folder's inode. On ext4 a folder made just after one was removed often
    gets the same inode: the uid still tells the queues apart. "gone" when there is no
    queue; None when it cannot be told (a failed read), which ends no consumer."""
    with BlockingBus(root) as bus:
        store = bus._engine()[1]._queues
        bus.declare_queue("q", ["t.#"])
        first = store.identity("q")
        assert isinstance(first, tuple)
        assert first[0]
        bus.declare_queue("q", ["t.#", "u.#"])  # the same queue, changed
        assert store.identity("q") == first
        bus.delete_queue("q")
        assert store.identity("q") == "gone"
        bus.declare_queue("q", ["t.#"])
        second = store.identity("q")
        assert isinstance(second, tuple)
        assert second[0] != first[0]
        bus_dir = root / "fsbus" / "queues" / "q" / "bus"
        bus_dir.rename(bus_dir.with_name("moved"))
        bus_dir.symlink_to(bus_dir)  # a stat of it fails with ELOOP: says nothing
        assert store.identity("q") is None


def test_a_definition_without_a_uid_is_read_as_before() -> None:
    """Definitions written before fsbus kept a uid still read (uid ""), and the uid is
    written and read back."""
    from fsbus._queues.definition import Definition

    old = Definition("q", bindings=("t.#",)).encode()
    assert b"uid" not in old
    assert Definition.decode(old, "q").uid == ""
    new = Definition("q", bindings=("t.#",), uid="abc").encode()
    assert Definition.decode(new, "q").uid == "abc"
    assert Definition.decode(new, "q") == Definition("q", bindings=("t.#",))
