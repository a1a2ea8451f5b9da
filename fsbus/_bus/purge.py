"""Purging by pattern: which messages (from one listing of every bucket), then removing them.

Blocking, through :class:`~fsbus._bus.fs.BusFS` only: the async Bus calls it in
worker-thread hops, the blocking face in its caller's thread. A multi message goes the
way an expired one goes (``BusFS.remove``: the file, its topic spill and its other
sidecars). A work-queue message is claimed and acknowledged as a consumer would, so one
that a consumer holds (by ``flock``, or moved aside by a rename claim) is never removed
under it. Names that are not messages, and long names whose topic spill is missing, are
never touched.
"""

from __future__ import annotations

import time

from .._core.topics import validate_pattern
from .._core.trie import TopicTrie
from .._errors import UsageError
from .fs import BusFS
from .message import PurgeKind
from .scan import ScanState, decide, long_names

__all__ = ["PURGE_KINDS", "check_purge", "purge_some", "purge_targets"]

PURGE_KINDS: tuple[PurgeKind, ...] = ("single", "multi", "all")

Target = tuple[str, str]
"""(bucket, name) of a message to purge."""


def check_purge(pattern: object, kind: object) -> str:
    """Validate a purge's arguments (no I/O); returns the pattern."""
    pattern = validate_pattern(pattern)
    if kind not in PURGE_KINDS:
        raise UsageError(
            f"invalid purge kind {kind!r}: kind must be one of {', '.join(PURGE_KINDS)} "
            '("single": work-queue messages, "multi": the others, "all": both)'
        )
    return pattern


def purge_targets(fs: BusFS, pattern: str, kind: PurgeKind) -> tuple[list[Target], list[Target]]:
    """The unexpired (multi, single) messages on the bus whose topic matches ``pattern``.

    ``pattern`` must be valid already (:func:`check_purge`). Expired messages are left to
    garbage collection.
    """
    trie: TopicTrie[int] = TopicTrie()
    trie.add(pattern, 1)
    matches: dict[str, bool] = {}

    def matching(topic: str | None) -> bool:
        assert topic is not None  # decide() holds back names whose topic is unknown
        hit = matches.get(topic)
        if hit is None:
            hit = matches[topic] = bool(trie.match(topic))
        return hit

    buckets = fs.layout.buckets
    listings = fs.list_buckets(range(len(buckets)))
    spills = fs.read_spills(long_names(ScanState(), listings))
    d = decide(ScanState(), listings, spills, int(time.time() * 1000), baseline=True)
    multi = (
        []
        if kind == "single"
        else [(buckets[e.bucket_index], e.name) for e in d.present_multi if matching(e.topic)]
    )
    single = (
        []
        if kind == "multi"
        else [(buckets[e.bucket_index], e.name) for e in d.singles if matching(e.topic)]
    )
    return multi, single


def purge_some(fs: BusFS, multi: list[Target], single: list[Target]) -> tuple[int, int, int]:
    """Remove these messages; returns (single removed, multi removed, single locked).

    A work-queue message that cannot be claimed is counted as locked when a consumer
    still holds its lock; one gone meanwhile (consumed, expired) is not counted at all.
    """
    multi_removed = fs.remove(multi)
    removed = locked = 0
    for bucket, name in single:
        claim = fs.claim(bucket, name, has_meta=False)
        if claim is None:
            if fs.is_locked(bucket, name):
                locked += 1
            continue
        fs.ack(claim)
        removed += 1
    return removed, multi_removed, locked
