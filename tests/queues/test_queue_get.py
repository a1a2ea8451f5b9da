"""``Bus.get``: one message of a durable queue, without subscribing.

It takes the head of the queue (priority, then publish order), skips what consumers
hold, holds its message for its block (acked at the end, given back when the block
raises, dead-lettered after the queue's ``max_deliveries``), and is not a consumer.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Decline, Message, QueueNotFound, Requeue

from .conftest import WAIT, wait_until


async def fail_in_block(bus: Bus, queue: str, exc: Exception, held: list[Message]) -> None:
    """Get a message, note it in ``held``, and raise ``exc`` in the block."""
    async with bus.get(queue) as msg:
        assert msg is not None
        held.append(msg)
        raise exc


@pytest.mark.anyio
async def test_get_takes_the_head_of_the_queue_then_none(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(5):
            await bus.publish("t.low", f"low{i}")
        await bus.publish("t.high", "urgent", priority=1)  # lower goes first
        got = []
        for _ in range(6):
            async with bus.get("q") as msg:
                assert msg is not None
                assert msg.queue == "q"
                got.append(msg.payload.decode())
        async with bus.get("q") as msg:
            assert msg is None
        info = await bus.queue_info("q")
    assert got == ["urgent", "low0", "low1", "low2", "low3", "low4"]
    assert info.depth == 0
    assert info.consumers == 0  # a get is not a consumer


@pytest.mark.anyio
async def test_a_block_that_raises_gives_the_message_back(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        await bus.publish("t.a", "once")
        held: list[Message] = []
        with pytest.raises(RuntimeError, match="not now"):
            await fail_in_block(bus, "q", RuntimeError("not now"), held)
        (first,) = held
        assert (await bus.queue_info("q")).depth == 1
        async with bus.get("q") as again:
            assert again is not None
        assert again.name == first.name
        assert again.delivery_count == first.delivery_count + 1
        assert (await bus.queue_info("q")).depth == 0


@pytest.mark.anyio
async def test_the_last_delivery_that_fails_is_dead_lettered(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"], max_deliveries=2, dead_letter="failed.q")
        await bus.declare_queue("dlq", ["failed.#"])
        await bus.publish("t.a", "poison")
        for _ in range(2):
            with pytest.raises(ValueError, match="bad"):
                await fail_in_block(bus, "q", ValueError("bad"), [])
        async with bus.get("q") as msg:
            assert msg is None
        async with bus.get("dlq") as dead:
            assert dead is not None
            assert dead.payload == b"poison"
            assert dead.headers["x-fsbus-queue"] == "q"
            assert dead.headers["x-fsbus-topic"] == "t.a"
        assert bus.statistics().dead_lettered == 1


@pytest.mark.anyio
async def test_get_passes_over_what_a_consumer_holds(root: Path, fast: BusConfig) -> None:
    held = anyio.Event()
    let_go = anyio.Event()
    seen: list[Message] = []

    async def slow(msg: Message) -> None:
        seen.append(msg)
        held.set()
        await let_go.wait()

    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        await bus.publish("t.a", "first")
        await bus.publish("t.a", "second")
        sub = await bus.subscribe(None, slow, queue="q", prefetch=1)
        with anyio.fail_after(WAIT):
            await held.wait()
        async with bus.get("q") as msg:
            assert msg is not None
            other = msg.payload
        async with bus.get("q") as msg:
            assert msg is None  # the only one left is held
        let_go.set()
        await wait_until(lambda: sub.in_flight == 0)
        await bus.unsubscribe(sub)
        assert (await bus.queue_info("q")).depth == 0
    assert {seen[0].payload, other} == {b"first", b"second"}


@pytest.mark.anyio
async def test_gets_at_once_take_different_messages(root: Path, fast: BusConfig) -> None:
    taken: list[bytes] = []
    inside = 0
    all_in = anyio.Event()

    async def get_one(bus: Bus) -> None:
        nonlocal inside
        async with bus.get("q") as msg:
            assert msg is not None
            taken.append(msg.payload)
            inside += 1
            if inside == 4:
                all_in.set()
            await all_in.wait()  # every one holds its message at the same time

    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(4):
            await bus.publish("t.a", str(i))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(get_one, bus)
        assert (await bus.queue_info("q")).depth == 0
    assert sorted(taken) == [b"0", b"1", b"2", b"3"]


@pytest.mark.anyio
async def test_get_from_a_queue_that_does_not_exist(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        with pytest.raises(QueueNotFound, match="nope"):
            async with bus.get("nope"):
                pass


def test_the_blocking_face(root: Path, fast: BusConfig) -> None:
    with BlockingBus(root, config=fast) as bus:
        bus.declare_queue("q", ["t.#"])
        bus.publish("t.a", "x")
        with bus.get("q") as msg:
            assert msg is not None
            assert msg.payload == b"x"
        with bus.get("q") as msg:
            assert msg is None
        assert bus.queue_info("q").depth == 0


@pytest.mark.anyio
async def test_a_get_sees_what_was_published_since_the_last(root: Path, fast: BusConfig) -> None:
    """Gets keep their listing and update it from the stamps: a message published after
    one get, ahead of the others by priority, is what the next get takes."""
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        for name in ("a", "b", "c"):
            await bus.publish("t.x", name)
        async with bus.get("q") as msg:
            assert msg is not None
            assert msg.payload == b"a"
        await bus.publish("t.x", "urgent", priority=1)
        got = []
        for _ in range(3):
            async with bus.get("q") as msg:
                assert msg is not None
                got.append(msg.payload)
    assert got == [b"urgent", b"b", b"c"]


@pytest.mark.anyio
async def test_a_get_passes_over_what_others_took(root: Path, fast: BusConfig) -> None:
    """Messages another bus took and acked since this one's last get are gone from its
    listing without a stamp: the get finds the one left, then none."""
    async with Bus(root, config=fast) as bus, Bus(root, config=fast) as other:
        await bus.declare_queue("q", ["t.#"])
        for i in range(5):
            await bus.publish("t.x", str(i))
        async with bus.get("q") as msg:
            assert msg is not None
            assert msg.payload == b"0"
        for i in range(1, 4):
            async with other.get("q") as msg:
                assert msg is not None
                assert msg.payload == str(i).encode()
        async with bus.get("q") as msg:
            assert msg is not None
            assert msg.payload == b"4"
        async with bus.get("q") as msg:
            assert msg is None


def test_a_message_no_stamp_told_of_is_found(root: Path, fast: BusConfig) -> None:
    """A publisher that died between its rename and its stamp left a message UPDATE
    does not tell of (here: UPDATE is put back as it was before the publish). The next
    get, finding nothing else, lists every bucket and takes it."""
    with BlockingBus(root, config=fast) as bus:
        bus.declare_queue("q", ["t.#"])
        bus.publish("t.x", "seen")
        with bus.get("q") as msg:  # the listing is made
            assert msg is not None
        (update,) = [p for p in root.rglob("UPDATE") if "queues" in p.parts]
        before = update.read_bytes()
        bus.publish("t.x", "unstamped")
        assert update.read_bytes() != before
        update.write_bytes(before)
        with bus.get("q") as msg:
            assert msg is not None
            assert msg.payload == b"unstamped"


@pytest.mark.anyio
async def test_foreign_files_at_the_head_are_passed_over_and_not_counted(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files that are not messages rank first in a listing: each get passes over them
    without parsing them again, and they are not counted as ready (``get-ok``'s count)."""
    import fsbus._bus.take as take

    parsed: list[str] = []
    real = take.parse_entry

    def counting(bi: int, name: str, spills: dict[tuple[int, str], bytes]) -> object:
        parsed.append(name)
        return real(bi, name, spills)

    monkeypatch.setattr(take, "parse_entry", counting)
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(3):
            await bus.publish("t.x", str(i))
        message = next((root / "fsbus" / "queues" / "q" / "bus" / "messages").glob("*/*@*"))
        foreign = [message.parent / f"notes-{i}.txt" for i in range(4)]
        for p in foreign:
            p.write_text("not a message")
        got, ready = [], []
        for _ in range(3):
            async with bus._taking("q") as taken:
                assert taken is not None
                got.append(taken[0].payload)
                ready.append(taken[1])
        async with bus.get("q") as msg:
            assert msg is None
    assert got == [b"0", b"1", b"2"]
    assert ready == [2, 1, 0]
    assert sorted(n for n in parsed if n.startswith("notes-")) == sorted(p.name for p in foreign)
    assert all(p.exists() for p in foreign)  # left where they are


@pytest.mark.anyio
async def test_a_message_taken_without_a_block_is_held_until_settled_once(root: Path) -> None:
    """What the AMQP gateway's basic.get uses: a message taken with no block stays held
    (neither got again nor counted ready) until its settle is awaited; a Decline gives
    it back untouched (not a delivery), an ack removes it, and a second settle does
    nothing."""
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(2):
            await bus.publish("t.x", str(i))
        first = await bus._take_held("q")
        assert first is not None
        assert (first.msg.payload, first.waiting) == (b"0", 1)
        second = await bus._take_held("q")
        assert second is not None
        assert (second.msg.payload, second.waiting) == (b"1", 0)
        assert await bus._take_held("q") is None  # both held
        await first.settle(Decline())
        again = await bus._take_held("q")
        assert again is not None
        assert (again.msg.payload, again.msg.delivery_count) == (b"0", 1)  # not counted
        await again.settle(None)
        await again.settle(Requeue())  # settled already: nothing happens
        await second.settle(None)
        assert await bus._take_held("q") is None
        assert (await bus.queue_info("q")).depth == 0


@pytest.mark.anyio
async def test_get_on_a_queue_another_bus_deleted_says_not_found(
    root: Path, fast: BusConfig
) -> None:
    """A get takes the queue's definition from the routing table, not the file: once
    another process's delete returned, the get says the queue is gone, and leaves
    nothing of it behind; declared again, the queue's new messages are what it gets."""
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"])
        await bus.publish("t.a", "old")
        async with bus.get("q") as msg:  # its bus for the queue is open now
            assert msg is not None
        await bus.publish("t.a", "left behind")
        with BlockingBus(root, config=fast) as other:
            assert other.delete_queue("q") == 1
        with pytest.raises(QueueNotFound):
            async with bus.get("q"):
                pass
        assert not (root / "fsbus" / "queues" / "q").exists()
        with BlockingBus(root, config=fast) as other:
            other.declare_queue("q", ["t.#"])
            other.publish("t.a", "new")
        async with bus.get("q") as msg:
            assert msg is not None
            assert msg.payload == b"new"
        async with bus.get("q") as msg:
            assert msg is None
