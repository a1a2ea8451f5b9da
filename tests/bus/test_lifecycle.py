"""Opening, closing, cancelling and concurrency limits of the async Bus."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message

from .conftest import WAIT, Inbox, files_under, message_files, wait_until


@pytest.mark.anyio
async def test_root_and_its_missing_parents_are_created(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "bus"
    async with Bus(os.fspath(root)) as bus:
        info = await bus.publish("t", b"x")
    assert Path(info.path).parent.parent == root / "messages"
    for sub in ("staging", "messages", f"messages/{info.bucket}", "topics", "update/UPDATE"):
        assert (root / sub).exists(), sub
    # the other buckets come with their first message (on a local mount)
    assert len(list((root / "messages").iterdir())) == 1


@pytest.mark.anyio
async def test_reopening_an_existing_bus_keeps_its_messages(root: Path) -> None:
    async with Bus(root) as bus:
        info = await bus.publish("keep", b"x", single=True)
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("keep", inbox)
        (msg,) = await inbox.wait_for(1)
    assert msg.name == info.name


@pytest.mark.anyio
async def test_handler_concurrency_is_a_ceiling(root: Path) -> None:
    limit = 3
    active = 0
    peak = 0
    gate = anyio.Event()
    done: list[bytes] = []

    async def slow(msg: Message) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            await gate.wait()
        finally:
            active -= 1
        done.append(msg.payload)

    async with Bus(root, config=BusConfig(handler_concurrency=limit)) as bus:
        await bus.subscribe("c.*", slow)
        for i in range(10):
            await bus.publish("c.m", str(i))
            await bus.publish("c.s", f"s{i}", single=True)
        await wait_until(lambda: active == limit)
        assert bus.statistics().in_flight <= limit
        gate.set()
        await wait_until(lambda: len(done) == 20)
    assert peak == limit


@pytest.mark.anyio
async def test_handler_workers_start_as_handlers_need_them(root: Path) -> None:
    """The pool of handler tasks grows to what runs at once, not to the ceiling: a bus
    whose handlers run one at a time keeps one worker; eight held at once make eight,
    all running together, and every message is handled once."""
    held = 8
    gate = anyio.Event()
    active = 0
    done: list[bytes] = []

    async def handler(msg: Message) -> None:
        nonlocal active
        if msg.topic == "w.held":
            active += 1
            await gate.wait()
        done.append(msg.payload)

    async with Bus(root, config=BusConfig(handler_concurrency=256)) as bus:
        await bus.subscribe("w.*", handler)
        for i in range(20):  # one at a time: each handled before the next is published
            await bus.publish("w.one", b"%d" % i)
            await wait_until(lambda i=i: len(done) == i + 1)
            await wait_until(lambda: len(bus._jobs._idle) == bus._jobs.workers)  # back idle
        assert bus._jobs.workers == 1
        for i in range(held):
            await bus.publish("w.held", b"h%d" % i)
        await wait_until(lambda: active == held)  # all eight at once
        assert bus._jobs.workers == held
        gate.set()
        await wait_until(lambda: len(done) == 20 + held)
    assert sorted(done) == sorted(
        [b"%d" % i for i in range(20)] + [b"h%d" % i for i in range(held)]
    )


@pytest.mark.anyio
async def test_resubscribing_after_every_subscription_closed(root: Path) -> None:
    first, second = Inbox(), Inbox()
    async with Bus(root) as bus:
        sub = await bus.subscribe("r", first)
        await bus.publish("r", b"1")
        await first.wait_for(1)
        await sub.aclose()
        await bus.subscribe("r", second)
        await bus.publish("r", b"2")
        await second.wait_for(1)
    assert first.payloads == [b"1"]
    assert second.payloads == [b"2"]


@pytest.mark.anyio
async def test_a_cancelled_streaming_publish_leaves_nothing(root: Path) -> None:
    started = anyio.Event()

    async def endless() -> AsyncIterator[bytes]:
        yield b"first chunk"
        started.set()
        await anyio.sleep_forever()
        yield b"never"  # pragma: no cover

    async with Bus(root) as bus, anyio.create_task_group() as tg:
        tg.start_soon(bus.publish, "t", endless())
        with anyio.fail_after(WAIT):
            await started.wait()
        assert len(files_under(root / "staging")) == 1
        tg.cancel_scope.cancel()
    assert files_under(root / "staging") == []
    assert message_files(root) == []


@pytest.mark.anyio
async def test_a_cancelled_publish_is_all_or_nothing(root: Path) -> None:
    payload = os.urandom(1 << 20)
    async with Bus(root) as bus:
        for _ in range(20):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await bus.publish("t", payload)
        # Whatever was published despite the cancel is whole; nothing is half-written.
        await bus.publish("t", b"after")
    assert files_under(root / "staging") == []
    for rel in message_files(root):
        data = (root / "messages" / rel).read_bytes()
        assert data in (b"\x00" + payload, b"\x00after")


@pytest.mark.anyio
async def test_bytearray_and_memoryview_payloads(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("b", inbox)
        await bus.publish("b", bytearray(b"array"))  # type: ignore[arg-type]
        await bus.publish("b", memoryview(b"view"))  # type: ignore[arg-type]
        await inbox.wait_for(2)
    assert sorted(inbox.payloads) == [b"array", b"view"]


@pytest.mark.anyio
async def test_gc_spares_an_expired_single_that_is_being_handled(root: Path) -> None:
    started = anyio.Event()
    gate = anyio.Event()

    async def holder(msg: Message) -> None:
        started.set()
        await gate.wait()

    async with Bus(root) as bus:
        await bus.subscribe("h", holder)
        info = await bus.publish("h", b"x", single=True, ttl=0.2)
        with anyio.fail_after(WAIT):
            await started.wait()
        await wait_until(lambda: info.expires < time.time())
        assert await bus.gc() == 0
        assert await anyio.Path(info.path).exists()
        gate.set()
        await wait_until(lambda: bus.statistics().acked == 1)
    assert message_files(root) == []


@pytest.mark.anyio
async def test_close_with_many_handlers_running_releases_every_single(root: Path) -> None:
    started = 0

    async def stuck(msg: Message) -> None:
        nonlocal started
        started += 1
        await anyio.sleep_forever()

    async with Bus(root, config=BusConfig(handler_concurrency=8)) as bus:
        infos = [await bus.publish("many", str(i), single=True) for i in range(8)]
        await bus.subscribe("many", stuck)
        await wait_until(lambda: started == 8)
    stats = bus.statistics()
    assert stats.released == 8
    assert stats.failed == 0
    assert sorted(message_files(root)) == sorted(f"{i.bucket}/{i.name}" for i in infos)
    assert files_under(root / "fsbus" / "attempts") == []


def open_fds() -> set[str]:
    """Descriptors of this process that point at files (not sockets, pipes, anon inodes)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/"):
            out.add(target)
    return out


@pytest.mark.anyio
async def test_open_and_close_leave_no_descriptor_behind(root: Path) -> None:
    async def cycle() -> None:
        inbox = Inbox()
        async with Bus(root) as bus:
            await bus.subscribe("#", inbox)
            await bus.publish("a", b"1")
            await bus.publish("b", b"2", single=True, headers={"k": "v"})
            await inbox.wait_for(2)
            await wait_until(lambda: bus.statistics().acked == 1)
            async for _ in bus.browse():
                pass
            await bus.gc()

    await cycle()  # warm up whatever is opened once per process
    before = await anyio.to_thread.run_sync(open_fds)
    for _ in range(5):
        await cycle()
    after = await anyio.to_thread.run_sync(open_fds)
    assert sorted(p for p in after - before if str(root) in p) == []


def test_blocking_bus_open_and_close_leave_no_descriptor_behind(root: Path) -> None:
    def cycle() -> None:
        with BlockingBus(root) as bus, bus.messages("#") as it:
            bus.publish("a", b"1", single=True)
            it.ack(it.get(timeout=WAIT))
            list(bus.browse())
            bus.gc()

    cycle()
    before = open_fds()
    for _ in range(3):
        cycle()
    assert sorted(p for p in open_fds() - before if str(root) in p) == []


@pytest.mark.anyio
async def test_buses_opened_and_closed_one_after_another_all_watch_with_inotify(
    root: Path,
) -> None:
    """A bus closes its inotify instance without waiting for the kernel to end it: more
    buses than the default per-user limit of instances (128), each closed before the
    next opens, still all get one (the closes have kept up)."""

    async def nothing(_msg: Message) -> None:
        pass

    for _ in range(150):
        async with Bus(root) as bus:
            await bus.subscribe("a", nothing)  # the first subscription starts the watch
            if bus.config.force_polling:
                pytest.skip("polling only here (force_polling): no inotify to watch with")
            assert bus.statistics().inotify
