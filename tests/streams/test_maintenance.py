"""Retention by size, age and consumption; compaction of closed segments."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsbus import OffsetOutOfRange, RecordIn, Stream, StreamConfig


def _fill(s: Stream, n: int, size: int = 100) -> None:
    for i in range(0, n, 10):
        s.append_batch([f"{j}".encode().ljust(size, b".") for j in range(i, i + 10)])


def test_retention_by_size(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, retention_bytes=3 * 4096)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        _fill(s, 1000)  # about 26 segments; retention runs at each roll
        info = s.info()
        assert info.size_bytes <= 4 * 4096 + 2048
        assert info.start_offset > 0
        assert info.end_offset == 1000
        assert [r.offset for r in s.read(info.start_offset)] == list(range(info.start_offset, 1000))
        with pytest.raises(OffsetOutOfRange, match=f"valid offsets are {info.start_offset}"):
            s.read(0)


def test_retention_by_age(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        old = [RecordIn(b"o" * 100, timestamp=1000.0 + i) for i in range(200)]
        s.append_batch(old[:100])
        s.append_batch(old[100:])
        _fill(s, 200)  # new records, timestamped now
    aged = cfg.model_copy(update={"retention_seconds": 3600.0})
    with Stream.open(tmp_path, "s", config=aged) as s:
        report = s.enforce_retention()
        assert report.deleted
        assert report.freed_bytes > 0
        first = s.start_offset
        assert 0 < first <= 200  # only segments of old records went
        assert all(r.timestamp > 10_000 for r in s.read(200))


def test_consumed_segments_are_deleted(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, delete_consumed=True)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        g1 = s.group("fast")
        g2 = s.group("slow")
        _fill(s, 300)
        assert s.start_offset == 0  # nothing consumed yet
        g1.poll(max_records=300)
        g1.commit()
        s.enforce_retention()
        assert s.start_offset == 0  # "slow" has not consumed anything
        g2.poll(max_records=150)
        g2.commit()
        s.enforce_retention()
        assert 0 < s.start_offset <= 150
        assert [r.offset for r in g2.poll(max_records=1000)] == list(range(150, 300))
        g1.close()
        g2.close()


def test_no_groups_means_nothing_consumed(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, delete_consumed=True)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        _fill(s, 300)
        assert s.enforce_retention().deleted == ()


def test_compaction_keeps_newest_per_key(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, index_interval_bytes=256)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        for i in range(300):
            s.append(f"v{i}".encode().ljust(80), key=f"k{i % 10}" if i % 3 else None)
        before = s.info()
        report = s.compact()
        assert report.removed_records > 0
        assert report.freed_bytes > 0
        after = s.info()
        assert after.end_offset == before.end_offset == 300
        assert after.size_bytes < before.size_bytes
        assert [seg.base_offset for seg in after.segments] == [
            seg.base_offset for seg in before.segments
        ]
        recs = list(s.read())
        offsets = [r.offset for r in recs]
        assert offsets == sorted(offsets)
        closed_end = after.segments[-1].base_offset
        keyed = [r for r in recs if r.key is not None and r.offset < closed_end]
        newest = {r.key: r.offset for r in recs if r.key is not None}
        assert all(newest[r.key] == r.offset for r in keyed)  # type: ignore[index]
        keyless = [r.offset for r in recs if r.key is None]
        assert keyless == [i for i in range(300) if i % 3 == 0]  # untouched
        # reads from any offset still work, gaps included, and appends go on
        assert next(s.read(1)).offset >= 1
        assert s.append(b"x") == 300
        assert s.offset_for_time(0) == 0


def test_temp_files_of_a_crashed_rewrite_are_removed(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        _fill(s, 100)
        debris = s.path / ".00000000000000000000.log.abc123.tmp"
        debris.write_bytes(b"half a rewrite")
        gdebris = s.path / "groups" / "g" / ".offsets.abc.tmp"
        gdebris.parent.mkdir(parents=True)
        gdebris.write_bytes(b"half")
        s.compact()
        assert not debris.exists()
        s.group("g").close()
        assert not gdebris.exists()
        assert [r.offset for r in s.read()] == list(range(100))
