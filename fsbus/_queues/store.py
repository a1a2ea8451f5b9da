"""Queues on disk: definitions, routing copies into each queue, depth and consumers.

Layout, under the bus directory::

    fsbus/queues/VERSION              replaced whenever a definition changes
    fsbus/queues/LOCK                 flock held while a definition changes
    fsbus/queues/<name>/queue.json    the definition (written whole, then renamed)
    fsbus/queues/<name>/used          its mtime: the last declare or consumer change
    fsbus/queues/<name>/orphaned      a consumer died (see QueueStore._reaped)
    fsbus/queues/<name>/expirer       flock held by the process that dead-letters the
                                      queue's expired messages (dead_letter_expired)
                                      and those it dropped (dead_letter_dropped)
    fsbus/queues/<name>/dropped/*     messages a full queue dropped, to be dead-lettered
                                      (dead_letter_dropped: see fsbus/_bus/dropped.py)
    fsbus/queues/<name>/consumers/*   one file per consumer, flocked while it lives
    fsbus/queues/<name>/bus/          the queue's messages: a bus of its own holding one
                                      work-queue (single) message per queued copy
    fsbus/queues/.router              flock held by the process that routes peers' messages
    fsbus/queues/.routed/             markers of peers' messages routed (see routed.py)

Publishers route: before a publish returns, a copy goes into every queue with a
matching binding, as a single message of the queue's own bus. Consumers of a queue are
work-queue consumers of that bus, so claims, acks, releases, delivery counts, priority
and expiry are the bus's own. Routing tables are cached for :data:`REFRESH` seconds and
a change of definitions waits :data:`SETTLE` before it returns, so a publish that starts
after ``bind_queue`` returns (in any process of the host) is routed by the new binding.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import shutil
import stat
import struct
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Literal, NamedTuple, Protocol

from .._core.trie import TopicTrie
from .._errors import (
    ClosedError,
    FsBusError,
    QueueError,
    QueueFull,
    QueueMismatch,
    QueueNotFound,
    StorageError,
    UsageError,
    storage_error,
)
from .._settings import Settings, with_changes
from . import routed
from .definition import Definition, QueueInfo, QueueOptions, validate_queue_name
from .routed import RouteMark


class QueueBus(Protocol):
    """A blocking handle on one queue's own bus (the bus face provides it)."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        ttl: float | None,
        durable: bool,
        headers: dict[str, str] | None,
        priority: int | None,
    ) -> None:
        """Add a work-queue message."""

    def depth(self) -> int:
        """Messages not expired: waiting, or held by a consumer."""

    def ready(self) -> int:
        """Messages not expired that no consumer holds (those held further back than
        the first one not held, from the head, may count as ready)."""

    def expire(self) -> int:
        """Remove the expired messages no consumer holds; how many."""

    def dead_letter_expired(self, send: DeadLetterSend) -> DeadLettered:
        """Claim the expired messages no consumer holds, hand them to ``send`` in queue
        order (in batches), then remove them. The messages of a batch ``send`` raises
        for are given back, and the exception raised."""

    def trim(self, max_length: int, spool: str | None = None) -> tuple[int, int, int]:
        """Count the queue (as :meth:`depth`) and remove from its head what goes beyond
        ``max_length`` of the messages no consumer holds: (depth counted, held ones
        passed over, removed). ``spool``: write each one removed into that folder
        first, for its dead-lettering."""

    def spool(self, folder: str, messages: list[Expired]) -> None:
        """Write ``messages`` into spool ``folder``, to be dead-lettered."""

    def dead_letter_dropped(self, folder: str, send: DeadLetterSend, quarantine: str) -> int:
        """Hand the messages in spool ``folder`` to ``send`` in the order dropped, in
        batches, then remove them; how many. A batch ``send`` raises for stays; a file
        that is not a dropped message goes to ``quarantine``."""

    def spooled(self, folder: str) -> int:
        """Messages in spool ``folder`` not sent yet (0 if there is none)."""

    def remove(self, messages: list[tuple[str, str]]) -> int:
        """Remove these messages (as a consumer would); how many were removed."""

    def purge_all(self) -> int:
        """Remove every message no consumer holds; how many."""

    def close(self) -> None:
        """Release what the handle holds."""


class DeadLettered(NamedTuple):
    """What a pass over the expired messages of queues did (see
    :meth:`QueueStore.dead_letter_expired`)."""

    sent: int
    """Messages sent under their dead-letter topic (and removed)."""
    next_ms: int | None
    """When the soonest message left expires (ms since the epoch), if a name tells."""
    listing: float = 0.0
    """Seconds spent listing the queues (not sending)."""
    spooling: bool = False
    """A queue this process dead-letters for has ``dead_letter_dropped``: its spool is
    looked at again soon (see :meth:`QueueStore.spool_of`)."""


Expired = tuple[str, bytes, dict[str, str]]
"""An expired message of a queue: its topic, payload and headers."""

DeadLetterSend = Callable[[list[Expired]], None]
"""Publishes expired messages of a queue under its dead-letter topic, in order."""

ExpiredSend = Callable[[str, str, list[Expired], str], None]
"""Publishes expired or dropped messages of a queue under its dead-letter topic: (queue,
dead-letter topic, the messages, in order, the reason: ``expired`` or ``maxlen``)."""

Opener = Callable[[str, Settings], QueueBus]
"""Opens the bus of a queue: (its directory, its configuration) -> a handle."""

log = logging.getLogger("fsbus.queues")

REFRESH = 0.005
"""Seconds a process trusts its routing table before it looks at VERSION again."""
SETTLE = 3 * REFRESH
"""Seconds a definition change waits before returning (every cached table is stale)."""
_DEF = "queue.json"
FOREVER = 100 * 365 * 24 * 3600.0
"""The TTL of a copy whose publish gave none, in a queue with no message_ttl."""


class QueueStore:
    """The queues of one bus directory, as seen by one process (thread-safe)."""

    def __init__(
        self,
        private: str,
        config: Settings,
        quarantine: str,
        opener: Opener,
        messages: str | None = None,
    ) -> None:
        self.base = f"{private}/queues"
        self._messages = messages
        self._opener = opener
        self.config = config
        self.log_source: Callable[[], Any] | None = None
        """Given to the queues' buses as they open: the bus's durable log, if it uses one."""
        self._quarantine = quarantine
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._version: tuple[int, int, int] | None = None
        self._defs: dict[str, Definition] = {}
        self._trie: TopicTrie[str] = TopicTrie()
        self._routes: dict[str, tuple[Definition, ...]] = {}
        self._publishers: dict[str, QueueBus] = {}
        # which queue each one was opened on (see identity): a queue another process
        # deleted, and perhaps declared again, is another one
        self._publisher_ids: dict[str, QueueId | Literal["gone"] | None] = {}
        # queue -> (its uid, the descriptor holding the flock of its expirer file)
        self._expirers: dict[str, tuple[str, int]] = {}
        # those found stale, closed once no publish that took one can still use it
        self._retired: list[tuple[float, QueueBus]] = []
        self._bad: set[str] = set()
        self._links: set[str] = set()  # queue folders found to be symbolic links (warned)
        self.on_router: Callable[[bool], None] | None = None
        """Called with whether a router of queue consumers is at work on the bus
        (:meth:`router_active`), as that changes: looked at with ``VERSION``."""
        self._trimming: dict[str, threading.Lock] = {}  # queue -> held while trimming it
        self.on_spooled: Callable[[], None] | None = None
        """Called (from the thread that trimmed) when a queue spooled messages it
        dropped, to be dead-lettered: the engine looks at the spools at once."""
        self._router_seen: bool | None = None
        self._router_fd: int | None = None
        self._router_warned = False
        self._progress_at = 0.0  # when note_progress last wrote (time.monotonic)
        # Queues with max_length: [depth last counted + copies written since, when to
        # count again (time.monotonic)], so that a publish counts only now and then.
        self._tallies: dict[str, list[float]] = {}
        self.sub_config = with_changes(
            config,
            max_deliveries=None,
            bucket_num_chars=1,
            locking=config.locking,
            count_deliveries=True,
            # a queue's bus keeps no durable log of its own: its copies are recorded in
            # the log of the bus that publishes them (log_source)
            durable_log="off",
        )

    # ------------------------------------------------------------------ paths
    def dir(self, name: str) -> str:
        return f"{self.base}/{name}"

    def bus_root(self, name: str) -> str:
        return f"{self.base}/{name}/bus"

    def identity(self, name: str) -> QueueId | Literal["gone"] | None:
        """Which queue ``name`` is now: its definition's uid and its ``bus/`` folder's
        inode (a queue deleted and declared again differs in its uid, though the
        filesystem may reuse the inode); ``"gone"`` when it is not there; None when
        that cannot be told now (a read failed otherwise: a network mount's passing
        error, a definition being replaced)."""
        try:
            dfd = _open_folder(self.dir(name))
        except (FileNotFoundError, NotADirectoryError, StorageError):
            return "gone"  # (a folder that is a symbolic link is no queue)
        except OSError:
            return None
        try:
            st = os.stat("bus", dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                return None  # (not followed, and says nothing: a link, say)
            ino = st.st_ino
            data = _read_in(dfd, _DEF)
        except (FileNotFoundError, NotADirectoryError):
            return "gone"
        except OSError:
            return None
        finally:
            os.close(dfd)
        try:
            return queue_id(Definition.decode(data, name), ino)
        except ValueError:
            return None  # (a corrupt definition: quarantined by the next read)

    # ------------------------------------------------------------------ routing
    def targets(self, topic: str) -> tuple[Definition, ...]:
        """The queues a message on ``topic`` is copied into (cheap: cached)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._refresh(now)
        return self._cached_targets(topic)

    def targets_if_fresh(self, topic: str) -> tuple[Definition, ...] | None:
        """:meth:`targets` from the table in memory, or None when it is due to be
        checked against VERSION (a stat: not from the event loop on a slow mount)."""
        if time.monotonic() >= self._next_check:
            return None
        return self._cached_targets(topic)

    def _cached_targets(self, topic: str) -> tuple[Definition, ...]:
        if not self._defs:
            return ()
        hit = self._routes.get(topic)
        if hit is None:
            if not isinstance(topic, str):
                return ()  # the publish itself says what is wrong with it
            try:
                names = sorted(set(self._trie.match(topic)))
            except ValueError:
                return ()
            hit = tuple(self._defs[n] for n in names if n in self._defs)
            if len(self._routes) > 10_000:
                self._routes = {}
            self._routes[topic] = hit
        return hit

    def _refresh(self, now: float, *, force: bool = False) -> None:
        done: list[QueueBus] = []
        try:
            self._refresh_locked(now, force, done)
        finally:
            for pub in done:
                with contextlib.suppress(OSError):
                    pub.close()

    def _refresh_locked(self, now: float, force: bool, done: list[QueueBus]) -> None:
        with self._lock:
            if self._retired and now - self._retired[0][0] >= RETIRE:
                done.extend(p for t, p in self._retired if now - t >= RETIRE)
                self._retired = [(t, p) for t, p in self._retired if now - t < RETIRE]
            try:
                st = os.stat(f"{self.base}/VERSION")
                version: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                version = None
            except OSError as exc:
                log.warning("cannot read %s/VERSION: %s; keeping the routing table", self.base, exc)
                version = self._version
            if self.on_router is not None:
                active = version is not None and self.router_active()
                if active != self._router_seen:
                    self._router_seen = active
                    self.on_router(active)
            if force or version != self._version:
                defs = self._load_all() if version is not None else {}
                trie: TopicTrie[str] = TopicTrie()
                for d in defs.values():
                    for p in d.bindings:
                        trie.add(p, d.name)
                self._defs, self._trie, self._routes = defs, trie, {}
                self._version = version
                # a definition changed: the buses this process writes into must still
                # be those of the queues of their names (a delete, then a declare, in
                # another process or by a bus of this one, makes a new directory)
                for name, ident in list(self._publisher_ids.items()):
                    uid = defs[name].uid if name in defs else ""
                    if uid and isinstance(ident, tuple) and uid == ident[0]:
                        continue  # the same queue (its uid says so, with no more I/O)
                    now_is = self.identity(name)
                    if now_is is not None and (now_is == "gone" or now_is != ident):
                        self._retired.append((now, self._publishers.pop(name)))
                        del self._publisher_ids[name]
            self._next_check = now + REFRESH

    def _load_all(self) -> dict[str, Definition]:
        out: dict[str, Definition] = {}
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            return out
        for name in names:
            if name in ("VERSION", "LOCK") or name.startswith("."):
                continue
            try:
                mode = os.lstat(self.dir(name)).st_mode
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISLNK(mode):
                if name not in self._links:
                    self._links.add(name)
                    log.warning("%s", _planted(self.dir(name)))
                continue
            if not stat.S_ISDIR(mode):
                continue  # a stray file: no queue, as a folder without queue.json
            d = self._read(name)
            if d is not None:
                out[name] = d
        return out

    def _read(self, name: str) -> Definition | None:
        path = f"{self.dir(name)}/{_DEF}"
        try:
            dfd = _open_folder(self.dir(name))
        except (FileNotFoundError, NotADirectoryError, StorageError):
            return None  # none, not a folder, or a symbolic link (see get and declare)
        except OSError as exc:
            log.warning("cannot read queue definition %s: %s", path, exc)
            return None
        try:
            data = _read_in(dfd, _DEF)
        except FileNotFoundError:
            return None  # being created or deleted
        except OSError as exc:
            log.warning("cannot read queue definition %s: %s", path, exc)
            return None
        finally:
            os.close(dfd)
        try:
            return Definition.decode(data, name)
        except ValueError as exc:
            self._quarantine_def(name, path, str(exc))
            return None

    def _quarantine_def(self, name: str, path: str, why: str) -> None:
        dst = f"{self._quarantine}/{int(time.time() * 1000):x}-queue-{name}.json"
        try:
            os.makedirs(self._quarantine, exist_ok=True)
            os.rename(path, dst)
        except OSError:
            if name not in self._bad:
                log.warning("queue %r has a corrupt definition (%s): %s", name, path, why)
                self._bad.add(name)
            return
        log.warning(
            "queue %r had a corrupt definition (%s) and was moved to %s; declare the "
            "queue again to use it (its messages are kept)",
            name,
            why,
            dst,
        )

    def check_room(
        self,
        targets: tuple[Definition, ...],
        refused: tuple[str, bytes, Mapping[str, str] | None] | None = None,
        ahead: Mapping[str, int] | None = None,
    ) -> None:
        """Raise :class:`QueueFull` if a reject-publish queue among ``targets`` is full.
        ``refused``: the message (topic, payload, headers), which each full one with
        ``dead_letter_dropped`` spools to be dead-lettered first (RabbitMQ's
        ``reject-publish-dlx``: see :meth:`spool_of`). ``ahead``: copies that go into
        queues (by name) before this one and are not written yet (the earlier messages
        of a batch whose rooms are all checked first)."""
        first: QueueFull | None = None
        for d in targets:
            o = d.options
            if o.max_length is not None and o.overflow == "reject-publish":
                extra = ahead.get(d.name, 0) if ahead else 0
                depth = self._tally(d.name, o.max_length - 1 - extra) + extra
                if depth >= o.max_length:
                    spooled = refused is not None and self._spool_refused(d, *refused)
                    first = first or QueueFull(
                        f"queue {d.name!r} is full ({depth} of max_length={o.max_length}, "
                        "overflow='reject-publish'): the message was not published"
                        + ("; it goes to the queue's dead-letter topic" if spooled else "")
                        + "; consume from it, purge it, or publish again later"
                    )
        if first is not None:
            raise first

    def _spool_refused(
        self, d: Definition, topic: str, payload: bytes, headers: Mapping[str, str] | None
    ) -> bool:
        """Spool the message full queue ``d`` refuses, if it dead-letters what it refuses
        (see :meth:`spool_of`); whether it did."""
        folder = self.spool_of(d)
        pub = None if folder is None else self._publisher(d.name)
        if folder is None or pub is None:
            return False
        pub.spool(folder, [(topic, payload, dict(headers or {}))])
        if self.on_spooled is not None:
            self.on_spooled()
        return True

    def enqueue(
        self,
        d: Definition,
        topic: str,
        payload: bytes,
        *,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> int:
        """Put one message into queue ``d``; returns 1 (0 if the queue vanished)."""
        pub = self._publisher(d.name)
        if pub is None:
            return 0
        pub.publish(
            topic,
            payload,
            ttl=copy_ttl(d, ttl),
            durable=durable,
            headers=headers,
            priority=priority,
        )
        self.trim(d)
        return 1

    def open_targets(self, targets: tuple[Definition, ...]) -> list[tuple[Definition, QueueBus]]:
        """The buses of ``targets`` (those that still exist), for a caller that writes the
        copies itself; it calls :meth:`trim` on each queue after its copy."""
        out = []
        for d in targets:
            pub = self._publisher(d.name)
            if pub is not None:
                out.append((d, pub))
        return out

    def trim(self, d: Definition) -> None:
        """After a copy went into ``d``: drop its head beyond ``max_length`` (drop-head)."""
        o = d.options
        if o.max_length is None:
            return
        with self._lock:
            t = self._tallies.get(d.name)
            if t is not None:
                t[0] += 1
        if o.overflow == "drop-head":
            self._drop_head(d.name, o.max_length, self.spool_of(d))

    def trim_given_back(self, name: str) -> None:
        """A message of queue ``name`` was given back (ready again): if the queue is a
        full ``drop-head`` one (its tally of ready messages, if fresh, says it had no
        room left), count it and drop its head beyond ``max_length``."""
        d = self._defs.get(name)
        o = None if d is None else d.options
        if d is None or o is None or o.max_length is None or o.overflow != "drop-head":
            return
        if self._tallied(name, o.max_length - 1) is not None:
            return  # room for it
        self._trimmed(name, o.max_length, self.spool_of(d))

    def spool_of(self, d: Definition) -> str | None:
        """Where queue ``d`` spools the messages it drops from its head (``drop-head``)
        or refuses (``reject-publish``), to be dead-lettered (``dead_letter_dropped``);
        None: they are gone."""
        return f"{self.dir(d.name)}/{_DROPPED}" if d.options.dead_letter_dropped else None

    def _tallied(self, name: str, most: int) -> int | None:
        """The tally of capped queue ``name`` if it can stand for a count: the last count,
        plus the copies this process wrote since, is at most ``most`` and younger than
        :data:`RECOUNT` (or ten times what the count took, for a queue so deep that
        counting it takes longer); else None. Consumers only lower a depth, so in one
        process the tally never says less than the queue holds; other processes' copies
        are seen at the next count (docs/queues.md, "Max length")."""
        with self._lock:
            t = self._tallies.get(name)
            if t is not None and t[0] <= most and time.monotonic() < t[1]:
                return int(t[0])
        return None

    def _counted(self, name: str, depth: int, since: float) -> None:
        """Record a count of ``depth`` started at ``since`` (time.monotonic)."""
        took = time.monotonic() - since
        with self._lock:
            self._tallies[name] = [depth, since + max(RECOUNT, took * 10)]

    def _tally(self, name: str, most: int) -> int:
        """The ready messages of capped queue ``name``: its tally, or counted (see
        :meth:`_tallied`; those a consumer holds do not count, as on RabbitMQ)."""
        depth = self._tallied(name, most)
        if depth is None:
            since = time.monotonic()
            pub = self._publisher(name)
            depth = 0 if pub is None else pub.ready()
            self._counted(name, depth, since)
        return depth

    def _defined(self, name: str) -> bool:
        """Whether queue ``name``'s folder (not a symbolic link) holds its definition."""
        try:
            dfd = _open_folder(self.dir(name))
        except (OSError, StorageError):
            return False
        try:
            return stat.S_ISREG(os.stat(_DEF, dir_fd=dfd, follow_symlinks=False).st_mode)
        except OSError:
            return False
        finally:
            os.close(dfd)

    def _publisher(self, name: str) -> QueueBus | None:
        now = time.monotonic()
        if now >= self._next_check:
            self._refresh(now)  # (drops the buses of queues deleted meanwhile)
        with self._lock:
            pub = self._publishers.get(name)
            if pub is not None:
                return pub
            if not self._defined(name):
                return None
            pub = self._opener(self.bus_root(name), self.sub_config)
            self._publishers[name] = pub
            self._publisher_ids[name] = self.identity(name)
            return pub

    def _drop_head(self, name: str, max_length: int, spool: str | None) -> None:
        # A queue may go max_length // 32 over before its head is dropped (then down to
        # max_length): a deep capped queue is counted once per that many copies.
        if self._tallied(name, max_length + max_length // 32) is not None:
            return
        self._trimmed(name, max_length, spool)

    def _trimmed(self, name: str, max_length: int, spool: str | None) -> int:
        """Count queue ``name``, drop its head beyond ``max_length`` ready messages (into
        ``spool``, if given: see :meth:`spool_of`); the depth left (the held ones
        counted in). Its tally is of the ready ones (the held ones do not count towards
        the limit): a message given back is counted at the next count."""
        pub = self._publisher(name)
        if pub is None:
            return 0
        with self._lock:
            trimming = self._trimming.setdefault(name, threading.Lock())
        # One trim of a queue at a time in a process: another's claims would look held
        # to it (a second copy dropped), and their spool files could swap places.
        with trimming:
            since = time.monotonic()
            depth, held, removed = pub.trim(max_length, spool)
            self._counted(name, depth - held - removed, since)
        if removed and spool is not None and self.on_spooled is not None:
            self.on_spooled()
        return depth - removed

    # ------------------------------------------------------------------ peers' messages
    def take_router(self) -> bool:
        """Become the process that routes peers' messages for the queue consumers of the
        bus, unless another one is: an exclusive ``flock`` on ``fsbus/queues/.router``, held
        until :meth:`close` (a process that dies lets it go). True when this store holds
        it, or when the lock cannot be had at all (no flock on this mount, no right to
        create the file): then this process routes as if elected, and the markers of
        :meth:`mark_routed` still keep every copy single."""
        with self._lock:
            if self._router_fd is not None:
                return True
            try:
                fd = _open_own(f"{self.base}/.router")
            except StorageError as exc:
                if not self._router_warned:
                    self._router_warned = True
                    log.warning("%s; until then every queue consumer routes", exc)
                return True
            except OSError:
                return True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False  # another process routes
            except OSError:
                os.close(fd)
                return True
            self._router_fd = fd
            return True

    def progress_due(self) -> bool:
        """Whether, as the router, it is time to record its progress again (first at
        once, then at most every :data:`PROGRESS_EVERY` seconds)."""
        return self._router_fd is not None and (
            not self._progress_at or time.monotonic() - self._progress_at >= PROGRESS_EVERY
        )

    def note_progress(self, wall: float) -> None:
        """As the router: every peer's message renamed into its bucket before ``wall``
        (``time.time()``) has been looked at. Kept in ``.router`` for the next router."""
        fd = self._router_fd
        if fd is None:
            return
        self._progress_at = time.monotonic()
        with contextlib.suppress(OSError):
            os.pwrite(fd, struct.pack("<d", wall), 0)

    def router_active(self) -> bool:
        """Whether a router is at work on the bus: ``.router`` was written (its progress,
        every :data:`PROGRESS_EVERY` while it lists) less than :data:`ROUTER_FRESH` ago."""
        try:
            age = time.time() - os.stat(f"{self.base}/.router").st_mtime
        except OSError:
            return False
        return -ROUTER_FRESH < age < ROUTER_FRESH

    def router_progress(self) -> float | None:
        """The last progress a router recorded (see :meth:`note_progress`), read by the
        router that takes over; None when there is none."""
        fd = self._router_fd
        if fd is None:
            return None
        try:
            data = os.pread(fd, 8, 0)
        except OSError:
            return None
        if len(data) != 8:
            return None
        (wall,) = struct.unpack("<d", data)
        return wall if math.isfinite(wall) and wall > 0 else None

    def drop_router(self) -> None:
        """Let another process route peers' messages (idempotent)."""
        with self._lock:
            fd, self._router_fd = self._router_fd, None
        if fd is not None:
            os.close(fd)

    def claim_route(
        self, bucket: str, name: str, topic: str, resumable: bool = True
    ) -> RouteMark | None:
        """Claim the routing of a qlobber-fsq peer's message (which routes nothing): a
        claim for the one process, on any host, that creates its marker first or finds it
        left half done by a router that died; None otherwise (see :mod:`.routed`)."""
        return routed.claim(self.base, bucket, name, topic, resumable)

    def abandoned_routes(self, resumable: bool = True) -> list[RouteMark]:
        """Claims on the peers' messages whose router died before it was done."""
        if self._messages is None:
            return []
        return routed.abandoned(self.base, self._messages, resumable)

    def sweep_routed(self, messages: str, min_age: float = 60.0) -> int:
        """Remove the routing markers of peers' messages that are gone (older than
        ``min_age``: a process may still be listing the message as new)."""
        return routed.sweep(self.base, messages, min_age)

    # ------------------------------------------------------------------ definitions
    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        os.makedirs(self.base, exist_ok=True)
        fd = _open_own(f"{self.base}/LOCK")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
            self._bump()
        finally:
            os.close(fd)
        self._refresh(time.monotonic(), force=True)
        time.sleep(SETTLE)

    def _bump(self) -> None:
        _write_atomic(self.base, "VERSION", uuid.uuid4().hex.encode())

    def get(self, name: str) -> Definition:
        validate_queue_name(name)
        d = self._read(name)
        if d is None:
            if os.path.islink(self.dir(name)):
                raise _planted(self.dir(name))
            raise QueueNotFound(
                f"no queue named {name!r} on this bus; declare it first "
                f"(bus.declare_queue({name!r}, bindings=[...]) or `fsbus queue declare {name}`)"
            )
        return d

    def current(self, name: str) -> Definition:
        """Queue ``name`` as the routing table knows it (cheap: cached like :meth:`targets`,
        so a change another process made is seen once its change returned)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._refresh(now)
        d = self._defs.get(name)
        return d if d is not None else self.get(name)

    def gone(self, d: Definition) -> bool:
        """Whether queue ``d`` was deleted since it was read (its definition is gone, or
        is another queue's of the same name): a copy that failed to reach it then
        reached no queue, rather than failing the publish."""
        try:
            os.stat(f"{self.dir(d.name)}/{_DEF}")
        except FileNotFoundError:
            return True
        except OSError:
            return False  # cannot tell: not gone
        now = self._read(d.name)
        return now is None or (bool(d.uid) and now.uid != d.uid)

    def existing(self, names: Iterable[str]) -> tuple[Definition, ...]:
        """The queues of ``names`` that exist now (as :meth:`current` knows them), each
        once, in the order given; a missing one is left out, an invalid name raises."""
        out: dict[str, Definition] = {}
        for name in names:
            if name in out:
                continue
            try:
                out[name] = self.current(name)
            except QueueNotFound:
                continue
        return tuple(out.values())

    def declare(self, name: str, bindings: list[str], options: QueueOptions) -> Definition:
        from .._core.topics import validate_pattern

        validate_queue_name(name)
        wanted = tuple(dict.fromkeys(validate_pattern(p) for p in bindings))
        folder = self.dir(name)
        made = False
        try:
            with self._changing():
                d = self._read(name)
                if d is not None:
                    diff = options.differences(d.options)
                    if diff:
                        raise QueueMismatch(
                            f"queue {name!r} exists with other options ({'; '.join(diff)}); "
                            "declare it with the same options, or delete it first"
                        )
                    merged = d.bindings + tuple(p for p in wanted if p not in d.bindings)
                    d = d.with_bindings(merged)
                else:
                    d = Definition(name, options, wanted, uuid.uuid4().hex)
                    try:
                        os.mkdir(folder)  # (a symbolic link there is not followed: EEXIST)
                        made = True
                    except FileExistsError:
                        pass  # a folder left without queue.json: taken over
                    dfd = _open_folder(folder)  # a symbolic link: StorageError
                    try:
                        for sub in ("consumers", "bus"):
                            with contextlib.suppress(FileExistsError):
                                os.mkdir(sub, dir_fd=dfd)
                    finally:
                        os.close(dfd)
                    # the new folders survive a power cut once declare returns
                    _sync_dirs([folder, self.base, os.path.dirname(self.base)])
                _write_atomic(folder, _DEF, d.encode())
                self.touch(name)
        except OSError as exc:
            if made:  # nothing half made is left (it would be a folder without queue.json)
                shutil.rmtree(folder, ignore_errors=True)
            raise storage_error(f"declaring queue {name!r}", exc) from exc
        except StorageError:
            if made:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        return d

    def bind(self, name: str, pattern: str, *, bind: bool = True) -> Definition:
        from .._core.topics import validate_pattern

        pattern = validate_pattern(pattern)
        try:
            with self._changing():
                d = self.get(name)
                if bind and pattern not in d.bindings:
                    d = d.with_bindings((*d.bindings, pattern))
                elif not bind and pattern in d.bindings:
                    d = d.with_bindings(tuple(p for p in d.bindings if p != pattern))
                else:
                    return d
                _write_atomic(self.dir(name), _DEF, d.encode())
        except OSError as exc:
            what = "binding" if bind else "unbinding"
            raise storage_error(f"{what} {pattern!r} of queue {name!r}", exc) from exc
        return d

    def delete(
        self,
        name: str,
        *,
        if_unused: bool = False,
        if_empty: bool = False,
        send: ExpiredSend | None = None,
    ) -> int:
        """Delete a queue and its messages; returns how many messages it held.

        ``send``: where what the queue dropped and has not dead-lettered yet goes first
        (its spool, ``dead_letter_dropped``: see :meth:`dead_letter_expired`). Those
        messages left the queue already: on RabbitMQ they would be in the dead-letter
        exchange's queues by now, and go with this queue no more than they would there.
        What another process drops meanwhile, before the queue is gone, goes on too."""
        late: tuple[Definition, QueueBus] | None = None
        if send is not None:
            try:
                d: Definition | None = self.get(name)
            except QueueNotFound:
                d = None  # (said below)
            if d is not None and d.options.dead_letter_dropped:
                # (outside the lock: it publishes); raises if they cannot go, and the
                # queue stays with them
                self._dead_letter_dropped(name, d, send, deleting=True)
                pub = self._publisher(name)
                late = None if pub is None else (d, pub)
        with self._changing():
            self.get(name)
            if if_unused and self.consumers(name):
                raise QueueMismatch(f"queue {name!r} has consumers (if_unused=True): not deleted")
            depth = self.depth(name)
            if if_empty and depth:
                raise QueueMismatch(
                    f"queue {name!r} holds {depth} messages (if_empty=True): not deleted"
                )
            self._close_publisher(name)
            with self._lock:
                self._tallies.pop(name, None)
            trash = f"{self.base}/.deleted-{uuid.uuid4().hex}"
            os.rename(self.dir(name), trash)
        if late is not None and send is not None:
            # dropped by another process after the spool was sent, before the rename
            d, pub = late
            spool = f"{trash}/{_DROPPED}"
            try:
                self._dead_letter_dropped(name, d, send, (pub, spool), deleting=True)
            except QueueError as exc:
                self._keep_spool(name, spool, exc)
        shutil.rmtree(trash, ignore_errors=True)
        return depth

    def _keep_spool(self, name: str, spool: str, exc: QueueError) -> None:
        """What another process dropped from queue ``name`` while it was deleted, and
        that could not be dead-lettered (``exc``): kept in the quarantine, not removed
        with the queue."""
        kept = f"{self._quarantine}/{int(time.time() * 1000):x}-queue-{name}-dropped"
        try:
            os.makedirs(self._quarantine, exist_ok=True)
            os.rename(spool, kept)
        except OSError as err:
            log.error("%s; and keeping them in %s failed: %s", exc.__cause__, kept, err)
            return
        log.error(
            "queue %r was deleted, but messages another process dropped from it meanwhile "
            "could not be dead-lettered (%s): they are kept in %s; publish them again by hand",
            name,
            exc.__cause__,
            kept,
        )

    def purge(self, name: str) -> int:
        self.get(name)
        with self._lock:
            self._tallies.pop(name, None)
        pub = self._publisher(name)
        if pub is None:
            return 0
        return pub.purge_all()

    def names(self) -> list[str]:
        self._refresh(time.monotonic(), force=True)
        return sorted(self._defs)

    def info(self, name: str, skip: Collection[str] = ()) -> QueueInfo:
        """Queue ``name`` now; its consumers counted but for the files in ``skip``."""
        d = self.get(name)
        o = d.options
        if o.max_length is not None and o.overflow == "drop-head":
            # A drop-head queue may be up to a 32nd over between two counts (see
            # _drop_head); trimmed here, the depth a caller reads is never over.
            try:
                depth = self._trimmed(name, o.max_length, self.spool_of(d))
            except (FsBusError, OSError):
                depth = self.depth(name)  # not ours to trim (a read-only observer)
        else:
            depth = self.depth(name)
        spool = self.spool_of(d)
        pub = None if spool is None else self._publisher(name)
        dead_lettering = 0 if spool is None or pub is None else pub.spooled(spool)
        return QueueInfo(d.name, d.bindings, o, depth, self.consumers(name, skip), dead_lettering)

    def depth(self, name: str) -> int:
        """Messages in queue ``name`` not expired (0 if it is gone)."""
        pub = self._publisher(name)
        return 0 if pub is None else pub.depth()

    # ------------------------------------------------------------------ consumers
    def touch(self, name: str) -> None:
        _stamp(self.dir(name), "used")

    def consumer_path(self, name: str) -> str:
        """A new consumer file's path for queue ``name`` (see :meth:`attach`)."""
        return f"{self.dir(name)}/consumers/{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def attach(self, name: str, path: str | None = None) -> int:
        """Register a consumer of ``name``: a flocked file (at ``path``, from
        :meth:`consumer_path`, or a new one); returns its descriptor."""
        os.close(_open_folder(self.dir(name)))  # never through a symbolic link
        os.makedirs(f"{self.dir(name)}/consumers", exist_ok=True)
        path = path or self.consumer_path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.touch(name)
        with contextlib.suppress(OSError):
            os.unlink(f"{self.dir(name)}/{_ORPHANED}")  # it has a consumer again
        return fd

    def detach(self, name: str, fd: int, send: ExpiredSend | None = None) -> bool:
        """Unregister a consumer; True when the queue was auto-deleted as it left
        (``send`` as for :meth:`delete`)."""
        path = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else None
        with contextlib.suppress(OSError):
            if path:
                os.unlink(path)
        os.close(fd)
        self.touch(name)
        try:
            d = self.get(name)
        except QueueNotFound:
            return False
        if d.options.auto_delete and self.consumers(name) == 0:
            with contextlib.suppress(QueueNotFound):
                self.delete(name, send=send)
                return True
        return False

    def live_consumers(self, name: str, own: Collection[str] = ()) -> list[str]:
        """The names of the live consumer files of ``name`` (held by a flock), sorted; the
        names in ``own`` (this process's) count as live without a look. Nothing is
        removed (see :meth:`consumers`)."""
        folder = f"{self.dir(name)}/consumers"
        live = {f for f in _names_in(folder) if f in own or _held(f"{folder}/{f}")}
        return sorted(live | set(own))

    def consumers(self, name: str, skip: Collection[str] = ()) -> int:
        """The live consumers of ``name``: consumer files held by a flock, but for the
        paths in ``skip`` (a process's own consumers, which it counts itself). A file no
        one holds is removed: its consumer died (see :meth:`_reaped`)."""
        folder = f"{self.dir(name)}/consumers"
        live = reaped = 0
        for f in _names_in(folder):
            p = f"{folder}/{f}"
            if p in skip:
                continue
            state = _consumer_state(p)
            live += state is True
            reaped += state is False
        if reaped:
            self._reaped(name)
        return live

    def _reaped(self, name: str) -> None:
        """A consumer of ``name`` died (killed: it never detached) and its file was
        removed. Its end is a use of the queue, as a detach is (``expires`` counts from
        it, not from when it attached), and it leaves a mark for :meth:`expire_unused`:
        an ``auto_delete`` queue whose last consumer died is deleted, as one whose last
        consumer left is (RabbitMQ deletes it when its consumer's connection dies)."""
        self.touch(name)
        _stamp(self.dir(name), _ORPHANED, utime=False)

    def expire_unused(
        self, send: ExpiredSend | None = None, *, on_delete: ExpiredSend | None = None
    ) -> list[str]:
        """Remove expired messages from every queue, and delete the queues with
        ``expires`` set and no use for that long, and the ``auto_delete`` ones whose last
        consumer died (see :meth:`_reaped`); their names. The expired messages of a
        queue with ``dead_letter_expired`` go to ``send`` (see :meth:`dead_letter_expired`)
        if this process is the one that looks for them, or stay, for the one that is.
        ``on_delete``: where what a deleted queue dropped goes (default ``send``: see
        :meth:`delete`), for a process that does not look for expired messages."""
        if self._messages is not None:
            self.sweep_routed(self._messages)
        for name in self.names():
            d = self._defs.get(name)
            if d is None:
                continue
            if d.options.dead_letter_dropped and send is not None and self._expires_here(name, d):
                self._dead_letter_dropped(name, d, send)
            if d.options.dead_letter_expired:
                if send is not None and self._expires_here(name, d):
                    self._dead_letter_expired(name, d, send)
                continue
            pub = self._publisher(name)
            if pub is not None:
                with contextlib.suppress(OSError):
                    pub.expire()
        return self.expire_queues(send if on_delete is None else on_delete)

    def dead_letter_expired(self, send: ExpiredSend, *, census: bool = True) -> DeadLettered:
        """Hand every expired message of the queues with ``dead_letter_expired`` that no
        consumer holds to ``send`` (queue, dead-letter topic, messages, ``"expired"``)
        under a claim, in batches, and remove them once sent; and what the queues with
        ``dead_letter_dropped`` spooled (reason ``"maxlen"``: see :meth:`spool_of`).
        Every process that runs the bus's engine does this, once a second or when the
        soonest is due: the claim (a ``flock``, or a rename where flock does not cross
        hosts) gives each message to one of them. A process killed after a send and
        before the removal leaves that batch to be sent again (at least once). A failing
        send leaves its batch in place, logged, for the next pass. Also says when the
        soonest message left in them expires: when to look again. ``census``: False
        looks at the spools only (no queue is listed)."""
        sent, soonest, listing, spooling = 0, None, 0.0, False
        names = self.names()
        for gone in set(self._expirers) - set(names):  # (deleted: let its file go)
            os.close(self._expirers.pop(gone)[1])
        for name in names:
            d = self._defs.get(name)
            if d is None:
                continue
            o = d.options
            if not (o.dead_letter_expired or (o.dead_letter_dropped and o.max_length is not None)):
                continue
            if not self._expires_here(name, d):
                continue
            if o.dead_letter_dropped and o.max_length is not None:  # (none: nothing drops)
                spooling = True
                sent += self._dead_letter_dropped(name, d, send)
            if o.dead_letter_expired and census:
                done = self._dead_letter_expired(name, d, send)
                sent += done.sent
                listing += done.listing
                if done.next_ms is not None and (soonest is None or done.next_ms < soonest):
                    soonest = done.next_ms
        return DeadLettered(sent, soonest, listing, spooling)

    def _expires_here(self, name: str, d: Definition) -> bool:
        """Whether this process is the one that dead-letters the expired messages of queue
        ``name``: the one holding the flock of its ``expirer`` file, from its first look
        until it closes or dies (then the next to look takes over), so that one process
        lists the queue for them, not each. True when that cannot be told (the claims
        still send each message once)."""
        held = self._expirers.get(name)
        if held is not None:
            if held[0] == d.uid:
                return True
            os.close(self._expirers.pop(name)[1])  # deleted, and declared again since
        flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(f"{self.dir(name)}/{_EXPIRER}", flags, 0o666)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            return exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN)
        self._expirers[name] = (d.uid, fd)
        return True

    def _dead_letter_expired(self, name: str, d: Definition, send: ExpiredSend) -> DeadLettered:
        pub = self._publisher(name)
        target = d.options.dead_letter
        if pub is None or target is None:
            return DeadLettered(0, None)
        try:
            return pub.dead_letter_expired(lambda batch: send(name, target, batch, "expired"))
        except ClosedError:
            raise  # the bus is closing: the next process to open it sends them
        except (FsBusError, OSError) as exc:
            log.warning(
                "dead-lettering the expired messages of queue %r to %r failed: %s; "
                "they stay in the queue and are tried again in a second",
                name,
                target,
                exc,
            )
            return DeadLettered(0, None)

    def _dead_letter_dropped(
        self,
        name: str,
        d: Definition,
        send: ExpiredSend,
        moved: tuple[QueueBus, str] | None = None,
        *,
        deleting: bool = False,
    ) -> int:
        """Send what queue ``name`` dropped (its spool, or the spool ``moved`` (its bus,
        the folder) of a queue renamed away to be deleted) to its dead-letter topic.

        ``deleting``: the queue is about to be deleted, so a failure cannot be tried
        again later: QueueError says what failed, and the spool keeps what was not sent."""
        pub, folder = (self._publisher(name), self.spool_of(d)) if moved is None else moved
        target = d.options.dead_letter
        if pub is None or target is None or folder is None:
            return 0
        try:
            return pub.dead_letter_dropped(
                folder, lambda batch: send(name, target, batch, "maxlen"), self._quarantine
            )
        except ClosedError:
            raise  # the bus is closing: the next process to open it sends them
        except (FsBusError, OSError) as exc:
            if deleting:
                raise QueueError(
                    f"queue {name!r} not deleted: the messages it dropped could not be "
                    f"dead-lettered to {target!r}: {exc}. They stay in {folder}; delete "
                    "the queue again once its dead-letter topic takes messages"
                ) from exc
            log.warning(
                "dead-lettering the messages queue %r dropped to %r failed: %s; they stay "
                "in %s and are tried again shortly",
                name,
                target,
                exc,
                folder,
            )
            return 0

    def expire_queues(self, send: ExpiredSend | None = None) -> list[str]:
        """Delete the queues with ``expires`` set and no use for that long, and the
        ``auto_delete`` ones whose last consumer died; their names. (The part of
        :meth:`expire_unused` that :meth:`expiry_due` times: no message is read.)
        ``send`` as for :meth:`delete`."""
        gone = []
        now = time.time()
        for name in self.names():
            d = self._defs.get(name)
            if d is None or (d.options.expires is None and not d.options.auto_delete):
                continue
            # counted first: a consumer that died is found (and its end noted) here
            if self.consumers(name):
                continue
            orphaned = d.options.auto_delete and os.path.lexists(f"{self.dir(name)}/{_ORPHANED}")
            if not orphaned:
                if d.options.expires is None:
                    continue
                try:
                    used = os.stat(f"{self.dir(name)}/used").st_mtime
                except OSError:
                    continue
                if now - used < d.options.expires:
                    continue
            with contextlib.suppress(FsBusError, OSError):
                self.delete(name, send=send)
                gone.append(name)
        return gone

    def expiry_due(self) -> float | None:
        """The soonest time (``time.time()``) a queue with ``expires`` is due to expire
        if it stays unused (its last use, plus ``expires``; perhaps past, for one still
        in use), or None when no queue has ``expires``: when to run
        :meth:`expire_queues` next, beside the periodic gc."""
        due: float | None = None
        for name in self.names():
            d = self._defs.get(name)
            if d is None or d.options.expires is None:
                continue
            try:
                used = os.stat(f"{self.dir(name)}/used").st_mtime
            except OSError:
                continue
            at = used + d.options.expires
            due = at if due is None else min(due, at)
        return due

    # ------------------------------------------------------------------ lifecycle
    def _close_publisher(self, name: str) -> None:
        """This process deletes queue ``name``: its bus here is retired, as a stale one."""
        with self._lock:
            pub = self._publishers.pop(name, None)
            self._publisher_ids.pop(name, None)
            if pub is not None:
                self._retired.append((time.monotonic(), pub))

    def close(self) -> None:
        for _uid, fd in self._expirers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._expirers = {}
        with self._lock:
            pubs, self._publishers = list(self._publishers.values()), {}
            self._publisher_ids = {}
            pubs += [p for _t, p in self._retired]
            self._retired = []
        for p in pubs:
            p.close()
        self.drop_router()


QueueId = tuple[str, int]
"""A queue's identity: its definition's uid, its bus folder's inode (see
:meth:`QueueStore.identity`)."""


def queue_id(d: Definition, bus_inode: int) -> QueueId:
    """The identity of the queue defined by ``d`` whose bus folder has ``bus_inode``."""
    return (d.uid, bus_inode)


RETIRE = 10.0
"""Seconds a queue's bus found stale, or of a queue this process deleted, stays open
before it is closed: a publish in another thread may have taken it just before (its
descriptors must not be reused under it)."""

RECOUNT = 0.1
"""Seconds a capped queue's count serves its publishes (with the copies they wrote)."""

PROGRESS_EVERY = 0.5
"""Seconds between two records of the router's progress in ``.router``."""
ROUTER_FRESH = 5.0
"""Seconds: a router that recorded its progress less long ago is at work (publishers tag
their stamps for it: ``fsbus._bus.stamps``)."""


def _names_in(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


_ORPHANED = "orphaned"
_EXPIRER = "expirer"
_DROPPED = "dropped"
"""A file a queue's folder holds once a consumer of it died (see QueueStore._reaped)."""


def _consumer_state(path: str, *, remove: bool = True) -> bool | None:
    """A consumer file: True while its consumer lives (it holds the file's flock); False
    when no one held it, and (``remove``) it was removed: its consumer died; None when
    it could not be opened (gone meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) or None
    else:
        if not remove:
            return False
        try:
            os.unlink(path)  # its consumer died: no one holds it
        except OSError:
            return None  # (another process removed it first: its death is noted there)
        return False
    finally:
        os.close(fd)


def _held(path: str) -> bool:
    """Whether a consumer file is held by a flock (its consumer lives); nothing is
    removed (see :func:`_consumer_state`)."""
    return _consumer_state(path, remove=False) is True


def copy_ttl(d: Definition, ttl: float | None) -> float:
    """The TTL of a copy in queue ``d`` of a message published with ``ttl``."""
    o = d.options
    # No TTL from the publish and none on the queue: the copy waits for a consumer
    # for good, as in RabbitMQ (not the bus's default single_ttl).
    life = ttl if ttl is not None else (o.message_ttl or FOREVER)
    if o.message_ttl is not None:
        life = min(life, o.message_ttl)
    return life


def _open_own(path: str) -> int:
    """Open (or create) one of the store's lock files for reading and writing, never
    through a symbolic link: a link planted in the bus directory would have this process
    lock, and write into, a file elsewhere."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise StorageError(
            f"{path} is a symbolic link, which fsbus never makes: someone planted it in the "
            "bus directory; remove it (fsbus creates the file again)",
            path,
        ) from exc


def _planted(path: str) -> StorageError:
    """The error for a symbolic link standing where a queue's folder should be."""
    return StorageError(
        f"{path} is a symbolic link, which fsbus never makes: someone planted it in the "
        f"bus directory; remove it (`rm {path}` removes the link only); fsbus does not "
        "follow it or write through it, and no queue of that name is used until it is gone",
        path,
    )


def _open_folder(path: str) -> int:
    """Open a folder of the store, never through a symbolic link (see :func:`_planted`):
    a link planted there would have fsbus write the queue's files, and route messages,
    into a folder elsewhere. Raises StorageError for a link, NotADirectoryError for
    another file, FileNotFoundError when there is nothing."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except NotADirectoryError as exc:  # (what Linux says of a link with O_DIRECTORY)
        if os.path.islink(path):
            raise _planted(path) from exc
        raise
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _planted(path) from exc


def _read_in(dfd: int, name: str) -> bytes:
    """The bytes of file ``name`` in the folder open as ``dfd`` (never through a link)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _stamp(folder: str, name: str, *, utime: bool = True) -> None:
    """Create file ``name`` in ``folder`` (both never through a symbolic link) and, with
    ``utime``, set its mtime to now; a failure is ignored (a stamp is a hint)."""
    try:
        dfd = _open_folder(folder)
    except (OSError, StorageError):
        return
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(name, flags, 0o666, dir_fd=dfd))
        if utime:
            os.utime(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _write_atomic(folder: str, name: str, data: bytes) -> None:
    """Write file ``name`` of ``folder`` whole (a temporary file, synced, renamed over
    it), never through a symbolic link; an OSError is raised with the file's path."""
    dfd = _open_folder(folder)
    tmp = f".{name}.{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o666,
            dir_fd=dfd,
        )
        try:
            os.write(fd, data)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    except OSError as exc:
        exc.filename = f"{folder}/{name}"
        raise
    finally:
        os.close(dfd)


def _sync_dirs(paths: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass  # a filesystem that cannot sync directories
        finally:
            os.close(fd)


def usage_if_queue_and_pattern_missing(pattern: object, queue: object) -> None:
    if pattern is None and queue is None:
        raise UsageError("give a pattern, a queue=, or both")
