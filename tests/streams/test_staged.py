"""Staged segments: records framed away from the append lock, then appended whole.

A large staged file becomes a segment of the stream by a rename (its data is not copied),
a small one is written at the end of the newest segment; either way every record gets
the next offsets, readers and other writers see them as any append, and a file is gone
from its staged name once its records are in the stream.
"""

from __future__ import annotations

import errno
from array import array
from pathlib import Path
from typing import Any

import pytest

from fsbus import (
    CorruptDataError,
    DiskFull,
    PayloadTooLarge,
    RecordIn,
    StagedSegment,
    StorageError,
    Stream,
    StreamConfig,
    UsageError,
    read_staged_columns,
)
from fsbus._stream.ops import StreamOps


def values(n: int, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i:06d}".encode() for i in range(n)]


def stage(stream: Stream, prefix: str, items: list[bytes]) -> list[StagedSegment]:
    stager = stream.stager(prefix)
    stager.add_values(b"".join(items), array("I", map(len, items)))
    return stager.finish()


def segment_files(root: Path, name: str = "s") -> list[str]:
    return sorted(p.name for p in (root / "streams" / name).glob("*.log"))


def test_a_large_staged_segment_is_renamed_in(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        stream.append(b"first")
        stager = stream.stager("task0")
        plain = values(20_000)
        stager.add_values(b"".join(plain), array("I", map(len, plain)))
        stager.add_records(
            [b"plain", RecordIn(value=b"keyed", key=b"k", headers={"h": "1"}, timestamp=5.0)]
        )
        staged = stager.finish()
        assert [s.records for s in staged] == [20_002]
        assert stream.staged() == [staged[0].path]
        assert stream.end_offset == 1  # staged records are not in the stream yet
        inode = Path(staged[0].path).stat().st_ino
        assert stream.append_staged(staged, copy_below=1) == range(1, 20_003)
        stream.append(b"last")
        records = list(stream.read())
        middle = next(iter(stream.read(10_000)))
        assert stream.staged() == []
    seg = tmp_path / "streams" / "s" / "00000000000000000001.log"
    assert seg.stat().st_ino == inode  # the file itself, not a copy
    assert [r.offset for r in records] == list(range(20_004))
    assert [r.value for r in records] == [b"first", *plain, b"plain", b"keyed", b"last"]
    assert (records[20_002].key, dict(records[20_002].headers)) == (b"k", {"h": "1"})
    assert records[20_002].timestamp == 5.0
    assert (middle.offset, middle.value) == (10_000, plain[9_999])  # found through the index
    with Stream.open(tmp_path, "s", create=False) as stream:  # a fresh handle agrees
        assert stream.end_offset == 20_004
        assert [r.value for r in stream.read(20_001, 20_004)] == [b"plain", b"keyed", b"last"]


def test_a_small_staged_segment_is_copied_into_the_newest_segment(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        stream.append(b"first")
        staged = stage(stream, "t", values(100))
        assert stream.append_staged(staged) == range(1, 101)  # under copy_below: copied
        assert [r.value for r in stream.read()] == [b"first", *values(100)]
        assert stream.staged() == []
    assert segment_files(tmp_path) == ["00000000000000000000.log"]


def test_a_new_stream_takes_a_staged_segment_as_its_first(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        assert stream.append_staged(stage(stream, "t", values(10)), copy_below=0) == range(10)
        assert stream.append(b"next") == 10
        assert [r.value for r in stream.read()] == [*values(10), b"next"]
    assert segment_files(tmp_path) == ["00000000000000000000.log"]


def test_the_stager_cuts_files_at_the_segment_size(tmp_path: Path) -> None:
    config = StreamConfig(segment_bytes=8192, max_frame_bytes=1024)
    with Stream.open(tmp_path, "s", config=config) as stream:
        stager = stream.stager("t")
        batches = [values(200, tag=f"b{b}-") for b in range(6)]
        for batch in batches:
            stager.add_values(b"".join(batch), array("I", map(len, batch)))
        staged = stager.finish()
        assert len(staged) > 1
        assert all(s.size <= 8192 for s in staged)
        assert sum(s.records for s in staged) == 1200
        assert stream.append_staged(staged, copy_below=0) == range(1200)
        assert [r.value for r in stream.read()] == [v for batch in batches for v in batch]
    assert len(segment_files(tmp_path)) == len(staged)


def test_producers_stage_in_parallel_and_appends_keep_their_order(tmp_path: Path) -> None:
    """Two producers (two handles, as two processes) stage at once; the files are
    appended in the order given, each file's records together."""
    with Stream.open(tmp_path, "s") as a, Stream.open(tmp_path, "s") as b:
        sa, sb = a.stager("a"), b.stager("b")
        for i in range(3):
            sa.add_records([f"a{i}".encode()])
            sb.add_records([f"b{i}".encode()])
        staged_a, staged_b = sa.finish(), sb.finish()
        assert len(a.staged()) == 2
        assert a.append_staged([*staged_b, *staged_a], copy_below=0) == range(6)
        assert [r.value for r in b.read()] == [b"b0", b"b1", b"b2", b"a0", b"a1", b"a2"]


def test_other_writers_append_after_a_renamed_segment(tmp_path: Path) -> None:
    """A writer whose handle knew the old newest segment finds the renamed one and
    appends after it: nothing is written over, no offset is given twice."""
    with Stream.open(tmp_path, "s") as other, Stream.open(tmp_path, "s") as stager_side:
        other.append(b"a")
        staged = stage(stager_side, "t", values(1000))
        assert stager_side.append_staged(staged, copy_below=0) == range(1, 1001)
        assert other.append(b"b") == 1001
        assert stager_side.append(b"c") == 1002
        assert other.end_offset == 1003
    with Stream.open(tmp_path, "s", create=False) as stream:
        assert [r.value for r in stream.read()] == [b"a", *values(1000), b"b", b"c"]


def test_a_reader_reads_on_into_a_renamed_segment(tmp_path: Path) -> None:
    """A handle that read the stream before a segment was renamed in reads on into it."""
    with Stream.open(tmp_path, "s") as writer, Stream.open(tmp_path, "s") as reader:
        writer.append(b"a")
        assert [r.value for r in reader.read()] == [b"a"]
        assert reader.end_offset == 1
        writer.append_staged(stage(writer, "t", values(500)), copy_below=0)
        writer.append(b"z")
        assert reader.end_offset == 502
        assert [r.value for r in reader.read(1)] == [*values(500), b"z"]


class _FailingRename(StreamOps):
    """The rename of the n-th staged segment into a segment fails (an I/O error)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.renames = 0

    def rename(self, src: Path, dst: Path) -> None:
        if src.name.endswith(".seg") and dst.name.endswith(".log"):
            self.renames += 1
            if self.renames == self.fail_at:
                raise OSError(errno.EIO, "Input/output error")
        super().rename(src, dst)


def test_a_failed_rename_leaves_the_file_to_append_again(tmp_path: Path) -> None:
    stream = Stream._open(
        tmp_path, "s", config=StreamConfig(), create=True, ops=_FailingRename(fail_at=2)
    )
    try:
        first = stage(stream, "a", values(300, "a"))
        second = stage(stream, "b", values(300, "b"))
        with pytest.raises(StorageError, match="append staged records"):
            stream.append_staged([*first, *second], copy_below=0)
        assert stream.staged() == [second[0].path]  # rebased already: appended again below
        stream.append(b"foreign")
        assert stream.append_staged(second, copy_below=0) == range(301, 601)
        want = [*values(300, "a"), b"foreign", *values(300, "b")]
        assert [r.value for r in stream.read()] == want
    finally:
        stream.close()


def test_a_corrupt_staged_segment_is_refused_and_nothing_is_appended(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        stream.append(b"first")
        staged = stage(stream, "t", values(100))
        path = Path(staged[0].path)
        raw = bytearray(path.read_bytes())
        raw[200] ^= 0xFF
        path.write_bytes(bytes(raw))
        with pytest.raises(CorruptDataError, match="fails its checksum") as err:
            stream.append_staged(staged, copy_below=0)
        assert str(path) in str(err.value)
        assert "stage the records again" in str(err.value)
        assert stream.end_offset == 1
        assert stream.append(b"second") == 1
        assert path.read_bytes() == bytes(raw)  # left as it was, for a look
        with pytest.raises(CorruptDataError):
            list(read_staged_columns(path))
        assert stream.remove_staged(stream.staged()) == 1


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.seg"
    outside.write_bytes(b"")
    with Stream.open(tmp_path, "s") as stream:
        with pytest.raises(UsageError, match="not a staged segment of stream 's'"):
            stream.append_staged([outside])
        planted = tmp_path / "streams" / "s" / ".staged.x.0.seg"
        planted.write_bytes(b"hello, this is not a frame" * 10)
        with pytest.raises(CorruptDataError, match="not a frame header"):
            stream.append_staged([planted], copy_below=0)
        with pytest.raises(UsageError, match="not a staged file"):
            stream.remove_staged([tmp_path / "streams" / "s" / "00000000000000000000.log"])
        assert stream.end_offset == 0


def test_a_bad_prefix_is_refused(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        for bad in ("", ".hidden", "a/b", "x" * 201):
            with pytest.raises(UsageError, match="stager prefix"):
                stream.stager(bad)


def test_read_staged_columns_gives_the_records(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        stager = stream.stager("t", durable=False)
        stager.add_records([b"a", RecordIn(value=b"b", key=b"k"), b"c"])
        [seg] = stager.finish()
    batches = list(read_staged_columns(seg.path))
    assert [v for b in batches for v in b.values] == [b"a", b"b", b"c"]
    assert [k for b in batches for k in b.keys] == [None, b"k", None]


def test_the_stager_refuses_a_record_too_large_and_abort_removes_its_files(
    tmp_path: Path,
) -> None:
    with Stream.open(tmp_path, "s", config=StreamConfig(max_record_bytes=1000)) as stream:
        stager = stream.stager("t")
        stager.add_values(b"x" * 10, array("I", [10]))
        with pytest.raises(PayloadTooLarge, match="max_record_bytes=1000"):
            stager.add_values(b"y" * 2000, array("I", [2000]))
        with pytest.raises(PayloadTooLarge):
            stager.add_records([b"z" * 2000])
        assert len(stream.staged()) == 1  # the file being written
        stager.abort()
        assert stream.staged() == []


def test_nothing_staged_appends_nothing(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as stream:
        assert stream.stager("t").finish() == []
        assert stream.append_staged([]) == range(0)


class _NoMap(StreamOps):
    """A mount that cannot map a file shared (some FUSE filesystems with direct I/O)."""

    def map_rw(self, fd: int, size: int) -> Any:
        raise OSError(errno.ENODEV, "No such device")


@pytest.mark.parametrize("copy_below", [0, 1 << 30])
def test_staged_segments_are_appended_where_files_cannot_be_mapped(
    tmp_path: Path, copy_below: int
) -> None:
    stream = Stream._open(tmp_path, "s", config=StreamConfig(), create=True, ops=_NoMap())
    try:
        stream.append(b"first")
        staged = stage(stream, "t", values(700))
        assert stream.append_staged(staged, copy_below=copy_below) == range(1, 701)
        assert stream.append(b"last") == 701
    finally:
        stream.close()
    with Stream.open(tmp_path, "s", create=False) as fresh:  # checksums hold on disk
        assert [r.value for r in fresh.read()] == [b"first", *values(700), b"last"]
    assert len(segment_files(tmp_path)) == (2 if copy_below == 0 else 1)


def test_a_corrupt_file_among_several_appends_none_of_them(tmp_path: Path) -> None:
    """Every file is checked before any is appended."""
    with Stream.open(tmp_path, "s") as stream:
        good = stage(stream, "a", values(300, "a"))
        bad = stage(stream, "b", values(300, "b"))
        raw = bytearray(Path(bad[0].path).read_bytes())
        raw[-1] ^= 0xFF
        Path(bad[0].path).write_bytes(bytes(raw))
        with pytest.raises(CorruptDataError, match="fails its checksum"):
            stream.append_staged([*good, *bad], copy_below=0)
        assert stream.end_offset == 0
        assert stream.staged() == [good[0].path, bad[0].path]
        assert stream.append_staged(good, copy_below=0) == range(300)  # the good one, later
        assert [r.value for r in stream.read()] == values(300, "a")


def test_large_files_are_rebased_side_by_side_and_appended_in_order(tmp_path: Path) -> None:
    """Files of 16 MiB or more in all are checked and rebased in threads; the offsets
    follow the order the files were given, whatever thread finished first."""
    big = [b"x" * 990 + f"{i:010d}".encode() for i in range(9_000)]  # ~9 MB a file
    with Stream.open(tmp_path, "s") as stream:
        stream.append(b"first")
        files = [stage(stream, f"t{k}", [v[:-1] + str(k).encode() for v in big]) for k in range(3)]
        staged = [s for f in files for s in f]
        assert sum(s.size for s in staged) >= 16 << 20
        assert stream.append_staged(staged) == range(1, 27_001)
        got = [r.value for r in stream.read(1)]
    assert [g[-1:] for g in got[::9_000]] == [b"0", b"1", b"2"]
    assert got[9_000 * 2 + 5] == big[5][:-1] + b"2"
    assert len(segment_files(tmp_path)) == 4
    with Stream.open(tmp_path, "s", create=False) as fresh:
        assert fresh.end_offset == 27_001
        assert [r.offset for r in fresh.read(8_999, 9_002)] == [8_999, 9_000, 9_001]


def test_values_of_several_calls_share_frames_up_to_frame_bytes(tmp_path: Path) -> None:
    """Small batches (Spark hands a task 10,000 rows at a time) are framed together, up to
    ``frame_bytes``, without joining their buffers; records with keys end a frame."""
    with Stream.open(tmp_path, "s") as stream:
        stager = stream.stager("t", frame_bytes=64 << 10)
        batches = [values(500, f"b{b}-") for b in range(20)]  # about 5 KB each
        for batch in batches[:10]:
            stager.add_values(b"".join(batch), array("I", map(len, batch)))
        stager.add_records([RecordIn(value=b"keyed", key=b"k")])
        for batch in batches[10:]:
            buf = bytearray(b"".join(batch))  # writable: copied when added
            stager.add_values(buf, array("I", map(len, batch)))
            buf[:] = b"?" * len(buf)
        staged = stager.finish()
        frames = [f for s in staged for f in read_staged_columns(s.path)]
        assert max(len(f.value_data) for f in frames) <= 64 << 10
        assert len(frames) < 10  # not a frame per call
        stream.append_staged(staged, copy_below=0)
        want = (
            [v for b in batches[:10] for v in b] + [b"keyed"] + [v for b in batches[10:] for v in b]
        )
        assert [r.value for r in stream.read()] == want
        assert next(iter(stream.read(5000, 5001))).key == b"k"
        with pytest.raises(UsageError, match="frame_bytes"):
            stream.stager("u", frame_bytes=10)


class _FullDisk(StreamOps):
    """Writes fail with ENOSPC once ``full`` is set (a filesystem filling up)."""

    full = False

    def pwritev(self, fd: int, parts: Any, pos: int) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().pwritev(fd, parts, pos)


def test_a_full_disk_while_staging_leaves_nothing_staged_and_the_stream_intact(
    tmp_path: Path,
) -> None:
    ops = _FullDisk()
    stream = Stream._open(tmp_path, "s", config=StreamConfig(), create=True, ops=ops)
    try:
        stream.append(b"first")
        stager = stream.stager("t", frame_bytes=4096)
        stager.add_values(b"".join(values(1000)), array("I", [7] * 1000))  # frames written
        ops.full = True
        with pytest.raises(DiskFull, match="stage records"):
            stager.add_values(b"".join(values(1000, "w")), array("I", [7] * 1000))
        assert stream.staged() == []  # the part written is gone with the rest
        ops.full = False
        assert stream.append(b"second") == 1
        assert [r.value for r in stream.read()] == [b"first", b"second"]
    finally:
        stream.close()
