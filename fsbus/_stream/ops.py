"""The I/O seam of streams: every ``os`` call, ``open`` and ``flock`` of the stream code.

Methods raise plain :class:`OSError`; the engine turns them into
:class:`~fsbus.StorageError` subclasses with what it was doing. Tests inject faults by
passing a subclass of :class:`StreamOps` (for example one whose ``pwrite`` fails with
ENOSPC after some bytes).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import stat
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._core.mounts import MountReader

__all__ = ["IOV_MAX", "StreamOps"]

_HAS_PWRITEV = hasattr(os, "pwritev")
IOV_MAX: int = 1024
"""Most buffers one vectored write takes (the system's limit where it says)."""
try:
    IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):
    pass


class StreamOps(MountReader):
    """Files, locks and clocks, as the stream engine uses them (and the mount table)."""

    # --- clock ---------------------------------------------------------------------------

    def now(self) -> float:
        """Wall-clock time, seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """A clock that never goes back (timeouts, leases measured locally)."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block this thread (the blocking faces poll between checks)."""
        time.sleep(seconds)

    # --- directories ---------------------------------------------------------------------

    def makedirs(self, path: Path) -> None:
        """Create ``path`` and its parents if missing, durably.

        The parent of each directory it creates is fsynced: a record or commit synced
        under a new directory must not vanish with the directory's name at a power cut.
        """
        missing: list[Path] = []
        p = Path(path)
        while not os.path.lexists(p) and p.parent != p:
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
        for d in reversed(missing):
            self.fsync_dir(d.parent)

    def listdir(self, path: Path) -> list[str]:
        """Names in ``path`` ([] if it does not exist)."""
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def is_dir(self, path: Path) -> bool:
        """Whether ``path`` is a directory."""
        return os.path.isdir(path)

    def rmdir(self, path: Path) -> None:
        """Remove an empty directory."""
        os.rmdir(path)

    def exists(self, path: Path | str) -> bool:
        """Whether ``path`` exists."""
        return os.path.exists(path)

    def fsync_dir(self, path: Path) -> None:
        """Make the directory's entries (creates, renames) durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- files by descriptor --------------------------------------------------------------

    def open_rw(self, path: Path, *, create: bool = True, truncate: bool = False) -> int:
        """Open for reading and writing (not O_APPEND: writers use pwrite at a known end).

        ``truncate`` empties the file once it is known to be the stream's own.
        """
        flags = os.O_RDWR | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT
        fd = _own_file(os.open(path, flags, 0o666), path)
        if truncate:
            os.ftruncate(fd, 0)
        return fd

    def open_append(self, path: Path) -> int:
        """Open for appending, creating the file if missing."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        return _own_file(os.open(path, flags, 0o666), path)

    def open_ro(self, path: Path) -> int:
        """Open for reading."""
        return _own_file(os.open(path, os.O_RDONLY | os.O_CLOEXEC), path)

    def close(self, fd: int) -> None:
        """Close a descriptor, ignoring errors (it is going away anyway)."""
        try:
            os.close(fd)
        except OSError:
            pass

    def size(self, fd: int) -> int:
        """Current size of the file."""
        return os.fstat(fd).st_size

    def stat(self, fd: int) -> os.stat_result:
        """fstat of the descriptor."""
        return os.fstat(fd)

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (short only at the end of the file)."""
        data = os.pread(fd, n, pos)
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
        while got < n:
            more = os.pread(fd, n - got, pos + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
        """Write all of ``data`` at ``pos``."""
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, pos)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[n:]
            pos += n

    def pwritev(self, fd: int, parts: Sequence[bytes | bytearray | memoryview], pos: int) -> None:
        """Write all of ``parts``, one after another, at ``pos``: one vectored write per
        :data:`IOV_MAX` buffers, and the rest again after a short write."""
        if not _HAS_PWRITEV:
            self.pwrite(fd, b"".join(parts), pos)
            return
        todo = list(parts)
        i = 0
        while i < len(todo):
            chunk = todo[i : i + IOV_MAX]
            n = os.pwritev(fd, chunk, pos)
            if n <= 0 and any(chunk):
                raise OSError(errno.EIO, "short write")
            pos += n
            for part in chunk:  # skip what was written; keep the rest of a part cut short
                size = len(part)
                if n < size:
                    todo[i] = memoryview(part)[n:]
                    break
                n -= size
                i += 1

    def map_rw(self, fd: int, size: int) -> mmap.mmap:
        """Map ``size`` bytes of ``fd`` read-write and shared (writes go to the file)."""
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def write(self, fd: int, data: bytes | bytearray) -> None:
        """Write all of ``data`` at the current position (O_APPEND files)."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def truncate(self, fd: int, size: int) -> None:
        """Cut the file to ``size`` bytes."""
        os.ftruncate(fd, size)

    def fdatasync(self, fd: int) -> None:
        """Make the file's data durable."""
        os.fdatasync(fd)

    def start_writeback(self, fd: int, pos: int, n: int) -> None:
        """Start writing ``n`` bytes from ``pos`` back to the disk, without waiting for it
        (Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``): an ``fdatasync`` later finds
        less left to do. No promise of durability; nothing where it is not supported."""
        _start_writeback(fd, pos, n)

    def fsync(self, fd: int) -> None:
        """Make the file's data and metadata durable."""
        os.fsync(fd)

    # --- locks ---------------------------------------------------------------------------

    def lock(self, fd: int) -> None:
        """Take the exclusive flock of ``fd``, waiting for it."""
        fcntl.flock(fd, fcntl.LOCK_EX)

    def try_lock(self, fd: int) -> bool:
        """Take the exclusive flock of ``fd`` if free; False if someone holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self, fd: int) -> None:
        """Release the flock of ``fd``."""
        fcntl.flock(fd, fcntl.LOCK_UN)

    # --- whole files ---------------------------------------------------------------------

    def read_file(self, path: Path) -> bytes | None:
        """The whole file, or None if it does not exist."""
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_atomic(
        self, path: Path, data: bytes, *, durable: bool, sync_file: bool = False
    ) -> None:
        """Replace ``path`` with ``data``: temp file, (fsync), rename, (fsync directory).

        Readers see the old contents or the new, never a mix. ``durable`` syncs the file
        and the directory (the rename survives a machine crash); ``sync_file`` syncs only
        the file, so a machine crash leaves the old contents or the new, never an empty
        file.
        """
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            self.write(fd, data)
            if durable or sync_file:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.remove(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            self.remove(tmp)
            raise
        if durable:
            self.fsync_dir(path.parent)

    def write_in_place(self, path: Path, data: bytes) -> None:
        """Overwrite ``path`` from byte 0 with ``data`` (same inode: no name to go stale)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            self.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        """Atomically replace ``dst`` by ``src``."""
        os.replace(src, dst)

    def remove(self, path: Path) -> bool:
        """Unlink ``path``; False if it was already gone."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def mtime(self, path: Path) -> float | None:
        """Modification time of ``path``, or None if it is gone."""
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            return None

    def identity(self, path: Path) -> tuple[int, int] | None:
        """(inode, mtime in ns) of ``path``, or None if it is gone: changes when replaced."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def file_size(self, path: Path) -> int | None:
        """Size of ``path``, or None if it is gone."""
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None

    def pid(self) -> int:
        """This process's id (for consumer names)."""
        return os.getpid()

    def hostname(self) -> str:
        """This host's name (for consumer names)."""
        return os.uname().nodename

    def device(self, path: Path) -> int:
        """The device number of the filesystem (mount) holding ``path``."""
        return os.stat(path).st_dev

    def kernel_id(self) -> str:
        """Who shares our kernel (and so our flocks): the boot id, else the host name.

        Containers may share a host name across machines; the boot id is unique per
        machine boot and shared by every container of one kernel.
        """
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                return f.read().strip() or self.hostname()
        except OSError:
            return self.hostname()


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Any = None


def _start_writeback(fd: int, pos: int, n: int) -> None:
    global _sync_file_range
    if _sync_file_range is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            _sync_file_range = fn
        except (OSError, AttributeError):  # not Linux, or no such call
            _sync_file_range = False
    if _sync_file_range:
        _sync_file_range(fd, pos, n, _SYNC_FILE_RANGE_WRITE)  # a failure is only a hint lost


DEFAULT_OPS = StreamOps()


def _own_file(fd: int, path: Path) -> int:
    """``fd`` if it is a regular file with no other name; else close it and raise.

    Streams never hard-link their files: a segment, index or offset file with more
    than one link is a link to some other file that someone placed in the stream.
    Reading it would leak that file and recovering or truncating it would destroy it.
    """
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        return fd
    os.close(fd)
    if stat.S_ISREG(st.st_mode):
        reason = f"a hard link with {st.st_nlink} names, not a file of this stream"
        raise OSError(errno.EMLINK, reason, str(path))
    raise OSError(errno.EINVAL, "not a regular file", str(path))
