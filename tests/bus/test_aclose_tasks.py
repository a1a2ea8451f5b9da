"""Closing a Bus from a task other than the one that entered it.

The entering task hosts only the bus's runner task; everything else runs under the
runner, so ``aclose`` from any task (another task of the caller's task group, a handler,
two tasks at once, a task being cancelled) stops the bus cleanly. Each test checks what is
left on disk: a work-queue message a handler held is released, unlocked and complete,
and nothing is lost.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, ClosedError, Message, PublishInfo

from .conftest import WAIT, files_under, is_flocked, message_files

LOCKINGS = ["flock", "rename"]


def claims(root: Path) -> list[str]:
    """Messages claimed by rename (moved aside) right now."""
    return files_under(root / "fsbus" / "claims")


def waiting(root: Path, info: PublishInfo) -> bool:
    """The message is back in its bucket, whole, and nobody holds it."""
    path = root / "messages" / info.bucket / info.name
    return (
        path.exists()
        and path.stat().st_size == info.size + 1
        and not is_flocked(path)
        and claims(root) == []
    )


async def publish(bus: Bus, topic: str, payload: bytes) -> PublishInfo:
    return await bus.publish(topic, payload, single=True)


class Holder:
    """A handler that takes a message and holds it until it is cancelled."""

    def __init__(self) -> None:
        self.held: list[Message] = []
        self.cancelled: list[str] = []
        self._changed = anyio.Event()

    async def __call__(self, msg: Message) -> None:
        self.held.append(msg)
        self._changed.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(msg.name)
            raise

    async def wait_for(self, count: int) -> None:
        with anyio.fail_after(WAIT):
            while len(self.held) < count:
                self._changed = anyio.Event()
                await self._changed.wait()


@pytest.mark.anyio
@pytest.mark.parametrize("locking", LOCKINGS)
async def test_aclose_from_another_task_releases_what_handlers_hold(
    root: Path, locking: str
) -> None:
    holder = Holder()
    closed = anyio.Event()
    config = BusConfig(locking=locking)
    async with anyio.create_task_group() as tg:
        async with Bus(root, config=config) as bus:
            await bus.subscribe("jobs.*", holder)
            infos = [await publish(bus, "jobs.a", b"one"), await publish(bus, "jobs.b", b"two")]
            await holder.wait_for(2)

            async def closer() -> None:
                await bus.aclose()
                closed.set()

            tg.start_soon(closer)
            with anyio.fail_after(WAIT):
                await closed.wait()
            # aclose returned in the other task: the bus is closed, the handlers are
            # cancelled and their messages are back, before this block ends.
            assert sorted(holder.cancelled) == sorted(i.name for i in infos)
            assert all(waiting(root, i) for i in infos)
            with pytest.raises(ClosedError):
                await bus.publish("jobs.c", b"x")
        # leaving the block afterwards has nothing left to do, and raises nothing
    assert message_files(root) == sorted(f"{i.bucket}/{i.name}" for i in infos)
    assert bus.statistics().released == 2
    assert bus.statistics().failed == 0


@pytest.mark.anyio
async def test_aclose_from_a_handler_does_not_wait_for_itself(root: Path) -> None:
    holder = Holder()
    returned = anyio.Event()

    async def close_and_return(msg: Message) -> None:
        await bus.aclose()  # must not wait for this very handler to end
        returned.set()

    async with Bus(root) as bus:
        await bus.subscribe("jobs.hold", holder)
        await bus.subscribe("jobs.close", close_and_return)
        held = await publish(bus, "jobs.hold", b"held")
        await holder.wait_for(1)
        await publish(bus, "jobs.close", b"closer")
        with anyio.fail_after(WAIT):
            await returned.wait()
        with pytest.raises(ClosedError):
            await bus.publish("jobs.more", b"x")
    # The handler that closed the bus returned: its message is acknowledged. The one
    # still held was cancelled and released.
    assert holder.cancelled == [held.name]
    assert message_files(root) == [f"{held.bucket}/{held.name}"]
    assert waiting(root, held)
    assert bus.statistics().acked == 1
    assert bus.statistics().released == 1


@pytest.mark.anyio
async def test_a_handler_cancelled_after_closing_releases_its_message(root: Path) -> None:
    cancelled = anyio.Event()

    async def close_then_wait(msg: Message) -> None:
        await bus.aclose()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with Bus(root) as bus:
        await bus.subscribe("jobs.*", close_then_wait)
        info = await publish(bus, "jobs.a", b"a")
        with anyio.fail_after(WAIT):
            await cancelled.wait()
    assert message_files(root) == [f"{info.bucket}/{info.name}"]
    assert waiting(root, info)
    assert bus.statistics().failed == 0


@pytest.mark.anyio
async def test_a_task_started_by_a_handler_may_close_the_bus(root: Path) -> None:
    done = anyio.Event()

    async def handler(msg: Message) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus.aclose)  # below the handler: starts the close, no deadlock
            await anyio.sleep_forever()
        finally:
            done.set()  # cancelled with the other handlers

    async with Bus(root) as bus:
        await bus.subscribe("jobs.*", handler)
        info = await publish(bus, "jobs.a", b"a")
        with anyio.fail_after(WAIT):
            await done.wait()
    assert waiting(root, info)


@pytest.mark.anyio
async def test_two_tasks_closing_at_once_both_return_when_it_is_closed(root: Path) -> None:
    holder = Holder()
    returned: list[bool] = []
    async with Bus(root) as bus:
        await bus.subscribe("jobs.*", holder)
        info = await publish(bus, "jobs.a", b"a")
        await holder.wait_for(1)

        async def closer() -> None:
            await bus.aclose()
            returned.append(waiting(root, info))  # closed by the time either returns

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(closer)
                tg.start_soon(closer)
        assert returned == [True, True]
        with anyio.fail_after(WAIT):
            await bus.aclose()  # a third call: nothing left to do
    assert bus.statistics().released == 1
    assert message_files(root) == [f"{info.bucket}/{info.name}"]


@pytest.mark.anyio
async def test_a_cancelled_aclose_still_closes_the_bus(root: Path) -> None:
    holder = Holder()
    async with Bus(root) as bus:
        await bus.subscribe("jobs.*", holder)
        info = await publish(bus, "jobs.a", b"a")
        await holder.wait_for(1)

        async def cancelled_closer() -> None:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await bus.aclose()  # starts the close, then its wait is cancelled
            assert scope.cancelled_caught

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_closer)
        with pytest.raises(ClosedError):
            await bus.publish("jobs.b", b"b")
        with anyio.fail_after(WAIT):
            await bus.aclose()  # waits for the close that task started
        assert holder.cancelled == [info.name]
        assert waiting(root, info)


@pytest.mark.anyio
async def test_aclose_after_the_block_was_cancelled_is_a_no_op(root: Path) -> None:
    holder = Holder()
    with anyio.CancelScope() as scope:
        async with Bus(root) as bus:
            await bus.subscribe("jobs.*", holder)
            info = await publish(bus, "jobs.a", b"a")
            await holder.wait_for(1)
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert holder.cancelled == [info.name]
    assert waiting(root, info)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(WAIT):
            tg.start_soon(bus.aclose)
            await bus.aclose()
    assert waiting(root, info)


@pytest.mark.anyio
async def test_aclose_from_another_task_ends_the_iterator_of_the_entering_task(
    root: Path,
) -> None:
    closed = anyio.Event()

    async def closer() -> None:
        await bus.aclose()
        closed.set()

    async with anyio.create_task_group() as tg, Bus(root) as bus:
        info = await publish(bus, "jobs.a", b"a")
        async with bus.messages("jobs.*", existing=True) as it:
            msg = await it.receive(WAIT)  # held: neither acknowledged nor released
            assert msg.name == info.name
            tg.start_soon(closer)
            with anyio.fail_after(WAIT):
                await closed.wait()
            assert waiting(root, info)
            with pytest.raises(StopAsyncIteration):
                await it.__anext__()  # the iterator has ended; nothing is acknowledged
    assert waiting(root, info)


@pytest.mark.anyio
async def test_aclose_of_a_bus_never_entered(root: Path) -> None:
    bus = Bus(root)
    await bus.aclose()
    await bus.aclose()
    with pytest.raises(ClosedError):
        await bus.publish("a", b"x")


def test_blocking_close_from_other_threads_releases_the_held_message(root: Path) -> None:
    errors: list[BaseException] = []
    with BlockingBus(root) as bus:
        info = bus.publish("jobs.a", b"a", single=True)
        it = bus.messages("jobs.*")
        it.__enter__()
        msg = it.get(timeout=WAIT)  # held: neither acked nor released
        assert msg.name == info.name
        assert is_flocked(info.path)
        results: list[bool] = []
        probing = threading.Lock()  # one flock probe at a time: each would see the other

        def closer() -> None:
            try:
                bus.close()
                with probing:
                    results.append(waiting(root, info))  # both return once it is closed
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=closer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert results == [True, True]
        with pytest.raises(ClosedError):
            it.get(timeout=0)
        it.__exit__(None, None, None)
    assert message_files(root) == [f"{info.bucket}/{info.name}"]
