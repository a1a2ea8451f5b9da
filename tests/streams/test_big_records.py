"""10 KB records: the append paths that write values without packing them record by record.

``append_batch`` joins a list of values with their frame headers into one buffer;
``append_values`` writes a head buffer and a slice of the caller's buffer per frame with
one vectored write. Both must leave the same bytes on disk, across segment rolls, and a
tail torn anywhere in them is cut back to the last whole frame.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from stream_workers import big_values

from fsbus import RecordIn, Stream, StreamConfig
from fsbus._stream.ops import IOV_MAX, StreamOps

# segments of 256 KB and frames of 64 KB: a batch of 100 records of 10 KB is 16 frames
# over 4 or 5 segments
SMALL_SEGMENTS = StreamConfig(
    durability="none",
    segment_bytes=256 << 10,
    max_frame_bytes=64 << 10,
    index_interval_bytes=16 << 10,
)


def _files(root: Path, name: str) -> dict[str, bytes]:
    sdir = root / "streams" / name
    return {
        p.name: p.read_bytes() for p in sorted(sdir.iterdir()) if p.suffix in (".log", ".index")
    }


class _FixedClock(StreamOps):
    """Every append at the same time, so two streams' files can be compared whole."""

    def now(self) -> float:
        return 1_700_000_000.5


@pytest.mark.parametrize("durability", ["none", "batch"])
def test_a_10kb_batch_reads_back_byte_for_byte_and_both_paths_write_the_same_files(
    tmp_path: Path, durability: str
) -> None:
    cfg = SMALL_SEGMENTS.model_copy(update={"durability": durability})
    first, second = big_values("a", 100), big_values("b", 37)
    s = Stream._open(tmp_path, "batch", config=cfg, create=True, ops=_FixedClock())
    v = Stream._open(tmp_path, "values", config=cfg, create=True, ops=_FixedClock())
    try:
        assert s.append_batch(first) == range(100)
        assert s.append_batch(second) == range(100, 137)
        assert v.append_values(b"".join(first), [len(x) for x in first]) == range(100)
        assert v.append_values(b"".join(second), [len(x) for x in second]) == range(100, 137)
        for stream in (s, v):
            assert len(stream.info().segments) > 3
            records = list(stream.read())
            assert [r.value for r in records] == first + second
            assert [r.offset for r in records] == list(range(137))
            assert [r.value for r in stream.read(55, 60)] == first[55:60]  # through the index
    finally:
        s.close()
        v.close()
    # segments (frames, checksums) and sparse indexes: the same bytes on both paths
    batch = _files(tmp_path, "batch")
    assert len(batch) > 6
    assert batch == _files(tmp_path, "values")


def test_the_files_are_those_the_packing_encoder_wrote(tmp_path: Path) -> None:
    """The digest of these files as written by the encoder that copied every frame into one
    buffer (before values were joined with their headers): the format is unchanged."""
    s = Stream._open(tmp_path, "g", config=SMALL_SEGMENTS, create=True, ops=_FixedClock())
    try:
        s.append_batch(big_values("a", 100))
        s.append_batch(big_values("b", 37))
        s.append_batch([b"%d" % i * 7 for i in range(3000)])
    finally:
        s.close()
    digest = hashlib.sha256()
    for name, data in _files(tmp_path, "g").items():
        digest.update(name.encode())
        digest.update(data)
    assert digest.hexdigest() == (
        "93b2b9184bf127e3db5d5b607ddf093eb181151cb34a5e2fa87268eaf6257d65"
    )


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_append_values_takes_read_only_and_writable_buffers(
    tmp_path: Path, wrap: type[bytes | bytearray | memoryview]
) -> None:
    values = big_values("w", 120)
    data = wrap(bytearray(b"".join(values)))
    with Stream.open(tmp_path, "s", config=SMALL_SEGMENTS) as s:
        assert s.append_values(data, [len(v) for v in values]) == range(120)
        assert [r.value for r in s.read()] == values


def test_a_mixed_batch_with_10kb_values_reads_back(tmp_path: Path) -> None:
    values = big_values("m", 150)
    items: list[bytes | str | RecordIn] = list(values)
    items[70] = RecordIn(values[70], key="k", headers={"h": "1"})
    with Stream.open(tmp_path, "s", config=SMALL_SEGMENTS) as s:
        assert s.append_batch(items) == range(150)
        got = list(s.read())
    assert [r.value for r in got] == values
    assert got[70].key == b"k"
    assert dict(got[70].headers) == {"h": "1"}


def test_a_10kb_tail_cut_anywhere_goes_back_to_the_last_whole_frame(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", max_frame_bytes=64 << 10)
    values = big_values("t", 40)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        s.append_batch(values[:10])
        frame_end = s.info().size_bytes
        s.append_batch(values[10:])
    (seg,) = (tmp_path / "streams" / "s").glob("*.log")
    full = seg.read_bytes()
    for cut in (frame_end + 10, frame_end + 48 + 4 * 6 + 5000, len(full) - 1):
        seg.write_bytes(full[:cut])
        with Stream.open(tmp_path, "s", config=cfg) as s:
            (info,) = s.recover()
            assert info.position <= cut
            assert info.cut_bytes == cut - info.position
            got = [r.value for r in s.read()]
            assert got == values[: len(got)]
            assert len(got) >= 10
            assert s.append(b"after") == len(got)
            assert [r.value for r in s.read(len(got))] == [b"after"]


def test_pwritev_writes_more_buffers_than_one_call_takes(tmp_path: Path) -> None:
    ops = StreamOps()
    parts = [b"%05d" % i for i in range(IOV_MAX * 2 + 7)]
    parts[3] = b""
    parts[IOV_MAX] = memoryview(b"x" * 70_000)
    fd = ops.open_rw(tmp_path / "f")
    try:
        ops.pwrite(fd, b"head", 0)
        ops.pwritev(fd, parts, 4)
    finally:
        ops.close(fd)
    assert (tmp_path / "f").read_bytes() == b"head" + b"".join(bytes(p) for p in parts)
    assert os.path.getsize(tmp_path / "f") == 4 + sum(map(len, parts))
