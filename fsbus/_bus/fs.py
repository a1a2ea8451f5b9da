"""The bus's I/O seam: every file operation on a bus directory lives here.

All functions are blocking and meant to be called in batches from a worker thread
(the async engine) or directly (the blocking face). Errors come out as
:class:`~fsbus.StorageError` subclasses that name the path and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import logging
import mmap
import os
import random
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from .._core.mounts import detect
from .._core.platform import MountFacts, Platform, decide
from .._errors import (
    LockingUnsupported,
    PayloadTooLarge,
    StorageError,
    StoragePermissionError,
    UsageError,
    storage_error,
)
from .._settings import Settings
from . import wal
from .layout import Layout
from .namer import pid_tag
from .ops import DEFAULT_OPS, Ops
from .plan import PublishPlan, unframe_headers
from .scan import BAD_SPILL, sweep_due
from .stamps import fresh, renew, tagged
from .wal import ACTIVE as LOGGING
from .wal import DurableLog, hold_stamp, note

__all__ = [
    "BusFS",
    "Claim",
    "Go",
    "PublishPlan",
    "ReadResult",
    "Withdrawn",
    "decode_meta",
    "encode_meta",
    "filesystem_type",
    "locks_stay_local",
    "probe_locking",
    "stamps_batched",
]

T = TypeVar("T")

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW
_REWRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | _O_NOFOLLOW
# O_NONBLOCK: a FIFO planted under a message name must not block the reader
# (it changes nothing for regular files).
_READ = os.O_RDONLY | os.O_NONBLOCK | _O_CLOEXEC | _O_NOFOLLOW
_CLAIM = os.O_RDWR | _O_CLOEXEC | _O_NOFOLLOW
_LEADING = b"\x00"
# The leading byte of a message file is ours: qlobber-fsq writes 0 and reads from byte 1.
# A consumer holding a work-queue message stores there how many deliveries were recorded
# (one pwrite on the fd it holds, instead of a counter file per delivery). It saturates
# at _COUNT_MAX; from there the counter file under fsbus/attempts/ holds the count.
_COUNT_MAX = 255
_SPARE_SEQ = itertools.count(int.from_bytes(os.urandom(4), "big"))
_SPARE_AGE = 60.0
"""Seconds a spare staging file (:meth:`BusFS.publish_plain`) waits for a publish before
it is replaced: far below the age (600 s unless ``gc`` is told less) at which the debris
sweep takes a spare for a dead publisher's leftover."""
_SPLIT_READ = 1 << 16  # above this a payload is read apart from its leading byte
_MISSING = (errno.ENOENT, errno.ESTALE)
# Files a reader passes over: links, unreadable files, directories, sockets.
_SKIP = (errno.ELOOP, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENXIO)
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
"""Errors opening UPDATE for writing after which the bus may still be looked at."""
_CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC
# The Ops methods the hot paths call: an Ops that keeps them all as they are (it may
# fake the mount table) lets those paths call the system directly.
_HOT_OPS = ("open", "close", "writev", "rename", "pwrite", "listdir", "unlink")
log = logging.getLogger("fsbus.fs")


def _own_file(st: os.stat_result) -> bool:
    """A regular file with no other name: one the bus (or a peer) wrote, not a link."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _inline_flag(name: str) -> bool:
    """Whether an fsbus name says its headers are inline in the file (``FLAG_INLINE``)."""
    unique = name[name.rfind("+") + 1 :]
    return len(unique) == 34 and unique.startswith("f1") and unique[2] in "2367abef"


def _has_meta_flag(name: str) -> bool:
    """Whether an fsbus name says a headers sidecar exists (foreign names: maybe)."""
    unique = name[name.rfind("+") + 1 :]
    if len(unique) == 34 and unique.startswith("f1"):
        return unique[2] in "13579bdf"
    return True


_BATCH = threading.local()
"""The buckets this thread placed messages in, on any bus, whose stamps wait for the end
of its :func:`stamps_batched` block: (bus, bucket index) → whether no subscription of
that bus wants any of them (:meth:`BusFS.stamp_own`)."""


@contextlib.contextmanager
def stamps_batched() -> Iterator[None]:
    """Hold back the stamps of the messages this thread places, on any bus, until the
    block ends; then stamp each bucket that got one once, in the order they came.

    It is a durable publish's (one message and its queue copies): it stamps nothing
    before all of it is synced. A stamp wakes subscribers, whose listings (an access
    time on a ``relatime`` mount), claims and removals in the bucket, and the stamp's
    own write, would otherwise land between the publish's syncs and make each of the
    later ones a journal commit of its own (measured on journaled ext4: 0.4 ms each,
    where they take 0.03 ms with nothing between them). A subscriber is also woken only
    for a message that a power cut would keep. A stamp that fails is raised once every
    stamp was tried, unless the block raised (then it is logged): its own error is not
    hidden.

    Not for a batch of several messages into one bus: a listing takes only messages
    named before it began, which keeps each publisher's order only if every earlier
    message was placed *and stamped* by then (:func:`~fsbus._bus.scan.split_fresh`).
    (The AMQP gateway once stamped a batch of a connection's publishes this way: a
    consumer then got a later message of the batch before an earlier one.)

    A block that raises still stamps what it placed (a stamp for a message taken back
    costs a listing). Nested blocks stamp when the outermost one ends.
    """
    if getattr(_BATCH, "due", None) is not None:
        yield
        return
    due: dict[tuple[BusFS, int], bool] = {}
    _BATCH.due = due
    ok = False
    try:
        yield
        ok = True
    finally:
        _BATCH.due = None
        first: StorageError | None = None
        for (fs, bucket_index), own in due.items():
            try:
                if own:
                    fs.stamp_own(bucket_index)
                else:
                    fs.stamp(bucket_index)
            except StorageError as exc:
                if ok:
                    first = first or exc
                else:
                    log.warning(
                        "could not stamp a bucket of %s: %s; its new messages are found "
                        "at the next full listing",
                        fs.layout.root,
                        exc,
                    )
        if first is not None:
            raise first


_MKDIR_TRIES = 8
"""Tries to make (or find) one directory another host is making at the same time."""
_MKDIR_SPLIT = 256
"""More directories to make than this (a new bus) are made in two threads."""


class NameClash(Exception):
    """Another publisher is staging a message of the same name: name it again, retry."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class Withdrawn(Exception):
    """A publish given up just before its rename (its caller was cancelled).

    Nothing of it is visible: the staging file and any sidecars were removed.
    """

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


Go = Callable[[], bool]
"""Asked just before a publish's rename, in the thread that publishes: False withdraws it."""
Then = Callable[[], None]
"""Called once a publish is visible (see :meth:`BusFS.publish`): what it raises takes it back."""

ONE_PAGE = 4096

# Messages whose size the debris sweep looks at (one lstat each) in one sweep, at most.
# A bus whose messages wait in the thousands (a queue with a backlog, multi messages kept
# until they expire) has each of them looked at once every few sweeps instead of at every
# sweep: an empty leftover is rare, harmless (no one delivers it), and a claim of it
# removes it anyway.
DEBRIS_LOOKS = 2048
"""The largest message file (leading byte and payload) that a durable publish may sync
after its rename rather than before (:meth:`BusFS.places_first`)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A multi message read (or not) from disk."""

    payload: bytes | None
    """The payload, or None when the file was gone or not a regular file."""
    meta: bytes | None
    """The headers sidecar, if any."""


@dataclass(slots=True)
class Claim:
    """A single message locked by this process (the fd holds the flock)."""

    bucket: str
    """Bucket directory name."""
    name: str
    """File name."""
    fd: int
    """Open descriptor holding LOCK_EX."""
    payload: bytes
    """The payload read under the lock."""
    meta: bytes | None
    """The headers sidecar, if any."""
    attempts: int
    """Deliveries recorded before this one (failed, or cut off with their consumer)."""
    renamed: bool = False
    """Claimed by renaming it into ``fsbus/claims/`` (locking "rename"), not by flock."""
    counted: bool = False
    """This delivery is already in the count (:meth:`BusFS.count_deliveries`)."""
    counter_file: bool = True
    """Whether a counter file may exist under ``fsbus/attempts/`` (False once looked)."""


class BusFS:
    """Blocking operations on one bus directory."""

    def __init__(self, layout: Layout, config: Settings, ops: Ops | None = None) -> None:
        self.layout = layout
        self.config = config
        self.ops = ops or DEFAULT_OPS
        self._file_mode = config.file_mode
        self._dir_mode = config.dir_mode
        self._update_fd: int | None = None
        self.read_only: str | None = None
        """Why this bus can only be looked at (its UPDATE file cannot be opened for
        writing: a read-only mount, no write permission), or None."""
        self.platform: Platform = decide(MountFacts(fstype="ext4"))
        """What this filesystem needs (``fsbus._core.platform.decide``); set by setup()."""
        self._read_fd: int | None = None  # UPDATE opened for coherent reads (O_DIRECT)
        self._local_read_fd: int | None = None  # UPDATE opened for page-cache reads
        self._read_direct = False
        self._direct_ok = False
        self._read_lock = threading.Lock()  # the scanner and the poller thread share the fd
        self._read_buf: mmap.mmap | None = None
        self._stamp_reopen = False
        self._place_first = False  # (durable publishes: see places_first)
        self.log_source: Callable[[], DurableLog | None] | None = None
        """Where durable publishes here are made durable by a record in the process's
        durable log (:mod:`fsbus._bus.wal`) instead of syncs: set by the bus that opens
        this one (:meth:`use_durable_log`) and given to its queues' buses; None syncs."""
        self._log_release: Callable[[], None] | None = None
        self._lister: ThreadPoolExecutor | None = None
        self._warned: set[str] = set()
        self._rand = random.Random()
        self.locking = "rename" if config.locking == "rename" else "flock"
        """How single messages are claimed here ("auto" is resolved by :meth:`setup`)."""
        self.peerless = False
        """No qlobber-fsq peer reads this directory (a durable queue's bus), nor an fsbus
        older than its queues: see :meth:`ack` and :meth:`fill_attempts`."""
        self.spares = False
        """Stage each plain publish in a file created ahead, on a local filesystem (set by
        the bus that publishes here before :meth:`setup`): see :meth:`publish_plain`."""
        self._spare_files: list[tuple[int, str, float, str]] = []  # fd, path, made, pid
        self._spares_dir = f"{layout.spares}/"
        self._staging = layout.staging
        self._messages = layout.messages
        self._bucket_dirs = tuple(f"{layout.messages}/{b}/" for b in layout.buckets)
        self._stamp_size = layout.stamp_size
        self._stamp_bits = layout.stamp_size * 8
        self._getrandbits = self._rand.getrandbits
        # Own stamps (see stamp_own): bucket -> the stamp value this bus has accounted
        # for (listed after it, or wrote itself with nothing else between), and bucket ->
        # the last stamp it wrote while that held.
        self.track_own = False
        """Set by the engine once it scans, on a local filesystem only."""
        self._tag_able = False  # (tag_stamps)
        self._tag = False  # stamps tagged now: able, and a router is at work
        self._router = False
        self.router_active: Callable[[], bool] | None = None
        """Whether a router of queue consumers is at work on the bus (the queue store's
        look, set by the engine), read when the bus opens (see :meth:`note_router`)."""
        self._own_lock = threading.Lock()
        self._known: dict[int, bytes] = {}
        self._own: dict[int, bytes] = {}
        # The hot path calls the system directly unless a test injected its own Ops.
        plain = all(getattr(type(self.ops), n) is getattr(Ops, n) for n in _HOT_OPS)
        self._plain_ops = plain
        # Where each path component costs a round trip (Platform.read_at_dirs and
        # write_at_dirs), the staging and messages directories are kept open and files
        # are named relative to them.
        self._read_at = self._write_at = False
        self._dir_fds: dict[str, int] = {}
        self._retired: list[int] = []  # replaced directory fds, closed with the bus
        self._swept: float | None = None  # when crash debris was last swept
        self._sweeps = 0  # sweeps done: which slice of the messages the next one sizes
        self._swept_names = 0  # messages the last sweep listed
        self._open = os.open if plain else self.ops.open
        self._writev = os.writev if plain else self.ops.writev
        self._close = os.close if plain else self.ops.close
        self._rename = os.rename if plain else self.ops.rename
        self._pwrite = os.pwrite if plain else self.ops.pwrite

    # ------------------------------------------------------------------ set-up
    def setup(self, *, reset_update: bool = True) -> None:
        """Create missing directories and the UPDATE file; check for planted links.

        Also finds out which filesystem holds the bus and follows what it needs
        (:attr:`platform`): how UPDATE is read and stamped, how singles are claimed.
        """
        ops = self.ops
        lay = self.layout
        self._created: list[str] = []
        for d in lay.all_dirs():
            if d == lay.root:
                try:
                    self._make_parents(d)  # like Stream.open: missing parents are made
                    ops.mkdir(d, 0o777 if self._dir_mode is None else 0o700)
                    self._created.append(d)
                    if self._dir_mode is not None:
                        ops.chmod(d, self._dir_mode)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise storage_error("creating the bus directory", exc, d) from exc
            else:
                self._make_dir(d, "creating the bus directory")
        self._apply_platform(detect(lay.root, ops))
        if self.spares and self.platform.family == "local":
            try:
                self._make_dir(lay.spares, "creating the spares directory")
            except StorageError:
                self.spares = False  # (read-only here, say: publishing will tell)
        else:
            self.spares = False
        if self.platform.shared:
            # Other hosts list these buckets through their own clients, whose caches
            # may keep a bucket's absence: every one is made now, as qlobber-fsq does.
            parents = (lay.messages, lay.topics)
            present = self._present_subdirs(parents)
            self._make_dirs(
                [f"{p}/{b}" for p in parents for b in lay.buckets if f"{p}/{b}" not in present],
                "creating the bus directory",
            )
        self._check_buckets()
        self._sync_created()
        if self.config.locking == "auto":
            # Rename on mounts where flock stays on each host, and wherever another
            # consumer already claims by rename (a host on the backing disk of an sshfs
            # share must follow the sshfs hosts, or the two kinds of claim would mix).
            local = self.platform.single_locking == "rename" or self._exists(self._claims)
            self.locking = "rename" if local else "flock"
        elif self.locking == "flock" and self.platform.locks_global is False:
            raise LockingUnsupported(
                f"locking='flock' on {self.platform.fstype or 'this filesystem'} at "
                f"{lay.root}: flock does not exclude other hosts here "
                f"({'; '.join(self.platform.notes[1:]) or 'locks stay on each client'}), so two "
                "hosts could take one work-queue message; use BusConfig(locking='auto') or "
                "locking='rename', or change the mount so that flock crosses hosts",
                lay.root,
            )
        if self.locking == "rename":
            self._make_dir(self._claims, "creating the claims directory")
            present = self._present_subdirs((self._claims,))
            self._make_dirs(
                [
                    f"{self._claims}/{b}"
                    for b in lay.buckets
                    if f"{self._claims}/{b}" not in present
                ],
                "creating the claims directory",
            )
        self._open_update(reset_update)

    def _check_buckets(self) -> None:
        """Refuse a bucket name under ``messages``, ``topics``, ``fsbus/meta`` or
        ``fsbus/attempts`` that is not a directory (a planted link would take what is
        written through it elsewhere): buckets are made on first use (on a local
        filesystem), so nothing else looks at them before."""
        buckets = set(self.layout.buckets)
        for parent in self.layout.bucket_parents:
            try:
                names = self.ops.listdir(parent)
                real = self.ops.subdirs(parent)
            except OSError as exc:
                raise storage_error("checking the bus directory", exc, parent) from exc
            for name in names:
                if name in buckets and name not in real:
                    self._check_dir(f"{parent}/{name}")  # raises: it is not a directory

    def _make_bucket(self, d: str) -> None:
        """Make bucket directory ``d`` (of :attr:`Layout.bucket_parents`) on its first
        use. Its name is synced before a file goes into it, whether or not that file is
        durable: a durable file written into it later syncs only the bucket (as when
        every bucket was made, and synced, with the bus). Not on a filesystem that
        commits metadata in order (journaled ext4, XFS: :attr:`places_first`), where
        the sync of the bucket that a durable file asks for commits its making too.

        Raises OSError, as the write that needed the bucket would have: the caller
        takes back what it wrote and says what failed (a bucket that cannot be made,
        or a name there that is not a directory, named with the path)."""
        try:
            self._make_dir(d, "creating a bucket directory", record=False)
        except StorageError as err:
            cause = err.__cause__
            if isinstance(cause, OSError):
                raise cause from None
            raise NotADirectoryError(errno.ENOTDIR, str(err), d) from None
        if not self._place_first:
            with contextlib.suppress(StorageError):  # (as setup: a mount that cannot sync)
                self._fsync_dir(os.path.dirname(d))

    def _present_subdirs(self, parents: Iterable[str]) -> set[str]:
        """Bucket directories that already exist, found with one listing per parent.

        On a network filesystem each mkdir and lstat is a round trip (2,000 of them
        took 0.5-2 s on CephFS and GlusterFS); an existing bus needs none of them.
        """
        found: set[str] = set()
        buckets = self.layout.buckets
        for parent in parents:
            try:
                names = self.ops.subdirs(parent)
            except OSError:
                continue
            found.update(f"{parent}/{b}" for b in buckets if b in names)
        return found

    def _make_dir(self, d: str, what: str, *, record: bool = True) -> None:
        ops = self.ops
        for attempt in range(_MKDIR_TRIES):
            try:
                ops.mkdir(d, 0o777 if self._dir_mode is None else 0o700)
                if self._dir_mode is not None:
                    ops.chmod(d, self._dir_mode)
                if record:
                    self._created.append(d)  # synced at the end of setup
                return  # made just now: a directory
            except FileExistsError:
                # Made by another host just now. GlusterFS can answer EEXIST to mkdir and
                # then ENOENT to a lookup for a moment: look again before giving up.
                if attempt + 1 < _MKDIR_TRIES and not self._exists(d):
                    time.sleep(0.05 * (attempt + 1))
                    continue
            except OSError as exc:
                raise storage_error(what, exc, d) from exc
            break
        self._check_dir(d)  # there already: a directory, or something foreign

    def _make_dirs(self, dirs: list[str], what: str) -> None:
        """Make missing directories; a few at once where each is a network round trip,
        and two at once for a new bus on a local disk (its 1,024 bucket directories:
        25 ms one by one on journaled ext4, 15 ms in two threads, each making whole
        parents', so that the two do not wait on one parent's lock)."""
        workers = self.platform.list_workers
        if workers > 1 and len(dirs) > 16:
            parts = [dirs[k::workers] for k in range(workers)]
            for _ in self._pool().map(self._make_each, parts, [what] * len(parts)):
                pass
            return
        if len(dirs) > _MKDIR_SPLIT:
            half = len(dirs) // 2  # listed parent by parent (Layout.all_dirs)
            with ThreadPoolExecutor(1, thread_name_prefix="fsbus-mkdir") as pool:
                other = pool.submit(self._make_each, dirs[half:], what)
                self._make_each(dirs[:half], what)
                other.result()
            return
        for d in dirs:
            self._make_dir(d, what)

    def _make_each(self, dirs: list[str], what: str) -> None:
        for d in dirs:
            self._make_dir(d, what)

    def _pool(self) -> ThreadPoolExecutor:
        if self._lister is None:
            workers = self.platform.list_workers
            self._lister = ThreadPoolExecutor(workers, thread_name_prefix="fsbus-fs")
        return self._lister

    def _apply_platform(self, platform: Platform) -> None:
        self.platform = platform
        self._read_at = platform.read_at_dirs and self._plain_ops
        self._write_at = platform.write_at_dirs and self._plain_ops
        self._stamp_reopen = platform.stamp_write == "reopen"
        self._read_direct = platform.stamp_read == "direct"
        self._place_first = platform.durable_order == "place_first"
        if platform.shared:
            # (a router on a shared mount lists every change: engine.py)
            self._tag_able = self._tag = False

    @property
    def _claims(self) -> str:
        return f"{self.layout.private}/claims"

    def _claim_path(self, bucket: str, name: str) -> str:
        return f"{self.layout.private}/claims/{bucket}/{name}"

    def _exists(self, path: str) -> bool:
        try:
            self.ops.lstat(path)
        except OSError:
            return False
        return True

    def _make_parents(self, path: str) -> None:
        parent = os.path.dirname(path)
        if not parent or parent == path:
            return
        try:
            self.ops.mkdir(parent, 0o777)
        except FileExistsError:
            return
        except FileNotFoundError:
            self._make_parents(parent)
            self.ops.mkdir(parent, 0o777)
        self._created.append(parent)

    def _sync_created(self) -> None:
        """Make the directories this setup created durable: each one's parent is
        fsynced (a power cut would otherwise take a new bus, or a new queue's bus, with
        the durable messages later published into it)."""
        created, self._created = self._created, []
        for parent in sorted({os.path.dirname(d) for d in created}, key=len, reverse=True):
            try:
                self._fsync_dir(parent)
            except StorageError:
                pass  # a filesystem that cannot sync directories: nothing more to do

    def _check_dir(self, path: str) -> None:
        try:
            st = self.ops.lstat(path)
        except OSError as exc:
            raise storage_error("checking the bus directory", exc, path) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(
                f"{path} should be a directory but is "
                f"{'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'a file'}; "
                "something foreign is in the bus directory: move it away and retry",
                path,
            )

    def _open_update(self, reset: bool) -> None:
        size = self.layout.update_size
        if size == 0:
            return
        path = self.layout.update_file
        try:
            fd = self.ops.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, 0o666)
        except OSError as exc:
            if exc.errno in _READ_ONLY and self._open_update_read_only(path, exc):
                return
            raise storage_error("opening the UPDATE file", exc, path) from exc
        self._update_fd = fd
        if self._file_mode is not None:
            # Created by us (or an earlier run of ours): give it the configured mode, as
            # every other file gets, so other users sharing the bus can stamp it.
            st = self.ops.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != self._file_mode:
                try:
                    self.ops.fchmod(fd, self._file_mode)
                except OSError as exc:
                    raise storage_error("setting the UPDATE file's mode", exc, path) from exc
        if reset or self.ops.fstat(fd).st_size < size:
            noise = os.urandom(size)
            try:
                if self._tag_able:
                    # Every slot changes, as ever, and says what it said (an fsbus stamp,
                    # or a peer's to carry), or a router would take every bucket for a
                    # peer's after each bus that opens (stamps.py). With no router at
                    # work, all say fsbus: one that starts lists every bucket first.
                    self.note_router(self.router_active is not None and self.router_active())
                    before = self.ops.pread(fd, size, 0) if self._tag else b""
                    noise = renew(before, noise, self._stamp_size, time.time())
                self.ops.pwrite(fd, noise, 0)
            except OSError as exc:
                raise storage_error("initialising the UPDATE file", exc, path) from exc

    def _open_update_read_only(self, path: str, exc: OSError) -> bool:
        """UPDATE could not be opened for writing (``exc``): whether it can be read, the
        bus then open for looking only (:attr:`read_only`)."""
        try:
            fd = self.ops.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
        except OSError:
            return False
        try:
            big_enough = self.ops.fstat(fd).st_size >= self.layout.update_size
        finally:
            self.ops.close(fd)
        if not big_enough:
            return False  # never initialised: not a bus to look at
        self.read_only = f"its UPDATE file cannot be opened for writing: {exc.strerror or exc}"
        return True

    def check_writable(self, what: str) -> None:
        """Raise :class:`StoragePermissionError` when this bus is open for looking only
        (:attr:`read_only`): ``what`` needs to write in its directory."""
        if self.read_only is not None:
            raise StoragePermissionError(
                f"{what} writes in the bus directory, and {self.layout.root} can only be "
                f"read here ({self.read_only}); remount it read-write or give this user "
                "write access, or only look: stats, ls, queue ls, top, browse and "
                "subscriptions to multi messages (kind='multi') work",
                self.layout.root,
            )

    def use_durable_log(self) -> None:
        """After :meth:`setup`, for a bus (not a queue's): write back what the durable
        logs of dead processes hold that a restart of the machine lost, and make
        durable publishes here go through this process's log if ``durable_log`` says so
        (:mod:`fsbus._bus.wal`; the log itself is made by the first such publish)."""
        if self.read_only is not None:
            return
        mode = self.config.durable_log
        lay = self.layout
        self.recover_logs()
        if mode == "on" and self.platform.shared:
            raise UsageError(
                f"durable_log='on' on {self.platform.fstype or 'a shared filesystem'} at "
                f"{lay.root}: other hosts share this mount, and a durable log is written "
                "back by its own machine only; use durable_log='auto' or 'off' here"
            )
        if mode == "off" or (mode == "auto" and not self.platform.durable_log):
            return
        if self.locking == "rename":
            return  # a claim moves the message out of the files a record names

        root, ops = lay.root, self.ops
        held: list[DurableLog] = []
        failed: list[StorageError] = []
        lock = threading.Lock()

        def source() -> DurableLog | None:
            if held and held[0].pid == os.getpid():
                return None if held[0].broken else held[0]
            with lock:
                if held and held[0].pid != os.getpid():
                    held.clear()  # a forked child: the log is its parent's
                if not held and not failed:
                    try:
                        held.append(wal.acquire(root, ops, self._file_mode, self._dir_mode))
                    except StorageError as exc:
                        # (a folder made by another user, say): the files are synced
                        failed.append(exc)
                        log.warning(
                            "durable publishes on %s sync their files instead of using a "
                            "durable log: %s",
                            root,
                            exc,
                        )
            return held[0] if held and not held[0].broken else None

        def give_back() -> None:
            if held and held[0].pid == os.getpid():
                wal.release(held.pop())

        self.log_source = source
        self._log_release = give_back

    def finish_setup(self, host: str, hostname: str) -> None:
        """After :meth:`setup`, for a bus (not a queue's): :meth:`use_durable_log`,
        then this host's record; if either fails, what setup opened is closed."""
        try:
            self.use_durable_log()
            self.register_host(host, hostname)
        except BaseException:
            self.close()  # (the UPDATE descriptor setup opened)
            raise

    def gc_turn(self, interval: float) -> int | None:
        """Whether this process runs the periodic collection of the bus now, on behalf of
        every process that runs one on it: each did, every ``gc_interval``, and each
        collection lists every bucket (the main bus keeps every multi message until it
        expires: 0.1-0.2 s a collection with 100,000 on tmpfs, in every process).

        Returns -1 to collect and say nothing (``fsbus/gc`` cannot be opened or locked
        here: collect as ever); a descriptor of ``fsbus/gc``, locked, to collect and
        then pass to :meth:`gc_done`; None to let this one pass: another process is
        collecting now (holds the lock), or finished less than nine tenths of
        ``interval`` ago (the file's mtime, which :meth:`gc_done` sets)."""
        if self.read_only is not None:
            return -1
        path = f"{self.layout.private}/gc"
        mode = 0o666 if self._file_mode is None else self._file_mode
        flags = os.O_RDWR | _O_CLOEXEC | _O_NOFOLLOW
        made = True  # (a file made now says nothing of a collection)
        try:
            try:
                fd = self.ops.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                made = False
                fd = self.ops.open(path, flags)
        except OSError:
            return -1
        try:
            self.ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.ops.close(fd)
            return None  # another process is collecting
        except OSError:
            self.ops.close(fd)
            return -1  # (no flock on this mount)
        try:
            since = interval if made else time.time() - self.ops.fstat(fd).st_mtime
        except OSError:
            since = interval
        if 0 <= since < interval * 0.9:
            self.ops.close(fd)  # (its lock with it)
            return None
        return fd

    def gc_done(self, fd: int) -> None:
        """A collection that :meth:`gc_turn` gave ``fd`` for ended (or failed): mark
        when, and let the lock go."""
        if fd < 0:
            return
        try:
            with contextlib.suppress(OSError):
                self.ops.utime(f"{self.layout.private}/gc")
        finally:
            self.ops.close(fd)

    def recover_logs(self) -> int:
        """The durable logs of dead processes here, dealt with (:func:`wal.recover`):
        when a bus opens, and at each gc (a log left long after its process died
        would, after a power cut, bring back the messages consumed since). Returns
        the files written back. Not on a mount other hosts share: a log there is
        another machine's (its flock is not seen from here), and only its own
        machine can tell whether it is dead."""
        if self.read_only is not None or self.platform.shared:
            return 0
        lay = self.layout
        return wal.recover(lay.root, self.ops, lay.staging, lay.quarantine)

    def close(self) -> None:
        """Close the UPDATE descriptors (and the listing threads); remove the spares;
        give back the durable log."""
        release, self._log_release = self._log_release, None
        if release is not None:
            release()
        self.drop_spares()
        if self._update_fd is not None:
            fd, self._update_fd = self._update_fd, None
            self.ops.close(fd)
        with self._read_lock:
            self._drop_read_fd()
            self._drop_local_read_fd()
        if self._lister is not None:
            self._lister.shutdown(wait=False)
            self._lister = None
        fds = [*self._dir_fds.values(), *self._retired]
        self._dir_fds, self._retired = {}, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _dir_fd(self, path: str) -> int:
        """A bus directory, opened once and kept (``Platform.read_at_dirs``...).

        On FUSE and network mounts the kernel asks the server again about every
        component of a path (GlusterFS's entry timeout is 0, ceph-fuse's is short): a
        file named relative to its kept directory costs one lookup instead of one per
        component. Kept until the bus closes (closing one while another thread uses
        it could hand its number to another file); :meth:`_check_dir_fds` replaces one
        whose directory was replaced.
        """
        fd = self._dir_fds.get(path)
        if fd is None:
            fd = os.open(path, _DIR)
            kept = self._dir_fds.setdefault(path, fd)
            if kept != fd:
                os.close(fd)  # another thread opened it first
            fd = kept
        return fd

    def _check_dir_fds(self) -> None:
        """Re-open a kept directory whose path now names another directory (the bus
        was removed and made again): at each full listing, as UPDATE is re-opened."""
        for path, fd in list(self._dir_fds.items()):
            try:
                st, kept = os.stat(path), os.fstat(fd)
            except OSError:
                continue
            if (st.st_ino, st.st_dev) != (kept.st_ino, kept.st_dev):
                try:
                    self._dir_fds[path] = os.open(path, _DIR)
                except OSError:
                    continue
                self._retired.append(fd)

    # ------------------------------------------------------------------ publish
    def publish(
        self,
        plan: PublishPlan,
        payload: bytes | str | os.PathLike[str],
        go: Go | None = None,
        then: Then | None = None,
    ) -> int:
        """Write a message completely (stage, sidecars, rename, stamp); returns its size.

        ``go``, when given, is asked once everything is written (and synced, unless the
        message :meth:`places_first`), just before the rename that makes the message
        visible: False removes what was staged and raises :class:`Withdrawn` (nothing of
        the message is visible then). ``then``, when given, is called once it is
        visible (before its syncs, if it places first); what it raises takes the
        message back and is raised.
        """
        if plan.durable and self.log_source is not None:
            durable_log = self.log_source()
            if durable_log is not None:
                plain = plan._replace(durable=False)
                return durable_log.durably(lambda: self.publish(plain, payload, go, then))
        if isinstance(payload, bytes):
            return self._publish_bytes(plan, payload, go, then)
        staged = self.begin(plan)
        try:
            size = self._copy_file(staged, os.fspath(payload))
        except BaseException:
            self.abort(plan, staged)
            raise
        self.commit(plan, staged, go)
        self._then(plan, then)
        return size

    def places_first(self, plan: PublishPlan, size: int) -> bool:
        """Whether a durable publish of a ``size``-byte payload under ``plan`` is renamed
        into its bucket before it is synced (:meth:`commit_then_sync`): here the
        filesystem writes a new file's data before the metadata that shows it
        (:attr:`~fsbus._core.platform.Platform.durable_order`), and it is one page with
        no sidecar. A power cut before the publish returns then leaves it whole, absent
        or empty, as it leaves a plain publish; an empty file is no message, and is
        collected as debris. A message with a sidecar is synced before its rename, the
        sidecars' names first (a cut would leave it without its topic or headers); a
        larger one too (a cut could leave part of it)."""
        return (
            self._place_first
            and plan.durable
            and plan.spill is None
            and plan.meta is None
            and size < ONE_PAGE
        )

    def _then(self, plan: PublishPlan, then: Then | None) -> None:
        if then is not None:
            try:
                then()
            except BaseException:
                self._unlink_quiet(self.layout.message_path(plan.bucket, plan.name))
                raise

    def _publish_bytes(
        self, plan: PublishPlan, payload: bytes, go: Go | None = None, then: Then | None = None
    ) -> int:
        if self.places_first(plan, len(payload)):
            fd = self._stage(f"{self._staging}/{plan.name}", payload)
            self.commit_then_sync(plan, fd, go, then)
        elif plan.durable or plan.spill is not None or plan.meta is not None:
            fd = self._stage(f"{self._staging}/{plan.name}", payload)
            self.commit(plan, fd, go)
            self._then(plan, then)
        else:
            self.publish_plain(plan.name, plan.bucket_index, payload, go, own=plan.own)
            self._then(plan, then)
        return len(payload)

    def publish_plain(
        self,
        name: str,
        bucket_index: int,
        payload: bytes,
        go: Go | None = None,
        own: bool = False,
        *,
        spare_ok: bool = True,
    ) -> str:
        """Publish a plain message (no sync, spill or sidecar); returns its path.

        The hot path: open, one writev, close, rename into the bucket, stamp. ``go`` as
        in :meth:`publish`; ``own``: no subscription of this bus wants it (see
        :meth:`stamp_own`).

        With :attr:`spares`, the message is written into an empty file this bus created
        after its previous plain publish was stamped, in ``fsbus/spares/``, and the
        next one is created after this one's stamp: the creation (a third of a plain
        publish on journaled ext4) happens while subscribers read the message, not
        before they can. A spare the debris sweep took meanwhile (an idle publisher
        and a ``gc`` told a short age) is found gone by the rename: the message is then
        staged as without spares (``spare_ok=False``).
        """
        spare = self._take_spare() if self.spares and spare_ok else None
        if spare is None:
            path = f"{self._staging}/{name}"
            fd = self._stage(path, payload)
        else:
            fd, path = spare
            self._fill(fd, path, payload)
        try:
            self._close(fd)
        except OSError as exc:
            self._unlink_quiet(path)
            raise storage_error("writing a message", exc, path) from exc
        if go is not None and not go():
            self._unlink_quiet(path)
            raise Withdrawn(path)
        final = self._bucket_dirs[bucket_index] + name
        try:
            self._place(path, final)
        except NameClash:
            self._unlink_quiet(path)
            raise
        except FileNotFoundError as exc:
            self._unlink_quiet(path)
            if spare is None:
                # (the staged file, or the bucket that could not be made: the path says)
                raise storage_error("publishing a message", exc, exc.filename or path) from exc
            # (or the bucket is gone: then staging it anew says so)
            return self.publish_plain(name, bucket_index, payload, go, own, spare_ok=False)
        except OSError as exc:
            self._unlink_quiet(path)
            raise storage_error("publishing a message", exc, exc.filename or path) from exc
        if LOGGING[0] and hold_stamp(self.stamp_own if own else self.stamp, bucket_index):
            pass  # a durable publish through the durable log: stamped once recorded
        elif self._stamp_later(bucket_index, own):
            pass  # at the end of this thread's stamps_batched block
        elif own:
            self.stamp_own(bucket_index)
        else:
            self.stamp(bucket_index)
        if self.spares and not self._spare_files:
            self._make_spare()
        return final

    def _take_spare(self) -> tuple[int, str] | None:
        """A spare staging file of this process (open, empty), if one is fresh enough
        (:data:`_SPARE_AGE`); one that is not is removed."""
        try:
            fd, path, made, owner = self._spare_files.pop()  # (atomic: threads publish)
        except IndexError:
            return None
        if owner != pid_tag():  # inherited through a fork: the parent's
            with contextlib.suppress(OSError):
                os.close(fd)
            return None
        if time.monotonic() - made > _SPARE_AGE:
            self._discard(fd, path)
            return None
        return fd, path

    def _make_spare(self) -> None:
        """Create the next plain publish's staging file (empty, open) in
        ``fsbus/spares/``; nothing when that fails (the publish creates its own)."""
        pid = pid_tag()
        path = f"{self._spares_dir}{pid}-{next(_SPARE_SEQ):x}"
        try:
            fd = self._open(path, _CREATE, 0o666)
        except OSError:
            return
        try:
            if self._file_mode is not None:
                self.ops.fchmod(fd, self._file_mode)
        except OSError:
            self._discard(fd, path)
            return
        self._spare_files.append((fd, path, time.monotonic(), pid))

    def drop_spares(self) -> None:
        """Close and remove the spare staging files this process made (at close)."""
        pid = pid_tag()
        while self._spare_files:
            try:
                fd, path, _made, owner = self._spare_files.pop()
            except IndexError:
                break
            if owner == pid:
                self._discard(fd, path)
            else:  # inherited through a fork: the parent's to use and remove
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _stage(self, path: str, payload: bytes) -> int:
        """Create a staging file (O_EXCL) holding 0x00 and the payload; returns the fd."""
        try:
            if self._write_at:
                fd = os.open(
                    path[len(self._staging) + 1 :],
                    _CREATE,
                    0o666,
                    dir_fd=self._dir_fd(self._staging),
                )
            else:
                fd = self._open(path, _CREATE, 0o666)
        except FileExistsError:
            raise NameClash(path) from None
        except OSError as exc:
            raise storage_error("creating a staging file", exc, path) from exc
        if self._file_mode is not None:
            try:
                self.ops.fchmod(fd, self._file_mode)
            except OSError as exc:
                self._discard(fd, path)
                raise storage_error("writing a message", exc, path) from exc
        self._fill(fd, path, payload)
        return fd

    def _fill(self, fd: int, path: str, payload: bytes) -> None:
        """Write 0x00 and the payload into a new staging file (removed if that fails)."""
        try:
            n = self._writev(fd, (_LEADING, payload))
            if n < len(payload) + 1:
                self._write_all(fd, memoryview(payload)[n - 1 :] if n else _LEADING + payload)
        except OSError as exc:
            self._discard(fd, path)
            raise storage_error("writing a message", exc, path) from exc
        except BaseException:
            self._discard(fd, path)
            raise

    def publish_many(
        self,
        items: Sequence[tuple[str, bytes]],
        name: Callable[[str], PublishPlan],
        durable: bool,
    ) -> list[tuple[PublishPlan | None, int | BaseException]]:
        """Publish several (topic, payload) messages in one call, one after the other;
        each comes back with the plan it was published under and its size, or the error
        (with no plan if naming it failed).

        ``name`` names each (validates and plans it) just before it is published: a
        consumer keeps a publisher's order only for a message named after the one
        before it was placed and stamped (:func:`~fsbus._bus.scan.split_fresh`), which a
        batch named before the first of it went out would not be. ``durable``: the
        messages are durable; through the durable log they are one record
        (:meth:`durably`): if it cannot be written, every message of the call is taken
        back and has its error."""
        out: list[tuple[PublishPlan | None, int | BaseException]] = []

        def each() -> None:
            for topic, payload in items:
                plan = None
                try:
                    plan = name(topic)
                    out.append((plan, self.publish(plan, payload)))
                except Exception as exc:
                    out.append((plan, exc))

        if not durable:
            each()
            return out
        try:
            self.durably(each, many=True)
        except StorageError as exc:
            return [(None, exc)] * len(items)
        return out

    def durably(self, fn: Callable[[], T], *, many: bool = False) -> T:
        """Run ``fn`` (publishes) as one record of the process's durable log, one sync
        for all of them (:meth:`~fsbus._bus.wal.DurableLog.durably`; ``many``: one
        message after the other, each stamped as it is placed), where this bus uses
        one; else just run it (each durable publish then syncs its own files)."""
        source = self.log_source
        durable_log = source() if source is not None else None
        return fn() if durable_log is None else durable_log.durably(fn, many=many)

    def begin(self, plan: PublishPlan) -> int:
        """Create the staging file (O_EXCL) with its leading byte; returns the fd."""
        path = f"{self.layout.staging}/{plan.name}"
        try:
            fd = self.ops.open(path, _CREATE, 0o666)
        except FileExistsError:
            raise NameClash(path) from None
        except OSError as exc:
            raise storage_error("creating a staging file", exc, path) from exc
        try:
            if self._file_mode is not None:
                self.ops.fchmod(fd, self._file_mode)
            self.ops.write(fd, _LEADING)
        except OSError as exc:
            self._discard(fd, path)
            raise storage_error("writing a staging file", exc, path) from exc
        return fd

    def write_chunk(self, fd: int, data: bytes, plan: PublishPlan) -> None:
        """Append a chunk to a staged message."""
        try:
            self._write_all(fd, data)
        except OSError as exc:
            raise storage_error(
                "writing a message", exc, f"{self.layout.staging}/{plan.name}"
            ) from exc

    def commit(self, plan: PublishPlan, fd: int, go: Go | None = None) -> None:
        """Finish a staged message: sync, sidecars, rename into its bucket, stamp.

        ``go`` as in :meth:`publish`: asked after the syncs, before the rename.
        """
        lay = self.layout
        staging = f"{lay.staging}/{plan.name}"
        written: list[str] = []
        try:
            if plan.durable:
                self.ops.fdatasync(fd)
            self.ops.close(fd)
            fd = -1
            # Sidecars are created exclusively: a clash must not touch another message's.
            if plan.spill is not None:
                p = lay.topic_path(plan.bucket, plan.name)
                self._write_file(p, plan.spill.encode("ascii"), plan.durable, exclusive=True)
                written.append(p)
                note(p)
            if plan.meta is not None:
                p = lay.meta_path(plan.bucket, plan.name)
                self._write_file(p, plan.meta, plan.durable, exclusive=True)
                written.append(p)
                note(p)
            if plan.durable:
                # The sidecars' names are durable before the message's: a power cut
                # after the rename must not leave it without its topic or headers.
                if plan.spill is not None:
                    self._fsync_dir(f"{lay.topics}/{plan.bucket}")
                if plan.meta is not None:
                    self._fsync_dir(f"{lay.private}/meta/{plan.bucket}")
            if go is not None and not go():
                for p in (staging, *written):
                    self._unlink_quiet(p)
                raise Withdrawn(staging)
            self._place(staging, lay.message_path(plan.bucket, plan.name))
        except FileExistsError:
            for p in (staging, *written):
                self._unlink_quiet(p)
            raise NameClash(staging) from None
        except NameClash:
            for p in (staging, *written):
                self._unlink_quiet(p)
            raise
        except OSError as exc:
            if fd >= 0:
                self.ops.close(fd)
            for p in (staging, *written):
                self._unlink_quiet(p)
            raise storage_error("publishing a message", exc, exc.filename or staging) from exc
        if plan.durable:
            self._fsync_dir(f"{lay.messages}/{plan.bucket}")
        self._stamp_placed(plan)

    def commit_then_sync(
        self, plan: PublishPlan, fd: int, go: Go | None = None, then: Then | None = None
    ) -> None:
        """Finish a staged durable message that :meth:`places_first`: rename it into
        its bucket and stamp it, then sync its data and its bucket. On a journaled
        filesystem the first sync commits the staging file's creation and its rename
        (and the copies' of :func:`~fsbus._bus.queueing.route`) in one journal commit,
        where syncing before the rename takes two. A sync that fails takes the message
        back (unless a consumer has it already) and raises.

        ``go`` and ``then`` as in :meth:`publish`: asked before the rename, and called
        after the message's data is synced, before its bucket is. (Its data first: the
        sync writes it back, and so allocates its blocks, in the transaction it
        commits; copies synced first would commit without them, and it would take a
        second commit.)

        The bucket is stamped once both syncs are done (:func:`stamps_batched`), as
        :meth:`commit` stamps after its syncs.
        """
        if go is not None and not go():
            self.abort(plan, fd)
            raise Withdrawn(f"{self.layout.staging}/{plan.name}")
        with stamps_batched():
            final = self.place_open(plan, fd)
            self.sync_placed(plan, fd, final, then)

    def place_open(self, plan: PublishPlan, fd: int) -> str:
        """Rename staged message ``plan`` into its bucket and stamp it; its descriptor
        ``fd`` stays open for :meth:`sync_placed` (closed here if the rename fails).
        Returns its path."""
        lay = self.layout
        staging = f"{lay.staging}/{plan.name}"
        final = lay.message_path(plan.bucket, plan.name)
        try:
            self._place(staging, final)
        except (FileExistsError, NameClash):
            self.abort(plan, fd)
            raise NameClash(staging) from None
        except OSError as exc:
            self.abort(plan, fd)
            raise storage_error("publishing a message", exc, exc.filename or staging) from exc
        self._stamp_placed(plan)
        return final

    def _stamp_later(self, bucket_index: int, own: bool) -> bool:
        """Leave the bucket's stamp to the end of this thread's :func:`stamps_batched`
        block, if it is in one (then True)."""
        due = getattr(_BATCH, "due", None)
        if due is None:
            return False
        key = (self, bucket_index)
        due[key] = due.get(key, True) and own
        return True

    def _stamp_placed(self, plan: PublishPlan) -> None:
        if not self._stamp_later(plan.bucket_index, plan.own) and not (
            LOGGING[0] and hold_stamp(self._stamp_now, plan)
        ):
            self._stamp_now(plan)

    def _stamp_now(self, plan: PublishPlan) -> None:
        if plan.own:
            self.stamp_own(plan.bucket_index)
        else:
            self.stamp(plan.bucket_index)

    def sync_placed(self, plan: PublishPlan, fd: int, final: str, then: Then | None = None) -> None:
        """Sync a message placed by :meth:`place_open` (its data, ``then``, its bucket)
        and close ``fd``. A sync that fails, or what ``then`` raises, takes the message
        back (unless a consumer has it already) and is raised."""
        try:
            try:
                self.ops.fdatasync(fd)
            except OSError as exc:
                raise storage_error("syncing a message", exc, final) from exc
            finally:
                self.ops.close(fd)
            if then is not None:
                then()
            self._fsync_dir(f"{self.layout.messages}/{plan.bucket}")
        except BaseException:
            self._unlink_quiet(final)
            raise

    def _place(self, staged: str, final: str) -> None:
        """Move a complete message into its bucket (one atomic rename).

        A rename replaces a file of the same name, so names must never repeat: they carry
        the host id (host name and pid namespace), the pid, a process-wide sequence and the
        publish millisecond, and the staging file is created with O_EXCL, so two live
        publishers can never pick the same name (a clash there is renamed and retried).
        A hard link would refuse to replace, but costs a quarter of a publish on these
        filesystems; the names make it unnecessary.
        """
        try:
            self._place_once(staged, final)
        except FileNotFoundError:
            # The bucket's first message (or the staged file is gone: then this raises
            # again, once the bucket is made)
            self._make_bucket(os.path.dirname(final))
            self._place_once(staged, final)

    def _place_once(self, staged: str, final: str) -> None:
        if self._write_at:
            os.rename(
                staged[len(self._staging) + 1 :],
                final[len(self._messages) + 1 :],
                src_dir_fd=self._dir_fd(self._staging),
                dst_dir_fd=self._dir_fd(self._messages),
            )
        else:
            self._rename(staged, final)
        if LOGGING[0]:
            note(final)

    def abort(self, plan: PublishPlan, fd: int) -> None:
        """Give up a staged message: close and remove the staging file."""
        self._discard(fd, f"{self.layout.staging}/{plan.name}")

    @property
    def tag_stamps(self) -> bool:
        """Whether this bus's stamps say they are fsbus's (:mod:`fsbus._bus.stamps`) while
        a router of queue consumers is at work on the bus (:meth:`note_router`): set by
        the engine for a main bus. Not on a shared mount (its router lists every
        change), nor for stamps too small to hold a tag."""
        return self._tag_able

    @tag_stamps.setter
    def tag_stamps(self, value: bool) -> None:
        self._tag_able = value and tagged(self._stamp_size)
        self._tag = self._tag_able and self._router

    def note_router(self, active: bool) -> None:
        """Whether a router of queue consumers is at work on the bus (the queue store
        looks as it checks its table, every 5 ms while this bus publishes). With none,
        a stamp is written as ever, without reading the slot first: the read costs a
        publish 2-4 µs, a tenth of a plain one, which only a router gains from."""
        self._router = active
        self._tag = self._tag_able and active

    def stamp_own(self, bucket_index: int) -> None:
        """:meth:`stamp`, for a message no subscription of this bus wants: remember the
        stamp as this bus's own when, just before it, the stamp still held the value this
        bus had accounted for (nobody else stamped the bucket since this bus listed it,
        or since its own last stamp there). A later scan then need not list the bucket
        for it (:meth:`own_only`).

        Between the read and the write (two system calls) another publisher's stamp can
        land and be overwritten unseen; the engine lists such buckets again within
        ``_OWN_RELIST`` seconds all the same, so that message is late, never lost.
        """
        fd = self._update_fd
        if fd is None or not self.track_own or self._stamp_reopen:
            self.stamp(bucket_index)
            return
        size = self._stamp_size
        offset = bucket_index * size
        data = self._getrandbits(self._stamp_bits).to_bytes(size, "little")
        try:
            with self._own_lock:
                before = self.ops.pread(fd, size, offset)
                if self._tag:
                    data = fresh(before, data, time.time)
                self._pwrite(fd, data, offset)
                if before == self._known.get(bucket_index):
                    self._known[bucket_index] = self._own[bucket_index] = data
                else:
                    self._own.pop(bucket_index, None)
        except OSError as exc:
            raise storage_error("stamping the UPDATE file", exc, self.layout.update_file) from exc

    def own_only(self, indexes: Iterable[int], update: bytes) -> set[int]:
        """Of these buckets (stamps changed in ``update``), those whose stamp in it is
        this bus's own clean stamp (:meth:`stamp_own`): nothing of another publisher's
        can be new there."""
        size = self._stamp_size
        out = set()
        with self._own_lock:
            own, known = self._own, self._known
            for bi in indexes:
                mine = own.get(bi)
                if mine is not None and known.get(bi) == mine:
                    if update[bi * size : bi * size + size] == mine:
                        out.add(bi)
        return out

    def note_listed(self, indexes: Iterable[int], update: bytes | None) -> None:
        """These buckets were listed after ``update`` was read: what their stamps held
        then is accounted for."""
        size = self._stamp_size
        with self._own_lock:
            if update is None or len(update) < self.layout.update_size:
                self._known.clear()
                self._own.clear()
                return
            for bi in indexes:
                self._known[bi] = update[bi * size : bi * size + size]

    def stamp(self, bucket_index: int) -> None:
        """Write a fresh stamp into a bucket's slot of UPDATE: random bytes, or, with
        :attr:`tag_stamps`, an fsbus stamp made from the slot's last one (read first)."""
        fd = self._update_fd
        if fd is None:
            return
        size = self._stamp_size
        try:
            # Random.randbytes(size), without its Python frame.
            data = self._getrandbits(self._stamp_bits).to_bytes(size, "little")
            if self._tag and not self._stamp_reopen:
                # (two threads stamping one bucket at once may drop a carried peer's
                # stamp, as a peer's stamp landing between the read and the write is
                # dropped: the router's next full listing finds the message)
                offset = bucket_index * size
                if self._plain_ops:
                    before = os.pread(fd, size, offset)
                else:
                    before = self.ops.pread(fd, size, offset)
                self._pwrite(fd, fresh(before, data, time.time), offset)
            elif self._stamp_reopen:
                # Open, write, close (as qlobber-fsq does): on NFS and BeeGFS the close
                # is what sends the write to the server for other clients to read.
                fd = self._open(self.layout.update_file, os.O_WRONLY | _O_CLOEXEC | _O_NOFOLLOW)
                try:
                    self._pwrite(fd, data, bucket_index * size)
                finally:
                    self._close(fd)
            else:
                self._pwrite(fd, data, bucket_index * size)
        except OSError as exc:
            raise storage_error("stamping the UPDATE file", exc, self.layout.update_file) from exc

    def _write_all(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = self.ops.write(fd, view)
            view = view[n:]

    def _copy_file(self, fd: int, src: str) -> int:
        limit = self.config.max_payload_size
        try:
            sfd = os.open(src, os.O_RDONLY | _O_CLOEXEC)
        except OSError as exc:
            raise storage_error("opening the payload file", exc, src) from exc
        try:
            total = 0
            while True:
                n = self.ops.copy_range(sfd, fd, _CHUNK)
                if n == 0:
                    return total
                total += n
                if total > limit:
                    raise PayloadTooLarge(
                        f"payload file {src} is larger than max_payload_size={limit} bytes; "
                        "raise BusConfig.max_payload_size or use a stream"
                    )
        except OSError as exc:
            raise storage_error("copying the payload file", exc, src) from exc
        finally:
            os.close(sfd)

    def _write_file(
        self, path: str, data: bytes, durable: bool, *, exclusive: bool = False
    ) -> None:
        try:
            fd = self.ops.open(path, _CREATE if exclusive else _REWRITE, 0o666)
        except FileNotFoundError:
            bucket = os.path.dirname(path)
            if os.path.dirname(bucket) not in self.layout.bucket_parents:
                raise
            self._make_bucket(bucket)  # its first file
            fd = self.ops.open(path, _CREATE if exclusive else _REWRITE, 0o666)
        try:
            if self._file_mode is not None:
                self.ops.fchmod(fd, self._file_mode)
            self._write_all(fd, data)
            if durable:
                self.ops.fdatasync(fd)
        finally:
            self.ops.close(fd)

    def _fsync_dir(self, path: str) -> None:
        try:
            fd = self.ops.open(path, os.O_RDONLY | _O_CLOEXEC)
            try:
                self.ops.fsync(fd)
            finally:
                self.ops.close(fd)
        except OSError as exc:
            raise storage_error("syncing a bucket directory", exc, path) from exc

    def _discard(self, fd: int, path: str) -> None:
        try:
            self.ops.close(fd)
        except OSError:
            pass
        self._unlink_quiet(path)

    def _unlink_quiet(self, path: str) -> bool:
        try:
            self.ops.unlink(path)
            return True
        except OSError:
            return False

    # ------------------------------------------------------------------ scanning
    def read_update(self, *, reopen: bool = False) -> bytes | None:
        """A fresh snapshot of UPDATE.

        On a local filesystem it is read through the page cache. Where another client's
        write would not reach our cache (:attr:`platform`), it is read with ``O_DIRECT``,
        or after dropping the cache where O_DIRECT is refused. Either way through a
        descriptor kept open (``reopen`` opens it again, in case UPDATE was replaced).
        """
        if reopen and self._dir_fds:
            self._check_dir_fds()
        if self.layout.update_size == 0:
            return None
        if self._read_direct:
            with self._read_lock:
                try:
                    return self._read_update_direct(reopen)
                except OSError:
                    self._drop_read_fd()  # replaced or gone (ESTALE): open it again
                    try:
                        return self._read_update_direct(True)
                    except OSError as exc:
                        if exc.errno in _MISSING:
                            return None
                        raise storage_error(
                            "reading the UPDATE file", exc, self.layout.update_file
                        ) from exc
        # Read through a descriptor kept open, as stamps are written through one
        # (opening the path again cost more than the read itself: 7 of 8 µs a scan).
        # ``reopen`` (every full listing, each refresh_ttl) opens it again, in case
        # UPDATE was replaced: until then this bus goes on reading the file it stamps.
        with self._read_lock:
            if reopen:
                self._drop_local_read_fd()
            fd = self._local_read_fd
            if fd is not None:
                try:
                    return self.ops.pread(fd, self.layout.update_size, 0)
                except OSError:
                    self._drop_local_read_fd()  # read it again through the path
            path = self.layout.update_file
            try:
                fd = self.ops.open(path, _READ)
            except OSError as exc:
                if exc.errno in _MISSING:
                    return None
                raise storage_error("reading the UPDATE file", exc, path) from exc
            self._local_read_fd = fd
            try:
                return self.ops.pread(fd, self.layout.update_size, 0)
            except OSError as exc:
                self._drop_local_read_fd()
                raise storage_error("reading the UPDATE file", exc, path) from exc

    def _read_update_direct(self, reopen: bool) -> bytes:
        size = self.layout.update_size
        if reopen:
            self._drop_read_fd()
        fd = self._read_fd
        if fd is None:
            path = self.layout.update_file
            flags = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW
            direct = getattr(os, "O_DIRECT", 0)
            try:
                fd = self.ops.open(path, flags | direct) if direct else -1
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                fd = -1
            self._direct_ok = fd >= 0
            if fd < 0:
                fd = self.ops.open(path, flags)  # O_DIRECT refused: drop the cache instead
            self._read_fd = fd
            if self._read_buf is None:
                # page-aligned and a whole number of pages, as O_DIRECT wants
                self._read_buf = mmap.mmap(
                    -1, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
                )
        buf = self._read_buf
        assert buf is not None
        if not self._direct_ok:
            self.ops.drop_cache(fd)
        n = self.ops.pread_into(fd, buf, 0)
        return buf[: min(n, size)]

    def _drop_local_read_fd(self) -> None:
        fd, self._local_read_fd = self._local_read_fd, None
        self._close_quiet(fd)

    def _drop_read_fd(self) -> None:
        fd, self._read_fd = self._read_fd, None
        self._close_quiet(fd)

    def _close_quiet(self, fd: int | None) -> None:
        if fd is not None:
            try:
                self.ops.close(fd)
            except OSError:
                pass

    def list_buckets(
        self, indexes: Iterable[int], *, update: bytes | None = None
    ) -> dict[int, list[str]]:
        """Names in each asked-for bucket (a missing bucket lists as empty).

        Where each listing is a network round trip (:attr:`platform`), a long list of
        buckets is listed by a few threads at once (256 buckets: 0.22 -> 0.08 s on
        CephFS, 0.45 -> 0.22 s on GlusterFS).
        """
        workers = self.platform.list_workers
        wanted = list(indexes)
        if workers > 1 and len(wanted) > 16:
            parts = [wanted[k::workers] for k in range(workers)]
            out: dict[int, list[str]] = {}
            for got in self._pool().map(self._list_serial, parts):
                out.update(got)
            return out
        return self._list_serial(wanted)

    def _list_serial(self, indexes: list[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        buckets = self.layout.buckets
        for i in indexes:
            path = f"{self.layout.messages}/{buckets[i]}"
            try:
                out[i] = self._list_bucket(buckets[i]) if self._read_at else self.ops.listdir(path)
            except OSError as exc:
                if exc.errno in _MISSING:
                    out[i] = []
                    continue
                raise storage_error("listing a bucket", exc, path) from exc
        return out

    def _list_bucket(self, bucket: str) -> list[str]:
        fd = os.open(bucket, _DIR, dir_fd=self._dir_fd(self._messages))
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def _open_message(self, bucket: str, name: str, path: str, flags: int) -> int:
        """Open a message file (relative to the kept messages directory, where kept)."""
        if self._read_at:
            return os.open(f"{bucket}/{name}", flags, dir_fd=self._dir_fd(self._messages))
        return self.ops.open(path, flags)

    def read_spills(self, wanted: Iterable[tuple[int, str]]) -> dict[tuple[int, str], str | None]:
        """The spilled topic rest of each (bucket, name).

        None where the spill is missing, empty (a spill is never empty: a power cut can
        leave its name without data) or not readable by us: it may still come right, so
        the message is looked at again. `BAD_SPILL` where it can never be a topic
        (not ASCII, a symlink, not a regular file): the message is foreign and is
        quarantined once instead of being read again at every listing.
        """
        out: dict[tuple[int, str], str | None] = {}
        for key in wanted:
            out[key] = self._read_spill(self.layout.topic_path(self.layout.buckets[key[0]], key[1]))
        return out

    def _read_spill(self, path: str) -> str | None:
        try:
            fd = self.ops.open(path, _READ)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                return BAD_SPILL  # a planted symlink, a directory, a device or a socket
            if exc.errno in _MISSING or exc.errno in _SKIP:
                return None
            raise storage_error("reading a topic spill", exc, path) from exc
        try:
            st = self.ops.fstat(fd)
            if not _own_file(st):
                return BAD_SPILL  # not a regular file, or a hard link to another file
            data = self.ops.pread(fd, st.st_size, 0)
        except OSError as exc:
            if exc.errno in _MISSING:
                return None
            raise storage_error("reading a topic spill", exc, path) from exc
        finally:
            self.ops.close(fd)
        if not data:
            return None
        try:
            return data.decode("ascii")
        except UnicodeDecodeError:
            return BAD_SPILL

    def _read_small(self, path: str) -> bytes | None:
        try:
            fd = self.ops.open(path, _READ)
        except OSError as exc:
            if exc.errno in _MISSING or exc.errno in _SKIP:
                return None
            raise storage_error("reading a sidecar file", exc, path) from exc
        try:
            st = self.ops.fstat(fd)
            if not _own_file(st):
                return None
            return self.ops.pread(fd, st.st_size, 0)
        finally:
            self.ops.close(fd)

    def read_multi(self, bucket: str, name: str, *, has_meta: bool) -> ReadResult:
        """Read a multi message; payload None when it vanished or is not a regular file."""
        path = self.layout.message_path(bucket, name)
        try:
            fd = self._open_message(bucket, name, path, _READ)
        except OSError as exc:
            if exc.errno in _MISSING or exc.errno in _SKIP:
                # Gone, a planted symlink, or another user's file we may not read:
                # skip it rather than stop delivering everything else.
                return ReadResult(None, None)
            raise storage_error("reading a message", exc, path) from exc
        try:
            st = self.ops.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or st.st_nlink == 0:
                return ReadResult(None, None)  # (no name left: removed since we opened it)
            if st.st_nlink != 1 and not self._rename_leftover(bucket, name, st, path):
                self._refuse_linked(bucket, name, st)
                return ReadResult(None, None)
            if self._too_large(path, st.st_size - 1):
                return ReadResult(None, None)
            payload = self._pread_all(fd, st.st_size - 1, 1)
            if len(payload) != st.st_size - 1:
                return ReadResult(None, None)  # truncated under us: consumed
            if _inline_flag(name):
                split = self._unframe(path, payload)
                return ReadResult(None, None) if split is None else ReadResult(split[1], split[0])
        except OSError as exc:
            if exc.errno in _MISSING:
                # Removed under us through another mount (ESTALE on NFS): gone.
                return ReadResult(None, None)
            raise storage_error("reading a message", exc, path) from exc
        finally:
            self.ops.close(fd)
        meta = self._read_small(self.layout.meta_path(bucket, name)) if has_meta else None
        return ReadResult(payload, meta)

    def changed_at(self, bucket: str, name: str) -> float | None:
        """When a message's name last changed (its ``st_ctime``: a rename sets it, so for
        a message this is when it was published); None when it is gone."""
        try:
            return self.ops.lstat(self.layout.message_path(bucket, name)).st_ctime
        except OSError:
            return None

    def _too_large(self, path: str, size: int) -> bool:
        """A payload over ``max_payload_size`` is not read into memory (said once)."""
        limit = self.config.max_payload_size
        if size <= limit:
            return False
        if path not in self._warned:
            self._warned.add(path)
            log.warning(
                "%s holds a %d-byte payload, over max_payload_size=%d; not delivered "
                "(raise BusConfig.max_payload_size on this subscriber to take it)",
                path,
                size,
                limit,
            )
        return True

    def _pread_all(self, fd: int, size: int, offset: int) -> bytes:
        data = self.ops.pread(fd, size, offset)
        if len(data) == size:
            return data
        parts = [data]
        got = len(data)
        while got < size:
            more = self.ops.pread(fd, size - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def claim(
        self, bucket: str, name: str, *, has_meta: bool, attempts: bool = True
    ) -> Claim | None:
        """Lock a single message (LOCK_EX|LOCK_NB) and read it.

        None when someone else holds it, it vanished, or it was an empty leftover (then
        it is removed). The caller must :meth:`ack` or :meth:`release` the claim.
        With ``locking == "rename"`` the claim is an atomic rename instead (one winner
        even where flock does not cross hosts). ``attempts=False`` leaves the failure
        count at 0 for :meth:`fill_attempts` to read for a batch of claims at once.
        """
        if self.locking == "rename":
            return self._claim_by_rename(bucket, name, has_meta=has_meta, read_attempts=attempts)
        path = self.layout.message_path(bucket, name)
        try:
            fd = self._open_message(bucket, name, path, _CLAIM)
        except OSError as exc:
            if exc.errno in _MISSING or exc.errno in _SKIP:
                return None
            raise storage_error("opening a work-queue message", exc, path) from exc
        try:
            self.ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.ops.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise storage_error("locking a work-queue message", exc, path) from exc
        try:
            st = self.ops.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink == 0:
                # No name left: the consumer that held it acknowledged it (unlinked and
                # closed it, which freed the lock) between our open and our lock. Gone.
                self._unlock_close(fd)
                return None
            # before reading, truncating or removing anything:
            if st.st_nlink != 1 and not self._rename_leftover(bucket, name, st, path):
                self._refuse_linked(bucket, name, st)
                self._unlock_close(fd)
                return None
            if st.st_size == 0:
                self._remove_message(bucket, name)
                self._unlock_close(fd)
                return None
            if self._too_large(path, st.st_size - 1):
                # Nobody here can take it: move it aside (under our lock) for a human.
                self.quarantine(bucket, name, int(st.st_mtime * 1000))
                self._unlock_close(fd)
                return None
            lead, payload = self._read_counted(fd, st.st_size)
            if len(payload) != st.st_size - 1:
                # Truncated since our fstat: another consumer acked it (a mount's
                # cached attributes can show the old size). It is done: skip it.
                self._unlock_close(fd)
                return None
            meta = None
            if _inline_flag(name):
                split = self._unframe(path, payload)
                if split is None:  # a damaged file: aside (under our lock), for a human
                    self.quarantine(bucket, name, int(time.time() * 1000))
                    self._unlock_close(fd)
                    return None
                meta, payload = split
            elif has_meta:
                meta = self._read_small(self.layout.meta_path(bucket, name))
        except OSError as exc:
            self._unlock_close(fd)
            if exc.errno in _MISSING:
                return None  # removed under us through another mount (ESTALE on NFS)
            raise storage_error("reading a work-queue message", exc, path) from exc
        except BaseException:
            self._unlock_close(fd)
            raise
        claim = Claim(bucket, name, fd, payload, meta, lead)
        if attempts:
            self.fill_attempts((claim,))
        return claim

    def fill_attempts(self, claims: Iterable[Claim]) -> None:
        """Complete the delivery counts of held claims from their counter files.

        A claim's count starts as its leading byte; only a claim whose byte is 0 (never
        counted, or counted in a file by an older version) or full (255) needs its file.
        On a durable queue's bus (:attr:`peerless`) a 0 is never counted: only versions
        with queues write there, and they write a counter file only once the byte is full.
        Where a bucket has several such claims its counter directory is listed once and
        only the counters present are opened, instead of one ``open`` per claim. Safe
        because the claims are held: a counter is written only by a holder, before it
        lets go, so it is in the directory before our claim.
        """
        by_bucket: dict[str, list[Claim]] = {}
        peerless = self.peerless
        for c in claims:
            if 0 < c.attempts < _COUNT_MAX or (peerless and c.attempts == 0):
                # Counted in its leading byte, which is never behind a counter file
                # (whoever wrote the byte had read the file first), or never counted.
                c.counter_file = False
                continue
            by_bucket.setdefault(c.bucket, []).append(c)
        for bucket, group in by_bucket.items():
            present: set[str] | None = None
            # With rename claims (network filesystems) a listing may be cached and miss a
            # counter another host just wrote: open each one there, as before.
            if len(group) > 1 and self.locking != "rename":
                try:
                    present = set(self.ops.listdir(f"{self.layout.private}/attempts/{bucket}"))
                except OSError as exc:
                    present = set() if exc.errno == errno.ENOENT else None
            for c in group:
                if present is None or c.name in present:
                    try:
                        counted = self._read_attempts(bucket, c.name)
                    except StorageError:
                        continue  # the count is advisory, as when writing it
                    c.attempts = max(c.attempts, counted)
                    c.counter_file = counted > 0 or present is not None
                else:
                    c.counter_file = False

    def _claim_by_rename(
        self, bucket: str, name: str, *, has_meta: bool, read_attempts: bool = True
    ) -> Claim | None:
        src = self.layout.message_path(bucket, name)
        dst = self._claim_path(bucket, name)
        try:
            self.ops.rename(src, dst)
        except OSError as exc:
            if exc.errno in _MISSING or exc.errno in _SKIP:
                return None  # another consumer won the rename, or it is gone
            raise storage_error("claiming a work-queue message", exc, src) from exc
        try:
            self.ops.utime(dst)  # the lease starts now (a rename keeps the old times)
            fd = self.ops.open(dst, _CLAIM)
        except OSError as exc:
            self._return_claim(bucket, name)
            if exc.errno in _SKIP:
                return None  # a planted symlink or another user's file
            raise storage_error("opening a claimed work-queue message", exc, dst) from exc
        try:
            st = self.ops.fstat(fd)
            if st.st_nlink == 0:  # removed since our rename (its lease was taken back): gone
                self.ops.close(fd)
                return None
            linked = st.st_nlink != 1 and not self._rename_leftover(bucket, name, st, dst)
            if not stat.S_ISREG(st.st_mode) or linked:
                self.ops.close(fd)
                self._return_claim(bucket, name)
                if linked:
                    self._refuse_linked(bucket, name, st)
                return None
            if st.st_size == 0:
                self.ops.close(fd)
                self._unlink_quiet(dst)
                self._remove_message(bucket, name)
                return None
            lead, payload = self._read_counted(fd, st.st_size)
            meta = None
            if _inline_flag(name):
                split = self._unframe(dst, payload)
                if split is None:  # a damaged file: aside, for a human
                    self.ops.close(fd)
                    if self._return_claim(bucket, name):
                        self.quarantine(bucket, name, int(time.time() * 1000))
                    return None
                meta, payload = split
            elif has_meta:
                meta = self._read_small(self.layout.meta_path(bucket, name))
            claim = Claim(bucket, name, fd, payload, meta, lead, renamed=True)
            if read_attempts:
                self.fill_attempts((claim,))
        except BaseException:
            self.ops.close(fd)
            self._return_claim(bucket, name)
            raise
        return claim

    def _read_counted(self, fd: int, size: int) -> tuple[int, bytes]:
        """The leading byte (deliveries recorded in the file) and the payload after it."""
        if size <= _SPLIT_READ:
            data = self._pread_all(fd, size, 0)
            return (data[0], data[1:]) if data else (0, b"")
        lead = self.ops.pread(fd, 1, 0)
        return (lead[0] if lead else 0), self._pread_all(fd, size - 1, 1)

    def _record_delivery(self, claim: Claim) -> None:
        """Count one more delivery of a held message: its leading byte, in place (the
        counter file as well once the byte is full). Raises OSError."""
        n = claim.attempts + 1
        self.ops.pwrite(claim.fd, bytes((min(n, _COUNT_MAX),)), 0)
        if n >= _COUNT_MAX:
            self._write_file(
                self.layout.attempts_path(claim.bucket, claim.name), str(n).encode(), False
            )
            claim.counter_file = True

    def _unrecord_delivery(self, claim: Claim) -> None:
        """Put a held message's count back to what it was before its claim counted this
        delivery (:meth:`_record_delivery` undone). Raises OSError."""
        n = claim.attempts
        self.ops.pwrite(claim.fd, bytes((min(n, _COUNT_MAX),)), 0)
        if n + 1 >= _COUNT_MAX:
            self._write_file(
                self.layout.attempts_path(claim.bucket, claim.name), str(n).encode(), False
            )
        claim.counted = False

    def renew(self, claims: Iterable[Claim]) -> list[Claim]:
        """Renew the leases of claims made by rename; returns the ones found lost.

        A renewal sets the claimed file's times to now (``utime``: on NFS the server's
        clock) so garbage collection, which gives back claims older than
        ``claim_lease``, sees a live consumer. A claim whose file is gone from
        ``fsbus/claims/`` was given back (its consumer paused past the lease): it is
        lost, and the message may be handled again elsewhere.
        """
        lost = []
        for c in claims:
            if not c.renamed:
                continue
            try:
                self.ops.utime(self._claim_path(c.bucket, c.name))
            except OSError as exc:
                if exc.errno in _MISSING:
                    lost.append(c)
                # any other error: try again at the next renewal, well within the lease
        return lost

    def _return_claim(self, bucket: str, name: str) -> bool:
        """Rename a claimed message back into its bucket and stamp it; False if gone."""
        try:
            self.ops.rename(self._claim_path(bucket, name), self.layout.message_path(bucket, name))
        except OSError:
            return False
        try:
            self.stamp(self.layout.buckets.index(bucket))
        except (StorageError, ValueError):
            pass  # the next full listing finds it
        return True

    def ack(self, claim: Claim) -> None:
        """Consume a claimed message: truncate, unlink it and its sidecars, unlock.

        The truncation is for readers that may still open the file after its unlink: a
        qlobber-fsq peer, which takes an empty file as consumed, and a client of a
        network filesystem whose cached attributes still show the link. fsbus's own
        claim checks ``st_nlink`` under the lock (:meth:`claim`), which a local
        filesystem keeps exact, so the bus of a durable queue (``peerless``) on one is
        only unlinked: on journaled ext4 a truncation is a journalled change of its own
        (about 7 µs of an AMQP consume's 73).
        """
        if claim.renamed:
            try:
                self._unlink_quiet(self._claim_path(claim.bucket, claim.name))
                self._remove_message(claim.bucket, claim.name, attempts=claim.counter_file)
            finally:
                self.ops.close(claim.fd)
            return
        try:
            if not (self.peerless and self.platform.family == "local"):
                self.ops.ftruncate(claim.fd, 0)
            # A counter file is only written under the lock we hold: we know.
            self._remove_message(claim.bucket, claim.name, attempts=claim.counter_file)
        finally:
            self._unlock_close(claim.fd)

    def count_deliveries(self, claims: Iterable[Claim]) -> None:
        """Record a delivery of each claim before it is handed out, so a consumer that
        dies holding it leaves a count behind (its redelivery is not a first delivery)."""
        for c in claims:
            try:
                self._record_delivery(c)
            except OSError:
                continue  # the count is advisory; never hold a message back over it
            c.counted = True

    def release(self, claim: Claim, *, failed: bool, uncount: bool = False) -> None:
        """Give a claimed message back for redelivery, counting a failure if asked.

        ``uncount``: no consumer saw it, so the delivery counted at its claim
        (:meth:`count_deliveries`) is taken back: its next delivery is not a redelivery.
        """
        try:
            if failed and not claim.counted:
                self._record_delivery(claim)
            elif uncount and claim.counted:
                self._unrecord_delivery(claim)
        except OSError:
            pass  # the count is advisory; never lose the message over it
        finally:
            if claim.renamed:
                self.ops.close(claim.fd)
                self._return_claim(claim.bucket, claim.name)
            else:
                self._unlock_close(claim.fd)

    def _read_attempts(self, bucket: str, name: str) -> int:
        data = self._read_small(self.layout.attempts_path(bucket, name))
        if not data:
            return 0
        try:
            return max(0, int(data.strip() or b"0"))
        except ValueError:
            return 0

    def _unlock_close(self, fd: int) -> None:
        try:
            self.ops.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        self.ops.close(fd)

    def _remove_message(self, bucket: str, name: str, *, attempts: bool = True) -> None:
        lay = self.layout
        try:
            if self._read_at:
                os.unlink(f"{bucket}/{name}", dir_fd=self._dir_fd(self._messages))
            else:
                self.ops.unlink(lay.message_path(bucket, name))
        except OSError as exc:
            if exc.errno not in _MISSING:
                raise storage_error(
                    "removing a message", exc, lay.message_path(bucket, name)
                ) from exc
        # Only the sidecars the name says exist (each miss is a wasted system call).
        if "@l+" in name:
            self._unlink_quiet(lay.topic_path(bucket, name))
        if _has_meta_flag(name):
            self._unlink_quiet(lay.meta_path(bucket, name))
        if attempts:
            self._unlink_quiet(lay.attempts_path(bucket, name))

    def remove(self, items: Iterable[tuple[str, str]]) -> int:
        """Remove messages (expired ones) and their sidecars; returns how many went."""
        n = 0
        for bucket, name in items:
            if self._unlink_quiet(self.layout.message_path(bucket, name)):
                n += 1
            lay = self.layout
            for p in (
                lay.topic_path(bucket, name),
                lay.meta_path(bucket, name),
                lay.attempts_path(bucket, name),
            ):
                self._unlink_quiet(p)
        return n

    def is_locked(self, bucket: str, name: str) -> bool:
        """Whether some process holds a flock on a message (probe, released at once)."""
        path = self.layout.message_path(bucket, name)
        try:
            fd = self.ops.open(path, _READ)
        except OSError:
            return False
        try:
            self.ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            self.ops.close(fd)
        return False

    def stat_message(self, bucket: str, name: str) -> os.stat_result | None:
        """lstat of a message file, None when gone."""
        try:
            return self.ops.lstat(self.layout.message_path(bucket, name))
        except OSError:
            return None

    def read_meta(self, bucket: str, name: str) -> bytes | None:
        """The headers of a message in its sidecar, if any (inline headers come with
        the file: :meth:`read_multi`)."""
        return self._read_small(self.layout.meta_path(bucket, name))

    def _unframe(self, path: str, data: bytes) -> tuple[bytes, bytes] | None:
        """(headers, payload) of a file whose name says its headers are inline; None
        (said once) when the file cannot hold them: damaged, or not written by fsbus."""
        split = unframe_headers(data)
        if split is None and path not in self._warned:
            self._warned.add(path)
            log.warning(
                "%s: its name says its headers are inline, but the file does not hold them "
                "(damaged, or not written by fsbus); not delivered, set aside in quarantine "
                "where it is a work-queue message",
                path,
            )
        return split

    def read_payload(self, bucket: str, name: str) -> bytes | None:
        """A message's payload without consuming it (None when gone)."""
        return self.read_multi(bucket, name, has_meta=False).payload

    # ------------------------------------------------------------------ housekeeping
    def _rename_leftover(self, bucket: str, name: str, st: os.stat_result, opened: str) -> bool:
        """Whether the file's only other name is a rename's source that a crash left.

        A rename into a bucket (or into the claims) changes two directories; a power cut
        can keep the new entry and lose the removal of the old one (each directory is
        written back on its own), leaving one file under both names. That old name is
        debris: it is removed and the message is the bus's own.
        """
        if st.st_nlink != 2:
            return False
        names = (
            f"{self._staging}/{name}",
            self.layout.message_path(bucket, name),
            self._claim_path(bucket, name),
        )
        # a plain message staged in a spare (publish_plain) had a name of its own there
        spares = (f"{self.layout.spares}/{n}" for n in self._listdir_quiet(self.layout.spares))
        for other in itertools.chain(names, spares):
            if other == opened:
                continue
            try:
                ost = self.ops.lstat(other)
            except OSError:
                continue
            if ost.st_ino == st.st_ino and ost.st_dev == st.st_dev:
                return self._unlink_quiet(other)
        return False

    def _refuse_linked(self, bucket: str, name: str, st: os.stat_result) -> None:
        """A message file with other hard links is another file, not a message.

        fsbus never links a message (queue copies are copies), so a link count above 1
        means someone linked a file from elsewhere into the bus: delivering it would
        leak that file, and acking a single would truncate it. It is moved aside
        unread (a rename touches neither the file nor its other names), with a warning.
        """
        path = self.layout.message_path(bucket, name)
        moved = self.quarantine(bucket, name, int(time.time() * 1000))
        log.warning(
            "%s has %d hard links: it is a link to a file outside the bus, not a message; "
            "%s (remove it, and find who linked it there)",
            path,
            st.st_nlink,
            f"moved to {self.layout.quarantine}/" if moved else "left in place, not delivered",
        )

    def quarantine(self, bucket: str, name: str, now_ms: int) -> bool:
        """Move a foreign file out of a bucket so it is seen once and kept for a human."""
        src = self.layout.message_path(bucket, name)
        prefix = f"{now_ms:x}-{bucket}-"
        raw = os.fsencode(name)
        room = 255 - len(prefix)  # a long name plus the prefix would be ENAMETOOLONG
        if len(raw) > room:
            raw = raw[: room // 2] + raw[len(raw) - (room - room // 2) :]
        dst = f"{self.layout.quarantine}/{prefix}{os.fsdecode(raw)}"
        try:
            self.ops.rename(src, dst)
            return True
        except OSError:
            return False

    def sweep_debris(self, now: float, max_age: float, listed: int | None = None) -> int:
        """Remove crash debris older than ``max_age`` seconds.

        Staging files of dead publishers, zero-byte messages (a consumer died between
        truncating and unlinking, or a peer truncated a multi message) with their
        sidecars, and topic/meta/attempts sidecars whose message is gone. Returns how
        many files were removed. On a network mount only every tenth of ``max_age``
        (or of the claim lease) at most: see :func:`~fsbus._bus.scan.sweep_due`.
        ``listed``: how many messages a listing just found (else the last sweep's count),
        which decides how many of them this sweep sizes (:data:`DEBRIS_LOOKS`).
        """
        lay = self.layout
        lease = self.config.claim_lease if self.locking == "rename" else max_age
        if not sweep_due(
            now, self._swept, max_age=min(max_age, lease), shared=self.platform.shared
        ):
            return 0
        self._swept = now
        removed = 0
        for name in self._listdir_quiet(lay.staging):
            removed += self._remove_if_old(f"{lay.staging}/{name}", now, max_age)
        own = {path for _fd, path, _made, _pid in list(self._spare_files)}
        for name in self._listdir_quiet(lay.spares):  # a dead (or idle) publisher's spare
            if f"{lay.spares}/{name}" not in own:
                removed += self._remove_if_old(f"{lay.spares}/{name}", now, max_age)
        # Sized this time: every message of a small bus; of a big one (as the caller's
        # listing or the last sweep counted it), the slice of names whose hash falls on
        # this sweep: each name every `slices` sweeps.
        count = self._swept_names if listed is None else listed
        slices = max(1, -(-count // DEBRIS_LOOKS))
        turn = self._sweeps % slices
        self._sweeps += 1
        self._swept_names = 0
        for bucket in lay.buckets:
            present = set(self._listdir_quiet(f"{lay.messages}/{bucket}"))
            self._swept_names += len(present)
            for name in self._listdir_quiet(f"{self._claims}/{bucket}"):
                # Claimed by rename: its sidecars are not orphans. A claim not renewed
                # for claim_lease seconds belongs to a consumer that died or was cut off
                # (a live one renews it while its handler runs): give it back.
                present.add(name)
                p = self._claim_path(bucket, name)
                lease = min(max_age, self.config.claim_lease)
                if self._is_old(p, now, lease) and self._return_claim(bucket, name):
                    removed += 1
            sized = present if slices == 1 else [n for n in present if hash(n) % slices == turn]
            for name in [n for n in sized if self._empty_and_old(bucket, n, now, max_age)]:
                removed += self.remove([(bucket, name)])
                present.discard(name)
            for parent in (
                f"{lay.topics}/{bucket}",
                f"{lay.private}/meta/{bucket}",
                f"{lay.private}/attempts/{bucket}",
            ):
                for name in self._listdir_quiet(parent):
                    if name not in present:
                        removed += self._remove_if_old(f"{parent}/{name}", now, max_age)
        return removed

    def _empty_and_old(self, bucket: str, name: str, now: float, max_age: float) -> bool:
        try:
            st = self.ops.lstat(self.layout.message_path(bucket, name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == 0 and now - st.st_mtime >= max_age

    def _is_old(self, path: str, now: float, max_age: float) -> bool:
        try:
            return now - self.ops.lstat(path).st_mtime >= max_age
        except OSError:
            return False

    def _remove_if_old(self, path: str, now: float, max_age: float) -> int:
        try:
            st = self.ops.lstat(path)
        except OSError:
            return 0
        if now - st.st_mtime < max_age:
            return 0
        return 1 if self._unlink_quiet(path) else 0

    def _listdir_quiet(self, path: str) -> list[str]:
        try:
            return self.ops.listdir(path)
        except OSError:
            return []

    def read_hosts(self) -> dict[str, str]:
        """Host id -> host name, from ``fsbus/hosts``."""
        out: dict[str, str] = {}
        for name in self._listdir_quiet(self.layout.hosts):
            data = self._read_small(f"{self.layout.hosts}/{name}")
            if data:
                out[name] = data.decode("utf-8", "replace")[:255]
        return out

    def register_host(self, hid: str, hostname: str) -> None:
        """Record which host name a host id stands for (once per host).

        Only what ``browse``, ``ls`` and ``top`` show depends on it, so a record that
        cannot be written (a full disk, no write permission) is said once and left out:
        a consumer must still start, and on a full disk consuming is what frees space.
        What publishing meets there, it says itself."""
        path = f"{self.layout.hosts}/{hid}"
        if self.read_only is not None or self._read_small(path) is not None:
            return  # (open for looking only: shown by its host id)
        try:
            self._write_file(path, hostname.encode("utf-8"), durable=False)
        except OSError as exc:
            log.warning(
                "cannot record this host's name at %s (%s): its messages show host id %s "
                "instead of %r; the bus is usable all the same",
                path,
                exc.strerror or exc,
                hid,
                hostname,
            )


def locks_stay_local(path: str) -> bool:
    """Whether the filesystem holding ``path`` is one where flock stays on each host."""
    return detect(path).locks_global is False


def filesystem_type(path: str) -> str:
    """The type of the mount holding ``path`` (``/proc/self/mountinfo``), "" if unknown."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    path = os.path.realpath(path)
    best, fstype = "", ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, fstype = mnt, right.split()[0]
    return fstype


def probe_locking(root_a: str | os.PathLike[str], root_b: str | os.PathLike[str]) -> bool:
    """Whether an flock taken through ``root_a`` excludes one taken through ``root_b``.

    ``root_a`` and ``root_b`` are two paths to one directory, typically the same share
    mounted twice or on two hosts. True means single (work-queue) messages are safe
    with ``locking="flock"``; False means use ``BusConfig(locking="rename")``.
    """
    a, b = os.fspath(root_a), os.fspath(root_b)
    name = f".fsbus-lock-probe-{os.getpid()}-{os.urandom(4).hex()}"
    pa, pb = os.path.join(a, name), os.path.join(b, name)
    try:
        fd_a = os.open(pa, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
    except OSError as exc:
        raise storage_error("creating the lock probe", exc, pa) from exc
    try:
        try:
            fd_b = os.open(pb, os.O_RDWR | _O_CLOEXEC)
        except FileNotFoundError:
            raise UsageError(
                f"{b} does not show the file just created through {a}: they are not two "
                "paths to the same directory (or listings lag there; retry)"
            ) from None
        except OSError as exc:
            raise storage_error("opening the lock probe", exc, pb) from exc
        try:
            fcntl.flock(fd_a, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                fcntl.flock(fd_b, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError as exc:
                raise storage_error("locking the lock probe", exc, pb) from exc
            return False
        finally:
            os.close(fd_b)
    finally:
        os.close(fd_a)
        try:
            os.unlink(pa)
        except OSError:
            pass


def encode_meta(headers: dict[str, str]) -> bytes:
    """The sidecar bytes for a message's headers."""
    return json.dumps({"headers": headers}, separators=(",", ":"), ensure_ascii=False).encode()


def decode_meta(data: bytes | None) -> dict[str, str]:
    """Headers from sidecar bytes; a corrupt sidecar yields no headers.

    The headers of the same bytes are decoded once and kept (:data:`_DECODED`, most
    messages of a publisher carry the same ones); each call returns a dict of its own,
    which its caller may change."""
    if not data:
        return {}
    kept = _DECODED.get(data) if type(data) is bytes else None
    if kept is not None:
        return dict(kept)
    try:
        obj = json.loads(data)
        headers = obj.get("headers", {}) if isinstance(obj, dict) else {}
        out = {str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}
    except (ValueError, AttributeError):
        return {}
    if type(data) is bytes and len(data) <= _DECODED_BYTES:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        _DECODED[data] = out
    return dict(out)


_DECODED: dict[bytes, dict[str, str]] = {}
"""Headers decoded lately, by the bytes they were decoded from (see :func:`decode_meta`):
never handed out, only copies of them. Shared by the threads that read messages (a
dict's get, set and clear are each atomic: a race costs a decoding, never a wrong
result)."""
_DECODED_MAX = 256
"""Entries :data:`_DECODED` holds before it starts afresh."""
_DECODED_BYTES = 2048
"""Headers of longer bytes are not kept."""
