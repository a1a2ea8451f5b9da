"""Scratch directories on the filesystems under test, made and removed by the harness.

- ``disk``: the machine's disk as it is (a temp dir under /tmp, or $FSBUS_BENCH_DISK_DIR);
- ``ext4loop``: a loop-mounted journaled ext4 image (root only), the typical server case;
- ``tmpfs``: a tmpfs mounted by the harness (root), else /dev/shm.

Scratch data never lands inside the repository.

On ext4 without a journal (the ``disk`` here) the kernel
avoids reusing an inode freed less than 1 minute ago (6 if its inode table block is not
yet written back): ``recently_deleted()`` in fs/ext4/ialloc.c. It finds that out by
stepping over every such inode of the block group on each create, so a create costs
2-5 µs normally and 100-300 µs in a group where a few thousand files were just deleted
(by the previous system, an earlier run's cleanup, or anyone else on the machine). The
raw loop used to swing between 4 k and 115 k messages/s with it. So that every system
measures the same thing, the ``disk`` scratch directory is marked as a top of directory
hierarchies (``chattr +T``: the Orlov allocator gives each new subdirectory the emptiest
block group) and :meth:`Scratch.workdir` probes the group it got and moves on when creates
there are slow. The allocator's first choice would be the group the previous measurement
has just emptied (the slowest of all), so :meth:`Scratch.remove` leaves one empty directory
in each group a measurement used, until the end. Files are still deleted right after each
measurement: their data was never written back, so deleting it is cheap (kept to the end
and written back, 30,000 files took 65 s to delete here: the disk is mounted ``discard``).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

NAMES = ("disk", "ext4loop", "tmpfs")


@dataclass(frozen=True)
class Scratch:
    """A place to run in."""

    name: str
    """disk, ext4loop or tmpfs."""
    path: Path
    """An empty directory on that filesystem."""
    description: str
    """What it is, for the report (type and mount options)."""
    probe: bool = False
    """Check that creates are fast where :meth:`workdir` puts a directory, and leave a
    directory behind in every block group a measurement used (see above)."""
    marked: set[int] = field(default_factory=set, compare=False)
    """Inode ranges (:data:`MARK_INODES` inodes each) where a directory was left."""

    def remove(self, workdir: Path) -> None:
        """Delete a measurement directory; with :attr:`probe`, all but one directory per
        inode range not marked yet (files go; they were not written back: cheap)."""
        if not self.probe:
            shutil.rmtree(workdir, ignore_errors=True)
            return
        for top, dirs, files in os.walk(workdir, topdown=False):
            for f in files:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(top, f))
            for d in (*dirs, None):
                path = top if d is None else os.path.join(top, d)
                try:
                    st = os.lstat(path)
                    if stat.S_ISLNK(st.st_mode):
                        os.unlink(path)
                        continue
                    mark = st.st_ino // MARK_INODES
                    if mark in self.marked:
                        os.rmdir(path)
                    else:
                        self.marked.add(mark)
                except OSError:
                    pass  # kept below a marked one, or gone already

    def workdir(self, name: str) -> Path:
        """A path for a new measurement directory (not made yet; its parent exists).

        With :attr:`probe`, the directory lands in a container that was shown to sit in a
        block group where creating files is fast: up to :data:`PROBE_TRIES` containers
        are made (a slow one is left in place until the end, so the allocator moves on).
        The group the previous measurement just emptied is the allocator's first choice
        and the slowest of all: the probe is what keeps the next system out of it.
        """
        unique = f"{name}-{secrets.token_hex(3)}"
        if not self.probe:
            return self.path / unique
        box = self.path / unique
        for attempt in range(PROBE_TRIES):
            box = self.path / (unique if attempt == 0 else f"{unique}-{attempt}")
            box.mkdir()
            us = probe_create_us(box / "probe")
            if us < PROBE_FAST_US:
                break
            print(
                f"  (slow creates where {name} was to run: {us:.0f} µs each; moving on)",
                file=sys.stderr,
                flush=True,
            )
        return box / "run"


def _is_root() -> bool:
    return os.geteuid() == 0


def _describe(path: Path) -> str:
    out = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE,OPTIONS", "-T", str(path)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    fstype, _, _opts = out.partition(" ")
    journal = ""
    if fstype == "ext4":
        src = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", "-T", str(path)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dev = os.path.basename(src)
        jbd2 = Path("/proc/fs/jbd2")
        if dev and jbd2.is_dir():
            has = any(e.name.startswith(dev + "-") for e in jbd2.iterdir())
            journal = ", journal" if has else ", no journal"
    return f"{fstype or '?'}{journal}"


MARK_INODES = 2048
"""Inodes per mark: no more than a block group holds (8192 with ext4's defaults)."""
PROBE_TRIES = 8
"""Containers :meth:`Scratch.workdir` tries before it takes a slow one."""
PROBE_FAST_US = 10.0
"""Median µs per create below which a block group counts as fast (2-5 µs when it is)."""
PROBE_FILES = 64
"""Files created by one probe."""


def probe_create_us(path: Path) -> float:
    """Median µs to create an empty file in new directory ``path`` (the files stay)."""
    path.mkdir()
    times = []
    for i in range(PROBE_FILES):
        t = time.perf_counter()
        os.close(os.open(path / f"{i:03d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e6


_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_TOPDIR_FL = 0x00020000


def mark_topdir(path: Path) -> bool:
    """``chattr +T path``: spread its subdirectories over block groups (ext2/3/4 only)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        flags[0] |= _FS_TOPDIR_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def unavailable(name: str) -> str | None:
    """Why ``name`` cannot be used here, or None."""
    if name not in NAMES:
        return f"unknown filesystem {name!r}; choose from {', '.join(NAMES)}"
    if name == "ext4loop" and not _is_root():
        return "a loop-mounted ext4 image needs root (mount -o loop)"
    if name == "ext4loop" and shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 not found (apt-get install e2fsprogs)"
    return None


@contextmanager
def scratch(name: str, *, size_mb: int = 3072) -> Iterator[Scratch]:
    """An empty directory on filesystem ``name``; everything is removed (and unmounted) after."""
    why = unavailable(name)
    if why:
        raise RuntimeError(why)
    if name == "disk":
        base = os.environ.get("FSBUS_BENCH_DISK_DIR") or None
        with tempfile.TemporaryDirectory(prefix="fsbus-bench-disk-", dir=base) as d:
            yield Scratch(name, Path(d), _describe(Path(d)), probe=mark_topdir(Path(d)))
        # written back, the freed inodes are avoided for 1 minute instead of 6
        subprocess.run(["sync", "-f", base or tempfile.gettempdir()], check=False)
        return
    outer = Path(tempfile.mkdtemp(prefix=f"fsbus-bench-{name}-"))
    mnt = outer / "mnt"
    mnt.mkdir()
    mounted = False
    try:
        if name == "ext4loop":
            img = outer / "ext4.img"
            subprocess.run(["truncate", "-s", f"{size_mb}M", str(img)], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
            subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
            mounted = True
            yield Scratch(name, mnt, _describe(mnt) + " (loop image)")
        elif _is_root():
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mnt)], check=True
            )
            mounted = True
            yield Scratch(name, mnt, "tmpfs")
        else:
            with tempfile.TemporaryDirectory(prefix="fsbus-bench-", dir="/dev/shm") as d:
                yield Scratch(name, Path(d), "tmpfs (/dev/shm)")
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
            if subprocess.run(["mountpoint", "-q", str(mnt)], check=False).returncode == 0:
                subprocess.run(["umount", "-l", str(mnt)], check=False)
        shutil.rmtree(outer, ignore_errors=True)
