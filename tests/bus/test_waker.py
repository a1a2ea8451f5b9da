"""The scanner's wake-ups from inotify (fsbus._core.watch.Waker), on both event loops.

On asyncio the inotify descriptor stays registered with the loop; on trio it is read
through ``wait_readable``. Both must wake the scanner for a write in the watched
directory, keep events queued in the kernel during a quiet spell, and leave nothing
registered once the task that reads them ends.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from fsbus._core.watch import Waker

pytestmark = pytest.mark.anyio

WAIT = 10.0


def _stamp(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"x")


@contextlib.asynccontextmanager
async def _running(tmp_path: Path) -> AsyncIterator[tuple[Waker, Path]]:
    """A waker on ``tmp_path`` with its reader running; stopped afterwards."""
    waker = Waker(str(tmp_path), use_inotify=True)
    if not waker.start():
        pytest.skip("no inotify descriptor on this system")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(waker.run)
            await anyio.lowlevel.checkpoint()  # the reader is listening once run started
            yield waker, tmp_path / "UPDATE"
            tg.cancel_scope.cancel()
    finally:
        waker.stop()


async def test_a_write_wakes_the_scanner(tmp_path: Path) -> None:
    async with _running(tmp_path) as (waker, update):
        for _ in range(3):  # and keeps listening after each event
            _stamp(update)
            with anyio.fail_after(WAIT):
                assert await waker.wait(WAIT)
            assert waker.take_fs_event()


async def test_no_event_means_no_wake(tmp_path: Path) -> None:
    async with _running(tmp_path) as (waker, _):
        assert not await waker.wait(0.05)
        assert not waker.take_fs_event()


async def test_a_quiet_spell_keeps_events_until_it_ends(tmp_path: Path) -> None:
    async with _running(tmp_path) as (waker, update):
        _stamp(update)
        with anyio.fail_after(WAIT):
            assert await waker.wait(WAIT)
        waker.take_fs_event()
        # The scanner asks for quiet: what happens meanwhile waits in the kernel.
        spell = 0.3
        waker.quiet_until = time.monotonic() + spell
        _stamp(update)  # the event the reader sees: it then rests for the spell
        with anyio.fail_after(WAIT):
            assert await waker.wait(WAIT)
        waker.take_fs_event()
        _stamp(update)  # during the spell: not read, no wake
        woke_early = await waker.wait(max(0.0, waker.quiet_until - time.monotonic() - 0.05))
        assert not woke_early
        with anyio.fail_after(WAIT):  # the spell over, the kept event wakes it
            assert await waker.wait(WAIT)
        assert waker.take_fs_event()
        assert time.monotonic() >= waker.quiet_until


async def test_the_descriptor_is_let_go_when_the_reader_ends(tmp_path: Path) -> None:
    async with _running(tmp_path) as (waker, _):
        assert waker._fd is not None
    # stopped: the descriptor is closed and the loop no longer watches it, so a new
    # descriptor that gets the same number is accepted afresh
    assert waker._fd is None
    r, w = os.pipe()
    try:
        with anyio.fail_after(WAIT):
            os.write(w, b"x")
            await anyio.wait_readable(r)
    finally:
        os.close(r)
        os.close(w)


def _inotify_descriptors() -> int:
    """How many inotify instances this process holds open."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                n += 1
    return n


async def test_a_stopped_waker_closes_its_inotify_instance(tmp_path: Path) -> None:
    before = _inotify_descriptors()
    async with _running(tmp_path):
        assert _inotify_descriptors() == before + 1
    # closed in a thread of its own (the kernel ends an instance with a watch only after
    # a grace period, which stop() does not wait for): gone soon, not left open
    with anyio.fail_after(WAIT):
        while _inotify_descriptors() > before:  # noqa: ASYNC110
            await anyio.sleep(0.01)
