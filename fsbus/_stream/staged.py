"""Segments framed away from the append lock, then appended whole.

A producer with many records to append (each Spark task of a write, say) frames them
itself, in parallel with the others, into *staged segments*: files of ordinary frames
whose offsets count from 0, made by :meth:`fsbus.Stream.stager` in the stream's own
directory (``.staged.<prefix>.<n>.seg``; ``.part`` while written). Then
:meth:`fsbus.Stream.append_staged` takes the append lock once and gives the frames their
offsets, which rewrites 8 bytes and the checksum of each frame header (48 bytes a frame,
about one a MiB). A large file is then renamed into a segment of its own, so no byte of
its data is copied; a small one is written at the end of the newest segment, as any
append is (renamed, a small batch at a time would make many small segments).

The staged files sit beside the segments so that the rename changes one directory: one
sync of it makes the new segment durable and the staged name gone together, where a
rename between two directories can leave both names after a power cut (one file with two
links, which a stream refuses as planted) or neither.

Pure: :func:`rebase` works on a buffer. I/O: :class:`SegmentStager` (writing) and the
writer's ``append_staged`` (appending), both through the streams' I/O seam.
"""

from __future__ import annotations

import re
import struct
import uuid
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import xxhash

from .._errors import CorruptDataError, UsageError, storage_error
from .defaults import Defaults
from .framing import (
    HEADER_SIZE,
    ColumnBatch,
    Encoded,
    FrameScan,
    RecordIn,
    encode_frames,
    encode_packed,
    encode_value_frame,
    frame_columns,
    prepare,
    scan_frames,
    too_large,
)
from .ops import IOV_MAX, StreamOps

if TYPE_CHECKING:
    from .config import Settings

__all__ = [
    "ADOPT_BYTES",
    "PREFIX",
    "SUFFIX",
    "SegmentStager",
    "StagedSegment",
    "check_frame_bytes",
    "check_prefix",
    "is_staged_name",
    "read_staged_columns",
    "rebase",
    "staged_records",
]

ADOPT_BYTES = 8 << 20
"""A staged segment at least this large is renamed into the stream, not copied."""
PREFIX = ".staged."
"""The name start of every staged file (complete or being written) in a stream."""
SUFFIX = ".seg"
"""The name ending of a complete staged segment file."""
_PARTIAL = ".part"
_PREFIX_RE = re.compile(r"[A-Za-z0-9_~-][A-Za-z0-9_.~-]{0,199}")


def check_prefix(prefix: object) -> str:
    """A stager's prefix: 1-200 letters, digits and ``_ . ~ -``, not starting with a dot."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise UsageError(
            f"a stager prefix must be 1-200 letters, digits, '_', '.', '~' or '-', not "
            f"starting with '.', got {prefix!r}"
        )
    return prefix


def check_frame_bytes(n: object) -> int:
    """A stager's frame size: 256 bytes to 4 GiB, as ``StreamConfig.max_frame_bytes``."""
    if isinstance(n, bool) or not isinstance(n, int) or not 256 <= n <= (1 << 32) - 1:
        raise UsageError(f"frame_bytes must be an int from 256 to 2**32 - 1, got {n!r}")
    return n


def is_staged_name(name: str) -> bool:
    """Whether ``name`` is a complete staged segment's file name."""
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


_U64 = struct.Struct("<Q")
_BASE_AT = 16  # byte of base_offset in a frame header (see framing.HEADER)


@dataclass(frozen=True, slots=True)
class StagedSegment:
    """One staged segment file, complete (written, then renamed to its name)."""

    path: str
    """The file."""
    records: int
    """Records it holds (their offsets count from 0 in the file)."""
    size: int
    """Its size in bytes."""


def rebase(buf: Any, base: int, *, path: str) -> tuple[list[tuple[int, int, int]], int]:
    """Give the frames of a staged segment held in ``buf`` (writable) the offsets from
    ``base`` on: each header's base offset is rewritten and its checksum taken again.
    Each frame's checksum is checked first, and the frames must follow each other with
    no gap, as a stager writes them (from 0; a file rebased before, by an append that
    failed, starts where that one put it); else :class:`CorruptDataError` names ``path``.

    Returns ``(frames, next_offset)``: per frame its new first offset, its position and
    its largest timestamp (as :class:`~.framing.Encoded` lists them), and the offset
    after the last record.
    """
    scan = _whole_frames(buf, path)
    hash64 = xxhash.xxh64_intdigest
    mv = memoryview(buf)
    first = scan.frames[0].base_offset if scan.frames else 0
    expect = first
    frames: list[tuple[int, int, int]] = []
    for f in scan.frames:
        if f.base_offset != expect:
            raise CorruptDataError(
                f"staged segment {path} has a frame for offset {f.base_offset} at byte "
                f"{f.position} where offset {expect} belongs: its frames must follow each "
                "other with no gap; remove it and stage the records again",
                Path(path),
            )
        offset = base + expect - first
        frames.append((offset, f.position, f.max_ts))
        _U64.pack_into(buf, f.position + _BASE_AT, offset)
        _U64.pack_into(buf, f.position, hash64(mv[f.position + 8 : f.end]))
        expect = f.next_offset
    mv.release()
    return frames, base + expect - first


def read_staged_columns(path: str | Path, *, ops: StreamOps | None = None) -> Iterator[ColumnBatch]:
    """The records of a staged segment, a frame at a time, as columns (offsets from the
    file's first frame, 0 for a file not appended yet). Raises
    :class:`~fsbus.CorruptDataError` for a file that is not whole frames."""
    from .ops import DEFAULT_OPS

    ops = ops if ops is not None else DEFAULT_OPS
    p = Path(path)
    try:
        fd = ops.open_ro(p)
        try:
            data = ops.pread(fd, ops.size(fd), 0)
        finally:
            ops.close(fd)
    except OSError as exc:
        raise storage_error("read staged records", exc, p) from exc
    scan = _whole_frames(data, p)
    for f in scan.frames:
        yield frame_columns(data, f.position, f)


def _whole_frames(buf: Any, path: str | Path) -> FrameScan:
    """Every frame of a staged segment, checksums checked; CorruptDataError if it is not
    whole frames."""
    scan = scan_frames(buf, verify=True)
    if scan.problem is not None:
        raise CorruptDataError(
            f"staged segment {path} has {scan.problem} at byte {scan.end}: it was not "
            "written whole by a stager; remove it and stage the records again",
            Path(path),
        )
    return scan


def staged_records(buf: Any) -> int:
    """How many records the frames of a staged segment held in ``buf`` hold, from their
    headers (checksums are checked by :func:`rebase`); 0 where it is not frames."""
    scan = scan_frames(buf, verify=False)
    if not scan.frames:
        return 0
    return scan.frames[-1].next_offset - scan.frames[0].base_offset


class SegmentStager:
    """Frames records into staged segments ``.staged.<prefix>.<n>.seg`` of one stream.

    Made by :meth:`fsbus.Stream.stager`. Each file is written under a temporary name
    (``.part``) and renamed when complete, cut where the next batch would take it past
    ``config.segment_bytes``. With ``durable`` each file is synced before its rename and
    the directory after it, so a commit that names the files finds them after a power
    cut. Not thread-safe: one stager per producer.
    """

    ADOPT_BYTES: ClassVar[int] = ADOPT_BYTES
    """A staged segment at least this large is renamed into the stream, not copied."""
    PREFIX: ClassVar[str] = PREFIX
    """The name start of every staged file in a stream (complete or being written)."""
    SUFFIX: ClassVar[str] = SUFFIX
    """The name ending of a complete staged segment file."""

    def __init__(
        self,
        directory: Path,
        prefix: str,
        *,
        config: Settings | None = None,
        durable: bool = True,
        frame_bytes: int | None = None,
        ops: StreamOps | None = None,
    ) -> None:
        from .ops import DEFAULT_OPS

        self._dir = Path(directory)
        self._prefix = check_prefix(prefix)
        self._config: Settings = config if config is not None else Defaults()
        self._durable = durable
        self._frame_bytes = check_frame_bytes(
            self._config.max_frame_bytes if frame_bytes is None else frame_bytes
        )
        self._ops = ops if ops is not None else DEFAULT_OPS
        self._done: list[StagedSegment] = []
        self._fd: int | None = None
        self._tmp: Path | None = None
        self._size = 0
        self._records = 0
        self._pending: list[tuple[memoryview, array[int]]] = []
        self._pending_bytes = 0

    @property
    def segments(self) -> list[StagedSegment]:
        """The files completed so far."""
        return list(self._done)

    def add_values(self, data: Any, lengths: array[int]) -> None:
        """Frame plain values lying back to back in ``data`` (``lengths``: ``array('I')``).

        Values of several calls share a frame, up to ``frame_bytes``: the buffers are
        written where they lie, not joined (a read-only buffer is kept, not copied, until
        its frame is written; a writable one is copied, lest it change meanwhile).
        """
        if not lengths:
            return
        view = memoryview(data).cast("B")
        limit = self._config.max_record_bytes
        # no value is longer than all of them: look at each only where one could be too
        # large (a pass over a million lengths costs ~20 ms)
        if len(view) > limit and (biggest := max(lengths)) > limit:
            raise too_large(biggest, limit)
        if not view.readonly:
            view = memoryview(view.tobytes())
        size = len(view) + 4 * len(lengths)
        budget = self._frame_bytes - HEADER_SIZE
        if self._pending and self._pending_bytes + size > budget:
            self._flush()
        if size > budget:  # frames of its own, cut to size
            self._add(
                lambda base: encode_packed(
                    view, lengths, base, now_us=self._now_us(), max_frame_bytes=self._frame_bytes
                )
            )
            return
        self._pending.append((view, lengths))
        self._pending_bytes += size

    def add_records(self, items: Sequence[bytes | RecordIn]) -> None:
        """Frame records: plain values (``bytes``) and :class:`~fsbus.RecordIn`."""
        if not items:
            return
        self._flush()
        limit = self._config.max_record_bytes
        batch: list[Any] = []
        for x in items:
            if type(x) is bytes:
                if len(x) > limit:
                    raise too_large(len(x), limit)
                batch.append(x)
            else:
                batch.append(prepare(x, max_record_bytes=limit))
        self._add(
            lambda base: encode_frames(
                batch, base, now_us=self._now_us(), max_frame_bytes=self._frame_bytes
            )
        )

    def finish(self) -> list[StagedSegment]:
        """Complete the last file; every file staged, in order."""
        self._flush()
        self._close_file()
        if self._durable and self._done:
            try:
                self._ops.fsync_dir(self._dir)
            except OSError as exc:
                raise storage_error("stage records", exc, self._dir) from exc
        return list(self._done)

    def abort(self) -> None:
        """Remove the file being written and every file completed (idempotent)."""
        self._pending.clear()
        self._pending_bytes = 0
        fd, tmp = self._fd, self._tmp
        self._fd = self._tmp = None
        if fd is not None:
            self._ops.close(fd)
        if tmp is not None:
            self._ops.remove(tmp)
        for seg in self._done:
            self._ops.remove(Path(seg.path))
        self._done.clear()

    # --- internals -----------------------------------------------------------------------

    def _now_us(self) -> int:
        return round(self._ops.now() * 1_000_000)

    def _flush(self) -> None:
        """Write the values waiting for their frame as one frame."""
        if not self._pending:
            return
        pieces = self._pending
        self._pending = []
        self._pending_bytes = 0
        now = self._now_us()
        self._add(lambda base: encode_value_frame(pieces, base, now))

    def _add(self, encode: Any) -> None:
        enc: Encoded = encode(self._records)
        if self._fd is not None and self._size + enc.size > self._config.segment_bytes:
            self._close_file()
            enc = encode(0)
        if self._fd is None:
            self._open_file()
        assert self._fd is not None
        try:
            parts = list(enc.parts)
            pos = self._size
            for i in range(0, len(parts), IOV_MAX):
                chunk = parts[i : i + IOV_MAX]
                self._ops.pwritev(self._fd, chunk, pos)
                pos += sum(len(p) for p in chunk)
            if self._durable:
                # the disk writes while the producer makes its next batch: the sync at
                # the end waits for the last of it only
                self._ops.start_writeback(self._fd, self._size, enc.size)
        except OSError as exc:
            self.abort()
            raise storage_error("stage records", exc, self._dir) from exc
        self._size += enc.size
        self._records = enc.next_offset

    def _open_file(self) -> None:
        ops = self._ops
        try:
            self._tmp = self._dir / f"{PREFIX}{self._prefix}.{uuid.uuid4().hex}{_PARTIAL}"
            self._fd = ops.open_rw(self._tmp, truncate=True)
        except OSError as exc:
            raise storage_error("stage records", exc, self._dir) from exc
        self._size = 0
        self._records = 0

    def _close_file(self) -> None:
        fd, tmp = self._fd, self._tmp
        if fd is None or tmp is None:
            return
        ops = self._ops
        path = self._dir / f"{PREFIX}{self._prefix}.{len(self._done)}{SUFFIX}"
        try:
            if self._durable:
                ops.fdatasync(fd)
            ops.close(fd)
            self._fd = None
            ops.rename(tmp, path)
        except OSError as exc:
            self.abort()
            raise storage_error("stage records", exc, path) from exc
        self._tmp = None
        self._done.append(StagedSegment(str(path), self._records, self._size))
