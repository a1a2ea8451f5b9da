"""Gathering the facts about a mount that :func:`fsbus._core.platform.decide` needs.

:class:`MountReader` holds the few system calls this takes (read a small text file, list
a directory, the statfs magic, resolve a path); the bus's and the streams' I/O seams
derive from it, so a test hands in a fake mount table or BeeGFS configuration through
the same object it uses to fake the rest of the filesystem.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import re

from .platform import BEEGFS_MAGIC, MountFacts, Platform, decide

__all__ = ["MountReader", "detect", "mount_facts", "parse_mountinfo"]

_MOUNTINFO = "/proc/self/mountinfo"
_BEEGFS_PROC = "/proc/fs/beegfs"
_JBD2_PROC = "/proc/fs/jbd2"
_EXT4_MAGIC = 0xEF53
_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountReader:
    """The system calls that find out which filesystem holds a path."""

    def read_text(self, path: str) -> str | None:
        """A small text file (``/proc``), None when it cannot be read."""
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def list_names(self, path: str) -> list[str]:
        """Names in a directory, empty when it cannot be listed."""
        try:
            return os.listdir(path)
        except OSError:
            return []

    def realpath(self, path: str) -> str:
        """``os.path.realpath``."""
        return os.path.realpath(path)

    def statfs_magic(self, path: str) -> int | None:
        """statfs ``f_type`` of ``path`` (Linux), None when unknown."""
        return _statfs_magic(path)


_libc: ctypes.CDLL | None = None


def _statfs_magic(path: str) -> int | None:
    global _libc
    if not hasattr(os, "statvfs") or os.uname().sysname != "Linux":
        return None
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
        if _libc.statfs(os.fsencode(path), buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    # f_type is the first field, a long (__fsword_t)
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(path: str, mountinfo: str) -> tuple[str, str, str, frozenset[str]] | None:
    """(mount point, type, source, options) of the mount holding ``path``.

    The longest mount point containing ``path`` wins (the last listed when a point is
    mounted twice); options are the per-mount and the superblock options together.
    """
    best: tuple[str, str, str, frozenset[str]] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        tail = right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            opts = set(fields[5].split(","))
            if len(tail) >= 3:
                opts.update(tail[2].split(","))
            best = (point, tail[0], _unescape(tail[1]), frozenset(o for o in opts if o))
    return best


def _parse_config(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for sep in ("=", ":"):
            key, found, value = line.partition(sep)
            if found:
                out[key.strip()] = value.strip()
                break
    return out


def _beegfs_config(reader: MountReader) -> dict[str, str] | None:
    """Settings of the BeeGFS clients; a boolean reads true only if every client says so."""
    merged: dict[str, str] | None = None
    for client in sorted(reader.list_names(_BEEGFS_PROC)):
        text = reader.read_text(f"{_BEEGFS_PROC}/{client}/config")
        if text is None:
            continue
        cfg = _parse_config(text)
        if merged is None:
            merged = cfg
            continue
        for key in ("tuneUseGlobalFileLocks", "tuneUseGlobalAppendLocks"):
            if merged.get(key, "false").lower() != cfg.get(key, "false").lower():
                merged[key] = "false"
    return merged


def mount_facts(path: str, reader: MountReader | None = None) -> MountFacts:
    """What :func:`~fsbus._core.platform.decide` needs to know about ``path``'s mount."""
    reader = reader or MountReader()
    real = reader.realpath(path)
    magic = reader.statfs_magic(real)
    text = reader.read_text(_MOUNTINFO)
    found = parse_mountinfo(real, text) if text else None
    point, fstype, source, options = found if found else ("", "", "", frozenset[str]())
    facts = MountFacts(
        fstype=fstype, options=options, magic=magic, mount_point=point, source=source
    )
    if fstype == "ext4" or (not fstype and magic == _EXT4_MAGIC):
        facts = dataclasses.replace(facts, journaled=_has_journal(source, reader))
    if fstype == "beegfs" or (not fstype and magic == BEEGFS_MAGIC):
        facts = dataclasses.replace(facts, fstype=fstype or "beegfs", beegfs=_beegfs_config(reader))
    return facts


def _has_journal(source: str, reader: MountReader) -> bool | None:
    """Whether ext4 device ``source`` has a journal: jbd2 lists each journal it runs
    as ``/proc/fs/jbd2/<device>-<inode>``. None when that cannot be told."""
    if not source.startswith("/dev/"):
        return None
    names = reader.list_names(_JBD2_PROC)
    if not names:
        return None  # no journal anywhere, or no /proc: not told
    device = source.rsplit("/", 1)[-1]
    return any(n.rsplit("-", 1)[0] == device for n in names)


def detect(path: str, reader: MountReader | None = None) -> Platform:
    """The :class:`~fsbus._core.platform.Platform` of the mount holding ``path``."""
    return decide(mount_facts(path, reader))
