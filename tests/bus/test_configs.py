"""The same round trip under each on-disk and delivery option that changes a code path."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsbus import Bus, BusConfig

from .conftest import Inbox, files_under, message_files, wait_until

CONFIGS = {
    "defaults": BusConfig(),
    "order-by-expiry": BusConfig(order_by_expiry=True),
    "no-update-file": BusConfig(bucket_stamp_size=0, poll_interval=0.05),
    "base36-one-char": BusConfig(bucket_base=36, bucket_num_chars=1),
    "tiny-stamps": BusConfig(bucket_stamp_size=1),
    "split-at-16": BusConfig(split_topic_at=16),
    "polling-only": BusConfig(force_polling=True, poll_interval=0.05),
    "one-handler": BusConfig(handler_concurrency=1),
    "no-dedup": BusConfig(dedup=False),
    "modes": BusConfig(file_mode=0o640, dir_mode=0o750),
    "rename-locking": BusConfig(locking="rename"),
}


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.anyio
async def test_round_trip(root: Path, cfg: BusConfig) -> None:
    multi, work = Inbox(), Inbox()
    long_topic = "long." + "segment." * 30 + "end"
    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("#", multi, kind="multi")  # an observer: never takes work
        await bus.subscribe("jobs.#", work)
        await bus.publish("news.a", b"m1", headers={"h": "1"})
        await bus.publish(long_topic, b"m2")
        await bus.publish("jobs.x", b"s1", single=True)
        await bus.publish("jobs." + "y" * 60, b"s2", single=True)
        await multi.wait_for(2)
        # Each single goes to one of the two matching subscriptions.
        await wait_until(lambda: bus.statistics().acked == 2)
    singles = [m for m in (*multi.messages, *work.messages) if m.single]
    assert {m.topic for m in multi.messages if not m.single} == {"news.a", long_topic}
    assert sorted(m.payload for m in singles) == [b"s1", b"s2"]
    assert next(m for m in multi.messages if m.topic == "news.a").headers == {"h": "1"}
    assert len(message_files(root)) == 2  # the multis stay until they expire
    assert len(files_under(root / "topics")) == 1  # the long multi's spill
    if cfg.file_mode is not None:
        for rel in message_files(root):
            assert (root / "messages" / rel).stat().st_mode & 0o777 == cfg.file_mode
        assert (root / "messages").stat().st_mode & 0o777 == cfg.dir_mode
