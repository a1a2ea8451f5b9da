"""Seams, log readers and a child process for the durable log's tests (test_durable_log).

Everything runs on real directories: the seams only record calls, fail calls on the
log's own descriptor, show the bus another mount table, or another boot id (a restart
of the machine). The child publishes durably into a real bus, reports the files it
placed, and waits to be killed with SIGKILL.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fsbus._bus import wal
from fsbus._bus.ops import Ops

WAIT = 30.0
"""Seconds any single wait may take before it fails the test."""

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the log on disk


def wal_dir(root: Path) -> Path:
    """Where a bus keeps its processes' durable logs."""
    return root / "fsbus" / "wal"


def log_files(root: Path) -> list[Path]:
    """The log files now in ``<root>/fsbus/wal`` (none when the folder is not there)."""
    d = wal_dir(root)
    return sorted(d.iterdir()) if d.is_dir() else []


def the_log(root: Path) -> Path:
    """The one log file of the bus (fails the test if there is not exactly one)."""
    logs = log_files(root)
    assert len(logs) == 1, logs
    return logs[0]


def read_log(path: Path) -> tuple[wal.Header | None, list[wal.Record]]:
    """The header and the readable records of a log file."""
    buf = path.read_bytes()
    return wal.decode_header(buf), list(wal.decode_records(buf))


def records_of(root: Path) -> list[wal.Record]:
    """The records of the bus's one log file (read while the bus is open)."""
    return read_log(the_log(root))[1]


def relative(root: Path, path: str | Path) -> str:
    """``path`` relative to the bus root, as a record names it."""
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root))


# ---------------------------------------------------------------- seams


class SyncRecording(Ops):
    """Records every data sync, file sync and filesystem sync, with the path synced,
    the directories made, and the files written back by a recovery (renamed from
    ``restored-*`` in staging)."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.syncs: list[tuple[str, str]] = []
        self.restored: list[str] = []
        self.made: list[str] = []
        self._lock = threading.Lock()

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        fd = super().open(path, flags, mode)
        with self._lock:
            self.paths[fd] = path
        return fd

    def _note(self, op: str, fd: int) -> None:
        with self._lock:
            self.syncs.append((op, self.paths.get(fd, f"<fd {fd}>")))

    def fdatasync(self, fd: int) -> None:
        self._note("fdatasync", fd)
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self._note("fsync", fd)
        super().fsync(fd)

    def syncfs(self, fd: int) -> None:
        self._note("syncfs", fd)
        super().syncfs(fd)

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        if os.path.basename(src).startswith("restored-"):
            with self._lock:
                self.restored.append(dst)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        super().mkdir(path, mode)
        with self._lock:
            self.made.append(path)

    def file_syncs(self) -> list[tuple[str, str]]:
        """The fdatasync and fsync calls (not syncfs)."""
        with self._lock:
            return [s for s in self.syncs if s[0] in ("fdatasync", "fsync")]

    def clear(self) -> None:
        with self._lock:
            self.syncs.clear()
            self.restored.clear()
            self.made.clear()


def is_log(path: str) -> bool:
    """Whether ``path`` is a durable log file."""
    return "/fsbus/wal/" in path and path.endswith(".log")


class LogFaults(SyncRecording):
    """Fails ``op`` (``pwrite`` or ``fdatasync``) with EIO on a durable log's descriptor
    while ``armed``; every other file is left alone."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self.armed = False
        self.failed = 0

    def _maybe_fail(self, op: str, fd: int) -> None:
        path = self.paths.get(fd, "")
        if self.armed and op == self.op and is_log(path):
            self.failed += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._maybe_fail("pwrite", fd)
        return super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fdatasync", fd)
        super().fdatasync(fd)


class Restarted(SyncRecording):
    """A bus opening after the machine restarted: another boot id."""

    def boot_id(self) -> str:
        return "00000000-0000-0000-0000-another-boot"


class SharedMount(Ops):
    """Every path is on a mount other hosts share (``fstype``: ceph, nfs4...)."""

    def __init__(self, fstype: str) -> None:
        self.fstype = fstype

    def read_text(self, path: str) -> str | None:
        if path == "/proc/self/mountinfo":
            return (
                f"22 1 0:50 / / rw,relatime shared:1 - {self.fstype} "
                "10.0.0.1:/export rw,name=admin\n"
            )
        return super().read_text(path)

    def statfs_magic(self, path: str) -> int | None:
        return None  # the mount table says what it is


# ---------------------------------------------------------------- a process to kill

CHILD = r"""
import json, sys
from fsbus import BlockingBus, BusConfig
from fsbus._bus import wal

args = json.loads(sys.argv[1])
wal.CHECKPOINT_EVERY = args["checkpoint_every"]
if args["log_size"]:
    wal.LOG_SIZE = args["log_size"]
bus = BlockingBus(args["root"], config=BusConfig(durable_log="on"))
bus.__enter__()
for q in args["queues"]:
    bus.declare_queue(q, ["t.#"])
placed = []
for i in range(args["count"]):
    mark = f"{args['prefix']}{i:05d}-".encode()
    payload = (mark * (args["size"] // len(mark) + 1))[: args["size"]]
    placed.append(bus.publish(args["topic"], payload, durable=True).path)
for q in args["delete"]:
    bus.delete_queue(q)
print(json.dumps({"event": "ready", "placed": placed}), flush=True)
sys.stdin.read()  # until killed
"""


class Publisher:
    """A child process that publishes ``count`` durable messages (payload
    ``<prefix><i>-...`` of ``size`` bytes: :func:`payload`) on ``topic`` into a bus with
    ``queues`` bound ``t.#``, deletes the queues in ``delete``, says ready, and waits to
    be killed."""

    def __init__(
        self,
        root: Path,
        *,
        count: int,
        queues: tuple[str, ...] = ("a", "b"),
        delete: tuple[str, ...] = (),
        size: int = 24,
        prefix: str = "m",
        topic: str = "t.x",
        log_size: int = 0,
        checkpoint_every: float = 3600.0,
    ) -> None:
        args = {
            "root": str(root),
            "count": count,
            "queues": list(queues),
            "delete": list(delete),
            "size": size,
            "prefix": prefix,
            "topic": topic,
            "log_size": log_size,
            "checkpoint_every": checkpoint_every,
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(args)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def ready(self) -> dict[str, Any]:
        """Wait for the child's ready line; returns it (``placed``: message paths)."""
        try:
            line = self._lines.get(timeout=WAIT)
        except queue.Empty:
            self.kill()
            raise TimeoutError(f"publisher not ready within {WAIT} s") from None
        if not line:
            self.proc.wait(timeout=WAIT)
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise AssertionError(f"publisher died (rc {self.proc.returncode}): {err}")
        event: dict[str, Any] = json.loads(line)
        assert event["event"] == "ready", event
        return event

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (its flocks with it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT)
        self._reader.join(timeout=WAIT)  # (its pipe at EOF now)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def payload(i: int, size: int = 24, prefix: str = "m") -> bytes:
    """What a :class:`Publisher` sends as its message ``i``."""
    mark = f"{prefix}{i:05d}-".encode()
    return (mark * (size // len(mark) + 1))[:size]


def run_and_kill(root: Path, **kwargs: Any) -> list[str]:
    """Run a :class:`Publisher` to its ready line, SIGKILL it; the paths it placed."""
    child = Publisher(root, **kwargs)
    try:
        placed: list[str] = child.ready()["placed"]
    finally:
        child.kill()
    assert child.proc.returncode == -signal.SIGKILL
    return placed
