"""The durable log: a durable publish made durable by one data sync of a log it owns.

Made durable file by file, a durable publish costs a journal commit on a journaled
filesystem (its new files and their renames are metadata): about 0.5 ms on journaled
ext4 whatever the message's size, one publish at a time. Here a durable publish writes
its files as a plain publish does, with no sync, and then appends one *record* (the
path and bytes of every file it placed: the message, its sidecars, its copies in
durable queues) to its process's log and syncs the log. The log was written in full
(zeros) and synced when it was made, so a record overwrites blocks the log already
owns: the sync writes that data and commits nothing.

Layout (``<root>/fsbus/wal/<host>-<pid>-<random>.log``, :data:`LOG_SIZE` bytes)::

    0, 512     two header slots: magic, version, generation, checkpoint, boot id, crc
    4096 ...   records: body length, crc32, sequence number, then the body (the
               files: relative path and bytes each), one after the other

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
import errno
import fcntl
import logging
import os
import secrets
import stat
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import StorageError, storage_error
from .ops import Ops

__all__ = [
    "LOG_SIZE",
    "MAX_RECORD",
    "DurableLog",
    "Record",
    "acquire",
    "decode_records",
    "encode_record",
    "note",
    "recover",
    "release",
]

T = TypeVar("T")
A = TypeVar("A")
log = logging.getLogger("fsbus.fs")

LOG_SIZE = 16 << 20
"""Bytes of a log file: about 30,000 records of a 100-byte message with one copy."""
HEADER = 4096
"""Bytes before the first record (the two header slots, then padding)."""
SLOT = 512
MAX_RECORD = 1 << 20
"""A publish whose files hold more bytes than this syncs them instead (their bytes
would be written twice)."""
CHECKPOINT_EVERY = 1.0
"""Seconds between checkpoints while records come: bounds what a power cut replays."""
ALL_DONE = (1 << 64) - 1
"""The checkpoint of a log that was recovered: nothing in it is replayed again."""
MAGIC = b"FSBUSWAL"
VERSION = 1
_HEAD = struct.Struct("<8sIQQ40sI")  # magic, version, generation, checkpoint, boot id, pid
_REC = struct.Struct("<IIQ")  # body length, crc32 of sequence + body, sequence
_SEQ = struct.Struct("<Q")
_ENTRY = struct.Struct("<HI")  # path length, data length
_ZEROS = bytes(1 << 20)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# ---------------------------------------------------------------- the format (pure)


@dataclass(frozen=True, slots=True)
class Record:
    """One durable publish: the files it placed, relative to the bus root."""

    seq: int
    files: tuple[tuple[str, bytes], ...]


def encode_record(seq: int, files: list[tuple[str, bytes]]) -> bytes:
    """A record as written into the log."""
    parts = [struct.pack("<I", len(files))]
    for rel, data in files:
        path = rel.encode("utf-8")
        parts += (_ENTRY.pack(len(path), len(data)), path, data)
    body = b"".join(parts)
    crc = zlib.crc32(body, zlib.crc32(_SEQ.pack(seq)))
    return _REC.pack(len(body), crc, seq) + body


def decode_records(buf: bytes | memoryview, start: int = HEADER) -> Iterator[Record]:
    """The records of a log's bytes, in order, up to the first that is torn, fails its
    crc, or does not follow the one before (the older records a wrapped log left)."""
    view = memoryview(buf)
    pos = start
    prev = 0
    while pos + _REC.size <= len(view):
        length, crc, seq = _REC.unpack_from(view, pos)
        end = pos + _REC.size + length
        if length < 4 or end > len(view) or seq <= prev:
            return
        body = view[pos + _REC.size : end]
        if zlib.crc32(body, zlib.crc32(_SEQ.pack(seq))) != crc:
            return
        files = _decode_body(body)
        if files is None:
            return
        yield Record(seq, files)
        prev = seq
        pos = end


def _decode_body(body: memoryview) -> tuple[tuple[str, bytes], ...] | None:
    (count,) = struct.unpack_from("<I", body, 0)
    pos = 4
    files: list[tuple[str, bytes]] = []
    for _ in range(count):
        if pos + _ENTRY.size > len(body):
            return None
        plen, dlen = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        if pos + plen + dlen > len(body):
            return None
        try:
            rel = bytes(body[pos : pos + plen]).decode("utf-8")
        except UnicodeDecodeError:
            return None
        files.append((rel, bytes(body[pos + plen : pos + plen + dlen])))
        pos += plen + dlen
    return tuple(files)


@dataclass(frozen=True, slots=True)
class Header:
    generation: int
    checkpoint: int
    boot_id: str
    pid: int


def encode_header(h: Header) -> bytes:
    raw = _HEAD.pack(
        MAGIC, VERSION, h.generation, h.checkpoint, h.boot_id.encode("ascii")[:40], h.pid
    )
    return raw + struct.pack("<I", zlib.crc32(raw))


def decode_header(buf: bytes) -> Header | None:
    """The valid header slot with the higher generation, or None (not a log, or never
    got as far as its first header)."""
    best: Header | None = None
    for off in (0, SLOT):
        raw = buf[off : off + _HEAD.size + 4]
        if len(raw) < _HEAD.size + 4:
            continue
        (crc,) = struct.unpack_from("<I", raw, _HEAD.size)
        if zlib.crc32(raw[: _HEAD.size]) != crc:
            continue
        magic, version, gen, ckpt, boot, pid = _HEAD.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            continue
        h = Header(gen, ckpt, boot.rstrip(b"\0").decode("ascii", "replace"), pid)
        if best is None or h.generation > best.generation:
            best = h
    return best


def safe_relative(rel: str) -> bool:
    """Whether a record's path stays inside the bus (a hostile log names nothing else)."""
    if not rel or rel.startswith("/") or "\0" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts)


# ---------------------------------------------------------------- the scope


_scope = threading.local()


def note(path: str) -> None:
    """Called by the bus as it places a file: recorded if a durable publish runs in
    this thread (:meth:`DurableLog.durably`)."""
    paths = getattr(_scope, "paths", None)
    if paths is not None:
        paths.append(path)


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
        self._lock = threading.Lock()
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

    def durably(self, fn: Callable[[], T]) -> T:
        """Run a publish (``fn``, writing without syncs) and make what it placed durable:
        one record and one data sync (or, for a big one, a sync of each file). A nested
        call joins the outer one. If the record cannot be written, the publish's files
        are taken back and :class:`~fsbus.StorageError` is raised."""
        if getattr(_scope, "paths", None) is not None:
            return fn()
        paths: list[str] = []
        stamps: list[tuple[Callable[[Any], object], Any]] = []
        _scope.paths, _scope.stamps = paths, stamps
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
            _scope.paths = _scope.stamps = None
            # Stamped all the same (a stamp for a file taken back costs a listing); an
            # error of a stamp does not hide the publish's own.
            with contextlib.suppress(StorageError):
                _stamp_all(stamps)
            raise
        _scope.paths = _scope.stamps = None
        _stamp_all(stamps)
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
                raise StorageError(
                    f"the durable log {self.path} failed its last checkpoint "
                    f"({self._failed}); see the log for the cause, and close and open "
                    "the bus again",
                    self.path,
                )
            seq = self._seq + 1
            rec = encode_record(seq, files)
            try:
                if self._offset + len(rec) > LOG_SIZE:
                    self._checkpoint_locked()
                    self._offset = HEADER
                self.ops.pwrite(self._fd, rec, self._offset)
                self.ops.fdatasync(self._fd)
            except OSError as exc:
                raise storage_error("writing the durable log", exc, self.path) from exc
            self._offset += len(rec)
            self._seq = seq
        if self._thread is None:
            self._start_checkpoints()

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


# ---------------------------------------------------------------- recovery


def recover(root: str, ops: Ops, staging: str, quarantine: str) -> int:
    """Deal with the logs of dead processes on the bus at ``root`` (see the module's
    docstring); returns how many files were written again."""
    wal_dir = f"{root}/fsbus/wal"
    try:
        names = ops.listdir(wal_dir)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise storage_error("listing the durable logs", exc, wal_dir) from exc
    mine = {w.path for w in _logs.values()}
    written = 0
    for name in sorted(names):
        path = f"{wal_dir}/{name}"
        if path in mine:
            continue
        try:
            st = ops.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error("looking at a durable log", exc, path) from exc
        if not stat.S_ISREG(st.st_mode):
            # a link, a folder, a pipe: no process of fsbus made it; it would make
            # every bus that opens here fail, so it goes where foreign files go
            _quarantine(ops, path, quarantine, "it is not a durable log fsbus wrote")
            continue
        try:
            fd = ops.open(path, os.O_RDWR | _O_CLOEXEC | _O_NOFOLLOW)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error("opening a durable log", exc, path) from exc
        try:
            try:
                ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue  # its process lives
                raise storage_error("locking a durable log", exc, path) from exc
            st = ops.fstat(fd)
            if st.st_nlink == 0:
                continue  # recovered and removed by another process just now
            try:
                written += _recover_one(root, ops, fd, path, st.st_size, staging, quarantine)
            except OSError as exc:
                raise storage_error("reading a durable log", exc, path) from exc
        finally:
            ops.close(fd)
    return written


def _recover_one(
    root: str, ops: Ops, fd: int, path: str, size: int, staging: str, quarantine: str
) -> int:
    head = ops.pread(fd, HEADER, 0)
    header = decode_header(head)
    if header is None:
        if any(head):
            _quarantine(ops, path, quarantine, "it is not a durable log fsbus wrote")
        else:
            # its process died while making it: it never held a record
            with contextlib.suppress(FileNotFoundError):
                ops.unlink(path)
        return 0
    written = 0
    if header.boot_id != ops.boot_id():
        buf = _read_all(ops, fd, size)
        for rec in decode_records(buf):
            if rec.seq <= header.checkpoint:
                continue
            for rel, data in rec.files:
                if not safe_relative(rel):
                    log.warning("durable log %s names %r, outside the bus: skipped", path, rel)
                    continue
                written += _restore(root, ops, rel, data, staging)
        if written:
            log.warning(
                "%d message file(s) written again from durable log %s after a "
                "restart of the machine (they were not on disk yet); a message consumed "
                "in the second before it may be delivered again",
                written,
                path,
            )
    try:
        ops.syncfs(fd)
        # Done, for good: should a power cut bring the log back (its removal is not
        # synced), it has nothing left to replay.
        done = Header(header.generation + 1, ALL_DONE, header.boot_id, header.pid)
        ops.pwrite(fd, encode_header(done), (done.generation % 2) * SLOT)
        ops.fdatasync(fd)
    except OSError as exc:
        raise storage_error("syncing the bus after a durable log's recovery", exc, path) from exc
    with contextlib.suppress(FileNotFoundError):
        ops.unlink(path)
    return written


def _read_all(ops: Ops, fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        b = ops.pread(fd, min(1 << 20, size - pos), pos)
        if not b:
            break
        chunks.append(b)
        pos += len(b)
    return b"".join(chunks)


def _restore(root: str, ops: Ops, rel: str, data: bytes, staging: str) -> int:
    """Put one file of a record back if it is not there whole; 1 if it was written."""
    target = f"{root}/{rel}"
    try:
        fd = ops.open(target, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
    except FileNotFoundError:
        have = None
    except OSError as exc:
        log.warning("%s, named by a durable log, left alone: %s", target, exc)
        return 0  # not a file we can read (a link planted there)
    else:
        try:
            have = _read_fd(ops, fd)
        except OSError as exc:
            log.warning("%s, named by a durable log, left alone: %s", target, exc)
            return 0  # a folder where the file was
        finally:
            ops.close(fd)
    if have is not None and len(have) == len(data) and have[1:] == data[1:]:
        return 0  # there whole (its leading byte may count a delivery since)
    folder = os.path.dirname(target)
    if have is None and not _exists(ops, folder) and not _exists(ops, os.path.dirname(folder)):
        return 0  # its queue (or its bus) is gone
    tmp = f"{staging}/restored-{secrets.token_hex(8)}"  # (a message's name may be 251 bytes)
    try:
        with contextlib.suppress(FileExistsError):
            ops.mkdir(folder, 0o777)  # (a bucket made for it, lost with it)
        wfd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | _O_NOFOLLOW)
        try:
            pos = 0
            while pos < len(data):
                pos += ops.write(wfd, memoryview(data)[pos:])
        finally:
            ops.close(wfd)
        ops.rename(tmp, target)
    except OSError as exc:
        # the log stays: the next bus to open tries again
        raise storage_error("writing back a message from a durable log", exc, target) from exc
    return 1


def _read_fd(ops: Ops, fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        b = ops.read(fd, 1 << 16)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _fsync_dir(ops: Ops, path: str) -> None:
    fd = ops.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        ops.fsync(fd)
    finally:
        ops.close(fd)


def _exists(ops: Ops, path: str) -> bool:
    try:
        ops.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _quarantine(ops: Ops, path: str, quarantine: str, why: str) -> None:
    dest = f"{quarantine}/{os.path.basename(path)}"
    try:
        ops.rename(path, dest)
    except OSError as exc:
        log.warning("durable log %s: %s, and moving it aside failed: %s", path, why, exc)
        return
    log.warning("%s: %s; moved to %s", path, why, dest)
