"""A full disk: publish fails with DiskFull, nothing published is lost, the bus recovers.

On a real 8 MiB / 200-inode tmpfs (root only) and, everywhere, through the I/O seam.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from fsbus import Bus, BusConfig, DiskFull
from fsbus._bus.ops import Ops

from .conftest import WAIT, Inbox, until

SMALL = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05)
"""16 buckets: the layout fits in a 200-inode filesystem."""


async def _fill(bus: Bus, size: int, count: int) -> tuple[dict[str, bytes], DiskFull]:
    """Publish until the disk is full; returns what went in and the error."""
    published: dict[str, bytes] = {}
    for i in range(count):
        data = os.urandom(size) if size else b"x" * (i % 7)
        try:
            info = await bus.publish(f"fill.{i}", data, single=bool(size))
        except DiskFull as exc:
            return published, exc
        published[info.name] = data
    raise AssertionError(f"{count} messages fitted: the disk never filled")


def _contents(root: Path) -> dict[str, bytes]:
    out = {}
    for bucket in (root / "messages").iterdir():
        for f in bucket.iterdir():
            out[f.name] = f.read_bytes()
    return out


@pytest.mark.root
@pytest.mark.anyio
async def test_out_of_bytes_publish_fails_clearly_nothing_lost_then_recovers(
    small_fs: Path,
) -> None:
    root = small_fs / "bus"
    inbox = Inbox()
    async with Bus(root, config=SMALL) as bus:
        published, err = await _fill(bus, 512 * 1024, 100)
        assert "full" in str(err)
        assert err.path is not None
        assert isinstance(err.__cause__, OSError)
        assert err.__cause__.errno == errno.ENOSPC
        assert 5 < len(published) < 16
        # Nothing half-written stays behind, and every earlier message is intact.
        assert os.listdir(root / "staging") == []
        assert _contents(root) == {n: b"\x00" + d for n, d in published.items()}
        # Consumers free space; publishing works again.
        await bus.subscribe("fill.#", inbox)
        await inbox.wait(len(published))
        assert {m.name: m.payload for m in inbox.messages} == published
        await until(lambda: not _contents(root))
        info = await bus.publish("after.full", os.urandom(512 * 1024), single=True)
        assert (root / "messages" / info.bucket / info.name).exists()


@pytest.mark.root
@pytest.mark.anyio
async def test_out_of_inodes_publish_fails_clearly_and_recovers(small_fs: Path) -> None:
    root = small_fs / "bus"
    async with Bus(root, config=SMALL) as bus:
        published, err = await _fill(bus, 0, 400)
        assert "full" in str(err)
        assert 20 < len(published) < 200
        assert os.listdir(root / "staging") == []
        assert _contents(root) == {n: b"\x00" + d for n, d in published.items()}
        names = list(published)
        # Long topics need a second file: that fails cleanly too, leaving no sidecar.
        with pytest.raises(DiskFull):
            await bus.publish("long." + "y" * 300, b"z")
        assert not any((root / "topics").rglob("*@l+*"))
        # Free a few inodes; a long topic now fits again.
        for n in names[:5]:
            next((root / "messages").glob(f"*/{n}")).unlink()
        info = await bus.publish("long." + "y" * 300, b"z")
        assert (root / "topics" / info.bucket / info.name).exists()


def fill_inodes(fs: Path) -> Path:
    """Take every free inode of ``fs`` with empty files in ``fs/filler``, named 0, 1, ...
    (free some again by removing them); returns that folder."""
    filler = fs / "filler"
    filler.mkdir()
    with contextlib.suppress(OSError):  # ENOSPC: none left
        for i in range(1000):
            (filler / str(i)).touch()
    return filler


@pytest.mark.root
@pytest.mark.anyio
async def test_bus_that_cannot_create_its_layout_says_disk_full(small_fs: Path) -> None:
    # Every inode taken but a few: not enough for the layout's dozen directories.
    filler = fill_inodes(small_fs)
    for i in range(3):
        (filler / str(i)).unlink()
    with pytest.raises(DiskFull, match="creating the bus directory"):
        async with Bus(small_fs / "bus"):
            pass


@pytest.mark.root
@pytest.mark.anyio
async def test_a_bucket_that_cannot_be_made_says_disk_full_and_leaves_nothing(
    small_fs: Path,
) -> None:
    """Buckets are made when their first message comes (on a local mount): a disk with
    no inode left for one refuses the publish with DiskFull naming the bucket, and
    leaves no staged file behind."""
    root = small_fs / "bus"
    async with Bus(root) as bus:
        filler = fill_inodes(small_fs)
        (filler / "0").unlink()  # room for the staged file, not for its bucket too
        with pytest.raises(DiskFull, match=r"messages/[0-9a-f]{2}"):
            await bus.publish("t", b"x")
        assert list((root / "staging").iterdir()) == []
        assert list((root / "messages").iterdir()) == []
        (filler / "1").unlink()
        (filler / "2").unlink()
        info = await bus.publish("t", b"x")  # room again: the bucket is made
        assert (root / "messages" / info.bucket / info.name).read_bytes() == b"\x00x"


class FullDisk(Ops):
    """A disk that is full while ``full`` is set: writes and creates fail with ENOSPC."""

    def __init__(self) -> None:
        self.full = False

    def _check(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        if flags & os.O_CREAT and "/staging/" in path:
            self._check()
        return super().open(path, flags, mode)

    def writev(self, fd: int, buffers: object) -> int:  # type: ignore[override]
        self._check()
        return super().writev(fd, buffers)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_injected_full_disk_recovers_and_subscribers_keep_going(tmp_path: Path) -> None:
    ops = FullDisk()
    inbox = Inbox()
    async with Bus(tmp_path / "bus", config=SMALL, ops=ops) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("before", b"1")
        ops.full = True
        for _ in range(3):
            with pytest.raises(DiskFull, match="free space"):
                await bus.publish("during", b"2")
        ops.full = False
        await bus.publish("after", b"3")
        await inbox.wait(2)
        assert sorted(inbox.topics) == ["after", "before"]
        assert os.listdir(tmp_path / "bus" / "staging") == []


@pytest.mark.root
@pytest.mark.slow
def test_work_queue_under_load_on_a_full_disk_loses_nothing(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishers keep hitting ENOSPC while workers consume and free space.

    The filesystem (200 inodes) is filled first but for 60: the bus's folders (about 45
    with one-character buckets) and a few messages fit. With all 200 free, workers as
    fast as publishers kept the disk from filling in some runs (a CI run saw it full
    0 times; on this machine 6 times in one run, 33-164 with 60-80 left)."""
    from stress import workqueue

    filler = small_fs / "filler"
    filler.mkdir()
    while os.statvfs(small_fs).f_ffree > 60:
        (filler / str(len(os.listdir(filler)))).touch()
    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    s = workqueue.run(
        "small", config={"bucket_num_chars": 1}, roots=[str(small_fs)], retry_when_full=True
    )
    assert s.ok, s.line() + "\n" + "\n".join(s.violations)
    assert s.delivered == s.sent == 300
    assert s.notes.get("disk_full", 0) > 0  # the disk really was full, often


@pytest.mark.root
def test_a_queues_first_consumer_starts_on_a_full_disk_and_frees_space(small_fs: Path) -> None:
    """A durable queue filled until the disk is full, then its first consumer from this
    host starts (it records the host's name in the queue's bus, which a full disk
    refused, and the consumer could not start: the very thing that frees space), takes
    every message once, and publishing works again."""
    from fsbus import BlockingBus, DiskFull, StorageError

    root = small_fs / "bus"
    published = []
    with BlockingBus(root, config=SMALL) as bus:
        bus.declare_queue("q", ["t.#"])
        queue_hosts = root / "fsbus" / "queues" / "q" / "bus" / "fsbus" / "hosts"
        for size in (200_000, 20_000, 1_000, 0):  # every page: no file fits any more
            for _ in range(1000):
                tag = f"{len(published):04d}".encode()
                try:
                    bus.publish("t.x", tag + b"z" * size, ttl=3600)
                except (DiskFull, StorageError):
                    break
                published.append(tag)
            else:
                raise AssertionError("the disk never filled")
        assert published
        with contextlib.suppress(OSError), open(small_fs / "filler", "wb") as f:
            while True:  # the last pages too (a failed publish gave its own back)
                f.write(b"f" * 4096)
                f.flush()
        assert not any(queue_hosts.iterdir())  # no consumer from here yet
        got = []
        with bus.messages(queue="q") as it:
            for _ in published:
                msg = it.get(timeout=WAIT)
                got.append(msg.payload[:4])
                it.ack(msg)
        assert got == published
        bus.publish("t.x", b"after")  # space again
        assert bus.queue_info("q").depth == 1
