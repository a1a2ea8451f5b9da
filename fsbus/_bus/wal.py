"""The durable log: a durable publish made durable by one data sync of a log it owns.

Made durable file by file, a durable publish costs a journal commit on a journaled
filesystem (its new files and their renames are metadata): about 0.5 ms on journaled
ext4 whatever the message's size, one publish at a time. Here a durable publish writes
its files as a plain publish does, with no sync, and then appends one *record* (the
path and bytes of every file it placed: the message, its sidecars, its copies in
durable queues) to its process's log and syncs the log. The log was written in full
(zeros) and synced when it was made, so a record overwrites blocks the log already
owns: the sync writes that data and commits nothing.

A log is ``<root>/fsbus/wal/<host>-<pid>-<random>.log``, :data:`LOG_SIZE` bytes: two
header slots, then the records, one after the other (:mod:`fsbus._bus.logformat`).

*Checkpoints.* Once a second while records come (and when the log is full), the owner
calls ``syncfs`` on the bus's filesystem, which puts every file placed so far on disk,
and then writes the sequence number of the last record written before it into the
older header slot (a slot carries a generation and a crc; the valid one with the
higher generation counts). Records at or below it need nothing more. A full log
checkpoints and starts again after the header; the records left beyond the new ones
have lower sequence numbers, which is where a reading stops (as it stops at a record
whose crc fails: a write cut short).

*Recovery* (:func:`recover`, when a bus opens for writing). Each process holds an
exclusive ``flock`` on its log while it lives. A log nobody holds is a dead process's:

* written since this machine booted (its header's boot id is this kernel's): its files
  are in the page cache or on disk, nothing was lost. ``syncfs``, then the log goes
  (a bus does this as it opens and at each ``gc``: a log left behind long after its
  process died would, after a power cut, bring back what was consumed since).
* written before a reboot (a power cut, a crash of the machine): every record after the
  checkpoint is replayed. A file of the record that is there with the same bytes (its
  leading byte aside: a consumer's delivery count) stays; a torn or empty one is
  written again; a missing one is written again, unless its folder's queue is gone. A
  message consumed in the last second before the cut so comes back and is delivered
  again (at least once: a consumer's removal of it was not durable either), as may one
  purged or dropped from a full queue then. Then ``syncfs``, and the log goes.

Either way the log's header is first marked done (:data:`ALL_DONE`) and synced, so that
a log whose removal a power cut undid replays nothing. A cut during a recovery leaves
the log as it was: the next bus to open replays it again, which writes nothing twice.
Until a bus opens for writing after a restart (an fsbus process: a qlobber-fsq peer
does not read the logs), the files a cut lost are missing.

Only where it pays and is sound (:attr:`~fsbus._core.platform.Platform.durable_log`):
a local journaled filesystem, flock claims, one machine's page cache. Elsewhere, and
for a publish bigger than :data:`MAX_RECORD`, the files are synced as they always
were.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .._errors import StorageError, storage_error
from . import logrecovery
from .logformat import (
    ALL_DONE,
    HEADER,
    SLOT,
    Header,
    Record,
    decode_header,
    decode_records,
    encode_header,
    encode_record,
    safe_relative,
)
from .ops import Ops

__all__ = [
    "ACTIVE",
    "ALL_DONE",
    "HEADER",
    "LOG_SIZE",
    "MAX_RECORD",
    "DurableLog",
    "Header",
    "Record",
    "acquire",
    "decode_header",
    "decode_records",
    "encode_header",
    "encode_record",
    "hold_stamp",
    "note",
    "recover",
    "release",
    "safe_relative",
]

T = TypeVar("T")
A = TypeVar("A")
log = logging.getLogger("fsbus.fs")

LOG_SIZE = 16 << 20
"""Bytes of a log file: about 30,000 records of a 100-byte message with one copy."""
MAX_RECORD = 1 << 20
"""A publish whose files hold more bytes than this syncs them instead (their bytes
would be written twice)."""
CHECKPOINT_EVERY = 1.0
"""Seconds between checkpoints while records come: bounds what a power cut replays."""
_ZEROS = bytes(1 << 20)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# ---------------------------------------------------------------- the scope


_scope = threading.local()
ACTIVE = [0]
"""How many durable publishes run in a durable log's scope now, in any thread: while 0
(a bus that publishes nothing durable through a log), the bus's hot path skips
:func:`note` and :func:`hold_stamp` with one look."""
_active_lock = threading.Lock()


def note(path: str) -> None:
    """Called by the bus as it places a file: recorded if a durable publish runs in
    this thread (:meth:`DurableLog.durably`)."""
    paths = getattr(_scope, "paths", None)
    if paths is not None:
        paths.append(path)


def _leave() -> None:
    _scope.paths = _scope.stamps = None
    with _active_lock:
        ACTIVE[0] -= 1


def _stamp_all(stamps: list[tuple[Callable[[Any], object], Any]]) -> None:
    for stamp, arg in stamps:
        stamp(arg)


def hold_stamp(stamp: Callable[[A], object], arg: A) -> bool:
    """Called by the bus for the stamp that wakes subscribers of a file it placed:
    while a durable publish runs in this thread, held (True) and written once its record
    is synced, so that no subscriber is woken for a message a power cut could take back
    or a failed record takes back; else False (the caller stamps now)."""
    stamps = getattr(_scope, "stamps", None)
    if stamps is None:
        return False
    stamps.append((stamp, arg))
    return True


# ---------------------------------------------------------------- the log


class DurableLog:
    """A process's log of durable publishes on one bus (shared by its buses there:
    :func:`acquire`)."""

    def __init__(
        self, root: str, ops: Ops, file_mode: int | None = None, dir_mode: int | None = None
    ) -> None:
        self.root = root
        self.ops = ops
        self._file_mode = file_mode
        self._dir_mode = dir_mode
        self.dir = f"{root}/fsbus/wal"
        self.path = ""
        self.pid = os.getpid()
        self.users = 0
        self._fd = -1
        self._lock = threading.Lock()  # writing records, the header
        self._sync_lock = threading.Lock()  # syncing them (see _sync_upto)
        self._synced = 0  # the last record known on disk
        self._offset = HEADER
        self._seq = 0
        self._checkpointed = 0
        self._generation = 0
        self._boot = ""
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    # -- life

    def open(self) -> None:
        """Make the log file: written in full, synced, its name synced, flocked."""
        ops = self.ops
        try:
            ops.mkdir(self.dir, 0o777 if self._dir_mode is None else 0o700)
            if self._dir_mode is not None:
                ops.chmod(self.dir, self._dir_mode)
            _fsync_dir(ops, os.path.dirname(self.dir))  # (the folder's name, for good)
        except FileExistsError:
            pass
        except OSError as exc:
            raise storage_error("creating the durable log's folder", exc, self.dir) from exc
        name = f"{os.uname().nodename[:40]}-{self.pid}-{secrets.token_hex(4)}.log"
        path = f"{self.dir}/{name}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW
        try:
            fd = ops.open(path, flags, 0o666)
        except OSError as exc:
            raise storage_error("creating the durable log", exc, path) from exc
        try:
            ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self._file_mode is not None:
                ops.fchmod(fd, self._file_mode)
            self._boot = ops.boot_id()
            pos = 0
            while pos < LOG_SIZE:
                n = ops.pwrite(fd, _ZEROS[: LOG_SIZE - pos], pos)
                pos += n
            self._fd = fd
            self._write_header()  # (synced with the zeros: one sync)
            _fsync_dir(ops, self.dir)  # its name
        except OSError as exc:
            self._fd = -1
            ops.close(fd)
            with contextlib.suppress(OSError):
                ops.unlink(path)
            raise storage_error("making the durable log", exc, path) from exc
        self.path = path

    def close(self) -> None:
        """Checkpoint what is left, stop the checkpoints, remove the log."""
        thread, self._thread = self._thread, None
        self._closing = True
        self._wake.set()
        if thread is not None:
            thread.join()
        if self._fd < 0:
            return
        try:
            with self._lock:
                if self._seq > self._checkpointed:
                    self._checkpoint_locked()
        except OSError as exc:
            log.warning("the last checkpoint of %s failed (%s): it stays", self.path, exc)
            self.ops.close(self._fd)
            self._fd = -1
            return
        with contextlib.suppress(OSError):
            self.ops.unlink(self.path)
        self.ops.close(self._fd)
        self._fd = -1

    # -- publishing

    def durably(self, fn: Callable[[], T], *, many: bool = False) -> T:
        """Run a publish (``fn``, writing without syncs) and make what it placed durable:
        one record and one data sync (or, for a big one, a sync of each file). A nested
        call joins the outer one. If the record cannot be written, the publish's files
        are taken back and :class:`~fsbus.StorageError` is raised.

        The stamps that wake subscribers wait for the record (:func:`hold_stamp`),
        unless ``fn`` publishes ``many`` messages one after the other (``publish_many``):
        then each is stamped as it is placed, before the next is named. A consumer
        takes what it lists in publish order only if each message was placed *and
        stamped* before the next one was named (:func:`~fsbus._bus.scan.split_fresh`);
        with the stamps held to the end, a consumer woken by another publisher could
        take a later message of the batch before an earlier one whose bucket it had no
        stamp for. (The messages are visible before the record either way: a listing
        for another reason finds them.)"""
        if getattr(_scope, "paths", None) is not None:
            return fn()
        paths: list[str] = []
        stamps: list[tuple[Callable[[Any], object], Any]] | None = None if many else []
        _scope.paths, _scope.stamps = paths, stamps
        with _active_lock:
            ACTIVE[0] += 1
        try:
            out = fn()
            if paths:
                try:
                    self.commit(paths)
                except BaseException:
                    for p in paths:
                        with contextlib.suppress(OSError):
                            self.ops.unlink(p)
                    raise
        except BaseException:
            _leave()
            # Stamped all the same (a stamp for a file taken back costs a listing); an
            # error of a stamp does not hide the publish's own.
            with contextlib.suppress(StorageError):
                _stamp_all(stamps or [])
            raise
        _leave()
        _stamp_all(stamps or [])
        return out

    def commit(self, paths: list[str]) -> None:
        """Record the files at ``paths`` (absolute, under the root) and sync the log."""
        files: list[tuple[str, bytes]] = []
        total = 0
        prefix = len(self.root) + 1
        for p in paths:
            data = self._read(p)
            if data is None:
                continue  # taken and removed already by a consumer
            files.append((p[prefix:], data))
            total += len(data) + len(p)
        if not files:
            return
        if total > MAX_RECORD:
            self._sync_files(paths)
            return
        with self._lock:
            if self._failed is not None:
                raise self._broken()
            seq = self._seq + 1
            rec = encode_record(seq, files)
            try:
                if self._offset + len(rec) > LOG_SIZE:
                    self._checkpoint_locked()
                    self._offset = HEADER
                self.ops.pwrite(self._fd, rec, self._offset)
            except OSError as exc:
                raise storage_error("writing the durable log", exc, self.path) from exc
            self._offset += len(rec)
            self._seq = seq
        self._sync_upto(seq)
        if self._thread is None:
            self._start_checkpoints()

    def _sync_upto(self, seq: int) -> None:
        """Record ``seq`` (and every one written before it) on disk: a group commit.
        Threads that wrote their records while another thread's sync ran share the
        next sync; one whose record a sync already covered returns at once. (A record
        whose sync failed stays written: its publish raises, and after a power cut its
        files may come back, as a publish that raises may have been delivered.)"""
        with self._sync_lock:
            if self._synced >= seq:
                return
            if self._failed is not None:
                raise self._broken()
            upto = self._seq  # (written before this sync starts: it covers them)
            try:
                self.ops.fdatasync(self._fd)
            except OSError as exc:
                # After a failed sync the kernel may count what it did not write as
                # written: no later sync of this log proves anything. It is broken;
                # the bus's durable publishes sync their own files from now on.
                self._failed = exc
                log.error("syncing the durable log %s failed: %s", self.path, exc)
                raise storage_error("writing the durable log", exc, self.path) from exc
            self._synced = upto

    @property
    def broken(self) -> bool:
        """Whether a sync or a checkpoint of this log failed: nothing more goes in it
        (the bus's durable publishes sync their files instead)."""
        return self._failed is not None

    def _broken(self) -> StorageError:
        return StorageError(
            f"the durable log {self.path} failed ({self._failed}); this publish is not "
            "on disk: publish it again (the bus's durable publishes now sync their own "
            "files), and check the disk",
            self.path,
        )

    def _read(self, path: str) -> bytes | None:
        ops = self.ops
        try:
            fd = ops.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise storage_error("reading a message back for the durable log", exc, path) from exc
        try:
            chunks: list[bytes] = []
            while True:
                b = ops.read(fd, 1 << 16)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks)
        except OSError as exc:
            raise storage_error("reading a message back for the durable log", exc, path) from exc
        finally:
            ops.close(fd)

    def _sync_files(self, paths: list[str]) -> None:
        """The slow way, for a big publish: each file's data, then each folder."""
        ops = self.ops
        dirs: dict[str, None] = {}
        for p in paths:
            try:
                fd = ops.open(p, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise storage_error("syncing a message", exc, p) from exc
            try:
                ops.fdatasync(fd)
            except OSError as exc:
                raise storage_error("syncing a message", exc, p) from exc
            finally:
                ops.close(fd)
            dirs[os.path.dirname(p)] = None
        for d in dirs:
            try:
                fd = ops.open(d, os.O_RDONLY | _O_CLOEXEC)
                try:
                    ops.fsync(fd)
                finally:
                    ops.close(fd)
            except FileNotFoundError:
                continue  # its queue was deleted since
            except OSError as exc:
                raise storage_error("syncing a bucket directory", exc, d) from exc

    # -- checkpoints

    def _start_checkpoints(self) -> None:
        with self._lock:
            if self._thread is not None or self._closing:
                return
            self._thread = threading.Thread(
                target=self._checkpoints, name="fsbus-durable-log", daemon=True
            )
            self._thread.start()

    def _checkpoints(self) -> None:
        while not self._closing:
            self._wake.wait(CHECKPOINT_EVERY)
            if self._closing:
                return
            upto = self._seq
            if upto <= self._checkpointed or self._failed is not None:
                continue
            try:
                # outside the lock: publishes go on meanwhile (their records are later)
                self.ops.syncfs(self._fd)
                with self._lock:
                    if upto > self._checkpointed:
                        self._checkpointed = upto
                        self._write_header()
            except OSError as exc:
                self._failed = exc
                log.error("checkpoint of the durable log %s failed: %s", self.path, exc)

    def _checkpoint_locked(self) -> None:
        """Every file placed so far on disk (``syncfs``), then the header says so."""
        upto = self._seq
        self.ops.syncfs(self._fd)
        self._checkpointed = upto
        self._write_header()

    def _write_header(self) -> None:
        self._generation += 1
        h = Header(self._generation, self._checkpointed, self._boot, self.pid)
        self.ops.pwrite(self._fd, encode_header(h), (self._generation % 2) * SLOT)
        self.ops.fdatasync(self._fd)


# ---------------------------------------------------------------- one per process and bus

_logs: dict[tuple[str, int], DurableLog] = {}
_logs_lock = threading.Lock()


def acquire(
    root: str, ops: Ops, file_mode: int | None = None, dir_mode: int | None = None
) -> DurableLog:
    """This process's log for the bus at ``root`` (made on first use, its file and
    folder with the bus's modes); give it back with :func:`release`."""
    key = (root, os.getpid())
    with _logs_lock:
        wal = _logs.get(key)
        if wal is None:
            wal = DurableLog(root, ops, file_mode, dir_mode)
            wal.open()
            _logs[key] = wal
        wal.users += 1
        return wal


def release(wal: DurableLog) -> None:
    """One user fewer; the last one closes it (:meth:`DurableLog.close`)."""
    with _logs_lock:
        wal.users -= 1
        if wal.users > 0:
            return
        _logs.pop((wal.root, wal.pid), None)
    if wal.pid == os.getpid():
        wal.close()


def _fsync_dir(ops: Ops, path: str) -> None:
    fd = ops.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        ops.fsync(fd)
    finally:
        ops.close(fd)


# ---------------------------------------------------------------- recovery


def recover(root: str, ops: Ops, staging: str, quarantine: str) -> int:
    """Deal with the logs of dead processes on the bus at ``root``
    (:func:`fsbus._bus.logrecovery.recover`; this process's own are left alone)."""
    mine = {w.path for w in _logs.values()}
    return logrecovery.recover(root, ops, staging, quarantine, mine)
