"""A client whose view of a segment lags what it has already read (shared filesystems).

On CephFS through ceph-fuse, a reader that holds no lock can find a file shorter than it
read it a moment before, or a page of it stale, while another client appends: the
kernel drops the stale pages asynchronously. A handle never calls an offset it has read
out of range, and a closed segment that reads short is read again before it is called
corrupt; records are never skipped. The stale view is made through the I/O seam.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsbus import CorruptDataError, OffsetOutOfRange, Stream, StreamConfig
from fsbus._stream.ops import StreamOps
from fsbus._stream.segments import list_segments, read_index, segment_name
from tests.lagging_view import lagging_view, segment_sizes


class _StaleOps(StreamOps):
    """Reads of segment files see at most ``limit`` bytes, for ``stale_reads`` reads of
    records (header probes see the same, uncounted)."""

    def __init__(self) -> None:
        self.limit: int | None = None
        self.stale_reads = 1 << 30
        self.sleeps: list[float] = []
        self._segment_fds: set[int] = set()

    def open_ro(self, path: Path) -> int:
        fd = super().open_ro(path)
        if path.name.endswith(".log"):
            self._segment_fds.add(fd)
        else:
            self._segment_fds.discard(fd)
        return fd

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        data = super().pread(fd, n, pos)
        if self.limit is None or fd not in self._segment_fds or self.stale_reads <= 0:
            return data
        if pos + len(data) > self.limit:
            if n > 64:
                self.stale_reads -= 1
            return data[: max(self.limit - pos, 0)]
        return data

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def _config() -> StreamConfig:
    return StreamConfig(durability="none", segment_bytes=8192, index_interval_bytes=512)


def _fill(root: Path, n: int) -> None:
    with Stream.open(root, "s", config=_config()) as w:
        for i in range(n):
            w.append(f"{i}".encode().ljust(100))


def test_an_offset_already_read_stays_in_range_while_the_file_reads_short(
    tmp_path: Path,
) -> None:
    _fill(tmp_path, 50)  # one segment
    ops = _StaleOps()
    s = Stream._open(tmp_path, "s", config=_config(), create=False, ops=ops)
    try:
        assert [r.offset for r in s.read(0)] == list(range(50))
        ops.limit = 1000  # this client now sees the segment cut mid-way
        assert list(s.read(50)) == []  # nothing new yet, and no error
        assert s.end_offset == 50
        ops.limit = None
        _fill(tmp_path, 3)  # the appends become visible: reading goes on from there
        assert [r.value.strip() for r in s.read(50)] == [b"0", b"1", b"2"]
    finally:
        s.close()
    # A handle that has read nothing sees only what the files show it.
    ops = _StaleOps()
    ops.limit = 1000
    fresh = Stream._open(tmp_path, "s", config=_config(), create=False, ops=ops)
    try:
        with pytest.raises(OffsetOutOfRange, match="valid offsets are 0"):
            fresh.read(50)
    finally:
        fresh.close()


def test_a_closed_segment_that_reads_short_for_a_moment_is_read_again(
    tmp_path: Path,
) -> None:
    _fill(tmp_path, 300)
    bases = list_segments(StreamOps(), tmp_path / "streams" / "s")
    assert len(bases) >= 3
    ops = _StaleOps()
    ops.limit = 2000  # every segment reads short at first ...
    ops.stale_reads = 2  # ... for two reads, then whole
    s = Stream._open(tmp_path, "s", config=_config(), create=False, ops=ops)
    try:
        values = [int(r.value) for r in s.read(0)]
    finally:
        s.close()
    assert values == list(range(300))  # none skipped, none twice
    assert ops.sleeps  # it waited before reading again


def test_a_closed_segment_cut_between_records_is_corrupt_not_skipped(tmp_path: Path) -> None:
    _fill(tmp_path, 300)
    sdir = tmp_path / "streams" / "s"
    bases = list_segments(StreamOps(), sdir)
    cut_at = read_index(StreamOps(), sdir, bases[0])[-1]  # a record boundary
    os.truncate(sdir / segment_name(bases[0]), cut_at.position)
    ops = _StaleOps()
    s = Stream._open(tmp_path, "s", config=_config(), create=False, ops=ops)
    try:
        with pytest.raises(CorruptDataError) as info:
            list(s.read(0))
    finally:
        s.close()
    msg = str(info.value)
    assert f"records from offset {cut_at.offset} to {bases[1]} are unreadable" in msg
    assert f"read from offset {bases[1]}" in msg
    assert len(ops.sleeps) == 3  # read again, later each time, before giving up
    # Reading from the next segment on still works, as the error says.
    s = Stream._open(tmp_path, "s", config=_config(), create=False, ops=ops)
    try:
        assert int(next(s.read(bases[1])).value) == bases[1]
    finally:
        s.close()


class _LaggingHost:
    """Every handle of the process sees segments cut at ``limit`` bytes for the first
    ``reads`` reads of records (StreamOps patched on the class: Spark's read opens its
    own handle)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int, reads: int) -> None:
        self.limit, self.left = limit, reads
        real = StreamOps.pread

        def pread(ops: StreamOps, fd: int, n: int, pos: int) -> bytes:
            data = real(ops, fd, n, pos)
            if self.left > 0 and n > 64 and pos + len(data) > self.limit:
                self.left -= 1
                return data[: max(self.limit - pos, 0)]
            return data

        monkeypatch.setattr(StreamOps, "pread", pread)


def _spark_range(root: Path, stop: int, *, fail_on_data_loss: bool = True) -> list[int]:
    spark = pytest.importorskip("fsbus.spark._stream_source")
    part = spark.StreamRangePartition(
        root=str(root), stream="s", start=0, stop=stop, fail_on_data_loss=fail_on_data_loss
    )
    return [o for b in spark.read_range(part) for o in b.column("offset").to_pylist()]


def test_a_spark_task_reads_its_whole_range_through_a_lagging_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver planned [0, 50) from its view; the task's host sees the segment cut
    for its first two reads: it reads on from where the view ended, nothing twice."""
    _fill(tmp_path, 50)
    host = _LaggingHost(monkeypatch, limit=1000, reads=2)
    assert _spark_range(tmp_path, 50) == list(range(50))
    assert host.left == 0  # the view did lag


def test_a_spark_task_whose_range_stays_unreadable_fails_or_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fill(tmp_path, 50)
    spark = pytest.importorskip("fsbus.spark._stream_source")
    monkeypatch.setattr(spark, "LAGGING_VIEW_WAITS", (0.01, 0.01))
    _LaggingHost(monkeypatch, limit=1000, reads=1 << 30)
    with pytest.raises(OffsetOutOfRange, match=r"offsets \d+\.\.49, planned for this task"):
        _spark_range(tmp_path, 50)
    with caplog.at_level("WARNING", logger="fsbus.spark"):
        got = _spark_range(tmp_path, 50, fail_on_data_loss=False)
    assert got == list(range(len(got)))
    assert 0 < len(got) < 50
    assert "skipped (failOnDataLoss=false)" in caplog.text


@pytest.mark.parametrize("heal_after", [0, 3, None])
def test_read_through_reads_to_the_locked_end_or_says_what_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heal_after: int | None
) -> None:
    _fill(tmp_path, 20)
    with Stream.open(tmp_path, "s", config=_config()) as s:
        sizes = segment_sizes(s.path)
    _fill(tmp_path, 30)  # appended on "another host": this one's view ends at 20
    with lagging_view(monkeypatch, sizes, heal_after=heal_after or None) as view:
        s = Stream.open(tmp_path, "s", config=_config(), create=False)
        try:
            if heal_after == 0:
                view.heal_after = 0  # no lag at all: no pause either
            else:
                assert s.end_offset == 20  # what this host's view shows
            assert s.locked_end_offset() == 50  # what the append lock shows
            got: list[int] = []
            if heal_after is None:
                with pytest.raises(OffsetOutOfRange, match=r"offsets 20\.\.49 exist"):
                    got.extend(r.offset for r in s.read_through(0, 50))
                assert got == list(range(20))  # what it could read, before the error
                assert sum(view.sleeps) == pytest.approx(5.0, abs=0.5)
            else:
                got.extend(r.offset for r in s.read_through(5, 50))
                assert got == list(range(5, 50))
                assert len(view.sleeps) == heal_after
        finally:
            s.close()
