"""TTL: expired messages are never delivered and are removed by a scan or by gc."""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig
from fsbus._bus import engine

from .conftest import Inbox, files_under, message_files, wait_until


async def wait_past(expires: float) -> None:
    """Wait until the wall clock is past an expiry."""
    await wait_until(lambda: time.time() > expires)


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_expired_message_is_not_delivered_and_the_scan_removes_it(
    root: Path, single: bool
) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        info = await bus.publish("ttl.short", b"stale", single=single, ttl=0.05, headers={"a": "b"})
        await wait_past(info.expires)
        await bus.subscribe("ttl.#", inbox, existing=True)
        await bus.publish("ttl.barrier", b"fresh", single=single)
        await inbox.wait_topic("ttl.barrier")
        await wait_until(lambda: not Path(info.path).exists())
        stats = bus.statistics()
    assert inbox.topics == ["ttl.barrier"]
    assert stats.expired == 1
    assert not (root / "fsbus" / "meta" / info.bucket / info.name).exists()


@pytest.mark.anyio
async def test_gc_removes_expired_messages_without_a_subscriber(root: Path) -> None:
    async with Bus(root) as bus:
        long_topic = "ttl." + "q" * 200
        short = await bus.publish(long_topic, b"x", ttl=0.05)
        short_single = await bus.publish("ttl.s", b"x", ttl=0.05, single=True)
        keep = await bus.publish("ttl.keep", b"y", ttl=3600)
        await wait_past(max(short.expires, short_single.expires))
        removed = await bus.gc()
        assert removed == 2
        assert bus.statistics().expired == 2
    assert message_files(root) == [f"{keep.bucket}/{keep.name}"]
    assert files_under(root / "topics") == []


@pytest.mark.anyio
async def test_expiry_is_publish_time_plus_ttl(root: Path) -> None:
    cfg = BusConfig(multi_ttl=30, single_ttl=90)
    async with Bus(root, config=cfg) as bus:
        before = time.time()
        multi = await bus.publish("t", b"x")
        single = await bus.publish("t", b"x", single=True)
        custom = await bus.publish("t", b"x", ttl=5.5)
        after = time.time()
    assert before + 30 - 0.002 <= multi.expires <= after + 30 + 0.002
    assert before + 90 - 0.002 <= single.expires <= after + 90 + 0.002
    assert before + 5.5 - 0.002 <= custom.expires <= after + 5.5 + 0.002


@pytest.mark.anyio
async def test_gc_loop_runs_on_its_own(root: Path) -> None:
    cfg = BusConfig(gc_interval=0.05)
    async with Bus(root, config=cfg) as bus:
        info = await bus.publish("t", b"x", ttl=0.05)
        await wait_until(lambda: bus.statistics().expired == 1)
        assert not await anyio.Path(info.path).exists()


@pytest.mark.anyio
async def test_an_expired_work_item_is_logged_as_a_warning(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Bus(root) as bus:
        await bus.publish("jobs.resize", b"j", single=True, ttl=0.01)
        await bus.publish("news.old", b"m", ttl=0.01)
        await anyio.sleep(0.05)  # let both TTLs pass (a clock condition, not an event)
        with caplog.at_level(logging.WARNING, logger="fsbus.bus"):
            await bus.subscribe("nothing.here", Inbox())
            await wait_until(lambda: bus.statistics().expired == 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "1 work-queue message(s) expired before any consumer took them (e.g. 'jobs.resize'); "
        "add consumers or raise single_ttl"
    ]


@pytest.mark.anyio
async def test_the_periodic_collection_is_one_process_at_a_time_once_an_interval(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every bus ran its own collection each ``gc_interval``, and each lists every bucket
    of the bus. Now the one that takes ``fsbus/gc`` (a flock) collects, and the others
    let that interval pass: collections on one bus never overlap, and each begins at
    least nine tenths of an interval after the last one ended. Two buses here (each
    holds its own descriptor, so their flocks exclude each other as two processes'
    do); expired messages are still removed."""
    interval = 0.5
    spans: list[tuple[float, float]] = []
    inner = engine.collect_garbage

    def timed(*args: object, **kwargs: object) -> tuple[int, int, int]:
        began = time.time()
        try:
            return inner(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            spans.append((began, time.time()))

    monkeypatch.setattr(engine, "collect_garbage", timed)
    cfg = BusConfig(gc_interval=interval)
    async with Bus(root, config=cfg) as a, Bus(root, config=cfg) as b:
        info = await a.publish("t", b"x", ttl=0.05)
        # the first sweep comes one interval after the buses opened, not two
        # (fsbus/gc, made by the first to look, says nothing of a sweep)
        t0 = time.monotonic()
        await wait_until(lambda: len(spans) >= 1)
        assert time.monotonic() - t0 < interval * 1.6
        await wait_until(lambda: len(spans) >= 6)
        expired = a.statistics().expired + b.statistics().expired
    assert expired == 1
    assert not await anyio.Path(info.path).exists()
    ordered = sorted(spans)
    for (_, ended), (began, _) in itertools.pairwise(ordered):
        assert began - ended >= interval * 0.9 - 0.01  # (mtimes of a coarse clock)
