"""What AMQP adds to a bus directory: exchanges, queue flags, headers bindings, owners.

Layout, under ``<root>/fsbus/amqp/``::

    exchanges/<X>.json     an exchange: type, durable, auto_delete, internal, arguments;
                           ``bound`` once an auto-delete one had a binding (it then goes
                           with its last)
    queues/<Q>.json        a queue's AMQP side: durable, exclusive owner, arguments
    headers/<X>.json       the bindings of headers exchange X: [[queue, arguments, uid],
                           ...]; ``uid``, the bound queue's (see ``Definition.uid``),
                           tells a binding of a queue since deleted by an fsbus process
                           from one of a queue declared again by its name
    exclusive/<Q>.json     queue Q's exclusive consumer: its owner and consumer tag
    sac/<Q>                flocked by queue Q's single active consumer (x-single-active-
                           consumer), on its own open file description; never removed
                           (a consumer may still hold or wait on it)
    sac/<Q>.waiting/<gateway>.<key>
                           one empty file per consumer of Q waiting on that gateway
    owners/<id>            one file per gateway, flocked while it runs
    LOCK                   flock held while any of these changes

``<X>`` and ``<Q>`` are names escaped as one topic word. The queues themselves (their
bindings and messages) are the bus's durable queues. Every file is written whole and
renamed, so a reader sees the old or the new one. Blocking: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any, TypeVar

from .. import StorageError, StoragePermissionError
from ._routing import PREDECLARED, word

_T = TypeVar("_T")

HeadersBinding = tuple[str, dict[str, Any], str]
"""A binding to a headers exchange: AMQP queue, arguments, the queue's uid."""

_LONGEST = 237
"""Bytes of the longest escaped name a record file is named after: with ``.json`` and a
write's temporary suffix (13 bytes) it is a file name of 255 bytes, the longest most
filesystems take."""


def file_word(name: str) -> str:
    """The name of ``name``'s record file (``.json`` left out): :func:`~._routing.word`
    with ``/`` and NUL escaped too (``%2F``, ``%00``; no escaped name holds them, since
    every ``%`` of a name is escaped). One longer than :data:`_LONGEST` bytes keeps its
    first 150 bytes (whole characters), then ``%%`` (which no escaped name holds) and 40
    hex digits of the SHA-256 of ``name``. A name that fitted before keeps its file: its
    record is found after an upgrade."""
    text = word(name).replace("/", "%2F").replace("\x00", "%00")
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= _LONGEST:
        return text
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:40]
    head = raw[:150].decode("utf-8", "ignore")  # (a character cut in two is left out)
    return f"{head}%%{digest}"


def jsonable(value: Any) -> Any:
    """A field-table value as JSON (for storing and comparing arguments)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, bytes | bytearray):
        return value.decode("latin-1")
    return str(value)


def try_lock(fd: int) -> bool:
    """Take the exclusive flock of ``fd`` if nobody holds it (no wait)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class AmqpState:
    """The AMQP files of one bus directory."""

    def __init__(self, root: str) -> None:
        self.base = os.path.join(root, "fsbus", "amqp")
        self.gateway_id = uuid.uuid4().hex[:16]
        path = os.path.join(self.base, "owners", self.gateway_id)
        try:
            for sub in ("exchanges", "queues", "headers", "owners", "exclusive", "sac"):
                os.makedirs(os.path.join(self.base, sub), exist_ok=True)
            self._owner_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            cls = StoragePermissionError if exc.errno in _NOT_WRITABLE else StorageError
            raise cls(
                f"an AMQP gateway keeps its exchanges, queues and bindings in {self.base}, "
                f"and cannot write there: {exc.strerror or exc}; serve a bus this user can "
                "write to (a read-only bus can only be looked at: fsbus stats, queue ls)",
                exc.filename or self.base,
            ) from exc
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        # path -> (the file's identity, its "owner"); see owner_of
        self._owners: dict[str, tuple[tuple[int, int, int, int], str | None]] = {}
        self._caps: dict[str, tuple[tuple[int, int, int, int], int | None]] = {}
        self._bound: dict[str, tuple[tuple[int, int, int, int], str | None]] = {}
        self._headers: dict[str, tuple[tuple[int, int, int, int], list[HeadersBinding]]] = {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.base, "owners", self.gateway_id))
        os.close(self._owner_fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = self.lock()
        try:
            yield
        finally:
            os.close(fd)

    def lock(self) -> int:
        """Take ``LOCK`` on an open file of its own (blocking); ``os.close`` releases it.
        For a hold across awaits: each call's file is locked against every other's, in
        this process too."""
        fd = os.open(os.path.join(self.base, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ------------------------------------------------------------------ files
    def _path(self, kind: str, name: str) -> str:
        return os.path.join(self.base, kind, file_word(name) + ".json")

    def read(self, kind: str, name: str) -> dict[str, Any] | None:
        return self._read_file(self._path(kind, name))

    @staticmethod
    def _read_file(path: str) -> dict[str, Any] | None:
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # unreadable or corrupt: as if absent (declaring again rewrites it)
        return doc if isinstance(doc, dict) else None

    def max_priority_of(self, queue: str) -> int | None:
        """The ``x-max-priority`` of bus queue ``queue`` (None: none, or no record), read
        again only when its record changed (see :meth:`_cached`): asked for each queue a
        message with a priority is routed to."""

        def cap(doc: dict[str, Any] | None) -> int | None:
            args = doc.get("arguments") if doc is not None else None
            value = args.get("x-max-priority") if isinstance(args, dict) else None
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return self._cached(self._caps, "queues", queue, cap)

    def owner_of(self, kind: str, name: str) -> str | None:
        """The ``owner`` a record names (None if none, or no record), read again only
        when the file changed (see :meth:`_cached`: each AMQP ``basic.get`` asks)."""

        def owner(doc: dict[str, Any] | None) -> str | None:
            value = doc.get("owner") if doc is not None else None
            return str(value) if value else None

        return self._cached(self._owners, kind, name, owner)

    def _cached(
        self,
        cache: dict[str, tuple[tuple[int, int, int, int], _T]],
        kind: str,
        name: str,
        extract: Callable[[dict[str, Any] | None], _T],
    ) -> _T | None:
        """``extract`` of a record, kept in ``cache`` by the file's identity. Every write
        renames a new file in, so a file with the same inode, size and times holds the
        same record: one ``stat`` instead of an open, a read and a parse."""
        return self._cached_file(cache, self._path(kind, name), extract)

    def _cached_file(
        self,
        cache: dict[str, tuple[tuple[int, int, int, int], _T]],
        path: str,
        extract: Callable[[dict[str, Any] | None], _T],
    ) -> _T | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        value = extract(self._read_file(path))  # replaced meanwhile: the newer one
        if len(cache) >= 4096:
            cache.clear()
        cache[path] = (key, value)
        return value

    def write(self, kind: str, name: str, doc: dict[str, Any]) -> None:
        self._write_file(self._path(kind, name), doc)

    @staticmethod
    def _write_file(path: str, doc: dict[str, Any]) -> None:
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(doc, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)

    def remove(self, kind: str, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(kind, name))

    # ------------------------------------------------------------------ exchanges
    def exchange(self, name: str) -> dict[str, Any] | None:
        """An exchange's definition; the predeclared ones always exist."""
        if name in PREDECLARED:
            return {
                "type": PREDECLARED[name],
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        if name == "":
            return {
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        return self.read("exchanges", name)

    def bound_auto_delete(self, names: Collection[str] | None = None) -> list[str]:
        """The auto-delete exchanges (of ``names``, or all) that have had a binding: the
        ones RabbitMQ deletes with their last binding. One never bound stays."""
        if names is None:
            folder = os.path.join(self.base, "exchanges")
            try:
                paths = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json")]
            except FileNotFoundError:
                return []
        else:
            paths = [self._path("exchanges", n) for n in names if n not in PREDECLARED and n]
        # every gateway looks every few seconds: a record unchanged since is not read again
        found = (self._cached_file(self._bound, p, _bound_auto_delete) for p in paths)
        return [name for name in found if name is not None]

    def note_bound(self, name: str) -> bool:
        """Exchange ``name`` has a binding now: an auto-delete one is marked, so that it
        goes with its last binding. False if the exchange is gone (deleted meanwhile: the
        binding just made is the caller's to take back). Call under :meth:`lock`."""
        doc = self.exchange(name)
        if doc is None:
            return False
        if doc.get("auto_delete") and not doc.get("bound") and name not in PREDECLARED:
            self.write("exchanges", name, {**doc, "bound": True})
        return True

    # ------------------------------------------------------------------ headers bindings
    def headers_bindings(self, exchange: str) -> list[HeadersBinding]:
        """Exchange ``exchange``'s headers bindings: (AMQP queue, arguments, the queue's
        uid; "" in a record written before uids were). Read again only when the file
        changed (see :meth:`_cached`: each batch published to the exchange asks)."""
        found = self._cached(self._headers, "headers", exchange, _headers_bindings)
        return [] if found is None else list(found)

    def drop_headers_bindings_of(self, queue: str) -> None:
        """Queue ``queue`` (an AMQP name) was deleted: its bindings to headers exchanges
        go with it, as on RabbitMQ (a queue declared again by that name has none)."""
        folder = os.path.join(self.base, "headers")
        with self.locked():
            try:
                files = [f for f in os.listdir(folder) if f.endswith(".json")]
            except FileNotFoundError:
                return
            for f in files:
                path = os.path.join(folder, f)
                doc = self._read_file(path)
                found = doc.get("bindings") if doc else None
                if not isinstance(found, list):
                    continue
                kept = [b for b in found if not (isinstance(b, list) and b and b[0] == queue)]
                if len(kept) != len(found):
                    self._write_file(path, {"bindings": kept})

    def set_headers_bindings(self, exchange: str, bindings: list[HeadersBinding]) -> None:
        self.write("headers", exchange, {"bindings": [list(b) for b in bindings]})

    # ------------------------------------------------------------------ owners
    def owner_alive(self, owner: str) -> bool:
        """Is the gateway that ``owner`` ("<gateway>/<connection>") names still running?"""
        gateway = owner.split("/", 1)[0]
        if gateway == self.gateway_id:
            return True
        path = os.path.join(self.base, "owners", gateway)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)  # its gateway died: nobody holds it
            return False
        finally:
            os.close(fd)

    def exclusive_consumer(self, queue: str) -> dict[str, Any] | None:
        """The exclusive consumer of ``queue`` (a bus queue name), if a running gateway
        has one; the file of one whose gateway is gone is removed."""
        doc = self.read("exclusive", queue)
        if doc is None:
            return None
        if self.owner_alive(str(doc.get("owner"))):
            return doc
        self.remove("exclusive", queue)
        return None

    def take_exclusive_consumer(self, queue: str, doc: dict[str, Any]) -> bool:
        """Record ``doc`` as ``queue``'s exclusive consumer, unless a running gateway has
        one already (False)."""
        with self.locked():
            if self.exclusive_consumer(queue) is not None:
                return False
            self.write("exclusive", queue, doc)
            return True

    def drop_exclusive_consumer(self, queue: str, doc: dict[str, Any]) -> None:
        """``queue``'s exclusive consumer ``doc`` is gone (another's file stays)."""
        with self.locked():
            if self.read("exclusive", queue) == doc:
                self.remove("exclusive", queue)

    # ------------------------------------------------------------------ single active
    def open_single_active(self, queue: str) -> int:
        """A new open file description of ``queue``'s (a bus queue name) single active
        consumer file, unlocked: one per AMQP consumer, whose flock makes it the active
        one on every gateway of the bus (see :func:`try_lock`)."""
        path = os.path.join(self.base, "sac", file_word(queue))
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def _waiting_dir(self, queue: str) -> str:
        return os.path.join(self.base, "sac", file_word(queue) + ".waiting")

    def add_waiting(self, queue: str, key: str) -> None:
        """A consumer of this gateway waits to be ``queue``'s single active consumer: an
        empty file ``<gateway>.<key>`` in ``sac/<Q>.waiting/``, for the other gateways'
        counts (see :meth:`waiting_elsewhere`)."""
        folder = self._waiting_dir(queue)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{self.gateway_id}.{key}")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))

    def drop_waiting(self, queue: str, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._waiting_dir(queue), f"{self.gateway_id}.{key}"))

    def waiting_elsewhere(self, queue: str) -> int:
        """The consumers of ``queue`` waiting to be its single active consumer on other
        running gateways (the files of a gateway that is gone are removed)."""
        folder = self._waiting_dir(queue)
        try:
            entries = os.listdir(folder)
        except FileNotFoundError:
            return 0
        alive: dict[str, bool] = {}
        n = 0
        for entry in entries:
            gateway = entry.split(".", 1)[0]
            if gateway == self.gateway_id:
                continue
            if gateway not in alive:
                alive[gateway] = self.owner_alive(gateway)
            if alive[gateway]:
                n += 1
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, entry))
        return n

    def orphaned_exclusive_queues(self) -> list[str]:
        """Exclusive queues whose gateway is gone (crashed): to be deleted."""
        out = []
        folder = os.path.join(self.base, "queues")
        for f in os.listdir(folder):
            if not f.endswith(".json"):
                continue
            try:
                with open(os.path.join(folder, f), "rb") as fh:
                    doc = json.loads(fh.read())
            except (OSError, ValueError):
                continue
            owner = doc.get("owner") if isinstance(doc, dict) else None
            if owner and not self.owner_alive(str(owner)):
                out.append(str(doc.get("name")))
        return out


def _headers_bindings(doc: dict[str, Any] | None) -> list[HeadersBinding]:
    """The bindings a ``headers/<X>.json`` record holds (see AmqpState.headers_bindings)."""
    found = doc.get("bindings") if doc else None
    if not isinstance(found, list):
        return []
    out: list[HeadersBinding] = []
    for b in found:
        if isinstance(b, list) and len(b) in (2, 3) and isinstance(b[1], dict):
            out.append((str(b[0]), dict(b[1]), str(b[2]) if len(b) == 3 else ""))
    return out


def _bound_auto_delete(doc: dict[str, Any] | None) -> str | None:
    """The name of the exchange of record ``doc`` if it is auto-delete and was bound."""
    if doc is None or not (doc.get("auto_delete") and doc.get("bound")) or "name" not in doc:
        return None
    return str(doc["name"])
