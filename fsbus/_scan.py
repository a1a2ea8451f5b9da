"""Scan decisions (pure): given listings, what is new, expired, foreign or a work item.

No filesystem, no clock: the engine passes the listing and ``now_ms`` in and carries
out the returned decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._names import ParsedName, decode_topic, parse_name

__all__ = ["Entry", "ScanDecision", "ScanState", "decide", "long_names"]


@dataclass(frozen=True, slots=True)
class Entry:
    """A parsed message file seen in a bucket."""

    bucket_index: int
    """Index of its bucket."""
    parsed: ParsedName
    """Its name taken apart."""
    topic: str | None
    """The decoded topic, or None while a long topic's spill is not read yet."""
    key: tuple[int, str] = field(init=False, repr=False, compare=False)
    """(bucket index, name): unique on the bus (computed once: it is used per scan)."""
    rank: tuple[int, int, str] = field(init=False, repr=False, compare=False)
    """Sort key: priority, publish time, then the publisher's sequence (FIFO).

    Names from qlobber-fsq peers carry no priority or publish time: they sort by expiry
    at the default priority."""

    def __post_init__(self) -> None:
        p = self.parsed
        f = p.fields
        rank = (
            (50, p.expires_ms, p.unique)
            if f is None
            else (f.priority, f.published_ms, p.unique[-12:])
        )
        object.__setattr__(self, "key", (self.bucket_index, p.name))
        object.__setattr__(self, "rank", rank)

    @property
    def name(self) -> str:
        """The file name."""
        return self.parsed.name

    def order(self) -> tuple[int, int, str]:
        """The sort key (see :attr:`rank`)."""
        return self.rank


@dataclass
class ScanState:
    """What the engine remembers between scans."""

    seen: dict[int, set[str]] = field(default_factory=dict)
    """Bucket index -> names in its previous listing."""
    parsed: dict[tuple[int, str], Entry | None] = field(default_factory=dict)
    """Cache of parsed names (None: foreign) for names still present."""


@dataclass
class ScanDecision:
    """What to do after one round of listings."""

    new_multi: list[Entry] = field(default_factory=list)
    """Multi messages not seen in the previous listing (deliver)."""
    present_multi: list[Entry] = field(default_factory=list)
    """Every unexpired multi message present (for subscribers asking for existing ones)."""
    singles: list[Entry] = field(default_factory=list)
    """Every unexpired single message present (work items to try to claim), in listing
    order: the engine's heap orders them by :meth:`Entry.order`."""
    expired: list[Entry] = field(default_factory=list)
    """Messages past their expiry (delete)."""
    foreign: list[tuple[int, str]] = field(default_factory=list)
    """Names that are not messages (quarantine)."""
    need_spill: list[tuple[int, str]] = field(default_factory=list)
    """Long messages whose topic spill must be read before they can be matched."""


def decide(
    state: ScanState,
    listings: dict[int, list[str]],
    spills: dict[tuple[int, str], str | None],
    now_ms: int,
    *,
    baseline: bool = False,
) -> ScanDecision:
    """Compare listings with the previous ones and sort every name into a decision.

    ``baseline`` marks the first listing of a bucket set: nothing in it counts as new.
    ``spills`` maps long names to their spilled topic rest (None: the spill file was
    missing). Long names absent from ``spills`` are listed in ``need_spill``; neither kind
    is marked as seen, so they are looked at again next round.
    """
    out = ScanDecision()
    for bi, names in listings.items():
        prev = state.seen.get(bi)
        current = set(names)
        # Forget cached parses of names that are gone.
        if prev:
            for gone in prev - current:
                state.parsed.pop((bi, gone), None)
        keep_unseen: set[str] = set()
        for name in names:
            key = (bi, name)
            if key in state.parsed:
                entry = state.parsed[key]
            else:
                entry = _parse(bi, name, spills)
                if entry is not None and entry.topic is None:
                    # The spill is not read yet, or was missing: try again next listing.
                    if key not in spills:
                        out.need_spill.append(key)
                    keep_unseen.add(name)
                    continue
                state.parsed[key] = entry
            if entry is None:
                out.foreign.append(key)
                continue
            p = entry.parsed
            if p.expires_ms <= now_ms:
                out.expired.append(entry)
                continue
            if p.kind == "s":
                out.singles.append(entry)
            elif p.kind == "m":
                out.present_multi.append(entry)
                if not baseline and (prev is None or name not in prev):
                    out.new_multi.append(entry)
        state.seen[bi] = current - keep_unseen
    out.new_multi.sort(key=Entry.order)
    # singles need no sort here: the engine keeps them in a priority heap
    return out


def long_names(state: ScanState, listings: dict[int, list[str]]) -> list[tuple[int, str]]:
    """Long-topic names not parsed yet: their spills must be read before :func:`decide`."""
    out = []
    for bi, names in listings.items():
        for name in names:
            if "@l+" in name and (bi, name) not in state.parsed:
                out.append((bi, name))
    return out


def _parse(bi: int, name: str, spills: dict[tuple[int, str], str | None]) -> Entry | None:
    parsed = parse_name(name)
    if parsed is None:
        return None
    if parsed.long:
        rest = spills.get((bi, name))
        if rest is None:
            return Entry(bi, parsed, None)
        topic = decode_topic(parsed.topic_hex + rest)
        if topic is None:
            return None
        return Entry(bi, parsed, topic)
    topic = decode_topic(parsed.topic_hex)
    if topic is None:
        return None
    return Entry(bi, parsed, topic)
