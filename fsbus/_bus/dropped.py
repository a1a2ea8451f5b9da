"""The spool of a queue's dropped messages, on their way to its dead-letter topic.

A full ``drop-head`` queue with ``dead_letter_dropped`` does not remove the messages it
drops from its head: the publisher that overfilled it claims each one, writes it whole
into the queue's spool (``fsbus/queues/<name>/dropped/``, one file a message, made
visible by a rename) and only then removes it from the queue. The process that
dead-letters the queue's expired messages (the holder of its ``expirer`` lock) sends
what the spool holds under the dead-letter topic, in the order dropped, with reason
``maxlen``, then removes each file.

A file is ``JSON {"topic", "headers"}``, a newline, then the payload. Its name sorts in
the order dropped: nanoseconds since the epoch, then a count of this process's.

Crash windows: a publisher killed before its rename leaves a ``.tmp-`` file (removed
once :data:`DEBRIS_AGE` old) and the message still in the queue; killed after the rename
and before the removal, the message is in both (sent once from the spool, delivered
maybe once more from the queue: at least once, never lost). A sender killed between its
send and the removal sends the file again (at least once). Senders of one file take
turns by its ``flock``, and one that got it after another had removed the file sees no
link left and passes it over. Where flock does not cross hosts (``locking="rename"``),
a sender claims a file by renaming it to ``.sending-NAME`` (one winner); one it left
behind when it died is given back once :data:`LEASE` old.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Final

from .._errors import storage_error
from .ops import Ops

__all__ = ["DEBRIS_AGE", "LEASE", "Spooled", "count_spooled", "spool", "take_spooled"]

DEBRIS_AGE: Final = 600.0
"""Seconds after which a half-written spool file (a publisher died writing it) is removed."""

LEASE: Final = 60.0
"""Seconds after which a ``.sending-`` file (claimed by a rename, where flock does not
cross hosts) whose sender died is given back, to be sent again."""

_TMP: Final = ".tmp-"
_SENDING: Final = ".sending-"

Spooled = tuple[str, bytes, dict[str, str]]
"""A dropped message: its topic, payload and headers."""

log = logging.getLogger("fsbus.queues")

_count = itertools.count()
_count_lock = threading.Lock()


def _next_name() -> str:
    with _count_lock:
        n = next(_count)
    return f"{time.time_ns():020d}-{os.getpid()}-{n:08d}"


def spool(ops: Ops, folder: str, messages: list[Spooled]) -> None:
    """Write ``messages`` into spool ``folder`` (made if missing), each whole, in order."""
    try:
        ops.mkdir(folder)
    except FileExistsError:
        pass
    except OSError as exc:
        raise storage_error("making a queue's spool of dropped messages", exc, folder) from exc
    for topic, payload, headers in messages:
        name = _next_name()
        tmp, final = f"{folder}/{_TMP}{name}", f"{folder}/{name}"
        head = json.dumps({"topic": topic, "headers": headers}, separators=(",", ":"))
        try:
            fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                ops.writev(fd, [head.encode(), b"\n", payload])
            finally:
                ops.close(fd)
            ops.rename(tmp, final)
        except OSError as exc:
            try:
                ops.unlink(tmp)
            except OSError:
                pass
            raise storage_error("writing a dropped message to its queue's spool", exc, tmp) from exc


def _parse(data: bytes) -> Spooled:
    head, sep, payload = data.partition(b"\n")
    if not sep:
        raise ValueError("no newline after its JSON head")
    doc = json.loads(head)
    topic, headers = doc.get("topic"), doc.get("headers")
    if not isinstance(topic, str) or not isinstance(headers, dict):
        raise ValueError("its head has no topic or no headers")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError("its headers are not all strings")
    return topic, payload, headers


def _read_all(ops: Ops, fd: int) -> bytes:
    size = ops.fstat(fd).st_size
    data = ops.pread(fd, size, 0)
    while len(data) < size:
        more = ops.pread(fd, size - len(data), len(data))
        if not more:
            break
        data += more
    return data


def _listed(ops: Ops, folder: str) -> list[str]:
    """The names in spool ``folder`` (none if nothing was ever dropped)."""
    try:
        return ops.listdir(folder)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error("listing a queue's spool of dropped messages", exc, folder) from exc


def count_spooled(ops: Ops, folder: str) -> int:
    """The messages in spool ``folder`` not sent yet: whole ones, and those a sender
    has claimed by a rename."""
    return sum(1 for n in _listed(ops, folder) if not n.startswith(_TMP))


def take_spooled(
    ops: Ops,
    folder: str,
    send: Callable[[list[Spooled]], None],
    *,
    batch: int,
    quarantine: str,
    by_rename: bool = False,
) -> int:
    """Hand what spool ``folder`` holds to ``send``, in the order dropped, ``batch`` at a
    time, each claimed (its ``flock``; ``by_rename``, where flock does not cross hosts:
    renamed to ``.sending-NAME``, one winner), and remove each batch once sent; how many
    were sent. A batch ``send`` raises for is given back (and the exception raised). A
    file that is not a dropped message is moved to ``quarantine`` with a warning."""
    listed = _listed(ops, folder)
    names = sorted(n for n in listed if not n.startswith("."))
    sent = 0
    held: list[tuple[str, str, int]] = []  # (path claimed, its spool path, descriptor)
    items: list[Spooled] = []

    def let_go(*, sent_on: bool) -> None:
        # Removed before its descriptor (and flock) goes: a sender that gets the lock
        # after finds no link left and passes it over (see _claim).
        for claimed, path, fd in held:
            try:
                if sent_on:
                    ops.unlink(claimed)
                elif claimed != path:
                    ops.rename(claimed, path)  # given back
            except FileNotFoundError:
                pass
            finally:
                ops.close(fd)
        held.clear()
        items.clear()

    def send_held() -> None:
        nonlocal sent
        send(list(items))
        sent += len(items)
        let_go(sent_on=True)

    try:
        for name in names:
            path = f"{folder}/{name}"
            claimed = f"{folder}/{_SENDING}{name}" if by_rename else path
            fd = _claim_by_rename(ops, path, claimed) if by_rename else _claim(ops, path)
            if fd is None:
                continue
            try:
                item = _parse(_read_all(ops, fd))
            except (ValueError, UnicodeDecodeError) as exc:
                ops.close(fd)
                _quarantine(ops, claimed, quarantine, f"{folder}/{name}", str(exc))
                continue
            except OSError:
                ops.close(fd)
                if claimed != path:
                    ops.rename(claimed, path)
                raise
            held.append((claimed, path, fd))
            items.append(item)
            if len(items) == batch:
                send_held()
        if items:
            send_held()
    except BaseException:
        let_go(sent_on=False)
        raise
    _sweep_debris(ops, folder, listed)
    return sent


def _claim(ops: Ops, path: str) -> int | None:
    """The file at ``path`` opened and flocked; None when another sender holds it or
    removed it."""
    try:
        fd = ops.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        ops.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if ops.fstat(fd).st_nlink == 0:  # sent and removed by the one that held it
            ops.close(fd)
            return None
    except OSError as exc:
        ops.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def _claim_by_rename(ops: Ops, path: str, claimed: str) -> int | None:
    """``path`` renamed to ``claimed`` (one sender wins), its lease started, opened; None
    when another sender won it."""
    try:
        ops.rename(path, claimed)
    except FileNotFoundError:
        return None
    try:
        ops.utime(claimed)  # its lease starts now (a rename keeps the old times)
        return ops.open(claimed, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        with contextlib.suppress(OSError):
            ops.rename(claimed, path)
        raise


def _quarantine(ops: Ops, path: str, quarantine: str, was: str, why: str) -> None:
    """Move ``path`` (spool file ``was``, maybe claimed under another name) aside."""
    dst = f"{quarantine}/{int(time.time() * 1000):x}-dropped-{os.path.basename(was)}"
    log.warning(
        "%s is not a dropped message (%s): moved to %s; remove it once looked at",
        was,
        why,
        dst,
    )
    try:
        ops.mkdir(quarantine)
    except OSError:
        pass
    try:
        ops.rename(path, dst)
    except OSError as exc:
        log.warning("could not move %s to quarantine (%s): removed instead", path, exc)
        try:
            ops.unlink(path)
        except OSError:
            pass


def _sweep_debris(ops: Ops, folder: str, listed: list[str]) -> None:
    """Remove the half-written files of ``listed`` older than :data:`DEBRIS_AGE` (their
    publishers died writing them), and give back the ``.sending-`` ones older than
    :data:`LEASE` (their senders died, where claims are renames)."""
    now = time.time()
    for name in listed:
        if not name.startswith((_TMP, _SENDING)):
            continue
        path = f"{folder}/{name}"
        try:
            age = now - ops.lstat(path).st_mtime
            if name.startswith(_TMP) and age > DEBRIS_AGE:
                ops.unlink(path)
            elif name.startswith(_SENDING) and age > LEASE:
                ops.rename(path, f"{folder}/{name[len(_SENDING) :]}")  # sent again
        except OSError:
            pass
