"""The append side of a stream: the append lock, tail recovery, rolling, the index, and
appending staged segments (renamed in as segments, or copied).

One writer per :class:`~fsbus.Stream` handle. Every append takes a thread lock and the
stream's ``append.lock`` flock, then *syncs*: it checks (one fstat and one stat) whether
other writers appended, rolled a new segment, or died leaving a torn tail, and catches
up before writing at the end of the newest segment.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import ClosedError, CorruptDataError, LockingUnsupported, storage_error
from .framing import (
    INDEX_ENTRY,
    Encoded,
    IndexEntry,
    encode_frames,
    encode_index_entry,
    encoded,
    index_name,
    segment_name,
)
from .ops import StreamOps
from .segments import (
    I64_MIN,
    last_index_entry,
    list_segments,
    read_index,
    scan_segment,
    seek_entry,
)
from .staged import rebase, staged_records

if TYPE_CHECKING:
    from .config import Settings

__all__ = ["RecoveryInfo", "Writer"]

log = logging.getLogger("fsbus.stream")


@dataclass(frozen=True, slots=True)
class RecoveryInfo:
    """A torn tail found and cut by a writer."""

    segment: str
    """Path of the segment whose tail was cut."""
    position: int
    """Byte position where the valid data ended (the new size of the segment)."""
    cut_bytes: int
    """How many bytes were cut."""
    reason: str
    """What was wrong with the bytes (cut short, checksum, not a frame)."""
    next_offset: int
    """The offset the next append gets."""


class Writer:
    """Appends to one stream directory; thread-safe, and process-safe through flock."""

    def __init__(self, sdir: Path, config: Settings, ops: StreamOps) -> None:
        self._dir = sdir
        self._dir_s = str(sdir)
        self._config = config
        self._ops = ops
        self._tlock = threading.Lock()
        lock_path = sdir / "append.lock"
        try:
            self._lock_fd = ops.open_rw(lock_path)
        except OSError as exc:
            raise storage_error("open the append lock", exc, lock_path) from exc
        self._seg_fd: int | None = None
        self._idx_fd: int | None = None
        self._base = -1
        self._size = 0
        self._next = 0
        self._max_ts = I64_MIN
        self._last_index_pos = -(1 << 62)
        self._closed = False
        self.recoveries: list[RecoveryInfo] = []
        self.rolled = False
        self._pid = ops.pid()

    # --- public --------------------------------------------------------------------------

    def append(
        self,
        items: Sequence[object],
        *,
        now_us: Callable[[], int],
        encode: Callable[[Sequence[object], int, int], Encoded] | None = None,
    ) -> range:
        """Frame ``items`` (bytes or prepared records) at the end of the stream."""
        enc = encode or self._encode
        with self._tlock:
            if self._closed:
                raise ClosedError("this stream handle is closed; open the stream again")
            ops = self._ops
            self._take_lock()
            try:
                self._sync()
                first = self._next
                if self._config.durability == "record" and len(items) > 1:
                    for item in items:
                        self._write_frames(enc([item], self._next, now_us()), sync=True)
                else:
                    self._write_frames(
                        enc(items, self._next, now_us()),
                        sync=self._config.durability != "none",
                    )
                return range(first, self._next)
            finally:
                ops.unlock(self._lock_fd)

    def append_staged(self, paths: Sequence[Path], *, copy_below: int) -> range:
        """Append staged segments (see :mod:`.staged`; files in the stream's directory) in
        order, with one hold of the lock.

        A file of at least ``copy_below`` bytes becomes a segment of its own (renamed: no
        data is copied); a smaller one is written at the end of the newest segment, then
        removed. Either way the file is gone from its path on return. Every file is
        checked before any is appended: a corrupt one appends nothing.
        """
        with self._tlock:
            if self._closed:
                raise ClosedError("this stream handle is closed; open the stream again")
            self._take_lock()
            staged: list[_Staged] = []
            try:
                self._sync()
                first = self._next
                for path in paths:
                    staged.append(self._open_staged(Path(path), copy_below))
                base = self._next
                for st in staged:
                    st.base = base
                    base += st.count
                self._rebase_all(staged)
                copied = False
                for st in staged:
                    if st.adopt:
                        self._adopt(st)
                    elif st.size:
                        self._copy(st)
                        copied = True
                    else:
                        self._ops.remove(st.path)
                if copied and self._config.durability != "none":
                    assert self._seg_fd is not None
                    self._ops.fdatasync(self._seg_fd)
                return range(first, self._next)
            except OSError as exc:
                raise storage_error(
                    f"append staged records to stream {self._dir.name!r}", exc, self._dir
                ) from exc
            finally:
                for st in staged:
                    st.release(self._ops)
                self._ops.unlock(self._lock_fd)

    @property
    def end(self) -> int:
        """The offset the next append gets, as of this writer's last hold of the lock."""
        return self._next

    def recover(self) -> list[RecoveryInfo]:
        """Take the lock and validate the tail now; return the cuts made (if any)."""
        with self._tlock:
            if self._closed:
                raise ClosedError("this stream handle is closed; open the stream again")
            before = len(self.recoveries)
            self._take_lock()
            try:
                self._sync()
            finally:
                self._ops.unlock(self._lock_fd)
            return self.recoveries[before:]

    def close(self) -> None:
        """Release the descriptors (idempotent)."""
        with self._tlock:
            if self._closed:
                return
            self._closed = True
            self._drop_segment()
            self._ops.close(self._lock_fd)

    # --- internals -----------------------------------------------------------------------

    def _take_lock(self) -> None:
        if self._pid != self._ops.pid():
            self._after_fork()
        try:
            self._ops.lock(self._lock_fd)
        except OSError as exc:
            path = self._dir / "append.lock"
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise LockingUnsupported(
                    f"cannot flock the append lock {path}: {exc.strerror}; this mount does "
                    "not support flock, so appends cannot be serialised here (use a local "
                    "or lock-forwarding mount, or append from one host through another path)",
                    path,
                ) from exc
            raise storage_error("take the append lock", exc, path) from exc

    def _encode(self, items: Sequence[object], base: int, now_us: int) -> Encoded:
        return encode_frames(
            items,  # type: ignore[arg-type]
            base,
            now_us=now_us,
            max_frame_bytes=self._config.max_frame_bytes,
        )

    def _after_fork(self) -> None:
        """In a forked child: get descriptors of our own.

        A forked child shares its parent's open file descriptions, flocks included, so
        the parent's lock would not exclude the child; the child opens the lock file
        again (the parent's descriptors stay open for the parent) and forgets the tail.
        """
        lock_path = self._dir / "append.lock"
        try:
            self._lock_fd = self._ops.open_rw(lock_path)
        except OSError as exc:
            raise storage_error("open the append lock", exc, lock_path) from exc
        self._seg_fd = self._idx_fd = None
        self._base = -1
        self._pid = self._ops.pid()

    def _drop_segment(self) -> None:
        if self._seg_fd is not None:
            self._ops.close(self._seg_fd)
        if self._idx_fd is not None:
            self._ops.close(self._idx_fd)
        self._seg_fd = self._idx_fd = None
        self._base = -1

    def _sync(self) -> None:
        """Catch up with the files: other writers, rolls, retention, torn tails."""
        ops = self._ops
        try:
            for _ in range(1_000_000):
                if self._seg_fd is None:
                    bases = list_segments(ops, self._dir)
                    if not bases:
                        self._roll(first=True)
                        return
                    self._open_segment(bases[-1])
                    continue
                st = ops.stat(self._seg_fd)
                if st.st_nlink == 0:
                    # Compacted (replaced) or deleted: find the newest segment again.
                    self._drop_segment()
                    continue
                if st.st_size != self._size:
                    if st.st_size < self._size:
                        self._open_segment(self._base)
                        continue
                    self._scan_from(self._size, self._next)
                    self._refresh_index()
                if self._next != self._base and ops.exists(
                    f"{self._dir_s}/{segment_name(self._next)}"  # str: no Path per append
                ):
                    self._open_segment(self._next)
                    continue
                if self._size >= self._config.segment_bytes:
                    self._roll(first=False)
                return
        except OSError as exc:
            raise storage_error("prepare to append", exc, self._dir) from exc

    def _open_segment(self, base: int) -> None:
        ops = self._ops
        self._drop_segment()
        seg_path = self._dir / segment_name(base)
        self._seg_fd = ops.open_rw(seg_path, create=False)
        self._idx_fd = ops.open_append(self._dir / index_name(base))
        self._base = base
        size = ops.size(self._seg_fd)
        entries = read_index(ops, self._dir, base)
        e = seek_entry(ops, self._seg_fd, entries, 2**64, size)
        floor = entries[0].max_ts_before if entries and entries[0].position == 0 else I64_MIN
        if e is None:
            self._scan_from(0, base, max(floor, self._max_ts))
        else:
            self._scan_from(e.position, e.offset, max(e.max_ts_before, self._max_ts))
        self._refresh_index()

    def _scan_from(self, pos: int, next_offset: int, max_ts: int | None = None) -> None:
        """Validate frames from ``pos`` to the end; cut a torn tail."""
        ops = self._ops
        assert self._seg_fd is not None
        seg_path = self._dir / segment_name(self._base)
        sc = scan_segment(
            ops,
            self._seg_fd,
            pos=pos,
            next_offset=next_offset,
            max_ts=self._max_ts if max_ts is None else max_ts,
            chunk=self._config.read_chunk_bytes,
        )
        if sc.problem is not None:
            if sc.followed:
                raise CorruptDataError(
                    f"segment {seg_path} has {sc.problem} at byte {sc.end}, and valid frames "
                    "follow it, so it is not a torn tail; appends stop here to keep the "
                    "data: restore the segment from a copy, or cut it at that byte by hand",
                    seg_path,
                )
            cut = sc.size - sc.end
            ops.truncate(self._seg_fd, sc.end)
            info = RecoveryInfo(str(seg_path), sc.end, cut, sc.problem, sc.next_offset)
            self.recoveries.append(info)
            log.warning(
                "stream %s: cut a torn tail of %d bytes at byte %d of %s (%s); "
                "the next offset is %d",
                self._dir.name,
                cut,
                sc.end,
                seg_path,
                sc.problem,
                sc.next_offset,
            )
        self._size = sc.end
        self._next = sc.next_offset
        self._max_ts = sc.max_ts

    def _refresh_index(self) -> None:
        """Drop a torn entry and entries past the valid end; note the last position."""
        ops = self._ops
        assert self._idx_fd is not None
        usable, last = last_index_entry(ops, self._idx_fd)
        while last is not None and 0 < last.position and last.position >= self._size:
            usable -= INDEX_ENTRY.size
            last = _entry_at(ops, self._idx_fd, usable - INDEX_ENTRY.size) if usable else None
        if usable != ops.size(self._idx_fd):
            ops.truncate(self._idx_fd, usable)
        self._last_index_pos = last.position if last is not None else -(1 << 62)

    def _roll(self, *, first: bool) -> None:
        """Start segment ``self._next`` (its index first, with the entry for byte 0)."""
        ops = self._ops
        base = self._next
        durable = self._config.durability != "none"
        if durable and self._seg_fd is not None:
            ops.fdatasync(self._seg_fd)  # the old segment is complete before the new one
        self._drop_segment()
        idx_path = self._dir / index_name(base)
        seg_path = self._dir / segment_name(base)
        idx_fd = ops.open_rw(idx_path, truncate=True)
        try:
            ops.pwrite(idx_fd, encode_index_entry(base, 0, self._max_ts), 0)
        finally:
            ops.close(idx_fd)
        self._seg_fd = ops.open_rw(seg_path)
        self._idx_fd = ops.open_append(idx_path)
        self._base = base
        self._size = 0
        self._last_index_pos = 0
        if durable:
            ops.fsync_dir(self._dir)
        if not first:
            self.rolled = True

    def _open_staged(self, path: Path, copy_below: int) -> _Staged:
        """Open and map a staged segment, and count its records (its frame headers)."""
        ops = self._ops
        st = _Staged(path, ops.open_rw(path, create=False))
        st.size = ops.size(st.fd)
        if not st.size:
            return st
        try:
            st.buf = ops.map_rw(st.fd, st.size)
        except OSError:  # a mount that cannot map the file shared: rewrite it instead
            st.buf = bytearray(ops.pread(st.fd, st.size, 0))
        st.count = staged_records(st.buf)
        st.adopt = st.size >= copy_below
        return st

    def _rebase_all(self, staged: list[_Staged]) -> None:
        """Check and rebase every file (in threads when there are several large ones: the
        hashing and the syncs leave the GIL); an adopted file's new headers are written
        back and synced here, before any file is renamed."""
        work = [st for st in staged if st.size]
        if len(work) > 1 and sum(st.size for st in work) >= _PARALLEL_BYTES:
            with ThreadPoolExecutor(max_workers=min(len(work), os.cpu_count() or 1)) as pool:
                for future in [pool.submit(self._rebase, st) for st in work]:
                    future.result()
        else:
            for st in work:
                self._rebase(st)

    def _rebase(self, st: _Staged) -> None:
        assert st.buf is not None
        st.frames, st.next_offset = rebase(st.buf, st.base, path=str(st.path))
        if not st.adopt:
            return
        ops = self._ops
        if isinstance(st.buf, bytearray):
            ops.pwrite(st.fd, st.buf, 0)  # the rebased frames, where the file could not be mapped
        if self._config.durability != "none":
            if isinstance(st.buf, mmap.mmap):
                st.buf.flush()
            ops.fdatasync(st.fd)  # the new headers are on disk before the name is
        # an adopted file is renamed, never read again here: unmap it now, in this thread
        # (unmapping 50 MB takes about 5 ms; in the caller's thread, one file after another)
        if isinstance(st.buf, mmap.mmap):
            st.buf.close()
        st.buf = None

    def _copy(self, st: _Staged) -> None:
        """Write a rebased staged segment at the end of the newest segment; remove it."""
        assert st.buf is not None
        view = memoryview(st.buf)
        try:
            self._write_frames(encoded(view, tuple(st.frames), st.next_offset), sync=False)
        finally:
            view.release()
        self._ops.remove(st.path)

    def _adopt(self, st: _Staged) -> None:
        """Rename a rebased staged segment into the stream as its newest segment."""
        ops = self._ops
        base = self._next
        assert st.base == base
        durable = self._config.durability != "none"
        seg_path = self._dir / segment_name(base)
        idx_path = self._dir / index_name(base)
        entries, last_pos, max_ts = _index_entries(
            st.frames, 0, 0, self._max_ts, self._config.index_interval_bytes
        )
        entries.insert(0, encode_index_entry(base, 0, self._max_ts))  # as a roll writes it
        if durable and self._seg_fd is not None and self._size:
            ops.fdatasync(self._seg_fd)  # the old segment is complete before the new one
        idx_fd = ops.open_rw(idx_path, truncate=True)
        try:
            ops.pwrite(idx_fd, b"".join(entries), 0)
        finally:
            ops.close(idx_fd)
        # in the stream's directory: replaces an empty newest segment of this base, and
        # one sync makes the new name and the staged name's removal durable together
        ops.rename(st.path, seg_path)
        if durable:
            ops.fsync_dir(self._dir)
        self._drop_segment()
        self._seg_fd, st.fd = st.fd, -1  # the segment's descriptor now
        self._idx_fd = ops.open_append(idx_path)
        self._base = base
        self._size = st.size
        self._next = st.next_offset
        self._max_ts = max_ts
        self._last_index_pos = last_pos
        self.rolled = True

    def _write_frames(self, enc: Encoded, *, sync: bool) -> None:
        """Write the frames, rolling to a new segment between frames when one is full."""
        limit = self._config.segment_bytes
        frames = enc.frames
        n = len(frames)
        if n <= 1 or self._size + enc.size <= limit:
            self._write(enc, sync=sync)
            return
        i = 0
        while i < n:
            if self._size >= limit:
                self._roll(first=False)
            start = frames[i][1]
            room = limit - self._size
            j = i + 1
            while j < n and frames[j][1] - start < room:
                j += 1
            end = frames[j][1] if j < n else enc.size
            part = Encoded(
                tuple(enc.cut(start, end)),
                tuple((off, pos - start, mts) for off, pos, mts in frames[i:j]),
                frames[j][0] if j < n else enc.next_offset,
                end - start,
            )
            self._write(part, sync=sync and j == n)
            i = j

    def _write(self, enc: Encoded, *, sync: bool) -> None:
        ops = self._ops
        assert self._seg_fd is not None
        assert self._idx_fd is not None
        if not enc.frames:
            return
        pos = self._size
        parts = enc.parts
        try:
            if len(parts) == 1:
                ops.pwrite(self._seg_fd, parts[0], pos)
            else:
                ops.pwritev(self._seg_fd, parts, pos)
        except OSError as exc:
            try:
                ops.truncate(self._seg_fd, pos)  # leave no partial frame behind
            except OSError:
                pass  # the next writer cuts it as a torn tail
            raise storage_error(
                f"append to stream {self._dir.name!r}", exc, self._dir / segment_name(self._base)
            ) from exc
        entries, self._last_index_pos, max_ts = _index_entries(
            enc.frames, pos, self._last_index_pos, self._max_ts, self._config.index_interval_bytes
        )
        self._size = pos + enc.size
        self._next = enc.next_offset
        self._max_ts = max_ts
        try:
            if entries:
                ops.write(self._idx_fd, b"".join(entries))
            if sync:
                ops.fdatasync(self._seg_fd)
        except OSError as exc:
            raise storage_error(
                f"append to stream {self._dir.name!r}", exc, self._dir / segment_name(self._base)
            ) from exc


_PARALLEL_BYTES = 16 << 20
"""Staged files of this many bytes in all are rebased in threads."""


@dataclass(slots=True)
class _Staged:
    """A staged segment being appended."""

    path: Path
    fd: int
    size: int = 0
    buf: mmap.mmap | bytearray | None = None
    count: int = 0
    base: int = 0
    adopt: bool = False
    frames: list[tuple[int, int, int]] = field(default_factory=list)
    next_offset: int = 0

    def release(self, ops: StreamOps) -> None:
        """Unmap, and close the descriptor unless the writer took it (``fd`` -1)."""
        if isinstance(self.buf, mmap.mmap):
            self.buf.close()
        self.buf = None
        if self.fd >= 0:
            ops.close(self.fd)
            self.fd = -1


def _index_entries(
    frames: Sequence[tuple[int, int, int]], at: int, last_pos: int, max_ts: int, interval: int
) -> tuple[list[bytes], int, int]:
    """Index entries for ``frames`` written from byte ``at`` of a segment (pure).

    An entry goes to each frame at least ``interval`` bytes after the last entry (at
    ``last_pos``); returns them, the position of the last entry and the largest
    timestamp after the frames.
    """
    entries: list[bytes] = []
    for off, fpos, fmax in frames:
        pos = at + fpos
        if pos - last_pos >= interval and pos > 0:
            entries.append(encode_index_entry(off, pos, max_ts))
            last_pos = pos
        if fmax > max_ts:
            max_ts = fmax
    return entries, last_pos, max_ts


def _entry_at(ops: StreamOps, fd: int, pos: int) -> IndexEntry:
    return IndexEntry(*INDEX_ENTRY.unpack(ops.pread(fd, INDEX_ENTRY.size, pos)))
