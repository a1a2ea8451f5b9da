"""Crash recovery and corruption: torn tails cut and reported, corruption reported."""

from __future__ import annotations

import errno
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import Worker
from stream_workers import BIG, big_values

from fsbus import (
    CorruptDataError,
    DiskFull,
    LockingUnsupported,
    StorageError,
    Stream,
    StreamConfig,
)
from fsbus._stream.ops import StreamOps

FAST = StreamConfig(durability="none", segment_bytes=64 << 10, index_interval_bytes=1024)


def _segments(root: Path, name: str = "s") -> list[Path]:
    return sorted((root / "streams" / name).glob("*.log"))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["small", "batch", "values"])
def test_sigkill_mid_frame_is_cut_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """``small``: short records; ``batch`` and ``values``: 10 KB records written from one
    joined buffer (append_batch) and from a head and a slice per frame (append_values)."""
    w = Worker("torn", tmp_path, "s", how)
    try:
        committed = int(w.expect("committed")[1])
        _, pos, written = w.expect("torn")
        os.kill(w.proc.pid, signal.SIGKILL)
        assert w.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        w.stop()
    seg = _segments(tmp_path)[-1]
    assert seg.stat().st_size == int(pos) + int(written)
    kept = [b"committed"] * committed if how == "small" else big_values("committed", committed)
    with Stream.open(tmp_path, "s", config=FAST if how == "small" else BIG) as s:
        # readers never see the partial frame
        assert [r.value for r in s.read()] == kept
        with caplog.at_level(logging.WARNING, logger="fsbus.stream"):
            (info,) = s.recover()
        assert info.cut_bytes == int(written)
        assert info.position == int(pos)
        assert info.next_offset == committed
        assert "cut a torn tail of" in caplog.text
        assert s.append(b"after") == committed
        assert [r.value for r in s.read()] == [*kept, b"after"]
    assert seg.stat().st_size > int(pos)


@pytest.mark.slow
def test_sigkill_at_a_random_point_loses_nothing_committed(tmp_path: Path) -> None:
    w = Worker("forever", tmp_path, "s")
    try:
        last = 0
        for _ in range(30):
            last = int(w.expect("ok")[1])
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait(timeout=30)
        while (line := w.lines.get(timeout=30)) is not None:
            # The kill can cut the child's last line short ("ok 12" of "ok 123", or "o"):
            # a cut line says no more than the complete one before it.
            parts = line.split()
            if len(parts) == 2 and parts[0] == "ok" and parts[1].isdigit():
                last = max(last, int(parts[1]))
    finally:
        w.stop()
    with Stream.open(tmp_path, "s", config=FAST) as s:
        s.recover()
        end = s.end_offset
        assert end >= last
        values = [r.value for r in s.read()]
        assert values == [f"v{j}".encode() * 20 for j in range(end)]
        assert s.append(b"x") == end


def test_truncated_segment_is_cut(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s", config=FAST) as s:
        s.append_batch([b"a" * 10] * 5)
        s.append_batch([b"b" * 10] * 5)
    seg = _segments(tmp_path)[0]
    size = seg.stat().st_size
    os.truncate(seg, size - 7)
    with Stream.open(tmp_path, "s", config=FAST) as s:
        assert s.end_offset == 5
        assert [r.value for r in s.read()] == [b"a" * 10] * 5
        assert s.append(b"c") == 5  # the first append cuts the tail
        (info,) = s.recoveries
        assert info.cut_bytes == size - 7 - info.position
        assert info.reason == "a frame is cut short"
        assert [r.offset for r in s.read()] == list(range(6))


def test_a_segment_hard_linked_to_an_outside_file_is_refused_untouched(tmp_path: Path) -> None:
    # A peer replaces a segment with a link to a file it can see: recovery would cut the
    # "torn tail" (truncating that file) and reads would hand its bytes out as records.
    with Stream.open(tmp_path, "s", config=FAST) as s:
        s.append_batch([b"a" * 10] * 5)
    seg = _segments(tmp_path)[0]
    outside = tmp_path / "precious"
    outside.write_bytes(seg.read_bytes() + b"not a frame, do not cut me")
    seg.unlink()
    os.link(outside, seg)
    before = outside.read_bytes()
    with Stream.open(tmp_path, "s", config=FAST) as s:
        with pytest.raises(StorageError, match="hard link") as err:
            list(s.read())
        assert "remove this name" in str(err.value)
        with pytest.raises(StorageError, match="hard link"):
            s.append(b"x")
    assert outside.read_bytes() == before
    assert outside.stat().st_nlink == 2


def test_zeroed_tail_is_cut(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s", config=FAST) as s:
        s.append_batch([b"a"] * 3)
    seg = _segments(tmp_path)[0]
    with seg.open("ab") as f:
        f.write(b"\0" * 4096)  # what a machine crash can leave after the last write
    with Stream.open(tmp_path, "s", config=FAST) as s:
        assert s.end_offset == 3
        (info,) = s.recover()
        assert info.cut_bytes == 4096
        assert s.recover() == ()


def test_corruption_in_a_closed_segment_is_reported(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        for i in range(200):
            s.append(f"record-{i}".encode() * 3)
    first = _segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with Stream.open(tmp_path, "s", config=cfg) as s:
        with pytest.raises(CorruptDataError) as err:
            list(s.read())
        assert err.value.path == str(first)
        assert "restore the file" in str(err.value)
        # the segments after it still read
        later = s.info().segments[1].base_offset
        assert next(s.read(later)).offset == later


def test_corruption_before_valid_frames_stops_appends(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s", config=FAST) as s:
        s.append_batch([b"one" * 100] * 3)
        s.append_batch([b"two" * 100] * 3)
    seg = _segments(tmp_path)[0]
    data = bytearray(seg.read_bytes())
    data[100] ^= 0x01  # inside the first frame; a valid frame follows
    seg.write_bytes(bytes(data))
    with Stream.open(tmp_path, "s", config=FAST) as s:
        with pytest.raises(CorruptDataError, match="not a torn tail") as err:
            s.append(b"x")
        assert err.value.path == str(seg)
    assert seg.read_bytes() == bytes(data)  # nothing was cut


def test_stale_index_is_ignored(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", index_interval_bytes=64)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        for i in range(50):
            s.append(str(i).encode())
    idx = next((tmp_path / "streams" / "s").glob("*.index"))
    idx.write_bytes(idx.read_bytes()[:-5] + b"\xff" * 53)  # torn and garbage entries
    with Stream.open(tmp_path, "s", config=cfg) as s:
        assert [r.value for r in s.read(25, 28)] == [b"25", b"26", b"27"]
        assert s.append(b"50") == 50
        assert [r.offset for r in s.read(40)] == list(range(40, 51))


class _FullDisk(StreamOps):
    """Writes part of a big write, then fails with ENOSPC (a filesystem filling up)."""

    full = False

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
        if self.full and len(data) > 100:
            super().pwrite(fd, memoryview(data)[:50], pos)
            raise OSError(errno.ENOSPC, "No space left on device")
        super().pwrite(fd, data, pos)

    def pwritev(self, fd: int, parts: Sequence[bytes | bytearray | memoryview], pos: int) -> None:
        if self.full:
            # the first buffer (a frame's head) and half of the next
            super().pwritev(fd, [parts[0], memoryview(parts[1])[: len(parts[1]) // 2]], pos)
            raise OSError(errno.ENOSPC, "No space left on device")
        super().pwritev(fd, parts, pos)


@pytest.mark.parametrize("how", ["small", "batch", "values"])
def test_disk_full_leaves_no_partial_frame(tmp_path: Path, how: str) -> None:
    ops = _FullDisk()
    s = Stream._open(tmp_path, "s", config=FAST if how == "small" else BIG, create=True, ops=ops)
    kept = [b"kept"] * 3 if how == "small" else big_values("kept", 3)
    failed = [b"x" * 100] * 3 if how == "small" else big_values("x", 200)  # several frames

    def write() -> object:
        if how == "values":
            return s.append_values(b"".join(failed), [len(v) for v in failed])
        return s.append_batch(failed)

    try:
        s.append_batch(kept)
        size = _segments(tmp_path)[0].stat().st_size
        ops.full = True
        with pytest.raises(DiskFull, match="free space") as err:
            write()
        assert isinstance(err.value.__cause__, OSError)
        assert err.value.path is not None
        assert err.value.path.endswith(".log")
        assert _segments(tmp_path)[0].stat().st_size == size
        ops.full = False
        assert s.recover() == ()  # the failed append cut its own partial frame
        assert s.append(b"after") == 3
        assert [r.value for r in s.read()] == [*kept, b"after"]
    finally:
        s.close()


class _NoFlock(StreamOps):
    """A mount whose flock fails with ENOLCK (some NFS set-ups without a lock manager)."""

    def lock(self, fd: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")


def test_a_mount_without_flock_is_reported(tmp_path: Path) -> None:
    s = Stream._open(tmp_path, "s", config=FAST, create=True, ops=_NoFlock())
    try:
        with pytest.raises(LockingUnsupported, match="does not support flock") as err:
            s.append(b"x")
        assert err.value.path is not None
        assert err.value.path.endswith("append.lock")
        assert list(s.read()) == []
    finally:
        s.close()
