"""What the dashboard shows, gathered through the public fsbus API.

A :class:`Snapshot` is one look at a bus: backlog per topic and per bucket, the
work-queue messages currently locked (and by which process, when this host can
tell), the durable queues, and the streams. Rates come from comparing successive
snapshots: a message name that appears is an arrival, one that disappears was
consumed or expired (for a queue: a copy that appears in it, one that leaves it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import fsbus
from fsbus import BlockingBus, MessageInfo

from ._locks import lock_owners

__all__ = [
    "BucketRow",
    "Dashboard",
    "GroupRow",
    "LockedRow",
    "PayloadTooLargeToShow",
    "PurgeResult",
    "QueueRow",
    "RateTracker",
    "Snapshot",
    "StreamRow",
    "TopicRow",
]

RATE_WINDOW = 10.0
"""Seconds of history rates are averaged over."""

MAX_PAYLOAD_READ = 16 * 1024 * 1024
"""Largest payload the message page reads."""

MAX_TOPIC_ROWS = 500
"""Messages listed on a topic's page."""


class PayloadTooLargeToShow(Exception):
    """The payload is larger than the page reads."""

    def __init__(self, size: int) -> None:
        super().__init__(
            f"the payload is {size} bytes; the dashboard shows payloads up to "
            f"{MAX_PAYLOAD_READ} bytes"
        )
        self.size = size


@dataclass(frozen=True)
class TopicRow:
    """Backlog and rates of one topic."""

    topic: str
    """The topic."""
    multi: int
    """Unexpired multi messages on disk."""
    single: int
    """Work-queue messages waiting or being handled."""
    locked: int
    """Work-queue messages currently locked by a consumer."""
    size: int
    """Payload bytes of all of them."""
    oldest: float | None
    """Publish time of the oldest message (None when no fsbus peer wrote one)."""
    rate_in: float | None
    """Messages per second arriving (None until two snapshots exist)."""
    rate_out: float | None
    """Messages per second leaving: consumed or expired."""

    @property
    def messages(self) -> int:
        """All messages on the topic."""
        return self.multi + self.single


@dataclass(frozen=True)
class BucketRow:
    """Backlog and rates of one bucket directory."""

    bucket: str
    """Bucket directory name."""
    messages: int
    """Messages in it."""
    size: int
    """Payload bytes."""
    rate_in: float | None
    """Messages per second arriving."""
    rate_out: float | None
    """Messages per second leaving."""


@dataclass(frozen=True)
class LockedRow:
    """A work-queue message a consumer holds right now."""

    info: MessageInfo
    """The message."""
    owner: str
    """Who holds it: "pid N (name)" when /proc/locks tells, else "locked"."""


@dataclass(frozen=True)
class GroupRow:
    """A consumer group of a stream."""

    name: str
    """Group name."""
    partitions: int
    """Partitions its records are spread over."""
    committed: int
    """Lowest committed offset over its partitions: everything below is done."""
    lag: int
    """Records between that offset and the stream's end (an upper bound on what is left)."""
    members: tuple[str, ...]
    """Live consumers."""


@dataclass(frozen=True)
class QueueRow:
    """One durable queue: its bindings, depth, consumers and rates."""

    name: str
    """Queue name."""
    bindings: tuple[str, ...]
    """Patterns bound to it."""
    depth: int
    """Copies waiting or held by a consumer (not expired)."""
    consumers: int
    """Live consumers."""
    rate_in: float | None
    """Copies per second arriving (None until two snapshots exist)."""
    rate_out: float | None
    """Copies per second leaving: acknowledged, expired, dropped or purged."""


@dataclass(frozen=True)
class StreamRow:
    """One stream and its segments."""

    name: str
    """Stream name."""
    start_offset: int
    """Oldest offset kept."""
    end_offset: int
    """Next offset to be written."""
    size: int
    """Bytes of all segments."""
    segments: tuple[tuple[int, int, int], ...]
    """(base offset, end offset, bytes) of each segment, oldest first."""
    groups: tuple[GroupRow, ...]
    """Consumer groups and their lag."""
    error: str | None = None
    """Why the stream could not be read, if it could not."""

    @property
    def records(self) -> int:
        """Records kept."""
        return self.end_offset - self.start_offset


@dataclass(frozen=True)
class Snapshot:
    """One look at a bus."""

    root: str
    """The bus directory."""
    taken_at: float
    """When, in seconds since the epoch."""
    topics: tuple[TopicRow, ...]
    """Topics with messages, busiest first."""
    buckets: tuple[BucketRow, ...]
    """Buckets with messages or traffic, in name order."""
    locked: tuple[LockedRow, ...]
    """Work-queue messages held by consumers."""
    streams: tuple[StreamRow, ...]
    """Streams under the root."""
    rate_window: float | None
    """Seconds the rates are measured over (None: not yet measured)."""
    queues: tuple[QueueRow, ...] = ()
    """Durable queues, in name order."""

    @property
    def messages(self) -> int:
        """Messages on the bus."""
        return sum(t.messages for t in self.topics)

    @property
    def singles(self) -> int:
        """Work-queue messages on the bus."""
        return sum(t.single for t in self.topics)

    @property
    def size(self) -> int:
        """Payload bytes on the bus."""
        return sum(t.size for t in self.topics)


@dataclass(frozen=True)
class PurgeResult:
    """What a purge did."""

    pattern: str
    """The pattern purged."""
    purged: int
    """Work-queue messages consumed and removed."""
    locked: int
    """Work-queue messages skipped because a consumer held them."""
    multi: int
    """Multi messages left alone (they expire at their TTL)."""


@dataclass
class RateTracker:
    """Rates per key from successive sets of message names."""

    window: float = RATE_WINDOW
    """Seconds of history kept."""
    _history: deque[tuple[float, dict[str, tuple[str, str]]]] = field(default_factory=deque)

    def observe(
        self, now: float, names: dict[str, tuple[str, str]]
    ) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]], float | None]:
        """Record the names present now, keyed to (topic, bucket).

        Returns rates (in, out) per topic and per bucket, and the seconds they span.
        """
        while self._history and now - self._history[0][0] > self.window:
            self._history.popleft()
        base = self._history[0] if self._history else None
        self._history.append((now, names))
        if base is None or now - base[0] < 0.5:
            return {}, {}, None
        then, old = base
        dt = now - then
        per_topic: dict[str, list[int]] = {}
        per_bucket: dict[str, list[int]] = {}
        for name, (topic, bucket) in names.items():
            if name not in old:
                per_topic.setdefault(topic, [0, 0])[0] += 1
                per_bucket.setdefault(bucket, [0, 0])[0] += 1
        for name, (topic, bucket) in old.items():
            if name not in names:
                per_topic.setdefault(topic, [0, 0])[1] += 1
                per_bucket.setdefault(bucket, [0, 0])[1] += 1
        return (
            {k: (i / dt, o / dt) for k, (i, o) in per_topic.items()},
            {k: (i / dt, o / dt) for k, (i, o) in per_bucket.items()},
            dt,
        )

    def observe_groups(
        self, now: float, names: dict[str, str]
    ) -> tuple[dict[str, tuple[float, float]], float | None]:
        """:meth:`observe` for names keyed to one group each (a queue's name).

        Returns rates (in, out) per group and the seconds they span.
        """
        rates, _, window = self.observe(now, {n: (g, g) for n, g in names.items()})
        return rates, window


class Dashboard:
    """Reads a bus for the UI; safe to call from the server's threads."""

    def __init__(
        self, bus: BlockingBus, *, cache_for: float = 1.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.bus = bus
        self.root = str(bus.root)
        self._cache_for = cache_for
        self._clock = clock
        self._lock = threading.Lock()
        self._rates = RateTracker()
        self._queue_rates = RateTracker()
        self._cached: Snapshot | None = None

    # ------------------------------------------------------------------ overview
    def snapshot(self) -> Snapshot:
        """A fresh snapshot, or the last one if it is younger than ``cache_for``."""
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached.taken_at < self._cache_for:
                return self._cached
            self._cached = self._take(now)
            return self._cached

    def _take(self, now: float) -> Snapshot:
        infos = list(self.bus.browse("#"))
        topic_rates, bucket_rates, window = self._rates.observe(
            now, {i.name: (i.topic, i.bucket) for i in infos}
        )
        topics: dict[str, list[MessageInfo]] = {}
        buckets: dict[str, list[MessageInfo]] = {}
        for info in infos:
            topics.setdefault(info.topic, []).append(info)
            buckets.setdefault(info.bucket, []).append(info)
        rows = []
        for topic in set(topics) | set(topic_rates):
            group = topics.get(topic, [])
            published = [i.published_at for i in group if i.published_at is not None]
            rate = topic_rates.get(topic, (0.0, 0.0)) if window else (None, None)
            rows.append(
                TopicRow(
                    topic=topic,
                    multi=sum(1 for i in group if not i.single),
                    single=sum(1 for i in group if i.single),
                    locked=sum(1 for i in group if i.locked),
                    size=sum(i.size for i in group),
                    oldest=min(published) if published else None,
                    rate_in=rate[0],
                    rate_out=rate[1],
                )
            )
        rows.sort(key=lambda r: (-r.messages, -(r.rate_in or 0), r.topic))
        bucket_rows = []
        for bucket in sorted(set(buckets) | set(bucket_rates)):
            group = buckets.get(bucket, [])
            rate = bucket_rates.get(bucket, (0.0, 0.0)) if window else (None, None)
            bucket_rows.append(
                BucketRow(bucket, len(group), sum(i.size for i in group), rate[0], rate[1])
            )
        return Snapshot(
            root=self.root,
            taken_at=now,
            topics=tuple(rows),
            buckets=tuple(bucket_rows),
            locked=tuple(self.locked_rows(i for i in infos if i.locked)),
            streams=tuple(self.streams()),
            rate_window=window,
            queues=tuple(self._queue_rows(now)),
        )

    def _queue_rows(self, now: float) -> list[QueueRow]:
        """Each durable queue, with rates from the copies that entered and left it."""
        infos = []
        names: dict[str, str] = {}
        for q in self.bus.queues():
            try:
                copies = list(self.bus.browse(queue=q.name))
            except fsbus.QueueNotFound:
                continue  # deleted while we looked
            infos.append(q)
            # copies of one message in two queues have names of their own; the key
            # keeps them apart anyway
            names.update({f"{q.name}/{c.name}": q.name for c in copies})
        rates, window = self._queue_rates.observe_groups(now, names)
        rows = []
        for q in sorted(infos, key=lambda q: q.name):
            rate = rates.get(q.name, (0.0, 0.0)) if window else (None, None)
            rows.append(
                QueueRow(
                    name=q.name,
                    bindings=tuple(q.bindings),
                    depth=q.depth,
                    consumers=q.consumers,
                    rate_in=rate[0],
                    rate_out=rate[1],
                )
            )
        return rows

    def locked_rows(self, infos: Iterable[MessageInfo]) -> list[LockedRow]:
        """Each locked message with the process holding it, when this host can tell."""
        held = list(infos)
        owners = lock_owners(i.path for i in held)
        return [LockedRow(i, str(owners[i.path]) if i.path in owners else "locked") for i in held]

    # ------------------------------------------------------------------ messages
    def messages(self, topic: str) -> list[MessageInfo]:
        """The messages on exactly ``topic``, oldest first."""
        found = [i for i in self.bus.browse("#") if i.topic == topic]
        found.sort(key=lambda i: (i.published_at or 0.0, i.name))
        return found

    def find(self, bucket: str, name: str) -> MessageInfo | None:
        """The message of that bucket and name, if it is still there."""
        for info in self.bus.browse("#"):
            if info.bucket == bucket and info.name == name:
                return info
        return None

    def payload(self, info: MessageInfo) -> bytes | None:
        """A message's payload, read without consuming it (None when gone).

        Raises :class:`PayloadTooLargeToShow` above :data:`MAX_PAYLOAD_READ` bytes: the
        bus reads a payload whole, and the page shows only its beginning anyway.
        """
        if info.size > MAX_PAYLOAD_READ:
            raise PayloadTooLargeToShow(info.size)
        return self.bus.read_payload(info)

    # ------------------------------------------------------------------ purge
    def purge_preview(self, pattern: str) -> PurgeResult:
        """What :meth:`purge` would do now (``purged``: how many it would remove).

        Raises :class:`fsbus.InvalidPattern` for a bad pattern.
        """
        infos = list(self.bus.browse(pattern))
        return PurgeResult(
            pattern=pattern,
            purged=sum(1 for i in infos if i.single and not i.locked),
            locked=sum(1 for i in infos if i.single and i.locked),
            multi=sum(1 for i in infos if not i.single),
        )

    def purge(self, pattern: str) -> PurgeResult:
        """Remove every work-queue message matching ``pattern`` that nobody holds.

        Through :meth:`fsbus.BlockingBus.purge`, which claims each message as a consumer
        would, so a message a worker is handling is never removed under it (it is
        counted as locked). Multi messages are not touched: they expire at their TTL.
        """
        preview = self.purge_preview(pattern)
        report = self.bus.purge(pattern, kind="single")
        with self._lock:
            self._cached = None
        return PurgeResult(pattern, report.single, report.locked, preview.multi)

    # ------------------------------------------------------------------ streams
    def streams(self) -> list[StreamRow]:
        """Every stream under the root, with its segments and consumer groups."""
        rows = []
        for name in fsbus.list_streams(self.root):
            try:
                with fsbus.Stream.open(self.root, name, create=False) as stream:
                    info = stream.info()
                    groups = tuple(_group_row(stream.group_info(g)) for g in stream.groups())
            except fsbus.FsBusError as exc:
                rows.append(StreamRow(name, 0, 0, 0, (), (), error=str(exc)))
                continue
            rows.append(
                StreamRow(
                    name=info.name,
                    start_offset=info.start_offset,
                    end_offset=info.end_offset,
                    size=info.size_bytes,
                    segments=tuple(
                        (s.base_offset, s.end_offset, s.size_bytes) for s in info.segments
                    ),
                    groups=groups,
                )
            )
        return rows


def _group_row(info: fsbus.GroupInfo) -> GroupRow:
    committed = min(info.committed.values()) if info.committed else 0
    return GroupRow(info.name, info.partitions, committed, info.lag, tuple(info.members))
