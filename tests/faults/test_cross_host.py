"""Two "hosts" seeing one bus through two mounts of the same directory.

bindfs (FUSE) gives a second and third view of one directory. Like two NFS clients,
inotify on one mount does not see writes made through the other, so delivery across
mounts relies on polling. ``--enable-lock-forwarding`` passes flock to the backing
directory, so locks exclude across mounts; without it each mount keeps its own locks
(as over sshfs), which :func:`fsbus.probe_locking` detects and ``locking="rename"``
survives. Needs root, /dev/fuse and bindfs (installed with apt when missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message, probe_locking

from .conftest import WAIT, Inbox, is_root, unmount, until

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _need_bindfs() -> str:
    if not is_root():
        pytest.skip("needs root to mount bindfs (FUSE)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse for bindfs")
    exe = shutil.which("bindfs")
    if exe is None:
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "bindfs"], capture_output=True, check=False
        )
        exe = shutil.which("bindfs")
    if exe is None:
        pytest.skip("bindfs is not installed and apt-get could not install it")
    return exe


@dataclass(frozen=True)
class Hosts:
    """One directory and two mounts of it."""

    backing: Path
    """The real directory."""
    a: Path
    """Mount seen by host A."""
    b: Path
    """Mount seen by host B."""


def _mounts(tmp_path: Path, *, forward_locks: bool) -> Iterator[Hosts]:
    exe = _need_bindfs()
    backing, a, b = tmp_path / "backing", tmp_path / "host-a", tmp_path / "host-b"
    for d in (backing, a, b):
        d.mkdir()
    opts = ["--multithreaded"] + (["--enable-lock-forwarding"] if forward_locks else [])
    mounted = []
    try:
        for m in (a, b):
            proc = subprocess.run(
                [exe, *opts, str(backing), str(m)], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                pytest.skip(f"bindfs could not mount: {proc.stderr.strip()}")
            mounted.append(m)
        yield Hosts(backing, a, b)
    finally:
        for m in mounted:
            unmount(m)


@pytest.fixture
def forwarding(tmp_path: Path) -> Iterator[Hosts]:
    """Two mounts that forward flock to the backing directory."""
    yield from _mounts(tmp_path, forward_locks=True)


@pytest.fixture
def local_locks(tmp_path: Path) -> Iterator[Hosts]:
    """Two mounts whose flocks stay local to each mount (like sshfs across hosts)."""
    yield from _mounts(tmp_path, forward_locks=False)


POLL = {"force_polling": True, "poll_interval": 0.05, "retry_interval": 0.05}


def test_probe_locking_tells_the_two_kinds_of_mount_apart(
    forwarding: Hosts, tmp_path: Path
) -> None:
    assert probe_locking(forwarding.a, forwarding.b) is True
    assert probe_locking(tmp_path, tmp_path) is True  # one local directory
    assert list(forwarding.backing.iterdir()) == []  # the probe cleans up


def test_probe_locking_finds_locks_that_stay_on_one_mount(local_locks: Hosts) -> None:
    assert probe_locking(local_locks.a, local_locks.b) is False


def test_probe_locking_refuses_two_different_directories(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    with pytest.raises(ValueError, match="not two paths to the same directory"):
        probe_locking(tmp_path / "x", tmp_path / "y")


@pytest.mark.asyncio
async def test_publish_on_one_mount_is_delivered_on_the_other_by_polling(
    forwarding: Hosts,
) -> None:
    inbox = Inbox()
    cfg = BusConfig(bucket_num_chars=1, **POLL)
    async with Bus(forwarding.b, config=cfg) as reader, Bus(forwarding.a, config=cfg) as writer:
        await reader.subscribe("x.#", inbox)
        for i in range(20):
            await writer.publish(f"x.{i}", str(i).encode(), single=i % 2 == 0)
            await writer.publish("x.long." + "l" * 150, b"long")
        await inbox.wait(40)
        assert (
            sorted(m.payload for m in inbox.messages if m.topic.startswith("x.long"))
            == [b"long"] * 20
        )
        assert reader.statistics().inotify is False


async def _compete(a: Path, b: Path, cfg: BusConfig, count: int) -> Counter[str]:
    """Consumers on both mounts share a queue; returns how often each payload ran."""
    runs: Counter[str] = Counter()
    done = anyio.Event()

    async def handle(msg: Message) -> None:
        runs[msg.payload.decode()] += 1
        await anyio.sleep(0.005)  # overlap the two consumers
        if len(runs) >= count:
            done.set()

    async with Bus(a, config=cfg) as bus_a, Bus(b, config=cfg) as bus_b:
        await bus_a.subscribe("q.#", handle)
        await bus_b.subscribe("q.#", handle)
        for i in range(count):
            await (bus_a if i % 2 else bus_b).publish(f"q.{i % 3}", str(i).encode(), single=True)
        with anyio.fail_after(WAIT * 4):
            await done.wait()
        # Let late duplicates show: every message must be gone from both views.
        await until(lambda: not any((a / "messages").rglob("*@*")))
    return runs


@pytest.mark.asyncio
async def test_flock_excludes_across_mounts_that_forward_locks(forwarding: Hosts) -> None:
    cfg = BusConfig(bucket_num_chars=1, handler_concurrency=4, **POLL)
    runs = await _compete(forwarding.a, forwarding.b, cfg, 150)
    assert set(runs) == {str(i) for i in range(150)}
    assert max(runs.values()) == 1


@pytest.mark.asyncio
async def test_claim_by_rename_is_exact_where_locks_stay_local(local_locks: Hosts) -> None:
    cfg = BusConfig(bucket_num_chars=1, handler_concurrency=4, locking="rename", **POLL)
    runs = await _compete(local_locks.a, local_locks.b, cfg, 150)
    assert set(runs) == {str(i) for i in range(150)}
    assert max(runs.values()) == 1
    assert list((local_locks.backing / "fsbus" / "claims").rglob("*@*")) == []


def test_stress_fanout_and_chaos_across_mounts_that_forward_locks(
    forwarding: Hosts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The stress scenarios with their processes spread over two mounts."""
    from stress import chaos, fanout

    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    roots = [str(forwarding.a), str(forwarding.b)]
    for run in (fanout.run, chaos.run):
        s = run("small", config={"force_polling": True}, roots=roots)
        assert s.ok, s.line() + "\n" + "\n".join(s.violations)


def test_stress_workqueue_by_rename_across_mounts_whose_locks_stay_local(
    local_locks: Hosts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stress import workqueue

    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    roots = [str(local_locks.a), str(local_locks.b)]
    s = workqueue.run("small", config={"force_polling": True, "locking": "rename"}, roots=roots)
    assert s.ok, s.line() + "\n" + "\n".join(s.violations)
    assert s.delivered == s.sent
