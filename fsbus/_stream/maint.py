"""Stream maintenance: retention (size, age, consumed) and compaction of closed segments.

Both take ``maint.lock`` (an flock) so two processes never delete or rewrite at once;
neither takes the append lock, so appends go on meanwhile. Only *closed* segments (every
segment but the newest) are ever deleted or rewritten, and always whole: a reader that
has a segment open keeps reading the old file; one that finds it gone starts again from
the segment list.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .._errors import storage_error
from .framing import (
    FrameHeader,
    Record,
    RecordIn,
    decode_frame,
    encode_frame,
    encode_index_entry,
    index_name,
    prepare,
    scan_frames,
    segment_name,
)
from .groups import min_committed
from .ops import StreamOps
from .segments import I64_MIN, list_segments, read_index, remove_debris
from .view import StreamView

__all__ = ["CompactionReport", "RetentionReport", "compact", "enforce_retention"]

log = logging.getLogger("fsbus.stream")


@dataclass(frozen=True)
class RetentionReport:
    """What a retention pass deleted."""

    deleted: tuple[int, ...]
    """Base offsets of the deleted segments, oldest first."""
    freed_bytes: int
    """Bytes of the deleted segment files."""
    start_offset: int
    """The stream's oldest offset afterwards."""


@dataclass(frozen=True)
class CompactionReport:
    """What a compaction pass rewrote."""

    segments: tuple[int, ...]
    """Base offsets of the rewritten segments."""
    removed_records: int
    """Records dropped because a newer record has the same key."""
    freed_bytes: int
    """Bytes saved."""


class _MaintLock:
    def __init__(self, ops: StreamOps, sdir: Path) -> None:
        self.ops = ops
        self.path = sdir / "maint.lock"
        self.fd = -1

    def __enter__(self) -> None:
        try:
            self.fd = self.ops.open_rw(self.path)
            self.ops.lock(self.fd)
        except OSError as exc:
            if self.fd >= 0:
                self.ops.close(self.fd)
            raise storage_error("take the maintenance lock", exc, self.path) from exc
        remove_debris(self.ops, self.path.parent)

    def __exit__(self, *exc: object) -> None:
        self.ops.close(self.fd)  # closing releases the flock


def enforce_retention(stream: StreamView) -> RetentionReport:
    """Delete the oldest closed segments that the stream's retention settings allow.

    A segment goes when the stream is over ``retention_bytes``, when its newest record is
    older than ``retention_seconds``, or (with ``delete_consumed``) when every consumer
    group has committed past it. Deletion stops at the first segment that must stay.
    """
    ops = stream.ops
    sdir = stream.path
    cfg = stream.config
    deleted: list[int] = []
    freed = 0
    with _MaintLock(ops, sdir):
        bases = list_segments(ops, sdir)
        sizes = {b: ops.file_size(sdir / segment_name(b)) or 0 for b in bases}
        total = sum(sizes.values())
        now_us = round(ops.now() * 1_000_000)
        consumed = min_committed(stream) if cfg.delete_consumed else None
        for i, base in enumerate(bases[:-1]):
            end = bases[i + 1]
            reasons = []
            if cfg.retention_bytes is not None and total > cfg.retention_bytes:
                reasons.append("size")
            if cfg.retention_seconds is not None:
                newest = _newest_before(ops, sdir, end)
                if newest is not None and newest < now_us - cfg.retention_seconds * 1e6:
                    reasons.append("age")
            if consumed is not None and end <= consumed:
                reasons.append("consumed")
            if not reasons:
                break
            seg = sdir / segment_name(base)
            try:
                ops.remove(seg)
                ops.remove(sdir / index_name(base))
            except OSError as exc:
                raise storage_error("delete a segment", exc, seg) from exc
            log.info("stream %s: deleted segment %s (%s)", stream.name, base, ", ".join(reasons))
            deleted.append(base)
            freed += sizes[base]
            total -= sizes[base]
    left = list_segments(ops, sdir)
    return RetentionReport(tuple(deleted), freed, left[0] if left else 0)


def _newest_before(ops: StreamOps, sdir: Path, next_base: int) -> int | None:
    """Largest timestamp (µs) of the records before segment ``next_base`` (index entry 0)."""
    idx = read_index(ops, sdir, next_base)
    if idx and idx[0].position == 0 and idx[0].max_ts_before != I64_MIN:
        return idx[0].max_ts_before
    return None


def _frames(ops: StreamOps, path: Path) -> Iterator[tuple[bytes, FrameHeader]]:
    """Every frame of a closed segment with the buffer holding it."""
    fd = ops.open_ro(path)
    try:
        data = ops.pread(fd, ops.size(fd), 0)
    finally:
        ops.close(fd)
    sc = scan_frames(data)
    if sc.problem is not None:
        from .._errors import CorruptDataError

        raise CorruptDataError(
            f"segment {path} has {sc.problem} at byte {sc.end}; compaction stopped before "
            "rewriting it (restore the segment from a copy)",
            path,
        )
    for fr in sc.frames:
        yield data, fr


def compact(stream: StreamView) -> CompactionReport:
    """Keep only the newest record of each key in the closed segments.

    Records without a key are kept. Offsets do not change (compacted frames record the
    gaps). Each rewritten segment is replaced atomically: written beside it, synced,
    renamed over it.
    """
    ops = stream.ops
    sdir = stream.path
    cfg = stream.config
    rewritten: list[int] = []
    removed = 0
    freed = 0
    with _MaintLock(ops, sdir):
        bases = list_segments(ops, sdir)
        if len(bases) < 2:
            return CompactionReport((), 0, 0)
        newest: dict[bytes, int] = {}
        for r in stream.read(bases[0]):
            if r.key is not None:
                newest[r.key] = r.offset
        for base in bases[:-1]:
            path = sdir / segment_name(base)
            try:
                frames = list(_frames(ops, path))
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
            out: list[bytes | bytearray] = []
            index: list[bytes] = []
            pos = 0
            last_index = -(1 << 62)
            max_ts = I64_MIN
            idx = read_index(ops, sdir, base)
            if idx and idx[0].position == 0:
                max_ts = idx[0].max_ts_before
            index.append(encode_index_entry(base, 0, max_ts))
            dropped_here = 0
            for n, (data, fr) in enumerate(frames):
                recs = decode_frame(data, fr.position, fr)
                keep = [r for r in recs if r.key is None or newest.get(r.key) == r.offset]
                dropped_here += len(recs) - len(keep)
                if not keep and n != len(frames) - 1:
                    continue
                if len(keep) == len(recs):
                    frame: bytes | bytearray = data[fr.position : fr.end]
                else:
                    frame = _reframe(keep, fr, cfg.max_record_bytes)
                if pos - last_index >= cfg.index_interval_bytes and pos > 0:
                    index.append(encode_index_entry(fr.base_offset, pos, max_ts))
                    last_index = pos
                max_ts = max(max_ts, fr.max_ts)
                out.append(frame)
                pos += len(frame)
            if not dropped_here:
                continue
            old_size = sum(fr.length for _, fr in frames)
            _replace_segment(ops, sdir, base, b"".join(out), b"".join(index))
            rewritten.append(base)
            removed += dropped_here
            freed += old_size - pos
            log.info(
                "stream %s: compacted segment %d (%d records dropped)",
                stream.name,
                base,
                dropped_here,
            )
    return CompactionReport(tuple(rewritten), removed, freed)


def _reframe(keep: list[Record], fr: FrameHeader, max_record_bytes: int) -> bytearray:
    prepared = [
        prepare(
            RecordIn(r.value, key=r.key, headers=dict(r.headers) or None, timestamp=r.timestamp),
            max_record_bytes=max_record_bytes,
        )
        for r in keep
    ]
    return encode_frame(
        prepared,
        [r.offset for r in keep],
        base_offset=fr.base_offset,
        last_delta=fr.last_offset - fr.base_offset,
        default_ts_us=fr.first_ts,
    )


def _replace_segment(ops: StreamOps, sdir: Path, base: int, data: bytes, index: bytes) -> None:
    seg = sdir / segment_name(base)
    try:
        ops.write_atomic(seg, data, durable=True)
        ops.write_atomic(sdir / index_name(base), index, durable=True)
    except OSError as exc:
        raise storage_error("rewrite a compacted segment", exc, seg) from exc
