"""Framing, index and offsets-file codecs: pure, synchronous, no files."""

from __future__ import annotations

from array import array
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsbus import UsageError
from fsbus._stream.framing import (
    HEADER_SIZE,
    FrameHeader,
    RecordIn,
    check_stream_name,
    decode_frame,
    decode_offsets_file,
    encode_frame,
    encode_frames,
    encode_index_entry,
    encode_offsets_file,
    encode_packed,
    encode_values,
    parse_index,
    parse_segment_name,
    prepare,
    scan_frames,
    segment_name,
)


def _records(buf: bytes) -> list[tuple[int, float, bytes | None, bytes, dict[str, str]]]:
    sc = scan_frames(buf)
    assert sc.problem is None
    out = []
    for fr in sc.frames:
        for r in decode_frame(buf, fr.position, fr):
            out.append((r.offset, r.timestamp, r.key, r.value, dict(r.headers)))
    return out


def test_plain_frame_roundtrip() -> None:
    frame = bytes(encode_values([b"a", b"", b"ccc"], 7, 1_500_000))
    sc = scan_frames(frame)
    assert sc.problem is None
    assert sc.end == len(frame)
    (fr,) = sc.frames
    assert (fr.base_offset, fr.last_offset, fr.count, fr.next_offset) == (7, 9, 3, 10)
    assert fr.length == len(frame) == HEADER_SIZE + 3 * 4 + 4
    assert _records(frame) == [
        (7, 1.5, None, b"a", {}),
        (8, 1.5, None, b"", {}),
        (9, 1.5, None, b"ccc", {}),
    ]


def test_mixed_frame_roundtrip() -> None:
    items = [
        prepare(RecordIn(b"v0", key=b"k0", headers={"a": "1"}, timestamp=2.0), max_record_bytes=99),
        prepare(b"v1", max_record_bytes=99),
        prepare(RecordIn("v2", key="", timestamp=1.0), max_record_bytes=99),
    ]
    frame = bytes(encode_frame(items, [10, 12, 15], base_offset=10, last_delta=6, default_ts_us=3))
    (fr,) = scan_frames(frame).frames
    assert (fr.base_offset, fr.last_offset, fr.count, fr.max_ts) == (10, 16, 3, 2_000_000)
    assert _records(frame) == [
        (10, 2.0, b"k0", b"v0", {"a": "1"}),
        (12, 3e-6, None, b"v1", {}),
        (15, 1.0, b"", b"v2", {}),
    ]


def test_decode_range_filters() -> None:
    frame = bytes(encode_values([b"%d" % i for i in range(10)], 100, 0))
    (fr,) = scan_frames(frame).frames
    assert [r.offset for r in decode_frame(frame, 0, fr, 103, 106)] == [103, 104, 105]
    assert [r.value for r in decode_frame(frame, 0, fr, 108)] == [b"8", b"9"]
    assert decode_frame(frame, 0, fr, 0, 100) == []


def test_batch_is_split_by_frame_size() -> None:
    enc = encode_frames([b"x" * 100] * 50, 0, now_us=5, max_frame_bytes=1000)
    assert len(enc.frames) > 5
    assert enc.next_offset == 50
    offs = [r[0] for r in _records(bytes(enc.data))]
    assert offs == list(range(50))
    assert [f[0] for f in enc.frames] == sorted(f[0] for f in enc.frames)


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40), st.integers(64, 2000))
def test_a_list_of_values_frames_as_the_same_values_back_to_back(
    values: list[bytes], max_frame: int
) -> None:
    listed = encode_frames(values, 11, now_us=3, max_frame_bytes=max_frame)
    packed = encode_packed(
        b"".join(values),
        array("I", map(len, values)),
        11,
        now_us=3,
        max_frame_bytes=max_frame,
    )
    assert bytes(listed.data) == bytes(packed.data)
    assert listed.frames == packed.frames
    assert [r[3] for r in _records(bytes(listed.data))] == values


def _big_values(n: int, size: int = 10_240) -> list[bytes]:
    """Distinct values of about ``size`` bytes (the index first, then filler)."""
    return [b"%08d" % i + bytes([65 + i % 26]) * (size - 8 - i % 3) for i in range(n)]


@pytest.mark.parametrize("max_frame", [64 << 10, 1 << 20])
def test_a_batch_of_10kb_values_frames_byte_for_byte_as_one_frame_each_would(
    max_frame: int,
) -> None:
    values = _big_values(300)
    listed = encode_frames(values, 5, now_us=77, max_frame_bytes=max_frame)
    packed = encode_packed(
        b"".join(values), array("I", map(len, values)), 5, now_us=77, max_frame_bytes=max_frame
    )
    assert len(listed.parts) == 1  # a list is joined into one buffer
    assert len(packed.parts) == 2 * len(packed.frames)  # head + slice of the caller's buffer
    data = bytes(listed.data)
    assert bytes(packed.data) == data
    assert listed.frames == packed.frames
    assert listed.size == packed.size == len(data)
    # each frame is what the one-frame encoder makes of its values
    starts = [*listed.frames, (listed.next_offset, len(data), 0)]
    for (off, pos, ts), (next_off, end, _) in pairwise(starts):
        assert data[pos:end] == bytes(encode_values(values[off - 5 : next_off - 5], off, ts))
    assert [r[3] for r in _records(data)] == values
    assert b"".join(bytes(p) for p in packed.cut(100, len(data) - 100)) == data[100:-100]


@pytest.mark.parametrize("cut", [1, 10, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3])
def test_torn_frame_is_incomplete(cut: int) -> None:
    good = bytes(encode_values([b"a" * 20], 0, 0))
    torn = bytes(encode_values([b"b" * 20], 1, 0))[:cut]
    sc = scan_frames(good + torn)
    assert len(sc.frames) == 1
    assert sc.end == len(good)
    assert sc.incomplete
    assert sc.problem is not None


def test_flipped_bit_fails_checksum() -> None:
    frame = bytearray(encode_values([b"hello world"], 0, 0))
    frame[-3] ^= 0x10
    sc = scan_frames(bytes(frame))
    assert sc.frames == ()
    assert sc.problem == "a frame fails its checksum"
    assert not sc.incomplete


def test_garbage_is_not_a_frame() -> None:
    sc = scan_frames(b"\0" * 100)
    assert sc.problem == "bytes that are not a frame header"


def test_scan_positions_are_absolute() -> None:
    a = bytes(encode_values([b"1"], 0, 0))
    b = bytes(encode_values([b"2"], 1, 0))
    sc = scan_frames(b, base=len(a))
    assert sc.frames[0].position == len(a)
    assert isinstance(sc.frames[0], FrameHeader)


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=50),
            st.none() | st.binary(max_size=10),
            st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=3),
            st.none() | st.integers(min_value=0, max_value=2**40).map(lambda x: x / 1000),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(min_value=0, max_value=2**50),
    st.integers(min_value=200, max_value=2000),
)
def test_roundtrip_property(
    items: list[tuple[bytes, bytes | None, dict[str, str], float | None]],
    base: int,
    max_frame: int,
) -> None:
    prepared = [
        prepare(RecordIn(v, key=k, headers=h, timestamp=t), max_record_bytes=1 << 20)
        for v, k, h, t in items
    ]
    enc = encode_frames(prepared, base, now_us=42, max_frame_bytes=max_frame)
    got = _records(bytes(enc.data))
    assert [g[0] for g in got] == list(range(base, base + len(items)))
    for (v, k, h, t), (_, ts, gk, gv, gh) in zip(items, got, strict=True):
        assert (gv, gk, gh) == (v, k, h)
        assert ts == (42 / 1e6 if t is None else round(t * 1e6) / 1e6)


def test_index_parse_ignores_torn_and_stale_entries() -> None:
    raw = b"".join(encode_index_entry(o, p, o) for o, p in [(0, 0), (10, 500), (20, 900)])
    assert [(e.offset, e.position) for e in parse_index(raw + b"\1\2\3")] == [
        (0, 0),
        (10, 500),
        (20, 900),
    ]
    stale = raw + encode_index_entry(5, 100, 0)
    assert len(parse_index(stale)) == 3


def test_segment_names() -> None:
    assert segment_name(42) == "00000000000000000042.log"
    assert parse_segment_name(segment_name(42)) == 42
    assert parse_segment_name("00000000000000000042.index") is None
    assert parse_segment_name("42.log") is None


def test_stream_names() -> None:
    assert check_stream_name("orders.v1_x-2") == "orders.v1_x-2"


def test_offsets_file_roundtrip() -> None:
    raw = encode_offsets_file({0: 10, 1: 0, 2: 99})
    assert decode_offsets_file(raw) == {0: 10, 1: 0, 2: 99}


@pytest.mark.parametrize(
    ("mangle", "match"),
    [
        (lambda b: b[: len(b) // 2], "no checksum line"),
        (lambda b: b.replace(b"0 10", b"0 11"), "checksum does not match"),
        (lambda b: b"", "no checksum line"),
    ],
)
def test_offsets_file_corruption_detected(mangle: object, match: str) -> None:
    raw = encode_offsets_file({0: 10, 1: 5})
    with pytest.raises(ValueError, match=match):
        decode_offsets_file(mangle(raw))  # type: ignore[operator]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e13, True, "1"])
def test_bad_timestamps_are_refused(bad: object) -> None:
    with pytest.raises(UsageError, match="timestamp must be seconds since the epoch"):
        prepare(RecordIn(b"x", timestamp=bad), max_record_bytes=10)  # type: ignore[arg-type]


def test_mixed_batch_frames_runs_of_plain_values_on_the_fast_path() -> None:
    marked = prepare(RecordIn(b"first", headers={"mark": "1"}), max_record_bytes=99)
    plain = [b"v%d" % i for i in range(200)]
    enc = encode_frames([marked, *plain], 0, now_us=7, max_frame_bytes=1 << 20)
    buf = bytes(enc.data)
    frames = scan_frames(buf).frames
    assert [(f.base_offset, f.count, f.flags) for f in frames] == [(0, 1, 2), (1, 200, 0)]
    assert _records(buf) == [(0, 7e-6, None, b"first", {"mark": "1"})] + [
        (i + 1, 7e-6, None, v, {}) for i, v in enumerate(plain)
    ]


def test_mixed_batch_keeps_short_plain_runs_in_shared_frames() -> None:
    items: list[object] = []
    for i in range(30):
        items.append(b"p%d" % i)
        items.append(prepare(RecordIn(b"k%d" % i, key=b"k"), max_record_bytes=99))
    enc = encode_frames(items, 5, now_us=1, max_frame_bytes=1 << 20)  # type: ignore[arg-type]
    assert len(enc.frames) == 1
    got = _records(bytes(enc.data))
    assert [g[3] for g in got] == [
        b"p%d" % (i // 2) if i % 2 == 0 else b"k%d" % (i // 2) for i in range(60)
    ]
    assert [g[2] for g in got] == [None, b"k"] * 30


@given(
    st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=200)), max_size=8),
    st.integers(min_value=200, max_value=5000),
)
def test_mixed_batches_roundtrip(runs: list[tuple[bool, int]], max_frame: int) -> None:
    items: list[object] = []
    for plain, n in runs:
        for _ in range(n):
            v = b"%d" % len(items)
            items.append(v if plain else prepare(RecordIn(v, key=v), max_record_bytes=99))
    enc = encode_frames(items, 3, now_us=9, max_frame_bytes=max_frame)  # type: ignore[arg-type]
    got = _records(bytes(enc.data))
    assert [g[0] for g in got] == list(range(3, 3 + len(items)))
    assert [g[3] for g in got] == [b"%d" % i for i in range(len(items))]
    assert [g[2] for g in got] == [
        None if type(x) is bytes else b"%d" % i for i, x in enumerate(items)
    ]


def test_packed_values_are_bytes_whatever_the_item_format_of_the_buffer() -> None:
    values = [b"abcd" * 3, b"wxyz" * 2]
    lengths = array("I", [12, 8])
    wide = memoryview(b"".join(values)).cast("I")  # 5 items of 4 bytes
    packed = encode_packed(wide, lengths, 0, now_us=1, max_frame_bytes=1000)
    assert bytes(packed.data) == bytes(encode_values(values, 0, 1))
