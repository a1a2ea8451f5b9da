"""Which buckets of a queue's bus a process lists first, when several consume it (pure).

Every consumer of a queue used to list every bucket that changed, at every change: with
a backlog, each of N consumers listed and parsed every message, and N - 1 of them only
to find it taken. Now the live consumers of a queue (its consumer files, sorted) split
its buckets: bucket ``i`` goes to the consumer at position ``i % N``. A consumer that
has work waiting lists only its own buckets when they change; the changes to the others'
it puts off, and lists them

- as soon as it has nothing left to claim and a handler free (it helps the others, as
  every consumer always did), and
- at the latest :data:`DEFER_MOST` seconds after the first of them was put off (so a
  consumer that died, or whose share is deeper, holds nothing back for long).

So a share only changes *when* a bucket is listed, never *whether*: every change is
listed within :data:`DEFER_MOST`, full listings still list every bucket, and claims stay
exclusive on disk. Consumers that see different sets of live consumers (one came or
went) split the buckets differently for a moment; that costs some double listing or a
short wait, never a message.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = ["DEFER_MOST", "SHARE_EVERY", "Share", "share_of"]

DEFER_MOST = 1.0
"""Seconds a change in another consumer's bucket waits at most before it is listed."""
SHARE_EVERY = 1.0
"""Seconds between two looks at a queue's live consumers."""


def share_of(live: Iterable[str], mine: Collection[str], buckets: int) -> frozenset[int] | None:
    """The buckets (of ``buckets``) that the consumers named ``mine`` list first, given the
    names of every live consumer of the queue (``mine`` among them); None: every bucket
    (every consumer is here, or none is)."""
    ordered = sorted(set(live) | set(mine))
    n = len(ordered)
    positions = {i for i, name in enumerate(ordered) if name in mine}
    if not positions or len(positions) == n:
        return None
    return frozenset(b for b in range(buckets) if b % n in positions)


class Share:
    """One queue bus's share of the buckets and the changes it put off."""

    __slots__ = ("deferred", "mine", "next_look", "since")

    def __init__(self) -> None:
        self.mine: frozenset[int] | None = None
        """The buckets listed first (None: every bucket, no share)."""
        self.deferred: set[int] = set()
        """Others' buckets that changed and were not listed yet."""
        self.since: float | None = None
        """When the oldest of :attr:`deferred` was put off (``time.monotonic``)."""
        self.next_look = 0.0
        """When to look at the live consumers again."""

    def deadline(self) -> float | None:
        """When the changes put off must be listed (None: none are)."""
        return None if self.since is None else self.since + DEFER_MOST

    def split(
        self, wanted: set[int], keep: Collection[int], steal: bool, now: float
    ) -> tuple[set[int], set[int], set[int]]:
        """Of the changed buckets ``wanted``: (those to list now, those to put off, the
        others' buckets among those listed, whose work items all go on the heap).
        ``keep``: buckets listed now whoever's they are (retries due there). ``steal``:
        this consumer has nothing to claim and a handler free."""
        mine = self.mine
        deadline = self.deadline()
        if mine is None or steal or (deadline is not None and now >= deadline):
            listed = wanted | self.deferred
            return listed, set(), (listed - mine) if mine is not None else set(self.deferred)
        put_off = {b for b in wanted if b not in mine and b not in keep}
        return wanted - put_off, put_off, set()

    def note(self, listed: Iterable[int], put_off: set[int], now: float) -> None:
        """Record a scan: ``listed`` were listed, ``put_off`` were not."""
        left = self.deferred.difference(listed)
        if not left:
            self.since = None
        self.deferred = left | put_off
        if self.deferred and self.since is None:
            self.since = now
