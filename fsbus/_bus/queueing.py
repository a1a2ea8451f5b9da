"""The bus side of durable queues: each queue's own bus, opened for the queue store.

A queue keeps its messages in a bus directory of its own (``fsbus/queues/<name>/bus``),
as work-queue messages. :class:`QueueWriter` writes into it, lists and removes there,
through the same :class:`~fsbus._bus.fs.BusFS` and :class:`~fsbus._bus.namer.Namer` a
Bus uses, so a copy in a queue is an ordinary message of that bus.
"""

from __future__ import annotations

import threading
import time

from .._config import BusConfig
from .._queues.store import QueueStore
from .fs import BusFS, NameClash
from .layout import Layout
from .namer import Namer
from .purge import purge_some, purge_targets
from .scan import ScanDecision, ScanState, decide, long_names


class QueueWriter:
    """A blocking handle on one queue's bus (the store's ``QueueBus``); thread-safe."""

    def __init__(self, root: str, config: BusConfig) -> None:
        self.layout = Layout.of(root, config)
        self._fs = BusFS(self.layout, config)
        self._fs.setup()
        self._namer = Namer(self.layout, config)
        self._lock = threading.Lock()

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
        with self._lock:
            plan = self._namer.plan(topic, True, ttl, durable, headers, priority)
        try:
            self._fs.publish(plan, payload)
        except NameClash:  # astronomically rare: name it again
            with self._lock:
                plan = self._namer.plan(topic, True, ttl, durable, headers, priority)
            self._fs.publish(plan, payload)

    def _listing(self) -> ScanDecision:
        listings = self._fs.list_buckets(range(len(self.layout.buckets)))
        spills = self._fs.read_spills(long_names(ScanState(), listings))
        return decide(ScanState(), listings, spills, int(time.time() * 1000), baseline=True)

    def depth(self) -> int:
        """Messages not expired: waiting, or held by a consumer."""
        return len(self._listing().singles)

    def expire(self) -> int:
        """Remove the expired messages no consumer holds; how many."""
        buckets = self.layout.buckets
        d = self._listing()
        return self.remove(
            [(buckets[e.bucket_index], e.name) for e in d.expired if e.parsed.single]
        )

    def oldest(self, count: int) -> list[tuple[str, str]]:
        """The ``count`` messages at the head of the queue, of those no consumer holds."""
        if count <= 0:
            return []
        buckets = self.layout.buckets
        d = self._listing()

        # the head of the queue: what a consumer would take next (priority, then
        # publish time and the publisher's sequence)
        entries = sorted(d.singles, key=lambda e: e.rank)
        out = []
        for e in entries:
            bucket = buckets[e.bucket_index]
            if not self._fs.is_locked(bucket, e.name):
                out.append((bucket, e.name))
                if len(out) == count:
                    break
        return out

    def remove(self, messages: list[tuple[str, str]]) -> int:
        return purge_some(self._fs, [], messages)[0]

    def purge_all(self) -> int:
        multi, single = purge_targets(self._fs, "#", "all")
        removed, multi_removed, _locked = purge_some(self._fs, multi, single)
        return removed + multi_removed

    def close(self) -> None:
        self._fs.close()


def open_store(layout: Layout, config: BusConfig) -> QueueStore:
    """The queue store of the bus laid out as ``layout``."""
    return QueueStore(layout.private, config, layout.quarantine, QueueWriter, layout.messages)
