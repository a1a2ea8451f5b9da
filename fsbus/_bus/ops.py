"""The system calls fsbus makes, behind one object (the I/O seam's seam).

Every bus file operation goes through an :class:`Ops` instance, so a test can pass a
subclass that fails the way a full disk, a read-only remount or a stolen file would,
without mocking the rest of the system. The default instance is a thin pass-through.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
from collections.abc import Sequence
from typing import Any

from .._core.mounts import MountReader

__all__ = ["DEFAULT_OPS", "Ops"]


class Ops(MountReader):
    """Pass-through to :mod:`os` and :mod:`fcntl`; subclass to inject faults.

    It also reads the mount table and the statfs magic (:class:`MountReader`), so a test
    can show the bus a filesystem it is not on.
    """

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        """``os.open``; O_NOFOLLOW and O_CLOEXEC are the caller's business."""
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        """``os.close``."""
        os.close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        """``os.write``."""
        return os.write(fd, data)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        """``os.writev``."""
        return os.writev(fd, buffers)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """``os.pwrite``."""
        return os.pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """``os.pread``."""
        return os.pread(fd, size, offset)

    def pread_into(self, fd: int, buffer: mmap.mmap, offset: int) -> int:
        """``os.preadv`` into one buffer (page-aligned, as ``O_DIRECT`` needs); bytes read."""
        return os.preadv(fd, [buffer], offset)

    def drop_cache(self, fd: int) -> None:
        """``posix_fadvise(DONTNEED)``: the next read of ``fd`` asks the filesystem."""
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def subdirs(self, path: str) -> set[str]:
        """Names of the real directories (not links) in ``path``: one listing."""
        with os.scandir(path) as it:
            return {e.name for e in it if e.is_dir(follow_symlinks=False)}

    def read(self, fd: int, size: int) -> bytes:
        """``os.read``."""
        return os.read(fd, size)

    def fstat(self, fd: int) -> os.stat_result:
        """``os.fstat``."""
        return os.fstat(fd)

    def lstat(self, path: str) -> os.stat_result:
        """``os.lstat``."""
        return os.lstat(path)

    def fdatasync(self, fd: int) -> None:
        """``os.fdatasync``."""
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        """``os.fsync``."""
        os.fsync(fd)

    def syncfs(self, fd: int) -> None:
        """``syncfs(2)``: everything written to the filesystem holding ``fd`` on disk
        (``os.sync``, every filesystem, where there is no syncfs)."""
        _syncfs(fd)

    def boot_id(self) -> str:
        """This kernel's boot id ("" where there is none): it changes when the machine
        restarts, so a test can show the bus a restart by returning another."""
        return (self.read_text("/proc/sys/kernel/random/boot_id") or "").strip()

    def ftruncate(self, fd: int, size: int) -> None:
        """``os.ftruncate``."""
        os.ftruncate(fd, size)

    def fchmod(self, fd: int, mode: int) -> None:
        """``os.fchmod``."""
        os.fchmod(fd, mode)

    def rename(self, src: str, dst: str) -> None:
        """``os.rename`` (atomic within one filesystem)."""
        os.rename(src, dst)

    def link(self, src: str, dst: str) -> None:
        """``os.link`` (fails with EEXIST instead of replacing ``dst``)."""
        os.link(src, dst)

    def unlink(self, path: str) -> None:
        """``os.unlink``."""
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        """``os.listdir``."""
        return os.listdir(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        """``os.mkdir``."""
        os.mkdir(path, mode)

    def chmod(self, path: str, mode: int) -> None:
        """``os.chmod`` (never follows a symlink)."""
        os.chmod(path, mode, follow_symlinks=False)

    def utime(self, path: str) -> None:
        """``os.utime`` to now (never follows a symlink)."""
        os.utime(path, follow_symlinks=False)

    def flock(self, fd: int, operation: int) -> None:
        """``fcntl.flock``."""
        fcntl.flock(fd, operation)

    def copy_range(self, src_fd: int, dst_fd: int, count: int) -> int:
        """Copy up to ``count`` bytes between files in the kernel where possible."""
        try:
            return os.copy_file_range(src_fd, dst_fd, count)
        except OSError:
            data = os.read(src_fd, min(count, 1 << 20))
            if data:
                os.write(dst_fd, data)
            return len(data)


_libc_syncfs: Any = None


def _syncfs(fd: int) -> None:
    global _libc_syncfs
    if _libc_syncfs is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).syncfs
            fn.argtypes = (ctypes.c_int,)
            _libc_syncfs = fn
        except (OSError, AttributeError):
            _libc_syncfs = False
    if _libc_syncfs is False:
        os.sync()
        return
    if _libc_syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


DEFAULT_OPS = Ops()
