"""Check that a directory can carry a bus: ``fsbus doctor`` and :func:`check_directory`.

Each check probes the real filesystem the way the bus will use it (a file created
and renamed, ``flock`` between two open file descriptions, an inotify watch, a fresh
file's mtime against the clock, free space and inodes) and reports ``ok``, ``warn``
or ``fail`` with what to fix. Probe files live in a private ``.fsbus-doctor-*``
folder under the root, which is removed afterwards; peers never look there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from .._core.mounts import MountReader, detect
from .._core.platform import Platform
from .._core.space import free_space
from .._env import env_force_polling

__all__ = ["DoctorCheck", "DoctorReport", "Status", "check_directory"]

Status = Literal["ok", "warn", "fail"]

_RANK: Final[dict[str, int]] = {"ok": 0, "warn": 1, "fail": 2}
_SUBDIRS: Final = ("staging", "messages", "topics", "update")
_INOTIFY_WAIT: Final = 2.0
_SKEW_WARN: Final = 1.0
_SKEW_FAIL: Final = 30.0
_MIB: Final = 1 << 20


@dataclass(frozen=True)
class DoctorCheck:
    """The outcome of one check."""

    name: str
    """Short name of the check ("flock", "inotify", ...)."""
    status: Status
    """``ok``, ``warn`` (works, with a caveat) or ``fail`` (the bus will misbehave)."""
    detail: str
    """What was found."""
    fix: str = ""
    """What to do about a warning or failure (empty when nothing is needed)."""


@dataclass(frozen=True)
class DoctorReport:
    """Every check run on one directory."""

    root: str
    """The directory examined, as given."""
    checks: tuple[DoctorCheck, ...]
    """The checks in the order they ran."""

    @property
    def status(self) -> Status:
        """The worst status of all checks."""
        worst: Status = "ok"
        for check in self.checks:
            if _RANK[check.status] > _RANK[worst]:
                worst = check.status
        return worst

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return self.status != "fail"

    def check(self, name: str) -> DoctorCheck:
        """The check called ``name``; :class:`KeyError` if it did not run."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)


def check_directory(
    root: str | os.PathLike[str], *, reader: MountReader | None = None
) -> DoctorReport:
    """Run every check on ``root`` (which is not created) and return the report.

    Blocking: the inotify check waits up to 2 seconds for its event. ``reader`` (tests)
    is what finds out the filesystem, as a bus's I/O seam does.
    """
    path = os.path.abspath(os.fspath(root))
    checks: list[DoctorCheck] = []
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        checks.append(
            DoctorCheck(
                "root",
                "fail",
                f"{path} {what}",
                "create it (`mkdir -p` it, or run any fsbus command with this --root)",
            )
        )
        return DoctorReport(os.fspath(root), tuple(checks))
    checks.append(DoctorCheck("root", "ok", f"{path} is a directory"))
    platform = detect(path, reader)
    checks.append(_check_filesystem(path, platform))
    checks.extend(_check_layout(path))
    checks.append(_check_space(path))
    try:
        probe = os.path.join(path, f".fsbus-doctor-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(probe)
    except OSError as exc:
        checks.append(
            DoctorCheck(
                "writable",
                "fail",
                f"cannot create a folder in {path}: {exc.strerror or exc}",
                _permission_fix(path, exc),
            )
        )
        return DoctorReport(os.fspath(root), tuple(checks))
    try:
        checks.append(_check_writable(probe))
        checks.append(_check_flock(probe))
        checks.append(_check_inotify(probe, platform))
        checks.append(_check_clock(probe))
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return DoctorReport(os.fspath(root), tuple(checks))


# --- filesystem type -------------------------------------------------------------


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_of(path: str, mountinfo: str) -> tuple[str, str, str] | None:
    """(mount point, filesystem type, source) of the mount holding ``path``.

    ``mountinfo`` is the text of ``/proc/self/mountinfo``; the longest mount point
    that contains ``path`` wins (the last one listed when a point is mounted twice).
    """
    best: tuple[str, str, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        tail = right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        point = _unescape_mount(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0], _unescape_mount(tail[1]))
    return best


def _check_filesystem(path: str, platform: Platform) -> DoctorCheck:
    """What the bus decides on this filesystem: the same decision a bus opening here takes."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            found = mount_of(os.path.realpath(path), f.read())
    except OSError:
        found = None
    where = platform.fstype or "unknown filesystem"
    if found is not None and found[1] == platform.fstype:
        where = f"{platform.fstype} ({found[2]} on {found[0]})"
    text = f"{where}: {platform.describe().partition(': ')[2]}"
    if platform.notes:
        text += "; " + "; ".join(platform.notes)
    if platform.family == "local":
        return DoctorCheck("filesystem", "ok", f"local filesystem {text}")
    fixes: list[str] = []
    if platform.problem:
        fixes.append(platform.problem)
    if platform.locks_global is None and platform.shared:
        fixes.append(
            "check that flock crosses hosts with fsbus.probe_locking(path_a, path_b), "
            "else set BusConfig(locking='rename') and use no streams here"
        )
    if platform.family == "sshfs":
        fixes.append("mount with -o dir_cache=no so listings do not lag by ~20 s")
    if platform.family == "unknown":
        fixes.append("check that flock and rename behave as on a local disk (see the other checks)")
    if fixes:
        return DoctorCheck("filesystem", "warn", text, "; ".join(fixes))
    return DoctorCheck("filesystem", "ok", text)


# --- layout and permissions --------------------------------------------------------


def _permission_fix(path: str, exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "the filesystem is read-only: remount it read-write or use another --root"
    if exc.errno == errno.ENOSPC:
        return "the filesystem is full: free space or inodes"
    return f"give this user write access to {path} (owner/mode: `ls -ld {path}`)"


def _check_layout(path: str) -> list[DoctorCheck]:
    missing = [d for d in _SUBDIRS if not os.path.isdir(os.path.join(path, d))]
    if len(missing) == len(_SUBDIRS):
        return [
            DoctorCheck(
                "layout",
                "ok",
                "no bus yet in this directory (sub-folders are created on first use)",
            )
        ]
    if missing:
        return [
            DoctorCheck(
                "layout",
                "warn",
                f"bus sub-folders missing: {', '.join(missing)}",
                "open a Bus on this root (any fsbus command) to recreate them",
            )
        ]
    unwritable = [d for d in _SUBDIRS if not os.access(os.path.join(path, d), os.W_OK | os.X_OK)]
    if unwritable:
        read_only = _read_only_mount(path)
        return [
            DoctorCheck(
                "layout",
                "fail",
                f"sub-folders not writable by this user: {', '.join(unwritable)}"
                + (" (the filesystem is mounted read-only)" if read_only else ""),
                ("remount it read-write" if read_only else "fix owner/mode of the bus sub-folders")
                + " (every peer needs write access); as it is, the bus can only be looked "
                "at: stats, ls, queue ls, top and multi subscriptions work",
            )
        ]
    return [DoctorCheck("layout", "ok", "staging/, messages/, topics/, update/ present")]


def _read_only_mount(path: str) -> bool:
    """Whether the filesystem holding ``path`` is mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _check_writable(probe: str) -> DoctorCheck:
    src = os.path.join(probe, "staged")
    dst = os.path.join(probe, "renamed")
    try:
        fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, b"\x00probe")
        finally:
            os.close(fd)
        os.rename(src, dst)
        os.unlink(dst)
    except OSError as exc:
        return DoctorCheck(
            "writable",
            "fail",
            f"create/rename/unlink failed: {exc.strerror or exc}",
            _permission_fix(os.path.dirname(probe), exc),
        )
    return DoctorCheck("writable", "ok", "create (O_EXCL), write, rename and unlink work")


def _check_space(path: str) -> DoctorCheck:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return DoctorCheck("space", "warn", f"statvfs failed: {exc.strerror or exc}")
    return space_check(st)


def space_check(st: os.statvfs_result) -> DoctorCheck:
    """Judge free space and inodes; values a filesystem does not know count as unknown.

    CephFS has no inode limit and reports ``f_ffree = -1`` (and the number of files as
    ``f_files``); a cluster without a manager reports 0 blocks. Neither means full.
    """
    free, total, free_inodes, inodes = free_space(st)
    if free is not None and total is not None:
        text = f"{free / _MIB:,.0f} MiB free of {total / _MIB:,.0f} MiB"
    else:
        text = "free space unknown (the filesystem reports no size)"
    if free_inodes is not None:
        text += f", {free_inodes:,} of {inodes:,} inodes free"
    elif st.f_files == 0:
        text += ", inodes not limited"
    else:
        text += ", free inodes unknown (not limited, or not reported)"
    if (free is not None and free < 16 * _MIB) or (free_inodes is not None and free_inodes < 100):
        return DoctorCheck(
            "space", "fail", text, "free disk space or inodes (each message is one file)"
        )
    low_space = free is not None and (free < 512 * _MIB or free < (total or 0) * 0.05)
    if low_space or (free_inodes is not None and free_inodes < 10_000):
        return DoctorCheck(
            "space", "warn", text, "free disk space or inodes before the bus fills the disk"
        )
    return DoctorCheck("space", "ok", text)


# --- flock -----------------------------------------------------------------------


def _check_flock(probe: str) -> DoctorCheck:
    target = os.path.join(probe, "lock")
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    fd1 = os.open(target, flags, 0o666)
    fd2 = os.open(target, flags, 0o666)  # a second open file description
    try:
        try:
            fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return DoctorCheck(
                "flock",
                "fail",
                f"flock is not supported here: {exc.strerror or exc}",
                "use BusConfig(locking='rename') for work queues on this filesystem",
            )
        try:
            fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return DoctorCheck(
                "flock", "ok", "an exclusive flock blocks a second open file description"
            )
        except OSError as exc:
            return DoctorCheck(
                "flock",
                "fail",
                f"second flock failed oddly: {exc.strerror or exc}",
                "use BusConfig(locking='rename') for work queues on this filesystem",
            )
        return DoctorCheck(
            "flock",
            "fail",
            "two open file descriptions both got an exclusive flock: locks do not exclude",
            "use BusConfig(locking='rename') so a work-queue message has one consumer at a time",
        )
    finally:
        os.close(fd2)
        os.close(fd1)


# --- inotify ---------------------------------------------------------------------


def _check_inotify(probe: str, platform: Platform) -> DoctorCheck:
    polling = env_force_polling()
    note = " (FSBUS_FORCE_POLLING is set, so the bus polls anyway)" if polling else ""
    if platform.watch == "poll":
        note = (
            " (the bus does not rely on it here: it sees no other client's changes on "
            f"{platform.fstype or platform.family}, so the bus polls)"
        )
    try:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers.inotify import InotifyObserver
    except ImportError as exc:  # pragma: no cover - watchdog is a dependency
        return DoctorCheck("inotify", "warn", f"watchdog's inotify backend unavailable: {exc}")

    seen = threading.Event()
    target = os.path.join(probe, "watched")

    class _Handler(FileSystemEventHandler):
        def on_any_event(self, event: Any) -> None:
            src = event.src_path
            if isinstance(src, bytes):
                src = os.fsdecode(src)
            if (
                os.path.basename(str(src)) == "watched"
                or os.path.basename(str(getattr(event, "dest_path", "") or "")) == "watched"
            ):
                seen.set()

    observer = InotifyObserver()
    try:
        observer.schedule(_Handler(), probe, recursive=False)
        observer.start()
    except OSError as exc:
        if platform.watch == "poll":
            return DoctorCheck(
                "inotify", "ok", f"cannot watch the directory: {exc.strerror or exc}{note}"
            )
        return DoctorCheck(
            "inotify",
            "warn",
            f"cannot watch the directory: {exc.strerror or exc}{note}",
            "raise fs.inotify.max_user_watches/max_user_instances, or set FSBUS_FORCE_POLLING=1",
        )
    try:
        started = time.monotonic()
        _write_file(target, b"x")
        if seen.wait(_INOTIFY_WAIT):
            took = time.monotonic() - started
            return DoctorCheck(
                "inotify", "ok", f"a write was seen after {took * 1000:.0f} ms{note}"
            )
        if platform.watch == "poll":
            return DoctorCheck(
                "inotify", "ok", f"a write was not seen within {_INOTIFY_WAIT:.0f} s{note}"
            )
        return DoctorCheck(
            "inotify",
            "warn",
            f"a write was not seen within {_INOTIFY_WAIT:.0f} s{note}",
            "set FSBUS_FORCE_POLLING=1: the bus then relies on polling update/UPDATE",
        )
    finally:
        _stop(observer.stop, observer.join)


class _DropInactiveNotice(logging.Filter):
    # watchdog logs an error when its reader thread wakes up for an event after stop()
    # began; that race is harmless here, and a probe must not print noise.
    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


def _stop(stop: Callable[[], None], join: Callable[[float], None]) -> None:
    quiet = _DropInactiveNotice()
    log = logging.getLogger("watchdog.observers.inotify")
    log.addFilter(quiet)
    try:
        with contextlib.suppress(Exception):
            stop()
            join(5.0)
    finally:
        log.removeFilter(quiet)


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# --- clock -----------------------------------------------------------------------


def _check_clock(probe: str) -> DoctorCheck:
    target = os.path.join(probe, "clock")
    before = time.time()
    _write_file(target, b"t")
    after = time.time()
    mtime = os.stat(target).st_mtime
    if mtime < before:
        skew = mtime - before
    elif mtime > after:
        skew = mtime - after
    else:
        skew = 0.0
    text = f"a fresh file's mtime is {skew:+.3f} s from this host's clock"
    if abs(skew) <= _SKEW_WARN:
        return DoctorCheck("clock", "ok", text)
    fix = (
        "synchronise the clocks of every host sharing the bus (NTP/chrony): "
        "expiry times are compared with each host's clock"
    )
    if abs(skew) <= _SKEW_FAIL:
        return DoctorCheck("clock", "warn", text, fix)
    return DoctorCheck("clock", "fail", text, fix)
