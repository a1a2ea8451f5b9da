"""Recovery of the durable logs of dead processes (see :mod:`fsbus._bus.wal`).

Each process holds an exclusive ``flock`` on its log while it lives; a log nobody holds
is a dead process's. Written since this machine booted (its header's boot id is this
kernel's), its files are in the page cache or on disk: ``syncfs``, and it goes. Written
before a restart, every record after its checkpoint is replayed first: a file there with
the same bytes (its leading byte aside: a delivery count) stays, a missing, empty or
torn one is written back, unless its queue is gone. Either way the header is then
marked done (:data:`~fsbus._bus.logformat.ALL_DONE`) and synced, and the log removed.
An entry of the folder that is not a regular file, or a file that is not a log, goes
to the quarantine with a warning; a path that leaves the bus is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import stat

from .._errors import storage_error
from .logformat import (
    ALL_DONE,
    HEADER,
    SLOT,
    Header,
    decode_header,
    decode_records,
    encode_header,
    safe_relative,
)
from .ops import Ops

__all__ = ["recover"]

log = logging.getLogger("fsbus.fs")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def recover(root: str, ops: Ops, staging: str, quarantine: str, mine: set[str]) -> int:
    """Deal with the logs of dead processes on the bus at ``root`` (see the module's
    docstring); returns how many files were written again."""
    wal_dir = f"{root}/fsbus/wal"
    try:
        names = ops.listdir(wal_dir)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise storage_error("listing the durable logs", exc, wal_dir) from exc
    written = 0
    for name in sorted(names):
        path = f"{wal_dir}/{name}"
        if path in mine:
            continue
        try:
            st = ops.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error("looking at a durable log", exc, path) from exc
        if not stat.S_ISREG(st.st_mode):
            # a link, a folder, a pipe: no process of fsbus made it; it would make
            # every bus that opens here fail, so it goes where foreign files go
            _quarantine(ops, path, quarantine, "it is not a durable log fsbus wrote")
            continue
        try:
            fd = ops.open(path, os.O_RDWR | _O_CLOEXEC | _O_NOFOLLOW)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error("opening a durable log", exc, path) from exc
        try:
            try:
                ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue  # its process lives
                raise storage_error("locking a durable log", exc, path) from exc
            st = ops.fstat(fd)
            if st.st_nlink == 0:
                continue  # recovered and removed by another process just now
            try:
                written += _recover_one(root, ops, fd, path, st.st_size, staging, quarantine)
            except OSError as exc:
                raise storage_error("reading a durable log", exc, path) from exc
        finally:
            ops.close(fd)
    return written


def _recover_one(
    root: str, ops: Ops, fd: int, path: str, size: int, staging: str, quarantine: str
) -> int:
    head = ops.pread(fd, HEADER, 0)
    header = decode_header(head)
    if header is None:
        if any(head):
            _quarantine(ops, path, quarantine, "it is not a durable log fsbus wrote")
        else:
            # its process died while making it: it never held a record
            with contextlib.suppress(FileNotFoundError):
                ops.unlink(path)
        return 0
    written = 0
    if header.boot_id != ops.boot_id():
        buf = _read_all(ops, fd, size)
        for rec in decode_records(buf):
            if rec.seq <= header.checkpoint:
                continue
            for rel, data in rec.files:
                if not safe_relative(rel):
                    log.warning("durable log %s names %r, outside the bus: skipped", path, rel)
                    continue
                written += _restore(root, ops, rel, data, staging)
        if written:
            log.warning(
                "%d message file(s) written again from durable log %s after a "
                "restart of the machine (they were not on disk yet); a message consumed "
                "in the second before it may be delivered again",
                written,
                path,
            )
    try:
        ops.syncfs(fd)
        # Done, for good: should a power cut bring the log back (its removal is not
        # synced), it has nothing left to replay.
        done = Header(header.generation + 1, ALL_DONE, header.boot_id, header.pid)
        ops.pwrite(fd, encode_header(done), (done.generation % 2) * SLOT)
        ops.fdatasync(fd)
    except OSError as exc:
        raise storage_error("syncing the bus after a durable log's recovery", exc, path) from exc
    with contextlib.suppress(FileNotFoundError):
        ops.unlink(path)
    return written


def _read_all(ops: Ops, fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        b = ops.pread(fd, min(1 << 20, size - pos), pos)
        if not b:
            break
        chunks.append(b)
        pos += len(b)
    return b"".join(chunks)


def _restore(root: str, ops: Ops, rel: str, data: bytes, staging: str) -> int:
    """Put one file of a record back if it is not there whole; 1 if it was written."""
    target = f"{root}/{rel}"
    try:
        fd = ops.open(target, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
    except FileNotFoundError:
        have = None
    except OSError as exc:
        log.warning("%s, named by a durable log, left alone: %s", target, exc)
        return 0  # not a file we can read (a link planted there)
    else:
        try:
            have = _read_fd(ops, fd)
        except OSError as exc:
            log.warning("%s, named by a durable log, left alone: %s", target, exc)
            return 0  # a folder where the file was
        finally:
            ops.close(fd)
    if have is not None and len(have) == len(data) and have[1:] == data[1:]:
        return 0  # there whole (its leading byte may count a delivery since)
    folder = os.path.dirname(target)
    if have is None and not _exists(ops, folder) and not _exists(ops, os.path.dirname(folder)):
        return 0  # its queue (or its bus) is gone
    tmp = f"{staging}/restored-{secrets.token_hex(8)}"  # (a message's name may be 251 bytes)
    try:
        with contextlib.suppress(FileExistsError):
            ops.mkdir(folder, 0o777)  # (a bucket made for it, lost with it)
        wfd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | _O_NOFOLLOW)
        try:
            pos = 0
            while pos < len(data):
                pos += ops.write(wfd, memoryview(data)[pos:])
        finally:
            ops.close(wfd)
        ops.rename(tmp, target)
    except OSError as exc:
        # the log stays: the next bus to open tries again
        raise storage_error("writing back a message from a durable log", exc, target) from exc
    return 1


def _read_fd(ops: Ops, fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        b = ops.read(fd, 1 << 16)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _exists(ops: Ops, path: str) -> bool:
    try:
        ops.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _quarantine(ops: Ops, path: str, quarantine: str, why: str) -> None:
    dest = f"{quarantine}/{os.path.basename(path)}"
    try:
        ops.rename(path, dest)
    except OSError as exc:
        log.warning("durable log %s: %s, and moving it aside failed: %s", path, why, exc)
        return
    log.warning("%s: %s; moved to %s", path, why, dest)
