"""Scratch directories on the filesystems under test, made and removed by the harness.

- ``disk``: the machine's disk as it is (a temp dir under /tmp, or $FSBUS_BENCH_DISK_DIR);
- ``ext4loop``: a loop-mounted journaled ext4 image (root only), the typical server case;
- ``tmpfs``: a tmpfs mounted by the harness (root), else /dev/shm.

Scratch data never lands inside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
            yield Scratch(name, Path(d), _describe(Path(d)))
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
