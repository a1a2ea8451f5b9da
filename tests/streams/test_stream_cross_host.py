"""Two "hosts" appending to and following one stream through two mounts of a directory.

bindfs (FUSE) with ``--enable-lock-forwarding`` gives two views of one directory whose
flocks exclude each other, like two NFS clients with a lock manager; inotify on one
mount does not see writes made through the other, so following relies on polling.
Needs root, /dev/fuse and bindfs.
"""

from __future__ import annotations

import queue
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import Worker

from fsbus import AsyncStream, RecordIn, Stream, StreamConfig
from tests.bindfs_mounts import mount_pair

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(backing directory, host A's mount, host B's mount), flocks forwarded."""
    yield from mount_pair(tmp_path, forward_locks=True)


def test_appenders_on_two_mounts(mounts: tuple[Path, Path, Path]) -> None:
    backing, a, b = mounts
    count = 400
    ws = [
        Worker("append", root, "s", f"{tag}{i}", count)
        for tag, root in (("a", a), ("b", b))
        for i in range(2)
    ]
    try:
        for w in ws:
            w.expect("ready")
        for w in ws:
            w.send("go")
        for w in ws:
            w.expect("done", timeout=110)
    finally:
        for w in ws:
            w.stop()
    with Stream.open(backing, "s", create=False) as s:
        recs = list(s.read())
    assert [r.offset for r in recs] == list(range(4 * count))
    counts = Counter(r.value for r in recs)
    assert len(counts) == 4 * count
    assert max(counts.values()) == 1


@pytest.mark.anyio
async def test_follow_on_one_mount_sees_appends_made_on_the_other(
    mounts: tuple[Path, Path, Path],
) -> None:
    _, a, b = mounts
    cfg = StreamConfig(durability="none", force_polling=True, poll_interval=0.05)
    got: list[bytes] = []
    async with AsyncStream(b, "f", config=cfg) as reader, AsyncStream(a, "f", config=cfg) as w:
        with anyio.fail_after(60):
            async with reader.follow(start=0, stop=3) as records:
                await w.append_batch([b"1", b"2", b"3"])
                got = [r.value async for r in records]
    assert got == [b"1", b"2", b"3"]


def test_a_group_shared_by_consumers_on_two_mounts(mounts: tuple[Path, Path, Path]) -> None:
    backing, a, b = mounts
    n = 200
    events: queue.Queue[tuple[int, str | None]] = queue.Queue()
    ws = [
        Worker("consume", root, "s", "g", f"c-{i}", 30.0, sink=events, tag=i)
        for i, root in enumerate((a, b))
    ]
    got: Counter[int] = Counter()
    try:
        for w in ws:
            w.expect("ready")
        with Stream.open(backing, "s", config=StreamConfig(durability="none")) as s:
            for i in range(0, n, 20):
                s.append_batch([RecordIn(f"r{j}", key=f"k{j % 7}") for j in range(i, i + 20)])
        while len(got) < n:
            try:
                _, line = events.get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"{n - len(got)} records never delivered") from None
            assert line is not None, "a consumer died"
            if line.startswith("got"):
                got[int(line.split()[1])] += 1
    finally:
        for w in ws:
            w.stop()
    assert sorted(got) == list(range(n))
    assert max(got.values()) == 1
