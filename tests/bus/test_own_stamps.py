"""A bus that subscribes does not list buckets again for its own stamps.

When a bus publishes a multi message none of its subscriptions wants, the stamp it writes
wakes it like anyone's. If, just before that stamp, the bucket's stamp still held what the
bus had accounted for (it listed the bucket since, or the stamp was its own), nothing new
of anyone else's can be there: its scan skips the bucket (``BusFS.stamp_own``). Such
buckets are listed again after ``_OWN_RELIST`` seconds all the same: between the read of
the stamp and its write, another publisher's stamp can land and be overwritten, and its
message must still arrive. Faults come through the I/O seam (an ``Ops`` subclass).
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, PayloadTooLarge, StorageError
from fsbus._bus import engine
from fsbus._bus.layout import Layout
from fsbus._bus.names import encode_topic, make_name
from fsbus._bus.ops import Ops

from .conftest import Inbox

FAST = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05)


class CountingOps(Ops):
    """Counts the listings of bucket directories."""

    def __init__(self, messages: Path) -> None:
        self.messages = str(messages) + "/"
        self.bucket_listings = 0

    def listdir(self, path: str) -> list[str]:
        if path.startswith(self.messages):
            self.bucket_listings += 1
        return super().listdir(path)


async def _scanned_after(bus: Bus, before: int) -> None:
    with anyio.fail_after(30):
        while bus.statistics().scans <= before:  # noqa: ASYNC110 (a counter, no event)
            await anyio.sleep(0.01)


async def _warm_up(bus: Bus) -> None:
    """Publish until publishing runs inline (a bus starts in a worker thread, measuring
    the mount; own stamps are taken on the inline path), then subscribe, which makes the
    next scan list every bucket, and wait for that scan: every warm-up message has then
    been listed (its own-only bucket too). A scan already under way when ``subscribe``
    returns is not that scan, and it may deliver the message published next: so wait
    for the scan after it, not for the message."""
    with anyio.fail_after(30):
        while not bus._offload.inline:
            await bus.publish("warm.up", b"x")
    sync = Inbox()
    await bus.subscribe("sync.#", sync)
    before = bus.statistics().scans  # (no await since subscribe returned)
    await bus.publish("sync.now", b"x")
    await sync.wait_for(1)
    await _scanned_after(bus, before + 1)  # the one under way, if any, then the full one


@pytest.mark.anyio
async def test_own_stamps_make_no_listing(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_OWN_RELIST", 3600.0)
    ops = CountingOps(root / "messages")
    inbox = Inbox()
    async with Bus(root, config=FAST, ops=ops) as bus:
        await bus.subscribe("wanted.#", inbox)
        await _warm_up(bus)
        await bus.publish("wanted.first", b"1")  # wanted here: listed as usual
        await inbox.wait_for(1)
        listed = ops.bucket_listings
        for i in range(200):
            await bus.publish(f"elsewhere.{i % 7}", b"x")
        # it woke for its stamps and looked at UPDATE, and listed no bucket
        await _scanned_after(bus, bus.statistics().scans)
        assert ops.bucket_listings == listed
        # a message it wants is still listed and delivered at once
        await bus.publish("wanted.second", b"2")
        await inbox.wait_for(2)
        assert ops.bucket_listings > listed
    assert [m.payload for m in inbox.messages] == [b"1", b"2"]


@pytest.mark.anyio
async def test_another_publishers_stamp_overwritten_unseen_is_late_not_lost(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between this bus's read of a stamp and its write, a peer's message lands in the
    bucket and its stamp is overwritten: the bus lists the bucket again after
    ``_OWN_RELIST`` and delivers it."""
    monkeypatch.setattr(engine, "_OWN_RELIST", 0.3)
    layout = Layout.of(str(root), FAST)
    planted: list[str] = []

    class PeerInTheWindow(Ops):
        armed = False

        def pread(self, fd: int, size: int, offset: int) -> bytes:
            before = super().pread(fd, size, offset)
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
            if PeerInTheWindow.armed and writable:  # the read just before a stamp
                PeerInTheWindow.armed = False
                bucket = layout.buckets[offset // size]
                name, _ = make_name(
                    encode_topic("wanted.peer"),
                    split_at=200,
                    expires_ms=2**42,
                    kind="m",
                    unique=secrets.token_hex(16),
                )
                staged = root / "staging" / f"peer-{secrets.token_hex(4)}"
                staged.write_bytes(b"\x00from the peer")
                os.rename(staged, root / "messages" / bucket / name)
                os.pwrite(fd, secrets.token_bytes(size), offset)  # the peer's stamp
                planted.append(name)
            return before

    inbox = Inbox()
    # no periodic listing of every bucket: only the relisting can find it
    config = FAST.model_copy(update={"refresh_ttl": 3600.0})
    async with Bus(root, config=config, ops=PeerInTheWindow()) as bus:
        await bus.subscribe("wanted.#", inbox)
        await _warm_up(bus)
        PeerInTheWindow.armed = True
        await bus.publish("elsewhere.b", b"x")  # its own stamp overwrites the peer's
        assert planted
        msg = await inbox.wait_topic("wanted.peer")
    assert msg.payload == b"from the peer"
    assert [m.topic for m in inbox.messages] == ["wanted.peer"]


@pytest.mark.anyio
async def test_own_messages_published_before_a_subscription_do_not_reach_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own messages that no subscription wanted are left unlisted for a while; a
    subscription made meanwhile does not receive them when their bucket is listed."""
    monkeypatch.setattr(engine, "_OWN_RELIST", 3600.0)
    first, later = Inbox(), Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("other.#", first)
        await _warm_up(bus)
        for i in range(20):
            await bus.publish(f"topic.{i}", b"before")
        await _scanned_after(bus, bus.statistics().scans)
        await bus.subscribe("topic.#", later)  # lists every bucket: the 20 are there
        await bus.publish("topic.after", b"after")
        await bus.publish("other.x", b"x")
        await first.wait_for(1)
        await later.wait_for(1)
    assert [m.payload for m in later.messages] == [b"after"]
    assert [m.topic for m in first.messages] == ["other.x"]


@pytest.mark.anyio
async def test_a_publish_that_fails_leaves_no_own_name_behind(root: Path) -> None:
    """Own names wait for a listing to see them; a message that was never published
    would never be seen, and its name would stay until the set fills up."""
    config = FAST.model_copy(update={"max_payload_size": 10})
    async with Bus(root, config=config) as bus:
        await bus.subscribe("other.#", Inbox())
        await _warm_up(bus)
        with pytest.raises(PayloadTooLarge):
            await bus.publish("topic.big", b"x" * 11)  # the general path, after the fast one
        with pytest.raises(PayloadTooLarge):
            await bus.publish("topic.big", b"x" * 11, ttl=60)  # the general path only
        with pytest.raises(StorageError, match=r"missing\.bin"):
            await bus.publish("topic.file", root / "missing.bin")
        assert bus._own_names == set()
        await bus.publish("topic.ok", b"small")
        assert len(bus._own_names) <= 1  # until its bucket is listed
