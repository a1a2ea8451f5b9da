"""Crash debris: what a killed publisher or consumer leaves is cleaned by gc.

A publisher SIGKILLed mid-write leaves a staging file; a crash between writing a long
topic's spill (or a headers sidecar) and the rename leaves a sidecar without a message;
a consumer killed between truncating and unlinking leaves a zero-byte message. None of
them is ever delivered, and ``gc`` removes them once they are older than ``debris_age``
(young ones may belong to a publish in progress, so they stay).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, BusConfig
from fsbus._bus import fs as fs_module
from fsbus._bus.ops import Ops

from .conftest import Inbox, until

FAST = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05, refresh_ttl=0.1)


def _wait_sync(condition: object, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_publisher_killed_mid_write_leaves_staging_debris_that_gc_removes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bus"
    repo = str(Path(__file__).resolve().parents[2])
    code = (
        "import sys\nfrom fsbus import BlockingBus, BusConfig\n"
        f"with BlockingBus({str(root)!r}, config=BusConfig(bucket_num_chars=1)) as bus:\n"
        "    bus.publish('big.file', sys.stdin.buffer)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": repo},
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"partial payload")
        proc.stdin.flush()
        _wait_sync(lambda: (root / "staging").is_dir() and os.listdir(root / "staging"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
    assert len(os.listdir(root / "staging")) == 1
    with BlockingBus(root, config=FAST) as bus:
        assert list(bus.browse()) == []
        assert bus.gc() == 0  # young debris may be a publish in progress: kept
        assert len(os.listdir(root / "staging")) == 1
    with BlockingBus(root, config=FAST) as bus:
        # BlockingBus.gc has no age knob: age the file instead of waiting ten minutes.
        (staged,) = (root / "staging").iterdir()
        old = time.time() - 3600
        os.utime(staged, (old, old))
        assert bus.gc() == 1
    assert os.listdir(root / "staging") == []


@pytest.mark.anyio
async def test_orphan_sidecars_are_swept_and_never_delivered(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("#", inbox)
        long_topic = "t." + "x" * 200
        info = await bus.publish(long_topic, b"1", headers={"h": "v"}, single=True)
        spill = root / "topics" / info.bucket / info.name
        meta = root / "fsbus" / "meta" / info.bucket / info.name
        await inbox.wait(1)
        # acked: the message gone, and its sidecars after it (an ack still removing them
        # would take the ones written below)
        await until(lambda: bus.statistics().acked == 1)
        await until(lambda: not Path(info.path).exists())
        # Simulate a publisher that died after writing its sidecars, before the rename.
        spill.write_text("ab" * 10)
        meta.write_text('{"headers":{"h":"v"}}')
        attempts = root / "fsbus" / "attempts" / info.bucket / info.name
        attempts.parent.mkdir(exist_ok=True)  # (made on first use)
        attempts.write_text("2")
        assert await bus.gc() == 0  # young: could be a publish in progress
        assert spill.exists()
        assert await bus.gc(debris_age=0) == 3
        assert not spill.exists()
        assert not meta.exists()
        assert not attempts.exists()
        assert inbox.topics == [long_topic]


@pytest.mark.anyio
async def test_zero_byte_messages_are_never_delivered_and_gc_removes_them(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bus"
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        # A consumer killed between ftruncate and unlink leaves an empty file. It is made
        # before anyone subscribes: a subscriber could otherwise take it first.
        leftover = await bus.publish("z.single", b"s2", ttl=3600, single=True)
        os.truncate(leftover.path, 0)
        await bus.subscribe("#", inbox, existing=True)
        multi = await bus.publish("z.multi", b"m", ttl=3600)
        single = await bus.publish("z.single", b"s", single=True)
        await inbox.wait(2)
        await until(lambda: not Path(single.path).exists())
        # So does a peer's truncated multi message.
        os.truncate(multi.path, 0)
        await bus.gc(debris_age=0)
        assert not os.path.exists(multi.path)  # noqa: ASYNC240
        assert not os.path.exists(leftover.path)  # noqa: ASYNC240
        await bus.publish("z.after", b"a")
        await inbox.wait(3)
        assert sorted(inbox.topics) == ["z.after", "z.multi", "z.single"]


class CountedSizes(Ops):
    """Counts the lstat's of message files: the debris sweep's look at each size."""

    def __init__(self) -> None:
        super().__init__()
        self.sized = 0

    def lstat(self, path: str) -> os.stat_result:
        if f"{os.sep}messages{os.sep}" in path:
            self.sized += 1
        return super().lstat(path)


def test_a_big_bus_has_a_slice_of_its_messages_sized_at_each_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more messages waiting than a sweep looks at, each sweep sizes only a slice
    of them (each message in turn), and an old empty leftover is still removed within
    as many sweeps as there are slices, with every other message kept."""
    monkeypatch.setattr(fs_module, "DEBRIS_LOOKS", 50)
    root = tmp_path / "bus"
    ops = CountedSizes()
    with BlockingBus(root, config=FAST, ops=ops) as bus:
        paths = [bus.publish(f"kept.{i}", b"m", ttl=3600).path for i in range(200)]
        leftover = paths[123]
        os.truncate(leftover, 0)  # a peer truncated it and died before its unlink
        old = time.time() - 3600
        os.utime(leftover, (old, old))
        looks = []
        for _ in range(4):  # 200 messages, 50 a sweep: 4 slices, the first sweep too
            ops.sized = 0
            bus.gc()
            looks.append(ops.sized)
            if not os.path.exists(leftover):
                break
        assert not os.path.exists(leftover), looks
        # a slice is about a quarter (hashes do not split names exactly evenly)
        assert all(n < 120 for n in looks), looks
        assert len(list(bus.browse())) == 199
