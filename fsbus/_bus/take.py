"""Taking one work-queue message without a subscription (what :meth:`Bus.get` does).

A subscription scans, claims in rounds and hands messages to a handler task: right for a
stream of messages, and several times the cost of one listing and one claim for a
single one. A take keeps the listing of the queue's buckets in the process, in the order
a consumer takes them (priority, then publish time and the publisher's sequence), brings
it up to date from UPDATE (:class:`TakeView`), and claims in that order until one locks.
"""

from __future__ import annotations

import bisect
import collections
import math
import threading
import time
from collections.abc import Collection
from typing import Final, NamedTuple

from .fs import BusFS, Claim
from .layout import changed_buckets
from .names import FLAG_META
from .scan import Entry, name_order, name_published_ms, parse_entry

__all__ = ["TakeView", "Taken"]

TRIES: Final = 64
"""Claims tried before giving up: the others in the listing are held by consumers (or
were taken since it was made), and the queue counts as empty for now."""

RELIST_EVERY: Final = 1.0
"""Seconds a view trusts UPDATE alone; then it lists every bucket again (a publisher
that died between its rename and its stamp left a message no stamp tells of)."""


class Taken(NamedTuple):
    """A message taken: its listing entry and the claim that holds it."""

    entry: Entry
    claim: Claim
    waiting: int
    """The other messages the listing holds, less those in ``skip``: what is ready in
    the queue, unless another process's consumers hold some."""


class TakeView:
    """The names of a bus's buckets in queue order, kept from one take to the next.

    The first take lists every bucket; the next ones read UPDATE and list only the
    buckets whose stamp changed (one bucket per publish meanwhile, none in a loop of gets
    that drains the queue), and every bucket again after :data:`RELIST_EVERY`. A message
    this process acked is dropped at once (:meth:`forget`). Thread-safe: takes and
    forgets come from worker threads and the event loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._update: bytes | None = None
        self._listed_at = -math.inf
        self._names: dict[int, set[str]] = {}
        self._keys: dict[str, str] = {}
        self._order: list[tuple[str, int, str]] = []
        self._gone: collections.deque[tuple[int, str]] = collections.deque()
        # Names in the order that are not a message to take, and never will be (foreign
        # files, expired messages, messages whose spill went): passed over without
        # being parsed again, until they leave the listing.
        self._passed: set[str] = set()

    def forget(self, bucket_index: int, name: str) -> None:
        """Message ``name`` is gone (acked here): never try it again."""
        self._gone.append((bucket_index, name))  # applied at the next take (no lock here)

    def take(
        self, fs: BusFS, skip: Collection[tuple[int, str]], *, count_deliveries: bool
    ) -> Taken | None:
        """Blocking: claim the first message of ``fs``'s bus, in queue order, that no
        one holds; None when there is none. ``skip``: (bucket index, name) of messages
        this process holds already (its own locks would not stop it: each claim opens
        the file anew)."""
        with self._lock:
            full, fresh = self._settle(fs, full=False)
            taken = self._claim_first(fs, skip, count_deliveries, fresh)
            if taken is None and not full:
                # Nothing free among what the view knows: make sure with a full listing
                # (the names tried may have been taken and acked by others).
                _, fresh = self._settle(fs, full=True)
                taken = self._claim_first(fs, skip, count_deliveries, fresh)
            return taken

    def _settle(self, fs: BusFS, *, full: bool) -> tuple[bool, set[str]]:
        """:meth:`_refresh`, once more when it found messages published after it began
        (another publisher's earlier ones may have landed in buckets it had listed
        already: the second listing sees them, see :func:`split_fresh`). Whether it
        listed every bucket, and the names the last listing found published after it
        began: not to be taken yet."""
        full, fresh = self._refresh(fs, full=full)
        if fresh:
            again, fresh = self._refresh(fs, full=False)
            full = full or again
        return full, fresh

    def _refresh(self, fs: BusFS, *, full: bool) -> tuple[bool, set[str]]:
        while self._gone:
            self._drop(*self._gone.popleft())
        count = len(fs.layout.buckets)
        horizon_ms = int(time.time() * 1000)
        update = fs.read_update()
        now = time.monotonic()
        if full or update is None or now - self._listed_at > RELIST_EVERY:
            full = True
            wanted: list[int] = list(range(count))
        else:
            wanted = changed_buckets(self._update, update, fs.layout.stamp_size, count)
        self._update = update
        if full:
            self._listed_at = now
        fresh: set[str] = set()
        if not wanted:
            return full, fresh
        listings = fs.list_buckets(wanted)
        removed = False
        added: list[tuple[str, int, str]] = []
        for bi, names in listings.items():
            new = set(names)
            old = self._names.get(bi, set())
            if new == old:
                continue
            self._names[bi] = new
            for name in old - new:
                self._keys.pop(name, None)
                self._passed.discard(name)
                removed = True
            for name in new - old:
                key = self._keys[name] = name_order(name)
                added.append((key, bi, name))
                published_ms = name_published_ms(name)
                if published_ms is not None and published_ms >= horizon_ms:
                    fresh.add(name)
        order = self._order
        if removed:  # gone since (taken elsewhere): one pass over the whole order
            keys = self._keys
            order = self._order = [t for t in order if t[2] in keys]
        if added:
            added.sort()
            behind = bool(order) and added[0] < order[-1]
            order.extend(added)
            if behind:  # not all published after the others: two sorted runs to merge
                order.sort()
        return full, fresh

    def _drop(self, bi: int, name: str) -> None:
        self._passed.discard(name)
        key = self._keys.pop(name, None)
        names = self._names.get(bi)
        if names is not None:
            names.discard(name)
        if key is None:
            return
        i = bisect.bisect_left(self._order, (key, bi, name))
        if i < len(self._order) and self._order[i] == (key, bi, name):
            del self._order[i]

    def _claim_first(
        self,
        fs: BusFS,
        skip: Collection[tuple[int, str]],
        count_deliveries: bool,
        fresh: Collection[str] = (),
    ) -> Taken | None:
        buckets = fs.layout.buckets
        now_ms = int(time.time() * 1000)
        tries = 0
        passed = self._passed
        for _, bi, name in self._order:
            if (bi, name) in skip or name in passed or name in fresh:
                continue
            # A queue's bus holds single messages only; a name that is not a message's
            # ranks first and is passed over.
            spills = fs.read_spills([(bi, name)]) if "@l+" in name else {}
            entry = parse_entry(bi, name, spills)
            if (
                entry is None
                or entry.topic is None  # its spill went with it: taken and acked since
                or entry.kind != "s"
                or entry.expires_ms <= now_ms  # the sweep removes it
            ):
                passed.add(name)
                continue
            fields = entry.fields
            has_meta = fields is not None and bool(fields.flags & FLAG_META)
            claim = fs.claim(buckets[bi], name, has_meta=has_meta, attempts=False)
            if claim is None:
                tries += 1
                if tries >= TRIES:
                    return None
                continue
            fs.fill_attempts([claim])
            if count_deliveries:
                fs.count_deliveries([claim])
            held_here = sum(1 for _, n in skip if n in self._keys)
            ready = len(self._order) - len(passed) - held_here - 1
            return Taken(entry, claim, max(0, ready))
        return None
