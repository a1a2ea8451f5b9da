"""Reading segments: listing, index look-ups, validated scans and record iteration.

Shared by the writer (which scans the tail it finds under the append lock) and by
readers (which take no lock and stop at the last complete, checksum-valid frame).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

from .._errors import CorruptDataError, OffsetOutOfRange, StreamNotFound, storage_error
from .framing import (
    HEADER,
    HEADER_SIZE,
    INDEX_ENTRY,
    MAGIC,
    VERSION,
    ColumnBatch,
    FrameHeader,
    IndexEntry,
    Record,
    frame_columns,
    frame_timestamps,
    index_name,
    iter_frame,
    parse_index,
    parse_segment_name,
    scan_frames,
    segment_name,
)
from .ops import StreamOps

__all__ = [
    "SegmentScan",
    "find_start",
    "frame_spans",
    "iter_columns",
    "iter_records",
    "list_segments",
    "offset_for_time",
    "read_index",
    "remove_debris",
    "scan_segment",
    "stream_end",
]

log = logging.getLogger("fsbus.stream")

I64_MIN = -(2**63)


def list_segments(ops: StreamOps, sdir: Path) -> list[int]:
    """Base offsets of the stream's segments, oldest first."""
    try:
        names = ops.listdir(sdir)
    except OSError as exc:
        raise storage_error("list the segments", exc, sdir) from exc
    bases = [b for b in map(parse_segment_name, names) if b is not None]
    bases.sort()
    return bases


def read_index(ops: StreamOps, sdir: Path, base: int) -> list[IndexEntry]:
    """The sparse index of segment ``base`` ([] if missing)."""
    raw = ops.read_file(sdir / index_name(base))
    return parse_index(raw) if raw else []


def _frame_at(ops: StreamOps, fd: int, pos: int, offset: int) -> bool:
    """Whether a frame header starting with ``offset`` sits at ``pos``."""
    raw = ops.pread(fd, HEADER_SIZE, pos)
    if len(raw) < HEADER_SIZE:
        return False
    f = HEADER.unpack_from(raw)
    return bool(f[1] == MAGIC and f[2] == VERSION and f[5] == offset)


def seek_entry(
    ops: StreamOps, fd: int, entries: list[IndexEntry], offset: int, size: int
) -> IndexEntry | None:
    """The last index entry at or before ``offset`` that checks out, or None (scan from 0)."""
    i = bisect.bisect_right([e.offset for e in entries], offset)
    while i > 0:
        e = entries[i - 1]
        if e.position < size and _frame_at(ops, fd, e.position, e.offset):
            return e
        i -= 1
    return None


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """The result of validating a segment from some position to its end."""

    end: int
    """Byte position after the last valid frame."""
    next_offset: int
    """Offset after the last valid frame (the start offset if none was found)."""
    max_ts: int
    """Largest timestamp seen, µs (the given floor if no frame was found)."""
    size: int
    """File size when the scan ended."""
    problem: str | None
    """Why the scan stopped before ``size`` (None if it reached it)."""
    followed: bool
    """True when valid frames follow the problem (corruption, not a torn tail)."""


def scan_segment(
    ops: StreamOps,
    fd: int,
    *,
    pos: int,
    next_offset: int,
    max_ts: int,
    chunk: int,
) -> SegmentScan:
    """Validate frames from ``pos`` to the end of the file."""
    while True:
        data = ops.pread(fd, chunk, pos)
        if not data:
            return SegmentScan(pos, next_offset, max_ts, pos, None, False)
        sc = scan_frames(data, base=pos)
        for fr in sc.frames:
            next_offset = fr.next_offset
            if fr.max_ts > max_ts:
                max_ts = fr.max_ts
        full = len(data) == chunk
        if sc.problem is None:
            pos = sc.end
            if not full:
                return SegmentScan(pos, next_offset, max_ts, pos, None, False)
            continue
        if sc.incomplete and full:
            # The frame straddles the chunk: read on from it, with room for all of it.
            if sc.end == pos:
                chunk = max(chunk, sc.needed)
            pos = sc.end
            continue
        size = ops.size(fd)
        if size <= sc.end:
            return SegmentScan(sc.end, next_offset, max_ts, size, None, False)
        return SegmentScan(
            sc.end, next_offset, max_ts, size, sc.problem, _valid_after(ops, fd, sc.end, size)
        )


def _valid_after(ops: StreamOps, fd: int, pos: int, size: int) -> bool:
    """Whether a valid frame starts somewhere after the bad bytes at ``pos``."""
    head = ops.pread(fd, HEADER_SIZE, pos)
    if len(head) == HEADER_SIZE:
        f = HEADER.unpack_from(head)
        if f[1] == MAGIC and HEADER_SIZE <= f[4] and pos + f[4] < size:
            nxt = pos + f[4]
            probe = ops.pread(fd, HEADER_SIZE, nxt)
            if len(probe) == HEADER_SIZE:
                g = HEADER.unpack_from(probe)
                if g[1] == MAGIC and nxt + g[4] <= size:
                    return bool(scan_frames(ops.pread(fd, g[4], nxt)).frames)
    return False


def stream_end(ops: StreamOps, sdir: Path, bases: list[int], chunk: int) -> int:
    """The next offset to be written, as readers see it (complete valid frames only)."""
    if not bases:
        return 0
    base = bases[-1]
    path = sdir / segment_name(base)
    try:
        fd = ops.open_ro(path)
    except FileNotFoundError:
        return stream_end(ops, sdir, list_segments(ops, sdir), chunk)
    except OSError as exc:
        raise storage_error("open a segment", exc, path) from exc
    try:
        size = ops.size(fd)
        e = seek_entry(ops, fd, read_index(ops, sdir, base), 2**64, size)
        start = e.position if e else 0
        first = e.offset if e else base
        sc = scan_segment(ops, fd, pos=start, next_offset=first, max_ts=I64_MIN, chunk=chunk)
        return sc.next_offset
    except OSError as exc:
        raise storage_error("read a segment", exc, path) from exc
    finally:
        ops.close(fd)


def find_start(
    ops: StreamOps, sdir: Path, name: str, bases: list[int], start: int, end: int
) -> int:
    """Index into ``bases`` of the segment holding ``start``; raise if out of range."""
    first = bases[0] if bases else 0
    if start < first or start > end:
        raise OffsetOutOfRange(
            f"offset {start} is outside stream {name!r}: valid offsets are {first} "
            f"(oldest kept) to {end} (the next to be written)"
        )
    return max(bisect.bisect_right(bases, start) - 1, 0)


RECHECK_WAITS = (0.0, 0.01, 0.05, 0.2)
"""Waits before each new read of a closed segment's end that read short or torn."""


def iter_records(
    ops: StreamOps,
    sdir: Path,
    name: str,
    start: int,
    stop: int | None,
    max_records: int | None,
    chunk: int,
    note: Callable[[int], object] | None = None,
) -> Iterator[Record]:
    """Records in [start, stop) up to the current end of the stream, in offset order.

    :func:`iter_frames` hands out one iterator per frame; chaining them runs only the
    frame's own generator per record. ``note`` is given the end offset of each frame read.
    """
    records = chain.from_iterable(iter_frames(ops, sdir, name, start, stop, chunk, note))
    return records if max_records is None else islice(records, max_records)


def iter_frames(
    ops: StreamOps,
    sdir: Path,
    name: str,
    start: int,
    stop: int | None,
    chunk: int,
    note: Callable[[int], object] | None = None,
) -> Iterator[Iterator[Record]]:
    """An iterator of records per frame, for [start, stop) up to the current end."""
    for data, pos, fr, lo in frame_spans(ops, sdir, name, start, stop, chunk, note):
        yield iter_frame(data, pos, fr, lo, stop)


def iter_columns(
    ops: StreamOps,
    sdir: Path,
    name: str,
    start: int,
    stop: int | None,
    max_records: int | None,
    chunk: int,
    note: Callable[[int], object] | None = None,
) -> Iterator[ColumnBatch]:
    """The records of [start, stop) up to the current end, one :class:`ColumnBatch` per frame."""
    left = max_records
    for data, pos, fr, lo in frame_spans(ops, sdir, name, start, stop, chunk, note):
        cols = frame_columns(data, pos, fr, lo, stop)
        if left is not None:
            if left <= len(cols):
                if left:
                    yield cols.head(left)
                return
            left -= len(cols)
        if len(cols):
            yield cols


def frame_spans(
    ops: StreamOps,
    sdir: Path,
    name: str,
    start: int,
    stop: int | None,
    chunk: int,
    note: Callable[[int], object] | None = None,
) -> Iterator[tuple[bytes, int, FrameHeader, int]]:
    """The frames holding [start, stop) up to the current end, in order.

    Yields ``(buffer, position of the frame in it, header, first offset wanted)``; the
    buffer is valid as long as the caller keeps it. ``note``, if given, is told the end
    offset of each frame yielded (a valid, complete frame: that much of the stream exists).

    A closed segment that reads short or torn is read again a few times, a little later
    each time, before it is called corrupt: on a shared filesystem a client's page cache
    can hold stale pages of a file another client appended to, for a moment after the
    other client's write (ceph-fuse invalidates them asynchronously).
    """
    if not ops.is_dir(sdir):
        raise StreamNotFound(f"stream {name!r} does not exist (looked in {sdir})")
    bases = list_segments(ops, sdir)
    if not bases:
        find_start(ops, sdir, name, bases, start, 0)
        return
    if start < bases[0]:
        find_start(ops, sdir, name, bases, start, bases[0])
    off = start
    i = max(bisect.bisect_right(bases, off) - 1, 0)
    seek = True
    while True:
        base = bases[i]
        path = sdir / segment_name(base)
        try:
            fd = ops.open_ro(path)
        except FileNotFoundError:
            # Retention removed it under us: start again from the current list.
            bases = list_segments(ops, sdir)
            if not bases or off < bases[0]:
                find_start(ops, sdir, name, bases, off, bases[0] if bases else 0)
                return
            i = max(bisect.bisect_right(bases, off) - 1, 0)
            seek = True
            continue
        except OSError as exc:
            raise storage_error("open a segment", exc, path) from exc
        try:
            pos = 0
            if seek:
                e = seek_entry(ops, fd, read_index(ops, sdir, base), off, ops.size(fd))
                pos = e.position if e else 0
                seek = False
            want = chunk
            rechecks = 0
            while True:
                data = ops.pread(fd, want, pos)
                sc = scan_frames(data, base=pos)
                for fr in sc.frames:
                    if fr.next_offset <= off:
                        continue
                    if note is not None:
                        note(fr.next_offset)
                    yield data, fr.position - pos, fr, off
                    off = fr.next_offset
                    if stop is not None and off >= stop:
                        return
                full = len(data) == want
                pos = sc.end
                if sc.problem is None and full:
                    want = chunk
                    continue
                if sc.incomplete and full:
                    want = max(chunk, sc.needed)
                    continue
                # End of what this segment holds now: is it closed?
                bases = list_segments(ops, sdir)
                later = [b for b in bases if b > base]
                if not later:
                    return  # the active segment: its end is the end of the stream
                if sc.problem is None and off >= later[0]:
                    i = bisect.bisect_left(bases, later[0])  # all of it read: the next one
                    break
                if rechecks < len(RECHECK_WAITS):
                    # closed since we read it, or a stale page: read its final bytes again
                    if rechecks:
                        ops.sleep(RECHECK_WAITS[rechecks])
                    rechecks += 1
                    want = chunk
                    continue
                what = f"has {sc.problem}" if sc.problem else "ends"
                raise CorruptDataError(
                    f"segment {path} {what} at byte {sc.end} although later "
                    f"segments exist; records from offset {off} to {later[0]} are "
                    "unreadable (restore the file from a copy, or move it away and "
                    "read from offset " + str(later[0]) + ")",
                    path,
                )
        except OSError as exc:
            raise storage_error("read a segment", exc, path) from exc
        finally:
            ops.close(fd)


def offset_for_time(ops: StreamOps, sdir: Path, name: str, ts_us: int, chunk: int) -> int:
    """The first offset whose timestamp is >= ``ts_us``, or the end offset if none."""
    bases = list_segments(ops, sdir)
    if not bases:
        return 0
    # The last segment whose records before it are all older than ts (index entry 0).
    firsts: list[int] = []
    for b in bases:
        idx = read_index(ops, sdir, b)
        firsts.append(idx[0].max_ts_before if idx and idx[0].position == 0 else I64_MIN)
    i = max(bisect.bisect_left(firsts, ts_us) - 1, 0)
    for base in bases[i:]:
        path = sdir / segment_name(base)
        try:
            fd = ops.open_ro(path)
        except FileNotFoundError:
            continue
        try:
            entries = read_index(ops, sdir, base)
            k = bisect.bisect_left([e.max_ts_before for e in entries], ts_us) - 1
            pos = 0
            while k >= 0:
                if _frame_at(ops, fd, entries[k].position, entries[k].offset):
                    pos = entries[k].position
                    break
                k -= 1
            want = chunk
            while True:
                data = ops.pread(fd, want, pos)
                sc = scan_frames(data, base=pos)
                for fr in sc.frames:
                    if fr.max_ts >= ts_us:
                        for off, t in frame_timestamps(data, fr.position - pos, fr):
                            if t >= ts_us:
                                return off
                full = len(data) == want
                pos = sc.end
                if sc.incomplete and full:
                    want = max(chunk, sc.needed)
                    continue
                if sc.problem is None and full:
                    want = chunk
                    continue
                break
        except OSError as exc:
            raise storage_error("read a segment", exc, path) from exc
        finally:
            ops.close(fd)
    return stream_end(ops, sdir, list_segments(ops, sdir), chunk)


def last_index_entry(ops: StreamOps, fd: int) -> tuple[int, IndexEntry | None]:
    """(usable size, last entry) of an open index file; a torn partial entry is not usable."""
    size = ops.size(fd)
    usable = size - size % INDEX_ENTRY.size
    if usable == 0:
        return 0, None
    raw = ops.pread(fd, INDEX_ENTRY.size, usable - INDEX_ENTRY.size)
    return usable, IndexEntry(*INDEX_ENTRY.unpack(raw))


def remove_debris(ops: StreamOps, directory: Path) -> int:
    """Remove the temp files a crashed rewrite left in ``directory``; return how many.

    Call it holding the lock under which such temp files are written: then every one
    found is debris.
    """
    n = 0
    for name in ops.listdir(directory):
        if name.startswith(".") and name.endswith(".tmp") and ops.remove(directory / name):
            n += 1
    if n:
        log.info("removed %d temp files left by a crash in %s", n, directory)
    return n
