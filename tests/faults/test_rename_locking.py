"""Claims by atomic rename (``locking="rename"``): release, crash and lease expiry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsbus import Bus, BusConfig, Message
from fsbus._bus.fs import filesystem_type, locks_stay_local

from .conftest import Inbox, until

RENAME = BusConfig(bucket_num_chars=1, locking="rename", poll_interval=0.05, retry_interval=0.05)


@pytest.mark.anyio
async def test_a_failed_handler_releases_by_renaming_back(tmp_path: Path) -> None:
    calls: list[int] = []
    inbox = Inbox()

    async def flaky(msg: Message) -> None:
        calls.append(msg.delivery_count)
        if len(calls) == 1:
            raise RuntimeError("first try fails")
        await inbox(msg)

    async with Bus(tmp_path / "bus", config=RENAME) as bus:
        await bus.subscribe("job", flaky)
        info = await bus.publish("job", b"j", single=True, headers={"k": "v"})
        await inbox.wait(1)
        assert calls == [1, 2]
        assert inbox.messages[0].headers == {"k": "v"}
        await until(lambda: not os.path.exists(info.path))
    assert list((tmp_path / "bus" / "fsbus").rglob("*@*")) == []


def test_a_consumer_killed_mid_handler_leaves_a_claim_that_gc_returns(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    repo = str(Path(__file__).resolve().parents[2])
    code = f"""
import anyio, sys
from fsbus import Bus, BusConfig
cfg = BusConfig(bucket_num_chars=1, locking="rename", poll_interval=0.05)
async def main():
    async def hang(msg):
        print("got", flush=True)
        await anyio.sleep_forever()
    async with Bus({str(root)!r}, config=cfg) as bus:
        await bus.publish("job", b"work", single=True)
        await bus.subscribe("job", hang)
        await anyio.sleep_forever()
anyio.run(main)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": repo},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "got"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    claims = list((root / "fsbus" / "claims").rglob("*@*"))
    assert len(claims) == 1
    assert not any((root / "messages").rglob("*@*"))
    # Within its lease the claim stays; once older it goes back and is redelivered.
    from fsbus import BlockingBus

    with BlockingBus(root, config=RENAME) as bus:
        assert bus.gc() == 0
        old = time.time() - 3600
        os.utime(claims[0], (old, old))
        assert bus.gc() == 1
        with bus.messages("job") as it:
            msg = it.get(timeout=15)
            assert msg.payload == b"work"
            it.ack(msg)
    assert not any((root / "messages").rglob("*@*"))
    assert not any((root / "fsbus" / "claims").rglob("*@*"))


def test_auto_locking_uses_flock_on_local_filesystems(tmp_path: Path) -> None:
    assert filesystem_type(str(tmp_path)) != ""
    assert locks_stay_local(str(tmp_path)) is False
