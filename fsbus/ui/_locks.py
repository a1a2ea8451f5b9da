"""Who holds a work-queue message: the pid behind an ``flock``, read from ``/proc/locks``.

Linux lists every lock in ``/proc/locks`` with the pid that took it and the file's
``major:minor:inode``. That is the only way to name the holder of an ``flock``; it
works for processes on this host only (a consumer on another host of a network
mount shows as merely "locked").
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LockOwner", "lock_owners", "parse_proc_locks", "process_name"]

FileKey = tuple[int, int, int]
"""(major, minor, inode) of a file."""


@dataclass(frozen=True)
class LockOwner:
    """The process holding a lock on a file."""

    pid: int
    """Process id as /proc/locks reports it (in the reader's pid namespace)."""
    name: str | None
    """The process's command name from /proc/<pid>/comm, when readable."""

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})" if self.name else f"pid {self.pid}"


def parse_proc_locks(lines: Iterable[str]) -> dict[FileKey, int]:
    """Map (major, minor, inode) to the pid of each held lock (waiters are skipped)."""
    owners: dict[FileKey, int] = {}
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 fe:00:2163244 0 EOF"; waiters have "->" after the id.
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if pid > 0:
            owners.setdefault(key, pid)
    return owners


def lock_owners(paths: Iterable[str]) -> dict[str, LockOwner]:
    """The owner of each of ``paths`` that /proc/locks names; others are left out."""
    wanted: dict[FileKey, list[str]] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        wanted.setdefault(key, []).append(path)
    if not wanted:
        return {}
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            owners = parse_proc_locks(f)
    except OSError:
        return {}
    out: dict[str, LockOwner] = {}
    names: dict[int, str | None] = {}
    for key, found in wanted.items():
        pid = owners.get(key)
        if pid is None:
            continue
        if pid not in names:
            names[pid] = process_name(pid)
        for path in found:
            out[path] = LockOwner(pid, names[pid])
    return out


def process_name(pid: int) -> str | None:
    """The command name of ``pid`` on this host, or None."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None
