"""Work-queue messages claimed by rename (``locking="rename"``) instead of flock."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message
from fsbus._bus.names import encode_topic, make_name

from .conftest import (
    WAIT,
    Inbox,
    files_under,
    message_files,
    peer_buckets,
    wait_until,
    wait_until_blocking,
)

RENAME = BusConfig(locking="rename", poll_interval=0.05, retry_interval=0.05)


def claims(root: Path) -> list[str]:
    """Messages currently claimed (moved aside) by some consumer."""
    return files_under(root / "fsbus" / "claims")


def prepare(root: Path) -> None:
    """Create the bus layout, claims directory included, and every bucket (as a
    qlobber-fsq peer makes them) for the files planted there."""
    with BlockingBus(root, config=RENAME):
        pass
    peer_buckets(root, RENAME)


@pytest.mark.anyio
async def test_each_single_is_handled_once_across_two_buses(root: Path) -> None:
    a, b = Inbox(), Inbox()
    async with Bus(root, config=RENAME) as one, Bus(root, config=RENAME) as two:
        await one.subscribe("jobs", a)
        await two.subscribe("jobs", b)
        for i in range(40):
            await one.publish("jobs", str(i), single=True)
        await wait_until(lambda: one.statistics().acked + two.statistics().acked == 40)
    got = Counter(m.payload for m in (*a.messages, *b.messages))
    assert sorted(int(p) for p in got) == list(range(40))
    assert set(got.values()) == {1}
    assert message_files(root) == []
    assert claims(root) == []


@pytest.mark.anyio
async def test_failure_returns_it_to_its_bucket_and_counts(root: Path) -> None:
    seen: list[int] = []

    async def flaky(msg: Message) -> None:
        seen.append(msg.delivery_count)
        if len(seen) == 1:
            raise RuntimeError("once")

    async with Bus(root, config=RENAME) as bus:
        await bus.subscribe("f", flaky)
        await bus.publish("f", b"x", single=True)
        await wait_until(lambda: bus.statistics().acked == 1)
    assert seen == [1, 2]
    assert message_files(root) == []
    assert claims(root) == []


@pytest.mark.anyio
async def test_shutdown_puts_a_claimed_message_back(root: Path) -> None:
    started = anyio.Event()

    async def stuck(msg: Message) -> None:
        started.set()
        await anyio.sleep_forever()

    async with Bus(root, config=RENAME) as bus:
        await bus.subscribe("s", stuck)
        info = await bus.publish("s", b"x", single=True)
        with anyio.fail_after(WAIT):
            await started.wait()
        assert message_files(root) == []  # moved aside while claimed
        assert claims(root) == [f"{info.bucket}/{info.name}"]
    assert message_files(root) == [f"{info.bucket}/{info.name}"]
    assert claims(root) == []
    inbox = Inbox()
    async with Bus(root, config=RENAME) as bus:
        await bus.subscribe("s", inbox)
        (msg,) = await inbox.wait_for(1)
    assert msg.delivery_count == 1


@pytest.mark.anyio
async def test_a_planted_symlink_is_not_followed(root: Path, tmp_path: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    secret = tmp_path / "secret"
    secret.write_bytes(b"\x00keep out")
    os.utime(secret, (1_000_000, 1_000_000))
    name, _ = make_name(
        encode_topic("steal"),
        split_at=200,
        expires_ms=int((time.time() + 600) * 1000),
        kind="s",
        unique=os.urandom(16).hex(),
    )
    link = root / "messages" / "42" / name
    link.symlink_to(secret)
    inbox = Inbox()
    async with Bus(root, config=RENAME) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("barrier", b"b", single=True)
        await inbox.wait_topic("barrier")
        scans = bus.statistics().scans
        await wait_until(lambda: bus.statistics().scans >= scans + 3)
    assert inbox.topics == ["barrier"]
    assert secret.read_bytes() == b"\x00keep out"
    assert secret.stat().st_mtime == 1_000_000
    assert link.is_symlink()


def test_blocking_face_with_rename_locking(root: Path) -> None:
    with BlockingBus(root, config=RENAME) as bus, bus.messages("b") as it:
        bus.publish("b", b"1", single=True)
        msg = it.get(timeout=WAIT)
        it.release(msg)
        again = it.get(timeout=WAIT)
        assert again.delivery_count == 2
        it.ack(again)
        wait_until_blocking(lambda: bus.statistics().acked == 1)
    assert message_files(root) == []
    assert claims(root) == []
