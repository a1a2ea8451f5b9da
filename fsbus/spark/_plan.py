"""Offset maths of the Spark source: admission control and splitting into tasks (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["OffsetRange", "cap_offsets", "split_ranges"]


@dataclass(frozen=True)
class OffsetRange:
    """A slice of one stream read by one Spark task."""

    stream: str
    """The stream's name."""
    start: int
    """First offset read."""
    stop: int
    """First offset not read (exclusive)."""

    @property
    def count(self) -> int:
        """How many offsets the range spans."""
        return self.stop - self.start


def cap_offsets(
    start: Mapping[str, int], latest: Mapping[str, int], max_records: int | None
) -> dict[str, int]:
    """End offsets for the next micro-batch, admitting at most ``max_records`` records.

    The budget is shared fairly between streams (water-filling): a stream with little
    new data takes only what it has, and the rest goes to the others.
    """
    end = {name: max(start.get(name, 0), latest[name]) for name in latest}
    if max_records is None:
        return end
    backlog = {name: end[name] - start.get(name, 0) for name in end}
    grant = dict.fromkeys(end, 0)
    budget = max_records
    # Smallest backlog first: each stream takes at most an equal share of what is left.
    order = sorted(backlog, key=lambda n: (backlog[n], n))
    for left, name in zip(range(len(order), 0, -1), order, strict=True):
        take = min(backlog[name], budget // left)
        grant[name] = take
        budget -= take
    # Rounding leaves fewer records than streams: one more each, in name order.
    for name in sorted(order):
        if budget == 0:
            break
        if grant[name] < backlog[name]:
            grant[name] += 1
            budget -= 1
    return {name: start.get(name, 0) + grant[name] for name in end}


def split_ranges(
    start: Mapping[str, int],
    end: Mapping[str, int],
    *,
    max_per_range: int,
    min_ranges: int = 1,
) -> list[OffsetRange]:
    """Split ``[start, end)`` of every stream into ranges for Spark tasks.

    Each range holds at most ``max_per_range`` records, and the whole is cut into at least
    ``min_ranges`` pieces when it has that many records. Empty streams give no range.
    """
    total = sum(max(0, end[n] - start.get(n, 0)) for n in end)
    if total == 0:
        return []
    per = min(max_per_range, max(1, -(-total // min_ranges)))
    out: list[OffsetRange] = []
    for name in sorted(end):
        lo, hi = start.get(name, 0), end[name]
        while lo < hi:
            step = min(per, hi - lo)
            out.append(OffsetRange(name, lo, lo + step))
            lo += step
    return out
