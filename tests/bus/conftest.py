"""Shared fixtures and helpers of the in-process bus tests.

Everything here runs on real temporary directories with the real :class:`fsbus.Bus`;
faults are injected through an :class:`fsbus._bus.ops.Ops` subclass (the I/O seam), never
by mocking. Waiting is always on a condition with a deadline, never a bare sleep.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fsbus import BusConfig, Message
from fsbus._bus.ops import Ops

WAIT = 30.0
"""Seconds any single wait in these tests may take before it fails the test."""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A bus directory that does not exist yet (the bus creates it)."""
    return tmp_path / "bus"


def peer_buckets(root: Path, config: BusConfig | None = None) -> None:
    """Make every bucket directory of ``messages`` and ``topics``, as a qlobber-fsq peer
    does when it starts (fsbus makes a bucket when its first file goes in, on a local
    mount): for tests that plant files in buckets by hand."""
    from fsbus._bus.layout import Layout

    layout = Layout.of(str(root), config or BusConfig())
    for parent in (layout.messages, layout.topics):
        for b in layout.buckets:
            os.makedirs(f"{parent}/{b}", exist_ok=True)


@pytest.fixture
def fast() -> BusConfig:
    """Defaults, but retries and polls quick enough for redelivery tests."""
    return BusConfig(poll_interval=0.05, retry_interval=0.05)


class Inbox:
    """An async handler that records what it receives and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._changed = anyio.Event()

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        self._changed.set()

    async def wait_for(self, count: int, seconds: float = WAIT) -> list[Message]:
        """Wait until at least ``count`` messages arrived; returns all of them."""
        with anyio.fail_after(seconds):
            while len(self.messages) < count:
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.messages

    async def wait_topic(self, topic: str, seconds: float = WAIT) -> Message:
        """Wait for a message on ``topic``; returns it."""
        with anyio.fail_after(seconds):
            while True:
                for m in self.messages:
                    if m.topic == topic:
                        return m
                self._changed = anyio.Event()
                await self._changed.wait()

    @property
    def topics(self) -> list[str]:
        """Topics received, in order."""
        return [m.topic for m in self.messages]

    @property
    def payloads(self) -> list[bytes]:
        """Payloads received, in order."""
        return [m.payload for m in self.messages]


async def wait_until(check: Callable[[], bool], seconds: float = WAIT) -> None:
    """Poll a condition on disk (or in counters) until it holds, or fail the test."""
    # Files and counters have no event to wait on: poll them, with a deadline.
    with anyio.fail_after(seconds):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def wait_until_blocking(check: Callable[[], bool], timeout: float = WAIT) -> None:
    """The blocking twin of :func:`wait_until`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(0.01)


def files_under(path: Path) -> list[str]:
    """Relative paths of every regular file or link below ``path`` (sorted)."""
    out = []
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            out.append(os.path.relpath(os.path.join(dirpath, n), path))
    return sorted(out)


def message_files(root: Path) -> list[str]:
    """``<bucket>/<name>`` of every file in the message buckets."""
    return files_under(root / "messages")


def is_flocked(path: str | os.PathLike[str]) -> bool:
    """Whether anyone holds a flock on ``path`` (probe with a fresh descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class RecordingOps(Ops):
    """Pass-through that records syncs, placements (rename or link into a bucket, once
    done) and directories made."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.paths: dict[int, str] = {}

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def fdatasync(self, fd: int) -> None:
        self.calls.append(("fdatasync", self.paths[fd]))
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self.calls.append(("fsync", self.paths[fd]))
        super().fsync(fd)

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self.calls.append(("place", f"{src} -> {dst}"))

    def link(self, src: str, dst: str) -> None:
        # Placing by link (then unlinking the staging name) is placing all the same.
        super().link(src, dst)
        self.calls.append(("place", f"{src} -> {dst}"))

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        super().mkdir(path, mode)
        self.calls.append(("mkdir", path))

    def copy_range(self, src_fd: int, dst_fd: int, count: int) -> int:
        n = super().copy_range(src_fd, dst_fd, count)
        self.calls.append(("copy_range", f"{count}:{n}"))
        return n


class FailingOps(Ops):
    """Fails one kind of call with an errno once ``armed`` (for staging-area faults)."""

    def __init__(self, op: str, err: int, *, where: str = "/staging/") -> None:
        self.op = op
        self.err = err
        self.where = where
        self.armed = False
        self.paths: dict[int, str] = {}

    def _maybe_fail(self, op: str, path: str) -> None:
        if self.armed and op == self.op and self.where in path:
            raise OSError(self.err, os.strerror(self.err), path)

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        self._maybe_fail("open", path)
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._maybe_fail("write", self.paths.get(fd, ""))
        return super().write(fd, data)

    def writev(self, fd: int, buffers: object) -> int:  # type: ignore[override]
        self._maybe_fail("write", self.paths.get(fd, ""))
        return super().writev(fd, buffers)  # type: ignore[arg-type]

    def rename(self, src: str, dst: str) -> None:
        self._maybe_fail("place", src)
        super().rename(src, dst)

    def link(self, src: str, dst: str) -> None:
        self._maybe_fail("place", src)
        super().link(src, dst)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fdatasync", self.paths.get(fd, ""))
        super().fdatasync(fd)

    def copy_range(self, src_fd: int, dst_fd: int, count: int) -> int:
        self._maybe_fail("write", self.paths.get(dst_fd, ""))
        return super().copy_range(src_fd, dst_fd, count)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        self._maybe_fail("mkdir", path)
        super().mkdir(path, mode)


ERRNO_NAMES = {errno.EACCES: "EACCES", errno.EROFS: "EROFS", errno.ENOSPC: "ENOSPC"}
