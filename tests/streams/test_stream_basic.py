"""The blocking Stream: append, read, offsets, time look-ups, info, errors."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fsbus import (
    ClosedError,
    InvalidConfig,
    InvalidHeader,
    InvalidTopic,
    OffsetOutOfRange,
    PayloadTooLarge,
    Record,
    RecordIn,
    Stream,
    StreamConfig,
    StreamNotFound,
    UsageError,
    list_streams,
)
from fsbus._stream.ops import StreamOps


def test_empty_stream(stream: Stream) -> None:
    assert (stream.start_offset, stream.end_offset) == (0, 0)
    assert list(stream.read()) == []
    assert stream.info().segments == ()


def test_append_and_read_back(stream: Stream) -> None:
    assert stream.append(b"a") == 0
    assert stream.append("b", key="k", headers={"h": "v"}, timestamp=1234.5) == 1
    assert stream.append_batch([b"c", "d", RecordIn("e", key=b"x")]) == range(2, 5)
    recs = list(stream.read())
    assert [r.value for r in recs] == [b"a", b"b", b"c", b"d", b"e"]
    assert [r.offset for r in recs] == [0, 1, 2, 3, 4]
    assert recs[1].key == b"k"
    assert dict(recs[1].headers) == {"h": "v"}
    assert recs[1].timestamp == 1234.5
    assert recs[0].key is None
    assert recs[4].key == b"x"
    assert stream.end_offset == 5


def test_record_is_frozen(stream: Stream) -> None:
    stream.append(b"a")
    rec = next(stream.read())
    assert isinstance(rec, Record)
    with pytest.raises(AttributeError):
        rec.value = b"b"  # type: ignore[misc]
    assert rec == Record(rec.offset, rec.timestamp, None, b"a", rec.headers)


def test_read_ranges_and_limits(stream: Stream) -> None:
    for k in range(0, 3000, 300):
        stream.append_batch([f"v{i}".encode() for i in range(k, k + 300)])
    assert len(stream.info().segments) > 2  # the small segments rolled
    assert [r.offset for r in stream.read(1500, 1505)] == list(range(1500, 1505))
    assert [r.value for r in stream.read(2998)] == [b"v2998", b"v2999"]
    assert len(list(stream.read(10, max_records=7))) == 7
    assert list(stream.read(3000)) == []
    for start in (0, 1, 511, 2047, 2999):
        assert next(stream.read(start)).value == f"v{start}".encode()


def test_offsets_across_segments(stream: Stream) -> None:
    for i in range(400):
        stream.append(b"x" * 40 + str(i).encode())
    info = stream.info()
    assert len(info.segments) > 1
    assert [s.base_offset for s in info.segments] == sorted(s.base_offset for s in info.segments)
    assert info.segments[-1].end_offset == 400 == info.end_offset
    assert [r.offset for r in stream.read()] == list(range(400))


def test_out_of_range_says_valid_range(stream: Stream) -> None:
    stream.append_batch([b"a", b"b"])
    with pytest.raises(OffsetOutOfRange, match=r"valid offsets are 0 \(oldest kept\) to 2"):
        stream.read(3)


def test_offset_for_time(stream: Stream) -> None:
    stream.append_batch([RecordIn(b"x", timestamp=float(t)) for t in range(100, 1100, 10)])
    stream.append_batch([RecordIn(b"late", timestamp=50.0)])  # not monotonic
    assert stream.offset_for_time(0) == 0
    assert stream.offset_for_time(100) == 0
    assert stream.offset_for_time(105) == 1
    assert stream.offset_for_time(1090) == 99
    assert stream.offset_for_time(5000) == stream.end_offset == 101


def test_offset_for_time_across_segments(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, index_interval_bytes=256)
    with Stream.open(tmp_path, "t", config=cfg) as s:
        for t in range(2000):
            s.append(b"y" * 20, timestamp=float(t))
        assert len(s.info().segments) > 5
        for t in (0, 1, 777, 1999):
            assert s.offset_for_time(t) == t
            assert next(s.read(s.offset_for_time(t))).timestamp == t


def test_open_missing_without_create(tmp_path: Path) -> None:
    with pytest.raises(StreamNotFound, match="does not exist"):
        Stream.open(tmp_path, "nope", create=False)


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "x" * 201, "é"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidTopic, match="invalid stream name"):
        Stream.open(tmp_path, name)
    assert not (tmp_path / "streams").exists()


def test_bad_input_loses_nothing(stream: Stream) -> None:
    stream.append(b"keep")
    with pytest.raises(InvalidHeader, match="values must be str"):
        stream.append(b"x", headers={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(UsageError, match="bytes or str"):
        stream.append_batch([b"ok", 12])  # type: ignore[list-item]
    assert [r.value for r in stream.read()] == [b"keep"]


def test_record_too_large(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s", config=StreamConfig(max_record_bytes=10)) as s:
        with pytest.raises(PayloadTooLarge, match="max_record_bytes=10"):
            s.append(b"x" * 11)
        with pytest.raises(PayloadTooLarge):
            s.append_batch([b"ok", b"x" * 11])
        assert s.end_offset == 0


def test_bad_config() -> None:
    with pytest.raises(InvalidConfig, match="durability"):
        StreamConfig(durability="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match="heartbeat_interval"):
        StreamConfig(session_timeout=1.0, heartbeat_interval=2.0)


def test_a_handle_without_a_config_reads_the_defaults_of_stream_config(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as s:
        assert s.config == StreamConfig()
        assert isinstance(s.config, StreamConfig)


def test_a_handle_without_a_config_needs_no_pydantic(tmp_path: Path) -> None:
    """A Spark planner opens streams with the defaults: it must not pay pydantic's import."""
    probe = (
        "import sys\n"
        "from fsbus import Stream\n"
        f"with Stream.open({str(tmp_path)!r}, 's') as s:\n"
        "    s.append(b'x')\n"
        "    assert [r.value for r in s.read()] == [b'x']\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_handle_given_something_else_than_a_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="config must be a StreamConfig, got dict"):
        Stream.open(tmp_path, "s", config={"durability": "none"})  # type: ignore[arg-type]


def test_closed_handle(stream: Stream) -> None:
    stream.close()
    with pytest.raises(ClosedError):
        stream.append(b"x")
    with pytest.raises(ClosedError):
        stream.read()


def test_list_streams(tmp_path: Path) -> None:
    assert list_streams(tmp_path) == []
    for n in ("b", "a"):
        Stream.open(tmp_path, n).close()
    assert list_streams(tmp_path) == ["a", "b"]


def test_two_handles_share_offsets(tmp_path: Path, fast_config: StreamConfig) -> None:
    with (
        Stream.open(tmp_path, "s", config=fast_config) as a,
        Stream.open(tmp_path, "s", config=fast_config) as b,
    ):
        for i in range(300):
            (a if i % 3 else b).append(str(i).encode())
        b.append_batch([b"x"] * 50)
        assert [r.value for r in a.read(0, 300)] == [str(i).encode() for i in range(300)]
        assert a.end_offset == b.end_offset == 350


@pytest.mark.parametrize("durability", ["none", "batch", "record"])
def test_durability_levels(tmp_path: Path, durability: str) -> None:
    cfg = StreamConfig(durability=durability)  # type: ignore[arg-type]
    with Stream.open(tmp_path, "d", config=cfg) as s:
        assert s.append_batch([b"a", b"b", b"c"]) == range(3)
        assert s.append(b"d") == 3
        assert [r.value for r in s.read()] == [b"a", b"b", b"c", b"d"]


def test_big_batch_is_split_into_frames(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", max_frame_bytes=1024)
    with Stream.open(tmp_path, "f", config=cfg) as s:
        s.append_batch([bytes([i % 256]) * 100 for i in range(500)])
        assert [r.value[0] for r in s.read()] == [i % 256 for i in range(500)]


def test_big_batch_rolls_between_frames(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="batch", max_frame_bytes=1024, segment_bytes=4096)
    with Stream.open(tmp_path, "f", config=cfg) as s:
        assert s.append_batch([b"z" * 100] * 400) == range(400)
        segs = s.info().segments
        assert len(segs) > 5
        assert all(seg.size_bytes <= 4096 + 1024 for seg in segs)
        assert [r.offset for r in s.read()] == list(range(400))


def test_pickles_as_reopen(stream: Stream) -> None:
    import pickle

    stream.append(b"x")
    again = pickle.loads(pickle.dumps(stream))
    try:
        assert again is not stream
        assert again.name == stream.name
        assert again.config == stream.config
        assert [r.value for r in again.read()] == [b"x"]
    finally:
        again.close()


class _CountingOps(StreamOps):
    """Remembers where segment data was read from."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        data = super().pread(fd, n, pos)
        if n > 64:  # frame data, not a header probe
            self.reads.append((pos, len(data)))
        return data


def test_seeks_use_the_index_not_a_scan(tmp_path: Path) -> None:
    cfg = StreamConfig(
        durability="none", segment_bytes=1 << 30, index_interval_bytes=4096, read_chunk_bytes=8192
    )
    ops = _CountingOps()
    s = Stream._open(tmp_path, "big", config=cfg, create=True, ops=ops)
    try:
        for i in range(0, 20_000, 100):
            s.append_batch(
                [
                    RecordIn(f"{j}".encode().ljust(100), timestamp=float(j))
                    for j in range(i, i + 100)
                ]
            )
        assert len(s.info().segments) == 1
        size = s.info().size_bytes
        ops.reads.clear()
        assert next(s.read(15_000)).offset == 15_000
        first_pos, _ = ops.reads[0]
        assert first_pos > size // 2  # started near the record, not at byte 0
        assert sum(n for _, n in ops.reads) < size // 20  # a few frames, not the segment
        ops.reads.clear()
        assert s.offset_for_time(12_345.0) == 12_345
        assert sum(n for _, n in ops.reads) < size // 20
    finally:
        s.close()


def test_reader_racing_a_writer_sees_every_record_once(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, max_frame_bytes=512)
    total = 3000
    with (
        Stream.open(tmp_path, "race", config=cfg) as w,
        Stream.open(tmp_path, "race", config=cfg) as r,
    ):

        def write() -> None:
            i = 0
            while i < total:
                n = min(1 + i % 37, total - i)
                w.append_batch([f"{j}".encode() for j in range(i, i + n)])
                i += n

        t = threading.Thread(target=write)
        t.start()
        seen: list[int] = []
        try:
            while len(seen) < total:
                for rec in r.read(len(seen)):
                    assert rec.offset == len(seen)  # no gap, no repeat
                    assert rec.value == str(rec.offset).encode()
                    seen.append(rec.offset)
                if not t.is_alive() and len(seen) < total and r.end_offset == len(seen):
                    break
        finally:
            t.join()
        assert len(seen) == total


def test_records_pickle(stream: Stream) -> None:
    import pickle

    stream.append(b"v", key=b"k", headers={"a": "b"})
    stream.append(b"w")
    for rec in stream.read():
        again = pickle.loads(pickle.dumps(rec))
        assert again == rec
        assert isinstance(again, Record)


def test_blocking_follow(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", poll_interval=0.01)
    with Stream.open(tmp_path, "f", config=cfg) as s:
        s.append(b"old")

        def later() -> None:
            with Stream.open(tmp_path, "f", config=cfg) as w:
                w.append_batch([b"a", b"b", b"c"])

        t = threading.Thread(target=later)
        t.start()
        got = [r.value for r in s.follow(start=0, stop=4)]
        t.join()
        assert got == [b"old", b"a", b"b", b"c"]
        assert list(s.follow(idle_timeout=0.05)) == []  # from the end: nothing new
        with pytest.raises(OffsetOutOfRange):
            s.follow(start=99)
