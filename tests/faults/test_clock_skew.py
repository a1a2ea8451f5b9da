"""Clock skew between hosts: expiry stamps from the past or the far future.

Expiry is an absolute time written by the publisher's clock and read by everyone
else's. A publisher whose clock runs behind makes messages that are already expired
for the readers: they are removed, never delivered. One whose clock runs ahead makes
messages that live longer: delivered normally. Extreme stamps (zero, beyond what fsbus
writes, the largest a name may hold) never crash a reader.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fsbus import Bus, BusConfig
from fsbus._bus.names import MAX_EXPIRES_MS, encode_topic, make_name

from .conftest import Inbox, until

FAST = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05, refresh_ttl=0.1)


def plant(root: Path, topic: str, payload: bytes, *, expires_ms: int, single: bool) -> Path:
    """Write a message as a peer on another host would (its clock, its name)."""
    name, spill = make_name(
        encode_topic(topic),
        split_at=200,
        expires_ms=expires_ms,
        kind="s" if single else "m",
        unique=os.urandom(16).hex(),
    )
    assert spill is None
    path = root / "messages" / "0" / name
    path.parent.mkdir(exist_ok=True)  # (as a qlobber-fsq peer makes every bucket)
    staging = root / "staging" / name
    staging.write_bytes(b"\x00" + payload)
    staging.rename(path)
    return path


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.anyio
async def test_a_peer_clock_behind_makes_already_expired_messages(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("#", inbox)
        # Published "now" with a 60 s TTL by a host one hour behind.
        behind = [
            plant(root, f"behind.{s}", b"x", expires_ms=now_ms() - 3_600_000 + 60_000, single=s)
            for s in (False, True)
        ]
        zero = plant(root, "zero", b"x", expires_ms=0, single=True)
        ok = plant(root, "ok", b"y", expires_ms=now_ms() + 60_000, single=False)
        await inbox.wait(1)
        await until(lambda: not any(p.exists() for p in (*behind, zero)))
        assert inbox.topics == ["ok"]
        assert ok.exists()
        assert bus.statistics().expired >= 3


@pytest.mark.anyio
async def test_a_peer_clock_far_ahead_is_delivered_and_kept(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("#", inbox)
        year_2400 = 13_569_465_600_000
        multi = plant(root, "ahead.multi", b"m", expires_ms=year_2400, single=False)
        single = plant(root, "ahead.single", b"s", expires_ms=year_2400, single=True)
        # Beyond the 11 hex digits fsbus writes: 13 digits is the most a name may carry.
        huge = plant(root, "ahead.huge", b"h", expires_ms=0xF_FFFF_FFFF_FFFF, single=True)
        await inbox.wait(3)
        assert sorted(inbox.topics) == ["ahead.huge", "ahead.multi", "ahead.single"]
        assert {m.topic: m.expires for m in inbox.messages}["ahead.multi"] == year_2400 / 1000
        await until(lambda: not single.exists() and not huge.exists())  # consumed
        await bus.gc(debris_age=0)
        assert multi.exists()  # not expired for anyone: kept until its time


@pytest.mark.anyio
async def test_an_unbounded_ttl_is_capped_at_the_largest_expiry_a_name_holds(
    tmp_path: Path,
) -> None:
    inbox = Inbox()
    async with Bus(tmp_path / "bus", config=FAST) as bus:
        await bus.subscribe("#", inbox)
        info = await bus.publish("forever", b"f", ttl=1e12, single=True)
        assert info.expires == MAX_EXPIRES_MS / 1000
        await inbox.wait(1)
        assert inbox.messages[0].expires == MAX_EXPIRES_MS / 1000
