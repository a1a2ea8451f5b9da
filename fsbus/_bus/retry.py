"""When to look at work items again, and how hard to compete for them (pure: the engine
passes the clock in).

:class:`RetrySchedule` holds the work items that are backing off (locked by another
consumer, released, failed) until a time; :class:`Contention` tells a consumer that keeps
losing claims to other consumers to list less often for a while.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

__all__ = ["Contention", "RetrySchedule"]

Key = tuple[int, str]


class RetrySchedule:
    """Work items backing off until a time, by (bucket index, name).

    A heap orders the times, so a scan finds what fell due without walking every item
    that backs off (a busy work queue can have thousands: each claim lost to another
    consumer is one).
    """

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._at: dict[Key, float] = {}
        self._heap: list[tuple[float, Key]] = []

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def add(self, key: Key, at: float) -> None:
        """Back ``key`` off until ``at`` (a later call replaces an earlier time)."""
        self._at[key] = at
        heapq.heappush(self._heap, (at, key))

    def backing_off(self, key: Key, now: float) -> bool:
        """Whether ``key`` must not be tried before a later time."""
        return self._at.get(key, 0.0) > now

    def next_due(self) -> float | None:
        """The soonest time an item falls due, or None when nothing backs off."""
        heap, at = self._heap, self._at
        while heap:
            t, key = heap[0]
            if at.get(key) == t:
                return t
            heapq.heappop(heap)  # replaced by a later add, or taken
        return None

    def take_due(self, now: float) -> list[Key]:
        """Remove and return the items due at ``now``."""
        heap, at = self._heap, self._at
        due: list[Key] = []
        while heap and heap[0][0] <= now:
            t, key = heapq.heappop(heap)
            if at.get(key) == t:
                del at[key]
                due.append(key)
        return due

    def put_back(self, keys: Iterable[Key], at: float) -> None:
        """Schedule taken items again (their bucket could not be listed)."""
        for key in keys:
            self.add(key, at)


class Contention:
    """How long a consumer that loses its claims to other consumers lists less often.

    When most claims of a round were lost, the listing they came from was already
    stale: other consumers are taking the work as fast as it comes. Listing again at
    every filesystem event would only repeat the race (with many consumers on few cores
    it takes CPU from the ones that win), so the consumer waits a little, doubling the
    wait from ``first`` to ``most`` while it keeps losing, and meanwhile tries its
    candidates from a random place (see :attr:`active`). A round that loses nothing
    ends it. An idle consumer never loses, so its latency does not change.
    """

    __slots__ = ("_wait", "first", "most", "until")

    def __init__(self, first: float = 0.004, most: float = 0.064) -> None:
        self.first = first
        self.most = most
        self._wait = 0.0
        self.until = 0.0
        """No listing on a filesystem event before this time."""

    def round(self, tried: int, lost: int, now: float) -> None:
        """Record a claim round: ``tried`` claims attempted, ``lost`` of them lost."""
        if not tried:
            return
        if lost * 2 > tried:
            self._wait = min(self.most, max(self.first, self._wait * 2))
            self.until = now + self._wait
        elif not lost:
            self._wait = 0.0
            self.until = 0.0

    @property
    def active(self) -> bool:
        """Whether the last rounds were mostly lost (and none since lost nothing)."""
        return self._wait > 0

    def quiet(self, now: float) -> bool:
        """Whether a filesystem event should wait (see :attr:`until`)."""
        return now < self.until
