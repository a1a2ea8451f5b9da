"""Stream.read_columns: the same records as Stream.read, column by column."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

from fsbus import (
    ColumnBatch,
    OffsetOutOfRange,
    PayloadTooLarge,
    Record,
    RecordIn,
    Stream,
    StreamConfig,
    UsageError,
)
from fsbus._stream.framing import encode_frame, encode_frames, frame_columns, prepare, scan_frames


def _rows(batches: list[ColumnBatch]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for b in batches:
        assert len(b) > 0
        assert len(b.offsets) == len(b.timestamps) == len(b.keys) == len(b.headers) == len(b)
        assert len(b.value_data) == sum(b.value_lengths)
        out += zip(b.offsets, b.timestamps, b.keys, b.values, map(dict, b.headers), strict=True)
    return out


def _expected(records: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, dict(r.headers)) for r in records]


def _mixed(stream: Stream) -> None:
    stream.append_batch([f"plain {i}".encode().ljust(100) for i in range(120)])
    stream.append(b"one", key="k1", headers={"h": "1"}, timestamp=1234.5)
    stream.append_batch(
        [
            RecordIn(f"v{i}", key=f"k{i % 3}" if i % 2 else None, headers={"n": str(i)})
            for i in range(40)
        ]
        + [b"tail-a", "tail-b"]
    )
    stream.append_batch([b""] * 5)  # empty values are records too
    stream.append(b"last")


def test_columns_equal_records(stream: Stream) -> None:
    _mixed(stream)
    assert len(stream.info().segments) > 1  # the small segments of the test config
    end = stream.end_offset
    for start, stop in [
        (0, None),
        (0, end),
        (3, 17),
        (79, 83),
        (119, 122),
        (121, 121),
        (130, None),
        (end, None),
    ]:
        got = _rows(list(stream.read_columns(start, stop)))
        assert got == _expected(list(stream.read(start, stop))), (start, stop)


@pytest.mark.parametrize("limit", [0, 1, 7, 110, 111, 1000])
def test_max_records(stream: Stream, limit: int) -> None:
    _mixed(stream)
    got = _rows(list(stream.read_columns(10, max_records=limit)))
    assert got == _expected(list(stream.read(10, max_records=limit)))


def test_plain_values_share_one_buffer(stream: Stream) -> None:
    values = [f"value {i}".encode() for i in range(100)]
    stream.append_batch(values)
    batches = list(stream.read_columns(5, 95))
    assert sum(map(len, batches)) == 90
    first = batches[0]
    assert isinstance(first.offsets, range)
    assert isinstance(first.value_lengths, array)
    assert first.value_lengths.typecode == "I"
    assert bytes(first.value_data) == b"".join(values[5 : 5 + len(first)])
    assert first.keys == [None] * len(first)
    assert not any(first.headers)
    assert len(set(first.timestamps)) == 1


def test_head_cuts_every_column(stream: Stream) -> None:
    stream.append_batch([RecordIn(f"v{i}", key=f"k{i}") for i in range(10)])
    (batch,) = stream.read_columns()
    cut = batch.head(3)
    assert list(cut.offsets) == [0, 1, 2]
    assert cut.values == [b"v0", b"v1", b"v2"]
    assert cut.keys == [b"k0", b"k1", b"k2"]
    assert batch.head(10) is batch


def test_compacted_frames_keep_their_offsets(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, index_interval_bytes=256)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        for i in range(200):
            s.append(f"v{i}".encode().ljust(60), key=f"k{i % 5}" if i % 4 else None)
        s.compact()
        for start in (0, 1, 77):
            got = _rows(list(s.read_columns(start, 150)))
            assert got == _expected(list(s.read(start, 150)))
        offsets = [o for b in s.read_columns() for o in b.offsets]
        assert len(offsets) < 200  # gaps, where compaction removed records


def test_errors_as_read(stream: Stream) -> None:
    stream.append_batch([b"a", b"b"])
    with pytest.raises(OffsetOutOfRange, match="valid offsets are 0"):
        stream.read_columns(3)
    with pytest.raises(UsageError, match="start must be an offset"):
        stream.read_columns(-1)
    with pytest.raises(UsageError, match="max_records"):
        stream.read_columns(0, max_records=-1)
    assert list(stream.read_columns(2)) == []


def test_frame_columns_slices_a_frame() -> None:
    enc = encode_frames([b"a", b"bb", b"ccc", b"dddd"], 100, now_us=5_000_000, max_frame_bytes=1024)
    buf = bytes(enc.data)
    (fr,) = scan_frames(buf).frames
    cols = frame_columns(buf, 0, fr, 101, 103)
    assert list(cols.offsets) == [101, 102]
    assert cols.values == [b"bb", b"ccc"]
    assert list(cols.timestamps) == [5.0, 5.0]
    assert len(frame_columns(buf, 0, fr, 104)) == 0
    items = [prepare(RecordIn(b"x", key=b"k", headers={"a": "b"}), max_record_bytes=99)]
    enc = encode_frames(items, 7, now_us=1, max_frame_bytes=1024)
    buf = bytes(enc.data)
    (fr,) = scan_frames(buf).frames
    cols = frame_columns(buf, 0, fr)
    assert (cols.keys, cols.values, dict(cols.headers[0])) == ([b"k"], [b"x"], {"a": "b"})


def test_frame_columns_with_gaps() -> None:
    items = [prepare(v, max_record_bytes=99) for v in (b"a", b"b", b"c")]
    frame = bytes(encode_frame(items, [10, 13, 17], base_offset=10, last_delta=8, default_ts_us=0))
    (fr,) = scan_frames(frame).frames
    cols = frame_columns(frame, 0, fr, 11, 17)
    assert (list(cols.offsets), cols.values) == ([13], [b"b"])
    assert list(frame_columns(frame, 0, fr, 13).offsets) == [13, 17]


def test_append_values_round_trips_with_read_columns(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, max_frame_bytes=512)
    values = [b"v%d" % i * (i % 7) for i in range(300)]  # some empty
    with Stream.open(tmp_path, "s", config=cfg) as s:
        s.append(b"before")
        got = s.append_values(b"".join(values), array("I", map(len, values)))
        assert got == range(1, 301)
        assert s.append_values(memoryview(b"xyz"), [1, 2]) == range(301, 303)
        assert s.append_values(b"", []) == range(303, 303)
        assert len(s.info().segments) > 1
        assert [r.value for r in s.read(1)] == [*values, b"x", b"yz"]
        batches = list(s.read_columns(1))
        assert b"".join(bytes(b.value_data) for b in batches) == b"".join(values) + b"xyz"
        assert all(len(b.value_data) + 4 * len(b) + 48 <= 512 for b in batches)


@pytest.mark.parametrize("durability", ["batch", "record"])
def test_append_values_durability_levels(tmp_path: Path, durability: str) -> None:
    with Stream.open(tmp_path, "s", config=StreamConfig(durability=durability)) as s:  # type: ignore[arg-type]
        assert s.append_values(b"abcdef", [1, 2, 3]) == range(3)
        assert [r.value for r in s.read()] == [b"a", b"bc", b"def"]


def test_append_values_refuses_bad_input_and_loses_nothing(stream: Stream) -> None:
    stream.append(b"kept")
    with pytest.raises(UsageError, match="add up to 3 bytes but data holds 4"):
        stream.append_values(b"abcd", [1, 2])
    with pytest.raises(UsageError, match="lengths must be ints"):
        stream.append_values(b"ab", [-1, 3])
    small = StreamConfig(durability="none", max_record_bytes=4)
    with Stream.open(stream.root, "t", config=small) as t, pytest.raises(PayloadTooLarge):
        t.append_values(b"abcdef", [1, 5])
    assert [r.value for r in stream.read()] == [b"kept"]


@pytest.mark.parametrize("durability", ["batch", "record"])
def test_append_values_first_headers(tmp_path: Path, durability: str) -> None:
    cfg = StreamConfig(durability=durability, max_frame_bytes=256)  # type: ignore[arg-type]
    values = [b"v%03d" % i for i in range(200)]
    with Stream.open(tmp_path, "s", config=cfg) as s:
        s.append(b"before")
        got = s.append_values(
            b"".join(values), array("I", map(len, values)), first_headers={"mark": "m1"}
        )
        assert got == range(1, 201)
        assert s.append_values(b"x", [1], first_headers={"mark": "m2"}) == range(201, 202)
        records = list(s.read(1))
    assert [r.value for r in records] == [*values, b"x"]
    assert [dict(r.headers) for r in records if r.headers] == [{"mark": "m1"}, {"mark": "m2"}]
    assert records[0].headers
    assert records[-1].headers
    assert all(r.key is None for r in records)


def test_append_value_chunks_refuses_a_value_too_large_in_any_chunk(tmp_path: Path) -> None:
    small = StreamConfig(durability="none", max_record_bytes=4)
    with Stream.open(tmp_path, "s", config=small) as s:
        # chunks larger than max_record_bytes whose values all fit are taken
        assert s.append_value_chunks([(b"abcdefgh", [4, 4]), (b"ij", [2])]) == range(3)
        # a value too large in the second chunk refuses the whole append
        with pytest.raises(PayloadTooLarge):
            s.append_value_chunks([(b"ab", [1, 1]), (b"abcdef", [1, 5])])
        assert [r.value for r in s.read()] == [b"abcd", b"efgh", b"ij"]
