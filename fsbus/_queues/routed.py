"""Markers of qlobber-fsq peers' messages routed into the queues, and what a router that
died half way through left to copy.

A peer's message is routed by the first fsbus process to create its marker,
``fsbus/queues/.routed/<bucket>/<name>``. The marker is a small text file:

- line 1: the message's topic, UTF-8 then hex (it is what a later router needs to route
  it again);
- one line per queue whose copy is in place;
- then the router makes it read-only (mode 0444): routing is done.

While it copies, the router holds an exclusive ``flock`` on the marker. The marker appears
already locked and holding its topic: it is written under a temporary name and linked into
place. So a marker that is writable and whose lock is free belongs to a router that died
(or failed) before it was done; whoever takes its lock finishes the job, into the queues
its lines do not name. A copy renamed into its queue just before a crash, and not yet
written down, is made again: the one duplicate the window allows, where losing the message
was the alternative.

An empty marker comes from an older fsbus, or from a mount without hard links: it is taken
as done (as it always was).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
import uuid

_DONE_MODE = 0o444
_TMP = ".tmp."


class RouteMark:
    """This process's claim on routing one peer's message: its marker, locked."""

    __slots__ = ("_fd", "bucket", "copied", "name", "topic")

    def __init__(self, fd: int, bucket: str, name: str, topic: str, copied: set[str]) -> None:
        self._fd = fd
        self.bucket = bucket
        self.name = name
        self.topic = topic
        self.copied = copied
        """Queues whose copy is already in place (by a router that died)."""

    def copied_into(self, queue: str) -> None:
        """Write down that ``queue`` has its copy."""
        self.copied.add(queue)
        with contextlib.suppress(OSError):
            os.write(self._fd, f"{queue}\n".encode())

    def done(self) -> None:
        """Every bound queue has its copy (or the message is gone): no one routes it again."""
        with contextlib.suppress(OSError):
            os.fchmod(self._fd, _DONE_MODE)

    def close(self) -> None:
        """Let the lock go; unless :meth:`done` ran, a later router finishes the job."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def claim(
    base: str, bucket: str, name: str, topic: str, resumable: bool = True
) -> RouteMark | None:
    """Claim the routing of a peer's message: a :class:`RouteMark` for the one process,
    on any host, that creates its marker first, or that finds it left half done by a
    router that died; None when it is routed, or being routed, by another.

    ``resumable``: whether ``flock`` crosses every host of the mount. Where it does not
    (the bus claims work by rename there), a free lock says nothing of a router on
    another host, so a marker is never taken over: whoever creates it routes it."""
    folder = f"{base}/.routed/{bucket}"
    path = f"{folder}/{name}"
    tmp = f"{folder}/{_TMP}{uuid.uuid4().hex}"
    for _ in range(2):
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
    else:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, topic.encode().hex().encode() + b"\n")
        os.link(tmp, path)
    except FileExistsError:
        os.close(fd)
        _unlink(tmp)
        return resume(base, bucket, name) if resumable else None
    except OSError:
        # no hard links (or no flock) here: the marker says only "routed", as it always did
        os.close(fd)
        _unlink(tmp)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except OSError:
            return None
        return RouteMark(-1, bucket, name, topic, set())
    _unlink(tmp)
    return RouteMark(fd, bucket, name, topic, set())


def resume(base: str, bucket: str, name: str) -> RouteMark | None:
    """Take over an existing marker left half done, or None (done, or its router lives)."""
    path = f"{base}/.routed/{bucket}/{name}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # gone, or read-only (done) and this user may not write it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o200:
            os.close(fd)
            return None  # done
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None  # its router is copying it now
        st = os.fstat(fd)  # as it is now that no one else writes it
        data = os.pread(fd, min(st.st_size, 1 << 20), 0) if st.st_mode & 0o200 else b""
    except BaseException:
        os.close(fd)
        raise
    lines = data.split(b"\n")[:-1]  # a last line without its newline was never finished
    if not lines:
        os.close(fd)
        return None  # done (or from an older fsbus, which wrote nothing)
    try:
        topic = bytes.fromhex(lines[0].decode("ascii")).decode()
    except ValueError:
        os.close(fd)
        return None  # not ours to read: leave it
    return RouteMark(fd, bucket, name, topic, {x.decode("ascii", "replace") for x in lines[1:]})


def abandoned(base: str, messages: str, resumable: bool = True) -> list[RouteMark]:
    """Claims on the markers whose router died before it was done, while their message is
    still in the bus (each locked: copy, then :meth:`RouteMark.done` and close); none
    where ``flock`` does not cross hosts (see :func:`claim`)."""
    out: list[RouteMark] = []
    if not resumable:
        return out
    top = f"{base}/.routed"
    for bucket in _listdir(top):
        for name in _listdir(f"{top}/{bucket}"):
            if name.startswith(_TMP):
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(f"{top}/{bucket}/{name}")
                if not st.st_mode & 0o200 or not st.st_size:
                    continue  # done
                if not os.path.lexists(f"{messages}/{bucket}/{name}"):
                    continue
                mark = resume(base, bucket, name)
                if mark is not None:
                    out.append(mark)
    return out


def sweep(base: str, messages: str, min_age: float = 60.0) -> int:
    """Remove the markers of peers' messages that are gone, and temporary files of
    routers that died, once older than ``min_age`` (a process may still be listing the
    message as new)."""
    removed = 0
    top = f"{base}/.routed"
    now = time.time()
    for bucket in _listdir(top):
        for name in _listdir(f"{top}/{bucket}"):
            path = f"{top}/{bucket}/{name}"
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime < min_age:
                    continue
                if name.startswith(_TMP) or not os.path.lexists(f"{messages}/{bucket}/{name}"):
                    os.unlink(path)
                    removed += 1
    return removed


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
