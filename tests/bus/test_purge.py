"""Purging messages by pattern: ``Bus.purge`` and ``BlockingBus.purge``.

Real directories and real locks: a work-queue message is held by a consumer of another
Bus (its own open file description, so its own flock) or claimed by rename, and the
purge must leave it alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    ClosedError,
    InvalidPattern,
    Message,
    PublishInfo,
    PurgeReport,
    UsageError,
)
from fsbus._bus.names import encode_topic, make_name
from fsbus._bus.ops import Ops

from .conftest import WAIT, files_under, is_flocked, message_files, wait_until

LONG = "long." + "x" * 150  # 300 hex characters: the rest of the topic spills into topics/


def names(*infos: PublishInfo) -> list[str]:
    """``<bucket>/<name>`` of these messages, as :func:`message_files` lists them."""
    return sorted(f"{i.bucket}/{i.name}" for i in infos)


class Gate:
    """A handler that holds every message it gets until the gate opens."""

    def __init__(self) -> None:
        self.held: list[Message] = []
        self.open = anyio.Event()
        self._changed = anyio.Event()

    async def __call__(self, msg: Message) -> None:
        self.held.append(msg)
        self._changed.set()
        await self.open.wait()

    async def wait_for(self, count: int) -> None:
        with anyio.fail_after(WAIT):
            while len(self.held) < count:
                self._changed = anyio.Event()
                await self._changed.wait()


@pytest.mark.anyio
async def test_default_kind_purges_work_queue_messages_only(root: Path) -> None:
    async with Bus(root) as bus:
        jobs = [await bus.publish(f"jobs.{n}", b"j", single=True) for n in ("a", "b")]
        other = await bus.publish("mail.send", b"m", single=True)
        event = await bus.publish("jobs.a", b"e")
        report = await bus.purge("jobs.*")
    assert report == PurgeReport("jobs.*", "single", single=2, multi=0, locked=0)
    assert report.purged == 2
    assert message_files(root) == names(other, event)
    assert not set(names(*jobs)) & set(message_files(root))


@pytest.mark.anyio
async def test_multi_messages_go_with_their_sidecars(root: Path) -> None:
    async with Bus(root) as bus:
        gone = [
            await bus.publish("news.eu", b"1", headers={"h": "v"}),
            await bus.publish("news.us", b"2"),
        ]
        kept = [
            await bus.publish("news.eu.late", b"3", headers={"h": "v"}),
            await bus.publish("news.eu", b"4", single=True),
        ]
        report = await bus.purge("news.*", kind="multi")
    assert (report.single, report.multi, report.locked) == (0, 2, 0)
    assert report.kind == "multi"
    assert message_files(root) == names(*kept)
    assert files_under(root / "fsbus" / "meta") == [f"{kept[0].bucket}/{kept[0].name}"]
    assert gone[0].name not in str(files_under(root))


@pytest.mark.anyio
async def test_kind_all_and_long_topics_with_spill_files(root: Path) -> None:
    async with Bus(root) as bus:
        long_multi = await bus.publish(LONG, b"m")
        long_single = await bus.publish(LONG, b"s", single=True)
        other_long = await bus.publish("other." + "y" * 150, b"o", single=True)
        assert len(files_under(root / "topics")) == 3  # each spilled its topic's rest
        report = await bus.purge("long.*", kind="all")
    assert (report.single, report.multi, report.locked) == (1, 1, 0)
    assert message_files(root) == names(other_long)
    assert files_under(root / "topics") == names(other_long)
    assert long_multi.name not in str(files_under(root))
    assert long_single.name not in str(files_under(root))


@pytest.mark.anyio
async def test_a_held_work_queue_message_survives_and_is_counted(root: Path) -> None:
    gate = Gate()
    config = BusConfig(handler_concurrency=1)
    async with Bus(root, config=config) as consumer, Bus(root) as purger:
        infos = [await purger.publish("jobs.x", str(n), single=True) for n in range(3)]
        await consumer.subscribe("jobs.*", gate)
        await gate.wait_for(1)
        held = gate.held[0]
        path = root / "messages" / held.bucket / held.name
        assert is_flocked(path)
        report = await purger.purge("jobs.#")
        assert (report.single, report.locked) == (2, 1)
        # Never removed under its consumer: still there, whole, and still locked.
        assert message_files(root) == [f"{held.bucket}/{held.name}"]
        assert is_flocked(path)
        assert path.stat().st_size == 2
        # The bus holding it counts it as locked too, when it purges itself.
        assert await consumer.purge("jobs.#") == PurgeReport("jobs.#", "single", 0, 0, 1)
        gate.open.set()
        await wait_until(lambda: consumer.statistics().acked == 1)
    assert held.name in {i.name for i in infos}
    assert message_files(root) == []


@pytest.mark.anyio
async def test_a_message_claimed_by_rename_is_not_seen(root: Path) -> None:
    gate = Gate()
    config = BusConfig(locking="rename", handler_concurrency=1)
    async with Bus(root, config=config) as consumer, Bus(root, config=config) as purger:
        for n in range(3):
            await purger.publish("jobs.x", str(n), single=True)
        await consumer.subscribe("jobs.*", gate)
        await gate.wait_for(1)
        held = gate.held[0]
        report = await purger.purge("jobs.#")
        assert (report.single, report.locked) == (2, 0)
        assert message_files(root) == []
        assert files_under(root / "fsbus" / "claims") == [f"{held.bucket}/{held.name}"]
        gate.open.set()
        await wait_until(lambda: consumer.statistics().acked == 1)
    assert files_under(root / "fsbus" / "claims") == []


@pytest.mark.anyio
async def test_failure_counters_go_with_the_message(root: Path) -> None:
    with BlockingBus(root) as bus:
        info = bus.publish("jobs.retry", b"r", single=True)
        with bus.messages("jobs.*") as it:
            it.release(it.get(timeout=WAIT))  # one failed delivery, counted on disk
        # counted in the message file's leading byte
        assert (root / "messages" / info.bucket / info.name).read_bytes()[0] == 1
        # A count in a counter file (past 255 deliveries, or written by an older fsbus):
        old = bus.publish("jobs.old", b"o", single=True)
        counter = root / "fsbus" / "attempts" / old.bucket / old.name
        counter.parent.mkdir(exist_ok=True)  # (made on first use)
        counter.write_text("300")
    async with Bus(root) as bus:
        report = await bus.purge("#")
    assert report.single == 2
    assert message_files(root) == []
    assert files_under(root / "fsbus" / "attempts") == []


@pytest.mark.anyio
async def test_files_that_are_not_messages_are_never_touched(root: Path) -> None:
    async with Bus(root) as bus:
        real = await bus.publish("t", b"x", single=True)
        bucket = root / "messages" / real.bucket
        strangers = [bucket / "notes.txt", bucket / "zz@s+1+s+x"]
        for p in strangers:
            p.write_bytes(b"\x00keep")
        # A long name whose topic spill is missing: its topic is unknown, so it is kept.
        orphan, _ = make_name(
            encode_topic("t." + "z" * 150),
            split_at=200,
            expires_ms=int((time.time() + 600) * 1000),
            kind="s",
            unique=os.urandom(16).hex(),
        )
        (bucket / orphan).write_bytes(b"\x00keep")
        report = await bus.purge("#", kind="all")
    assert (report.single, report.multi) == (1, 0)
    for p in [*strangers, bucket / orphan]:
        assert p.read_bytes() == b"\x00keep"


@pytest.mark.anyio
async def test_purge_concurrent_with_consumers_loses_nothing(root: Path) -> None:
    total = 400
    consumed: list[str] = []
    gate = anyio.Event()

    async def consume(msg: Message) -> None:
        if len(consumed) < 4:
            await gate.wait()  # the first ones stay held while the purge starts
        consumed.append(msg.name)

    config = BusConfig(handler_concurrency=4, poll_interval=0.05, retry_interval=0.05)
    async with Bus(root, config=config) as consumer, Bus(root) as purger:
        published = [
            f"{i.name}"
            for i in await purger.publish_many(
                [(f"work.{n % 7}", str(n)) for n in range(total)], single=True
            )
        ]
        await consumer.subscribe("work.*", consume)
        await wait_until(lambda: consumer.statistics().in_flight == 4)
        reports: list[PurgeReport] = []

        async def purge() -> None:
            reports.append(await purger.purge("work.#"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(purge)
            gate.set()  # the consumer takes messages while the purge claims them
        [report] = reports
        # Whatever the purge left (held by the consumer then) the consumer finishes.
        await wait_until(lambda: len(consumed) + report.single == total)
        await wait_until(lambda: consumer.statistics().in_flight == 0)
    assert len(set(consumed)) == len(consumed)  # no message handled twice
    assert set(consumed) <= set(published)
    assert len(consumed) + report.single == total  # each one purged or consumed, once
    assert message_files(root) == []


class CountingOps(Ops):
    """Records every path-based call, to prove that a bad call did no I/O."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        self.calls.append(f"open {path}")
        return super().open(path, flags, mode)

    def listdir(self, path: str) -> list[str]:
        self.calls.append(f"listdir {path}")
        return super().listdir(path)

    def lstat(self, path: str) -> os.stat_result:
        self.calls.append(f"lstat {path}")
        return super().lstat(path)


@pytest.mark.anyio
@pytest.mark.parametrize("pattern", ["a\x00b", "x" * 1100, 7])
async def test_a_bad_pattern_raises_before_any_io(root: Path, pattern: object) -> None:
    ops = CountingOps()
    async with Bus(root, ops=ops) as bus:
        ops.calls.clear()
        with pytest.raises(InvalidPattern, match="invalid pattern"):
            await bus.purge(pattern)  # type: ignore[arg-type]
        assert ops.calls == []
    with BlockingBus(root, ops=ops) as blocking:
        ops.calls.clear()
        with pytest.raises(InvalidPattern, match="invalid pattern"):
            blocking.purge(pattern)  # type: ignore[arg-type]
        assert ops.calls == []


@pytest.mark.anyio
async def test_a_bad_kind_names_the_value_and_the_choices(root: Path) -> None:
    ops = CountingOps()
    async with Bus(root, ops=ops) as bus:
        ops.calls.clear()
        with pytest.raises(UsageError, match=r"'any'.*single, multi, all"):
            await bus.purge("#", kind="any")  # type: ignore[arg-type]
        assert ops.calls == []


@pytest.mark.anyio
async def test_purge_on_a_closed_bus(root: Path) -> None:
    async with Bus(root) as bus:
        pass
    with pytest.raises(ClosedError):
        await bus.purge("#")
    with BlockingBus(root) as blocking:
        pass
    with pytest.raises(ClosedError):
        blocking.purge("#")


def test_blocking_purge(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.publish("a.b", b"1", single=True)
        bus.publish("a.c", b"2")
        kept = bus.publish("b.c", b"3", single=True)
        with bus.messages("a.*") as it:
            held = it.get(timeout=WAIT)  # the work-queue message (the multi one is older)
            assert held.topic == "a.b"
            report = bus.purge("a.*", kind="all")
            assert report == PurgeReport("a.*", "all", single=0, multi=1, locked=1)
            it.ack(held)
        assert message_files(root) == names(kept)
        assert bus.purge("#") == PurgeReport("#", "single", single=1, multi=0, locked=0)
    assert message_files(root) == []
