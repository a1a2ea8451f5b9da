"""Two mounts of one directory through bindfs (FUSE): two "hosts" for the tests.

With ``--enable-lock-forwarding`` their flocks exclude each other, like two NFS clients
with a lock manager; without it each mount keeps its locks to itself, like sshfs across
hosts. inotify on one mount does not see writes made through the other. Needs root and
/dev/fuse; bindfs is installed with apt-get when missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MOUNT_WAIT = 20.0
"""Seconds a bindfs may take to mount, or to end after its unmount."""


def _bindfs() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount bindfs (FUSE)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse for bindfs")
    exe = shutil.which("bindfs")
    if exe is None:
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "bindfs"], capture_output=True, check=False
        )
        exe = shutil.which("bindfs")
    if exe is None:
        pytest.skip("bindfs is not installed and apt-get could not install it")
    return exe


def _unmount(target: Path) -> None:
    """Unmount, lazily if something still holds the mount."""
    if subprocess.run(["umount", str(target)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


def mount_pair(tmp_path: Path, *, forward_locks: bool) -> Iterator[tuple[Path, Path, Path]]:
    """(backing directory, host A's mount, host B's mount) under ``tmp_path``, for as long
    as the generator runs.

    Each bindfs runs in the foreground (``-f``), a child of this process, and is ended
    after its unmount: daemonized, one whose unmount had to be lazy (a stress child
    still exiting) was left running after the suite.
    """
    exe = _bindfs()
    backing, a, b = tmp_path / "backing", tmp_path / "host-a", tmp_path / "host-b"
    for d in (backing, a, b):
        d.mkdir()
    opts = ["--multithreaded"] + (["--enable-lock-forwarding"] if forward_locks else [])
    daemons: list[tuple[Path, subprocess.Popen[str]]] = []
    try:
        for m in (a, b):
            proc = subprocess.Popen(
                [exe, "-f", *opts, str(backing), str(m)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            daemons.append((m, proc))
            deadline = time.monotonic() + MOUNT_WAIT
            while not os.path.ismount(m) and proc.poll() is None:
                if time.monotonic() > deadline:
                    pytest.fail(f"bindfs did not mount {m} within {MOUNT_WAIT} s")
                time.sleep(0.01)
            if proc.poll() is not None:
                pytest.skip(f"bindfs could not mount: {proc.communicate()[1].strip()}")
        yield backing, a, b
    finally:
        for m, proc in daemons:
            _unmount(m)
            proc.terminate()
            try:
                proc.wait(timeout=MOUNT_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
