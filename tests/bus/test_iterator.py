"""The iterator face, ``bus.messages``: ack, release, auto-ack on next, leaving releases."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig

from .conftest import WAIT, is_flocked, message_files, wait_until


@pytest.mark.anyio
async def test_multi_messages_arrive_in_async_for(root: Path) -> None:
    got: list[bytes] = []
    async with Bus(root) as bus, bus.messages("feed.*") as it:
        for i in range(3):
            await bus.publish("feed.x", str(i))
        with anyio.fail_after(WAIT):
            async for msg in it:
                got.append(msg.payload)
                if len(got) == 3:
                    break
    assert sorted(got) == [b"0", b"1", b"2"]


@pytest.mark.anyio
async def test_ack_consumes_a_single(root: Path) -> None:
    async with Bus(root) as bus, bus.messages("jobs") as it:
        info = await bus.publish("jobs", b"j", single=True)
        msg = await it.receive(timeout=WAIT)
        assert msg.single
        assert is_flocked(info.path)  # held while the consumer decides
        await it.ack(msg)
        # the file goes in the ack's worker thread; the counter when the handler task resumes
        await wait_until(lambda: message_files(root) == [] and bus.statistics().acked == 1)


@pytest.mark.anyio
async def test_release_gives_it_back_and_counts_a_failed_delivery(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05)
    async with Bus(root, config=cfg) as bus, bus.messages("jobs") as it:
        info = await bus.publish("jobs", b"j", single=True)
        first = await it.receive(timeout=WAIT)
        await it.release(first)
        again = await it.receive(timeout=WAIT)
        assert again.name == first.name == info.name
        assert (first.delivery_count, again.delivery_count) == (1, 2)
        await it.ack(again)
        await wait_until(lambda: bus.statistics().acked == 1)
        stats = bus.statistics()
    assert stats.released == 1
    assert stats.acked == 1


@pytest.mark.anyio
async def test_asking_for_the_next_message_acks_the_previous_single(root: Path) -> None:
    async with Bus(root) as bus, bus.messages("q") as it:
        a = await bus.publish("q", b"a", single=True)
        first = await it.receive(timeout=WAIT)
        assert first.name == a.name
        await bus.publish("q", b"b", single=True)
        second = await it.receive(timeout=WAIT)
        assert second.payload == b"b"
        await wait_until(lambda: not Path(a.path).exists())
        await it.ack(second)
        await wait_until(lambda: message_files(root) == [])


@pytest.mark.anyio
async def test_leaving_the_block_releases_what_was_not_acked(root: Path) -> None:
    async with Bus(root) as bus:
        infos = [await bus.publish("w", str(i), single=True) for i in range(3)]
        async with bus.messages("w") as it:
            held = await it.receive(timeout=WAIT)
            # The others are buffered (claimed) or still on disk; none is acked.
        await wait_until(lambda: not any(is_flocked(i.path) for i in infos))
        stats = bus.statistics()
        assert stats.acked == 0
        assert stats.failed == 0
        assert len(message_files(root)) == 3
        assert not list((root / "fsbus" / "attempts").rglob("*@*"))
        # A new consumer gets all three, each as a first delivery.
        async with bus.messages("w") as it:
            again = [await it.receive(timeout=WAIT) for _ in range(3)]
            for m in again:
                await it.ack(m)
        await wait_until(lambda: message_files(root) == [])
    assert held.name in {m.name for m in again}
    assert all(m.delivery_count == 1 for m in again)


@pytest.mark.anyio
async def test_receive_times_out(root: Path) -> None:
    async with Bus(root) as bus, bus.messages("nothing.here") as it:
        with pytest.raises(TimeoutError):
            await it.receive(timeout=0.2)


@pytest.mark.anyio
async def test_iterator_existing(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.publish("old", b"1")
        async with bus.messages("old", existing=True) as it:
            msg = await it.receive(timeout=WAIT)
    assert msg.payload == b"1"


@pytest.mark.anyio
async def test_ack_of_a_multi_is_harmless(root: Path) -> None:
    async with Bus(root) as bus, bus.messages("m") as it:
        await bus.publish("m", b"x")
        msg = await it.receive(timeout=WAIT)
        await it.ack(msg)
        await it.release(msg)
    assert len(message_files(root)) == 1


@pytest.mark.anyio
async def test_closing_the_bus_ends_a_waiting_consumer(root: Path) -> None:
    # Regression: a consumer task waiting on an iterator kept waiting after aclose.
    got: list[str] = []
    ready = anyio.Event()

    async def consume(bus: Bus) -> None:
        async with bus.messages("never") as it:
            ready.set()
            async for msg in it:
                got.append(msg.topic)  # pragma: no cover - nothing is published
        got.append("ended")

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            async with Bus(root) as bus:
                tg.start_soon(consume, bus)
                await ready.wait()
            # The bus is closed; the consumer must finish for the task group to exit.
    assert got == ["ended"]


@pytest.mark.anyio
async def test_receive_with_timeout_zero_polls(root: Path) -> None:
    async with Bus(root) as bus, bus.messages("p") as it:
        with pytest.raises(TimeoutError):
            await it.receive(timeout=0)  # nothing yet: at once
        await bus.publish("p", b"waiting")
        # Regression: timeout=0 refused even a message already buffered.
        got = None
        with anyio.fail_after(WAIT):
            while got is None:
                try:
                    got = await it.receive(timeout=0)
                except TimeoutError:
                    await anyio.sleep(0.01)
    assert got.payload == b"waiting"


@pytest.mark.anyio
async def test_an_iterator_claims_one_work_item_at_a_time_by_default(root: Path) -> None:
    async with Bus(root) as bus:
        infos = [await bus.publish("jobs", f"j{i}".encode(), single=True) for i in range(5)]
        async with bus.messages("jobs") as it:
            first = await it.receive(timeout=WAIT)
            # The other four stay free for other consumers while this one works.
            await wait_until(lambda: sum(is_flocked(i.path) for i in infos) == 1)
            assert [i.name for i in infos if is_flocked(i.path)] == [first.name]
            second = await it.receive(timeout=WAIT)  # acks the first
            assert second.name != first.name


@pytest.mark.anyio
async def test_prefetch_lets_an_iterator_hold_more(root: Path) -> None:
    async with Bus(root) as bus:
        infos = [await bus.publish("jobs", f"j{i}".encode(), single=True) for i in range(5)]
        async with bus.messages("jobs", prefetch=3) as it:
            await it.receive(timeout=WAIT)
            await wait_until(lambda: sum(is_flocked(i.path) for i in infos) == 3)
