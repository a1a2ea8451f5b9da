"""Whole-bus passes: counting a queue, removing what expired, quarantining foreign files.

A scan looks only at the names that changed since its last listing; these passes look at
every name of every bucket, so they sort names out with :func:`~fsbus._bus.scan.census`
(one match per name) and hand only the names it cannot take apart to
:func:`~fsbus._bus.scan.decide`.
"""

from __future__ import annotations

import time

from .fs import BusFS
from .scan import Census, ScanState, census, decide, long_names

__all__ = ["collect_garbage", "take_census"]


def take_census(fs: BusFS, now_ms: int, topics: dict[str, bool] | None = None) -> Census:
    """Blocking: every bucket of ``fs`` listed and sorted out (``rest`` is empty: the names
    the census leaves are decided here, their spills read)."""
    listings = fs.list_buckets(range(len(fs.layout.buckets)))
    c = census(listings, now_ms, topics)
    if not c.rest:
        return c
    spills = fs.read_spills(long_names(ScanState(), c.rest))
    d = decide(ScanState(), c.rest, spills, now_ms, baseline=True)
    return Census(
        c.singles + [e.key for e in d.singles],
        c.multis + len(d.present_multi),
        c.expired + [(e.bucket_index, e.name, e.kind) for e in d.expired],
        c.foreign + d.foreign,
        {},
    )


def collect_garbage(
    fs: BusFS, in_flight: set[tuple[int, str]], debris_age: float, *, keep_expired: bool = False
) -> tuple[int, int, int]:
    """Blocking: remove expired messages, quarantine foreign files, sweep debris.

    ``keep_expired``: leave the expired single messages (a queue's that are dead-lettered
    when they expire: see ``QueueStore.dead_letter_expired``).
    Returns (expired removed, files quarantined, debris removed).
    """
    buckets = fs.layout.buckets
    now_ms = int(time.time() * 1000)
    c = take_census(fs, now_ms)
    gone = [
        (buckets[bi], name)
        for bi, name, kind in c.expired
        if (bi, name) not in in_flight and not (keep_expired and kind == "s")
    ]
    n = fs.remove(gone)
    q = sum(fs.quarantine(buckets[bi], name, now_ms) for bi, name in c.foreign)
    listed = len(c.singles) + c.multis + len(c.expired) + len(c.foreign)
    debris = fs.sweep_debris(time.time(), debris_age, listed)
    fs.recover_logs()  # (the logs of processes that died since)
    return n, q, debris
