"""Fixtures of the fault suite: tiny real filesystems, other users, an inbox.

Mount-based fixtures need root (they mount a small tmpfs and unmount it afterwards) and
skip with the reason otherwise. Waiting is on conditions with deadlines, never a sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from fsbus import Message

WAIT = 15.0
"""Seconds a single wait may take before it fails the test."""

NOBODY = 65534


def is_root() -> bool:
    """Whether the tests run as root (mounts, other users)."""
    return os.geteuid() == 0


def mount_tmpfs(target: Path, options: str) -> None:
    """Mount a tmpfs at ``target`` or skip the test saying why."""
    if not is_root():
        pytest.skip("needs root to mount a small tmpfs (disk-full tests also run injected)")
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


def unmount(target: Path) -> None:
    """Unmount, lazily if something still holds the mount."""
    if subprocess.run(["umount", str(target)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs_at(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``mnt`` with ``options`` (or the test skipped), unmounted
    afterwards."""
    mount_tmpfs(mnt, options)
    try:
        yield mnt
    finally:
        unmount(mnt)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs with 200 inodes, unmounted afterwards."""
    with tmpfs_at(tmp_path / "small", "size=8m,nr_inodes=200,mode=0755") as mnt:
        yield mnt


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-writable directory outside pytest's private tmp tree (for other users)."""
    path = Path(tempfile.mkdtemp(prefix="fsbus-faults-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_BECOME = """
import json, os, sys, tempfile, time
from fsbus import BlockingBus, BusConfig, StreamConfig
# The interpreter lives under root's home; import and warm up everything first (a real
# subscription, so lazy imports happen; configs validated, which builds their validators
# on first use), then drop to the other user.
BusConfig(file_mode=0o666), StreamConfig(durability="none")
with tempfile.TemporaryDirectory() as _d, BlockingBus(_d + "/bus") as _b:
    with _b.messages("#") as _it:
        try:
            _it.get(timeout=0.01)
        except TimeoutError:
            pass
os.setgroups([])
os.setgid({uid})
os.setuid({uid})
"""


def run_python(
    code: str, *, user: int | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter, optionally as another user (uid)."""
    code = textwrap.dedent(code)
    if user is not None:
        if not is_root():
            pytest.skip("needs root to run a process as another user")
        code = _BECOME.format(uid=user) + code
    repo = str(Path(__file__).resolve().parents[2])
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env={**os.environ, "PYTHONPATH": repo},
        check=False,
    )


class Inbox:
    """An async handler recording what arrives, with a wait on a count."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._changed = anyio.Event()

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        self._changed.set()

    @property
    def topics(self) -> list[str]:
        """Topics received, in order."""
        return [m.topic for m in self.messages]

    async def wait_for(self, check: Callable[[list[Message]], bool], seconds: float = WAIT) -> None:
        """Wait until ``check(messages)`` holds."""
        with anyio.fail_after(seconds):
            while not check(self.messages):
                await self._changed.wait()
                self._changed = anyio.Event()

    async def wait(self, n: int, seconds: float = WAIT) -> None:
        """Wait until at least ``n`` messages arrived."""
        await self.wait_for(lambda ms: len(ms) >= n, seconds)


async def until(condition: Callable[[], bool], seconds: float = WAIT) -> None:
    """Wait for a condition on disk (no event to await there); fail after ``seconds``."""
    with anyio.fail_after(seconds):
        for _ in iter(int, 1):
            if condition():
                return
            await anyio.sleep(0.02)
