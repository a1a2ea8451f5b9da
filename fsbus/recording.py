"""Record Bus topics into a Stream, each message exactly once: ``fsbus stream record``
and the Spark source over Bus topics use it.

A durable queue (named after the recording) collects the messages of the pattern while
nothing runs. A drain takes what the queue holds and appends it to the Stream, one batch
at a time, as an exactly-once step:

1. the batch's message names go into ``<root>/fsbus/recordings/<queue>.pending``
   (written whole and fsynced) with the Stream's end offset;
2. the batch is appended (durably, at the Stream's ``batch`` level), each record carrying
   its message's name in the ``fsbus-message`` header;
3. the messages are acknowledged, and the pending file removed.

A recorder killed after 2 and before 3 leaves the file: the next drain reads the records
appended since its offset and acknowledges, without appending again, every redelivered
message already there; its own pending files keep naming those until they are
acknowledged, so a drain killed while recovering does not append them again either.
Killed before 2, its messages come back and are appended then.
Each record keeps what the Bus knew of its message (topic, kind, expiry, priority,
publish time, host, headers) in headers, so a reader can rebuild the message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from . import BlockingBus, Message, RecordIn, Stream

__all__ = ["RECORD_HEADERS", "Recording", "drain", "queue_for"]

MESSAGE = "fsbus-message"
TOPIC = "fsbus-topic"
KIND = "fsbus-kind"
EXPIRES = "fsbus-expires"
PRIORITY = "fsbus-priority"
PUBLISHED = "fsbus-published"
HOST = "fsbus-host"
RECORD_HEADERS = (MESSAGE, TOPIC, KIND, EXPIRES, PRIORITY, PUBLISHED, HOST)
"""Headers a recorded message's record carries besides the message's own."""

QUEUE_EXPIRES = 7 * 24 * 3600.0
"""A recording's queue is deleted after a week with no drain (its recorder is gone)."""
BATCH = 500
"""Messages appended per step; the recorder's bus holds as many at once."""


def queue_for(pattern: str, into: str) -> str:
    """The queue a recording of ``pattern`` into Stream ``into`` uses by default."""
    digest = hashlib.sha1(f"{pattern}\0{into}".encode()).hexdigest()[:12]
    return f"record-{digest}"


@dataclass(frozen=True)
class Recording:
    """What one drain did."""

    appended: int
    """Messages appended to the Stream."""
    skipped: int
    """Redelivered messages found already appended (after a recorder crash)."""
    end_offset: int
    """The Stream's end offset afterwards."""


def _pending_path(root: str, queue: str) -> str:
    return os.path.join(root, "fsbus", "recordings", f"{queue}.pending")


def _write_pending(path: str, start: int, names: list[str]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(json.dumps({"start": start, "names": names}).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _already_appended(path: str, stream: Stream) -> tuple[int, set[str]]:
    """Names of the pending batch's messages that reached the Stream before a crash, and
    the offset from which they were appended."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        start = int(doc["start"])
        names = set(doc["names"])
    except FileNotFoundError:
        return stream.end_offset, set()
    except (OSError, ValueError, KeyError, TypeError):
        # a torn pending file: its batch was never appended (step 2 is after)
        return stream.end_offset, set()
    # every record up to the end the append lock shows: a lagging view (a shared mount,
    # the crashed drain on another host) would have them appended twice
    end = stream.locked_end_offset()
    found = {r.headers.get(MESSAGE, "") for r in stream.read_through(start, end)}
    return start, names & found


def _record(msg: Message) -> RecordIn:
    headers = dict(msg.headers)
    headers.update(
        {
            MESSAGE: msg.name,
            TOPIC: msg.topic,
            KIND: "single" if msg.single else "multi",
            EXPIRES: repr(msg.expires),
            PRIORITY: str(msg.priority),
            PUBLISHED: "" if msg.published_at is None else repr(msg.published_at),
            HOST: msg.host or "",
        }
    )
    return RecordIn(msg.payload, headers=headers, timestamp=msg.published_at)


def _messages(it: object, want: int, wait: float) -> Iterator[Message]:
    """Up to ``want`` messages: the first within ``wait`` seconds, the others as long as
    they keep coming (a pause of 0.2 s ends the batch)."""
    for i in range(want):
        try:
            yield it.get(timeout=wait if i == 0 else min(wait, 0.2))  # type: ignore[attr-defined]
        except TimeoutError:
            return


def recorder_bus(root: str | os.PathLike[str]) -> BlockingBus:
    """A bus able to hold a whole batch of the recording's queue at once (with the
    defaults otherwise: no pydantic in a Spark task)."""
    return BlockingBus._using(os.fspath(root), None, handler_concurrency=BATCH)


def drain(
    root: str | os.PathLike[str],
    pattern: str,
    into: str,
    *,
    queue: str | None = None,
    bus: BlockingBus | None = None,
    wait: float = 2.0,
) -> Recording:
    """Append every message waiting in the recording's queue to Stream ``into``.

    The queue (``queue``, or :func:`queue_for` of the pattern and stream) is declared
    bound to ``pattern`` if missing: messages published from then on are recorded, by
    this drain or a later one. ``wait`` bounds the wait for each message the queue
    said it holds.
    """
    root = os.fspath(root)
    queue = queue or queue_for(pattern, into)
    pending = _pending_path(root, queue)
    with contextlib.ExitStack() as stack:
        if bus is None:
            bus = stack.enter_context(recorder_bus(root))
        bus.declare_queue(queue, [pattern], expires=QUEUE_EXPIRES)
        stream = stack.enter_context(Stream.open(root, into))
        since, already = _already_appended(pending, stream)
        unacked = set(already)  # appended before a crash, not acknowledged since
        appended = skipped = 0
        depth = bus.queue_info(queue).depth
        if depth == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pending)
            return Recording(0, 0, stream.end_offset)
        with bus.messages(queue=queue, prefetch=BATCH, ack_previous=False) as it:
            left = depth
            while left > 0:
                batch = list(_messages(it, min(BATCH, left), wait))
                if not batch:
                    break
                left -= len(batch)
                fresh = [m for m in batch if m.name not in already]
                skipped += len(batch) - len(fresh)
                if fresh:
                    # The new pending file still names what a crash left unacknowledged
                    # (from its offset on): killed again before those acks, the next
                    # drain must skip them too.
                    start = since if unacked else stream.end_offset
                    _write_pending(pending, start, [*sorted(unacked), *(m.name for m in fresh)])
                    stream.append_batch([_record(m) for m in fresh])
                    appended += len(fresh)
                for m in batch:
                    it.ack(m)
                unacked.difference_update(m.name for m in batch)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pending)
        return Recording(appended, skipped, stream.end_offset)


def record_forever(
    root: str | os.PathLike[str],
    pattern: str,
    into: str,
    *,
    queue: str | None = None,
    interval: float = 0.2,
    stop: object = None,
) -> Iterator[Recording]:
    """Drain again and again (every ``interval`` seconds when idle); yields each drain
    that appended or skipped something. Stops when ``stop.is_set()`` (a threading.Event)."""
    with recorder_bus(root) as bus:
        while stop is None or not stop.is_set():  # type: ignore[attr-defined]
            r = drain(root, pattern, into, queue=queue, bus=bus)
            if r.appended or r.skipped:
                yield r
            else:
                time.sleep(interval)
